"""The safetensors format's own rules for a header, each refused in one line naming the file and the tensor.

The format (huggingface/safetensors, README "Format"): 8 bytes of little-endian header size N; N bytes of UTF-8
JSON, an object that begins with `{` and may be padded at its end with spaces (0x20); each tensor entry holds
exactly dtype, shape and data_offsets, the offsets relative to the byte buffer after the header; `__metadata__`
is a map of strings to strings; duplicate keys are disallowed; the byte buffer is entirely indexed, with no
holes and no overlap.  Python's json would keep the last of two entries with one name and ignore the other's
bytes; minirt refuses it, as it does every other breach of these rules.

The reference is the safetensors library (the format's own reader, never minirt's code): a hypothesis property
makes valid layouts, breaks each with one flaw, and checks that minirt refuses every flaw, in one line naming
the file and the thing at fault, and that every flaw the library also refuses is one the library refuses (so
that the test's reading of the format is the library's); the unbroken layouts, both accept and read alike.
Where the library is more lenient than the format's text (a tensor named twice, a key twice in `__metadata__`,
an unknown field, white space before the header or a line break after it, `__metadata__: null`), minirt keeps
to the text.  Then two checks the file-size check always pre-empts through the loader, pinned by calling the
reader on its own (a header over 100,000,000 bytes; a tensor over 2**63 - 1 bytes), the dtype codes the format
has added since (valid, but not minirt's), and the command line: exit 2, one line, no traceback.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from conftest import FIXTURES, ROOT
from minirt.errors import CheckpointError
from minirt.loading.checkpoint import load_checkpoint
from minirt.loading.safetensors_header import read_entry, read_safetensors_header

BASE = FIXTURES / "base"
WEIGHTS = "model.safetensors"
# The sizes the format gives its codes, written out here rather than imported.
DTYPE_BYTES = {
    "U8": 1,
    "I8": 1,
    "BOOL": 1,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "F32": 4,
    "F64": 8,
}
# The safetensors library refuses a header one byte longer than this ("header too large").
LIBRARY_MAX_HEADER = 100_000_000


def examples(n: int) -> settings:
    return settings(
        max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


# ---------------------------------------------------------------- writing headers by hand


def as_json(value) -> str:
    """JSON text of a value whose objects are lists of (key, value) pairs, so that a key can be given twice.
    Strings are escaped to ASCII, so a lone surrogate is written as the escape \\ud800."""
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {as_json(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(as_json(v) for v in value) + "]"
    return json.dumps(value)


class Pairs(list):
    """A JSON object as its (key, value) pairs, in order."""


def entry(dtype: str, shape: list, start: int) -> Pairs:
    size = DTYPE_BYTES[dtype]
    for n in shape:
        size *= n
    return Pairs([("dtype", dtype), ("shape", shape), ("data_offsets", [start, start + size])])


def write_file(path: Path, header_text: str, data_len: int) -> None:
    """A safetensors file: the length, the header text exactly as given, `data_len` zero bytes."""
    raw = header_text.encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data_len))


def library_reading(path: Path) -> dict | None:
    """{name: (dtype, shape)} as the safetensors library reads the file, or None where it refuses it."""
    try:
        with safe_open(str(path), "numpy") as f:
            return {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in f.keys()}
    except Exception:  # noqa: BLE001 (any exception of the library's is its refusal)
        return None


def refusal(path: Path) -> str:
    """The one-line message of the CheckpointError that reading `path`'s header raises, which names the file."""
    with pytest.raises(CheckpointError) as exc:
        read_safetensors_header(path)
    message = str(exc.value)
    assert len(message.splitlines()) == 1 and "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    return message


# ---------------------------------------------------------------- valid layouts, one flaw each

NAME = st.text("abcxyz._0123", min_size=1, max_size=8)


