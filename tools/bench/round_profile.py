"""Where a generate run's time goes, operation by operation, on this machine.

One minirt process serves one of bench.py's workloads (`short-b8`: 8 prompts of 8-32 tokens, 32 new
tokens each, one static group; `long-b8`: 8 prompts of 600-950 tokens) through `LLM.generate`, with every
layer operation of the model timed in-process: the weight products of the blocks (`linear`: the QKV,
attention-output and both MLP projections), GELU, the layer norms, attention (`attend`: the KV writes
and the softmax over the keys) and the head (`lm_head`). What the whole run took beyond them is the
rest: the Batch metadata, sampling, the engine and the scheduler. Each kind gets its share of the run,
its calls and its time a call, the decode rounds apart from the prefill.

Beside the weight products it times the same products alone, on the same shapes and the same weights,
each repeated on hot weights (the first call of a repeat reads them from memory, the others from cache):
so a call that takes much longer inside the run than alone is paying for something besides the product
(weights streamed from memory, fresh temporaries, page faults, the BLAS's thread hand-off). Two more
columns tell those apart: the minor page faults a call (getrusage's ru_minflt around it: a fresh
temporary the allocator had to map, touched page by page, which a lazily backed VM makes dear), and for
the weight products and the head the rate their weights went through the call (the weight's bytes over
the time a call): a rate near the machine's memory bandwidth says the call waits on weights streaming
from memory, not on the product.

The machine and the BLAS kernel are printed first (blas_env.report()); by default OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE are unset, as on a user's machine (`--blas-env keep`: as this machine sets them).

    python tools/bench/round_profile.py                          # short-b8 on a random gpt2-124M
    python tools/bench/round_profile.py --workload long-b8
    python tools/bench/round_profile.py --model /path/to/folder --repeats 3

The random gpt2-124M is made once in --scratch (needs the `reference` extra: transformers writes it).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))  # reference.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py, bench.py

import blas_env
from bench import WORKLOADS, workload_prompts

# The model's operations timed, each in the module namespaces that call it.
TIMED = {
    "linear": ("gpt2", "layers"),
    "gelu": ("layers",),
    "layer_norm": ("gpt2",),
    "attend": ("gpt2",),
    "lm_head": ("decoder",),
}


class Clock:
    """Seconds and calls per (operation, phase), and the products `linear` was asked for: (rows, in,
    out) and the weight's id, so that they can be timed alone afterwards."""

    def __init__(self):
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.page_faults: dict[tuple[str, str], int] = defaultdict(int)
        self.weight_bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.phase = "prefill"
        self.products: dict[tuple[str, tuple[int, int, int]], object] = {}

    def wrap(self, name, function):
        def timed(*args, **kwargs):
            faults_before = minor_page_faults()
            start = time.perf_counter()
            result = function(*args, **kwargs)
            seconds = time.perf_counter() - start
            key = (name, self.phase)
            self.seconds[key] += seconds
            self.page_faults[key] += minor_page_faults() - faults_before
            self.calls[key] += 1
            if name == "linear":
                x, fc = args[0], args[1]
                self.products.setdefault((self.phase, (x.shape[0], *fc.weight.shape)), fc)
                self.weight_bytes[key] += fc.weight.nbytes
            elif name == "lm_head":
                self.weight_bytes[key] += args[2].nbytes  # lm_head(xp, hidden, head_weight)
            return result

        return timed


