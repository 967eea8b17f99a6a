"""Reading the small JSON files of a model folder, with a size cap.

Owns: `read_json_file`, the one reader of a model folder's JSON (config.json,
generation_config.json, a shard index): a regular file of at most MAX_JSON_BYTES, so a FIFO or
/dev/zero is never read forever; `read_config`, config.json as a checked `GPT2Config` or a
one-line CheckpointError; and `broken_link`, the one wording of a path that is a symlink to
nothing or a symlink loop, which checkpoint.py uses for the folder, the weights and the shards, so
that such a link is never reported as a file that "does not exist".

Must not know: weights, backends, tokenizers or requests.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from ..errors import CheckpointError
from ..model.config import GPT2Config

# A model's JSON files are kilobytes; nothing bigger (or a FIFO, /dev/zero) is read.
MAX_JSON_BYTES = 16 * 2**20


def read_json_file(path: Path):
    """A small regular file's parsed JSON.  OSError (FileNotFoundError if missing), or ValueError
    for bad text."""
    if not stat.S_ISREG(path.stat().st_mode) or path.stat().st_size > MAX_JSON_BYTES:
        raise OSError(0, f"not a regular file of at most {MAX_JSON_BYTES // 2**20} MiB")
    return json.loads(path.read_text(encoding="utf-8"))


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


def read_config(path: Path) -> GPT2Config:
    """config.json as a checked GPT2Config, or a CheckpointError saying what is wrong with the
    file."""
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
    return GPT2Config.from_dict(raw, source=str(path))
