"""Reading prompts files: one prompt per line (.txt) or one JSON object per line (.jsonl).

Owns: the two formats and their escapes, and telling a bad file (one line,
nothing runs) from a bad line (that request alone gets an error).

.txt   One prompt per line.  Write a newline inside a prompt as \\n, a tab as
       \\t and a backslash as \\\\.  Blank lines are skipped (use .jsonl for an
       empty prompt).
.jsonl One JSON object per line: {"prompt": "...", "id": "optional", ...} plus
       any sampling field to override for that request alone: max_new_tokens,
       temperature, top_k, top_p, seed, stop, stop_token_ids, ignore_eos.
       Blank lines are skipped.
-      Standard input, in either format: JSONL if the first non-blank line
       starts with "{", text otherwise.

Must not know: models, tokenizers or how requests are served.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import MinirtError
from .sampling import SamplingParams

FORMATS = ("auto", "txt", "jsonl")


@dataclass
class PromptEntry:
    """One line of the prompts file: a prompt to serve, or the reason it can't be."""

    line: int  # 1-based line number in the file, for messages
    prompt: str | list[int] | None
    id: str | None = None
    overrides: dict = field(default_factory=dict)  # per-request sampling fields
    error: str | None = None  # set when the line itself is bad


def unescape_txt(line: str) -> str:
    """Undo the .txt escapes: \\n newline, \\t tab, \\\\ backslash; any other backslash stays as it is."""
    out, i = [], 0
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line) and line[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[line[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def parse_jsonl_line(number: int, line: str) -> PromptEntry:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return PromptEntry(number, None, error=f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
    if not isinstance(obj, dict):
        return PromptEntry(number, None,
                           error=f"line {number}: expected a JSON object with a \"prompt\", got {type(obj).__name__}")
    request_id = obj.get("id")
    request_id = None if request_id is None else str(request_id)
    if "prompt" not in obj:
        return PromptEntry(number, None, request_id, error=f"line {number}: no \"prompt\" field")
    prompt = obj["prompt"]
    is_id_list = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not isinstance(prompt, str) and not is_id_list:
        return PromptEntry(number, None, request_id,
                           error=f"line {number}: \"prompt\" must be a string (or a list of token ids)")
    known = set(SamplingParams.field_names())
    unknown = sorted(set(obj) - known - {"prompt", "id"})
    if unknown:
        return PromptEntry(number, prompt, request_id,
                           error=f"line {number}: unknown field(s) {', '.join(unknown)}; "
                                 f"known: prompt, id, {', '.join(sorted(known))}")
    overrides = {k: v for k, v in obj.items() if k in known}
    return PromptEntry(number, prompt, request_id, overrides)


def read_prompts(path: str, fmt: str = "auto") -> list[PromptEntry]:
    """Read a prompts file (or '-' for standard input).  A file that can't be read is a MinirtError."""
    if path == "-":
        text = sys.stdin.read()
        source = "standard input"
    else:
        file = Path(path)
        if not file.exists():
            raise MinirtError(f"prompts file {path} does not exist; "
                              "pass a .txt or .jsonl file, or - for standard input")
        if file.is_dir():
            raise MinirtError(f"{path} is a folder; --prompts takes a .txt or .jsonl file")
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise MinirtError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
        except OSError as exc:
            raise MinirtError(f"{path}: cannot read ({exc.strerror})") from None
        source = path
    lines = text.splitlines()
    if fmt == "auto":
        suffix = Path(path).suffix.lower() if path != "-" else ""
        if suffix in (".jsonl", ".ndjson"):
            fmt = "jsonl"
        elif suffix == ".txt":
            fmt = "txt"
        else:
            first = next((ln for ln in lines if ln.strip()), "")
            fmt = "jsonl" if first.lstrip().startswith("{") else "txt"
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if fmt == "jsonl":
            entries.append(parse_jsonl_line(number, line))
        else:
            entries.append(PromptEntry(number, unescape_txt(line)))
    if not entries:
        raise MinirtError(f"{source} holds no prompts (blank lines are skipped)")
    return entries
