"""The prefix cache measured: minirt with it against minirt without it (and transformers' `generate`
beside them), each run in a fresh process, alternating.

Workloads (fp32, greedy, every request forced to its full length: ignore_eos for minirt, min_new_tokens
for transformers):

  shared-512  64 requests sharing one 512-token prefix, each with its own suffix of 16-48 tokens, 32 new
              tokens each, batch 8 (the issue's workload: a system prompt or a document asked about many
              times)
  short-b1, short-b8, long-b8, score-8x1024
              tools/bench/bench.py's workloads, which share no prefix: what the cache costs when it finds
              nothing (score-8x1024 goes through `model.logits`, which the cache never touches: a control)

Sides: `cache` (minirt, LLM(prefix_cache=True)), `nocache` (LLM(), the cache off, its default) and
`transformers` (GPT2LMHeadModel.generate in left-padded batches of 8, on shared-512 only; needs the
`reference` extra).  Each measurement is a fresh process (`--child SIDE WORKLOAD`) that loads the model,
warms up on a small piece of the workload (with prompts of its own, so that the cache side starts
empty), and times the workload once.  The parent alternates the sides `--repeats` times and prints each
side's median rate (min-max) and the ratio cache/nocache with its range over the pairs run back to back,
and whether the tokens of the sides are equal.

By default every timed process runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (NumPy's OpenBLAS
picks its kernel, as on a user's machine); the kernel threadpoolctl reports is printed below the table.

    python tools/bench/prefix_bench.py                                   # shared-512, 3 repeats
    python tools/bench/prefix_bench.py --workloads short-b1 short-b8 long-b8 score-8x1024 --sides cache nocache
    python tools/bench/prefix_bench.py --policy continuous

Other work on the machine skews every figure: run it alone (or under `flock /tmp/bench.lock`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))  # reference.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py, bench.py

import blas_env
import bench

SHARED = "shared-512"
WORKLOADS = [SHARED, "short-b1", "short-b8", "long-b8", "score-8x1024"]
SIDES = ("cache", "nocache", "transformers")


def shared_prompts(vocab_size: int, seed: int) -> list[list[int]]:
    """64 prompts: one 512-token prefix, then each its own 16-48 tokens."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab_size, size=512).tolist()
    return [
        prefix + rng.integers(0, vocab_size, size=int(rng.integers(16, 49))).tolist()
        for _ in range(64)
    ]


def workload(name: str, vocab_size: int, seed: int) -> tuple[list[list[int]], int, int]:
    """(prompts, new tokens, batch size)."""
    if name == SHARED:
        return shared_prompts(vocab_size, seed), 32, 8
    _, _, new_tokens, batch_size = bench.WORKLOADS[name]
    return bench.workload_prompts(name, vocab_size, seed), new_tokens, batch_size


def minirt_side(model_dir: str, batch_size: int, prefix_cache: bool, policy: str):
    from minirt import LLM, SamplingParams

    llm = LLM(
        model_dir, backend="numpy", batch_size=batch_size, prefix_cache=prefix_cache, policy=policy
    )

    def generate(prompts, new_tokens):
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
        outputs = [out.outputs[0] for out in llm.generate(prompts, params)]
        assert all(len(o.token_ids) == new_tokens for o in outputs)
        return [o.token_ids for o in outputs], sum(o.cached_prompt_tokens for o in outputs)

    def score(sequences):
        return llm.model.logits(sequences)

    return generate, score


def transformers_side(model_dir: str, batch_size: int):
    generate, score = bench.transformers_side(model_dir, "float32", batch_size)

    def generate_counted(prompts, new_tokens):
        return generate(prompts, new_tokens), 0

    return generate_counted, score


