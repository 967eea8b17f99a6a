"""The one place a prompt becomes a request (minirt/request_maker.py), at its edges.  Expected
ids come from the tokenizers library reading the model's own tokenizer.json; the rest by hand."""

import pytest
from tokenizers import Tokenizer as HFTokenizer

from minirt.engine.params import SamplingParams
from minirt.engine.request import Status
from minirt.loading.checkpoint import shipped_model_folder
from minirt.loading.tokenizer import load_tokenizer
from minirt.request_maker import RequestMaker

VOCAB = 50
CONTEXT = 8


def token_maker(bos=3, run_seed=0) -> RequestMaker:
    """A maker for a model of 50 tokens and a context of 8, without a tokenizer."""
    return RequestMaker(None, VOCAB, CONTEXT, bos, run_seed=run_seed)


def test_text_is_encoded_as_the_models_own_tokenizer_encodes_it():
    folder = shipped_model_folder()
    tokenizer = load_tokenizer(folder, vocab_size=4096)
    maker = RequestMaker(tokenizer, 4096, 256, tokenizer.bos_token_id)
    text = "ROMEO:\nBut soft, what light through yonder window breaks?"
    request = maker.make(0, text, SamplingParams(temperature=0.0, max_tokens=64))
    want = HFTokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    assert request.prompt_ids == want and request.prompt == text and request.error is None


@pytest.mark.parametrize("length", [CONTEXT - 1, CONTEXT])
def test_a_prompt_that_fills_the_context_is_taken(length):
    request = token_maker().make(
        0, list(range(1, length + 1)), SamplingParams(temperature=0.0, max_tokens=64)
    )
    assert request.error is None and request.prompt_len == length
    assert request.status is Status.WAITING


def test_a_prompt_one_token_past_the_context_fails_alone_naming_both_numbers():
    request = token_maker().make(
        4, list(range(CONTEXT + 1)), SamplingParams(temperature=0.0, max_tokens=64)
    )
    assert request.finish_reason == "error" and request.status is Status.FINISHED
    assert request.error == (
        f"the prompt has {CONTEXT + 1} tokens, more than the model's context of {CONTEXT}; "
        "shorten it"
    )
    assert request.id == "4" and request.prompt_ids == []


def test_an_empty_prompt_is_bos_alone_or_refused_without_one():
    assert token_maker(bos=3).make(
        0, [], SamplingParams(temperature=0.0, max_tokens=64)
    ).prompt_ids == [3]
    refused = token_maker(bos=None).make(0, [], SamplingParams(temperature=0.0, max_tokens=64))
    assert "empty" in refused.error and "BOS" in refused.error


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(stop_token_ids=(VOCAB,), temperature=0.0, max_tokens=64), "stop"),
        (SamplingParams(logit_bias={VOCAB: 1.0}, temperature=0.0, max_tokens=64), "logit_bias"),
        (SamplingParams(stop=("x",), temperature=0.0, max_tokens=64), "stop strings"),
    ],
)
def test_parameters_this_model_cannot_take_fail_the_request(params, field):
    request = token_maker().make(0, [1, 2], params)
    assert request.finish_reason == "error" and request.error.startswith(field)


def test_the_last_token_of_the_vocabulary_is_a_stop_token_like_any_other():
    request = token_maker().make(
        0, [1], SamplingParams(stop_token_ids=(VOCAB - 1,), temperature=0.0, max_tokens=64)
    )
    assert request.error is None


def test_text_needs_a_tokenizer():
    request = token_maker().make(0, "hello", SamplingParams(temperature=0.0, max_tokens=64))
    assert "no tokenizer" in request.error and request.prompt == "hello"


def draws(request, n=4):
    return request.rng.random(n).tolist()


def test_each_request_owns_its_stream():
    """Unseeded: the stream follows the run seed, the index and the sample, and nothing else; a
    seeded request's follows its seed and sample alone (not its index, nor the run's seed)."""
    maker = token_maker(run_seed=5)
    params = SamplingParams(temperature=1.0, max_tokens=64)
    same = [draws(maker.make(2, [1], params)) for _ in range(2)]
    assert same[0] == same[1]
    assert draws(maker.make(3, [1], params)) != same[0]
    assert draws(maker.make(2, [1], params, sample=1)) != same[0]
    assert draws(token_maker(run_seed=6).make(2, [1], params)) != same[0]
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=64)
    assert draws(maker.make(0, [1], seeded)) == draws(token_maker(run_seed=9).make(7, [4], seeded))


def test_logprobs_are_kept_when_asked_either_way():
    maker = token_maker()
    assert maker.make(
        0, [1], SamplingParams(temperature=0.0, max_tokens=64), want_logprobs=True
    ).want_logprobs
    assert maker.make(
        0, [1], SamplingParams(logprobs=2, temperature=0.0, max_tokens=64)
    ).want_logprobs
    assert not maker.make(0, [1], SamplingParams(temperature=0.0, max_tokens=64)).want_logprobs


def test_a_models_maker_draws_from_the_run_seed_it_is_given():
    """`for_model` (what LLM(seed=...) and the server use) keeps the run seed: its unseeded
    streams are those of a maker built by hand with that seed, and another seed's differ."""
    from conftest import FIXTURES
    from minirt.loading.checkpoint import load_checkpoint

    config = load_checkpoint(FIXTURES / "base").config
    params = SamplingParams(temperature=1.0, max_tokens=64)
    by_hand = RequestMaker(None, config.vocab_size, config.n_positions, None, run_seed=5)
    made = RequestMaker.for_model(config, None, run_seed=5)
    assert draws(made.make(1, [1], params)) == draws(by_hand.make(1, [1], params))
    other = RequestMaker.for_model(config, None, run_seed=6)
    assert draws(other.make(1, [1], params)) != draws(made.make(1, [1], params))


def test_a_text_no_encoding_could_fit_is_refused_without_being_encoded():
    """The shipped vocabulary's longest token is 29 bytes (counted here from the tokenizers
    library's own vocabulary), so with a context of 8 a text of 8 x 29 + 1 characters cannot fit
    and is refused by its length; one of 8 x 29 is encoded, and then refused by its tokens."""
    folder = shipped_model_folder()
    library = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    byte_of = {ch: b for b, ch in byte_level_alphabet().items()}
    longest = max(len(bytes(byte_of[ch] for ch in token)) for token in library.get_vocab())
    tokenizer = load_tokenizer(folder, vocab_size=4096)
    assert tokenizer.most_bytes_per_token == longest
    encoded = []
    real_encode = tokenizer.encode
    tokenizer.encode = lambda text: encoded.append(text) or real_encode(text)
    maker = RequestMaker(tokenizer, 4096, CONTEXT, tokenizer.bos_token_id)
    too_long = maker.make(
        0, "a" * (CONTEXT * longest + 1), SamplingParams(temperature=0.0, max_tokens=64)
    )
    assert encoded == [] and f"{CONTEXT * longest + 1} characters" in too_long.error
    at_bound = maker.make(
        1, "a" * (CONTEXT * longest), SamplingParams(temperature=0.0, max_tokens=64)
    )
    assert len(encoded) == 1 and "tokens, more than the model's context of 8" in at_bound.error


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table, written out from its rule: the printable bytes stand for
    themselves, the rest for 256 + their rank."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    rank = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + rank)
            rank += 1
    return table
