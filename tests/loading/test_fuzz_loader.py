"""Fuzzing the loader's readers of untrusted files: safetensors headers and config.json.

Hypothesis writes the files a damaged download or a hostile upload could hold.  Headers: valid layouts (small
random ones, and a real model's), then mutated: fields of the wrong type (strings, lists, dicts, floats, NaN,
bools, null, integers past 2**64, negative ones, `-0`), shapes whose size overflows 64 bits, tensors moved onto
another's bytes or away from them (a hole), bytes after the last tensor, entries that are not objects or hold an
unknown field, a key given twice (a tensor, a field, a metadata key), a name with a lone surrogate, numbers too
long for Python to parse, deep nesting, white space before the header or after it other than spaces, garbage
bytes, a length prefix that lies, a file cut at any byte.  Configs: every field given random JSON values or
absurd sizes (a model of 10**12 weights, or of more than 10**4000), loaded with the real weights; and
config.json texts that are not JSON, or not an object.

The property, for every file: the only exception that escapes is a MinirtError whose message is one non-empty
line.  Whatever the safetensors library (the format's own reader, an independent reference) refuses, minirt
refuses too; a file left valid, both accept.  A header that is accepted must be consistent, checked here
without minirt's code: exactly the JSON the format allows (begins with `{`, only spaces after it, no key given
twice, no NaN), every entry as the JSON says with exactly its three fields, a known dtype, a shape of integers,
its length the shape's size, `__metadata__` a map of strings, the library's own reading of every name, shape and
dtype, and the tensors tiling the data section: in order, each begins where the one before ends, and the last
ends with the file.  A real model that loads maps each tensor onto its own bytes.  A config that is accepted
must be one the weights were written for, with every field of the right type.  And the other way round: a
layout left valid must be accepted (the real model must load), and so must a valid variant of the real config
(other heads, n_ctx, token ids, epsilon, GELU names, options off).

The model is tests/fixtures/tiny_vocab_short_ctx (one layer, 17 header entries), so an example costs little.
The default run draws 400 headers and 300 configs; `-m slow` draws 1,200 and 800, with the same bodies.
Each example overwrites the same files in one folder per test.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from conftest import DTYPE_BYTES, FIXTURES, bounded
from minirt.loading.checkpoint import load_checkpoint
from minirt.errors import MinirtError
from minirt.loading.safetensors_header import read_safetensors_header


MODEL = FIXTURES / "tiny_vocab_short_ctx"
WEIGHTS = "model.safetensors"
ENTRY_FIELDS = {"dtype", "shape", "data_offsets"}
# The safetensors library's limit on the header (it refuses one byte more).
MAX_HEADER_BYTES = 100_000_000

RAW = (MODEL / WEIGHTS).read_bytes()
REAL_HEADER = json.loads(RAW[8 : 8 + int.from_bytes(RAW[:8], "little")])
REAL_BODY_BYTES = len(RAW) - 8 - int.from_bytes(RAW[:8], "little")
BASE_CONFIG = json.loads((MODEL / "config.json").read_text())

DEFAULT = {"headers": 400, "configs": 300}
SLOW = {"headers": 1_200, "configs": 800}
RUNS = [pytest.param(DEFAULT, id="default"), pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]


# ---------------------------------------------------------------- the property


def assert_one_line(exc: MinirtError) -> None:
    """A refusal says what is wrong in one non-empty line.  Only a MinirtError may escape: the callers catch that
    alone, so any other exception propagates and fails the test."""
    message = str(exc)
    assert message.strip() and "\n" not in message and len(message.splitlines()) == 1, repr(message)


def is_count(value) -> bool:
    return type(value) is int and value >= 0


def library_reading(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    """{name: (dtype, shape)} as the safetensors library reads the file, or None where it refuses it."""
    try:
        with safe_open(str(path), "numpy") as f:
            return {
                name: (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape())
                for name in f.keys()
            }
    except Exception:  # noqa: BLE001 (whatever the library raises, it has refused the file)
        return None


def no_repeats(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key given twice: {keys}"
    return dict(pairs)


def refuse_constant(name: str):
    raise AssertionError(f"{name} accepted")


def assert_consistent(blob: bytes, entries: dict, data_offset: int) -> None:
    """An accepted header, checked against the file's bytes with this file's own reading of the format."""
    header_len = int.from_bytes(blob[:8], "little")
    assert len(blob) >= 8 and data_offset == 8 + header_len <= len(blob)
    text = blob[8:data_offset].decode("utf-8")
    assert text.startswith("{"), "the header must begin with {"
    header = json.loads(
        text.rstrip(" "), object_pairs_hook=no_repeats, parse_constant=refuse_constant
    )
    assert isinstance(header, dict) and set(entries) == set(header) - {"__metadata__"}
    metadata = header.get("__metadata__", {})
    assert isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()), (
        metadata
    )
    spans = []
    for name, entry in entries.items():
        name.encode("utf-8")  # no lone surrogate
        raw = header[name]
        assert set(raw) == ENTRY_FIELDS, name
        assert entry.dtype == raw["dtype"] and entry.dtype in DTYPE_BYTES, name
        assert list(entry.shape) == raw["shape"] and all(is_count(n) for n in raw["shape"]), name
        assert [entry.start, entry.end] == raw["data_offsets"] and all(
            is_count(n) for n in raw["data_offsets"]
        ), name
        assert entry.end - entry.start == math.prod(entry.shape) * DTYPE_BYTES[entry.dtype], name
        spans.append((entry.start, entry.end, name))
    covered = 0  # the tensors tile the data section: no overlap, no hole, nothing after the last
    for start, end, name in sorted(spans):
        assert start == covered, f"{name} starts at {start}, the bytes before it end at {covered}"
        covered = end
    assert data_offset + covered == len(blob), "bytes after the last tensor"


# ---------------------------------------------------------------- strategies: headers

HUGE = st.one_of(
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 10**30, 2**1000]),
    st.integers(min_value=2**64, max_value=2**64 + 1000),
    st.integers(min_value=2**31, max_value=2**70),
)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(max_value=-1),
    HUGE,
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["0", "4", "F32", "", "\n", "\x1b[2J", "\ud800", "F4", "C64"]),
)
HOSTILE = st.recursive(
    SCALAR,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=6,
)
NAMES = st.one_of(
    st.text(max_size=8),
    st.sampled_from(
        [
            "",
            "a",
            "wte.weight",
            "transformer.h.0.ln_1.bias",
            "__metadata__",
            "a\nb",
            "\u2028",
            "x" * 300,
        ]
    ),
)


class Pairs(list):
    """A JSON object written as its (key, value) pairs, so that a key can be given twice."""


def dump(value, ascii_only: bool) -> str:
    """JSON text for `value`, Pairs included.  A string with a lone surrogate is always escaped (\\ud800): it
    has no UTF-8 to be written in."""
    if isinstance(value, dict):
        value = Pairs(value.items())
    if isinstance(value, Pairs):
        return (
            "{" + ", ".join(f"{dump(k, ascii_only)}: {dump(v, ascii_only)}" for k, v in value) + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(dump(v, ascii_only) for v in value) + "]"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            ascii_only = True
    return json.dumps(value, ensure_ascii=ascii_only)


def well_formed(info) -> bool:
    """A header entry that minirt must accept on its own (what it shares with others aside)."""
    if not isinstance(info, dict) or set(info) != ENTRY_FIELDS:
        return False
    shape, offsets = info["shape"], info["data_offsets"]
    return (
        isinstance(info["dtype"], str)
        and info["dtype"] in DTYPE_BYTES
        and isinstance(shape, list)
        and all(is_count(n) for n in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(is_count(n) for n in offsets)
        and offsets[1] - offsets[0] == math.prod(shape) * DTYPE_BYTES[info["dtype"]]
    )


def twin(n: int):
    """Values that equal the count n in Python or spell it, but are not JSON integers: the sizes still add up,
    so only a type check can refuse them."""
    return st.sampled_from(
        [float(n), str(n), [n]] + ([bool(n)] * 3 if n in (0, 1) else [])
    )  # bools: == n


def utf8_encodable(text) -> bool:
    """Whether a string (and not a lone surrogate in it) has a UTF-8 encoding."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def layouts(draw) -> tuple[dict, int, bool, bool]:
    """(a header, its data section's size, whether it is the real model, whether it is valid: a random layout is,
    unless it has a hole (a gap before a tensor, or bytes after the last) or a __metadata__ that is not the
    format's map of strings)."""
    if draw(st.integers(0, 3)) == 0:
        return copy.deepcopy(REAL_HEADER), REAL_BODY_BYTES, True, True
    header = {}
    offset = 0
    valid = True
    for name in draw(
        st.lists(NAMES.filter(lambda n: n != "__metadata__"), max_size=6, unique=True)
    ):
        dtype = draw(st.sampled_from(sorted(DTYPE_BYTES)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        gap = draw(st.sampled_from([0] * 15 + [1, 8]))  # a hole: a place for a second file
        valid = valid and gap == 0
        offset += gap
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    items = draw(st.permutations(list(header.items())))
    if draw(st.booleans()):
        strings = st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)
        metadata = draw(st.one_of(strings, strings, strings, HOSTILE))
        # A lone surrogate ("\ud800", escaped in the JSON) is no UTF-8 string: the library refuses
        # it (safetensors 0.8 does), so a header with one is not the test's valid file.
        valid = (
            valid
            and isinstance(metadata, dict)
            and all(isinstance(v, str) for v in metadata.values())
            and all(utf8_encodable(text) for item in metadata.items() for text in item)
        )
        items.insert(draw(st.integers(0, len(items))), ("__metadata__", metadata))
    trailing = draw(st.sampled_from([0] * 15 + [1, 5]))  # bytes after the last tensor
    return dict(items), offset + trailing, False, valid and trailing == 0


@st.composite
def mutated(draw, header: dict, data_len: int):
    """The header with one thing made wrong (or, for an overlap, a shift or a new entry, possibly still right)."""
    names = [n for n in header if n != "__metadata__"]
    good = [
        n for n in names if well_formed(header[n]) and header[n]["data_offsets"][1] <= data_len
    ]  # in the file
    kinds = (
        ["new_entry", "metadata", "not_object", "trailing"]
        + (["entry", "extra_field", "extra_field", "rename"] if names else [])
        + (
            [
                "field",
                "element",
                "element",
                "twin",
                "twin",
                "overlap",
                "overlap",
                "overlap",
                "shift",
                "overflow",
            ]
            if good
            else []
        )
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "not_object":
        return draw(HOSTILE.filter(lambda v: not isinstance(v, dict))), data_len
    if kind == "metadata":
        header["__metadata__"] = draw(HOSTILE)
        return header, data_len
    if kind == "trailing":
        return header, data_len + draw(st.integers(1, 9))
    if kind == "new_entry":
        name = draw(NAMES)
        header[name] = {
            "dtype": draw(st.one_of(st.sampled_from(sorted(DTYPE_BYTES)), HOSTILE)),
            "shape": draw(st.one_of(st.lists(st.integers(0, 4), max_size=2), HOSTILE)),
            "data_offsets": draw(
                st.one_of(st.lists(st.integers(0, data_len + 8), min_size=2, max_size=2), HOSTILE)
            ),
        }
        return header, data_len
    name = draw(st.sampled_from(names if kind in ("entry", "extra_field", "rename") else good))
    entry = header[name]
    if kind == "rename":  # a lone surrogate in the name (\\ud800 in the JSON): no Unicode text
        surrogate = draw(st.sampled_from(["\ud800", "\udfff", "\udc80"]))
        header[draw(st.sampled_from([surrogate, name + surrogate, surrogate + name]))] = header.pop(
            name
        )
    elif kind == "entry":
        if draw(st.booleans()) or not isinstance(entry, dict) or not entry:
            header[name] = draw(HOSTILE)
        else:
            dropped = draw(st.sampled_from(sorted(entry)))
            header[name] = {k: v for k, v in entry.items() if k != dropped}
    elif kind == "extra_field":  # a field the format has not: `offsets`, `dtype ` or random text
        field = draw(
            st.one_of(
                st.sampled_from(["offsets", "dtype ", "Dtype", "byte_order"]), st.text(max_size=4)
            )
        )
        header[name] = {**entry, field: draw(HOSTILE)} if isinstance(entry, dict) else entry
    elif kind == "field":
        entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(HOSTILE)
    elif kind == "element":
        values = entry[draw(st.sampled_from(["shape", "data_offsets"]))]
        at = draw(st.integers(0, len(values)))
        if draw(st.booleans()) and at < len(values):
            values[at] = draw(HOSTILE)
        else:
            values.insert(at, draw(st.one_of(HOSTILE, st.integers(0, 8))))
    elif kind == "twin":  # a wrong type whose value fits: True for a 1, 128.0 or "128" for 128
        values = entry[draw(st.sampled_from(["shape", "data_offsets"]))]
        at = draw(st.integers(0, len(values)))
        if at < len(values):
            values[at] = draw(twin(values[at]))
        else:
            values.insert(draw(st.integers(0, len(values))), draw(twin(1)))
    elif (
        kind == "overlap"
    ):  # onto another tensor's bytes (itself included): still a valid entry on its own
        start, end = header[draw(st.sampled_from(good))]["data_offsets"]
        size = entry["data_offsets"][1] - entry["data_offsets"][0]
        low = max(0, start - size + 1) if size else start
        new_start = draw(st.integers(low, max(low, end - 1)))
        entry["data_offsets"] = [new_start, new_start + size]
        data_len = max(data_len, new_start + size)
    elif (
        kind == "shift"
    ):  # a few bytes along: a hole behind it, or an overlap ahead (or, for an empty one, fine)
        start, end = entry["data_offsets"]
        by = draw(st.integers(-min(start, 8), 8))
        entry["data_offsets"] = [start + by, end + by]
        data_len = max(data_len, end + by)
    else:  # overflow: a size past 64 bits, or one that fits 64 bits but no file
        dims = draw(st.lists(st.one_of(HUGE, st.integers(1, 2**32)), min_size=1, max_size=4))
        entry["shape"] = dims
        start = draw(st.one_of(st.integers(0, 64), HUGE))
        size = math.prod(dims) * DTYPE_BYTES.get(entry["dtype"], 1) + draw(
            st.sampled_from([0, 0, 1, -1])
        )
        entry["data_offsets"] = [start, start + size]
    return header, data_len


@st.composite
def repeated_key(draw, header: dict):
    """The header with one key given twice: a tensor's name, a field of an entry, or a key of __metadata__ (the
    second value the same as the first, or another)."""
    places = [None] + [n for n, v in header.items() if isinstance(v, dict) and v]
    place = draw(st.sampled_from(places))
    target = header if place is None else header[place]
    if not target:
        return header
    key = draw(st.sampled_from(sorted(target)))
    second = target[key] if draw(st.booleans()) else draw(HOSTILE)
    pairs = list(target.items())
    pairs.insert(draw(st.integers(0, len(pairs))), (key, second))
    if place is None:
        return Pairs(pairs)
    return {**header, place: Pairs(pairs)}


@dataclass(frozen=True)
class HeaderFile:
    """A safetensors file, kept short for hypothesis to print: the data section (zeros) is only a size."""

    head: bytes  # the length prefix and the header
    data_len: int
    cut_at: int | None  # a download cut short at this byte
    real: bool  # the real model (with its header mutated): load_checkpoint is tried too
    valid: bool  # nothing was done to a valid layout: it must be accepted (and the real model must load)

    def blob(self) -> bytes:
        return (self.head + bytes(self.data_len))[: self.cut_at]


@st.composite
def header_files(draw) -> HeaderFile:
    if draw(st.integers(0, 19)) == 0:
        return HeaderFile(
            draw(st.binary(max_size=96)), 0, None, False, False
        )  # garbage from the first byte
    header, data_len, real, valid = draw(layouts())
    n_mutations = draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))
    for _ in range(n_mutations):
        if not isinstance(header, dict):
            break
        header, data_len = draw(mutated(header, data_len))
    repeated = isinstance(header, dict) and draw(st.integers(0, 7)) == 0
    if repeated:
        header = draw(repeated_key(header))
    text = dump(header, ascii_only=draw(st.booleans())).encode()
    edit = draw(
        st.sampled_from(
            ["none"] * 24
            + [
                "long_number",
                "nesting",
                "garbage",
                "flip",
                "bad_utf8",
                "minus_zero",
                "before",
                "after",
            ]
        )
    )
    if edit == "long_number" and re.search(
        rb"\d", text
    ):  # past Python's 4,300-digit limit on parsing integers
        at = draw(st.sampled_from([m.start() for m in re.finditer(rb"\d+", text)]))
        text = text[:at] + b"7" * draw(st.sampled_from([4300, 4301, 5000, 20_000])) + text[at:]
    elif edit == "minus_zero" and re.search(
        rb"\b0\b", text
    ):  # -0: an integer to Python, a float to the format
        at = draw(st.sampled_from([m.start() for m in re.finditer(rb"\b0\b", text)]))
        text = text[:at] + b"-" + text[at:]
    elif edit == "nesting":
        depth = draw(st.sampled_from([500, 1000, 5000, 20_000]))
        text = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
    elif edit == "garbage":
        text = draw(st.binary(max_size=64))
    elif edit in ("flip", "bad_utf8") and text:
        at = draw(st.integers(0, len(text) - 1))
        text = (
            text[:at]
            + (b"\xff" if edit == "bad_utf8" else bytes([draw(st.integers(0, 255))]))
            + text[at + 1 :]
        )
    elif edit == "before":  # white space JSON allows and the format does not, or a byte-order mark
        text = draw(st.sampled_from([b" ", b"\n", b"\t", b"\xef\xbb\xbf"])) + text
    elif edit == "after":  # after the object: only spaces may pad it
        text += draw(st.sampled_from([b"\n", b"\t", b"\r\n", b"\x00", b"x", b" \n", b"{}"]))
    if draw(st.booleans()):
        text += b" " * (-len(text) % 8)
    length = (
        len(text)
        if draw(st.integers(0, 9))
        else draw(
            st.one_of(  # a length prefix that lies
                st.integers(max(0, len(text) - 8), len(text) + 8),
                st.integers(0, 2**64 - 1),
                st.sampled_from([2**64 - 1, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1]),
            )
        )
    )
    head = struct.pack("<Q", length) + text
    cut_at = draw(st.integers(0, len(head) + data_len)) if draw(st.integers(0, 14)) == 0 else None
    valid = (
        valid
        and n_mutations == 0
        and not repeated
        and edit == "none"
        and length == len(text)
        and cut_at is None
    )
    return HeaderFile(head, data_len, cut_at, real and length == len(text), valid)


