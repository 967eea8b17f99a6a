"""Reading prompts files in chunks of lines, for readers that run in many processes
(minirt/distributed/ray_data.py).

Owns: which files a source names (`prompt_files`: a file, a folder, a glob), one streaming scan that
cuts them into `Chunk`s of whole lines (`plan_chunks`: each knows its byte range, its first line
number and the global input index of its first entry, so no process ever holds a file whole), and
reading one chunk back into entries (`chunk_rows`), parsed exactly as minirt/cli/prompt_file.py
parses a whole file.

Must not know: Ray, models, or how requests are served.
"""

from __future__ import annotations

import glob
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, cast

from ..errors import MinirtError
from ..cli.prompt_file import (
    FORMATS,
    decoded_lines,
    entry_for,
    is_entry,
    prompt_text_hint,
    resolved_format,
)

# Prompts-file entries one chunk holds (a read task turns one chunk into rows).
LINES_PER_CHUNK = 1024
PROMPT_SUFFIXES = (".txt", ".jsonl", ".ndjson")


def prompt_files(source: str) -> list[str]:
    """The prompts files a source names, in the order their rows are numbered: a file; a folder's
    .txt, .jsonl and .ndjson files, sorted by name; or a glob's matches, sorted."""
    # Read tasks run in other processes, maybe on other machines.
    path = Path(source).absolute()
    if path.is_dir():
        files = sorted(
            str(p) for p in path.iterdir() if p.suffix.lower() in PROMPT_SUFFIXES and p.is_file()
        )
        if not files:
            raise MinirtError(f"{source} is a folder with no .txt, .jsonl or .ndjson files in it")
        return files
    if path.is_file():
        return [str(path)]
    if glob.has_magic(source):
        files = sorted(str(Path(p).absolute()) for p in glob.glob(source) if Path(p).is_file())
        if files:
            return files
        raise MinirtError(f"no file matches {source}")
    raise MinirtError(
        f"prompts file {source} does not exist; pass a .txt or .jsonl file, a folder or a glob"
        f"{prompt_text_hint(source)}"
    )


@dataclass(frozen=True)
class Chunk:
    """A run of whole lines of one prompts file: what one read task turns into rows."""

    path: str
    fmt: str  # "txt" or "jsonl"
    start: int  # byte offset of its first line
    size: int  # bytes, endings included
    first_line: int  # the file's line number of its first line
    first_index: int  # the global input index of its first entry
    entries: int  # how many rows it gives (blank lines give none)


def plan_chunks(
    paths: list[str], fmt: str = "auto", entries_per_chunk: int = LINES_PER_CHUNK
) -> list[Chunk]:
    """Chunks of every file, scanned once, a line at a time (no file is ever held whole): where each
    chunk starts, its first line number and the global index of its first entry.  A file that cannot
    be read, or in which no line is UTF-8, is refused whole; so is a source with no prompts at
    all."""
    if fmt not in FORMATS:
        raise MinirtError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    chunks: list[Chunk] = []
    index = 0
    for path in paths:
        try:
            with open(path, "rb") as stream:
                file_chunks, first_text, decoded_any = scan_file(
                    path, stream, index, entries_per_chunk
                )
        except OSError as exc:
            raise MinirtError(f"{path}: cannot read ({exc.strerror})") from None
        if not decoded_any and file_chunks:
            raise MinirtError(f"{path}: not UTF-8 text; save it as UTF-8")
        resolved = resolved_format(fmt, path, first_text)
        chunks += [Chunk(path, resolved, *c) for c in file_chunks]
        index += sum(c[-1] for c in file_chunks)
    if index == 0:
        raise MinirtError(f"{', '.join(paths)}: no prompts (blank lines are skipped)")
    return chunks


def scan_file(path: str, stream: BinaryIO, first_index: int, entries_per_chunk: int):
    """(chunks as (start, size, first_line, first_index, entries), the first non-blank line, whether
    any line decoded) of one file."""
    chunks: list[tuple[int, int, int, int, int]] = []
    # Where the file has been read to; where the chunk being cut starts, its first line number,
    # the global index of its first entry, and its entries so far.
    offset = 0
    start = 0
    first_line = 1
    index = first_index
    entries = 0
    first_text = ""
    decoded_any = False
    for line, size in decoded_lines(stream):
        if line.text is not None and line.text.strip():
            decoded_any = True
            first_text = first_text or line.text
        entries += is_entry(line)
        offset += size
        if entries == entries_per_chunk:
            chunks.append((start, offset - start, first_line, index, entries))
            start = offset
            first_line = line.number + 1
            index += entries
            entries = 0
    if entries:
        chunks.append((start, offset - start, first_line, index, entries))
    return chunks, first_text, decoded_any


class LimitedReader(io.RawIOBase):
    """At most `size` bytes of a binary stream, from where it stands."""

    def __init__(self, stream: BinaryIO, size: int):
        self.stream = stream
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.left
        else:
            n = min(n, self.left)
        data = self.stream.read(n)
        self.left -= len(data)
        return data


def chunk_rows(chunk: Chunk) -> Iterator[dict[str, Any]]:
    """The rows of one chunk: its entries, each with its global index, parsed as one process parses
    them."""
    index = chunk.first_index
    with open(chunk.path, "rb") as stream:
        stream.seek(chunk.start)
        lines = decoded_lines(
            cast(BinaryIO, LimitedReader(stream, chunk.size)), first_number=chunk.first_line
        )
        for line, _ in lines:
            if is_entry(line):
                yield {
                    "index": index,
                    "entry": json.dumps(asdict(entry_for(line, chunk.fmt)), ensure_ascii=False),
                }
                index += 1
