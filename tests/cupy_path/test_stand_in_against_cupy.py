"""The stand-in's rules, confirmed against a real CuPy on a GPU (marked `gpu`;
tools/bench/device_check.py runs them): each rule it keeps, CuPy keeps too, and each copy it
counts, CuPy allocates."""

from __future__ import annotations

import numpy as np
import pytest

from strict_cupy import StrictCuPy

from minirt.errors import BackendError
from minirt.model.backend import cupy_backend
from minirt.model.fusion import elementwise_chains


def real_cupy():
    try:
        return cupy_backend().xp
    except BackendError:
        return None


CUPY = real_cupy()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUPY is None, reason="needs CuPy and a usable NVIDIA GPU"),
]

SNIPPETS = {
    "implicit conversion": lambda xp: np.asarray(xp.arange(3)),
    "numpy operand": lambda xp: xp.arange(3) + np.arange(3),
    "numpy operand of a ufunc": lambda xp: xp.exp(np.ones(3)),
    "unknown keyword": lambda xp: xp.zeros(3, dtypo=np.float32),
    "unknown method keyword": lambda xp: xp.arange(3).max(initial=0),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_what_the_stand_in_refuses_cupy_refuses_alike(name):
    snippet = SNIPPETS[name]
    with pytest.raises(Exception) as real:
        snippet(CUPY)
    with pytest.raises(Exception) as stand_in:
        snippet(StrictCuPy())
    assert type(stand_in.value) is type(real.value), (real.value, stand_in.value)


def test_an_index_out_of_range_wraps_on_cupy_as_the_stand_in_computes():
    for xp in (CUPY, StrictCuPy()):
        got = xp.asarray(np.array([10, 11, 12]))[xp.asarray(np.array([0, 4]))]
        assert got.get().tolist() == [10, 11]


def test_a_reduction_gives_a_device_array():
    assert isinstance(CUPY.arange(3).sum(), CUPY.ndarray)
    stand_in = StrictCuPy()
    assert isinstance(stand_in.arange(3).sum(), stand_in.ndarray)


def allocations(xp, work) -> int:
    """Device allocations `work` makes (CuPy's allocator hook)."""
    pool = xp.cuda.MemoryPool()
    count = 0

    def counting_malloc(size):
        nonlocal count
        count += 1
        return pool.malloc(size)

    with xp.cuda.using_allocator(counting_malloc):
        work()
        xp.cuda.get_current_stream().synchronize()
    return count


def test_a_batched_matmul_copies_what_the_stand_in_counts():
    """Beyond 2-D, a sliced operand costs CuPy one more buffer (its contiguous copy)."""
    cache = CUPY.zeros((2, 3, 8, 4), dtype=np.float32)
    queries = CUPY.zeros((2, 3, 1, 4), dtype=np.float32)
    contiguous = CUPY.ascontiguousarray(CUPY.swapaxes(cache, -1, -2))
    sliced = CUPY.swapaxes(cache[:, :, :5], -1, -2)
    plain = allocations(CUPY, lambda: queries @ contiguous)
    copied = allocations(CUPY, lambda: queries @ sliced)
    assert copied == plain + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_each_chain_fused_by_cupy_equals_numpys_run(dtype):
    """cupy.fuse compiles minirt's chains; each gives what NumPy's unfused run gives: its result,
    or, for a chain that works in place, its first argument afterwards."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 16)).astype(dtype)
    x32 = x.astype(np.float32)
    weight = rng.standard_normal(16).astype(dtype)
    bias = rng.standard_normal(16).astype(dtype)
    cases = {
        "gelu_tanh": (x,),
        "gelu_erf": (x,),
        "centered_on_mean": (x32, x32.sum(axis=-1, keepdims=True), 16),
        "normalize_scale_shift": (
            x32,
            rng.random((5, 1)).astype(np.float32) + 8,
            16,
            1e-5,
            weight,
            bias,
        ),
        "shift_and_exp": (x32, x32.max(axis=-1, keepdims=True)),
        "weighted_mean_or_zero": (x32, np.full((5, 1), 3.0, np.float32), rng.random((5, 1)) < 0.7),
    }
    on_numpy = elementwise_chains(np)
    on_cupy = elementwise_chains(CUPY)
    tolerance = 1e-6 if dtype == np.float32 else 2e-3
    for name, arguments in cases.items():
        host_arguments = [np.array(a) if isinstance(a, np.ndarray) else a for a in arguments]
        device_arguments = [CUPY.asarray(a) if isinstance(a, np.ndarray) else a for a in arguments]
        want = getattr(on_numpy, name)(*host_arguments)
        got = getattr(on_cupy, name)(*device_arguments)
        if want is None:
            # In place: compare the first argument, which the chain updated.
            assert got is None, name
            want = host_arguments[0]
            got = device_arguments[0]
        got = CUPY.asnumpy(got)
        assert got.dtype == want.dtype, name
        scale = max(float(np.abs(want).max()), 1.0)
        assert float(np.abs(got.astype(np.float64) - want).max()) <= tolerance * scale, name
