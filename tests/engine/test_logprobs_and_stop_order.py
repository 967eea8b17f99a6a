"""Two documented meanings, compared against their definitions in the hard cases.

* **Logprobs are under the raw model** (docs/generate.md): with a logit_bias or penalties that change which
  token is chosen, a record's logprobs and top alternatives are still the log-softmax of the model's own
  logits.  The reference is a separate scoring pass of prompt + output (`GPT2.logits`, no KV cache) and a
  log-softmax written here by hand.
* **The order of the stop rules** (minirt/engine/request.py `add_token`): an EOS or stop token ends the
  request first, its token kept in token_ids and its text not added; a stop string completed by an
  earlier token cuts the text just before it.  The expected texts come from decoding the pieces by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minirt import LLM, SamplingParams
from conftest import completions


@pytest.fixture(scope="module")
def llm():
    return LLM()


def raw_log_softmax(logits) -> np.ndarray:
    """log p = x - max - log(sum(exp(x - max))), in float64, by hand."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max()
    return shifted - math.log(float(np.exp(shifted).sum()))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    biased=st.dictionaries(st.integers(0, 4095), st.floats(-100, 100), min_size=1, max_size=4),
    repetition=st.floats(0.5, 2.0),
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
    temperature=st.sampled_from([0.0, 0.7, 1.3]),
    seed=st.integers(0, 10**6),
)
def test_logprobs_are_the_raw_models_whatever_changes_the_choice(
    llm, biased, repetition, presence, frequency, temperature, seed
):
    params = SamplingParams(
        max_tokens=5,
        ignore_eos=True,
        logit_bias=biased,
        repetition_penalty=repetition,
        presence_penalty=presence,
        frequency_penalty=frequency,
        temperature=temperature,
        seed=seed,
        logprobs=3,
    )
    [output] = completions(llm.generate(["The quick brown"], params), top_n=3)
    prompt = llm.prompt_ids("The quick brown")
    tokens = output.token_ids
    assert len(tokens) == 5 and len(output.logprobs) == 5
    # One scoring pass of the whole text: position len(prompt) + i - 1 predicts token i.
    scored = llm.model.logits([prompt + tokens])[0]
    for i, token in enumerate(tokens):
        raw = raw_log_softmax(scored[len(prompt) + i - 1])
        assert output.logprobs[i] == pytest.approx(raw[token], abs=2e-4)
        most_likely = np.argsort(-raw, kind="stable")[:3]
        alternatives = output.top_logprobs[i]
        assert [t for t, _ in alternatives] == [int(t) for t in most_likely]
        for (_, logprob), t in zip(alternatives, most_likely, strict=True):
            assert logprob == pytest.approx(raw[t], abs=2e-4)
        # vLLM's shape: the chosen token first, then the top 3 by rank (1, 2, 3), and the chosen
        # token's rank is how many tokens the raw model finds at least as likely (itself too).
        # The scoring pass's logits are not the decode round's bit for bit: tokens within the
        # tolerance of the chosen one may fall either side of it.
        entry = output.output.logprobs[i]
        assert list(entry)[0] == token
        surely_above = int(np.count_nonzero(raw > raw[token] + 2e-4))
        perhaps_above = int(np.count_nonzero(raw >= raw[token] - 2e-4))
        assert surely_above + 1 <= entry[token].rank <= perhaps_above
        others = [t for t in entry if t != token]
        assert others == [int(t) for t in most_likely if t != token]
        assert [entry[t].rank for t in others] == [
            r for r, t in enumerate(most_likely, start=1) if t != token
        ]


def greedy_pieces(llm, prompt: str, n: int) -> tuple[list[int], list[str]]:
    """The first n greedy tokens of `prompt`, and each one's text."""
    [output] = completions(
        llm.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0))
    )
    tokens = output.token_ids
    texts = [llm.tokenizer.decode(tokens[: i + 1]) for i in range(n)]
    pieces = [texts[0]] + [texts[i][len(texts[i - 1]) :] for i in range(1, n)]
    assert "".join(pieces) == output.text
    return tokens, pieces


def straddling_stop(pieces: list[str], at: int) -> str:
    """A stop string that token `at` completes: the last character of the text before it, then the
    first of its own text."""
    before = "".join(pieces[:at])
    return before[-1] + pieces[at][:1]


@pytest.mark.parametrize("prompt", ["ROMEO:", "The quick brown", "Once upon a time"])
def test_a_stop_token_that_also_completes_a_stop_string_keeps_the_text_before_the_token(
    llm, prompt
):
    tokens, pieces = greedy_pieces(llm, prompt, 8)
    at = next(i for i in range(2, 8) if pieces[i] and "".join(pieces[:i]))
    stop = straddling_stop(pieces, at)
    if stop in "".join(pieces[:at]):
        pytest.skip("the stop string already appears earlier")
    params = SamplingParams(
        max_tokens=8, ignore_eos=True, stop=[stop], stop_token_ids=[tokens[at]], temperature=0.0
    )
    [output] = completions(llm.generate([prompt], params))
    if tokens[at] in tokens[:at]:
        pytest.skip("the stop token appears earlier")
    # The token rule wins: the token is kept, its text is not added, and the stop string (which never
    # appeared whole in the kept text) cuts nothing.
    assert output.finish_reason == "stop"
    assert output.token_ids == tokens[: at + 1]
    assert output.text == "".join(pieces[:at])


@pytest.mark.parametrize("prompt", ["ROMEO:", "The quick brown", "Once upon a time"])
def test_a_stop_string_completed_before_a_stop_token_cuts_the_text(llm, prompt):
    tokens, pieces = greedy_pieces(llm, prompt, 8)
    at = next(i for i in range(2, 7) if pieces[i] and "".join(pieces[:i]))
    stop = straddling_stop(pieces, at)
    text_before = "".join(pieces[:at])
    if stop in text_before or tokens[at + 1] in tokens[: at + 1]:
        pytest.skip("the stop string or token appears earlier")
    params = SamplingParams(
        max_tokens=8, ignore_eos=True, stop=[stop], stop_token_ids=[tokens[at + 1]], temperature=0.0
    )
    [output] = completions(llm.generate([prompt], params))
    # The string completes at token `at`, one token before the stop token: cut just before it.
    assert output.finish_reason == "stop"
    assert output.token_ids == tokens[: at + 1]
    assert output.text == text_before[:-1]


def test_a_stop_token_on_the_last_allowed_token_is_a_stop_not_a_length(llm):
    """Stop tokens come before the length rule: the request that stops on its max_new_tokens-th
    token by a stop token says "stop"."""
    tokens, pieces = greedy_pieces(llm, "ROMEO:", 4)
    if tokens[3] in tokens[:3]:
        pytest.skip("the stop token appears earlier")
    params = SamplingParams(
        max_tokens=4, ignore_eos=True, stop_token_ids=[tokens[3]], temperature=0.0
    )
    [output] = completions(llm.generate(["ROMEO:"], params))
    assert output.token_ids == tokens
    assert output.finish_reason == "stop" and output.text == "".join(pieces[:3])
