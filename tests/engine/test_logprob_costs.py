"""What log-probabilities cost the engine's one thread, and that the cheaper ways give the same
numbers as the plain ones, bit for bit.

* **Top logprobs** (`logprobs=k`): the k most likely tokens come from a partition and a sort of
  the candidates, not a sort of the whole vocabulary: the same tokens in the same order as the
  stable full sort (equal values by id), checked against it on values with many ties.  A row's
  log-softmax is computed once, for its chosen token and its top k alike.
* **Prompt logprobs** (echo with logprobs): the log-softmax runs over a block of prompt positions
  at a time, never [L, V] in float64 at once, with the numbers of the whole computation, written
  out here by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minirt import SamplingParams
from minirt.engine import sampler
from minirt.engine.sampler import PROMPT_ROWS_AT_ONCE, most_likely, prompt_logprobs, top_logprobs
from minirt.model.backend import numpy_backend


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
            params=SamplingParams(temperature=0, logprobs=4),
            rng=request_rng(k),
            want_logprobs=True,
            prompt_ids=[1],
            token_ids=[],
        )
        for k in range(3)
    ]
    chosen = choose_tokens(numpy_backend(), logits, rows)
    assert calls == [(50,)] * 3
    for row, (token, logprob, top) in zip(logits, chosen, strict=True):
        want = full_log_softmax(row)
        assert token == int(np.argmax(row)) and logprob == float(want[token])
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
