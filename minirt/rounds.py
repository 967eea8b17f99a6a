"""`python -m minirt.rounds`: static groups beside continuous batching, counted in rounds, without a model.

Owns: the simulation (requests that finish after known output lengths, run through the engine's own
schedulers, `Request` records and stop rule), its text and JSON reports, long-tailed workloads, and the SVG.

    python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3
    python -m minirt.rounds --workload 200 --seed 0 --batch-sizes 4,8,16 --svg rounds.svg

A round is one forward pass; a request with output length L is active for L
consecutive rounds, the first being its prefill.  Utilization = active
row-rounds / (rows x rounds).

Must not know: models, arrays or text.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cli import EXIT_OK, add_version_flag, parse_kv_budget, run_command
from .engine import DEFAULT_ROUND_TOKENS
from .errors import MinirtError, require_at_least_one
from .report import cell_mark, grid_lines
from .request import Request, add_token
from .sampling import SamplingParams
from .scheduler import POLICIES, SCHEDULERS, RoundPlan, Scheduler

UNLIMITED = 10**12  # a context / KV budget that never binds
MAX_LENGTH = 1_000_000  # the longest output or prompt length simulated: a request of it takes seconds
MAX_WORKLOAD = 10_000  # the most --workload requests: the simulation holds every one of them


@dataclass
class Simulation:
    """One policy's run over a workload."""
    policy: str
    rows: int
    requests: list[Request]  # each asks for its output length as max_new_tokens
    scheduler: Scheduler

    @property
    def total_rounds(self) -> int:
        return len(self.scheduler.active_rows)

    @property
    def utilization(self) -> float:
        return sum(self.scheduler.active_rows) / max(1, sum(self.scheduler.held_rows))  # as generate's summary

    def row_held_until(self, request: Request) -> int | None:
        """The last round a request's row was held: its group's end (static) or its own finish (continuous)."""
        if request.group is not None:
            return self.scheduler.groups[request.group - 1].last_round
        return request.finish_round

    def summary(self) -> dict:
        requests = [{"index": r.index, "output_len": r.params.max_new_tokens, "rounds_waited": r.rounds_waited,
                     "first_round": r.first_round, "finish_round": r.finish_round} for r in self.requests]
        return {"total_rounds": self.total_rounds, "utilization": round(self.utilization, 6), "requests": requests}


def simulate(output_lens: list[int], policy: str, rows: int, prompt_lens: list[int] | None = None,
             kv_budget: int = UNLIMITED, round_tokens: int = DEFAULT_ROUND_TOKENS,
             on_plan: Callable[[Scheduler, RoundPlan], None] | None = None) -> Simulation:
    """Run requests with the given output (and prompt) lengths through the engine's scheduler."""
    prompt_lens = prompt_lens or [1] * len(output_lens)
    if len(prompt_lens) != len(output_lens):
        raise MinirtError(f"got {len(output_lens)} output lengths but {len(prompt_lens)} prompt lengths")
    if any(n < 1 for n in output_lens) or any(p < 1 for p in prompt_lens):
        raise MinirtError("every output and prompt length must be at least 1")
    requests = [Request(index=i, id=str(i), prompt=None, prompt_ids=[0] * p,
                        params=SamplingParams(max_new_tokens=n, ignore_eos=True))
                for i, (n, p) in enumerate(zip(output_lens, prompt_lens, strict=True))]
    scheduler = SCHEDULERS[policy](rows, kv_budget, UNLIMITED, round_tokens)
    for request in requests:
        reason = scheduler.refusal(request)
        if reason is not None:
            raise MinirtError(f"request {request.index} can never run: {reason}")
        scheduler.submit(request)
    round_number = 0
    while scheduler.has_work():
        round_number += 1
        plan = scheduler.plan(round_number)
        if on_plan:
            on_plan(scheduler, plan)
        for request in plan.active:  # the "forward pass": every active row produces one token (id 0)
            add_token(request, 0, None, round_number, None, UNLIMITED)
        scheduler.complete(plan)
    return Simulation(policy, rows, requests, scheduler)


