"""An --output file that nothing is lost from and that never clobbers what it should not.

Owns: `OutputFile` (written through a partial file beside the target and renamed over it at the end,
each line whole; pipes, devices and standard output written directly) and `writing_changes` (whether
writing a path could change a file of a folder: inside it, or one of its files through a link).

Must not know: what the lines hold, or what any command does.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from contextlib import suppress
from pathlib import Path

from ..errors import MinirtError, OutputError
from ..loading.checkpoint import model_boundary


class OutputFile:
    """An --output file of lines (records), written so that nothing is lost and nothing clobbered.

    A regular file is written through a partial file beside it, made by `tempfile.mkstemp` (a new
    file with a short, unpredictable name: never one planted there in advance), each line whole and
    at once; `keep` renames it over the target when the run ends, with the target's mode, and
    `discard` deletes it, leaving the target as it was.  Anything else (a pipe, a FIFO, a device
    such as /dev/null), and the file that standard output or error already writes to (`--output
    /dev/stdout`), is written directly: never created, cut or replaced (so there a write that fails
    part-way cannot be cut back either)."""

    def __init__(self, path: str):
        # An empty name (an unset shell variable) would otherwise name the current folder.
        if path == "":
            raise MinirtError(
                "--output is empty; give a file for the records (out.jsonl), or leave --output out"
            )
        self.path = path
        self.target = path
        # None: written directly.
        self.partial: str | None = None
        # Whole records written, and the bytes they take.
        self.records = 0
        self.size = 0
        self.fd = self._open()

    def _open(self) -> int:
        """Opened now, so that a bad path fails before any work is done; how, decided by what `path`
        is now."""
        try:
            st = stat_or_none(self.path)
            stream = standard_stream(st)
            # Share its offset: records and completions land in the order written.
            if stream is not None:
                return os.dup(stream)
            # As it is: no O_CREAT, no O_TRUNC.
            if st is not None and not stat.S_ISREG(st.st_mode):
                return os.open(self.path, os.O_WRONLY | os.O_APPEND)
            # Through a symlink, the file it names is replaced.
            self.target = os.path.realpath(self.path)
            # Refused as writing it in place would be, and for the same reason (permission
            # denied, a read-only file system): opened for writing, neither created nor cut.
            if st is not None:
                os.close(os.open(self.target, os.O_WRONLY))
            fd, self.partial = tempfile.mkstemp(
                prefix=".minirt-", suffix=".partial", dir=os.path.dirname(self.target)
            )
            return fd
        except OSError as exc:
            raise MinirtError(
                f"cannot write --output {self.path}{why_not_written(exc)}; {what_to_do(exc)}"
            ) from None

    def write(self, line: str) -> None:
        """One record as one whole line; a write that fails part-way is cut back to the last whole
        record."""
        data = line.encode("utf-8")
        try:
            left = memoryview(data)
            while left:
                left = left[os.write(self.fd, left) :]
        except OSError as exc:
            self._cut_back()
            if self.records == 1:
                kept = "the 1 record before it is kept, a whole line"
            else:
                kept = f"the {self.records} records before it are kept, each a whole line"
            raise OutputError(
                f"cannot write --output {self.path}{why_not_written(exc)}; {kept}"
            ) from None
        self.records += 1
        self.size += len(data)

    def _cut_back(self) -> None:
        if self.partial is None:
            # Written directly: what is there before our records is not ours to cut.
            return
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
                    # As open() would have made it.
                    os.chmod(self.partial, 0o666 & ~current_umask())
                os.replace(self.partial, self.target)
        except OSError as exc:
            raise OutputError(
                f"cannot write --output {self.path}{why_not_written(exc)}; the records are in "
                f"{self.partial}"
            ) from None

    def close(self, interrupted: bool) -> None:
        """The run is over: `keep` the records, unless it was interrupted before any record was
        written: then it produced nothing to keep, and `discard` leaves the target as it was."""
        if interrupted and self.records == 0:
            self.discard()
        else:
            self.keep()

    def discard(self) -> None:
        """The run produced nothing to keep: the partial file goes, and the target stays as it was.
        Never raises: a partial file already gone must not hide the error that brought us here."""
        with suppress(OSError):
            os.close(self.fd)
        if self.partial is not None:
            with suppress(OSError):
                os.unlink(self.partial)


def why_not_written(exc: OSError) -> str:
    """What follows "cannot write --output PATH" in a message: the system's reason, in words that
    say what it means where they do not ("Read-only file system" alone reads like a permission)."""
    if exc.errno == errno.EROFS:
        return ": it is on a read-only file system"
    if exc.errno == errno.ENOSPC:
        return f" ({exc.strerror}): the disk is full"
    return f" ({exc.strerror})"


def what_to_do(exc: OSError) -> str:
    """What to do about an --output that cannot be opened, for the reason `exc` gives."""
    if exc.errno == errno.EROFS:
        return "write the records somewhere else"
    if exc.errno == errno.ENOSPC:
        return "free some space, or write the records somewhere else"
    return "check the folder exists and is writable"


def stat_or_none(path: str) -> os.stat_result | None:
    """`os.stat(path)` (symlinks followed), or None when nothing is there yet."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def standard_stream(st: os.stat_result | None) -> int | None:
    """1 or 2 when `st` is the file (pipe, terminal, redirect target) standard output or error
    writes to."""
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
    """Why writing `path` could change a file of `folder`, or None.  The path lies inside the folder
    as given (no symlink resolved), or once resolved inside the resolved folder (in a Hugging Face
    cache snapshot, whose files link into `models--org--name/blobs/`, anywhere in that repo folder);
    or it already is one of the folder's files, through a symlink or a hard link."""
    folders = {
        model_boundary(Path(os.path.abspath(folder))),
        model_boundary(Path(os.path.realpath(folder))),
    }
    if any(
        p.is_relative_to(f)
        for p in (Path(os.path.abspath(path)), Path(os.path.realpath(path)))
        for f in folders
    ):
        return "is inside"
    try:
        st = os.stat(path)
    except OSError:
        # Nothing there (yet): it cannot be one of the folder's files.
        return None
    # A symlinked subfolder is listed, not entered: no loops.
    for root, _, names in os.walk(folder):
        for name in names:
            # A symlink is followed to the file it names (a snapshot's blob).
            with suppress(OSError):
                if same_file(os.stat(os.path.join(root, name)), st):
                    return "is the same file as one inside"
    return None
