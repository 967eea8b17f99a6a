"""The model's own checks, each reached on its own.

The engine refuses a prompt longer than the context, caps every KV capacity at it, and never runs a round
past a slot's capacity, so through the engine these checks never fire: an earlier one always pre-empts
them.  A check nothing reaches can drift unseen (`>=` becoming `>`), so each is called here directly, and
its boundary is pinned by hand: the positions 0 .. n_positions - 1 exist, n_positions does not.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_model
from minirt.errors import InputError
from minirt.model.batch import Batch

N_POSITIONS = 12


@pytest.fixture(scope="module")
def model():
    return random_model(seed=4, n_positions=N_POSITIONS, vocab_size=20)


@settings(max_examples=60, deadline=None)
@given(past=st.integers(0, N_POSITIONS + 2), new=st.integers(1, N_POSITIONS + 2))
def test_forward_refuses_exactly_the_positions_past_the_context(model, past, new):
    """A row of `new` tokens after `past` cached ones reaches position past + new - 1."""
    cache = model.new_kv_cache(n_slots=1, capacity=N_POSITIONS)
    batch = Batch([[1] * new], model.backend, slots=[0], past_lens=[past])
    last_position = past + new - 1
    if last_position < N_POSITIONS:
        logits = model.forward(batch, cache)
        assert logits.shape == (1, 20)
        return
    with pytest.raises(InputError) as refused:
        model.forward(batch, cache)
    assert f"past the context of {N_POSITIONS}" in str(refused.value)
    assert f"a position reaches {last_position}" in str(refused.value)
    # Refused before anything was written: the slot holds nothing.
    assert int(cache.lengths[0]) == 0


def test_forward_without_a_cache_refuses_past_keys(model):
    batch = Batch([[1, 2]], model.backend, past_lens=[3])
    with pytest.raises(InputError, match="needs the KV cache"):
        model.forward(batch)


def test_a_kv_cache_may_hold_the_context_but_not_more(model):
    assert model.new_kv_cache(n_slots=2, capacity=N_POSITIONS).capacity == N_POSITIONS
    with pytest.raises(ValueError, match=f"exceeds the model's context of {N_POSITIONS}"):
        model.new_kv_cache(n_slots=2, capacity=N_POSITIONS + 1)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, N_POSITIONS), past=st.integers(0, N_POSITIONS), new=st.integers(1, 4)
)
def test_a_round_that_would_overfill_a_slot_is_refused_before_it_writes(model, capacity, past, new):
    """The cache's own capacity check, below the context (a static group's cache is sized to its
    members): exactly the rounds that would hold more than `capacity` keys are refused."""
    if past + new > N_POSITIONS:
        # The position check comes first; that boundary is the test above.
        return
    cache = model.new_kv_cache(n_slots=1, capacity=capacity)
    batch = Batch([[1] * new], model.backend, slots=[0], past_lens=[past])
    if past + new <= capacity:
        cache.prepare_round(batch)
        assert bool(cache.written[0])
        return
    with pytest.raises(ValueError, match=f"would hold {past + new} positions"):
        cache.prepare_round(batch)
    assert not bool(cache.written[0])


def test_the_last_position_gives_the_same_logits_in_one_pass_or_after_a_cache(model):
    """At the boundary itself (position n_positions - 1) the model still computes: the whole context in
    one pass and the same tokens fed one by one agree."""
    tokens = [int(t) for t in np.arange(N_POSITIONS) % 20]
    whole = model.logits([tokens])[0, -1]
    cache = model.new_kv_cache(n_slots=1, capacity=N_POSITIONS)
    model.forward(Batch([tokens[:-1]], model.backend, slots=[0]), cache)
    last = Batch([tokens[-1:]], model.backend, slots=[0], past_lens=[N_POSITIONS - 1])
    stepped = model.backend.to_numpy(model.forward(last, cache))[0]
    np.testing.assert_allclose(stepped, whole, rtol=1e-5, atol=1e-5)
