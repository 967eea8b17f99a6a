"""Hostile checkpoint files are refused in one line, never a crash.

A safetensors header is untrusted input.  Each of these is refused with one line naming the file (and the
tensor), through the API and through `minirt.generate`: header fields of the wrong type (offsets that are
strings, a dtype that is a list, shape entries that are strings, floats, bools, negative or past 2**63),
tensors whose byte ranges alias or overlap, a shard index whose weight_map does not map names to file names or
is empty (each blamed on the index), and a config.json whose sizes imply billions of weights, refused in well
under a second with the memory it asks for, before anything is allocated by it.  The positive controls load:
adjacent tensors, and zero-size tensors at any boundary between them, share no bytes and leave no hole (read
as the safetensors library reads them); a config whose weights fit the files at 2 bytes each passes the size
check.  The last section holds what fuzzing found: a tensor name with a line break, an integer too long for
Python to parse, a config whose size does not fit a float, a shape of half a million dimensions; each must
still be one line, and quick.  test_fuzz_loader.py fuzzes the same readers with random files, and
test_loading_header_rules.py holds the format's other rules (names given twice, holes, padding, metadata).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from conftest import DTYPE_BYTES, FIXTURES, ROOT, bounded
from minirt import LLM
from minirt.loading.checkpoint import load_checkpoint
from minirt.cli.command import EXIT_USAGE, run_command
from minirt.errors import CheckpointError
from minirt.generate import main as generate_main
from minirt.loading.safetensors_header import read_safetensors_header


BASE = FIXTURES / "base"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
OLD = b'{"an": "existing record"}\n'


def examples(n: int) -> settings:
    """n examples, no deadline, a tmp_path or model_dir reused (each example overwrites the same files)."""
    return settings(
        max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


# ---------------------------------------------------------------- helpers


def split_file(path: Path) -> tuple[dict, bytes]:
    """(header, data section) of a safetensors file, read here without minirt."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def join_file(path: Path, header, data: bytes) -> None:
    """Write a safetensors file: any JSON value as its header (padded to 8 bytes), then `data`."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def refusal(call, *args) -> str:
    """The one-line message of the CheckpointError that `call(*args)` raises."""
    with pytest.raises(CheckpointError) as exc:
        call(*args)
    message = str(exc.value)
    assert message and len(message.splitlines()) == 1 and "\n" not in message, message
    return message


def same_size_pair(header: dict) -> tuple[str, str]:
    """Two tensors of a header with the same dtype and shape, so that one can alias the other."""
    seen = {}
    for name, info in sorted(header.items()):
        if name != "__metadata__":
            key = (info["dtype"], tuple(info["shape"]))
            if key in seen:
                return seen[key], name
            seen[key] = name
    raise AssertionError("no two tensors of the same size")


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A writable copy of the base fixture."""
    shutil.copytree(BASE, tmp_path / "model")
    return tmp_path / "model"


# ---------------------------------------------------------------- header fields of the wrong type

BIG = st.one_of(
    st.integers(min_value=2**63 - 1, max_value=2**63 + 8),
    st.integers(min_value=2**64, max_value=2**80),
)
NOT_A_COUNT = st.one_of(
    st.integers(max_value=-1),
    st.floats(),
    st.sampled_from([4.0, 0.0, -0.0, 1e300]),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.sampled_from(["4", "0", "32", "0x10"]),
    st.lists(st.integers(0, 4), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(0, 4), max_size=2),
)
NOT_A_LIST = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.dictionaries(st.text(max_size=2), st.integers(0, 4), max_size=2),
)
NOT_A_DTYPE = st.one_of(
    st.lists(st.sampled_from(["F32", "F16"]), max_size=2),
    st.sampled_from(["f32", "F32 ", "FP32", "float32", "F31", "", "__proto__"]),
    st.text(max_size=5).filter(lambda s: s not in DTYPE_BYTES),
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
)


def twin(n: int):
    """Values that equal the count n in Python or look like it, but are not JSON integers: only the type check
    can refuse them, since the sizes still add up."""
    return st.sampled_from(
        [float(n), str(n), [n], {"n": n}] + ([bool(n)] * 3 if n in (0, 1) else [])
    )


