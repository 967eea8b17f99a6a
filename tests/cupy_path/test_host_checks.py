"""What CuPy does differently from NumPy, refused on the host before any device work: an index out
of range wraps around silently on CuPy (NumPy raises), and a scatter that names one element twice
is undefined there.  So `GPT2.forward` checks every token id and `logits_at`, and `Batch` checks its
slots, on NumPy and CuPy alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_model
from strict_cupy import StrictCuPy, strict_backend

from minirt.errors import InputError
from minirt.evaluate import text_loss
from minirt.model.backend import numpy_backend
from minirt.model.batch import Batch

VOCAB = 50


def backends():
    """NumPy, and a fresh stand-in (whose findings the test reads)."""
    stand_in = StrictCuPy()
    return [(numpy_backend(), None), (strict_backend(stand_in), stand_in)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.lists(st.integers(-3, VOCAB + 3), min_size=1, max_size=6), min_size=1, max_size=4
    )
)
def test_a_token_id_outside_the_vocabulary_is_refused_before_the_device_sees_it(rows):
    """Refused (naming the id) exactly when some id lies outside [0, V); else the logits of both
    backends are equal.  On the stand-in no wrapped index is ever found: nothing reached it."""
    outside = [t for row in rows for t in row if not 0 <= t < VOCAB]
    results = []
    for backend, stand_in in backends():
        model = random_model(seed=1, backend=backend, vocab_size=VOCAB)
        batch = Batch(rows, backend)
        if outside:
            with pytest.raises(InputError, match=f"token id {outside[0]} is outside"):
                model.forward(batch, logits_at=np.arange(batch.n_tokens))
        else:
            logits = model.forward(batch, logits_at=np.arange(batch.n_tokens))
            results.append(backend.to_numpy(logits))
        if stand_in is not None:
            assert stand_in.findings == []
    if not outside:
        np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize(
    "logits_at, message",
    [
        ([0, 3], "index 3 is outside the round's 3 tokens"),
        ([-1], "index -1 is outside"),
        ([0.0, 1.0], "integer token indices"),
        ([[0, 1]], "1-D"),
    ],
)
def test_logits_at_must_name_the_rounds_own_tokens(logits_at, message):
    for backend, stand_in in backends():
        model = random_model(seed=1, backend=backend)
        batch = Batch([[1, 2, 3]], backend)
        with pytest.raises(InputError, match=message):
            model.forward(batch, logits_at=logits_at)
        if stand_in is not None:
            assert stand_in.findings == []


def test_an_empty_logits_at_gives_no_rows():
    model = random_model(seed=1)
    assert model.forward(Batch([[1, 2]], numpy_backend()), logits_at=[]).shape == (0, 50)


@pytest.mark.parametrize(
    "slots, past_lens, message",
    [
        ([1, 1], [0, 0], "share a KV slot"),
        ([0, -1], [0, 0], "negative"),
        ([0, 1], [0, -2], "negative"),
    ],
)
def test_each_row_of_a_round_has_a_slot_of_its_own(slots, past_lens, message):
    with pytest.raises(InputError, match=message):
        Batch([[1], [2]], numpy_backend(), slots=slots, past_lens=past_lens)


def test_a_slot_beyond_the_cache_is_refused_before_anything_is_written():
    stand_in = StrictCuPy()
    backend = strict_backend(stand_in)
    model = random_model(seed=1, backend=backend)
    cache = model.new_kv_cache(n_slots=2, capacity=8)
    with pytest.raises(ValueError, match="KV slot 2 is not in the cache, which has 2 slots"):
        model.forward(Batch([[1], [2]], backend, slots=[0, 2]), cache)
    assert stand_in.findings == [] and not cache.written.any()


def test_text_loss_refuses_an_id_outside_the_vocabulary():
    for backend, stand_in in backends():
        model = random_model(seed=1, backend=backend, n_positions=16)
        with pytest.raises(InputError, match="token id 50 is outside"):
            text_loss(model, [1, 2, 3, 50, 4], window=4, stride=2)
        if stand_in is not None:
            assert stand_in.findings == []
