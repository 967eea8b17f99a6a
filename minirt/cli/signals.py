"""Ctrl-C and SIGTERM during a run, as exceptions that never cut a record in half.

Owns: `StopSignals`, which raises KeyboardInterrupt on SIGINT and `Terminated` on SIGTERM, and holds
either back while a record is being written (`held`).

Must not know: what is being written, or what any command does.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from ..errors import Terminated


class StopSignals:
    """Inside `with StopSignals()`, SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated;
    within `held()` a signal waits until the block is done, so a record is never half written.  The
    handlers that were there before come back when the `with` block ends."""

    RAISES: dict[int, type[BaseException]] = {
        signal.SIGINT: KeyboardInterrupt,
        signal.SIGTERM: Terminated,
    }

    def __init__(self) -> None:
        self.previous: dict = {}
        self.pending: int | None = None
        self.holding = False

    def __enter__(self) -> StopSignals:
        # Only the main thread may set handlers.
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.RAISES:
            # An ignored signal stays ignored (nohup).
            if signal.getsignal(signum) is not signal.SIG_IGN:
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
            signum = self.pending
            self.pending = None
            raise self.RAISES[signum]()
