"""A safetensors file's header, read as untrusted input: every field checked before a byte of
weights is touched.

Owns: `read_safetensors_header`, which turns the 8-byte length and the JSON header of a
`.safetensors` file into `TensorEntry`s, and refuses in one line naming the file (and the tensor)
anything that could make a later step misread memory or raise a TypeError or OverflowError: a
truncated file, a header that is not a JSON object, a dtype that is not a known code, a shape that
is not a list of integers or whose size overflows 64 bits, offsets that are not two integers, do
not fit the shape, run past the end of the file, or overlap another tensor's bytes.

Must not know: GPT-2, tensor names, configs or backends (checkpoint.py decides which tensors it
wants).
"""

from __future__ import annotations

import json
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
# The format's own limit on the JSON header.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# A size past this cannot be an offset in any file.
MAX_TENSOR_BYTES = 2**63 - 1


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it."""

    # The safetensors code: "F32", "F16", "BF16", ...
    dtype: str
    shape: tuple[int, ...]
    # Byte offsets into the data section: the tensor's first byte, and one past its last.
    start: int
    end: int


def is_count(value) -> bool:
    """A JSON integer >= 0 (true and false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header_json(path: Path) -> tuple[dict, int, int]:
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
            if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
                raise CheckpointError(
                    f"{path}: truncated or not a safetensors file (header claims {header_len} "
                    f"bytes, file has {file_size}); re-download or re-save it"
                )
            header = json.loads(f.read(header_len).decode("utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None
    # Bad UTF-8 or JSON, or an integer of over 4,300 digits.
    except (ValueError, RecursionError):
        raise CheckpointError(
            f"{path}: not a safetensors file (its header is not JSON); re-download or re-save it"
        ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (its header is not a JSON object)")
    return header, 8 + header_len, file_size


def shown(value) -> str:
    """A value for a one-line message: its repr, cut short (a header may hold a million-entry
    shape)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_entry(path: Path, name: str, info) -> TensorEntry:
    """One header entry, every field's type and size checked."""

    def malformed(what: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: tensor {shown(name)} has {what}; the file is damaged or not safetensors"
        )

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise malformed("a malformed header entry (it needs dtype, shape and data_offsets)")
    dtype = info["dtype"]
    shape = info["shape"]
    offsets = info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in KNOWN_DTYPES:
        raise malformed(f"unknown dtype {shown(dtype)}")
    if not isinstance(shape, list) or not all(is_count(n) for n in shape):
        raise malformed(f"shape {shown(shape)}, which is not a list of integers >= 0")
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


def read_safetensors_header(path: Path) -> tuple[dict[str, TensorEntry], int]:
    """Parse and check a safetensors header.  Returns (entries by name, data section offset)."""
    header, data_offset, file_size = read_header_json(path)
    # Free-form strings about the file, not a tensor.
    header.pop("__metadata__", None)
    entries = {name: read_entry(path, name, info) for name, info in header.items()}
    previous = None
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)):
        if data_offset + entry.end > file_size:
            raise CheckpointError(
                f"{path}: truncated safetensors file (tensor {shown(name)} ends at byte "
                f"{data_offset + entry.end}, file has {file_size}); re-download or re-save it"
            )
        if previous is not None and entry.start < previous[1].end and entry.end > entry.start:
            raise CheckpointError(
                f"{path}: tensors {shown(previous[0])} and {shown(name)} share bytes "
                f"({previous[1].start}..{previous[1].end} and {entry.start}..{entry.end}); "
                "the file is damaged or not safetensors"
            )
        # An empty tensor holds no bytes, so it cannot overlap.
        if entry.end > entry.start or previous is None:
            previous = (name, entry)
    return entries, data_offset
