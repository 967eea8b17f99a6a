"""What exact batch invariance costs: minirt with `batch_invariant=True` against minirt without, on
the same workloads, alternating in one process.

Workloads (fp32, greedy, every request forced to its full length):

  decode-b1, decode-b8, decode-b32
            1, 8 or 32 prompts of 16 tokens in one static group, 32 new tokens each: the time a
            decode round takes (the group's run less its prefill, over its 31 decode rounds)
  prefill-8x512
            8 prompts of 512 tokens, one token each: the prefill of one group

Both sides are loaded once (the weights are shared, read-only, from the mapped file), warmed on
the workload, then timed in turns, `--repeats` times each; the table gives each side's median
(min-max) and the ratio exact/default of the pairs run back to back, median (min-max), and whether
the sides' tokens agree (greedy: they should, but need not, bitwise: only exact mode promises that
a request's numbers do not depend on its batch).

By default the process runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (NumPy's OpenBLAS
picks its kernel, as on a user's machine); the machine and the kernel are printed first, and the
heights exact mode's probe chose.

    python tools/bench/invariance_cost.py                      # every workload, 5 repeats
    python tools/bench/invariance_cost.py --workloads decode-b8 --repeats 9
    python tools/bench/invariance_cost.py --blas-env keep      # under this machine's forced kernel

The random gpt2-124M is made once in --scratch (needs the `reference` extra: transformers writes it).
Other work on the machine skews every figure: run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))  # reference.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env

# name: (prompts, prompt length, new tokens)
WORKLOADS = {
    "decode-b1": (1, 16, 32),
    "decode-b8": (8, 16, 32),
    "decode-b32": (32, 16, 32),
    "prefill-8x512": (8, 512, 1),
}


def prompts_of(name: str, vocab_size: int, seed: int) -> list[list[int]]:
    n, length, _ = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=length).tolist() for _ in range(n)]


def timed_run(llm, prompts, new_tokens: int) -> tuple[float, list[list[int]]]:
    """Seconds a decode round took (the run less its prefill, over its decode rounds), or the
    prefill's seconds when there is no decode round; and the tokens."""
    from minirt import SamplingParams

    def run(tokens: int):
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return time.perf_counter() - start, [o.outputs[0].token_ids for o in outputs]

    if new_tokens == 1:
        return run(1)
    prefill, _ = run(1)
    whole, tokens = run(new_tokens)
    return (whole - prefill) / (new_tokens - 1), tokens


def measure(model_dir: str, workload: str, repeats: int, seed: int) -> dict:
    from minirt import LLM

    n, _length, new_tokens = WORKLOADS[workload]
    sides = {
        "default": LLM(model_dir, backend="numpy", batch_size=n),
        "exact": LLM(model_dir, backend="numpy", batch_size=n, batch_invariant=True),
    }
    prompts = prompts_of(workload, sides["default"].model.config.vocab_size, seed)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    tokens = {}
    for llm in sides.values():
        timed_run(llm, prompts, new_tokens)  # warm-up
    for repeat in range(repeats):
        # Alternate which side goes first.
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            took, tokens[side] = timed_run(sides[side], prompts, new_tokens)
            seconds[side].append(took)
    ratios = [e / d for e, d in zip(seconds["exact"], seconds["default"], strict=True)]
    return {
        "seconds": seconds,
        "ratios": ratios,
        "tokens_agree": tokens["exact"] == tokens["default"],
        "heights": sides["exact"].model.tiles.heights,
    }


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return (
        f"{statistics.median(values) * scale:.{digits}f} "
        f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Exact batch invariance against the default mode (see the docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/bench/invariance_cost.py\n"
        "  python tools/bench/invariance_cost.py --workloads decode-b8 --repeats 9",
    )
    parser.add_argument("--model", help="checkpoint folder (default: a random gpt2-124M)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/gpt2-124m-random"))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=5, help="timed runs a side (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    blas_env.add_blas_env_argument(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    blas_env.run_under(args.blas_env)
    if args.model is None:
        from reference import make_gpt2_124m

        args.model = str(make_gpt2_124m(args.scratch))
    print(blas_env.report(), flush=True)
    print(
        "\n| workload | default: ms | exact: ms | exact / default | tokens agree |"
        "\n|---|---|---|---|---|",
        flush=True,
    )
    heights = None
    for workload in args.workloads:
        result = measure(args.model, workload, args.repeats, args.seed)
        heights = result["heights"]
        what = "a decode round" if WORKLOADS[workload][2] > 1 else "the prefill"
        print(
            f"| {workload} ({what}) | {spread(result['seconds']['default'], 1e3, 1)} "
            f"| {spread(result['seconds']['exact'], 1e3, 1)} "
            f"| {spread(result['ratios'])}x | {'yes' if result['tokens_agree'] else 'no'} |",
            flush=True,
        )
    print(
        f"\nexact mode's weight products ran in calls of {heights} rows; "
        f"medians (min-max) of {args.repeats} alternating runs a side"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
