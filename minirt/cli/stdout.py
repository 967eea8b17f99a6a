"""What to do when standard output fails: its reader has gone (`| head`) or writing it fails.

Owns: `mute_stdout`, `stdout_error` (the failure as one line: closed, 141, or failing, 74) and
`flush_stdout`.

Must not know: what is written, or what any command does.
"""

from __future__ import annotations

import io
import os
import sys

from ..errors import OutputError, StdoutClosed


def mute_stdout() -> None:
    """Once standard output's reader has gone: point it at os.devnull, so that what is still
    buffered does not fail again (as "Exception ignored ... BrokenPipeError") when Python exits."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        # Not a real file (a test's captured output): nothing will be flushed at exit.
        pass
    finally:
        os.close(devnull)


def stdout_error(exc: OSError, told: str) -> OutputError:
    """A failed write to standard output as one line: closed by its reader (141), or failing
    (74)."""
    if isinstance(exc, BrokenPipeError):
        return StdoutClosed(f"standard output was closed {told}")
    return OutputError(f"cannot write standard output ({exc.strerror or exc}) {told}")


def flush_stdout() -> None:
    """Flush standard output; if that fails, mute it (so that Python's flush at exit does not fail
    again), and raise."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        mute_stdout()
        raise stdout_error(exc, "before everything was written") from None
