"""What log-probabilities cost the engine's one thread, and that the cheaper ways give the same
numbers as the plain ones, bit for bit.

* **Top logprobs** (`logprobs=k`): the k most likely tokens come from a partition and a sort of
  the candidates, not a sort of the whole vocabulary: the same tokens in the same order as the
  stable full sort (equal values by id), checked against it on values with many ties.  A row's
  log-softmax is computed once, for its chosen token and its top k alike.
* **Prompt logprobs** (echo with logprobs): the log-softmax runs over a block of prompt positions
  at a time, never [L, V] in float64 at once, with the numbers of the whole computation, written
  out here by hand; and a prompt's n choices (any requests of one prompt that run together) are
  scored once and each given the same numbers as n = 1, the shared record dropped when the last
  of them finishes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_request, random_model
from minirt import LLM, SamplingParams
from minirt.engine import sampler
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.sampler import PROMPT_ROWS_AT_ONCE, most_likely, prompt_logprobs, top_logprobs
from minirt.model.backend import numpy_backend
from conftest import completions


def full_log_softmax(logits) -> np.ndarray:
    """The whole log-softmax along the last axis in float64, by hand: x - max - log(sum(exp))."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# A few values, so that most of them tie.
FEW_VALUES = st.sampled_from([-3.5, -1.0, 0.0, 0.25, 2.0, 7.0])


@settings(max_examples=300, deadline=None)
@given(values=st.lists(FEW_VALUES, min_size=1, max_size=120), n=st.integers(0, 20))
def test_most_likely_is_the_stable_full_sort(values, n):
    """The n largest, largest first, ties by index: what the full stable argsort's first n are,
    for every n from 0 to past the number of values."""
    x = np.array(values, dtype=np.float64)
    for k in (n, x.size - 1, x.size, x.size + n):
        want = np.argsort(-x, kind="stable")[: max(k, 0)]
        got = most_likely(x, k)
        assert got.tolist() == want.tolist(), k


@settings(max_examples=100, deadline=None)
@given(values=st.lists(FEW_VALUES, min_size=1, max_size=300), n=st.integers(1, 25))
def test_top_logprobs_equal_the_full_sort_of_the_log_softmax(values, n):
    """`top_logprobs` on fp32 logits full of ties: the same (token, logprob) pairs, in the same
    order, as a stable sort of the whole row's log-softmax written out here."""
    logits = np.array(values, dtype=np.float32)
    logprobs = full_log_softmax(logits)
    want = [(int(t), float(logprobs[t])) for t in np.argsort(-logprobs, kind="stable")[:n]]
    assert top_logprobs(logits, n) == want
    assert top_logprobs(logits, n, logprobs) == want


def test_a_row_with_top_logprobs_computes_its_log_softmax_once(monkeypatch):
    """The chosen token's logprob and the top k come from one log-softmax of the row."""
    from types import SimpleNamespace

    from minirt.engine.sampler import choose_tokens, request_rng

    calls = []
    original = sampler.log_softmax

    def counting(logits, axis=-1):
        calls.append(np.shape(logits))
        return original(logits, axis)

    monkeypatch.setattr(sampler, "log_softmax", counting)
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    rows = [
        SimpleNamespace(
            params=SamplingParams(temperature=0, logprobs=4, max_tokens=64),
            rng=request_rng(k),
            want_logprobs=True,
            prompt_ids=[1],
            token_ids=[],
        )
        for k in range(3)
    ]
    chosen = choose_tokens(numpy_backend(), logits, rows)
    assert calls == [(50,)] * 3
    for row, (token, logprob, top, rank) in zip(logits, chosen, strict=True):
        want = full_log_softmax(row)
        assert token == int(np.argmax(row)) and logprob == float(want[token])
        # The argmax of distinct values: vLLM's rank 1.
        assert rank == 1 and np.unique(row).size == row.size
        assert top == [(int(t), float(want[t])) for t in np.argsort(-want, kind="stable")[:4]]


@pytest.mark.parametrize("length", [1, 2, 3, 64, 65, 66, 129, 130, 200])
def test_prompt_logprobs_are_the_whole_log_softmax_a_block_at_a_time(length, monkeypatch):
    """Bit for bit what the log-softmax of all L-1 positions at once gives at each next token,
    while no call holds more than a block of at most 64 positions."""
    rng = np.random.default_rng(length)
    logits = (rng.standard_normal((length, 40)) * 4).astype(np.float32)
    ids = rng.integers(0, 40, length).tolist()
    whole = full_log_softmax(logits[:-1])  # [L-1, V]
    want = [None] + [float(whole[i, ids[i + 1]]) for i in range(length - 1)]
    shapes = []
    original = sampler.log_softmax

    def recording(x, axis=-1):
        shapes.append(np.shape(x))
        return original(x, axis)

    monkeypatch.setattr(sampler, "log_softmax", recording)
    assert prompt_logprobs(logits, ids) == want
    assert sum(rows for rows, _ in shapes) == length - 1
    # 64 positions of GPT-2's vocabulary in float64: 26 MB.
    assert PROMPT_ROWS_AT_ONCE <= 64 and all(rows <= PROMPT_ROWS_AT_ONCE for rows, _ in shapes)


