"""Speed of two checkouts of minirt side by side: generation and scoring, alternating fresh processes.

For a change that must not cost speed (a refactor), run the old and the new tree on the same model and
workload, each in fresh processes, alternating, and compare medians:

    git worktree add /tmp/base 46f5ce3
    python tools/fixtures/reference.py make-124m /tmp/gpt2-124m-random
    python tools/quality/compare_trees.py --trees /tmp/base . --model /tmp/gpt2-124m-random --runs 4

Each run: `LLM(model, batch_size=8).generate` on 8 random prompts of 9-29 tokens, 32 greedy tokens each
(after a short warm-up), then `model.logits` on 4 sequences of 256 tokens.  It prints each run, then for
each tree the median and range of both timings, the ratio to the first tree, and whether every run
produced the same tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ONE_RUN = r"""
import time
import numpy as np
import minirt
from minirt import LLM, SamplingParams
llm = LLM(MODEL, batch_size=8)
rng = np.random.default_rng(0)
vocab = llm.model.config.vocab_size
prompts = [rng.integers(0, vocab, n).tolist() for n in (9, 12, 15, 18, 21, 24, 27, 29)]
# Greedy and max_new_tokens: the same request in a tree before vLLM's names (#39) and after.
llm.generate(prompts[:2], SamplingParams(max_new_tokens=2, ignore_eos=True, temperature=0.0))  # warm up
start = time.perf_counter()
outs = llm.generate(prompts, SamplingParams(max_new_tokens=32, ignore_eos=True, temperature=0.0))
generate = time.perf_counter() - start
sequences = [rng.integers(0, vocab, 256).tolist() for _ in range(4)]
start = time.perf_counter()
llm.model.logits(sequences)
score = time.perf_counter() - start
# One output per prompt holding its completions (after #39), or one per request (before).
ids = [(o.outputs[0] if hasattr(o, "outputs") else o).token_ids for o in outs]
print(minirt.__file__, generate, score, hash(tuple(tuple(t) for t in ids)))
"""


def run_once(tree: Path, model: str) -> tuple[str, float, float, int]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", ONE_RUN.replace("MODEL", repr(model))],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    where, generate, score, tokens = out[0], float(out[1]), float(out[2]), int(out[3])
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: imported minirt from {where}, not from this tree")
    return where, generate, score, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, type=Path, required=True, metavar=("OLD", "NEW"))
    parser.add_argument(
        "--model",
        required=True,
        help="a model folder, e.g. from tools/fixtures/reference.py make-124m",
    )
    parser.add_argument("--runs", type=int, default=4, help="alternating runs per tree (default 4)")
    args = parser.parse_args(argv)
    results = {tree: [] for tree in args.trees}
    for i in range(args.runs):
        for tree in args.trees:  # alternate, so drift in the machine's speed hits both sides alike
            _, generate, score, tokens = run_once(tree, args.model)
            results[tree].append((generate, score, tokens))
            print(f"run {i + 1} {tree}: generate {generate:.3f} s, score {score:.3f} s", flush=True)
    first = args.trees[0]
    for tree, rows in results.items():
        gen, sco = [r[0] for r in rows], [r[1] for r in rows]
        ratio_gen = statistics.median(gen) / statistics.median([r[0] for r in results[first]])
        ratio_sco = statistics.median(sco) / statistics.median([r[1] for r in results[first]])
        print(
            f"{tree}: generate median {statistics.median(gen):.3f} s ({min(gen):.3f}-{max(gen):.3f}), "
            f"x{ratio_gen:.2f}; score median {statistics.median(sco):.3f} s ({min(sco):.3f}-{max(sco):.3f}), "
            f"x{ratio_sco:.2f}"
        )
    tokens = {r[2] for rows in results.values() for r in rows}
    print(f"tokens identical in every run: {len(tokens) == 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
