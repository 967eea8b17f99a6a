"""The round grids of simulations, drawn as one SVG (the README's pictures).

Owns: `svg_panels`, a panel per simulation, a row per request and a column per round, and its
colours.

Must not know: models, arrays, or how the rounds were run.
"""

from __future__ import annotations


from .grids import cell_mark
from .plural import plural
from .simulation import Simulation


# Where the grid starts: room for the labels on its left.
LEFT = 110
COLOURS = {"#": "#2b6cb0", "-": "#e2e8f0", ".": "#f6ad55", " ": "#ffffff"}
LEGEND = [
    ("#", "active (produces a token)"),
    ("-", "waiting for a row"),
    (".", "finished, row still held by its static group"),
]


def svg_panels(sims: list[Simulation], title: str) -> str:
    """One SVG: for each simulation, a grid of cells (a row per request, a column per round)."""
    width_rounds = max(s.total_rounds for s in sims)
    n_requests = max(len(s.requests) for s in sims)
    cell = max(2, min(24, 900 // max(width_rounds, 1), 480 // max(n_requests, 1)))
    top = 40
    gap = 62
    panel_h = n_requests * cell
    # Room for the legend.
    width = max(LEFT + width_rounds * cell + 20, 720)
    tick_every = next(
        step
        for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9)
        if width_rounds / step <= 20
    )
    height = top + len(sims) * (panel_h + gap) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12" data-cell="{cell}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>',
    ]
    for k, sim in enumerate(sims):
        y0 = top + k * (panel_h + gap) + 16
        parts += panel(sim, y0, cell, tick_every)
    for j, (mark, label) in enumerate(LEGEND):
        x = 10 + j * 200
        parts.append(
            f'<rect x="{x}" y="{height - 26}" width="12" height="12" fill="{COLOURS[mark]}"/>'
        )
        parts.append(f'<text x="{x + 18}" y="{height - 16}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def panel(sim: Simulation, y0: int, cell: int, tick_every: int) -> list[str]:
    """One simulation's panel: its title, round numbers on top, and a row of cells per request."""
    parts = [
        f'<text x="10" y="{y0 - 20}">{sim.policy}: {plural(sim.total_rounds, "round")}, '
        f"utilization {sim.utilization:.1%}</text>"
    ]
    # Round numbers on top.
    for n in [1] + list(range(tick_every, sim.total_rounds + 1, tick_every)):
        parts.append(
            f'<text x="{LEFT + (n - 0.5) * cell}" y="{y0 - 4}" text-anchor="middle" '
            f'font-size="10" fill="#555">{n}</text>'
        )
    for i, r in enumerate(sim.requests):
        if cell >= 10:
            parts.append(
                f'<text x="{LEFT - 6}" y="{y0 + i * cell + cell - 3}" text-anchor="end" '
                f'font-size="{min(11, cell - 2)}">req {r.index}</text>'
            )
        parts += row_cells(sim, r, y0 + i * cell, cell)
    return parts


def row_cells(sim: Simulation, request, y: int, cell: int) -> list[str]:
    """A request's row of cells: one rect per run of equal cells keeps big grids small."""
    parts = []
    held_until = sim.row_held_until(request)
    # Big cells are drawn one by one, with a gap; small ones as runs.
    if cell >= 10:
        gap_px = 1
    else:
        gap_px = 0
    n = 1
    while n <= sim.total_rounds:
        mark = cell_mark(request, n, held_until)
        run = 1
        while (
            not gap_px
            and n + run <= sim.total_rounds
            and cell_mark(request, n + run, held_until) == mark
        ):
            run += 1
        if mark != " ":
            parts.append(
                f'<rect x="{LEFT + (n - 1) * cell}" y="{y}" width="{run * cell - gap_px}" '
                f'height="{cell - gap_px}" fill="{COLOURS[mark]}"/>'
            )
        n += run
    return parts