@st.composite
def layouts(draw) -> tuple[list[tuple[str, Pairs]], Pairs | None, int]:
    """(tensor pairs, in header order; __metadata__ or None; the data section's size): a valid file, the
    tensors back to back from byte 0 to the end, empty ones (a 0 in the shape) among them."""
    names = draw(st.lists(NAME, min_size=1, max_size=5, unique=True))
    tensors = []
    offset = 0
    for name in names:
        dtype = draw(st.sampled_from(sorted(DTYPE_BYTES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        tensors.append((name, entry(dtype, shape, offset)))
        offset = offsets_of(tensors[-1][1])[1]
    tensors = draw(st.permutations(tensors))
    metadata = None
    if draw(st.booleans()):
        keys = draw(
            st.lists(st.text("kv_", min_size=1, max_size=3), min_size=1, max_size=3, unique=True)
        )
        metadata = Pairs((key, draw(st.text("pt xyz", max_size=4))) for key in keys)
    return list(tensors), metadata, offset


def header_text(tensors, metadata) -> str:
    pairs = Pairs(tensors if metadata is None else [("__metadata__", metadata), *tensors])
    return as_json(pairs)


def offsets_of(info: Pairs) -> list[int]:
    return dict(info)["data_offsets"]


def sized(tensors) -> list[tuple[str, Pairs]]:
    """The tensors that hold bytes, in the order of their offsets."""
    return sorted(
        (t for t in tensors if offsets_of(t[1])[1] > offsets_of(t[1])[0]),
        key=lambda t: offsets_of(t[1]),
    )


def shifted(info: Pairs, by: int) -> Pairs:
    start, end = offsets_of(info)
    return Pairs((k, [start + by, end + by] if k == "data_offsets" else v) for k, v in info)


# Each flaw: (header text, data size, what the message must say, whether the library refuses it too).  None
# for the last: the library is more lenient than the format's text, and minirt keeps to the text.
FLAWS = [
    "tensor_twice",
    "field_twice",
    "metadata_key_twice",
    "metadata_twice",
    "metadata_not_strings",
    "metadata_lone_surrogate",
    "unknown_field",
    "hole",
    "bytes_after_the_last",
    "empty_inside",
    "begins_with_space",
    "not_space_after",
    "minus_zero",
    "lone_surrogate",
]


@st.composite
def one_flaw(draw, flaw: str):
    tensors, metadata, data_len = draw(layouts())
    index = draw(st.integers(0, len(tensors) - 1))
    name, info = tensors[index]
    if flaw == "tensor_twice":  # Python's json keeps the last, the other's bytes are ignored
        other = draw(st.sampled_from([info for _, info in tensors]))
        tensors.insert(draw(st.integers(0, len(tensors))), (name, other))
        return header_text(tensors, metadata), data_len, [f"names tensor {name!r} twice"], None
    if flaw == "field_twice":
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        value = dict(info)[field]
        tensors[index] = (name, Pairs([*info, (field, value)]))
        return (
            header_text(tensors, metadata),
            data_len,
            [f"tensor {name!r} has the field {field!r} twice"],
            True,
        )
    if flaw == "metadata_key_twice":
        metadata = metadata or Pairs([("format", "pt")])
        key, value = draw(st.sampled_from(list(metadata)))
        metadata = Pairs([*metadata, (key, draw(st.sampled_from([value, "np"])))])
        return (
            header_text(tensors, metadata),
            data_len,
            [f"__metadata__ holds the key {key!r} twice"],
            None,
        )
    if flaw == "metadata_twice":
        metadata = metadata or Pairs([("format", "pt")])
        pairs = Pairs([("__metadata__", metadata), *tensors, ("__metadata__", metadata)])
        return as_json(pairs), data_len, ["names __metadata__ twice"], True
    if flaw == "metadata_not_strings":
        bad = draw(st.sampled_from(["value", "null", "list", "string"]))
        if bad == "value":  # keys of "kv_" only: "format" and "n" are new ones
            key = draw(st.sampled_from(["format", "n"]))
            value = draw(st.sampled_from([1, 1.5, True, None, ["pt"], Pairs([("a", "b")])]))
            metadata = Pairs([*(metadata or []), (key, value)])
            text = header_text(tensors, metadata)
            fragment = f"__metadata__ maps {key!r} to "
        else:
            value = {"null": None, "list": ["pt"], "string": "pt"}[bad]
            text = as_json(Pairs([("__metadata__", value), *tensors]))
            fragment = "not a map of strings to strings"
        # null: the library reads it as no metadata at all
        return text, data_len, ["__metadata__", fragment], None if bad == "null" else True
    if flaw == "metadata_lone_surrogate":  # in a key or in a value
        key = draw(st.sampled_from(["format", "n\udc00"]))
        value = "pt" if key != "format" else draw(st.sampled_from(["\ud800", "p\udfff"]))
        metadata = Pairs([*(metadata or []), (key, value)])
        fragment = f"__metadata__ entry {key!r} holds a lone surrogate"
        return header_text(tensors, metadata), data_len, [fragment], True
    if flaw == "unknown_field":
        field = draw(st.sampled_from(["offsets", "byte_order", "Dtype", "dtype ", ""]))
        tensors[index] = (name, Pairs([*info, (field, draw(st.sampled_from([0, "little", None])))]))
        return (
            header_text(tensors, metadata),
            data_len,
            [f"tensor {name!r} has an unknown field {field!r}"],
            None,
        )
    if (
        flaw == "hole"
    ):  # the tensors from one on move along: a gap before it (room for a second file)
        order = sized(tensors)
        if not order:
            return draw(one_flaw("bytes_after_the_last"))
        at = draw(st.integers(0, len(order) - 1))
        gap = draw(st.integers(1, 16))
        moved = {n for n, _ in order[at:]}
        start = offsets_of(order[at][1])[0]
        # Empty tensors at the hole's far side move too, so that the hole is the first thing wrong.
        tensors = [
            (n, shifted(i, gap) if n in moved or offsets_of(i)[0] > start else i)
            for n, i in tensors
        ]
        fragments = [f"bytes {start}..{start + gap} of the data belong to no tensor"]
        return header_text(tensors, metadata), data_len + gap, fragments, True
    if flaw == "bytes_after_the_last":
        extra = draw(st.integers(1, 16))
        fragments = [f"bytes {data_len}..{data_len + extra} of the data, after the last tensor"]
        return header_text(tensors, metadata), data_len + extra, fragments, True
    if flaw == "empty_inside":  # at a byte strictly inside a tensor that holds two or more
        wide = [(n, i) for n, i in sized(tensors) if offsets_of(i)[1] - offsets_of(i)[0] >= 2]
        if not wide:
            tensors.append(("wide", entry("U8", [2], data_len)))
            wide = [tensors[-1]]
            data_len += 2
        owner, owner_info = draw(st.sampled_from(wide))
        start, end = offsets_of(owner_info)
        at = draw(st.integers(start + 1, end - 1))
        empty = Pairs([("dtype", "F32"), ("shape", [0]), ("data_offsets", [at, at])])
        tensors.insert(draw(st.integers(0, len(tensors))), ("empty!", empty))
        fragments = [f"empty tensor 'empty!' sits at byte {at}, inside tensor {owner!r}"]
        return header_text(tensors, metadata), data_len, fragments, True
    if flaw == "begins_with_space":  # JSON allows it, the format does not (and the library does)
        before = draw(st.sampled_from([" ", "\n", "\t", "\r\n  "]))
        fragment = f"its header begins with {before[0]!r}"
        return before + header_text(tensors, metadata), data_len, [fragment], None
    if flaw == "not_space_after":  # only 0x20 may pad the header
        after = draw(st.sampled_from(["\n", "\t", "  \r", "\x00", "x", "{}", " 0"]))
        library_refuses = None if after.strip() == "" else True  # serde_json skips JSON white space
        fragment = f"its header has {after.lstrip(' ')!r} after the JSON object"
        return header_text(tensors, metadata) + after, data_len, [fragment], library_refuses
    if (
        flaw == "minus_zero"
    ):  # -0: Python reads the integer 0, the library a float it refuses as an offset
        first = next((n, i) for n, i in tensors if offsets_of(i)[0] == 0)
        written = as_json(first[1])
        text = header_text(tensors, metadata).replace(
            f"{json.dumps(first[0])}: {written}",
            f"{json.dumps(first[0])}: "
            + written.replace('"data_offsets": [0, ', '"data_offsets": [-0, '),
        )
        return text, data_len, [f"tensor {first[0]!r} has data_offsets [-0.0, "], True
    # A lone surrogate (the JSON escape \ud800 with no low half after it) in a name: not Unicode text.
    bad_name = draw(st.sampled_from(["\ud800", name + "\udfff", "\udc80" + name]))
    tensors[index] = (bad_name, info)
    return (
        header_text(tensors, metadata),
        data_len,
        [f"tensor {bad_name!r} has a name with a lone surrogate"],
        True,
    )


@examples(150)
@given(flaw=st.sampled_from(FLAWS), data=st.data())
def test_each_breach_of_the_format_is_refused_naming_the_file_and_what_is_wrong(
    tmp_path, flaw, data
):
    text, data_len, fragments, library_refuses = data.draw(one_flaw(flaw))
    path = tmp_path / WEIGHTS
    write_file(path, text, data_len)
    message = refusal(path)
    assert all(fragment in message for fragment in fragments), (flaw, message)
    if library_refuses:  # the reference agrees that this is a breach of the format
        assert library_reading(path) is None, flaw


@examples(60)
@given(layout=layouts(), padding=st.integers(0, 9))
def test_valid_layouts_padded_with_spaces_are_read_as_the_library_reads_them(
    tmp_path, layout, padding
):
    """The positive control of the property above: the same layouts, unbroken, padded with spaces or not."""
    tensors, metadata, data_len = layout
    path = tmp_path / WEIGHTS
    write_file(path, header_text(tensors, metadata) + " " * padding, data_len)
    entries, data_offset = read_safetensors_header(path)
    assert data_offset + data_len == path.stat().st_size
    assert {n: (e.dtype, list(e.shape)) for n, e in entries.items()} == library_reading(path)
    assert {n: [e.start, e.end] for n, e in entries.items()} == {
        n: offsets_of(i) for n, i in tensors
    }


# ---------------------------------------------------------------- a tensor named twice, in a real model


@pytest.fixture
def model_dir(tmp_path) -> Path:
    shutil.copytree(BASE, tmp_path / "model")
    return tmp_path / "model"


def real_header() -> tuple[dict, bytes]:
    raw = (BASE / WEIGHTS).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def with_wte_twice(model_dir: Path) -> Path:
    """The base model, its header naming transformer.wte.weight twice: first with another tensor's bytes,
    then with its own, which Python's json (and the library) would keep, ignoring the first."""
    header, body = real_header()
    pairs = Pairs((name, Pairs(info.items())) for name, info in header.items())
    decoy = Pairs(header["transformer.wpe.weight"].items())
    pairs.insert(1, ("transformer.wte.weight", decoy))
    text = as_json(pairs)
    text += " " * (-len(text) % 8)
    path = model_dir / WEIGHTS
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + body)
    return path


def test_a_real_model_naming_wte_twice_is_refused_where_the_library_keeps_the_last(model_dir):
    path = with_wte_twice(model_dir)
    library = library_reading(path)
    if (
        library is not None
    ):  # safetensors 0.8 keeps the last entry without a word: the model would load
        assert library["transformer.wte.weight"] == ("F32", [128, 32])
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert str(exc.value) == (
        f"{path}: the header names tensor 'transformer.wte.weight' twice (the format forbids a name given "
        "twice); the file is damaged or not safetensors"
    )


# ---------------------------------------------------------------- checks that an earlier one pre-empts


def test_a_header_over_the_format_limit_is_refused_before_it_is_read(tmp_path):
    """Through the loader, a header this long is refused first for running past a small file: only a file of
    over 100 MB reaches the limit.  A sparse one does, and is refused by it, without the 100 MB being read."""
    path = tmp_path / WEIGHTS
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", LIBRARY_MAX_HEADER + 1))
        f.truncate(8 + LIBRARY_MAX_HEADER + 1)  # zeros, never written: not JSON, were it read
    message = refusal(path)
    assert (
        "its header claims 100,000,001 bytes, and the format allows at most 100,000,000" in message
    )
    assert library_reading(path) is None


def test_a_header_at_the_format_limit_is_read(tmp_path):
    """The boundary: exactly 100,000,000 bytes, `{}` and spaces, is a valid (empty) file to the library too."""
    path = tmp_path / WEIGHTS
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", LIBRARY_MAX_HEADER) + b"{}")
        spaces = b" " * 2**20
        left = LIBRARY_MAX_HEADER - 2
        while left:
            f.write(spaces[:left])
            left -= min(left, len(spaces))
    assert library_reading(path) == {}
    assert read_safetensors_header(path) == ({}, 8 + LIBRARY_MAX_HEADER)


@pytest.mark.parametrize(
    "dtype, shape, accepted",
    [
        ("U8", [2**63 - 1], True),  # the largest size an offset can hold
        ("U8", [2**63], False),
        ("I16", [2**62], False),  # 2**63 bytes
        ("F32", [2**31, 2**31], False),  # 2**62 elements fit 64 bits; their 2**64 bytes do not
        ("U8", [2**31, 2**31, 2], False),  # 2**63, in three dimensions
    ],
)
def test_a_tensor_past_2_63_bytes_is_refused_by_the_entry_check_alone(
    tmp_path, dtype, shape, accepted
):
    """In a file, such a tensor also runs past the end, which a later check refuses: only the entry check on
    its own pins the 2**63 - 1 boundary (the offsets fit the shape, so nothing else refuses it there)."""
    size = DTYPE_BYTES[dtype]
    for n in shape:
        size *= n
    info = {"dtype": dtype, "shape": shape, "data_offsets": [0, size]}
    if accepted:
        got = read_entry(tmp_path / WEIGHTS, "t", info)
        assert (got.dtype, got.shape, got.start, got.end) == (dtype, tuple(shape), 0, size)
        return
    with pytest.raises(CheckpointError) as exc:
        read_entry(tmp_path / WEIGHTS, "t", info)
    assert f"tensor 't' has offsets 0..{size} that do not fit its shape" in str(exc.value)


def test_a_shape_whose_element_count_overflows_64_bits_is_refused_before_its_offsets():
    """2**32 * 2**32 = 2**64 elements: the format's reader overflows counting them, so the shape itself is
    named, not the offsets (which could never be written to match)."""
    info = {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 4 * 2**64]}
    with pytest.raises(CheckpointError) as exc:
        read_entry(Path("model.safetensors"), "t", info)
    expected = "tensor 't' has shape [4294967296, 4294967296], whose size overflows 64 bits"
    assert expected in str(exc.value)


# ---------------------------------------------------------------- codes the format added since


@pytest.mark.parametrize("dtype, n_bytes", [("F4", 4), ("F8_E8M0", 8), ("C64", 64)])
def test_a_dtype_code_newer_than_minirt_is_named_as_such_not_as_damage(tmp_path, dtype, n_bytes):
    path = tmp_path / WEIGHTS
    write_file(
        path,
        json.dumps({"t": {"dtype": dtype, "shape": [8], "data_offsets": [0, n_bytes]}}),
        n_bytes,
    )
    assert library_reading(path) == {"t": (dtype, [8])}  # a valid file to the format's own reader
    message = refusal(path)
    assert (
        f"tensor 't' has dtype {dtype}, a newer safetensors code that minirt cannot read" in message
    )
    assert "damaged" not in message


# ---------------------------------------------------------------- the command line


def generate(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--model", str(folder), "--prompt", "hi"]
        + ["--max-new-tokens", "2", "--backend", "numpy"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_generate_refuses_a_tensor_named_twice_in_one_line(model_dir):
    path = with_wte_twice(model_dir)
    result = generate(model_dir)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{path}: the header names tensor 'transformer.wte.weight' twice" in result.stderr


def test_generate_refuses_a_hole_in_the_data_in_one_line(model_dir):
    header, body = real_header()
    path = model_dir / WEIGHTS
    text = json.dumps(header)
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + body + b"polyglot")
    result = generate(model_dir)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        f"{path}: bytes {len(body)}..{len(body) + 8} of the data, after the last tensor"
        in result.stderr
    )
