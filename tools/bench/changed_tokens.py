"""How often batching changes a request's result: each request served alone, then in batches, and
its logits and tokens compared, in the default mode and in exact mode (`batch_invariant=True`).

The requests (300 by default) are seeded and sampled, as users send them: prompts cut from the
shipped model's validation text (16-160 characters), temperature 1.0 or 1.5, top-p 0.9 on half of
them, presence, frequency or repetition penalties on a third, 32-64 new tokens, each its own seed.
Every request is first served alone (a batch of one); then all of them together, under each
batching:

  static-8, static-32     static groups of 8 and of 32
  continuous-8            continuous batching, 8 rows
  continuous-16-chunked   continuous, 16 rows, at most 32 tokens a round (prompts in chunks)
  prefix-cache            continuous, 8 rows, the prefix cache on

For each the table gives how many decode-time logit vectors are bitwise those of the solo run, and
how many requests got other tokens.  A request's logits are read where the engine hands them to
the sampler.  The figures depend on the BLAS kernel and the machine (they count last-bit
differences); the kernel is printed first.

    python tools/bench/changed_tokens.py                     # 300 requests, both modes
    python tools/bench/changed_tokens.py --modes default --requests 1000
    python tools/bench/changed_tokens.py --blas-env keep     # under this machine's forced kernel
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env

BATCHINGS = {
    "static-8": {"policy": "static", "batch_size": 8},
    "static-32": {"policy": "static", "batch_size": 32},
    "continuous-8": {"policy": "continuous", "batch_size": 8},
    "continuous-16-chunked": {"policy": "continuous", "batch_size": 16, "round_token_budget": 32},
    "prefix-cache": {"policy": "continuous", "batch_size": 8, "prefix_cache": True},
}


def requests_of(text: str, n: int, seed: int):
    """n (prompt, SamplingParams) pairs, seeded and sampled (see the docstring)."""
    from minirt import SamplingParams

    rng = np.random.default_rng(seed)
    made = []
    for i in range(n):
        length = int(rng.integers(16, 161))
        start = int(rng.integers(0, len(text) - length))
        options = {
            "max_tokens": int(rng.integers(32, 65)),
            "temperature": float(rng.choice([1.0, 1.5])),
            "seed": 1000 + i,
            "ignore_eos": True,
        }
        if rng.random() < 0.5:
            options["top_p"] = 0.9
        penalty = rng.integers(0, 6)
        if penalty == 0:
            options["presence_penalty"] = 0.5
        elif penalty == 1:
            options["frequency_penalty"] = 0.5
        elif penalty == 2:
            options["repetition_penalty"] = 1.2
        made.append((text[start : start + length], SamplingParams(**options)))
    return made


@contextmanager
def logits_seen():
    """{request index: [each token's logits, as bytes]} while the block runs."""
    from minirt.engine.runner import ModelRunner

    seen: dict[int, list[bytes]] = {}
    original = ModelRunner.pick_tokens

    def pick_tokens(self, active, logits, round_number):
        producing = [request for request in active if request.prompt_done]
        host = self.model.backend.to_numpy(logits)
        for request, row in zip(producing, host, strict=True):
            seen.setdefault(request.index, []).append(row.tobytes())
        return original(self, active, logits, round_number)

    ModelRunner.pick_tokens = pick_tokens
    try:
        yield seen
    finally:
        ModelRunner.pick_tokens = original


def served(llm, requests, indices) -> tuple[dict[int, list[bytes]], dict[int, list[int]]]:
    """Each request's logits and tokens, served by `llm` as one run; `indices` are their places
    in the whole set (a request's index seeds nothing: each has its own seed)."""
    made = [
        llm.make_request(index, prompt, params)
        for index, (prompt, params) in zip(indices, requests, strict=True)
    ]
    with logits_seen() as seen:
        llm.run(made)
    failed = [request.error for request in made if request.error is not None]
    if failed:
        raise SystemExit(f"changed_tokens: a request failed: {failed[0]}")
    return seen, {request.index: list(request.token_ids) for request in made}


def compare(solo, together) -> tuple[int, int, int]:
    """(logit vectors bitwise equal, logit vectors, requests whose tokens differ) of a batched run
    against the solo runs: solo and together are each ({index: logits}, {index: tokens})."""
    solo_logits, solo_tokens = solo
    logits, tokens = together
    equal = sum(
        mine == theirs
        for index in solo_logits
        for mine, theirs in zip(logits[index], solo_logits[index], strict=False)
    )
    vectors = sum(len(vectors) for vectors in solo_logits.values())
    changed = sum(tokens[index] != solo_tokens[index] for index in solo_tokens)
    return equal, vectors, changed


def measure(model: str, requests, mode: str) -> list[tuple[str, int, int, int]]:
    from minirt import LLM

    exact = mode == "exact"
    indices = list(range(len(requests)))
    solo_llm = LLM(model, backend="numpy", batch_size=1, batch_invariant=exact)
    solo_logits: dict[int, list[bytes]] = {}
    solo_tokens: dict[int, list[int]] = {}
    for index, request in zip(indices, requests, strict=True):
        logits, tokens = served(solo_llm, [request], [index])
        solo_logits.update(logits)
        solo_tokens.update(tokens)
    rows = []
    for name, settings in BATCHINGS.items():
        llm = LLM(model, backend="numpy", batch_invariant=exact, **settings)
        together = served(llm, requests, indices)
        rows.append((name, *compare((solo_logits, solo_tokens), together)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description="How often batching changes a request's result (see the docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/bench/changed_tokens.py\n"
        "  python tools/bench/changed_tokens.py --modes default --requests 1000",
    )
    parser.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--requests", type=int, default=300, help="requests (default 300)")
    parser.add_argument(
        "--modes", nargs="+", choices=("default", "exact"), default=["default", "exact"]
    )
    parser.add_argument("--seed", type=int, default=0)
    blas_env.add_blas_env_argument(parser)
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    blas_env.run_under(args.blas_env)
    from minirt.loading.checkpoint import shipped_model_folder

    model = args.model or str(shipped_model_folder())
    text = (Path(shipped_model_folder()) / "validation.txt").read_text(encoding="utf-8")
    requests = requests_of(text, args.requests, args.seed)
    print(blas_env.report(), flush=True)
    print(
        "\n| mode | batching | logit vectors bitwise equal to solo | requests with other tokens |"
        "\n|---|---|---|---|",
        flush=True,
    )
    for mode in args.modes:
        start = time.perf_counter()
        for name, equal, vectors, changed in measure(model, requests, mode):
            print(
                f"| {mode} | {name} | {equal} of {vectors} ({equal / vectors:.1%}) "
                f"| {changed} of {len(requests)} ({changed / len(requests):.1%}) |",
                flush=True,
            )
        print(f"({mode} mode: {time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
