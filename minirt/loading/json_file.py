"""Reading the small JSON files of a model folder, with a size cap.

Owns: `read_json_file`, the one reader of a model folder's JSON (config.json,
generation_config.json, a shard index): a regular file of at most MAX_JSON_BYTES, so a FIFO or
/dev/zero is never read forever, and refused with `NotAJsonFile`, whose message says what the path
is instead; `read_config`, config.json as a checked config of its family, or a one-line
CheckpointError;
`broken_link`, the one wording of a path that is a symlink to nothing or a symlink loop, and
`not_a_regular_file`, the one wording of a path that is a folder, a FIFO, a device or a socket.
checkpoint.py (the folder, the weights, the shards) and tokenizer.py use both, so that such a path
is never reported as a file that "does not exist", nor opened (a FIFO would block).

Must not know: weights, backends, tokenizers or requests.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from ..errors import CheckpointError
from ..model.interface import ModelConfig
from ..model.registry import family_for

# A model's JSON files are kilobytes; nothing bigger (or a FIFO, /dev/zero) is read.
MAX_JSON_BYTES = 16 * 2**20
# What such a file must be, the end of every NotAJsonFile message.
WANTED = f"not a regular file of at most {MAX_JSON_BYTES // 2**20} MiB"


class NotAJsonFile(OSError):
    """`read_json_file`'s refusal of a path that is no regular file, or too big to be a model's
    JSON.  Its message is the reason alone ("a FIFO, not a regular file of at most 16 MiB"), with no
    "[Errno ...]" before it, and it is its `strerror` too, so that a caller may print either; the
    caller puts the path in front."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.strerror = reason


def read_json_file(path: Path):
    """A small regular file's parsed JSON.  OSError (FileNotFoundError if missing, NotAJsonFile
    for a folder, a FIFO, a device or a file over MAX_JSON_BYTES), or ValueError for bad text."""
    # Looked at, never opened, before it is known to be a regular file: a FIFO would block.
    kind = not_a_regular_file(path)
    if kind:
        raise NotAJsonFile(f"{kind}, {WANTED}")
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise NotAJsonFile(f"{size:,} bytes long, {WANTED}")
    return json.loads(path.read_text(encoding="utf-8"))


def not_a_regular_file(path: Path) -> str | None:
    """What `path` (followed through its links) is when it exists but is no regular file: "a
    folder", "a FIFO", "a character device", "a block device", "a socket" (or "a special file",
    for a kind the system has added).  None for a regular file, and for a path that cannot
    be looked at (absent, a broken link, a NUL byte): `broken_link` and the callers' own "missing"
    say those.  Nothing is opened."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def broken_link(path: Path) -> str | None:
    """What is wrong with `path` when it is a symlink that leads to no file: "<path> is a symlink
    loop", or "<path> is a link to <target>, which does not exist" (or "cannot be reached", with
    the system's reason); None when the path works, or is simply absent."""
    try:
        path.stat()
        return None
    except OSError as exc:
        reason = exc
    # A NUL byte: not a path at all, so no link either.
    except ValueError:
        return None
    if reason.errno == errno.ELOOP:
        return f"{path} is a symlink loop (following it never ends at a file)"
    try:
        # Following the path failed and looking at it works: only a symlink is so.
        path.lstat()
    except OSError:
        return None
    # Where the chain of links ends.
    target = os.path.realpath(path)
    if reason.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{path} is a link to {target}, which does not exist"
    return f"{path} is a link to {target}, which cannot be reached ({reason.strerror})"


def read_config(path: Path) -> ModelConfig:
    """config.json as the checked config of its family (minirt/model/registry.py), or a
    CheckpointError saying what is wrong with the file."""
    path = Path(path)
    try:
        raw = read_json_file(path)
    except OSError as exc:
        link_problem = broken_link(path)
        if link_problem:
            raise CheckpointError(
                f"{link_problem}; point the link at the model's config.json, or re-download it"
            ) from None
        if isinstance(exc, FileNotFoundError):
            raise CheckpointError(
                f"{path}: no config.json here; a model folder needs config.json beside its weights"
            ) from None
        raise CheckpointError(f"{path}: cannot read config ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    # Not UTF-8, an integer of over 4,300 digits, nesting too deep.
    except (ValueError, RecursionError):
        raise CheckpointError(
            f"{path}: not JSON in UTF-8 that minirt can read (too deep or too long)"
        ) from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    family = family_for(raw, source=str(path))
    return family.read_config(raw, str(path))
