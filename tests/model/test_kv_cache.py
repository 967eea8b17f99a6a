"""The KV cache (minirt/model/kv_cache.py): a pool of per-request slots, preallocated once and filled in place.

* a slot is a view into the pool holding its request's keys and values for every layer, the same as a run
  of that request alone; the pool's size is known before it is allocated, and it never exceeds the context;
* a round that would write past a slot's capacity is refused;
* decoding with the cache, token by token or in chunks, rows out of step and slots shuffled (the gather
  read), gives the logits of a full recompute (`model.logits` scores without a KV cache, so this compares
  two independent ways of computing attention);
* a slot given to a new request (`reset_slot`) carries nothing of its previous occupant: neither stale keys
  past its length nor an earlier overflow (inf, NaN).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minirt
from conftest import model_choice, model_for, random_model, relative_error, token_lists
from minirt.model.batch import Batch

TOL = 1e-5  # fp32: different batch shapes reorder BLAS sums, nothing more
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def model():
    return random_model(seed=11, vocab_size=60, n_positions=32)


# ------------------------------------------------------------------ the pool and its slots


def test_a_request_owns_its_kv_buffer():
    """Slot 1 of a shared pool holds its request's keys for every layer, equal to a run of it alone."""
    model = random_model(seed=3)
    cache = model.new_kv_cache(n_slots=2, capacity=6)
    model.forward(Batch([[1, 2, 3], [4, 5]], model.backend, slots=[1, 0]), cache)
    assert cache.lengths.tolist() == [2, 3]
    keys_together, values_together = (
        cache.keys[:, 1, :, :3],
        cache.values[:, 1, :, :3],
    )  # [n_layer, H, 3, D]
    alone = model.new_kv_cache(n_slots=1, capacity=6)
    model.forward(Batch([[1, 2, 3]], model.backend), alone)
    keys_alone, values_alone = alone.keys[:, 0, :, :3], alone.values[:, 0, :, :3]
    assert keys_together.shape == (2, 2, 3, 8)
    assert np.allclose(keys_together, keys_alone, atol=1e-6) and np.allclose(
        values_together, values_alone, atol=1e-6
    )
    assert np.shares_memory(keys_together, cache.keys)  # a view into the preallocated pool


def test_kv_cache_budget_arithmetic():
    model = random_model()
    cache = model.new_kv_cache(n_slots=3, capacity=5)
    held = cache.keys.nbytes + cache.values.nbytes
    assert (
        held
        == minirt.model.kv_cache.KVCache.bytes_needed(2, 2, 8, 3, 5, np.float32)
        == 2 * 2 * 3 * 2 * 5 * 8 * 4
    )
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model.new_kv_cache(n_slots=1, capacity=33)


def test_kv_write_refuses_overflow():
    model = model_for(1, 0)
    cache = model.new_kv_cache(n_slots=1, capacity=2)
    with pytest.raises(ValueError, match="capacity"):
        model.forward(Batch([[1, 2, 3]], model.backend), cache)


# ------------------------------------------------------------------ reading back what was written


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


# ------------------------------------------------------------------ a slot's next occupant


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


def test_an_overflowed_slot_cannot_poison_its_next_occupant(model):
    cache = model.new_kv_cache(n_slots=1, capacity=8)
    cache.values[:, 0] = np.inf  # whatever an earlier request left behind, even an fp16 overflow
    cache.keys[:, 0] = np.nan
    cache.reset_slot(0)
    from minirt.model.batch import Batch

    logits = model.backend.to_numpy(
        model.forward(Batch([[4, 5, 6]], model.backend), cache, logits_at=[0, 1, 2])
    )
    assert np.isfinite(logits).all()
    assert np.allclose(logits, model.logits([[4, 5, 6]])[0], atol=1e-5)