@st.composite
def broken_field(draw, info: dict) -> tuple[str, object]:
    """(which field, the entry with that field made the wrong type or size): nothing about it is valid."""
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "entry"]))
    if field == "dtype":
        return field, {**info, "dtype": draw(NOT_A_DTYPE)}
    if field == "shape":
        shape = list(info["shape"])
        if draw(st.booleans()):
            return field, {**info, "shape": draw(NOT_A_LIST)}
        position = draw(st.integers(0, len(shape)))
        if draw(st.booleans()) and shape:  # in place of a dimension, or inserted between them
            position = min(position, len(shape) - 1)
            shape[position] = draw(
                st.one_of(twin(shape[position]), twin(shape[position]), NOT_A_COUNT, BIG)
            )
        else:
            shape.insert(position, draw(st.one_of(twin(1), twin(1), NOT_A_COUNT, BIG)))
        return field, {**info, "shape": shape}
    if field == "data_offsets":
        offsets = list(info["data_offsets"])
        how = draw(st.sampled_from(["not_a_list", "length", "start", "end", "strings"]))
        if how == "not_a_list":
            return field, {**info, "data_offsets": draw(NOT_A_LIST)}
        if how == "length":
            n = draw(st.sampled_from([0, 1, 3, 4]))
            return field, {**info, "data_offsets": (offsets * 2)[:n]}
        if how == "strings":
            return field, {**info, "data_offsets": [str(n) for n in offsets]}
        at = 1 if how == "end" else 0
        offsets[at] = draw(st.one_of(twin(offsets[at]), twin(offsets[at]), NOT_A_COUNT, BIG))
        return field, {**info, "data_offsets": offsets}
    if draw(
        st.booleans()
    ):  # the whole entry: not an object, or an object without one of its three keys
        return field, draw(
            st.one_of(
                NOT_A_LIST.filter(lambda v: not isinstance(v, dict)),
                st.lists(st.integers(0, 4), max_size=3),
            )
        )
    dropped = draw(st.sampled_from(sorted(info)))
    return field, {k: v for k, v in info.items() if k != dropped}


@examples(150)
@given(data=st.data())
def test_header_fields_of_the_wrong_type_are_refused_naming_the_tensor(model_dir, data):
    header, body = split_file(BASE / WEIGHTS)
    name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    field, header[name] = data.draw(broken_field(header[name]))
    join_file(model_dir / WEIGHTS, header, body)
    message = refusal(read_safetensors_header, model_dir / WEIGHTS)
    assert str(model_dir / WEIGHTS) in message and repr(name) in message and "damaged" in message, (
        message
    )
    assert {"dtype": "dtype", "shape": "shape", "data_offsets": "offsets", "entry": "header entry"}[
        field
    ] in message
    assert (
        refusal(load_checkpoint, model_dir) == message
    )  # the loader says the same, before it looks at shapes


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        (
            "data_offsets",
            ["0", "128"],
            "data_offsets ['0', '128'], which are not two integers >= 0",
        ),
        ("dtype", ["F32"], "unknown dtype ['F32']"),
        ("shape", ["32"], "shape ['32'], which is not a list of integers >= 0"),
        ("shape", [True, 32], "shape [True, 32]"),
        ("shape", [32.0], "shape [32.0]"),
        ("shape", [-32], "shape [-32]"),
        (
            "shape",
            [2**64, 2**64],
            "shape [18446744073709551616, 18446744073709551616], whose dimensions do not all fit",
        ),
        # No bytes at all, but a dimension the format cannot hold (the safetensors library refuses it).
        ("shape", [2**64, 0], "shape [18446744073709551616, 0], whose dimensions do not all fit"),
        # The library multiplies left to right in 64 bits: an overflow before the 0 is refused.
        (
            "shape",
            [2**63, 2**63, 0, 1],
            "shape [9223372036854775808, 9223372036854775808, 0, 1], whose size overflows 64 bits",
        ),
        ("shape", [2**62, 4, 0], "whose size overflows 64 bits"),
        ("data_offsets", [0, 2**64], "offsets 0..18446744073709551616 that do not fit"),
        ("data_offsets", [False, 128], "data_offsets [False, 128]"),
    ],
)
def test_each_wrong_field_is_named(model_dir, field, value, fragment):
    header, body = split_file(BASE / WEIGHTS)
    header["transformer.ln_f.bias"][field] = value
    join_file(model_dir / WEIGHTS, header, body)
    message = refusal(load_checkpoint, model_dir)
    assert (
        f"{model_dir / WEIGHTS}: tensor 'transformer.ln_f.bias' has " in message
        and fragment in message
    ), message


