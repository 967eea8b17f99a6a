"""`python -m minirt.rounds`: static groups beside continuous batching, counted in rounds, without a
model.

Owns: the command: its flags, and its reports of given lengths (grids, tables, JSON) or of a
long-tailed workload at several batch sizes, and the SVG file.  The simulation is
minirt/cli/simulation.py.

    python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3
    python -m minirt.rounds --workload 200 --seed 0 --batch-sizes 4,8,16 --svg rounds.svg

Must not know: models, arrays or text.
"""

from __future__ import annotations

import argparse
import json
import sys
import numpy as np

from .cli.command import EXIT_OK, add_version_flag, parse_command_line, run_command
from .cli.plural import plural
from .cli.kv_budget import parse_kv_budget
from .cli.round_tables import comparison_table, grid_text, request_table
from .cli.simulation import Simulation, UNLIMITED, long_tailed_workload, simulate
from .cli.svg import svg_panels
from .engine.engine import DEFAULT_ROUND_TOKENS
from .engine.scheduler import POLICIES
from .errors import MinirtError, require_at_least_one

# Its output is a report: a reader that stops early (`| head`) ends it without a word.
REPORT = True


# The longest output or prompt length simulated: a request of it takes seconds.
MAX_LENGTH = 1_000_000

# The most --workload requests: the simulation holds every one of them.
MAX_WORKLOAD = 10_000


def parse_lengths(
    text: str, flag: str, what: str = "length", cap: int | None = MAX_LENGTH, usage: bool = True
) -> list[int]:
    """The integers of `flag`'s list (2,5,8,4), each from 1 to `cap`.  A refusal is one line (a
    MinirtError, which argparse lets through), but for a non-integer or one below 1 with `usage`:
    argparse's usage, then a line."""

    def error(message: str) -> Exception:
        if usage:
            return argparse.ArgumentTypeError(message)
        return MinirtError(f"{flag}: {message}")

    # A space beside a comma is fine; one inside a number is not (2 5 is not 25).
    items = [item.strip() for item in text.split(",")]
    try:
        values = [int(v) for v in items if v]
    except ValueError:
        raise error(f"expected comma-separated integers like 2,5,8,4, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise error(f"every {what} must be an integer >= 1, got {text!r}")
    if "" in items:
        raise MinirtError(
            f"{flag}: {text!r} has an empty item (two commas in a row, or one at an end)"
        )
    if cap is not None and max(values) > cap:
        raise MinirtError(f"{flag}: every {what} must be at most {cap}, got {max(values)}")
    return values


EPILOG = """examples:
  python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3
  python -m minirt.rounds --lengths 2,5,8,4 --prompt-lengths 3,9,1,4 --batch-size 3 --json
  python -m minirt.rounds --workload 200 --seed 0 --batch-sizes 4,8,16 --svg rounds.svg
  python -m minirt.rounds --lengths 4,4,4,4 --prompt-lengths 40,40,40,40 --shared-prefix 32 \\
      --prefix-cache --batch-size 2 --max-round-tokens 24

Marks in the grid: '#' active (the request produces a token), '~' fed a chunk of its prompt
(no token yet), '-' waiting for a row, '.' finished while its static group still runs.  The
table's "cached" column is the prompt tokens the prefix cache gave (no round computed them).
The scheduler is the engine's own: python -m minirt.generate --policy static|continuous runs
real requests through it."""


def build_parser(prog: str = "python -m minirt.rounds") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Static groups and continuous batching on the same requests, counted in rounds "
        "(no model needed).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_request_flags(p)
    add_run_flags(p)
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"policies": {"static": {...}, "continuous": {...}}}',
    )
    p.add_argument(
        "--svg", metavar="FILE", help="also draw the round grids of both policies into an SVG file"
    )
    add_version_flag(p)
    return p


