"""What the round grid costs the engine: the time `Engine.record` (one `RoundRecord` a round, built whether a page
watches or not) takes, against the time of the rounds themselves.

    python tools/bench/round_record_cost.py                      # the shipped model: its rounds are the shortest
    python tools/bench/round_record_cost.py --model /tmp/gpt2-124m-random --requests 16

It serves --requests prompts (random ids, --prompt-len tokens, --new-tokens each, ignore_eos) offline with
continuous batching at --batch-size rows, with a queue longer than the rows so that every record lists waiting
requests too, and times each call of `Engine.record` inside each `Engine.take_step`.  Over --repeats runs it
reports the records' share of the rounds' time (median, min-max) and the median microseconds a record takes.
The serve bench (serve_bench.py --sides minirt,baseline,watched) measures the same from outside, through HTTP,
where the noise of 16 client threads on 2 cores is far larger than this share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env


def one_run(args) -> tuple[float, float]:
    """(the records' share of the run's step time, median seconds a record took)."""
    import numpy as np

    from minirt import LLM, SamplingParams
    from minirt.engine.engine import Engine

    if args.model is None:
        llm = LLM(batch_size=args.batch_size, policy="continuous")
    else:
        llm = LLM(args.model, batch_size=args.batch_size, policy="continuous")
    vocab = llm.model.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [
        rng.integers(0, vocab - 1, size=args.prompt_len).tolist() for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, temperature=0.0)
    record_seconds: list[float] = []
    step_seconds: list[float] = []
    original_record = Engine.record
    original_step = Engine.take_step

    def timed_record(self, *a):
        start = time.perf_counter()
        result = original_record(self, *a)
        record_seconds.append(time.perf_counter() - start)
        return result

    def timed_step(self):
        start = time.perf_counter()
        result = original_step(self)
        step_seconds.append(time.perf_counter() - start)
        return result

    Engine.record = timed_record
    Engine.take_step = timed_step
    try:
        llm.generate(prompts, params)
    finally:
        Engine.record = original_record
        Engine.take_step = original_step
    return sum(record_seconds) / sum(step_seconds), statistics.median(record_seconds)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="a model folder (default: the shipped model)")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    blas_env.add_blas_env_argument(p)
    args = p.parse_args()
    blas_env.run_under(args.blas_env)
    print(f"minirt's {blas_env.report()}", flush=True)
    shares = []
    micros = []
    for repeat in range(args.repeats):
        share, record_s = one_run(args)
        shares.append(share)
        micros.append(record_s * 1e6)
        print(
            f"run {repeat + 1}: records {100 * share:.3f}% of step time, {record_s * 1e6:.1f} us each",
            flush=True,
        )
    print(
        f"records' share of step time: median {100 * statistics.median(shares):.3f}% "
        f"({100 * min(shares):.3f}-{100 * max(shares):.3f}); a record: median {statistics.median(micros):.1f} us "
        f"({min(micros):.1f}-{max(micros):.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
