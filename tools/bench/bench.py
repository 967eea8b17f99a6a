"""minirt beside transformers on the same checkpoint: a matrix of workloads, each side in fresh processes.

Workloads (fp32 by default, greedy, every request forced to its full length: ignore_eos for minirt,
min_new_tokens for transformers, so both sides do exactly the same work):

  short-b1    8 prompts of 8-32 random tokens, 32 new each, one request at a time
  short-b8    the same 8 prompts as one batch (minirt: one static group; transformers: one left-padded
              `generate` call with an attention mask)
  long-b8     8 prompts of 600-950 tokens, 32 new each, as one batch
  score-8x1024  the logits of 8 sequences of 1024 tokens (minirt: `model.logits`; transformers: one forward)
  decode-b32  32 prompts of 16 tokens: decode-only speed, 32 x (33 - 1) tokens / (t(33 new) - t(1 new)),
              i.e. the prefill (and the first token it gives) is subtracted on both sides

Every measurement runs in a fresh Python process (this script, `--child SIDE WORKLOAD`), which loads the
model, warms up once on a small piece of the workload, times the workload once, and reports its peak RSS
(VmHWM, /proc/self/status: load, warm-up and run together; not `ru_maxrss`, which on Linux keeps the
high-water mark of the parent's image that the child was forked from, across exec).  The parent runs the two sides alternately, `--repeats`
times each, and prints medians, the min-max range of each side, and the ratio's range over the pairs
run back to back.  The minirt child never imports torch, so its RSS is minirt's own.  The greedy tokens
(for scoring: the argmax at every position) of the two sides are compared as a sanity check.

`--decode-floor` measures, in one minirt process, a decode step (`model.forward` of one token per row
after 40 cached positions, or --kv-len; Batch metadata included; sampling is not) against the time of that step's weight GEMMs
alone (4 per layer and the head, on random inputs of the same shapes, as minirt runs them),
alternating, at batch 1, 8, 32; and the same step two other ways: with each Conv1D weight copied to
[out, in] (as torch.nn.Linear keeps it) and multiplied `weight @ x.T`, which runs faster in GEMMs of a few
rows timed alone (tried for #24: the step gained within noise, and copying at load cost 10x the load),
against the file's [in, out] that minirt maps and multiplies `x @ weight`; and with
the head multiplied as the file's [V, C] transposed, against the [C, V] copy minirt keeps.

The BLAS kernel: by default every timed process runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, so
that NumPy's OpenBLAS picks its kernel as on a user's machine (`--blas-env keep`: as this machine sets
them; tools/bench/blas_env.py).  The kernel, as threadpoolctl reports it, is printed beside every table
(above the decode floor's; below the matrix, from what its children report).

Usage (needs the `reference` extra; the default model is a random gpt2-124M made once in /tmp):

    python tools/bench/bench.py                                  # the whole matrix, 3 repeats
    python tools/bench/bench.py --workloads long-b8 score-8x1024 --repeats 5
    python tools/bench/bench.py --decode-floor                   # decode step against its GEMMs
    python tools/bench/bench.py --decode-floor --blas-env keep   # ... under the machine's OPENBLAS_*
    python tools/bench/bench.py --model gpt2                     # a real checkpoint from the local HF cache
    python tools/bench/bench.py --shape smollm2-135m             # a random model in SmolLM2-135M's shape
    python tools/bench/bench.py --shape qwen2.5-0.5b --workloads short-b8 decode-b32

`--shape` (smollm2-135m, qwen2.5-0.5b: tools/fixtures/reference.py's SHAPES) makes a random fp32
checkpoint in that real model's shape, once, in /tmp/SHAPE-random (or --scratch); the transformers
side loads any family through AutoModelForCausalLM.  --decode-floor is GPT-2's alone.

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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env

# reference.py's SHAPES, by name (reference.py itself imports torch: only the parent that makes a
# checkpoint imports it).
SHAPES = ("smollm2-135m", "qwen2.5-0.5b")

# name -> (prompts, (min, max) prompt length, new tokens, batch size)
WORKLOADS = {
    "short-b1": (8, (8, 32), 32, 1),
    "short-b8": (8, (8, 32), 32, 8),
    "long-b8": (8, (600, 950), 32, 8),
    "score-8x1024": (8, (1024, 1024), 0, 8),
    "decode-b32": (32, (16, 16), 33, 32),
}


def workload_prompts(name: str, vocab_size: int, seed: int) -> list[list[int]]:
    n, (low, high), _, _ = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, vocab_size, size=int(rng.integers(low, high + 1))).tolist()
        for _ in range(n)
    ]


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM), in MB (MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise SystemExit("bench: /proc/self/status has no VmHWM line (peak RSS needs Linux)")


# ---------------------------------------------------------------------------- the two sides, in a child


def minirt_side(model_dir: str, dtype: str, batch_size: int):
    """(generate(prompts, new_tokens) -> token lists, score(sequences) -> logits [B, T, V])"""
    from minirt import LLM, SamplingParams

    llm = LLM(model_dir, backend="numpy", dtype=dtype, batch_size=batch_size)

    def generate(prompts, new_tokens):
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
        outputs = [out.outputs[0] for out in llm.generate(prompts, params)]
        assert all(len(o.token_ids) == new_tokens for o in outputs)
        return [o.token_ids for o in outputs]

    def score(sequences):
        return llm.model.logits(sequences)  # [B, T, V] fp32 NumPy

    return generate, score


def pad_token_id(eos_token_id) -> int:
    """The left padding of transformers' batches: the eos id (the first, when a config lists
    several, as Qwen's and Llama 3's generation configs do), or 0."""
    if isinstance(eos_token_id, list):
        eos_token_id = eos_token_id[0] if eos_token_id else None
    return eos_token_id if eos_token_id is not None else 0


def transformers_side(model_dir: str, dtype: str, batch_size: int):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    # Any family: GPT-2, Llama, Qwen2, ... (the prompts are token ids: no tokenizer needed).
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, dtype=getattr(torch, dtype)
    ).eval()
    pad_id = pad_token_id(model.config.eos_token_id)

    def generate(prompts, new_tokens):
        tokens = []
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first : first + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    pad_token_id=pad_id,
                )
            tokens += out[:, width:].tolist()
        return tokens

    def score(sequences):
        with torch.no_grad():
            return model(torch.tensor(sequences)).logits  # [B, T, V]

    return generate, score


def child(side: str, name: str, model_dir: str, dtype: str, seed: int) -> dict:
    """Load one side, warm it up, time one workload; the result as one JSON-able dict."""
    from minirt import load_checkpoint

    n_prompts, _, new_tokens, batch_size = WORKLOADS[name]
    vocab_size = load_checkpoint(model_dir).config.vocab_size
    prompts = workload_prompts(name, vocab_size, seed)
    generate, score = (minirt_side if side == "minirt" else transformers_side)(
        model_dir, dtype, batch_size
    )
    result = {}
    if name.startswith("score"):
        score([p[:16] for p in prompts[:2]])  # warm-up
        start = time.perf_counter()
        logits = score(prompts)
        seconds = time.perf_counter() - start
        result["tokens"], result["logits_mb"] = (
            logits.argmax(-1).tolist(),
            logits.nbytes / 2**20,
        )  # after the clock
        result["rate"] = sum(map(len, prompts)) / seconds  # tokens scored per second
    elif name.startswith("decode"):
        generate(prompts[:2], 2)  # warm-up
        start = time.perf_counter()
        generate(prompts, 1)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        result["tokens"] = generate(prompts, new_tokens)
        seconds = time.perf_counter() - start
        result["rate"] = (
            n_prompts * (new_tokens - 1) / (seconds - prefill)
        )  # decode tokens per second
    else:
        generate(prompts[:1], 2)  # warm-up
        start = time.perf_counter()
        result["tokens"] = generate(prompts, new_tokens)
        seconds = time.perf_counter() - start
        result["rate"] = n_prompts * new_tokens / seconds  # generated tokens per second
    result["seconds"] = seconds
    result["peak_rss_mb"] = peak_rss_mb()
    # After the peak is read: threadpoolctl is not part of either side.
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
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
        # The parent's choice, or the child would re-execute itself under the default.
        "--blas-env",
        args.blas_env,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"bench: the {side} child for {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the matrix, in the parent


def spread(values) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def matrix(args) -> None:
    print(
        f"model {args.model}, {args.dtype}; {args.repeats} alternating runs per side, each in a fresh process; "
        "rates are medians (min-max)"
    )
    blas_lines: set[str] = set()
    print(
        "| workload | minirt tok/s | transformers tok/s | ratio (pair range) | peak RSS MiB minirt / transformers "
        "| same tokens |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.workloads:
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(run_child("minirt", name, args))
            theirs.append(run_child("transformers", name, args))
        blas_lines.update(result["blas"] for result in ours + theirs)
        ratios = [a["rate"] / b["rate"] for a, b in zip(ours, theirs, strict=True)]
        rate = statistics.median(a["rate"] for a in ours) / statistics.median(
            b["rate"] for b in theirs
        )
        rss = [statistics.median(r["peak_rss_mb"] for r in side) for side in (ours, theirs)]
        same = sum(x == y for x, y in zip(ours[-1]["tokens"], theirs[-1]["tokens"], strict=True))
        extra = ""
        if "logits_mb" in ours[-1]:
            extra = f"; minirt RSS above its logits {rss[0] - ours[-1]['logits_mb']:.0f} MiB"
        print(
            f"| {name} | {spread([a['rate'] for a in ours])} | {spread([b['rate'] for b in theirs])} "
            f"| **{rate:.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) | {rss[0]:.0f} / {rss[1]:.0f}{extra} "
            f"| {same}/{len(ours[-1]['tokens'])} rows |",
            flush=True,
        )
    # Every child reports the BLAS it ran with; they all share one environment.
    print("\nthe timed processes' " + " | ".join(sorted(blas_lines)))


def linear_transposed(x, fc, tiles=None):
    """A weight GEMM on a weight copied to [out, in]: `weight @ x.T`, viewed back as [N, out] (the
    default mode's: no exact batch invariance's `tiles`)."""
    assert tiles is None
    out = (fc.weight @ x.T).T  # [N, out]
    out += fc.bias
    return out


def blocks_transposed(blocks):
    """The same blocks with each Conv1D weight copied to [out, in], contiguous."""
    from dataclasses import replace

    from minirt.model.gpt2 import MLP, Attention
    from minirt.model.layers import Linear

    def out_in(fc):
        return Linear(np.ascontiguousarray(fc.weight.T), fc.bias)  # [out, in]

    return [
        replace(
            block,
            attn=Attention(out_in(block.attn.c_attn), out_in(block.attn.c_proj)),
            mlp=MLP(out_in(block.mlp.c_fc), out_in(block.mlp.c_proj)),
        )
        for block in blocks
    ]


def decode_floor(args) -> None:
    """A decode step against its own weight GEMMs, at batch 1, 8 and 32, and the same step with the
    weights laid out two other ways (see the module docstring)."""
    import minirt
    from minirt.model import gpt2, layers
    from minirt.model.batch import Batch

    model = minirt.load_model(args.model, dtype=args.dtype)
    kv_len = args.kv_len
    steps = args.steps
    c = model.config
    rng = np.random.default_rng(args.seed)
    blocks = {"step": model.blocks, "weights [out, in]": blocks_transposed(model.blocks)}
    linears = {"step": layers.linear, "weights [out, in]": linear_transposed}
    head_cv = model.head_weight  # [C, V]
    head_vc_t = np.ascontiguousarray(model.head_weight.T).T  # the same numbers, [V, C] in memory

    def gemms(x, x_inner):
        # As minirt runs them, without the biases.
        for block in model.blocks:
            x @ block.attn.c_attn.weight
            x @ block.attn.c_proj.weight
            x @ block.mlp.c_fc.weight
            x_inner @ block.mlp.c_proj.weight
        return x @ model.head_weight

    print(blas_env.report())
    print(
        f"decode step (model.forward, KV {kv_len}) against its weight GEMMs; medians of {steps} alternating steps"
    )
    # The bytes every step's GEMMs read: the weights of every block and the head.
    weight_bytes = model.head_weight.nbytes + sum(
        fc.weight.nbytes
        for block in model.blocks
        for fc in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
    )
    print(f"the GEMMs read {weight_bytes / 1e6:.0f} MB of weights per step")
    print(
        "| batch | step ms | GEMMs ms | their weight GB/s | step / GEMMs | step with the weights [out, in] ms | its speed-up "
        "| step with the head as [V, C]^T ms | saving |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = ("step", "gemms", "weights [out, in]", "head [V, C]^T")
    for batch_size in (1, 8, 32):
        cache = model.new_kv_cache(batch_size, kv_len + 1)
        slots = list(range(batch_size))
        prompts = [rng.integers(0, c.vocab_size, kv_len).tolist() for _ in slots]
        model.forward(Batch(prompts, model.backend, slots=slots, past_lens=[0] * batch_size), cache)
        x = rng.standard_normal((batch_size, c.n_embd)).astype(model.dtype)
        x_inner = rng.standard_normal((batch_size, c.n_inner)).astype(model.dtype)
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _step in range(steps):
            for kind in kinds:
                layout = "weights [out, in]" if kind == "weights [out, in]" else "step"
                model.blocks = blocks[layout]
                # GPT-2's attention and the shared MLP each call it.
                layers.linear = linears[layout]
                gpt2.linear = linears[layout]
                model.head_weight = head_vc_t if kind == "head [V, C]^T" else head_cv
                # Every step at KV kv_len + 1.
                tokens = rng.integers(0, c.vocab_size, (batch_size, 1)).tolist()
                start = time.perf_counter()
                if kind == "gemms":
                    gemms(x, x_inner)
                else:
                    batch = Batch(
                        tokens, model.backend, slots=slots, past_lens=[kv_len] * batch_size
                    )
                    model.forward(batch, cache)
                times[kind].append(time.perf_counter() - start)
        model.blocks = blocks["step"]
        layers.linear = linears["step"]
        gpt2.linear = linears["step"]
        model.head_weight = head_cv
        step, gemm, out_in, old_head = (1e3 * statistics.median(times[kind]) for kind in kinds)
        print(
            f"| {batch_size} | {step:.2f} | {gemm:.2f} | {weight_bytes / gemm / 1e6:.0f} "
            f"| {step / gemm:.2f}x | {out_in:.2f} "
            f"| {step / out_in:.2f}x | {old_head:.2f} | {old_head / step:.2f}x |",
            flush=True,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="minirt beside transformers: a matrix of workloads, fresh processes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/bench/bench.py --repeats 3\n"
        "  python tools/bench/bench.py --workloads long-b8 --repeats 5\n"
        "  python tools/bench/bench.py --decode-floor\n"
        "  python tools/bench/bench.py --decode-floor --blas-env keep",
    )
    parser.add_argument(
        "--model",
        help="checkpoint folder or hub id (default: a random gpt2-124M, or --shape, in --scratch)",
    )
    parser.add_argument(
        "--shape",
        choices=list(SHAPES),
        help="no --model: a random model in this real model's shape (tools/fixtures/reference.py "
        "make-shape), fp32, made once in --scratch",
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        help="where the random checkpoint lives, made on first use (default "
        "/tmp/gpt2-124m-random, or /tmp/SHAPE-random)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=list(WORKLOADS),
        default=list(WORKLOADS),
        help="rows of the matrix (default: all)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternating runs per side (default 3)"
    )
    parser.add_argument(
        "--decode-floor", action="store_true", help="measure the decode step against its GEMMs"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=31,
        help="--decode-floor: alternating steps per kind (default 31)",
    )
    parser.add_argument(
        "--kv-len",
        type=int,
        default=40,
        help="--decode-floor: cached positions each step attends to (default 40)",
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds one child may run (default 900)"
    )
    blas_env.add_blas_env_argument(parser)
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "WORKLOAD"), help=argparse.SUPPRESS)
    return parser


def default_model(args) -> str:
    """--model, or the random checkpoint (gpt2-124M or --shape) in --scratch, made if missing."""
    if args.model is not None:
        return args.model
    if args.shape is None:
        from reference import make_gpt2_124m

        return str(make_gpt2_124m(args.scratch or Path("/tmp/gpt2-124m-random")))
    from reference import make_shape

    return str(make_shape(args.shape, args.scratch or Path(f"/tmp/{args.shape}-random")))


def main() -> int:
    args = build_parser().parse_args()
    # Before anything is timed: every process from here on runs under the chosen BLAS environment.
    blas_env.run_under(args.blas_env)
    if args.child:
        print(json.dumps(child(*args.child, args.model, args.dtype, args.seed)))
        return 0
    args.model = default_model(args)
    if args.decode_floor:
        decode_floor(args)
    else:
        matrix(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