@pytest.mark.parametrize(
    "prefix, header_text, fragment",
    [
        (2**64 - 1, b"{}", "header claims 18446744073709551615 bytes"),
        (100_000_001, b"{}", "truncated or not a safetensors file"),
        (None, b"[1, 2]", "not a JSON object"),
        (None, b'"text"', "not a JSON object"),
        (None, b'{"a": ', "its header is not JSON"),
        (None, b"\xff\xfe{}", "its header is not JSON"),
        (None, b"[" * 100_000 + b"]" * 100_000, "not a safetensors file"),
    ],
)
def test_a_header_that_lies_about_its_length_or_is_not_an_object_is_refused(
    model_dir, prefix, header_text, fragment
):
    length = len(header_text) if prefix is None else prefix
    (model_dir / WEIGHTS).write_bytes(struct.pack("<Q", length) + header_text + b"\0" * 16)
    assert fragment in refusal(load_checkpoint, model_dir)


# ---------------------------------------------------------------- tensors that share bytes


def test_a_tensor_that_aliases_another_in_a_real_model_is_refused(model_dir):
    header, body = split_file(BASE / WEIGHTS)
    first, second = same_size_pair(header)
    header[second]["data_offsets"] = list(
        header[first]["data_offsets"]
    )  # same shape and dtype: it would load
    join_file(model_dir / WEIGHTS, header, body)
    message = refusal(load_checkpoint, model_dir)
    assert "share bytes" in message and first in message and second in message, message


def u8_tensor(start: int, length: int) -> dict:
    return {"dtype": "U8", "shape": [length], "data_offsets": [start, start + length]}


@st.composite
def overlapping_pair(draw) -> tuple[dict, dict]:
    """Two non-empty byte ranges sharing at least one byte: an exact alias, one inside the other, or a partial
    overlap from either side."""
    a_start, a_len = draw(st.integers(0, 64)), draw(st.integers(1, 64))
    b_start = draw(st.integers(max(0, a_start - 64), a_start + a_len - 1))
    b_len = draw(st.integers(max(1, a_start - b_start + 1), 130))
    if draw(st.integers(0, 4)) == 0:
        b_start, b_len = a_start, a_len  # an exact alias
    return u8_tensor(a_start, a_len), u8_tensor(b_start, b_len)


@examples(100)
@given(
    pair=overlapping_pair(),
    dtype=st.sampled_from(["U8", "I8", "BOOL", "F8_E4M3"]),
    others=st.lists(st.integers(0, 16), max_size=4),
    names=st.lists(st.text("abc.0_", min_size=1, max_size=6), min_size=2, max_size=2, unique=True),
    order=st.randoms(use_true_random=False),
)
def test_tensors_whose_bytes_overlap_are_refused(tmp_path, pair, dtype, others, names, order):
    a, b = ({**t, "dtype": dtype} for t in pair)
    entries = [(names[0], a), (names[1], b)]
    first = min(a["data_offsets"][0], b["data_offsets"][0])
    if first:  # the bytes before the pair belong to a tensor, so that no hole is refused first
        entries.append(("filler", u8_tensor(0, first)))
    end = max(a["data_offsets"][1], b["data_offsets"][1])
    for i, length in enumerate(others):  # bystanders after them, adjacent: not part of the overlap
        entries.append((f"other{i}", u8_tensor(end, length)))
        end += length
    order.shuffle(entries)
    join_file(tmp_path / WEIGHTS, dict(entries), bytes(end))
    message = refusal(read_safetensors_header, tmp_path / WEIGHTS)
    assert "share bytes" in message and names[0] in message and names[1] in message, message


