"""What every minirt command shares: one-line errors, documented exit codes, signals and a closed standard output.

Owns: `run_command`, which calls a command's main function and turns a
MinirtError into one line on standard error (never a traceback), the exit
codes below (each error in errors.py carries its own),
`StopSignals` (Ctrl-C and SIGTERM as exceptions, held back while a record is
being written), `OutputFile` (an output file that only a run that started
replaces, and that never holds half a line) and `mute_stdout` (what to do
once a reader closed our standard output, as in `| head`).

Must not know: what any particular command does.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable

from .errors import MinirtError, OutputError, StdoutClosed, Terminated

EXIT_OK = 0  # everything asked for was done
EXIT_REQUEST_FAILED = 1  # the run finished, but at least one request got an error of its own
EXIT_USAGE = MinirtError.exit_code  # 2: a bad flag, file, model or backend: nothing was run (as argparse)
EXIT_OUTPUT_FAILED = OutputError.exit_code  # 74: writing an output file failed; what was whole is kept
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); whatever was finished has been kept
EXIT_STDOUT_CLOSED = StdoutClosed.exit_code  # 141: standard output was closed by its reader, as in `| head`
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM); whatever was finished has been kept


class StopSignals:
    """Inside `with StopSignals()`, SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated; within
    `held()` a signal waits until the block is done, so a record is never half written.  The handlers that
    were there before come back when the `with` block ends."""

    RAISES = {signal.SIGINT: KeyboardInterrupt, signal.SIGTERM: Terminated}

    def __init__(self):
        self.previous: dict = {}
        self.pending: int | None = None
        self.holding = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for signum in self.RAISES:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # an ignored signal stays ignored (nohup)
                    self.previous[signum] = signal.signal(signum, self.on_signal)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self.previous = {}

    def on_signal(self, signum: int, frame) -> None:
        if self.holding:
            self.pending = signum
            return
        raise self.RAISES[signum]()

    @contextmanager
    def held(self):
        """Run the block whole: a signal that arrives meanwhile is raised when it ends."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise self.RAISES[signum]()


class OutputFile:
    """An --output file of lines (records), written so that nothing is lost and nothing clobbered.  The lines
    go to a partial file beside the target (a device or a pipe, such as /dev/stdout, is written directly),
    each whole and at once; `keep` renames it over the target when the run ends, `discard` deletes it when
    the run never started, leaving the target as it was."""

    def __init__(self, path: str):
        self.path, self.target = path, os.path.realpath(path)
        self.direct = os.path.exists(path) and not os.path.isfile(path)
        folder, name = os.path.split(self.target)
        self.partial = self.target if self.direct else os.path.join(folder, f".{name}.{os.getpid()}.partial")
        self.records, self.size = 0, 0  # whole records written, and the bytes they take
        self.fd = self._open()

    def _open(self) -> int:
        """Created now, so that a bad path fails before any work is done."""
        try:
            if not self.direct and os.path.exists(self.target) and not os.access(self.target, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))  # as writing it in place would
            return os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError as exc:
            raise MinirtError(f"cannot write --output {self.path} ({exc.strerror}); "
                              "check the folder exists and is writable") from None

    def write(self, line: str) -> None:
        """One record as one whole line; a write that fails part-way is cut back to the last whole record."""
        data = line.encode("utf-8")
        try:
            left = memoryview(data)
            while left:
                left = left[os.write(self.fd, left):]
        except OSError as exc:
            self._cut_back()
            raise OutputError(f"cannot write --output {self.path} ({exc.strerror}); the {self.records} records "
                              "before it are kept, each a whole line") from None
        self.records, self.size = self.records + 1, self.size + len(data)

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self.fd, self.size)
            os.lseek(self.fd, self.size, os.SEEK_SET)
        except OSError:
            pass  # a device or a pipe: there is nothing to cut

    def keep(self) -> None:
        """The run is over (done, interrupted or failed): the records written replace the target."""
        try:
            os.close(self.fd)
            if not self.direct:
                if os.path.exists(self.target):
                    shutil.copymode(self.target, self.partial)
                os.replace(self.partial, self.target)
        except OSError as exc:
            raise OutputError(f"cannot write --output {self.path} ({exc.strerror}); the records are in "
                              f"{self.partial}") from None

    def discard(self) -> None:
        """The run never started: the partial file goes, and the target stays as it was."""
        os.close(self.fd)
        if not self.direct:
            os.unlink(self.partial)


def mute_stdout() -> None:
    """Once standard output's reader has gone: point it at os.devnull, so that what is still buffered
    does not fail again (as "Exception ignored ... BrokenPipeError") when Python exits."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a test's captured output): nothing will be flushed at exit
    finally:
        os.close(devnull)


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "minirt") -> int:
    """Run `main(argv)`, mapping user-fixable problems to one line and an exit code."""
    try:
        code = main(argv)
        sys.stdout.flush()  # a closed standard output shows here, not as noise at exit
        return code
    except MinirtError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into `head`: not worth a traceback, but not a success either
        mute_stdout()
        print(f"{prog}: error: standard output was closed before everything was written", file=sys.stderr)
        return EXIT_STDOUT_CLOSED
