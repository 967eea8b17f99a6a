r"""Reading prompts files: one prompt per line (.txt) or one JSON object per line (.jsonl).

Owns: the two formats and their escapes, and telling a bad file (one line,
nothing runs) from a bad line (that request alone gets an error).

.txt   One prompt per line.  Write a newline inside a prompt as \n, a tab as
       \t and a backslash as \\.  Blank lines are skipped (use .jsonl for an
       empty prompt).
.jsonl One JSON object per line: {"prompt": "...", "id": "optional", ...} plus
       any sampling field to override for that request alone: max_tokens (or
       its other name, max_new_tokens), temperature, top_k, top_p, seed, stop,
       stop_token_ids, ignore_eos, repetition_penalty, presence_penalty,
       frequency_penalty, min_p, logit_bias, logprobs, prompt_logprobs, n.
       "prompt" is a string (an empty one starts from BOS) or a list of token ids;
       "id" is a string or an integer, which the record writes in decimal ("id": 0
       is "0", "id": "" stays ""); without one, a request's id is its index.  Either
       of another JSON type (null, true, 1.5, a list, an object) fails its line, as
       a sampling field of a type it does not take does; the message shows the value
       as JSON, never as Python writes it (`{"a": 1}`, not `{'a': 1}`).
       Blank lines are skipped.
-      Standard input, in either format: JSONL if the first non-blank line
       starts with "{", text otherwise.

A line ends at "\n" (or "\r\n", whose "\r" is dropped) and nowhere else, as JSON Lines defines
it.  So a lone "\r", U+2028, U+2029, U+0085, a form feed, a vertical tab and \x1c-\x1e (where
`str.splitlines` also ends a line) stay inside it, as part of a .txt prompt or raw inside a JSON
string (where JSON allows them, and `json.dumps` writes them); in JSONL a lone "\r" between values
is whitespace, as JSON says.  A UTF-8 byte-order mark at the very start (as some Windows editors
write) is skipped, not read as text.

Lines are read and decoded one at a time, so these fail their own line alone (its record says why,
with the line number) while the others run: a line that is not UTF-8, a line longer than
MAX_LINE_BYTES (1 MiB, read past without being held or tokenized), and a JSONL string that is not
valid Unicode (a lone surrogate such as "\ud800", which JSON can escape but no text can hold).  A
file in which no line decodes is not UTF-8 at all: the whole file is refused.

Must not know: models, tokenizers or how requests are served.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from .plural import noun_for
from ..errors import MinirtError
from ..engine.params import FIELD_NAMES, MAX_TOKENS_ALIAS

FORMATS = ("auto", "txt", "jsonl")
# 1 MiB: a longer line fails alone, read past without being held whole.
MAX_LINE_BYTES = 1 << 20
READ_CHUNK = 1 << 16  # bytes read at a time
# What some editors write before the first line of a UTF-8 file.
UTF8_BOM = b"\xef\xbb\xbf"
# json.loads joins valid pairs, so any surrogate left is alone.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class PromptEntry:
    """One line of the prompts file: a prompt to serve, or the reason it can't be."""

    line: int  # 1-based, for messages
    prompt: str | list[int] | None
    id: str | None = None
    overrides: dict = field(default_factory=dict)  # per-request sampling fields
    error: str | None = None  # set when the line itself is bad


@dataclass
class Line:
    """One decoded line of a prompts file, or the reason it could not be decoded."""

    number: int  # 1-based
    text: str | None  # None when the line is bad
    error: str | None = None
    bad_byte: int | None = None  # where in the line a byte that is not UTF-8 is