@examples(100)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(1, 40)), max_size=8),
    empties=st.data(),
    order=st.randoms(use_true_random=False),
)
def test_adjacent_and_zero_size_tensors_share_no_bytes_and_load(tmp_path, lengths, empties, order):
    """The positive control: tensors back to back, and empty ones at any boundary between them (the very start
    and the very end of the data included), in any order in the header, are accepted as written, and read as
    the safetensors library reads them."""
    entries = {}
    end = 0
    boundaries = [0]
    for i, length in enumerate(lengths):
        entries[f"t{i}"] = u8_tensor(end, length)
        end += length
        boundaries.append(end)
    for j in range(empties.draw(st.integers(0, 3))):
        at = empties.draw(st.sampled_from(boundaries))
        entries[f"empty{j}"] = {
            "dtype": empties.draw(st.sampled_from(sorted(DTYPE_BYTES))),
            "shape": empties.draw(st.sampled_from([[0], [3, 0], [0, 5, 2]])),
            "data_offsets": [at, at],
        }
    items = list(entries.items())
    order.shuffle(items)
    join_file(tmp_path / WEIGHTS, dict(items), bytes(end))
    got, data_offset = read_safetensors_header(tmp_path / WEIGHTS)
    assert data_offset + end == (tmp_path / WEIGHTS).stat().st_size
    assert {name: (e.dtype, list(e.shape), [e.start, e.end]) for name, e in got.items()} == {
        name: (info["dtype"], info["shape"], info["data_offsets"]) for name, info in entries.items()
    }
    with safe_open(str(tmp_path / WEIGHTS), "numpy") as f:  # the reference reads the same
        assert {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in f.keys()} == {
            name: (e.dtype, list(e.shape)) for name, e in got.items()
        }


def test_a_zero_size_tensor_past_the_end_of_the_file_is_refused(tmp_path):
    join_file(tmp_path / WEIGHTS, {"a": u8_tensor(0, 8), "empty": u8_tensor(9, 0)}, bytes(8))
    assert "truncated" in refusal(read_safetensors_header, tmp_path / WEIGHTS)


# ---------------------------------------------------------------- shard indexes whose weight_map is not names


@pytest.mark.parametrize(
    "index, fragment",
    [
        (
            {"weight_map": {"transformer.wte.weight": ["model-00001-of-00003.safetensors"]}},
            "refused shard name ['model-00001-of-00003.safetensors'] for tensor 'transformer.wte.weight'",
        ),
        (
            {
                "weight_map": {
                    "transformer.wte.weight": {"file": "model-00001-of-00003.safetensors"}
                }
            },
            "refused shard name {'file': 'model-00001-of-00003.safetensors'} for tensor",
        ),
        (
            {"weight_map": {"transformer.wte.weight": 2**70}},
            "refused shard name 1180591620717411303424",
        ),
        ({"weight_map": {"transformer.wte.weight": 1.5e300}}, "refused shard name 1.5e+300"),
        (
            {"weight_map": ["model-00001-of-00003.safetensors"]},
            "not a valid shard index (its weight_map is list, not an object",
        ),
        (
            {"weight_map": "model-00001-of-00003.safetensors"},
            "not a valid shard index (its weight_map is str, not an object",
        ),
        ({"weight_map": None}, "not a valid shard index (its weight_map is NoneType"),
        # No shards at all: the index is to blame, not config.json (whose weights the files lack).
        ({"weight_map": {}}, "model.safetensors.index.json: its weight_map is empty"),
        ({"metadata": {}}, "not a valid shard index"),
        ([{"weight_map": {}}], "not a valid shard index"),
    ],
)
def test_a_weight_map_that_does_not_map_names_to_file_names_is_refused(tmp_path, index, fragment):
    """Beyond test_model_folder.py's scalar names: unhashable names, and a weight_map or index of the wrong type
    or empty.  Every non-string value is refused, none is used as a path, and each refusal names the index."""
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "sharded", folder)
    real = json.loads((folder / INDEX).read_text())
    if (
        isinstance(index, dict)
        and isinstance(index.get("weight_map"), dict)
        and index["weight_map"]
    ):
        index = {
            "weight_map": {**real["weight_map"], **index["weight_map"]}
        }  # one bad value among good ones
    (folder / INDEX).write_text(json.dumps(index))
    message = refusal(load_checkpoint, folder)
    assert fragment in message and message.startswith(f"{folder / INDEX}: "), message