def child(side: str, name: str, args) -> dict:
    from minirt import load_checkpoint

    vocab_size = load_checkpoint(args.model).config.vocab_size
    prompts, new_tokens, batch_size = workload(name, vocab_size, args.seed)
    if side == "transformers":
        generate, score = transformers_side(args.model, batch_size)
    else:
        generate, score = minirt_side(args.model, batch_size, side == "cache", args.policy)
    # Warm-up on prompts of its own (another seed), so that nothing of the workload is cached yet.
    warm = workload(name, vocab_size, args.seed + 1000)[0]
    result: dict = {}
    if name.startswith("score"):
        score([p[:16] for p in warm[:2]])
        start = time.perf_counter()
        logits = score(prompts)
        seconds = time.perf_counter() - start
        result["tokens"] = logits.argmax(-1).tolist()
        result["rate"] = sum(map(len, prompts)) / seconds
        result["cached"] = 0
    else:
        generate([p[:40] for p in warm[:1]], 2)
        start = time.perf_counter()
        tokens, cached = generate(prompts, new_tokens)
        seconds = time.perf_counter() - start
        result["tokens"] = tokens
        result["cached"] = cached
        result["rate"] = len(prompts) * new_tokens / seconds
    result["seconds"] = seconds
    result["blas"] = blas_env.report()
    return result


def run_child(side: str, name: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        side,
        name,
        "--model",
        args.model,
        "--seed",
        str(args.seed),
        "--policy",
        args.policy,
        "--blas-env",
        args.blas_env,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(
            f"prefix_bench: the {side} child for {name} failed:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def table(args) -> None:
    print(
        f"model {args.model}, float32, {args.policy} policy; {args.repeats} alternating runs per side, each in a "
        "fresh process; rates are generated (or, for score, scored) tokens/s, medians (min-max)"
    )
    print(
        "| workload | "
        + " | ".join(f"{side} tok/s" for side in args.sides)
        + " | cache/nocache (pair range) | "
        "prompt tokens cached | same tokens |"
    )
    print("|---|" + "---|" * len(args.sides) + "---|---|---|")
    blas_lines: set[str] = set()
    for name in args.workloads:
        sides = [side for side in args.sides if side != "transformers" or name == SHARED]
        results: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(args.repeats):
            for side in sides:
                results[side].append(run_child(side, name, args))
        for runs in results.values():
            blas_lines.update(r["blas"] for r in runs)
        rates = [
            spread([r["rate"] for r in results[side]]) if side in results else "-"
            for side in args.sides
        ]
        ratio = "-"
        if "cache" in results and "nocache" in results:
            pairs = [
                a["rate"] / b["rate"]
                for a, b in zip(results["cache"], results["nocache"], strict=True)
            ]
            median = statistics.median(r["rate"] for r in results["cache"]) / statistics.median(
                r["rate"] for r in results["nocache"]
            )
            ratio = f"**{median:.2f}x** ({min(pairs):.2f}-{max(pairs):.2f})"
        cached = results["cache"][-1]["cached"] if "cache" in results else 0
        reference = results[sides[0]][-1]["tokens"]
        same = []
        for side in sides[1:]:
            equal = sum(x == y for x, y in zip(results[side][-1]["tokens"], reference, strict=True))
            same.append(f"{side} {equal}/{len(reference)}")
        print(
            f"| {name} | "
            + " | ".join(rates)
            + f" | {ratio} | {cached} | {', '.join(same)} (vs {sides[0]}) |",
            flush=True,
        )
    print("\nthe timed processes' " + " | ".join(sorted(blas_lines)))


def main() -> int:
    parser = argparse.ArgumentParser(
        description="The prefix cache: minirt with it against without it (and transformers), fresh processes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/bench/prefix_bench.py\n"
        "  python tools/bench/prefix_bench.py --workloads short-b1 short-b8 long-b8 score-8x1024 "
        "--sides cache nocache",
    )
    parser.add_argument(
        "--model", help="checkpoint folder (default: a random gpt2-124M in --scratch)"
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/gpt2-124m-random"))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=[SHARED])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--policy", choices=("static", "continuous"), default="static")
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternating runs per side (default 3)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one child may run")
    blas_env.add_blas_env_argument(parser)
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    blas_env.run_under(args.blas_env)
    if args.model is None:
        from reference import make_gpt2_124m

        args.model = str(make_gpt2_124m(args.scratch))
    if args.child:
        print(json.dumps(child(*args.child, args)))
        return 0
    table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
