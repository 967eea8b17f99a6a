"""The prefix cache and chunked prefill through `minirt serve` and OpenAI's client: the tokens are those of
the offline run with neither, `usage.prompt_tokens_details.cached_tokens` counts the prompt tokens the cache
gave (by hand: whole blocks of 16 of the shared prefix, which the `tokenizers` library encodes), and
/metrics counts the lookups and hits."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as HFTokenizer

from minirt import LLM, SamplingParams
from minirt.loading.checkpoint import shipped_model_folder
from serving import Server, serve_tests
from conftest import completions

pytestmark = serve_tests

PREFIX = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
)
QUESTIONS = ["MENENIUS:\nWhat work's, my countrymen,", "CORIOLANUS:\nThanks. What's the matter,"]


@pytest.fixture(scope="module")
def reference():
    """Offline, neither cache nor chunking."""
    return LLM(prefix_cache=False, chunked_prefill=False)


@pytest.fixture(scope="module")
def encode():
    tokenizer = HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))
    return lambda text: tokenizer.encode(text).ids


def expected_text(reference, prompt: str, max_tokens: int) -> str:
    (output,) = completions(
        reference.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0))
    )
    return output.text


def shared_full_blocks(encode, first: str, second: str) -> int:
    """Tokens of whole 16-token blocks that two prompts share at their start (the last token never counts)."""
    a = encode(first)
    b = encode(second)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    common = min(common, len(b) - 1)
    return common // 16 * 16


def test_a_second_prompt_with_the_same_prefix_reports_its_cached_tokens_and_gets_the_same_text(
    reference, encode
):
    with Server("--batch-size", "2", "--prefix-cache") as server:
        client = server.client()
        answers = []
        for question in QUESTIONS:
            prompt = PREFIX + question
            answers.append(
                client.completions.create(model=None, prompt=prompt, max_tokens=12, temperature=0)
            )
            assert answers[-1].choices[0].text == expected_text(reference, prompt, 12)
        cached = [answer.usage.prompt_tokens_details.cached_tokens for answer in answers]
        expected = shared_full_blocks(encode, PREFIX + QUESTIONS[0], PREFIX + QUESTIONS[1])
        assert expected >= 32 and cached == [0, expected]
        assert answers[1].choices[0].model_extra["minirt"]["cached_prompt_tokens"] == expected
        prompt_tokens = sum(len(encode(PREFIX + q)) for q in QUESTIONS)
        assert server.metric("minirt:prefix_cache_queries_total") == prompt_tokens
        assert server.metric("minirt:prefix_cache_hits_total") == expected
        assert server.metric("minirt:prefix_cache_positions") > 0
        assert server.stop() == 0


def test_without_prefix_cache_the_default_nothing_is_cached_and_the_text_is_the_same(reference):
    with Server() as server:
        client = server.client()
        for question in QUESTIONS:
            prompt = PREFIX + question
            answer = client.completions.create(
                model=None, prompt=prompt, max_tokens=12, temperature=0
            )
            assert answer.usage.prompt_tokens_details.cached_tokens == 0
            assert answer.choices[0].text == expected_text(reference, prompt, 12)
        assert server.metric("minirt:prefix_cache_hits_total") == 0
        assert server.stop() == 0


def test_prompts_longer_than_the_round_budget_are_chunked_and_streamed_as_offline(
    reference, encode
):
    prompts = [PREFIX + q for q in QUESTIONS] + ["ROMEO:"]
    with Server("--max-round-tokens", "8") as server:
        client = server.client()
        answer = client.completions.create(model=None, prompt=prompts, max_tokens=10, temperature=0)
        for choice, prompt in zip(answer.choices, prompts, strict=True):
            assert choice.text == expected_text(reference, prompt, 10)
            fields = choice.model_extra["minirt"]
            # 8 tokens a round, the decoding rows first: a prompt of P tokens needs at least P / 8 rounds before
            # its first token, so its rounds number more than its tokens.
            rounds = fields["finish_round"] - fields["first_round"] + 1
            assert rounds >= len(fields["token_ids"]) + (len(encode(prompt)) - 1) // 8
        streamed = client.completions.create(
            model=None, prompt=prompts[0], max_tokens=10, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in streamed) == expected_text(
            reference, prompts[0], 10
        )
        assert server.stop() == 0


def test_unchunked_a_prompt_over_the_round_budget_is_a_400_naming_the_flags():
    import openai

    with Server("--max-round-tokens", "8", "--no-chunked-prefill") as server:
        with pytest.raises(openai.BadRequestError) as raised:
            server.client().completions.create(model=None, prompt=PREFIX, max_tokens=4)
        assert (
            "--max-round-tokens" in raised.value.message and raised.value.body["param"] == "prompt"
        )
        assert server.stop() == 0
