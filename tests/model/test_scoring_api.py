"""`model.logits`, the public scoring API: its input checks, and the shapes it returns (empty inputs included)."""

import numpy as np
import pytest

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
