"""Invariants of the padded, KV-cached forward pass, checked by hypothesis.

The expected values are invariants, not minirt's own pasted output:
  * a row's logits do not depend on its padding or on the other rows;
  * decoding with the KV cache, token by token or in chunks, gives the logits
    of a full recompute;
  * permuting the rows permutes the output and nothing else;
  * a row with no valid keys produces finite numbers.

`model.logits` scores without a KV cache, so the cache-decode test compares
two independent ways of computing attention.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_model, relative_error
from minirt.model.batch import Batch

TOL = 1e-5  # fp32: different batch shapes reorder BLAS sums, nothing more
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MODELS = {}


def model_for(n_head: int, seed: int):
    """Cache a few random models; configs vary the head count and the MLP width."""
    key = (n_head, seed)
    if key not in MODELS:
        MODELS[key] = random_model(
            seed=seed,
            n_head=n_head,
            n_embd=6 * n_head,
            n_inner=10 * n_head,
            vocab_size=37,
            n_positions=24,
        )
    return MODELS[key]


model_choice = st.builds(model_for, n_head=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2))
token_lists = st.lists(
    st.lists(st.integers(0, 36), min_size=1, max_size=24), min_size=1, max_size=5
)


@SETTINGS
@given(model=model_choice, sequences=token_lists)
def test_padding_and_neighbours_never_change_a_row(model, sequences):
    """Each sequence alone == the same sequence at any row of a padded batch."""
    alone = [model.logits([seq])[0, : len(seq)] for seq in sequences]
    batched = model.logits(sequences)  # [B, max_len, V]
    for b, seq in enumerate(sequences):
        assert relative_error(batched[b, : len(seq)], alone[b]) <= TOL
    assert np.isfinite(batched).all()


@SETTINGS
@given(model=model_choice, sequences=token_lists, data=st.data())
def test_row_permutation_changes_nothing(model, sequences, data):
    order = data.draw(st.permutations(range(len(sequences))))
    straight = model.logits(sequences)
    permuted = model.logits([sequences[i] for i in order])
    for new_row, old_row in enumerate(order):
        n = len(sequences[old_row])
        assert relative_error(permuted[new_row, :n], straight[old_row, :n]) <= TOL


@SETTINGS
@given(model=model_choice, sequences=token_lists, data=st.data())
def test_kv_cache_decode_equals_full_recompute(model, sequences, data):
    """Prefill a prefix of each row, then feed the rest in random-size chunks, rows out of step.

    Slots are shuffled (so the KV read takes the gather path, not the
    contiguous view), and each round only some rows take part.  At every
    position the logits must equal those of running the whole sequence at once.
    """
    full = model.logits(sequences)  # [B, max_len, V], the full recompute
    B = len(sequences)
    slots = np.array(data.draw(st.permutations(range(B + 1))))[
        :B
    ]  # one spare slot, rows out of order
    cache = model.new_kv_cache(n_slots=B + 1, capacity=max(len(s) for s in sequences))
    fed = [0] * B  # tokens of each row already in its slot
    got = [np.zeros((len(s), model.config.vocab_size), np.float32) for s in sequences]
    while any(fed[b] < len(sequences[b]) for b in range(B)):
        pending = [b for b in range(B) if fed[b] < len(sequences[b])]
        rows = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        chunks = []
        for b in rows:
            n = data.draw(st.integers(1, len(sequences[b]) - fed[b]))
            chunks.append(sequences[b][fed[b] : fed[b] + n])
        batch = Batch(
            chunks, model.backend, slots=slots[rows], past_lens=cache.lengths[slots[rows]]
        )
        packed = model.forward(
            batch, cache, logits_at=np.arange(batch.n_tokens)
        )  # [N, V], the real tokens
        logits = batch.unpack_on_host(model.backend.to_numpy(packed))  # [len(rows), T, V]
        for i, (b, chunk) in enumerate(zip(rows, chunks, strict=True)):
            got[b][fed[b] : fed[b] + len(chunk)] = logits[i, : len(chunk)]
            fed[b] += len(chunk)
    for b, seq in enumerate(sequences):
        assert relative_error(got[b], full[b, : len(seq)]) <= TOL
        assert cache.lengths[slots[b]] == len(seq)


@SETTINGS
@given(sequences=token_lists, data=st.data())
def test_each_rows_positions_continue_its_own_history(sequences, data):
    """Packed token k of row b sits at past_lens[b] + (its place in the row), whatever the padding."""
    past_lens = data.draw(
        st.lists(st.integers(0, 9), min_size=len(sequences), max_size=len(sequences))
    )
    batch = Batch(sequences, random_model().backend, past_lens=past_lens)
    want = [
        past + i for seq, past in zip(sequences, past_lens, strict=True) for i in range(len(seq))
    ]
    assert batch.positions.tolist() == want
    assert batch.kv_lens.tolist() == [
        past + len(seq) for seq, past in zip(sequences, past_lens, strict=True)
    ]
    assert batch.last_index.tolist() == (np.cumsum([len(s) for s in sequences]) - 1).tolist()


def test_row_with_no_valid_keys_is_finite():
    """A row that brings no tokens and has no history sees no key at all: zeros, not NaN."""
    model = model_for(2, 0)
    cache = model.new_kv_cache(n_slots=3, capacity=8)
    batch = Batch([[1, 2, 3], [], [4]], model.backend)
    logits = model.backend.to_numpy(
        model.forward(batch, cache, logits_at=np.arange(batch.n_tokens))
    )  # [4, V]
    assert logits.shape[0] == 4 and np.isfinite(logits).all()  # 3 + 0 + 1 real tokens
    assert cache.lengths.tolist() == [3, 0, 1]
    assert np.isfinite(model.logits([[5, 6], []])).all()


def test_stale_slot_contents_are_masked():
    """Garbage left in a slot beyond its length must not reach the next request."""
    model = model_for(3, 1)
    cache = model.new_kv_cache(n_slots=1, capacity=10)
    model.forward(Batch([[9, 8, 7, 6, 5, 4, 3]], model.backend), cache)
    cache.reset_slot(0)  # a new request takes the slot
    logits = model.backend.to_numpy(
        model.forward(Batch([[1, 2]], model.backend), cache, logits_at=[0, 1])
    )  # [2, V]
    assert relative_error(logits, model.logits([[1, 2]])[0]) <= TOL


def test_kv_write_refuses_overflow():
    model = model_for(1, 0)
    cache = model.new_kv_cache(n_slots=1, capacity=2)
    with pytest.raises(ValueError, match="capacity"):
        model.forward(Batch([[1, 2, 3]], model.backend), cache)