def unescape_txt(line: str) -> str:
    """Undo the .txt escapes: \\n newline, \\t tab, \\\\ backslash; any other backslash stays as it
    is."""
    out = []
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line) and line[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[line[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# ----------------------------------------------------------------------------- lines


def byte_lines(stream: BinaryIO) -> Iterator[tuple[bytes | None, int]]:
    """(line, size) for each line of a binary stream, split at \\n, the only line ending (a decoded
    line is never split again).  The line comes without its ending (\\n, or \\r\\n), or as None when
    it is longer than MAX_LINE_BYTES (read past, never held whole); its size in the stream counts
    the ending."""
    # The line read so far (its last byte alone once it is too long), and the bytes dropped of it.
    pending = b""
    dropped = 0
    for chunk in iter(lambda: stream.read(READ_CHUNK), b""):
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            yield sized(line + b"\n", dropped)
            dropped = 0
        # Surely too long (an ending takes 2 bytes at most): keep only its last byte, a \r that a
        # \n may follow.
        if dropped or len(pending) > MAX_LINE_BYTES + 2:
            dropped += len(pending) - 1
            pending = pending[-1:]
    if pending:
        yield sized(pending, dropped)


def sized(line: bytes, dropped: int) -> tuple[bytes | None, int]:
    """A line as `byte_lines` yields it, from what was kept of it (ending included) and the bytes
    dropped."""
    # Any \r but the one before the \n is text.
    if line.endswith(b"\n"):
        content = line[:-1].removesuffix(b"\r")
    else:
        content = line
    if dropped + len(content) > MAX_LINE_BYTES:
        return None, dropped + len(line)
    return content, dropped + len(line)


def decoded_lines(stream: BinaryIO, first_number: int = 1) -> Iterator[tuple[Line, int]]:
    """Each line of a binary stream, decoded and numbered from `first_number` (a line ends at \\n,
    or \\r\\n), with its size in the stream; one at a time, so a file of any size streams through.
    A byte-order mark is skipped at the start of line 1."""
    for number, (raw, size) in enumerate(byte_lines(stream), start=first_number):
        # A byte-order mark is no part of line 1.
        if number == 1 and raw is not None and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        yield decoded_line(number, raw), size


def decoded_line(number: int, raw: bytes | None) -> Line:
    """Line `number`, decoded; or why it cannot be (too long: None, or not UTF-8)."""
    if raw is None:
        return Line(
            number,
            None,
            f"line {number}: longer than {MAX_LINE_BYTES} bytes, the most a line may hold; "
            "shorten it",
        )
    try:
        return Line(number, raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Line(
            number,
            None,
            f"line {number}: not UTF-8 text (bad byte at offset {exc.start} of the line); "
            "save it as UTF-8",
            bad_byte=exc.start,
        )


def numbered_lines(stream: BinaryIO) -> tuple[list[Line], int | None]:
    """Every line, decoded and numbered, and the offset in the stream of the first byte that is not
    UTF-8 (None when there is none)."""
    lines: list[Line] = []
    offset = 0
    first_bad = None
    for line, size in decoded_lines(stream):
        if first_bad is None and line.bad_byte is not None:
            first_bad = offset + line.bad_byte
        lines.append(line)
        offset += size
    return lines, first_bad


def is_entry(line: Line) -> bool:
    """A line that becomes a request: any bad line, and every line that is not blank."""
    return line.text is None or bool(line.text.strip())


def prompt_text_hint(path: str) -> str:
    """The end of the error for a --prompts FILE that is not there: it may be a prompt's text."""
    return f"; to generate from this text itself, use --prompt {shlex.quote(path)}"


def read_file_lines(path: str) -> list[Line]:
    """The lines of a prompts file; a file that is missing, unreadable or not UTF-8 at all is a
    MinirtError."""
    # Path("") is the current folder: an empty name (an unset shell variable) names no file.
    if path == "":
        raise MinirtError("--prompts is empty; give a .txt or .jsonl file, or - for standard input")
    file = Path(path)
    if not file.exists():
        raise MinirtError(
            f"prompts file {path} does not exist; "
            "pass a .txt or .jsonl file, or - for standard input"
            f"{prompt_text_hint(path)}"
        )
    if file.is_dir():
        raise MinirtError(f"{path} is a folder; --prompts takes a .txt or .jsonl file")
    try:
        with file.open("rb") as stream:
            lines, first_bad = numbered_lines(stream)
    except OSError as exc:
        raise MinirtError(f"{path}: cannot read ({exc.strerror})") from None
    if first_bad is not None and not any(line.text and line.text.strip() for line in lines):
        raise MinirtError(
            f"{path}: not UTF-8 text (bad byte at offset {first_bad}); save it as UTF-8"
        )
    return lines


def read_stdin_lines() -> list[Line]:
    """The lines of standard input, as bytes; a line that is not UTF-8 fails alone, even if all
    do."""
    if sys.stdin is None:
        raise MinirtError("standard input is closed; pass a prompts file instead of -")
    stream = getattr(sys.stdin, "buffer", None)
    # A text stream with no bytes beneath (as tests substitute): encode it back.
    if stream is None:
        stream = io.BytesIO(sys.stdin.read().encode("utf-8", "surrogatepass"))
    try:
        return numbered_lines(stream)[0]
    except OSError as exc:
        raise MinirtError(f"standard input: cannot read ({exc.strerror})") from None


# ----------------------------------------------------------------------------- entries


def strings_in(value) -> Iterator[str]:
    """Every string inside a JSON value, object keys included (without recursion: JSON may nest
    deeply)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def has_lone_surrogate(value) -> bool:
    return any(LONE_SURROGATE.search(s) for s in strings_in(value))


def lone_surrogate_field(obj: dict) -> str | None:
    """Which field of a JSONL object holds a string that is not valid Unicode ('"stop"', 'a field
    name'), if any."""
    for key, value in obj.items():
        if has_lone_surrogate(key):
            return "a field name"
        if has_lone_surrogate(value):
            return f'"{key}"'
    return None


# The longest value an error message shows whole; a longer one is cut, ending in "...".
SHOWN_VALUE_CHARS = 60


def json_kind(value) -> str:
    """What JSON calls the type of a value json.loads made: 'null', 'a boolean', 'a number',
    'a string', 'a list' or 'an object'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def json_text(value) -> str:
    """A value of a JSONL line as the line could have written it (`{"a": 1}`, `true`, `null`),
    for a message: never Python's spelling of it (`{'a': 1}`, `True`, `None`).  Past
    SHOWN_VALUE_CHARS characters it is cut, ending in "..."."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError):
        # Too deep to write back (json.loads stops a little deeper than json.dumps).
        return json_kind(value)
    if len(text) > SHOWN_VALUE_CHARS:
        return text[:SHOWN_VALUE_CHARS] + "..."
    return text


def is_json_integer(value) -> bool:
    """A JSON integer: json.loads makes it a Python int, as it makes true a bool (which Python
    counts as an int too)."""
    return isinstance(value, int) and not isinstance(value, bool)


def parse_jsonl_line(number: int, line: str) -> PromptEntry:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return PromptEntry(
            number, None, error=f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
        )
    except RecursionError:
        return PromptEntry(number, None, error=f"line {number}: not valid JSON (nested too deeply)")
    except ValueError:
        # Python reads no integer of more digits than its limit (4300 by default).
        return PromptEntry(
            number,
            None,
            error=f"line {number}: an integer too long to read (thousands of digits); "
            "no field takes one",
        )
    if not isinstance(obj, dict):
        return PromptEntry(
            number,
            None,
            error=f'line {number}: expected a JSON object with a "prompt", got {json_kind(obj)}',
        )
    return parse_jsonl_object(number, obj)


def jsonl_id(obj: dict) -> str | None:
    """A JSONL line's own "id", as its record writes it: a string as it is ("" too), an integer
    in decimal (0 is "0").  None when the line has none, or one the record cannot carry (of
    another type, or not valid Unicode): the record then gets the default, its index."""
    request_id = obj.get("id")
    if isinstance(request_id, str) and not has_lone_surrogate(request_id):
        return request_id
    if is_json_integer(request_id):
        return str(request_id)
    return None


def id_error(obj: dict) -> str | None:
    """What is wrong with a JSONL line's "id", or None: a string or an integer, as OpenAI's and
    vLLM's batch files name a request; never null, a boolean, a fraction, a list or an object,
    which the record could only write as something the line did not say."""
    if "id" not in obj:
        return None
    request_id = obj["id"]
    if isinstance(request_id, str) or is_json_integer(request_id):
        return None
    return (
        f'"id" must be a string or an integer (leave it out and the request is named by its '
        f"index), got {json_text(request_id)}"
    )


def prompt_error(obj: dict) -> str | None:
    """What is wrong with a JSONL line's "prompt", or None: a string, or a list of token ids."""
    if "prompt" not in obj:
        return 'no "prompt" field'
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, list) and all(is_json_integer(token) for token in prompt):
        return None
    return f'"prompt" must be a string (or a list of token ids), got {json_text(prompt)}'


def parse_jsonl_object(number: int, obj: dict) -> PromptEntry:
    """The entry of line `number`, a JSON object: its prompt, id and sampling fields, or what is
    wrong with them."""
    request_id = jsonl_id(obj)
    bad_field = lone_surrogate_field(obj)
    if bad_field is not None:
        return PromptEntry(
            number,
            None,
            request_id,
            error=f"line {number}: {bad_field} is not valid Unicode (a lone surrogate)",
        )
    wrong_prompt = prompt_error(obj)
    if wrong_prompt is not None:
        return PromptEntry(number, None, request_id, error=f"line {number}: {wrong_prompt}")
    prompt = obj["prompt"]
    # A good prompt stays in the record of a line that fails for another field.
    wrong_id = id_error(obj)
    if wrong_id is not None:
        return PromptEntry(number, prompt, None, error=f"line {number}: {wrong_id}")
    known = set(FIELD_NAMES) | {MAX_TOKENS_ALIAS}
    unknown = sorted(set(obj) - known - {"prompt", "id"})
    if unknown:
        return PromptEntry(
            number,
            prompt,
            request_id,
            error=f"line {number}: unknown {noun_for(len(unknown), 'field')} {', '.join(unknown)}; "
            f"known: prompt, id, {', '.join(sorted(known))}",
        )
    overrides = {k: v for k, v in obj.items() if k in known}
    return PromptEntry(number, prompt, request_id, overrides)


def entry_for(line: Line, fmt: str) -> PromptEntry:
    """The prompts-file entry of one non-blank line, in the file's format."""
    if line.error is not None or line.text is None:
        return PromptEntry(line.number, None, error=line.error)
    if fmt == "jsonl":
        return parse_jsonl_line(line.number, line.text)
    return PromptEntry(line.number, unescape_txt(line.text))


def resolved_format(fmt: str, path: str, first_text: str) -> str:
    """'txt' or 'jsonl': as asked, else from the file name, else from its first non-blank line
    (`first_text`)."""
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower() if path != "-" else ""
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".txt":
        return "txt"
    return "jsonl" if first_text.lstrip().startswith("{") else "txt"


def read_prompts(path: str, fmt: str = "auto") -> list[PromptEntry]:
    """Read a prompts file (or '-' for standard input).  A file that can't be read is a MinirtError;
    a bad line is an entry with an error of its own."""
    if path == "-":
        lines = read_stdin_lines()
    else:
        lines = read_file_lines(path)
    first_text = next((line.text for line in lines if line.text and line.text.strip()), "")
    fmt = resolved_format(fmt, path, first_text)
    entries = [entry_for(line, fmt) for line in lines if is_entry(line)]
    if not entries:
        source = "standard input" if path == "-" else path
        raise MinirtError(f"{source} holds no prompts (blank lines are skipped)")
    return entries
