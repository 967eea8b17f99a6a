"""`model.logits`, the public scoring API: its input checks, and the shapes it returns (empty inputs included)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minirt
from conftest import FIXTURES


@pytest.fixture(scope="module")
def base_model():
    return minirt.load_model(FIXTURES / "base")


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ([[1, 2, 128]], "sequence 0 token id 128 is outside the vocabulary [0, 128)"),
        ([[5], [-1]], "sequence 1 token id -1"),
        ([list(range(65))], "65 tokens, more than the model's context of 64"),
        ([["a", "b"]], "not a list of integer token ids"),
        (np.zeros((2, 3), dtype=int), "list of token-id lists"),
        ("hello", "list of token-id lists"),
    ],
)
def test_logits_rejects_bad_token_ids(base_model, bad, fragment):
    with pytest.raises(minirt.InputError) as exc:
        base_model.logits(bad)
    assert fragment in str(exc.value)


def test_logits_shapes_and_empty_inputs(base_model):
    assert base_model.logits([]).shape == (0, 0, 128)
    assert base_model.logits([[]]).shape == (1, 0, 128)
    out = base_model.logits([[1, 2, 3], [4]])
    assert out.shape == (2, 3, 128) and out.dtype == np.float32


# ------------------------------------------------------------------ logits_at: the order asked


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_logits_at_follows_the_order_asked_permuted_or_repeated(base_model, data):
    """`forward(batch, logits_at=at)` returns row i of the logits at packed token at[i], in the
    order asked: a permutation of every token, repeats and a subset alike.  The reference is
    the same batch scored in packed order (every token, in order), indexed by hand."""
    from minirt.model.batch import Batch

    rows = data.draw(
        st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=6), min_size=1, max_size=4),
        label="rows",
    )
    n_tokens = sum(map(len, rows))
    every = st.permutations(range(n_tokens))
    repeated = st.lists(st.integers(0, n_tokens - 1), min_size=1, max_size=2 * n_tokens)
    at = data.draw(st.one_of(every, repeated), label="logits_at")
    backend = base_model.backend
    in_order = backend.to_numpy(
        base_model.forward(Batch(rows, backend), logits_at=list(range(n_tokens)))
    )  # [N, V]
    got = backend.to_numpy(base_model.forward(Batch(rows, backend), logits_at=list(at)))
    assert got.shape == (len(at), 128)
    np.testing.assert_allclose(got, in_order[list(at)], rtol=0, atol=1e-5)
    # Packed order is row by row, each row's tokens in order: the same as `logits` unpacked.
    unpacked = base_model.logits(rows)
    packed = np.concatenate([unpacked[b, : len(r)] for b, r in enumerate(rows)])
    np.testing.assert_allclose(in_order, packed, rtol=0, atol=1e-5)


def test_logits_at_reversed_and_twice_by_hand(base_model):
    """Two rows of 3 and 2 tokens: packed tokens 0-2 are row 0's, 3-4 row 1's.  Asked for
    [4, 3, 2, 1, 0] and [2, 2, 0], the rows come back in exactly that order."""
    from minirt.model.batch import Batch

    rows = [[1, 2, 3], [4, 5]]
    full = base_model.logits(rows)  # [2, 3, V]
    by_hand = [full[1, 1], full[1, 0], full[0, 2], full[0, 1], full[0, 0]]
    backend = base_model.backend
    got = backend.to_numpy(base_model.forward(Batch(rows, backend), logits_at=[4, 3, 2, 1, 0]))
    np.testing.assert_allclose(got, np.stack(by_hand), rtol=0, atol=1e-5)
    got = backend.to_numpy(base_model.forward(Batch(rows, backend), logits_at=[2, 2, 0]))
    np.testing.assert_allclose(got, np.stack([full[0, 2], full[0, 2], full[0, 0]]), atol=1e-5)
