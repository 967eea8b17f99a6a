"""The strict stand-in's own teeth: each rule it keeps for CuPy, shown on a deliberately bad
snippet, and each count on a snippet whose cost is known by hand.  No GPU and no CuPy needed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, random_model
from round_costs import forward_without_syncs
from strict_cupy import API_FILE, StrictArray, StrictCuPy, strict_backend

import minirt.model.gpt2 as gpt2
from minirt.model.batch import Batch


@pytest.fixture
def xp() -> StrictCuPy:
    return StrictCuPy()


def kinds(stand_in: StrictCuPy) -> list[str]:
    return [finding.kind for finding in stand_in.findings]


# ------------------------------------------------------------------ what CuPy refuses


def test_implicit_conversion_to_numpy_is_refused(xp):
    device = xp.asarray(np.arange(3))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(device)
    assert kinds(xp) == ["implicit conversion"]


@pytest.mark.parametrize(
    "snippet",
    [
        lambda xp, device, host: device + host,
        lambda xp, device, host: host * device,
        lambda xp, device, host: xp.exp(host),
        lambda xp, device, host: xp.where(device > 0, host, 0.0),
        lambda xp, device, host: xp.matmul(device, host),
        lambda xp, device, host: device.__setitem__(slice(None), host),
    ],
    ids=["operator", "reflected operator", "ufunc", "function", "matmul", "assignment"],
)
def test_a_numpy_operand_is_refused(xp, snippet):
    device = xp.asarray(np.ones((3, 3), np.float32))
    host = np.ones((3, 3), np.float32)
    with pytest.raises(TypeError):
        snippet(xp, device, host)
    assert kinds(xp) == ["numpy operand"]


def test_an_unknown_keyword_or_name_is_refused(xp):
    with pytest.raises(TypeError, match="dtypo"):
        xp.zeros(3, dtypo=np.float32)
    with pytest.raises(TypeError, match="keepdim"):
        xp.asarray(np.ones(3)).sum(axis=0, keepdim=True)
    with pytest.raises(TypeError, match="initial"):
        xp.asarray(np.ones(3)).max(initial=0)
    # NumPy has these; CuPy does not.
    with pytest.raises(AttributeError):
        xp.erf  # noqa: B018
    with pytest.raises(AttributeError):
        xp.asarray(np.ones(3)).ctypes  # noqa: B018
    assert kinds(xp) == ["unknown keyword"] * 3


def test_an_index_out_of_range_is_reported_and_wraps_as_on_cupy(xp):
    table = xp.asarray(np.array([10, 11, 12]))
    got = table[xp.asarray(np.array([0, 4]))]
    assert got.get().tolist() == [10, 11]  # 4 wraps to 1, as CuPy does
    assert kinds(xp) == ["index out of range"]


def test_a_scatter_that_names_one_element_twice_is_reported(xp):
    cache = xp.zeros((4, 2), dtype=np.float32)
    slots = xp.asarray(np.array([1, 1]))
    cache[slots, :] = xp.asarray(np.ones((2, 2), np.float32))
    assert kinds(xp) == ["duplicate scatter"]
    distinct = xp.asarray(np.array([0, 1]))
    cache[distinct, :] = xp.asarray(np.ones((2, 2), np.float32))
    assert kinds(xp) == ["duplicate scatter"]


def test_a_sync_inside_forward_is_reported(monkeypatch):
    """A layer that reads a number back (here `int()` of a sum) syncs inside GPT2.forward."""
    stand_in = StrictCuPy()
    model = random_model(seed=0, backend=strict_backend(stand_in))
    forward_without_syncs(stand_in, monkeypatch)
    model.logits([[1, 2, 3]])
    assert stand_in.findings == []
    # GPT-2's blocks call the shared layer norm by this name.
    real_layer_norm = gpt2.layer_norm

    def syncing_layer_norm(xp, chains, x, ln, eps, tiles=None):
        if int(x.sum()) > 10**9:
            raise AssertionError("unreachable")
        return real_layer_norm(xp, chains, x, ln, eps, tiles)

    monkeypatch.setattr(gpt2, "layer_norm", syncing_layer_norm)
    model.logits([[1, 2, 3]])
    assert set(kinds(stand_in)) == {"sync"}
    assert "inside GPT2.forward" in str(stand_in.findings[0])


def test_only_elementwise_work_may_be_fused(xp):
    """cupy.fuse compiles elementwise arithmetic; a reduction or an index inside is a finding."""

    def with_a_reduction(x):
        return x - x.max()

    def elementwise(x):
        out = 2.0 * x
        xp.exp(out, out=out)
        return out

    device = xp.asarray(np.ones(4, np.float32))
    with xp.counting() as counts:
        xp.fuse(elementwise)(device)
    assert counts.operations == 1 and xp.findings == []
    xp.fuse(kernel_name="bad")(with_a_reduction)(device)
    assert kinds(xp) == ["not fusable"] and "max inside fused bad" in str(xp.findings[0])


# ------------------------------------------------------------------ what it counts


def test_views_cost_nothing_and_each_kernel_costs_one(xp):
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with xp.counting() as counts:
        device = xp.asarray(host)
        view = device.transpose(0, 2, 1)[:, 1:]
        xp.swapaxes(view, 0, 1)
        device.reshape(6, 4)
        total = (device * 2.0).sum(axis=-1)
    assert (counts.uploads, counts.bytes_uploaded) == (1, host.nbytes)
    assert counts.operations == 2  # the multiply and the sum
    with xp.counting() as counts:
        view.reshape(-1)  # not contiguous: a copy
        float(total[0, 0])
        total.get()
    assert counts.operations == 1 and counts.by_name == {"copy for reshape": 1}
    assert (counts.downloads, counts.syncs) == (2, 2)


def test_a_batched_matmul_counts_the_copies_cupy_makes():
    """cupy/_core/_routines_linalg.pyx: beyond 2-D both operands are made C-contiguous (and fp32
    for fp16) first; 2-D goes to cuBLAS as it is."""
    xp = StrictCuPy()
    keys = xp.zeros((2, 3, 8, 4), dtype=np.float32)[:, :, :5]  # a slice of a KV buffer
    queries = xp.zeros((2, 3, 1, 4), dtype=np.float32)
    with xp.counting() as counts:
        queries @ xp.swapaxes(keys, -1, -2)
    assert counts.operations == 2 and counts.by_name["copy for matmul"] == 1
    left = xp.zeros((3, 4), dtype=np.float16)
    right = xp.zeros((4, 5), dtype=np.float16)
    with xp.counting() as counts:
        left @ right
    assert counts.operations == 1
    queries16 = queries.astype(np.float16)
    values16 = xp.zeros((2, 3, 4, 5), dtype=np.float16)
    with xp.counting() as counts:
        queries16 @ values16
    # The matmul, an fp32 copy of each operand, and the result cast back to fp16.
    assert counts.operations == 1 + 2 + 1


def test_a_boolean_mask_index_syncs(xp):
    device = xp.asarray(np.arange(5))
    with xp.counting() as counts:
        device[device > 2]
    assert counts.syncs == 1


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=12),
    scale=st.floats(-4, 4, width=32),
    operation=st.sampled_from(["add", "mul", "sub", "truediv", "exp", "tanh", "where", "sum"]),
)
def test_the_numbers_are_numpys_own(values, scale, operation):
    """Whatever the stand-in counts, it computes what NumPy computes, bit for bit."""
    xp = StrictCuPy()
    host = np.array(values, dtype=np.float32)
    device = xp.asarray(host)
    factor = np.float32(scale)
    # Each operation, written once against a module: NumPy's on the host, the stand-in's.
    operations = {
        "add": lambda m, a: a + factor,
        "mul": lambda m, a: a * factor,
        "sub": lambda m, a: factor - a,
        "truediv": lambda m, a: a / (m.abs(a) + 1),
        "exp": lambda m, a: m.exp(a / 1e3),
        "tanh": lambda m, a: m.tanh(a),
        "where": lambda m, a: m.where(a > 0, a, 0.0),
        "sum": lambda m, a: a.sum(axis=-1, keepdims=True),
    }
    with np.errstate(all="ignore"):
        expected = operations[operation](np, host)
        result = operations[operation](xp, device)
    assert isinstance(result, StrictArray)
    np.testing.assert_array_equal(result.get(), expected)
    assert xp.findings == []


# ------------------------------------------------------------------ the record of CuPy's API


def names_minirt_calls_on_xp() -> set[str]:
    """Every `xp.NAME` and `backend.xp.NAME` in minirt's source."""
    names = set()
    for path in (ROOT / "minirt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "xp":
                    names.add(node.attr)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                if node.value.attr == "xp":
                    names.add(node.attr)
    return names


def test_every_name_minirt_calls_on_xp_is_in_cupys_api():
    record = json.loads(API_FILE.read_text(encoding="utf-8"))
    used = names_minirt_calls_on_xp()
    assert {"exp", "matmul", "copyto", "where", "asnumpy"} <= used  # the scan sees them
    # cuda and fuse are CuPy's own (NumPy lacks them: minirt asks for fuse with getattr).
    missing = sorted(name for name in used if name not in record["names"])
    assert missing == []


def test_the_record_is_of_a_real_cupy():
    record = json.loads(API_FILE.read_text(encoding="utf-8"))
    assert record["made_by"] == "tools/quality/cupy_api.py"
    assert record["cupy_version"].split(".")[0] == "14"
    assert record["names"]["tanh"]["kind"] == "ufunc"
    assert "keepdims" in record["ndarray"]["methods"]["sum"]["parameters"]["keywords"]
    assert "initial" not in record["ndarray"]["methods"]["max"]["parameters"]["keywords"]
    assert record["names"]["fuse"]["parameters"]["keywords"] == ["kernel_name"]


def test_the_record_matches_the_cupy_installed_here(tmp_path):
    """Where CuPy imports (it does without a GPU), the committed record is what the tool writes."""
    cupy = pytest.importorskip("cupy")
    if not hasattr(cupy, "ndarray"):
        pytest.skip("a folder named cupy, not CuPy")
    import subprocess
    import sys

    out = tmp_path / "api.json"
    tool = ROOT / "tools" / "quality" / "cupy_api.py"
    subprocess.run([sys.executable, str(tool), "--out", str(out)], check=True)
    fresh = json.loads(out.read_text(encoding="utf-8"))
    committed = json.loads(API_FILE.read_text(encoding="utf-8"))
    if fresh["cupy_version"] != committed["cupy_version"]:
        pytest.skip(
            f"CuPy {fresh['cupy_version']} here, the record is of {committed['cupy_version']}"
        )
    assert fresh["names"] == committed["names"]
    assert fresh["ndarray"] == committed["ndarray"]


def test_the_stand_in_stays_out_of_minirt():
    for path in (ROOT / "minirt").rglob("*.py"):
        assert "strict_cupy" not in path.read_text(encoding="utf-8"), path


def test_batches_on_the_stand_in_cost_one_upload(xp):
    backend = strict_backend(xp)
    with xp.counting() as counts:
        Batch([[1, 2, 3], [], [4]], backend, slots=[2, 0, 1], past_lens=[0, 3, 1])
    assert counts.uploads == 1 and counts.operations == 0


def test_the_api_record_is_small_enough_to_commit():
    assert Path(API_FILE).stat().st_size < 1_000_000


def test_the_stand_ins_own_methods_take_only_cupys_keywords():
    """The methods written out by hand (astype, reshape, get, ...) check their keywords by their
    Python signatures: each of those must be CuPy's, as recorded."""
    import inspect

    record = json.loads(API_FILE.read_text(encoding="utf-8"))["ndarray"]["methods"]
    written = ["astype", "reshape", "transpose", "swapaxes", "get", "item", "tolist"]
    for name in written:
        parameters = inspect.signature(getattr(StrictArray, name)).parameters
        keywords = {
            p.name
            for p in parameters.values()
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        assert keywords <= set(record[name]["parameters"]["keywords"]), name


def test_an_index_of_several_arrays_costs_what_cupy_launches(xp):
    """cupy/_core/_routines_indexing.pyx: with k > 1 index arrays, the flat index is zeroed, one
    kernel per array adds its part, then one take (or scatter): k + 2.  One array: one kernel."""
    table = xp.zeros((4, 3, 5), dtype=np.float32)
    first = xp.asarray(np.array([0, 2]))
    second = xp.asarray(np.array([1, 4]))
    with xp.counting() as counts:
        table[first, :, second]
    assert counts.operations == 2 + 2
    values = xp.zeros((2, 3), dtype=np.float32)
    with xp.counting() as counts:
        table[first, :, second] = values
    assert counts.operations == 2 + 2
    with xp.counting() as counts:
        table[first]
    assert counts.operations == 1


def test_a_list_operand_and_a_fused_functions_result(xp):
    """CuPy's ufuncs take arrays and scalars, not lists; what a fused function returns is a new
    array, even an argument it updated in place."""
    device = xp.asarray(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        xp.exp([1.0, 2.0])
    with pytest.raises(TypeError):
        device + [1.0, 2.0, 3.0]

    def doubled_in_place(x):
        x *= 2.0
        return x

    result = xp.fuse(doubled_in_place)(device)
    assert result is not device and result.get().tolist() == [2.0, 2.0, 2.0]
    assert device.get().tolist() == [2.0, 2.0, 2.0]
    assert kinds(xp) == ["numpy operand", "numpy operand"]
