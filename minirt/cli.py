"""What every minirt command shares: one-line errors, documented exit codes, signals and a closed standard output.

Owns: `run_command`, which calls a command's main function and turns a MinirtError into one line on
standard error (never a traceback), the exit codes below (each error in errors.py carries its own),
`StopSignals` (Ctrl-C and SIGTERM as exceptions, held back while a record is being written), `OutputFile`
(an output file that only a run that started replaces, and that never holds half a line), `writing_changes`
(whether an output path could change a folder's files), `mute_stdout`, `stdout_error` and `flush_stdout`
(what to do once standard output's reader has gone, as in `| head`, or writing it fails, as on a full
disk), and `parse_kv_budget` (the one spelling of a KV budget).

Must not know: what any particular command does.
"""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable

from .checkpoint import model_boundary
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

    RAISES: dict[int, type[BaseException]] = {signal.SIGINT: KeyboardInterrupt, signal.SIGTERM: Terminated}

    def __init__(self) -> None:
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
    """An --output file of lines (records), written so that nothing is lost and nothing clobbered.

    A regular file is written through a partial file beside it, made by `tempfile.mkstemp` (a new file with a
    short, unpredictable name: never one planted there in advance), each line whole and at once; `keep` renames
    it over the target when the run ends, with the target's mode, and `discard` deletes it, leaving the target
    as it was.  Anything else (a pipe, a FIFO, a device such as /dev/null), and the file that standard output
    or error already writes to (`--output /dev/stdout`), is written directly: never created, cut or replaced
    (so there a write that fails part-way cannot be cut back either)."""

    def __init__(self, path: str):
        self.path, self.target = path, path
        self.partial: str | None = None  # None: written directly
        self.records, self.size = 0, 0  # whole records written, and the bytes they take
        self.fd = self._open()

    def _open(self) -> int:
        """Opened now, so that a bad path fails before any work is done; how, decided by what `path` is now."""
        try:
            st = stat_or_none(self.path)
            stream = standard_stream(st)
            if stream is not None:  # share its offset: records and completions land in the order written
                return os.dup(stream)
            if st is not None and not stat.S_ISREG(st.st_mode):
                return os.open(self.path, os.O_WRONLY | os.O_APPEND)  # as it is: no O_CREAT, no O_TRUNC
            self.target = os.path.realpath(self.path)  # through a symlink, the file it names is replaced
            if st is not None and not os.access(self.target, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))  # as writing it in place would
            fd, self.partial = tempfile.mkstemp(prefix=".minirt-", suffix=".partial",
                                                dir=os.path.dirname(self.target))
            return fd
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
        if self.partial is None:
            return  # written directly: what is there before our records is not ours to cut
        with suppress(OSError):
            os.ftruncate(self.fd, self.size)
            os.lseek(self.fd, self.size, os.SEEK_SET)

    def keep(self) -> None:
        """The run is over (done, interrupted or failed): the records written replace the target."""
        try:
            os.close(self.fd)
            if self.partial is not None:
                if os.path.exists(self.target):
                    shutil.copymode(self.target, self.partial)
                else:
                    os.chmod(self.partial, 0o666 & ~current_umask())  # as open() would have made it
                os.replace(self.partial, self.target)
        except OSError as exc:
            raise OutputError(f"cannot write --output {self.path} ({exc.strerror}); the records are in "
                              f"{self.partial}") from None

    def close(self, interrupted: bool) -> None:
        """The run is over: `keep` the records, unless it was interrupted before any record was written: then
        it produced nothing to keep, and `discard` leaves the target as it was."""
        if interrupted and self.records == 0:
            self.discard()
        else:
            self.keep()

    def discard(self) -> None:
        """The run produced nothing to keep: the partial file goes, and the target stays as it was.  Never
        raises: a partial file already gone must not hide the error that brought us here."""
        with suppress(OSError):
            os.close(self.fd)
        if self.partial is not None:
            with suppress(OSError):
                os.unlink(self.partial)