# ---------------------------------------------------------------- configs that imply billions of weights


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_head", True),
        ("n_head", 4.0),
        ("n_layer", 2.0),
        ("n_layer", "2"),
        ("n_embd", [32]),
        ("vocab_size", 128.0),
        ("n_positions", "64"),
        ("n_inner", 128.0),
        ("n_inner", True),
        ("n_ctx", 64.0),
        ("bos_token_id", False),
        ("eos_token_id", 0.0),
        ("eos_token_id", [0.0]),
        ("scale_attn_weights", 1),
        ("tie_word_embeddings", "true"),
        ("layer_norm_epsilon", "1e-5"),
        ("layer_norm_epsilon", [1e-5]),
        ("activation_function", ["gelu_new"]),
    ],
)
def test_a_config_field_of_the_wrong_type_is_refused_even_when_its_value_fits(
    model_dir, field, value
):
    """Each of these equals (or spells) a value the weights fit, so only the type check can refuse it."""
    raw = json.loads((BASE / "config.json").read_text())
    if field == "n_ctx":
        del raw["n_positions"]
    (model_dir / "config.json").write_text(json.dumps({**raw, field: value}))
    message = refusal(load_checkpoint, model_dir)
    assert (
        str(model_dir / "config.json") in message
        and field.replace("n_ctx", "n_positions") in message
    ), message


def weights_implied(raw: dict) -> int:
    """How many numbers a GPT-2 of this config holds, counted here from the tensor shapes (a tied head once)."""
    V, P, C, L = raw["vocab_size"], raw["n_positions"], raw["n_embd"], raw["n_layer"]
    n_inner = raw.get("n_inner") or 4 * C
    block = [
        (C,),
        (C,),
        (C, 3 * C),
        (3 * C,),
        (C, C),
        (C,),
        (C,),
        (C,),
        (C, n_inner),
        (n_inner,),
        (n_inner, C),
        (C,),
    ]
    return V * C + P * C + L * sum(math.prod(shape) for shape in block) + 2 * C


@pytest.mark.parametrize(
    "changes",
    [
        {"n_layer": 10**9},
        {"n_embd": 10**9},  # n_head 4 divides it
        {"n_positions": 3 * 10**8},
        {"vocab_size": 10**12},
        {"n_inner": 10**9},
        {"n_layer": 10**9, "n_embd": 4 * 10**9, "n_positions": 10**9, "vocab_size": 10**12},
    ],
    ids=lambda c: "-".join(f"{k}={v:.0e}" for k, v in c.items()),
)
def test_a_config_implying_billions_of_weights_is_refused_quickly_with_the_memory(
    model_dir, changes
):
    raw = {**json.loads((BASE / "config.json").read_text()), **changes}
    (model_dir / "config.json").write_text(json.dumps(raw))
    n = weights_implied(raw)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with bounded(seconds=20):
            message = refusal(load_checkpoint, model_dir)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"implies {n:,} weights ({n * 4 / 2**30:,.1f} GiB in float32)" in message, message
    assert str(model_dir / "config.json") in message, message
    assert elapsed < 2, f"refused after {elapsed:.1f} s"
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_the_size_check_allows_two_bytes_a_weight_and_no_fewer(model_dir):
    """The boundary, from the file's size: the largest n_positions whose weights fit the files at 2 bytes each
    passes the size check (and fails the shape check, naming wpe.weight); one more position is refused by size."""
    raw = json.loads((BASE / "config.json").read_text())
    file_bytes = (BASE / WEIGHTS).stat().st_size
    fits = max(
        p
        for p in range(raw["n_positions"], 10**5)
        if 2 * weights_implied({**raw, "n_positions": p}) <= file_bytes
    )
    assert (
        4 * weights_implied({**raw, "n_positions": fits}) > file_bytes
    )  # more than the file holds in float32
    (model_dir / "config.json").write_text(json.dumps({**raw, "n_positions": fits}))
    message = refusal(load_checkpoint, model_dir)
    assert "weights (" not in message and "wpe.weight" in message, message
    (model_dir / "config.json").write_text(json.dumps({**raw, "n_positions": fits + 1}))
    assert f"implies {weights_implied({**raw, 'n_positions': fits + 1}):,} weights (" in refusal(
        load_checkpoint, model_dir
    )