# ---------------------------------------------------------------- strategies: configs

SIZE_FIELDS = ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner")
SIZE_VALUES = st.one_of(
    st.integers(-2, 300),
    st.sampled_from(
        [BASE_CONFIG[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")]
    ),
    st.sampled_from(
        [
            10**9,
            3 * 10**8,
            10**12,
            2**31,
            2**32,
            2**63 - 1,
            2**63,
            2**64 + 1,
            10**30,
            10**200,
            10**320,
            10**4000,
        ]
    ),
    st.floats(0, 300),
    st.sampled_from([True, False, "128", None, [128], 128.0]),
)
FIELD_VALUES = {
    "layer_norm_epsilon": st.one_of(
        st.floats(), st.sampled_from([1e-5, 0, 1, -1e-5, 1e-300, 0.5, 10**400, "1e-5"])
    ),
    "activation_function": st.sampled_from(
        ["gelu_new", "gelu", "gelu_pytorch_tanh", "relu", "GELU", "", None]
    ),
    "scale_attn_weights": st.sampled_from([True, False, 0, 1, "true", None]),
    "tie_word_embeddings": st.sampled_from([True, False, 0, 1, "false", None]),
    "bos_token_id": st.one_of(
        st.integers(-3, 300), st.sampled_from([[0], [0, 1], [], 2**64, 0.0, True, "0", None])
    ),
    "eos_token_id": st.one_of(
        st.integers(-3, 300), st.sampled_from([[0], [[0]], [-1], 2**70, 1.5, False, None])
    ),
    "model_type": st.sampled_from(["gpt2", "GPT2", "llama", "", None, ["gpt2"], {"a": 1}]),
    "scale_attn_by_inverse_layer_idx": st.sampled_from([False, True, 0, 1, None, [], [0], "no"]),
    "reorder_and_upcast_attn": st.sampled_from([False, True, 0, None, {}, {"a": 1}]),
    "add_cross_attention": st.sampled_from([False, True, 0.0, None, ""]),
    "is_encoder_decoder": st.sampled_from([False, True, None, "yes"]),
    **{name: SIZE_VALUES for name in SIZE_FIELDS},
}


GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate", "gelu", "gelu_python")
TOKEN_IDS = st.one_of(st.none(), st.integers(0, 10**6), st.integers(0, 200).map(lambda n: [n]))
# Changes that keep the real config one its weights fit: each may be made, or the field removed where optional.
VALID_CHANGES = {
    "n_head": st.sampled_from([n for n in range(1, 33) if BASE_CONFIG["n_embd"] % n == 0]),
    "n_inner": st.sampled_from([None, 4 * BASE_CONFIG["n_embd"]]),
    "layer_norm_epsilon": st.one_of(st.floats(1e-12, 0.5), st.sampled_from([1e-5, 1e-6])),
    "activation_function": st.sampled_from(GELU_NAMES),
    "scale_attn_weights": st.booleans(),
    "bos_token_id": TOKEN_IDS,
    "eos_token_id": TOKEN_IDS,
    "model_type": st.just("gpt2"),
    **{
        option: st.sampled_from([False, None, 0])
        for option in (
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "add_cross_attention",
            "is_encoder_decoder",
        )
    },
}


@st.composite
def valid_configs(draw) -> dict:
    raw = dict(BASE_CONFIG)
    for field in draw(st.lists(st.sampled_from(sorted(VALID_CHANGES)), max_size=6, unique=True)):
        if field != "n_head" and draw(st.integers(0, 3)) == 0:
            raw.pop(field, None)
        else:
            raw[field] = draw(VALID_CHANGES[field])
    if draw(st.integers(0, 3)) == 0:
        raw["n_ctx"] = raw.pop("n_positions")  # the old spelling
    return raw


@st.composite
def config_files(draw) -> tuple[bytes, bool]:
    """(a config.json, whether the weights fit it): a valid variant of the real one, or one with some fields
    changed or removed, or text that is not a config."""
    if draw(st.integers(0, 5)) == 0:
        return json.dumps(draw(valid_configs())).encode(), True
    raw = dict(BASE_CONFIG) if draw(st.integers(0, 9)) else {}
    if draw(st.integers(0, 5)) == 0:  # a size of the wrong type whose value fits the weights
        field = draw(st.sampled_from(["vocab_size", "n_positions", "n_embd", "n_layer", "n_head"]))
        raw[field] = draw(
            st.one_of(twin(BASE_CONFIG[field]), st.just(True) if field == "n_head" else twin(0))
        )
    for field in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=5, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            raw.pop(field, None)
        else:
            raw[field] = draw(st.one_of(FIELD_VALUES[field], FIELD_VALUES[field], HOSTILE))
    if (
        draw(st.integers(0, 4)) == 0
    ):  # absurd sizes that pass the per-field checks: n_head divides n_embd
        raw["n_head"] = draw(st.integers(1, 64))
        raw["n_embd"] = raw["n_head"] * draw(
            st.sampled_from([1, 8, 10**9, 10**12, 2**63, 10**200, 10**2000])
        )
    text = json.dumps(raw).encode()
    shape = draw(
        st.sampled_from(["object"] * 8 + ["not_object", "cut", "garbage", "long_number", "nesting"])
    )
    if shape == "not_object":
        text = json.dumps(draw(HOSTILE.filter(lambda v: not isinstance(v, dict)))).encode()
    elif shape == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif shape == "garbage":
        text = draw(st.binary(max_size=64))
    elif shape == "long_number":
        text = text.replace(
            f'"n_layer": {BASE_CONFIG["n_layer"]}'.encode(),
            b'"n_layer": ' + b"3" * draw(st.sampled_from([4300, 4301, 9000])),
        )
    elif shape == "nesting":
        depth = draw(st.sampled_from([1000, 20_000]))
        text = b'{"n_inner": ' + b"[" * depth + b"]" * depth + b"}"
    return text, False


def assert_config_is_the_weights_own(text: bytes, checkpoint) -> None:
    """An accepted config, checked against its own text: every field of the right type, every size the one the
    fixed weights were written with, and every tensor of the shape those sizes give."""
    raw = json.loads(text)
    assert isinstance(raw, dict)
    positions = raw["n_positions"] if "n_positions" in raw else raw["n_ctx"]
    sizes = {
        "vocab_size": raw["vocab_size"],
        "n_positions": positions,
        "n_embd": raw["n_embd"],
        "n_layer": raw["n_layer"],
    }
    assert all(type(v) is int for v in sizes.values()), sizes
    assert sizes == {k: BASE_CONFIG[k] for k in sizes}, sizes  # the weights fix these
    heads = raw["n_head"]  # any number of heads that divides n_embd fits the same weights
    assert (
        type(heads) is int
        and heads >= 1
        and raw["n_embd"] % heads == 0
        and checkpoint.config.n_head == heads
    )
    inner = raw.get("n_inner")
    assert inner is None or (type(inner) is int and inner == 4 * raw["n_embd"]), inner
    eps = raw.get("layer_norm_epsilon", 1e-5)
    assert (
        type(eps) in (int, float) and 0 < eps < 1 and checkpoint.config.layer_norm_epsilon == eps
    ), eps
    for flag in ("scale_attn_weights", "tie_word_embeddings"):
        assert type(raw.get(flag, True)) is bool, flag
    for option in (
        "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
        "add_cross_attention",
        "is_encoder_decoder",
    ):
        assert not raw.get(option), option
    assert raw.get("model_type") in (None, "gpt2")
    assert raw.get("activation_function", "gelu_new") in (
        "gelu_new",
        "gelu_pytorch_tanh",
        "gelu_fast",
        "gelu_accurate",
        "gelu",
        "gelu_python",
    )
    for token in ("bos_token_id", "eos_token_id"):
        value = raw.get(token)
        value = value[0] if isinstance(value, list) and len(value) == 1 else value
        assert value is None or is_count(value), token
    V, P, C = sizes["vocab_size"], sizes["n_positions"], sizes["n_embd"]
    assert checkpoint.tensors["wte.weight"].shape == (V, C) and checkpoint.tensors[
        "wpe.weight"
    ].shape == (P, C)
    assert checkpoint.tensors["h.0.mlp.c_fc.weight"].shape == (C, 4 * C)


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """One model folder per module, whose files each example overwrites."""
    target = tmp_path_factory.mktemp("fuzz") / "model"
    shutil.copytree(MODEL, target)
    return target


def check_header_file(folder: Path, case: HeaderFile) -> None:
    path, blob = folder / WEIGHTS, case.blob()
    path.write_bytes(blob)
    library = library_reading(path)
    if case.valid:
        assert library is not None, (
            "the test's own valid file is refused by the safetensors library"
        )
    try:
        with bounded(seconds=10):
            entries, data_offset = read_safetensors_header(path)
    except MinirtError as exc:
        assert_one_line(exc)
        assert not case.valid, f"a valid file was refused: {exc}"
        return
    assert library is not None, "minirt accepted a file the safetensors library refuses"
    assert_consistent(blob, entries, data_offset)
    assert {name: (e.dtype, list(e.shape)) for name, e in entries.items()} == library
    if not case.real:
        return
    try:
        with bounded(seconds=10):
            checkpoint = load_checkpoint(folder)
    except MinirtError as exc:
        assert_one_line(exc)
        assert not case.valid, f"the real model, untouched, was refused: {exc}"
        return
    for (
        name,
        array,
    ) in checkpoint.tensors.items():  # each tensor is its own bytes of the file, in its dtype
        entry = entries.get(name, entries.get("transformer." + name))
        if entry is not None and entry.dtype in ("F32", "F16"):
            raw = blob[data_offset + entry.start : data_offset + entry.end]
            assert np.array_equal(
                array,
                np.frombuffer(raw, "<f4" if entry.dtype == "F32" else "<f2").reshape(entry.shape),
            ), name


def check_config_file(folder: Path, text: bytes, valid: bool) -> None:
    (folder / "config.json").write_bytes(text)
    try:
        with bounded(seconds=10):
            checkpoint = load_checkpoint(folder)
    except MinirtError as exc:
        assert_one_line(exc)
        assert not valid, f"a config the weights fit was refused: {exc}"
        return
    assert_config_is_the_weights_own(text, checkpoint)


@pytest.mark.parametrize("counts", RUNS)
def test_any_header_is_refused_in_one_line_or_read_consistently(folder, counts):
    shutil.copy(MODEL / "config.json", folder / "config.json")

    @settings(max_examples=counts["headers"], deadline=None)
    @given(case=header_files())
    def header_fuzz(case):
        check_header_file(folder, case)

    header_fuzz()


@pytest.mark.parametrize("counts", RUNS)
def test_any_config_is_refused_in_one_line_or_matches_the_weights(folder, counts):
    shutil.copy(MODEL / WEIGHTS, folder / WEIGHTS)

    @settings(max_examples=counts["configs"], deadline=None)
    @given(case=config_files())
    def config_fuzz(case):
        check_config_file(folder, *case)

    config_fuzz()