@pytest.fixture(scope="module")
def llm():
    return LLM()


def counted_scoring(monkeypatch, llm) -> list[list[int]]:
    """The prompts of the runner's scoring passes, as they happen."""
    runner = llm.engine.runner
    passes: list[list[int]] = []
    original = runner.score_prompt

    def counting(request):
        passes.append(list(request.prompt_ids))
        return original(request)

    monkeypatch.setattr(runner, "score_prompt", counting)
    return passes


def test_n_choices_of_a_prompt_are_scored_once(llm, monkeypatch):
    """n = 8 with prompt logprobs: one scoring pass, and every choice's prompt logprobs equal
    (exactly) those of the same prompt alone."""
    prompt = "ROMEO:\nWhat light through yonder window breaks?"
    alone = completions(
        llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=0, temperature=0.0))
    )[0]
    passes = counted_scoring(monkeypatch, llm)
    params = SamplingParams(max_tokens=3, temperature=1.0, n=8, prompt_logprobs=0)
    outputs = completions(llm.generate([prompt], params))
    assert len(passes) == 1
    assert len(alone.prompt_logprobs) > 5 and alone.prompt_logprobs[0] is None
    assert all(out.prompt_logprobs == alone.prompt_logprobs for out in outputs)


def test_choices_served_one_static_group_after_another_share_one_pass(monkeypatch):
    """n = 6 in static groups of 2: the choices waiting for a later group keep the first
    group's pass, and get the numbers the prompt alone gets."""
    llm = LLM(batch_size=2, policy="static")
    prompt = "JULIET:\nO Romeo, Romeo"
    alone = completions(
        llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=0, temperature=0.0))
    )[0]
    passes = counted_scoring(monkeypatch, llm)
    params = SamplingParams(max_tokens=2, temperature=1.0, n=6, prompt_logprobs=0)
    outputs = completions(llm.generate([prompt], params))
    assert len(llm.last_stats.groups) == 3
    assert len(passes) == 1
    assert all(out.prompt_logprobs == alone.prompt_logprobs for out in outputs)


def test_different_prompts_are_scored_apart(llm, monkeypatch):
    """Prompts that differ in their last token only are two passes, each with its own numbers,
    while a repeat of one of them shares its pass."""
    tokens = llm.tokenizer.encode("KING HENRY:\nOnce more unto the breach")
    other = tokens[:-1] + [(tokens[-1] + 1) % llm.engine.runner.model.config.vocab_size]
    params = SamplingParams(max_tokens=2, prompt_logprobs=0, temperature=0.0)
    each_alone = [
        completions(llm.generate([p], params))[0].prompt_logprobs for p in (tokens, other)
    ]
    passes = counted_scoring(monkeypatch, llm)
    outputs = completions(llm.generate([tokens, other, tokens], params))
    assert passes == [tokens, other]
    assert [out.prompt_logprobs for out in outputs] == [*each_alone, each_alone[0]]
    assert each_alone[0] != each_alone[1]


def test_a_prompts_record_is_dropped_when_its_requests_finish():
    """Stepped as a server steps it: the shared record lives while a request of its prompt runs,
    and is gone after the step that finishes the last; a request of that prompt admitted later
    is scored again, with the same numbers."""
    model = random_model(seed=3, vocab_size=60, n_positions=32)
    engine = Engine(ModelRunner(model), None, batch_size=4, policy="continuous")
    short = SamplingParams(max_tokens=1, prompt_logprobs=0, ignore_eos=True, temperature=0.0)
    long = SamplingParams(max_tokens=4, prompt_logprobs=0, ignore_eos=True, temperature=0.0)
    prompt = [5, 9, 2, 7]
    first = [make_request(engine, i, prompt, p) for i, p in enumerate((short, long))]
    engine.start_run()
    assert engine.add_requests(first) is None
    engine.step()
    assert first[0].finished and not first[1].finished
    assert list(engine.scored_prompts) == [tuple(prompt)]
    assert engine.scored_prompts[tuple(prompt)].holders == [first[1]]
    while engine.has_unfinished():
        engine.step()
    assert engine.scored_prompts == {}
    later = make_request(engine, 2, prompt, short)
    engine.add_request(later)
    engine.step()
    assert later.prompt_logprobs == first[0].prompt_logprobs == first[1].prompt_logprobs
    assert engine.scored_prompts == {}