# ---------------------------------------------------------------- through the command line


def damage(folder: Path, how: str) -> tuple[str, ...]:
    """Damage the model in `folder` one way; the fragments its refusal must contain."""
    path = folder / WEIGHTS
    header, body = split_file(path)
    first = sorted(k for k in header if k != "__metadata__")[0]
    if how == "offsets_as_strings":
        header[first]["data_offsets"] = [str(n) for n in header[first]["data_offsets"]]
        fragments = (f"tensor {first!r} has data_offsets ['",)
    elif how == "dtype_a_list":
        header[first]["dtype"] = [header[first]["dtype"]]
        fragments = (f"tensor {first!r} has unknown dtype [",)
    elif how == "shape_past_2_63":
        header[first]["shape"] = [2**63, *header[first]["shape"]]
        fragments = (f"tensor {first!r} has shape [9223372036854775808", "overflows 64 bits")
    elif how == "aliased":
        first, second = same_size_pair(header)
        header[second]["data_offsets"] = list(header[first]["data_offsets"])
        fragments = ("share bytes", first, second)
    elif how == "length_lies":
        path.write_bytes(struct.pack("<Q", 2**64 - 1) + path.read_bytes()[8:])
        return ("header claims 18446744073709551615 bytes",)
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return ("truncated safetensors file",)
    else:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, "n_layer": 10**9}))
        return ("implies", "GiB in float32")
    join_file(path, header, body)
    return (str(path), *fragments)


@pytest.mark.parametrize(
    "how",
    [
        "offsets_as_strings",
        "dtype_a_list",
        "shape_past_2_63",
        "aliased",
        "length_lies",
        "truncated",
        "config_n_layer_1e9",
    ],
)
def test_generate_refuses_a_damaged_checkpoint_in_one_line_and_leaves_output_untouched(
    tmp_path, tiny_lm, how
):
    folder = tmp_path / "m"
    shutil.copytree(tiny_lm, folder)
    fragments = damage(folder, how)
    (tmp_path / "p.txt").write_text("To be\n")
    output = tmp_path / "out.jsonl"
    output.write_bytes(OLD)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), bounded(seconds=60):
        code = run_command(
            generate_main,
            [
                "--backend",
                "numpy",
                "--model",
                str(folder),
                "--prompts",
                str(tmp_path / "p.txt"),
                "--output",
                str(output),
            ],
            prog="minirt.generate",
        )
    lines = err.getvalue().splitlines()
    assert code == EXIT_USAGE == 2 and len(lines) == 1 and err.getvalue().endswith("\n"), (
        err.getvalue()
    )
    assert lines[0].startswith("minirt.generate: error: ") and all(
        f in lines[0] for f in fragments
    ), lines[0]
    assert "Traceback" not in err.getvalue() and out.getvalue() == ""
    assert output.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m",
        "out.jsonl",
        "p.txt",
    ]  # no partial file left


def test_generate_in_its_own_process_exits_2_on_aliased_tensors(tmp_path, tiny_lm):
    folder = tmp_path / "m"
    shutil.copytree(tiny_lm, folder)
    fragments = damage(folder, "aliased")
    (tmp_path / "p.txt").write_text("To be\n")
    output = tmp_path / "out.jsonl"
    output.write_bytes(OLD)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minirt.generate",
            "--backend",
            "numpy",
            "--model",
            str(folder),
            "--prompts",
            str(tmp_path / "p.txt"),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(f in result.stderr for f in fragments), result.stderr
    assert output.read_bytes() == OLD


# ---------------------------------------------------------------- found by fuzzing: still one line, still quick


@pytest.mark.parametrize("layout", ["overlap", "past_the_end", "unexpected"])
def test_a_tensor_name_with_a_line_break_is_refused_in_one_line(model_dir, layout):
    """A name is the file's to choose: a refusal that prints it must not become two lines on the terminal."""
    header, body = split_file(BASE / WEIGHTS)
    name = "evil\nminirt.generate: all is well"
    if layout == "overlap":
        header[name] = dict(header["transformer.ln_f.bias"])
    elif layout == "past_the_end":
        header[name] = u8_tensor(len(body), 16)
    else:  # a well-formed empty tensor: the header is fine, the loader names it as unexpected
        header[name] = u8_tensor(0, 0)
    join_file(model_dir / WEIGHTS, header, body)
    refusal(load_checkpoint, model_dir)