def long_tailed_workload(n: int, seed: int) -> tuple[list[int], list[int]]:
    """(output lengths, prompt lengths): log-normal, so most are short and a few are very long."""
    rng = np.random.default_rng(seed)
    outputs = np.clip(np.round(rng.lognormal(mean=np.log(24), sigma=1.0, size=n)), 1, 512).astype(int)
    prompts = np.clip(np.round(rng.lognormal(mean=np.log(32), sigma=0.8, size=n)), 1, 512).astype(int)
    return outputs.tolist(), prompts.tolist()


# ----------------------------------------------------------------------------- text and picture


def grid_text(sim: Simulation, max_columns: int = 120) -> str:
    rounds = range(1, sim.total_rounds + 1)
    lines = [f"{sim.policy}: {len(sim.requests)} requests, {sim.rows} rows, {sim.total_rounds} rounds, "
             f"utilization {sim.utilization:.1%}   (# active, - waiting, . finished but row held)"]
    if len(rounds) > max_columns:
        lines.append(f"(grid not drawn: {len(rounds)} rounds is wider than {max_columns} columns; use --svg)")
        return "\n".join(lines)
    rows = [(f"req {r.index:<3d}", "".join(cell_mark(r, n, sim.row_held_until(r)) for n in rounds), "")
            for r in sim.requests]
    return "\n".join(lines + grid_lines(rows, rounds, sim.scheduler.active_rows, "active", gap=1))


def request_table(sim: Simulation) -> str:
    rows = [f"{r.index:7d} {r.params.max_new_tokens:6d} {r.rounds_waited:6d} {r.first_round:6d} {r.finish_round:6d}"
            for r in sim.requests]
    return "\n".join([f"{'request':>7s} {'length':>6s} {'waited':>6s} {'first':>6s} {'finish':>6s}"] + rows)


def comparison_table(sims: list[Simulation]) -> str:
    lines = [f"{'policy':12s} {'rounds':>7s} {'utilization':>12s} {'mean waited':>12s} {'mean finish':>12s}"]
    for sim in sims:
        waited = np.mean([r.rounds_waited for r in sim.requests])
        finish = np.mean([r.finish_round for r in sim.requests])
        lines.append(f"{sim.policy:12s} {sim.total_rounds:7d} {sim.utilization:12.1%} {waited:12.1f} {finish:12.1f}")
    return "\n".join(lines)


COLOURS = {"#": "#2b6cb0", "-": "#e2e8f0", ".": "#f6ad55", " ": "#ffffff"}


