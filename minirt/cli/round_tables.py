"""`minirt rounds` as text: one simulation's grid and its request table; both policies side by side.

Owns: `grid_text`, `request_table` and `comparison_table`.

Must not know: models, arrays, or how the rounds were run.
"""

from __future__ import annotations

import numpy as np

from .grids import cell_mark, grid_lines
from .plural import plural
from .simulation import Simulation


def grid_text(sim: Simulation, max_columns: int = 120) -> str:
    rounds = range(1, sim.total_rounds + 1)
    counts = (
        f"{plural(len(sim.requests), 'request')}, {plural(sim.rows, 'row')}, "
        f"{plural(sim.total_rounds, 'round')}"
    )
    lines = [
        f"{sim.policy}: {counts}, utilization {sim.utilization:.1%}   "
        "(# active, ~ prefill chunk, - waiting, . finished but row held)"
    ]
    if len(rounds) > max_columns:
        lines.append(
            f"(grid not drawn: {len(rounds)} rounds is wider than {max_columns} columns; use --svg)"
        )
        return "\n".join(lines)
    rows = [
        (f"req {r.index:<3d}", "".join(cell_mark(r, n, sim.row_held_until(r)) for n in rounds), "")
        for r in sim.requests
    ]
    return "\n".join(
        lines + grid_lines(rows, rounds, sim.stats.active_rows_per_round, "active", gap=1)
    )


def request_table(sim: Simulation) -> str:
    """A line per request: its length; the rounds it waited; the round it was admitted in (its
    prefill's first), the round that gave its first token (later when its prompt was fed in
    chunks) and its last round; its prompt's tokens, those the prefix cache gave, and the rounds
    its prompt took."""
    rows = [
        f"{r.index:7d} {r.params.max_tokens:6d} {r.rounds_waited:6d} {r.first_round:8d} "
        f"{first_token_round(r):11d} {r.finish_round:6d} {r.prompt_len:6d} "
        f"{r.cached_prompt_tokens:6d} {r.prefill_rounds:7d}"
        for r in sim.requests
    ]
    header = (
        f"{'request':>7s} {'length':>6s} {'waited':>6s} {'admitted':>8s} {'first-token':>11s} "
        f"{'finish':>6s} {'prompt':>6s} {'cached':>6s} {'prefill':>7s}"
    )
    return "\n".join([header] + rows)


def first_token_round(request) -> int:
    """The round that gave a request its first token: the last of its prompt's rounds."""
    return request.first_round + request.prefill_rounds - 1


def comparison_table(sims: list[Simulation]) -> str:
    lines = [
        f"{'policy':12s} {'rounds':>7s} {'utilization':>12s} {'mean waited':>12s} "
        f"{'mean finish':>12s} {'prefill saved':>14s}"
    ]
    for sim in sims:
        waited = np.mean([r.rounds_waited for r in sim.requests])
        finish = np.mean([r.finish_round for r in sim.requests])
        # Prompt tokens the prefix cache gave, so no round computed them.
        saved = sum(r.cached_prompt_tokens for r in sim.requests)
        lines.append(
            f"{sim.policy:12s} {sim.total_rounds:7d} {sim.utilization:12.1%} {waited:12.1f} "
            f"{finish:12.1f} {saved:14d}"
        )
    return "\n".join(lines)
