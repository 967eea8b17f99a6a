"""One process against 1 and 2 Ray workers, side by side: wall time of the whole command, and the records compared.

Each measurement is a fresh `python -m minirt.generate` process (model loads, and Ray's start for --ray runs,
included: what a user waits for), the configurations taking turns in every repeat.  The output records of each
run are checked against the one-process run: the same index, id, text, token_ids and finish_reason.

    python tools/bench/ray_bench.py --model /tmp/gpt2-124m-random --prompts 64 --max-new-tokens 32 --repeats 3

Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default (NumPy's OpenBLAS picks its kernel, as on a
user's machine; Ray's workers inherit the driver's environment); `--blas-env keep` keeps them as this machine sets
them (tools/bench/blas_env.py).  The kernel is printed above the table.

On a 2-core machine this cannot show scaling: one process already uses both cores for its matrix products,
and each worker gets one.  It shows what Ray costs (start, a model load per worker) beside what it buys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env  # noqa: E402 (after its folder is on the path)

CONFIGS = {
    "one process": [],
    "ray, 1 worker": ["--ray", "local", "--workers", "1"],
    "ray, 2 workers": ["--ray", "local", "--workers", "2"],
}
SAME = ("index", "id", "text", "token_ids", "finish_reason")


def write_prompts(path: Path, n: int) -> None:
    words = [
        "ROMEO:",
        "JULIET:",
        "To be, or not to be",
        "All the world's a stage",
        "Now is the winter of",
    ]
    path.write_text(
        "".join(json.dumps({"prompt": f"{words[i % len(words)]} {i}"}) + "\n" for i in range(n))
    )


def run(config: list[str], model: str, prompts: Path, out: Path, max_new_tokens: int) -> float:
    command = [
        sys.executable,
        "-m",
        "minirt.generate",
        "--model",
        model,
        "--prompts",
        str(prompts),
        "--output",
        str(out),
        "--max-new-tokens",
        str(max_new_tokens),
        "--ignore-eos",
        "--quiet",
        "--no-progress",
        *config,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tools/bench/ray_bench.py --model /tmp/gpt2-124m-random "
        "--prompts 64 --max-new-tokens 32 --repeats 3",
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=64, help="how many prompts (default 64)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    blas_env.add_blas_env_argument(parser)
    args = parser.parse_args()
    # Before anything is timed: every run (and its Ray workers) inherits the chosen BLAS environment.
    blas_env.run_under(args.blas_env)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        write_prompts(prompts, args.prompts)
        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        outputs: dict[str, list[dict]] = {}
        for repeat in range(args.repeats):
            order = (
                list(CONFIGS) if repeat % 2 == 0 else list(CONFIGS)[::-1]
            )  # alternate who goes first
            for name in order:
                out = Path(tmp) / f"{name.replace(' ', '_').replace(',', '')}.jsonl"
                times[name].append(
                    run(CONFIGS[name], args.model, prompts, out, args.max_new_tokens)
                )
                outputs[name] = [json.loads(line) for line in out.read_text().splitlines()]
                print(
                    f"  repeat {repeat + 1}: {name:15s} {times[name][-1]:7.2f} s", file=sys.stderr
                )
    base = outputs["one process"]
    tokens = sum(len(r["token_ids"]) for r in base)
    print(
        f"{args.prompts} prompts x {args.max_new_tokens} new tokens ({tokens} tokens), model {args.model}, "
        f"{args.repeats} repeats"
    )
    # Ray's workers inherit the kernel; their threads are their CPUs' (ray_data.worker_env: 1 each).
    print(f"each run's {blas_env.report()}; each Ray worker: the same kernel, 1 thread")
    print("| run | wall s, median (min-max) | tokens/s | vs one process | records equal |")
    print("|---|---|---|---|---|")
    single = statistics.median(times["one process"])
    for name, values in times.items():
        median = statistics.median(values)
        equal = [{k: r[k] for k in SAME} for r in outputs[name]] == [
            {k: r[k] for k in SAME} for r in base
        ]
        print(
            f"| {name} | {median:.2f} ({min(values):.2f}-{max(values):.2f}) | {tokens / median:.0f} | "
            f"{single / median:.2f}x | {'yes' if equal else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
