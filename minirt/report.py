"""What a generate run shows: completions in input order, JSONL records, progress, the round grid, the summary.

Owns:
  * `OrderedOutput`: records leave in input order, each as soon as it and
    every earlier one are final, to standard output and to the JSONL file,
    flushed at once so an interrupted run keeps what is done;
  * `Progress`: a one-line progress bar on standard error;
  * `group_grid`: a static group's round grid (the `--trace` view);
  * `summary`: the closing counts.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO

from .engine import RunStats
from .scheduler import GroupRecord
from .request import Request


def request_label(request: Request) -> str:
    """'[3]' for a request without an id of its own, '[3] my-id' otherwise."""
    return f"[{request.index}]" if request.id == str(request.index) else f"[{request.index}] {request.id}"


def completion_block(request: Request, color: bool = False) -> str:
    """One request, readably: a header line, then the prompt and its completion (bold on a terminal)."""
    if request.error is not None:
        return f"### {request_label(request)}: error: {request.error}\n"
    header = (f"### {request_label(request)}: {request.finish_reason}, {len(request.token_ids)} new tokens, "
              f"group {request.group}, rounds {request.first_round}-{request.finish_round}")
    if request.text is None:  # no tokenizer: show ids
        return f"{header}\n{request.prompt_ids} -> {request.token_ids}\n"
    completion = f"\033[1m{request.text}\033[0m" if color else request.text
    return f"{header}\n{request.prompt}{completion}\n"


class OrderedOutput:
    """Emits finished requests in input order, the moment the order allows."""

    def __init__(self, total: int, stdout: IO | None, jsonl: IO | None, color: bool = False):
        self.total, self.color = total, color
        self.stdout, self.jsonl = stdout, jsonl
        self.ready: dict[int, Request] = {}
        self.next_index = 0
        self.done = 0

    def final(self, request: Request) -> None:
        self.ready[request.index] = request
        self.done += 1
        while self.next_index in self.ready:
            self._emit(self.ready.pop(self.next_index))
            self.next_index += 1

    def flush_out_of_order(self) -> None:
        """After an interruption: write what is final even if an earlier request never finished."""
        for index in sorted(self.ready):
            self._emit(self.ready.pop(index))

    def _emit(self, request: Request) -> None:
        if self.stdout is not None:
            self.stdout.write(completion_block(request, self.color) + "\n")
            self.stdout.flush()
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(request.record(), ensure_ascii=False) + "\n")
            self.jsonl.flush()


class Progress:
    """A progress bar on standard error, redrawn at most ten times a second."""

    def __init__(self, total: int, stream: IO = sys.stderr, enabled: bool = True, width: int = 24):
        self.total, self.stream, self.width = total, stream, width
        self.enabled = enabled
        self.last_draw = 0.0
        self.drawn = False

    def update(self, stats: RunStats, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_draw < 0.1:
            return
        self.last_draw = now
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        line = (f"\rgenerating [{bar}] {done}/{self.total} requests | group {len(stats.groups)} | "
                f"round {stats.rounds} | {stats.generated_tokens} tokens | {stats.tokens_per_second:.1f} tok/s")
        self.stream.write(line)
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (so other text can follow); the next update starts a new one."""
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False


def round_grid(title: str, members: list[Request], first_round: int, last_round: int, active_rows: list[int],
               rows_stay: bool) -> list[str]:
    """A row per request, a column per round: '#' it produced a token, '-' it was waiting,
    '.' it had finished but its row stayed in the group (static), blank once its row was freed."""
    rounds = list(range(first_round, last_round + 1))
    wide = len(rounds) <= 40  # space the columns when they fit
    sep = " " if wide else ""
    label_width = max([len(request_label(r)) for r in members] + [len("active rows")]) + 2
    lines = [title]
    if wide:
        lines.append(" " * label_width + sep.join(str(n % 10) for n in rounds) + "   (round, last digit)")
    for r in members:
        cells = []
        for n in rounds:
            if r.first_round is not None and r.finish_round is not None and r.first_round <= n <= r.finish_round:
                cells.append("#")
            elif r.first_round is not None and n < r.first_round:
                cells.append("-")
            else:
                cells.append("." if rows_stay else " ")
        reason = r.finish_reason if r.error is None else "error"
        lines.append(f"{request_label(r):<{label_width}}{sep.join(cells)}   {len(r.token_ids)} tokens, {reason}")
    lines.append(f"{'active rows':<{label_width}}" + sep.join(str(n) if n < 10 else "+" for n in active_rows))
    return lines


def group_grid(group: GroupRecord, waiting: list[Request]) -> str:
    """A static group's rounds, and which requests waited for the whole group."""
    members = f"{len(group.members)} member{'s' if len(group.members) != 1 else ''}"
    lines = round_grid(f"group {group.number}: {members}, rounds {group.first_round}-{group.last_round}",
                       group.members, group.first_round, group.last_round, group.active_rows, rows_stay=True)
    if waiting:
        rounds = group.last_round - group.first_round + 1
        shown = ", ".join(f"[{r.index}]" for r in waiting[:8]) + (" ..." if len(waiting) > 8 else "")
        lines.append(f"waiting through all {rounds} rounds of this group: {shown} "
                     f"(the next group starts in round {group.last_round + 1})")
    return "\n".join(lines) + "\n"


def continuous_grid(requests: list[Request], stats: RunStats) -> str:
    """The whole run under continuous batching: rows are freed and refilled every round."""
    served = [r for r in requests if r.first_round is not None]
    if not served:
        return ""
    lines = round_grid(f"continuous batching: {len(served)} requests in up to {stats.batch_size} rows, rounds 1-{stats.rounds}",
                       served, 1, stats.rounds, stats.active_rows_per_round, rows_stay=False)
    return "\n".join(lines) + "\n"


def summary(stats: RunStats, load_seconds: float) -> str:
    """The closing counts, one fact per line."""
    ok = stats.requests - stats.failed
    row_rounds = stats.batch_size * stats.rounds
    active = sum(stats.active_rows_per_round)
    lines = [
        f"requests     {stats.requests} ({ok} ok, {stats.failed} failed)",
        (f"groups       {len(stats.groups)} (static, batch size {stats.batch_size})" if stats.policy == "static"
         else f"policy       continuous batching, up to {stats.batch_size} rows"),
        f"rounds       {stats.rounds}",
        f"utilization  {stats.utilization:.1%} active rows ({active} of {row_rounds} row-rounds)",
        f"tokens       {stats.prompt_tokens} prompt, {stats.generated_tokens} generated",
        f"speed        {stats.tokens_per_second:.1f} generated tokens/s",
        f"wall time    {stats.wall_seconds:.2f} s generating, {load_seconds:.2f} s loading",
    ]
    return "\n".join(lines) + "\n"
