"""What a generate run shows: completions in input order, JSONL records, progress, the round grid, the summary.

Owns:
  * `record`: a finished request as the JSON object --output writes;
  * `OrderedOutput`: records leave in input order, each as soon as it and
    every earlier one are final, to standard output and to the JSONL file,
    flushed at once so an interrupted run keeps what is done; a closed or
    failing standard output (`| head`, a full disk) stops the run unless
    --output still wants records;
  * `Progress`: a one-line progress bar on standard error;
  * `group_grid`: a static group's round grid (the `--trace` view);
  * `summary`: the closing counts.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from typing import IO, Callable, ContextManager

from .cli import OutputFile, mute_stdout, stdout_error
from .errors import OutputError
from .engine import RunStats
from .output import RequestOutput, prompt_text
from .scheduler import GroupRecord
from .request import Request, unshown_text
from .tokenizer import Tokenizer


def request_label(request: Request) -> str:
    """'[3]' for a request without an id of its own, '[3] my-id' otherwise."""
    label = f"[{request.index}]" if request.id == str(request.index) else f"[{request.index}] {request.id}"
    return label if request.params.n == 1 else f"{label} sample {request.sample}"


def record(request: Request, tokenizer: Tokenizer | None = None) -> dict:
    """The JSON-ready record of a finished request (one line of --output): its `RequestOutput`, as JSON."""
    return RequestOutput.from_request(request, tokenizer).record(request.prompt is None, request.params.n)


def block_header(request: Request) -> str:
    """'### [3]: length, 12 new tokens, group 1, rounds 1-12', or '### [3]: error: why'."""
    if request.error is not None:
        return f"### {request_label(request)}: error: {request.error}"
    group = "" if request.group is None else f"group {request.group}, "  # no groups under continuous batching
    return (f"### {request_label(request)}: {request.finish_reason}, {len(request.token_ids)} new tokens, "
            f"{group}rounds {request.first_round}-{request.finish_round}")


def shown_prompt(request: Request, tokenizer: Tokenizer | None) -> str:
    """The prompt as a completion follows it: its text, or its ids and an arrow when it has no text."""
    prompt = prompt_text(request, tokenizer)
    return f"{request.prompt_ids} -> " if prompt is None else prompt  # a token-id prompt, no tokenizer given


def completion_block(request: Request, color: bool = False, tokenizer: Tokenizer | None = None) -> str:
    """One request, readably: a header line, then the prompt and its completion (bold on a terminal)."""
    if request.error is not None:
        return block_header(request) + "\n"
    if request.text is None:  # no tokenizer: show ids
        return f"{block_header(request)}\n{request.prompt_ids} -> {request.token_ids}\n"
    return f"{block_header(request)}\n{shown_prompt(request, tokenizer)}{bold(request.text, color)}\n"


def bold(text: str, color: bool) -> str:
    return f"\033[1m{text}\033[0m" if color and text else text


class OrderedOutput:
    """Emits finished requests in input order, the moment the order allows: each completion to standard output,
    then its record to --output.  Only the record is written within `hold` (a signal waits until it is whole);
    standard output never is, so that Ctrl-C and SIGTERM are not held off by a reader that does not read.

    With `stream`, the request whose turn it is shows its text as its tokens come (`token`), between a
    '### [i]: streaming' line and its usual header line; the others wait for their turn, as without it."""

    def __init__(self, total: int, stdout: IO | None, jsonl: OutputFile | None, color: bool = False,
                 hold: Callable[[], ContextManager] = nullcontext, tokenizer: Tokenizer | None = None,
                 stream: bool = False):
        self.total, self.color, self.hold, self.tokenizer = total, color, hold, tokenizer  # tokenizer: id prompts
        self.stdout, self.jsonl = stdout, jsonl
        self.ready: dict[int, Request] = {}  # final, and not yet written to --output
        self.next_index = 0
        self.done = 0
        self.shown = 0  # completions that reached standard output
        self.last_shown = -1  # the index of the last of them
        self.showing = False  # still True after a signal cut a completion short
        self.stdout_failure: OutputError | None = None  # why standard output was given up, the run going on
        self.stream, self.streaming = stream, -1  # the index of the request whose text is being streamed

    def token(self, request: Request) -> None:
        """A token was added: if the request's turn has come, its new final text goes to standard output now."""
        if not self.stream or self.stdout is None or request.order != self.next_index or request.text is None:
            return
        start = "" if self.streaming == request.order else \
            f"### {request_label(request)}: streaming\n{shown_prompt(request, self.tokenizer)}"
        self.streaming = request.order
        self._write(start + bold(unshown_text(request), self.color))

    def final(self, request: Request) -> None:
        self.ready[request.order] = request
        self.done += 1
        while self.next_index in self.ready:
            request = self.ready[self.next_index]
            if self.stdout is not None:
                self._show(request)
            with self.hold():  # the record, and then the note that it is written
                self._write_record(request)
                del self.ready[self.next_index]
                self.next_index += 1

    def flush_out_of_order(self, finished: list[Request]) -> None:
        """After an interruption: write every finished request not written yet (those it kept from `final` too),
        even if an earlier one never finished: the records, then the completions not shown yet, unless the
        interruption cut one short (its reader may not be reading) or a second one comes meanwhile."""
        for request in finished:
            if request.order >= self.next_index and request.order not in self.ready:
                self.ready[request.order] = request
                self.done += 1
        pending = [self.ready.pop(index) for index in sorted(self.ready)]
        if self.showing:
            self._drop_stdout()
        try:
            with self.hold():
                for request in pending:
                    self._write_record(request)
            if self.streaming == self.next_index and self.stdout is not None:  # a stream was cut short
                self._write("\n")
            for request in pending:
                if self.stdout is not None and request.order > self.last_shown:
                    self._show(request)
        except KeyboardInterrupt:  # every record is written: stop waiting for standard output's reader
            self._drop_stdout()

    def _write_record(self, request: Request) -> None:
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(record(request, self.tokenizer), ensure_ascii=False, allow_nan=False) + "\n")

    def _show(self, request: Request) -> None:
        """A completion on standard output (the rest of it, if it was streamed)."""
        if self.streaming == request.order:  # its text so far is out: the rest, then its header line
            text = bold(unshown_text(request), self.color) + "\n" + block_header(request) + "\n\n"
        else:
            text = completion_block(request, self.color, self.tokenizer) + "\n"
        if self._write(text):
            self.shown, self.last_shown = self.shown + 1, request.order

    def _write(self, text: str) -> bool:
        """Write to standard output; False if that failed (its reader has gone, a full disk): standard output is
        then given up, and the run stops unless --output still wants records."""
        self.showing = True
        assert self.stdout is not None  # only called while standard output is still wanted
        try:
            self.stdout.write(text)
            self.stdout.flush()
        except OSError as exc:
            self._drop_stdout()
            told = f"after {self.shown} of {self.total} completions reached it"
            if self.jsonl is None:
                raise stdout_error(exc, f"{told}; stopped (with --output FILE the run goes on and keeps every "
                                        "record)") from None
            self.stdout_failure = stdout_error(exc, f"{told}; the run went on and --output {self.jsonl.path} "
                                                    "holds every record")
        self.showing = False
        return self.stdout is not None

    def _drop_stdout(self) -> None:
        """Write nothing more to standard output, and send what is still buffered for it nowhere."""
        if self.stdout is not None:
            self.stdout = None
            mute_stdout()


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
            where = f"{len(stats.groups)} groups" if done == self.total else f"group {len(stats.groups)}"
        line = (f"\rgenerating [{bar}] {done}/{self.total} requests | {where} | "
                f"round {stats.rounds} | {stats.generated_tokens} tokens | {tokens_per_second(stats):.1f} tok/s")
        self.stream.write(line)
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (so other text can follow); the next update starts a new one."""
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False


def cell_mark(request: Request, round_number: int, row_held_until: int | None) -> str:
    """One cell of a round grid: '#' it produced a token, '-' it was waiting for a row,
    '.' it had finished but its row was still held (by its static group), blank once its row was freed."""
    first, finish = request.first_round, request.finish_round
    if first is not None and finish is not None and first <= round_number <= finish:
        return "#"
    if first is not None and round_number < first:
        return "-"
    return "." if row_held_until is not None and round_number <= row_held_until else " "


def grid_lines(rows: list[tuple[str, str, str]], rounds: range, active_rows: list[int], active_label: str,
               gap: int, header_note: str = "") -> list[str]:
    """A round grid, a line per request: rows are (label, cells, suffix); a column per round, spaced when
    40 rounds or fewer fit; round numbers (last digit) on top and the active rows per round underneath."""
    spaced = len(rounds) <= 40
    sep = " " if spaced else ""
    width = max(len(label) for label, _, _ in rows + [(active_label, "", "")]) + gap
    lines = [" " * width + sep.join(str(n % 10) for n in rounds) + header_note] if spaced else []
    lines += [f"{label:<{width}}{sep.join(cells)}{suffix}" for label, cells, suffix in rows]
    lines.append(f"{active_label:<{width}}" + sep.join(str(n) if n < 10 else "+" for n in active_rows))
    return lines


def request_grid(title: str, members: list[Request], rounds: range, active_rows: list[int],
                 held_until: Callable[[Request], int | None]) -> list[str]:
    """The --trace grid of some requests, each row ending with its token count and finish reason."""
    rows = [(request_label(r), "".join(cell_mark(r, n, held_until(r)) for n in rounds),
             f"   {len(r.token_ids)} tokens, {r.finish_reason if r.error is None else 'error'}") for r in members]
    return [title] + grid_lines(rows, rounds, active_rows, "active rows", gap=2, header_note="   (round, last digit)")


def group_grid(group: GroupRecord, waiting: list[Request]) -> str:
    """A static group's rounds, and which requests waited for the whole group."""
    members = f"{len(group.members)} member{'s' if len(group.members) != 1 else ''}"
    lines = request_grid(f"group {group.number}: {members}, rounds {group.first_round}-{group.last_round}",
                         group.members, range(group.first_round, group.last_round + 1), group.active_rows,
                         held_until=lambda r: group.last_round)
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
    title = f"continuous batching: {len(served)} requests in up to {stats.batch_size} rows, rounds 1-{stats.rounds}"
    lines = request_grid(title, served, range(1, stats.rounds + 1), stats.active_rows_per_round,
                         held_until=lambda r: r.finish_round)
    return "\n".join(lines) + "\n"


