"""A one-line progress bar on standard error.

Owns: `Progress`, redrawn at most ten times a second from the run's counts, and cleared before anything
else is printed.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from .summary import tokens_per_second
from ..engine.stats import RunStats


class Progress:
    """A progress bar on standard error, redrawn at most ten times a second."""

    def __init__(self, total: int, stream: IO = sys.stderr, enabled: bool = True, width: int = 24):
        self.total, self.stream, self.width, self.enabled = total, stream, width, enabled
        self.last_draw, self.drawn = 0.0, False

    def update(self, stats: RunStats, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_draw < 0.1:
            return
        self.last_draw = now
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        if stats.policy != "static":
            where = "continuous"
        else:  # a group is recorded when it starts: the last one is the one running
            where = (
                f"{len(stats.groups)} groups"
                if done == self.total
                else f"group {len(stats.groups)}"
            )
        line = (
            f"\rgenerating [{bar}] {done}/{self.total} requests | {where} | "
            f"round {stats.rounds} | {stats.generated_tokens} tokens | {tokens_per_second(stats):.1f} tok/s"
        )
        self.stream.write(line)
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (so other text can follow); the next update starts a new one."""
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False
