"""Invariants of the padded, KV-cached forward pass, checked by hypothesis.

The expected values are invariants, not minirt's own pasted output:
  * a row's logits do not depend on its padding or on the other rows, nor on a row of the same decode round
    that brings no token;
  * permuting the rows permutes the output and nothing else;
  * a row with no valid keys produces finite numbers.

Decoding with the KV cache against a full recompute is in test_kv_cache.py.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import model_choice, model_for, random_model, relative_error, token_lists
from minirt.model.batch import Batch

TOL = 1e-5  # fp32: different batch shapes reorder BLAS sums, nothing more
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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


def test_a_decode_round_with_an_empty_row_leaves_the_others_alone():
    """A decode round may carry a row with no new token (padded [B, H, 1, L] with a hole): the other rows'
    logits equal those of the same round without that row, so padding lands on the right rows."""
    model = random_model(seed=5)
    prompts, slots = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [2, 0, 1]
    caches = [model.new_kv_cache(n_slots=3, capacity=8) for _ in range(2)]
    for cache in caches:
        model.forward(Batch(prompts, model.backend, slots=slots), cache)
    past = [len(p) for p in prompts]
    with_hole = model.forward(
        Batch([[10], [], [11]], model.backend, slots=slots, past_lens=past), caches[0]
    )
    without = model.forward(
        Batch([[10], [11]], model.backend, slots=[2, 1], past_lens=[3, 4]), caches[1]
    )
    assert with_hole.shape == without.shape == (2, model.config.vocab_size)
    np.testing.assert_allclose(with_hole, without, rtol=1e-5, atol=1e-6)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [2, 5, 4]