def add_request_flags(p) -> None:
    """The requests: their lengths, or a long-tailed workload."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths",
        type=lambda text: parse_lengths(text, "--lengths"),
        metavar="L1,L2,...",
        help=f"output length of each request (each at most {MAX_LENGTH})",
    )
    source.add_argument(
        "--workload",
        type=int,
        metavar="N",
        help=f"draw N long-tailed requests (N <= {MAX_WORKLOAD})",
    )
    p.add_argument(
        "--prompt-lengths",
        type=lambda text: parse_lengths(text, "--prompt-lengths"),
        metavar="P1,P2,...",
        help=f"prompt length of each request (default 1; each at most {MAX_LENGTH})",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")


def add_run_flags(p) -> None:
    """The rows, and the budgets of a round and of the KV cache."""
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="rows (default 8)")
    p.add_argument(
        "--batch-sizes",
        type=lambda text: parse_lengths(text, "--batch-sizes", "batch size", None, False),
        default="4,8,16",
        metavar="B1,B2,...",
        help="workload: batch sizes to compare (default 4,8,16)",
    )
    p.add_argument(
        "--kv-budget",
        type=lambda text: parse_kv_budget(text, tokens_only=True)[1],
        default=UNLIMITED,
        metavar="TOKENS",
        help="KV positions (tokens) the running requests may reserve (default: unlimited)",
    )
    p.add_argument(
        "--max-round-tokens",
        type=int,
        default=DEFAULT_ROUND_TOKENS,
        metavar="N",
        help="continuous: tokens per round, decode rows first, a prompt counting the tokens it "
        f"feeds (default {DEFAULT_ROUND_TOKENS})",
    )
    p.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_false",
        help="continuous: feed each prompt whole in one round (one over --max-round-tokens can "
        "never run) instead of in chunks over several",
    )
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        metavar="N",
        help="every prompt starts with the same N tokens (the rest are its own), which "
        "--prefix-cache, in blocks of 16, gives to requests admitted after the first has "
        "prefilled them (default 0)",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="simulate the prefix cache (off by default, as in generate and serve)",
    )


def main(argv: list[str] | None = None, prog: str = "python -m minirt.rounds") -> int:
    args = parse_command_line(build_parser(prog), argv)
    # Then the numbers are checked: a bad one is one line and exit 2.
    for flag in ("--batch-size", "--max-round-tokens"):
        require_at_least_one(getattr(args, flag[2:].replace("-", "_")), flag)
    if args.seed < 0:
        raise MinirtError(f"--seed must be an integer >= 0, got {args.seed}")
    # An empty name (an unset shell variable) is no file, and not --svg left out either.
    if args.svg == "":
        raise MinirtError(
            "--svg is empty; give a file for the drawing (rounds.svg), or leave --svg out"
        )
    report = report_lengths if args.lengths is not None else report_workload
    settings = {
        "kv_budget": args.kv_budget,
        "round_tokens": args.max_round_tokens,
        "chunked_prefill": args.chunked_prefill,
        "shared_prefix": args.shared_prefix,
        "prefix_cache": args.prefix_cache,
    }
    if args.shared_prefix < 0:
        raise MinirtError(f"--shared-prefix must be an integer >= 0, got {args.shared_prefix}")
    report(args, settings)
    return EXIT_OK


def report_lengths(args, budgets: dict) -> None:
    """--lengths: both policies on the given requests, as grids and tables (or JSON)."""
    sims = [
        simulate(args.lengths, policy, args.batch_size, args.prompt_lengths, **budgets)
        for policy in POLICIES
    ]
    if args.svg is not None:
        title = f"{plural(len(args.lengths), 'request')}, {plural(args.batch_size, 'row')}"
        write_svg(args.svg, sims, title)
    if args.json:
        print(json.dumps({"policies": {s.policy: s.summary() for s in sims}}))
        return
    # Each: its grid, a blank line, its table and its totals.
    for sim in sims:
        print(
            grid_text(sim),
            "",
            request_table(sim),
            f"total rounds {sim.total_rounds}, utilization {sim.utilization:.1%}\n",
            sep="\n",
        )
    print(comparison_table(sims))


def report_workload(args, budgets: dict) -> None:
    """--workload: a long-tailed draw, both policies at several batch sizes, as a table (or
    JSON)."""
    if args.workload < 1:
        raise MinirtError(f"--workload needs at least 1 request, got {args.workload}")
    if args.workload > MAX_WORKLOAD:
        raise MinirtError(f"--workload takes at most {MAX_WORKLOAD} requests, got {args.workload}")
    outputs, prompts = long_tailed_workload(args.workload, args.seed)
    results = {
        rows: [simulate(outputs, policy, rows, prompts, **budgets) for policy in POLICIES]
        for rows in args.batch_sizes
    }
    if args.svg is not None:
        title = (
            f"workload of {plural(args.workload, 'request')} (seed {args.seed}), "
            f"{plural(args.batch_sizes[0], 'row')}"
        )
        write_svg(args.svg, results[args.batch_sizes[0]], title)
    if args.json:
        workload = {
            "n": args.workload,
            "seed": args.seed,
            "output_lens": outputs,
            "prompt_lens": prompts,
        }
        batch_sizes = {
            str(rows): {"policies": {s.policy: s.summary() for s in sims}}
            for rows, sims in results.items()
        }
        print(json.dumps({"workload": workload, "batch_sizes": batch_sizes}))
        return
    print_workload_table(args, outputs, prompts, results)


def print_workload_table(
    args, outputs: list[int], prompts: list[int], results: dict[int, list[Simulation]]
) -> None:
    """The workload's lengths, then a line per batch size: both policies' rounds and utilization."""
    print(
        f"workload: {plural(args.workload, 'request')} (seed {args.seed}); "
        f"output lengths {min(outputs)}-{max(outputs)}, "
        f"median {int(np.median(outputs))}; prompt lengths {min(prompts)}-{max(prompts)}, "
        f"median {int(np.median(prompts))}"
    )
    print(
        f"{'batch':>5s} {'static rounds':>14s} {'static util':>12s} {'continuous rounds':>18s} "
        f"{'continuous util':>16s} {'rounds saved':>13s}"
    )
    for rows, (static, continuous) in results.items():
        saved = 1 - continuous.total_rounds / static.total_rounds
        print(
            f"{rows:5d} {static.total_rounds:14d} {static.utilization:12.1%} "
            f"{continuous.total_rounds:18d} {continuous.utilization:16.1%} {saved:13.1%}"
        )


def write_svg(path: str, sims: list[Simulation], title: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg_panels(sims, title))
    except OSError as exc:
        raise MinirtError(f"cannot write --svg {path} ({exc.strerror})") from None
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(run_command(main, prog="minirt.rounds", quiet_when_cut=REPORT))