def stat_or_none(path: str) -> os.stat_result | None:
    """`os.stat(path)` (symlinks followed), or None when nothing is there yet."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def standard_stream(st: os.stat_result | None) -> int | None:
    """1 or 2 when `st` is the file (pipe, terminal, redirect target) standard output or error writes to."""
    if st is None:
        return None
    for fd in (1, 2):
        with suppress(OSError):
            if same_file(os.fstat(fd), st):
                return fd
    return None


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def current_umask() -> int:
    """The process's umask (reading it means setting it, so it is set back at once)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def writing_changes(path: str, folder) -> str | None:
    """Why writing `path` could change a file of `folder`, or None.  The path lies inside the folder as given
    (no symlink resolved), or once resolved inside the resolved folder (in a Hugging Face cache snapshot, whose
    files link into `models--org--name/blobs/`, anywhere in that repo folder); or it already is one of the
    folder's files, through a symlink or a hard link."""
    folders = {model_boundary(Path(os.path.abspath(folder))), model_boundary(Path(os.path.realpath(folder)))}
    if any(p.is_relative_to(f) for p in (Path(os.path.abspath(path)), Path(os.path.realpath(path))) for f in folders):
        return "is inside"
    try:
        st = os.stat(path)
    except OSError:
        return None  # nothing there (yet): it cannot be one of the folder's files
    for root, _, names in os.walk(folder):  # a symlinked subfolder is listed, not entered: no loops
        for name in names:
            with suppress(OSError):  # a symlink is followed to the file it names (a snapshot's blob)
                if same_file(os.stat(os.path.join(root, name)), st):
                    return "is the same file as one inside"
    return None


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


def stdout_error(exc: OSError, told: str) -> OutputError:
    """A failed write to standard output as one line: closed by its reader (141), or failing (74)."""
    if isinstance(exc, BrokenPipeError):
        return StdoutClosed(f"standard output was closed {told}")
    return OutputError(f"cannot write standard output ({exc.strerror or exc}) {told}")


def flush_stdout() -> None:
    """Flush standard output; if that fails, mute it (so Python's flush at exit does not fail again), and raise."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        mute_stdout()
        raise stdout_error(exc, "before everything was written") from None


KV_BUDGET = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(tokens?|kib|mib|gib)?\s*", re.IGNORECASE)


def parse_kv_budget(text: str, flag: str = "--kv-budget", tokens_only: bool = False) -> tuple[str, int]:
    """--kv-budget in every command: tokens ('20000', '20000tokens': one token's keys and values in every layer)
    as ('tokens', n), or memory ('512MiB', '1.5GiB', '64KiB') as ('bytes', n) unless `tokens_only`."""
    match = KV_BUDGET.fullmatch(text)
    if not match:
        raise MinirtError(f"{flag}: expected a number of tokens (20000) or a memory size (512MiB, 2GiB), got {text!r}")
    number, unit = float(match[1]), (match[2] or "tokens").lower()
    if unit.startswith("token"):
        if not number.is_integer() or number < 1:
            raise MinirtError(f"{flag}: a number of tokens must be a whole number >= 1, got {text!r}")
        return "tokens", int(number)
    if tokens_only:  # no model to size a token by
        raise MinirtError(f"{flag}: give a number of tokens (2048) here, not a memory size; got {text!r}")
    size = int(number * {"kib": 2**10, "mib": 2**20, "gib": 2**30}[unit])
    if not 0 < size < 2**60:
        raise MinirtError(f"{flag}: a memory size must be above 0 and below 2**60 bytes, got {text!r}")
    return "bytes", size


def add_version_flag(parser) -> None:
    """`--version` on a command's parser: prints `minirt X.Y.Z` and exits 0."""
    from . import __version__  # noqa: PLC0415 (here: the package is whole by the time a parser is built)
    parser.add_argument("--version", action="version", version=f"minirt {__version__}")


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "minirt") -> int:
    """Run `main(argv)`, mapping user-fixable problems to one line and an exit code."""
    try:
        code = main(argv)
        flush_stdout()  # a closed or failing standard output shows here, not as noise at exit
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
    except MemoryError:  # a model or batch bigger than this machine: one line, not a traceback
        print(f"{prog}: error: out of memory; try a smaller --batch-size or --kv-budget, or a smaller model",
              file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. piped into `head`: not worth a traceback, but not a success either
        mute_stdout()
        print(f"{prog}: error: standard output was closed before everything was written", file=sys.stderr)
        return EXIT_STDOUT_CLOSED