def svg_panels(sims: list[Simulation], title: str) -> str:
    """One SVG: for each simulation, a grid of cells (a row per request, a column per round)."""
    width_rounds = max(s.total_rounds for s in sims)
    n_requests = max(len(s.requests) for s in sims)
    cell = max(2, min(24, 900 // max(width_rounds, 1), 480 // max(n_requests, 1)))
    left, top, gap = 110, 40, 62
    panel_h = n_requests * cell
    width = max(left + width_rounds * cell + 20, 720)  # room for the legend
    tick_every = next(step for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if width_rounds / step <= 20)
    height = top + len(sims) * (panel_h + gap) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12" data-cell="{cell}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>']
    for k, sim in enumerate(sims):
        y0 = top + k * (panel_h + gap) + 16
        parts.append(f'<text x="10" y="{y0 - 20}">{sim.policy}: {sim.total_rounds} rounds, '
                     f'utilization {sim.utilization:.1%}</text>')
        for n in [1] + list(range(tick_every, sim.total_rounds + 1, tick_every)):  # round numbers on top
            parts.append(f'<text x="{left + (n - 0.5) * cell}" y="{y0 - 4}" text-anchor="middle" font-size="10" '
                         f'fill="#555">{n}</text>')
        for i, r in enumerate(sim.requests):
            if cell >= 10:
                parts.append(f'<text x="{left - 6}" y="{y0 + i * cell + cell - 3}" text-anchor="end" '
                             f'font-size="{min(11, cell - 2)}">req {r.index}</text>')
            n, held_until = 1, sim.row_held_until(r)
            gap_px = 1 if cell >= 10 else 0  # big cells are drawn one by one, with a gap; small ones as runs
            while n <= sim.total_rounds:  # one rect per run of equal cells keeps big grids small
                mark, run = cell_mark(r, n, held_until), 1
                while not gap_px and n + run <= sim.total_rounds and cell_mark(r, n + run, held_until) == mark:
                    run += 1
                if mark != " ":
                    parts.append(f'<rect x="{left + (n - 1) * cell}" y="{y0 + i * cell}" width="{run * cell - gap_px}" '
                                 f'height="{cell - gap_px}" fill="{COLOURS[mark]}"/>')
                n += run
    for j, (mark, label) in enumerate([("#", "active (produces a token)"), ("-", "waiting for a row"),
                                        (".", "finished, row still held by its static group")]):
        x = 10 + j * 200
        parts.append(f'<rect x="{x}" y="{height - 26}" width="12" height="12" fill="{COLOURS[mark]}"/>')
        parts.append(f'<text x="{x + 18}" y="{height - 16}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- command


def parse_lengths(text: str, flag: str, what: str = "length", cap: int | None = MAX_LENGTH,
                  usage: bool = True) -> list[int]:
    """The integers of `flag`'s list (2,5,8,4), each from 1 to `cap`.  A refusal is one line (a MinirtError, which
    argparse lets through), but for a non-integer or one below 1 with `usage`: argparse's usage, then a line."""
    error = argparse.ArgumentTypeError if usage else lambda message: MinirtError(f"{flag}: {message}")
    items = text.replace(" ", "").split(",")
    try:
        values = [int(v) for v in items if v]
    except ValueError:
        raise error(f"expected comma-separated integers like 2,5,8,4, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise error(f"every {what} must be an integer >= 1, got {text!r}")
    if "" in items:
        raise MinirtError(f"{flag}: {text!r} has an empty item (two commas in a row, or one at an end)")
    if cap is not None and max(values) > cap:
        raise MinirtError(f"{flag}: every {what} must be at most {cap}, got {max(values)}")
    return values


def build_parser(prog: str = "python -m minirt.rounds") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Static groups and continuous batching on the same requests, counted in rounds (no model needed).",
        epilog="""examples:
  python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3
  python -m minirt.rounds --lengths 2,5,8,4 --prompt-lengths 3,9,1,4 --batch-size 3 --json
  python -m minirt.rounds --workload 200 --seed 0 --batch-sizes 4,8,16 --svg rounds.svg

Marks in the grid: '#' active (the request produces a token), '-' waiting for a row,
'.' finished while its static group still runs.  The scheduler is the engine's own:
python -m minirt.generate --policy static|continuous runs real requests through it.""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--lengths", type=lambda text: parse_lengths(text, "--lengths"), metavar="L1,L2,...",
                        help=f"output length of each request (each at most {MAX_LENGTH})")
    source.add_argument("--workload", type=int, metavar="N", help=f"draw N long-tailed requests (N <= {MAX_WORKLOAD})")
    p.add_argument("--prompt-lengths", type=lambda text: parse_lengths(text, "--prompt-lengths"), metavar="P1,P2,...",
                   help=f"prompt length of each request (default 1; each at most {MAX_LENGTH})")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="rows (default 8)")
    p.add_argument("--batch-sizes", type=lambda text: parse_lengths(text, "--batch-sizes", "batch size", None, False),
                   default="4,8,16", metavar="B1,B2,...", help="workload: batch sizes to compare (default 4,8,16)")
    p.add_argument("--kv-budget", type=lambda text: parse_kv_budget(text, tokens_only=True)[1], default=UNLIMITED,
                   metavar="TOKENS", help="KV positions (tokens) the running requests may reserve (default: unlimited)")
    p.add_argument("--max-round-tokens", type=int, default=DEFAULT_ROUND_TOKENS, metavar="N",
                   help=f"continuous: tokens per round, a prefill counting its prompt (default {DEFAULT_ROUND_TOKENS})")
    p.add_argument("--json", action="store_true", help='print {"policies": {"static": {...}, "continuous": {...}}}')
    p.add_argument("--svg", metavar="FILE", help="also draw the round grids of both policies into an SVG file")
    add_version_flag(p)
    return p


def main(argv: list[str] | None = None, prog: str = "python -m minirt.rounds") -> int:
    args = build_parser(prog).parse_args(argv)  # then the numbers are checked: a bad one is one line and exit 2
    for flag in ("--batch-size", "--max-round-tokens"):
        require_at_least_one(getattr(args, flag[2:].replace("-", "_")), flag)
    if args.seed < 0:
        raise MinirtError(f"--seed must be an integer >= 0, got {args.seed}")
    report = report_lengths if args.lengths is not None else report_workload
    report(args, {"kv_budget": args.kv_budget, "round_tokens": args.max_round_tokens})
    return EXIT_OK


def report_lengths(args, budgets: dict) -> None:
    """--lengths: both policies on the given requests, as grids and tables (or JSON)."""
    sims = [simulate(args.lengths, policy, args.batch_size, args.prompt_lengths, **budgets) for policy in POLICIES]
    if args.svg:
        write_svg(args.svg, sims, f"{len(args.lengths)} requests, {args.batch_size} rows")
    if args.json:
        print(json.dumps({"policies": {s.policy: s.summary() for s in sims}}))
        return
    for sim in sims:  # each: its grid, a blank line, its table and its totals
        print(grid_text(sim), "", request_table(sim), f"total rounds {sim.total_rounds}, "
              f"utilization {sim.utilization:.1%}\n", sep="\n")
    print(comparison_table(sims))


def report_workload(args, budgets: dict) -> None:
    """--workload: a long-tailed draw, both policies at several batch sizes, as a table (or JSON)."""
    if not 1 <= args.workload <= MAX_WORKLOAD:
        raise MinirtError(f"--workload needs at least 1 request, got {args.workload}" if args.workload < 1
                          else f"--workload takes at most {MAX_WORKLOAD} requests, got {args.workload}")
    outputs, prompts = long_tailed_workload(args.workload, args.seed)
    results = {rows: [simulate(outputs, policy, rows, prompts, **budgets) for policy in POLICIES]
               for rows in args.batch_sizes}
    if args.svg:
        title = f"workload of {args.workload} requests (seed {args.seed}), {args.batch_sizes[0]} rows"
        write_svg(args.svg, results[args.batch_sizes[0]], title)
    if args.json:
        workload = {"n": args.workload, "seed": args.seed, "output_lens": outputs, "prompt_lens": prompts}
        print(json.dumps({"workload": workload, "batch_sizes": {
            str(rows): {"policies": {s.policy: s.summary() for s in sims}} for rows, sims in results.items()}}))
        return
    print(f"workload: {args.workload} requests (seed {args.seed}); output lengths {min(outputs)}-{max(outputs)}, "
          f"median {int(np.median(outputs))}; prompt lengths {min(prompts)}-{max(prompts)}, "
          f"median {int(np.median(prompts))}")
    print(f"{'batch':>5s} {'static rounds':>14s} {'static util':>12s} {'continuous rounds':>18s} "
          f"{'continuous util':>16s} {'rounds saved':>13s}")
    for rows, (static, continuous) in results.items():
        saved = 1 - continuous.total_rounds / static.total_rounds
        print(f"{rows:5d} {static.total_rounds:14d} {static.utilization:12.1%} {continuous.total_rounds:18d} "
              f"{continuous.utilization:16.1%} {saved:13.1%}")


def write_svg(path: str, sims: list[Simulation], title: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg_panels(sims, title))
    except OSError as exc:
        raise MinirtError(f"cannot write --svg {path} ({exc.strerror})") from None
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(run_command(main, prog="minirt.rounds"))
