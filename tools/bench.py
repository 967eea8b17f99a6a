"""Generated tokens per second: minirt beside transformers' `generate`, same checkpoint, same workload, one run.

The workload (issue #3): 8 prompts of 8-32 random tokens, 32 new tokens each,
greedy, every request forced to its full 32 tokens (ignore_eos for minirt,
min_new_tokens for transformers), so both do exactly the same work.

  batch 8   minirt serves the 8 prompts as one static group; transformers runs
            one left-padded `generate` call with an attention mask.
  batch 1   each prompt alone, one after another, on both sides.

The two sides run alternately, `--repeats` times each, in this one process;
the table shows medians and the ratio.  Both use the machine's cores (OpenBLAS
threads for NumPy, intra-op threads for torch).  The greedy tokens of the two
sides are compared as a sanity check.

Usage (needs the `reference` extra):

    python tools/bench.py                               # a random gpt2-124M made once in /tmp
    python tools/bench.py --model gpt2 --repeats 5      # a real one from the local HF cache
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def workload(vocab_size: int, n_prompts: int, seed: int, lengths: tuple[int, int] = (8, 32)) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=int(rng.integers(lengths[0], lengths[1] + 1))).tolist()
            for _ in range(n_prompts)]


def run_minirt(llms, prompts, new_tokens: int, batch_size: int) -> tuple[float, list[list[int]]]:
    """`llms` maps each batch size to its LLM (one per batch size, all sharing one loaded checkpoint)."""
    from minirt import SamplingParams

    llm = llms[batch_size]
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outputs)
    return len(prompts) * new_tokens / seconds, [o.token_ids for o in outputs]


def run_transformers(model, prompts, new_tokens: int, batch_size: int, pad_id: int) -> tuple[float, list[list[int]]]:
    import torch

    tokens = []
    start = time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first:first + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=pad_id)
        tokens += out[:, width:].tolist()
    seconds = time.perf_counter() - start
    return len(prompts) * new_tokens / seconds, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description="minirt vs transformers generate: generated tokens per second, side by side.",
                                     epilog="example: python tools/bench.py --repeats 3 --batch-sizes 8 1")
    parser.add_argument("--model", help="checkpoint folder or hub id (default: a random gpt2-124M written to --scratch)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/gpt2-124m-random"), help="where the random checkpoint lives")
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts (default 8)")
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens per prompt (default 32)")
    parser.add_argument("--prompt-lengths", type=int, nargs=2, default=[8, 32], metavar=("MIN", "MAX"),
                        help="prompt lengths, drawn uniformly (default 8 32; long prompts: 600 950)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 1], help="batch sizes to measure (default 8 1)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side (default 3)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    from minirt import LLM, load_checkpoint

    logging.set_verbosity_error()
    if args.model is None:
        from reference import make_gpt2_124m

        args.model = str(make_gpt2_124m(args.scratch))
    checkpoint = load_checkpoint(args.model)  # one set of (memory-mapped) weights for every batch size's LLM
    llms = {b: LLM(checkpoint, backend="numpy", dtype=args.dtype, batch_size=b) for b in {1, *args.batch_sizes}}
    llm = llms[1]
    folder = llm.model.folder
    reference = GPT2LMHeadModel.from_pretrained(folder, local_files_only=True, torch_dtype=torch.float32).eval()
    prompts = workload(llm.model.config.vocab_size, args.prompts, args.seed, tuple(args.prompt_lengths))
    pad_id = llm.tokenizer.eos_token_id if llm.tokenizer is not None and llm.tokenizer.eos_token_id is not None else 0
    print(f"model {args.model}: {llm.model.n_params / 1e6:.0f}M parameters, {args.dtype}; "
          f"{args.prompts} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.new_tokens} new each, greedy; "
          f"torch threads {torch.get_num_threads()}")

    run_minirt(llms, prompts[:1], 2, 1)  # warm both sides up once
    run_transformers(reference, prompts[:1], 2, 1, pad_id)
    print(f"{'batch':>5s} {'minirt tok/s':>13s} {'transformers tok/s':>19s} {'ratio':>7s} {'ratio range':>13s}  "
          "greedy tokens equal")
    for batch_size in args.batch_sizes:
        ours, theirs, same = [], [], None
        for _ in range(args.repeats):
            rate, our_tokens = run_minirt(llms, prompts, args.new_tokens, batch_size)
            ours.append(rate)
            rate, their_tokens = run_transformers(reference, prompts, args.new_tokens, batch_size, pad_id)
            theirs.append(rate)
            same = sum(a == b for a, b in zip(our_tokens, their_tokens))
        a, b = statistics.median(ours), statistics.median(theirs)
        ratios = [x / y for x, y in zip(ours, theirs)]  # each pair measured back to back
        print(f"{batch_size:5d} {a:13.1f} {b:19.1f} {a / b:6.2f}x {min(ratios):5.2f}-{max(ratios):.2f}x  "
              f"{same}/{len(prompts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