def tokens_per_second(stats: RunStats) -> float:
    return stats.generated_tokens / stats.wall_seconds if stats.wall_seconds > 0 else 0.0


def kv_limit_lines(stats: RunStats) -> list[str]:
    """A summary line when the KV budget held a group (or the continuous pool) below the batch size."""
    if not stats.kv_limited_rows:
        return []
    if stats.policy == "static":
        n = len(stats.kv_limited_rows)
        return [f"kv budget    held {n} group{'s' if n != 1 else ''} below {stats.batch_size} rows "
                f"(rows: {', '.join(map(str, stats.kv_limited_rows))})"]
    return [f"kv budget    held the pool to {stats.kv_limited_rows[0]} of {stats.batch_size} rows"]


def summary(stats: RunStats, load_seconds: float) -> str:
    """The closing counts, one fact per line."""
    row_rounds, active = sum(stats.held_rows_per_round), sum(stats.active_rows_per_round)  # rows held, rows run
    ttft = sorted(stats.first_token_seconds) or [0.0]
    lines = [
        f"requests     {stats.requests} ({stats.requests - stats.failed} ok, {stats.failed} failed)",
        (f"groups       {len(stats.groups)} (static, batch size {stats.batch_size})" if stats.policy == "static"
         else f"policy       continuous batching, up to {stats.batch_size} rows"),
        *kv_limit_lines(stats),
        f"rounds       {stats.rounds}",
        f"utilization  {stats.utilization:.1%} active rows ({active} of {row_rounds} row-rounds)",
        f"tokens       {stats.prompt_tokens} prompt, {stats.generated_tokens} generated",
        f"speed        {tokens_per_second(stats):.1f} generated tokens/s",
        f"first token  {ttft[len(ttft) // 2]:.3f} s median, {ttft[-1]:.3f} s at most (time to first token)",
        f"wall time    {stats.wall_seconds:.2f} s generating, {load_seconds:.2f} s loading",
    ]
    return "\n".join(lines) + "\n"
