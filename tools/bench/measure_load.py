"""Load time and peak memory: minirt.load_model beside transformers' from_pretrained, in one run.

Each measurement runs in its own fresh Python process (so neither inherits the
other's memory), in alternation, `--repeats` times; the table reports medians.
For each side it records:

    import_s      time to import the library
    load_s        time to load the checkpoint into a model object
    first_s       time for a first forward pass on 32 tokens (this is when
                  memory-mapped weights are actually read from disk)
    rss_import    resident memory after the imports (MiB)
    peak_load     peak resident memory after loading (MiB)
    peak_first    peak resident memory after the first forward pass (MiB)

Peak RSS is the process's own high-water mark (VmHWM in /proc/self/status).  Memory-mapped pages of the weights file
count toward RSS once touched, like any other page, so `peak_first` is the
fair number to compare.

The BLAS kernel: every child runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default, so that
NumPy's OpenBLAS picks its kernel as on a user's machine; `--blas-env keep` keeps them as this machine
sets them (tools/bench/blas_env.py).  The kernel is printed above the table.

Usage (needs the `reference` extra):

    python tools/bench/measure_load.py --make /tmp/gpt2-124m-random   # writes a random 124M checkpoint once
    python tools/bench/measure_load.py --model /tmp/gpt2-124m-random --repeats 3
    python tools/bench/measure_load.py --model gpt2                    # a real one from the local HF cache
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env

CHILD_TEMPLATE = r"""
import json, resource, sys, time

def peak_rss_mib():
    # VmHWM: this process's own peak RSS.  ru_maxrss would also count the parent's
    # RSS at fork time on Linux, which is wrong for a fresh child.
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
rss_import = peak_rss_mib()
{load}
t2 = time.perf_counter()
peak_load = peak_rss_mib()
{forward}
t3 = time.perf_counter()
peak_first = peak_rss_mib()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "first_s": t3 - t2,
                  "rss_import": rss_import, "peak_load": peak_load, "peak_first": peak_first}}))
"""

MINIRT_CHILD = CHILD_TEMPLATE.format(
    imports="import numpy as np\nimport minirt",
    load="model = minirt.load_model(sys.argv[1])",
    forward="model.logits([list(range(32))])",
)
TRANSFORMERS_CHILD = CHILD_TEMPLATE.format(
    imports="import torch\nfrom transformers import GPT2LMHeadModel\n"
    "from transformers.utils import logging\nlogging.set_verbosity_error()",
    load="model = GPT2LMHeadModel.from_pretrained(sys.argv[1], local_files_only=True).eval()",
    forward="with torch.no_grad():\n    model(torch.arange(32)[None])",
)


def make_checkpoint(folder: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
    from reference import make_gpt2_124m

    make_gpt2_124m(folder)
    print(
        f"checkpoint {folder} ({sum(p.stat().st_size for p in folder.iterdir()) / 2**20:.0f} MiB)"
    )


def run_child(code: str, model: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", code, model], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"measurement failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Load time and peak RSS: minirt vs transformers from_pretrained.",
        epilog="example: python tools/bench/measure_load.py --model /tmp/gpt2-124m-random --repeats 3",
    )
    parser.add_argument("--model", help="checkpoint folder or hub id in the local HF cache")
    parser.add_argument(
        "--make", type=Path, metavar="FOLDER", help="write a random gpt2-124M checkpoint here first"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per side, alternating (default 3)"
    )
    blas_env.add_blas_env_argument(parser)
    args = parser.parse_args()
    # Before anything is timed: every child inherits the chosen BLAS environment.
    blas_env.run_under(args.blas_env)
    if args.make:
        make_checkpoint(args.make)
        args.model = args.model or str(args.make)
    if not args.model:
        parser.error("give --model (or --make)")

    runs = {"minirt": [], "transformers": []}
    for _ in range(args.repeats):
        runs["minirt"].append(run_child(MINIRT_CHILD, args.model))
        runs["transformers"].append(run_child(TRANSFORMERS_CHILD, args.model))
    keys = ["import_s", "load_s", "first_s", "rss_import", "peak_load", "peak_first"]
    median = {
        side: {k: statistics.median(r[k] for r in rs) for k in keys} for side, rs in runs.items()
    }
    print(
        f"model: {args.model}   (median of {args.repeats} alternating runs, each in a fresh process)"
    )
    print(f"the children's {blas_env.report()}")
    print(
        f"{'':14s}{'import s':>10s}{'load s':>10s}{'1st fwd s':>11s}"
        f"{'RSS import':>12s}{'peak load':>11s}{'peak 1st':>10s}   (MiB)"
    )
    for side in runs:
        m = median[side]
        print(
            f"{side:14s}{m['import_s']:10.3f}{m['load_s']:10.3f}{m['first_s']:11.3f}{m['rss_import']:12.0f}{m['peak_load']:11.0f}{m['peak_first']:10.0f}"
        )
    a, b = median["minirt"], median["transformers"]
    print(
        f"ratios (transformers / minirt): load time {b['load_s'] / a['load_s']:.1f}x, "
        f"load + first forward {(b['load_s'] + b['first_s']) / (a['load_s'] + a['first_s']):.1f}x, "
        f"peak RSS after first forward {b['peak_first'] / a['peak_first']:.2f}x, "
        "peak RSS above the imports "
        f"{(b['peak_first'] - b['rss_import']) / (a['peak_first'] - a['rss_import']):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