def minor_page_faults() -> int:
    """This process's minor page faults so far: pages the kernel mapped on first touch."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def install(clock: Clock):
    """Every timed operation replaced by its clocked wrapper; returns how to put them back."""
    from minirt.model import decoder, gpt2, layers

    modules = {"gpt2": gpt2, "layers": layers, "decoder": decoder}
    originals = []
    for name, where in TIMED.items():
        original = getattr(layers, name)
        timed = clock.wrap(name, original)
        for module_name in where:
            originals.append((modules[module_name], name, getattr(modules[module_name], name)))
            setattr(modules[module_name], name, timed)

    def restore():
        for module, name, function in originals:
            setattr(module, name, function)

    return restore


def bare_product_ms(clock: Clock, phase: str, repeats: int = 7) -> float:
    """The products `linear` ran in `phase`, each timed alone on its own weight and a random input of its
    shape, hot (the median of `repeats` back-to-back calls), summed over one call of each shape and
    weight: the product's own cost, ms a call on average."""
    rng = np.random.default_rng(0)
    times = []
    for (recorded_phase, (rows, n_in, _n_out)), fc in clock.products.items():
        if recorded_phase != phase:
            continue
        x = rng.standard_normal((rows, n_in)).astype(fc.weight.dtype)
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            x @ fc.weight
            runs.append(time.perf_counter() - start)
        times.append(statistics.median(runs))
    return 1e3 * statistics.mean(times) if times else float("nan")


def profile(model_dir: str, workload: str, seed: int) -> tuple[Clock, float, int]:
    """One timed run of the workload (after a warm-up of its first two prompts): the clock, the run's
    wall seconds, and its rounds."""
    from minirt import LLM, SamplingParams

    _n, _lengths, new_tokens, batch_size = WORKLOADS[workload]
    llm = LLM(model_dir, backend="numpy", batch_size=batch_size)
    prompts = workload_prompts(workload, llm.model.config.vocab_size, seed)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0))
    clock = Clock()
    restore = install(clock)
    requests = llm.make_requests(prompts, params)
    try:
        start = time.perf_counter()
        with llm.steps(requests) as steps:
            for step in steps:
                # Round 1 of the group is its prefill; every later round decodes.
                if step.round_number is not None and step.round_number >= 1:
                    clock.phase = "decode"
        wall = time.perf_counter() - start
    finally:
        restore()
    assert llm.last_stats is not None
    return clock, wall, llm.last_stats.rounds


def table(clock: Clock, wall: float, rounds: int) -> str:
    lines = [
        "| operation | phase | share of the run | calls | ms a call | the same product alone, hot: ms a call"
        " | page faults a call | weights through the call: GB/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    timed_total = 0.0
    for (name, phase), seconds in sorted(clock.seconds.items(), key=lambda item: -item[1]):
        calls = clock.calls[(name, phase)]
        timed_total += seconds
        alone = f"{bare_product_ms(clock, phase):.3f}" if name == "linear" else ""
        faults = clock.page_faults[(name, phase)] / calls
        weight_bytes = clock.weight_bytes[(name, phase)]
        rate = f"{weight_bytes / seconds / 1e9:.1f}" if weight_bytes else ""
        lines.append(
            f"| {name} | {phase} | {seconds / wall:.1%} | {calls} | {1e3 * seconds / calls:.3f} | {alone}"
            f" | {faults:.1f} | {rate} |"
        )
    lines.append(
        f"| the rest | both | {(wall - timed_total) / wall:.1%} | {rounds} rounds | | | | |"
    )
    lines.append(f"\nwall time {wall:.3f} s for {rounds} rounds")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Where a generate run's time goes, operation by operation (see the docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/bench/round_profile.py\n"
        "  python tools/bench/round_profile.py --workload long-b8 --repeats 3",
    )
    parser.add_argument(
        "--model", help="checkpoint folder (default: a random gpt2-124M in --scratch)"
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/gpt2-124m-random"))
    parser.add_argument("--workload", choices=("short-b8", "long-b8"), default="short-b8")
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs, each printed (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0)
    blas_env.add_blas_env_argument(parser)
    args = parser.parse_args()
    blas_env.run_under(args.blas_env)
    if args.model is None:
        from reference import make_gpt2_124m

        args.model = str(make_gpt2_124m(args.scratch))
    print(blas_env.report())
    for repeat in range(args.repeats):
        clock, wall, rounds = profile(args.model, args.workload, args.seed)
        print(f"\n{args.workload}, run {repeat + 1} of {args.repeats}:")
        print(table(clock, wall, rounds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
