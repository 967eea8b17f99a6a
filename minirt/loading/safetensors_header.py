"""A safetensors file's header, read as untrusted input: every rule of the format checked before a
byte of weights is touched.

Owns: `read_safetensors_header`, which turns the 8-byte length and the JSON header of a
`.safetensors` file into `TensorEntry`s, and refuses in one line naming the file (and the tensor)
anything the format forbids or that could make a later step misread memory or raise a TypeError or
OverflowError:

  * the frame: a truncated file, a header longer than the format's 100,000,000 bytes, a header
    that is not UTF-8 JSON, that is not an object, that does not begin with `{`, or that is
    followed by anything but space padding;
  * names: a key given twice anywhere that matters (a tensor named twice, a field twice in one
    entry, a key twice in `__metadata__`: Python's json would silently keep the last), a name with
    a lone surrogate, which is no Unicode text;
  * `__metadata__`: anything but a map of strings to strings (so NaN and Infinity, which Python
    reads and JSON has not, are refused there as they are in every field: none takes a float),
    the offending value written as JSON (null, NaN), as the file holds it;
  * each entry: anything but exactly dtype, shape and data_offsets; a dtype that is not a known
    code (one the format added since, such as F4 or C64, is named as valid but unreadable); a
    shape that is not a list of integers, has a dimension past 64 bits (even beside a 0), or
    whose size overflows 64 bits; offsets that are not two
    integers (`-0` included, which the format's own reader takes for a float) or do not fit the
    shape;
  * the data section: tensors must tile it, as the format says ("the byte buffer needs to be
    entirely indexed, and cannot contain holes"): sorted by offset, each begins where the one
    before it ends, the first at 0, and the last ends where the file does.  So a tensor past the
    end of the file, two tensors sharing bytes, an empty tensor inside another's bytes, a hole
    between tensors (room for a second file) and bytes after the last tensor are each refused.

Must not know: GPT-2, tensor names, configs or backends (checkpoint.py decides which tensors it
wants).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

# Every dtype code the format defines, with its size in bytes, so that a foreign dtype is named, not
# misread.
KNOWN_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
# Codes the format has added since, which the safetensors library reads and minirt does not (four
# and six bits a number, complex pairs, float8 variants): a valid file, refused as such, not as
# damaged.
NEWER_DTYPES = ("F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "C64")
# The format's own limit on the JSON header: the safetensors library refuses a byte more.
MAX_HEADER_BYTES = 100_000_000
# A size past this cannot be an offset in any file.
MAX_TENSOR_BYTES = 2**63 - 1
# The key that holds the file's free-form strings, not a tensor.
METADATA = "__metadata__"
# What a tensor entry holds: these three fields, no more.
ENTRY_FIELDS = ("dtype", "shape", "data_offsets")
# What JSON counts as white space, and the one byte the format pads a header with.
JSON_WHITESPACE = " \t\n\r"
PADDING = " "


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it."""

    # The safetensors code: "F32", "F16", "BF16", ...
    dtype: str
    shape: tuple[int, ...]
    # Byte offsets into the data section: the tensor's first byte, and one past its last.
    start: int
    end: int


class HeaderObject(dict):
    """A JSON object of the header that remembers the keys it was given more than once.  Python's
    json keeps the last value of a repeated key without a word; the format forbids repeats, so the
    reader must see them."""

    repeated: list[str]


def header_object(pairs: list[tuple[str, object]]) -> HeaderObject:
    """json's `object_pairs_hook`: every object of the header, with its repeated keys noted."""
    obj = HeaderObject(pairs)
    counts = Counter(key for key, _ in pairs)
    obj.repeated = [key for key, count in counts.items() if count > 1]
    return obj


def repeated_keys(obj) -> list[str]:
    """The keys a parsed object was given more than once (a plain dict, built by a caller rather
    than parsed, has none)."""
    return getattr(obj, "repeated", [])


def read_integer(text: str) -> int | float:
    """json's `parse_int`.  `-0` is a negative number to the format's own reader (which refuses it
    where a size belongs), but Python would read it as the integer 0: it is kept a float, -0.0, so
    that no check mistakes it for a size."""
    if text == "-0":
        return -0.0
    return int(text)


# NaN and Infinity, which Python reads and JSON has not, are floats: no field takes one, so each is
# refused where it stands, naming its tensor.
HEADER_DECODER = json.JSONDecoder(object_pairs_hook=header_object, parse_int=read_integer)


