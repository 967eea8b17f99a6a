"""A one-line progress bar on standard error.

Owns: `Progress`, redrawn at most ten times a second from the run's counts, and cleared (`clear`)
before anything else is printed on the same screen.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from .plural import plural
from .summary import tokens_per_second
from ..engine.stats import RunStats


class Progress:
    """A progress bar on standard error, redrawn at most ten times a second."""

    def __init__(self, total: int, stream: IO = sys.stderr, enabled: bool = True, width: int = 24):
        self.total = total
        self.stream = stream
        self.width = width
        self.enabled = enabled
        self.last_draw = 0.0
        self.drawn = False
        # The characters the bar's line holds now, for `clear` to wipe.
        self.drawn_width = 0

    def update(self, stats: RunStats, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_draw < 0.1:
            return
        self.last_draw = now
        line = self.line(stats, done)
        self.stream.write("\r" + line)
        self.stream.flush()
        self.drawn = True
        self.drawn_width = len(line)

    def line(self, stats: RunStats, done: int) -> str:
        """The bar's text: 'generating [###---] 3/8 requests | group 2 | round 7 | ...'."""
        if self.total:
            filled = int(self.width * done / self.total)
        else:
            filled = self.width
        bar = "#" * filled + "-" * (self.width - filled)
        if stats.policy != "static":
            where = "continuous"
        elif done == self.total:
            where = plural(len(stats.groups), "group")
        else:
            # A group is recorded when it starts: the last one is the one running.
            where = f"group {len(stats.groups)}"
        return (
            f"generating [{bar}] {done}/{self.total} requests | {where} | "
            f"round {stats.rounds} | {plural(stats.generated_tokens, 'token')} | "
            f"{tokens_per_second(stats):.1f} tok/s"
        )

    def clear(self) -> None:
        """Wipe the bar's line, so that what is printed next starts at its beginning; the next
        update draws the bar again."""
        if not (self.enabled and self.drawn):
            return
        self.stream.write("\r" + " " * self.drawn_width + "\r")
        self.stream.flush()
        self.drawn = False
        # Not rate-limited: the bar comes back at the next update.
        self.last_draw = 0.0

    def close(self) -> None:
        """End the bar's line (so other text can follow); the next update starts a new one."""
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False
