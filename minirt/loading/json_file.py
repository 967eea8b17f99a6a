"""Reading the small JSON files of a model folder, with a size cap.

Owns: `read_json_file`, the one reader of a model folder's JSON (config.json,
generation_config.json, a shard index): a regular file of at most MAX_JSON_BYTES, so a FIFO or
/dev/zero is never read forever, and `read_config`, config.json as a checked `GPT2Config` or a
one-line CheckpointError.

Must not know: weights, backends, tokenizers or requests.
"""

from __future__ import annotations

import json
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


def read_config(path: Path) -> GPT2Config:
    """config.json as a checked GPT2Config, or a CheckpointError saying what is wrong with the
    file."""
    path = Path(path)
    try:
        raw = read_json_file(path)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: no config.json here; a model folder needs config.json beside its weights"
        ) from None
    except OSError as exc:
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