def is_count(value) -> bool:
    """A JSON integer >= 0 (true and false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_unicode(text: str) -> bool:
    """Whether a JSON string is Unicode text: `\\ud800` alone decodes to a lone surrogate, which
    is not (and cannot be written as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def cut_short(text: str) -> str:
    """A value's text cut to 60 characters (a header may hold a million-entry shape)."""
    return text if len(text) <= 60 else text[:57] + "..."


def shown(value) -> str:
    """A name (or a piece of the header's text) for a one-line message: its repr, quoted so that
    '' and a name with a line break show, cut short."""
    return cut_short(repr(value))


def shown_as_json(value) -> str:
    """A JSON value of the header for a one-line message, written as JSON, since that is what the
    file holds: null, {"a": "b"}, NaN, not Python's None, {'a': 'b'}, nan.  Non-ASCII characters
    are escaped (a lone surrogate could not be printed otherwise), and the text is cut short."""
    try:
        text = json.dumps(value)
    # Nesting that only just parsed: Python's repr still shows what the value is.
    except (ValueError, RecursionError):
        text = repr(value)
    return cut_short(text)


def not_safetensors(path: Path, why: str) -> CheckpointError:
    """The refusal of a file whose frame is wrong: no header to trust at all."""
    return CheckpointError(f"{path}: not a safetensors file ({why}); re-download or re-save it")


def damaged(path: Path, what: str) -> CheckpointError:
    """The refusal of a header that parses but breaks one of the format's rules."""
    return CheckpointError(f"{path}: {what}; the file is damaged or not safetensors")


def parse_header_text(path: Path, raw: bytes) -> HeaderObject:
    """The header's bytes as a JSON object, held to the format's framing: UTF-8, beginning with
    `{`, followed by nothing but spaces."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_safetensors(
            path, f"its header is not JSON: byte {exc.start} is not UTF-8"
        ) from None
    # JSON allows white space before the value; the format does not, but a value after it is still
    # worth telling apart from no JSON at all.
    begins_at = len(text) - len(text.lstrip(JSON_WHITESPACE))
    try:
        header, ends_at = HEADER_DECODER.raw_decode(text, begins_at)
    # Bad JSON, or an integer of over 4,300 digits; nesting too deep.
    except (ValueError, RecursionError):
        raise not_safetensors(path, "its header is not JSON") from None
    # Every object the decoder makes is a HeaderObject.
    if not isinstance(header, HeaderObject):
        raise not_safetensors(path, "its header is not a JSON object")
    if begins_at > 0:
        raise not_safetensors(
            path, f"its header begins with {shown(text[0])}, and the format wants '{{' first"
        )
    after = text[ends_at:]
    if after.strip(PADDING):
        extra = after.lstrip(PADDING)
        raise not_safetensors(
            path,
            f"its header has {shown(extra[:20])} after the JSON object, "
            "where only spaces may pad it",
        )
    return header


def read_header_json(path: Path) -> tuple[HeaderObject, int, int]:
    """(the parsed header, where the data section starts, the file's size), or a one-line
    CheckpointError."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            # The header's length, a little-endian uint64.
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path}: truncated safetensors file ({file_size} bytes, no header); "
                    "re-download or re-save it"
                )
            header_len = int.from_bytes(prefix, "little")
            if 8 + header_len > file_size:
                raise CheckpointError(
                    f"{path}: truncated or not a safetensors file (header claims {header_len} "
                    f"bytes, file has {file_size}); re-download or re-save it"
                )
            # Only a file of over 100 MB gets here with a header this long.
            if header_len > MAX_HEADER_BYTES:
                raise not_safetensors(
                    path,
                    f"its header claims {header_len:,} bytes, and the format allows at most "
                    f"{MAX_HEADER_BYTES:,}",
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_header_text(path, raw), 8 + header_len, file_size


def check_metadata(path: Path, metadata) -> None:
    """`__metadata__`, when there is one: a map of strings to strings, as the format says."""
    if not isinstance(metadata, dict):
        raise damaged(
            path, f"{METADATA} is {shown_as_json(metadata)}, not a map of strings to strings"
        )
    if repeated_keys(metadata):
        twice = repeated_keys(metadata)[0]
        raise damaged(path, f"{METADATA} holds the key {shown(twice)} twice")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise damaged(
                path,
                f"{METADATA} maps {shown(key)} to {shown_as_json(value)}, which is not a string",
            )
        if not is_unicode(key) or not is_unicode(value):
            raise damaged(
                path, f"{METADATA} entry {shown(key)} holds a lone surrogate, which is not text"
            )


def overflowing_shape(shape: list[int]) -> str | None:
    """Why the format's own reader refuses a shape of counts, or None: its dimensions are 64-bit
    (a larger one is refused even beside a 0), and it multiplies them left to right in 64 bits,
    refusing a product that overflows even when a later 0 would bring it back to nothing."""
    if any(n >= 2**64 for n in shape):
        return "whose dimensions do not all fit in 64 bits"
    elements = 1
    for n in shape:
        elements *= n
        if elements >= 2**64:
            return "whose size overflows 64 bits"
    return None


def read_entry(path: Path, name: str, info) -> TensorEntry:
    """One header entry, every field's type and size checked."""

    def malformed(what: str) -> CheckpointError:
        return damaged(path, f"tensor {shown(name)} has {what}")

    if not isinstance(info, dict) or not set(ENTRY_FIELDS) <= info.keys():
        raise malformed("a malformed header entry (it needs dtype, shape and data_offsets)")
    if repeated_keys(info):
        twice = repeated_keys(info)[0]
        raise malformed(f"the field {shown(twice)} twice in its header entry")
    unknown = sorted(key for key in info if key not in ENTRY_FIELDS)
    if unknown:
        raise malformed(
            f"an unknown field {shown(unknown[0])} in its header entry "
            "(an entry holds dtype, shape and data_offsets only)"
        )
    dtype = info["dtype"]
    shape = info["shape"]
    offsets = info["data_offsets"]
    if dtype in NEWER_DTYPES:
        raise CheckpointError(
            f"{path}: tensor {shown(name)} has dtype {dtype}, a newer safetensors code that "
            "minirt cannot read"
        )
    if not isinstance(dtype, str) or dtype not in KNOWN_DTYPES:
        raise malformed(f"unknown dtype {shown(dtype)}")
    if not isinstance(shape, list) or not all(is_count(n) for n in shape):
        raise malformed(f"shape {shown(shape)}, which is not a list of integers >= 0")
    shape_problem = overflowing_shape(shape)
    if shape_problem:
        raise malformed(f"shape {shown(shape)}, {shape_problem}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_count(n) for n in offsets):
        raise malformed(f"data_offsets {shown(offsets)}, which are not two integers >= 0")
    n_bytes = KNOWN_DTYPES[dtype] if 0 not in shape else 0
    for n in shape:
        if n_bytes > MAX_TENSOR_BYTES:
            # Too big already: a million more dimensions must not cost quadratic time.
            break
        # Python integers: an absurd shape gives a huge number, never an overflow.
        n_bytes *= n
    start, end = offsets
    if n_bytes > MAX_TENSOR_BYTES or end < start or end - start != n_bytes:
        raise malformed(
            f"offsets {start}..{end} that do not fit its shape {shown(shape)} and dtype {dtype}"
        )
    return TensorEntry(dtype=dtype, shape=tuple(shape), start=start, end=end)


def check_inside_the_file(
    path: Path, in_order: list[tuple[str, TensorEntry]], data_offset: int, file_size: int
) -> None:
    """No tensor runs past the end of the file: the first that does, in the order of their offsets,
    is named."""
    for name, entry in in_order:
        if data_offset + entry.end > file_size:
            raise CheckpointError(
                f"{path}: truncated safetensors file (tensor {shown(name)} ends at byte "
                f"{data_offset + entry.end}, file has {file_size}); "
                "re-download or re-save it"
            )


def check_layout(
    path: Path, entries: dict[str, TensorEntry], data_offset: int, file_size: int
) -> None:
    """The tensors tile the data section: none runs past the file, and in the order of their
    offsets each begins exactly where the bytes before it end, the last ending with the file."""
    data_size = file_size - data_offset
    in_order = sorted(entries.items(), key=lambda item: (item[1].start, item[1].end))
    # A cut download first: it is the likeliest damage, and the rest of the layout may be fine.
    check_inside_the_file(path, in_order, data_offset, file_size)
    # Where the bytes placed so far end, and the last non-empty tensor, which owns the bytes
    # just before that.
    covered = 0
    owner: tuple[str, TensorEntry] | None = None
    for name, entry in in_order:
        if entry.start < covered:
            # Only a non-empty tensor can have moved `covered` past 0.
            assert owner is not None
            owner_name, owner_entry = owner
            if entry.end > entry.start:
                raise damaged(
                    path,
                    f"tensors {shown(owner_name)} and {shown(name)} share bytes "
                    f"({owner_entry.start}..{owner_entry.end} and {entry.start}..{entry.end})",
                )
            raise damaged(
                path,
                f"empty tensor {shown(name)} sits at byte {entry.start}, inside tensor "
                f"{shown(owner_name)} ({owner_entry.start}..{owner_entry.end}), and the format "
                "puts each tensor where the one before it ends",
            )
        if entry.start > covered:
            raise damaged(
                path,
                f"bytes {covered}..{entry.start} of the data belong to no tensor (a hole before "
                f"tensor {shown(name)}, which the format forbids)",
            )
        covered = entry.end
        if entry.end > entry.start:
            owner = (name, entry)
    if covered < data_size:
        raise damaged(
            path,
            f"bytes {covered}..{data_size} of the data, after the last tensor, belong to no "
            "tensor (a hole at the end, which the format forbids)",
        )


def read_safetensors_header(path: Path) -> tuple[dict[str, TensorEntry], int]:
    """Parse and check a safetensors header.  Returns (entries by name, data section offset)."""
    header, data_offset, file_size = read_header_json(path)
    if repeated_keys(header):
        twice = repeated_keys(header)[0]
        what = METADATA if twice == METADATA else f"tensor {shown(twice)}"
        raise damaged(
            path, f"the header names {what} twice (the format forbids a name given twice)"
        )
    # Free-form strings about the file, not a tensor.
    if METADATA in header:
        check_metadata(path, header.pop(METADATA))
    for name in header:
        if not is_unicode(name):
            raise damaged(
                path, f"tensor {shown(name)} has a name with a lone surrogate, which is not text"
            )
    entries = {name: read_entry(path, name, info) for name, info in header.items()}
    check_layout(path, entries, data_offset, file_size)
    return entries, data_offset