def test_a_number_too_long_to_convert_is_refused_in_one_line(model_dir):
    """Python refuses to parse an integer of more than 4,300 digits, with a ValueError that is no JSONDecodeError."""
    text = json.dumps({"a": u8_tensor(0, 0)}).replace("[0]", "[" + "9" * 5000 + "]")
    (model_dir / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text.encode())
    assert str(model_dir / WEIGHTS) in refusal(load_checkpoint, model_dir)
    shutil.copy(BASE / WEIGHTS, model_dir / WEIGHTS)
    config = (BASE / "config.json").read_text()
    (model_dir / "config.json").write_text(
        config.replace('"n_layer": 2', '"n_layer": ' + "9" * 5000)
    )
    assert str(model_dir / "config.json") in refusal(load_checkpoint, model_dir)


@pytest.mark.parametrize(
    "changes",
    [
        {"n_embd": 10**200, "n_head": 1},
        {"vocab_size": 10**320},
        {"n_layer": 10**2000, "n_embd": 10**2000, "n_head": 1},
    ],
    ids=["gib_past_float", "vocab_1e320", "weights_past_4300_digits"],
)
def test_a_config_whose_size_does_not_fit_a_float_is_refused_in_one_line(model_dir, changes):
    raw = {**json.loads((BASE / "config.json").read_text()), **changes}
    (model_dir / "config.json").write_text(json.dumps(raw))
    with bounded(seconds=20):
        assert str(model_dir / "config.json") in refusal(load_checkpoint, model_dir)


@pytest.mark.parametrize(
    "first, last, end",
    [("2", "2", 1), ("2", "0", 0), ("0", "2", 0)],
    ids=["refused", "overflowing_before_its_zero_refused", "zero_first_empty_and_accepted"],
)
def test_a_shape_with_half_a_million_dimensions_is_read_quickly(tmp_path, first, last, end):
    """Multiplying out a shape of 2s one dimension at a time takes quadratic time; a 1 MB header must not.  The
    format's reader multiplies left to right in 64 bits: 2s before a zero overflow first and are refused, as the
    safetensors library refuses them; a zero first makes the tensor empty, and fine."""
    dims = ",".join([first] + ["2"] * 500_000 + [last])
    text = '{"a": {"dtype": "U8", "shape": [' + dims + '], "data_offsets": [0, %d]}}' % end
    (tmp_path / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text.encode() + b"\0" * end)
    start = time.perf_counter()
    with bounded(seconds=30):
        if first != "0":
            refusal(read_safetensors_header, tmp_path / WEIGHTS)
        else:
            assert len(read_safetensors_header(tmp_path / WEIGHTS)[0]["a"].shape) == 500_002
    assert time.perf_counter() - start < 1


# ---------------------------------------------------------------- files that are not small JSON


@pytest.mark.parametrize("file_name", ["config.json", "generation_config.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "oversized"])
def test_a_json_file_that_is_not_a_small_regular_file_is_refused_without_reading_it(
    model_dir, file_name, kind
):
    """Before: a FIFO hung the loader forever, /dev/zero ate memory, a sparse 17 MiB file was read whole."""
    path = model_dir / file_name
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(17 * 2**20)
    start = time.perf_counter()
    with (
        pytest.raises(CheckpointError) as exc,
        bounded(5),
    ):  # a hang or a runaway read fails, not blocks, the suite
        LLM(model_dir)
    assert (
        time.perf_counter() - start < 5
        and file_name in str(exc.value)
        and "\n" not in str(exc.value)
    )
    assert "not a regular file of at most 16 MiB" in str(exc.value)


def test_an_untied_config_without_lm_head_is_refused(model_dir):
    """transformers would give such a head random numbers; before, minirt silently tied it to wte."""
    config = json.loads((model_dir / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match="no lm_head.weight, but config.json says tie_word_embeddings false"
    ):
        load_checkpoint(model_dir)
    untied = (
        FIXTURES / "untied_head"
    )  # the positive control: an untied config with its own head loads
    assert not load_checkpoint(untied).head_is_tied
