"""Backend choice: numpy always works; cupy works or fails in one clear line."""

import numpy as np
import pytest

import minirt
from conftest import FIXTURES
from minirt.model.backend import get_backend, resolve_dtype
from minirt.errors import BackendError


def cupy_usable() -> bool:
    try:
        get_backend("cupy")
    except BackendError:
        return False
    return True


def test_numpy_backend_round_trip():
    backend, note = get_backend("numpy")
    assert backend.name == "numpy" and note is None
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    on_backend = backend.asarray(host)
    assert np.shares_memory(on_backend, host)  # NumPy: no copy when the dtype already fits
    back = backend.to_numpy(backend.asarray(host, dtype=np.float64))
    assert back.dtype == np.float64 and np.array_equal(back, host)


def test_unknown_backend_and_dtype():
    with pytest.raises(BackendError, match="choose one of auto, numpy, cupy"):
        get_backend("tpu")
    with pytest.raises(BackendError, match="unknown dtype 'bfloat16'"):
        resolve_dtype("bfloat16")
    assert resolve_dtype("fp16") == np.float16 and resolve_dtype("float32") == np.float32


@pytest.mark.skipif(cupy_usable(), reason="a usable GPU is present")
def test_cupy_without_a_gpu_is_one_clear_line():
    with pytest.raises(BackendError) as exc:
        get_backend("cupy")
    message = str(exc.value)
    assert "\n" not in message and "--backend numpy" in message
    with pytest.raises(BackendError):
        minirt.load_model(FIXTURES / "base", backend="cupy")


@pytest.mark.skipif(cupy_usable(), reason="a usable GPU is present")
def test_auto_falls_back_to_numpy_and_says_so():
    backend, note = get_backend("auto")
    assert backend.name == "numpy" and "numpy" in note


def test_float16_compute_on_numpy_stays_close():
    """fp16 is the user's choice even on the CPU; statistics and softmax stay fp32 inside."""
    model32 = minirt.load_model(FIXTURES / "fp16_file", dtype="float32")
    model16 = minirt.load_model(FIXTURES / "fp16_file", dtype="float16")
    assert (
        model16.params["wpe.weight"].dtype == np.float16 and model16.head_weight.dtype == np.float32
    )
    seqs = [[1, 2, 3, 4, 5], [6, 7]]
    ref, got = model32.logits(seqs), model16.logits(seqs)
    assert got.dtype == np.float32
    err = np.abs(got[0, :5] - ref[0, :5]).max() / np.abs(ref[0, :5]).max()
    assert err < 2e-2, err
