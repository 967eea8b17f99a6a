"""The round grid: a line per request, a column per round (the `--trace` view).

Owns: `cell_mark` (what one cell shows), `grid_lines` (the layout), `group_grid` (a static group's
rounds, and who waited for it) and `continuous_grid` (a continuous run's rounds).

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

from typing import Callable

from .plural import plural
from .records import request_label
from ..engine.request import Request
from ..engine.scheduler import GroupRecord
from ..engine.stats import RunStats


def cell_mark(request: Request, round_number: int, row_held_until: int | None) -> str:
    """One cell of a round grid: '#' it produced a token, '~' it was fed a chunk of its prompt
    that did not end it (no token yet), '-' it was waiting for a row, '.' it had finished but its
    row was still held (by its static group), blank once its row was freed."""
    first = request.first_round
    finish = request.finish_round
    if first is not None and finish is not None and first <= round_number <= finish:
        # Its prompt's rounds before the last gave no token.
        if round_number < first + request.prefill_rounds - 1:
            return "~"
        return "#"
    if first is not None and round_number < first:
        return "-"
    if row_held_until is not None and round_number <= row_held_until:
        return "."
    return " "


def grid_lines(
    rows: list[tuple[str, str, str]],
    rounds: range,
    active_rows: list[int],
    active_label: str,
    gap: int,
    header_note: str = "",
) -> list[str]:
    """A round grid, a line per request: rows are (label, cells, suffix); a column per round, spaced
    when 40 rounds or fewer fit; round numbers (last digit) on top and the active rows per round
    underneath."""
    spaced = len(rounds) <= 40
    if spaced:
        sep = " "
    else:
        sep = ""
    width = max(len(label) for label, _, _ in rows + [(active_label, "", "")]) + gap
    lines = []
    if spaced:
        lines.append(" " * width + sep.join(str(n % 10) for n in rounds) + header_note)
    lines += [f"{label:<{width}}{sep.join(cells)}{suffix}" for label, cells, suffix in rows]
    counts = sep.join(str(n) if n < 10 else "+" for n in active_rows)
    lines.append(f"{active_label:<{width}}" + counts)
    return lines


def request_grid(
    title: str,
    members: list[Request],
    rounds: range,
    active_rows: list[int],
    held_until: Callable[[Request], int | None],
) -> list[str]:
    """The --trace grid of some requests, each row ending with its token count and finish reason."""
    rows = [
        (
            request_label(r),
            "".join(cell_mark(r, n, held_until(r)) for n in rounds),
            f"   {plural(len(r.token_ids), 'token')}, {finish_word(r)}{cached_words(r)}",
        )
        for r in members
    ]
    return [title] + grid_lines(
        rows, rounds, active_rows, "active rows", gap=2, header_note="   (round, last digit)"
    )


def cached_words(request: Request) -> str:
    """', 32 prompt tokens from the prefix cache' when the cache saved it their prefill."""
    if not request.cached_prompt_tokens:
        return ""
    return f", {request.cached_prompt_tokens} prompt tokens from the prefix cache"


def finish_word(request: Request) -> str:
    """Why a request finished, as its grid row ends: its finish reason, or 'error'."""
    if request.error is None:
        return str(request.finish_reason)
    return "error"


def group_grid(group: GroupRecord, waiting: list[Request]) -> str:
    """A static group's rounds, and which requests waited for the whole group."""
    members = plural(len(group.members), "member")
    lines = request_grid(
        f"group {group.number}: {members}, rounds {group.first_round}-{group.last_round}",
        group.members,
        range(group.first_round, group.last_round + 1),
        group.active_rows,
        held_until=lambda r: group.last_round,
    )
    if waiting:
        lines.append(waiting_line(group, waiting))
    return "\n".join(lines) + "\n"


def waiting_line(group: GroupRecord, waiting: list[Request]) -> str:
    """'waiting through all 9 rounds of this group: [2] (the next group starts in round 10)'."""
    rounds = group.last_round - group.first_round + 1
    shown = ", ".join(f"[{r.index}]" for r in waiting[:8])
    if len(waiting) > 8:
        shown += " ..."
    if rounds == 1:
        through = "the 1 round"
    else:
        through = f"all {rounds} rounds"
    return (
        f"waiting through {through} of this group: {shown} "
        f"(the next group starts in round {group.last_round + 1})"
    )


def continuous_grid(requests: list[Request], stats: RunStats) -> str:
    """The whole run under continuous batching: rows are freed and refilled every round."""
    served = [r for r in requests if r.first_round is not None]
    if not served:
        return ""
    title = (
        f"continuous batching: {plural(len(served), 'request')} in up to "
        f"{plural(stats.batch_size, 'row')}, rounds 1-{stats.rounds}"
    )
    lines = request_grid(
        title,
        served,
        range(1, stats.rounds + 1),
        stats.active_rows_per_round,
        held_until=lambda r: r.finish_round,
    )
    return "\n".join(lines) + "\n"
