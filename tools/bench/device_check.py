"""The one script a GPU session runs: environment, tests, correctness, speed, floor, round counts.

Made for a single run of about 8 minutes on the lent NVIDIA H200 (cupy-cuda13x,
torch, transformers, safetensors and tokenizers preinstalled; no network; minirt
is used from this checkout, not installed).  It works against a global
deadline (`--deadline`, default 480 s), writes its results to one JSON file after
every section (so a run cut short keeps what it measured), and prints a summary
table last.

Sections:
  1. environment   versions, the GPU, and minirt's fused tanh GELU (cupy.fuse)
                   checked against NumPy's run of the same function;
  2. gpu_tests     the `gpu` tests (pytest -m gpu): tests/model/test_gpu.py (CuPy
                   against NumPy on random configs, batches and paddings, and the
                   device paths beyond scoring: continuous batching with reused,
                   zeroed and gathered slots, a decode round padded by scatter,
                   prompt and token logprobs, penalties, evaluate, LLM and
                   `generate --backend cupy`) and
                   tests/cupy_path/test_stand_in_against_cupy.py (the strict
                   stand-in's rules confirmed on the real CuPy), with pytest's
                   whole output;
  3. correctness   every fixture model against the transformers logits saved
                   beside it; a random-weight model of the gpt2-124M shape against
                   transformers on the GPU, in fp32 and fp16;
  4. greedy        greedy tokens against transformers' `generate` (fp32, on the GPU),
                   for the shipped trained model and the random gpt2-124M shape, in
                   fp32 and fp16, in one padded batch: where they part, the
                   reference's top-2 margin at that step says whether it was clear;
  5. timing        decode tokens/s at batch 1, 8 and 64, fp16 and fp32, minirt
                   against transformers' `generate` (PyTorch eager) on the same
                   weights, plus minirt's host time per round measured with
                   cupyx.profiler.benchmark;
  6. floor         the bytes of weights and KV read per decode step, divided by
                   ~4.8 TB/s, as a fraction of the measured step time;
  7. counts        a prefill and a decode round of the timed shape on the strict
                   stand-in (tests/strict_cupy): device operations, uploads,
                   downloads and syncs; on a GPU, beside them, what the GPU ran for
                   the same rounds (kernels and copies, recorded by torch.profiler,
                   whose CUPTI trace sees every kernel of the process, CuPy's too);
  8. launches      what one launch costs the host here (CuPy's and torch's add, sum,
                   max, matmul; a fused chain), the kernels transformers runs for a
                   decode step, and a cProfile of minirt's decode round: where a
                   round bound by its launches spends its host time.

The gpu tests take what time is left after the sections that follow them have had their
minimum (MIN_SECONDS), at most 240 s.

On a machine with an NVIDIA GPU, CuPy, torch and transformers (docs/gpu.md):

    python tools/bench/device_check.py --out device_check.json

Here, on the CPU, the same code runs small and fast, start to end (the default
suite runs this, without torch: `--no-transformers` makes the random checkpoint
with NumPy and skips every transformers comparison):

    python tools/bench/device_check.py --backend numpy --quick --no-transformers --out /tmp/dc.json

Where pytest and hypothesis cannot be installed into the machine's own Python,
install them into .device_deps in the clone (`pip install --target .device_deps
pytest hypothesis`): this script puts that folder on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "fixtures"))
# The strict stand-in for CuPy (the counts section).
sys.path.insert(0, str(ROOT / "tests"))
if (ROOT / ".device_deps").is_dir():  # last, so the machine's own packages win
    sys.path.append(str(ROOT / ".device_deps"))

H200_BANDWIDTH = 4.8e12  # bytes/s, HBM3e, the H200's nominal memory bandwidth
GPT2_124M = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
QUICK = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 128}
SECTION_NAMES = (
    "environment",
    "gpu_tests",
    "correctness",
    "greedy",
    "timing",
    "floor",
    "counts",
    "launches",
)
SHIPPED_MODEL = ROOT / "weights" / "shakespeare-gpt2-tiny"
# A parting of greedy paths is "clear" (a real difference, not rounding) when the reference's
# top-2 margin at that step exceeds this fraction of its largest logit: the logits tolerance of
# each dtype (fp32 1e-4, fp16 3%; docs/gpu.md).
CLEAR_MARGIN = {"float32": 1e-4, "float16": 3e-2}


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="minirt on a GPU: environment, correctness, speed, bandwidth floor.",
        epilog="example: python tools/bench/device_check.py --out $OUT/device_check.json",
    )
    p.add_argument(
        "--out",
        default=os.path.join(os.environ.get("OUT", "."), "device_check.json"),
        help="JSON results file, rewritten after every section (default $OUT/device_check.json)",
    )
    p.add_argument(
        "--deadline", type=float, default=480.0, help="seconds for the whole run (default 480)"
    )
    p.add_argument(
        "--backend", choices=("cupy", "numpy"), default="cupy", help="numpy runs the CPU side only"
    )
    p.add_argument(
        "--quick", action="store_true", help="a tiny model and few tokens (for CPU smoke tests)"
    )
    p.add_argument(
        "--batch-sizes", default="1,8,64", help="decode batch sizes to time (default 1,8,64)"
    )
    p.add_argument(
        "--dtypes",
        default="float16,float32",
        help="compute dtypes to time (default float16,float32)",
    )
    p.add_argument(
        "--prompt-len", type=int, default=32, help="prompt tokens per request (default 32)"
    )
    p.add_argument(
        "--new-tokens", type=int, default=64, help="tokens generated per request (default 64)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of each side, alternating, per dtype and batch size (default 3)",
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTION_NAMES),
        help=f"which sections to run (default {','.join(SECTION_NAMES)})",
    )
    p.add_argument(
        "--no-transformers",
        action="store_true",
        help="no torch: a NumPy-made random checkpoint, and no transformers comparison",
    )
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTION_NAMES)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.quick:
        args.new_tokens = min(args.new_tokens, 4)
        args.prompt_len = min(args.prompt_len, 8)
    return args


# ----------------------------------------------------------------------------- helpers


def model_shape(args) -> dict:
    return QUICK if args.quick else GPT2_124M


def torch_device(args) -> str:
    import torch

    return "cuda" if args.backend == "cupy" and torch.cuda.is_available() else "cpu"


def make_checkpoint(args, folder: Path):
    """A random-weight GPT-2 saved in safetensors: transformers' own init, returning the torch
    model; or, with --no-transformers, NumPy's (tools/fixtures/tiny_random_model.py), returning
    None."""
    if args.no_transformers:
        from safetensors.numpy import save_file
        from tiny_random_model import random_tensors

        from minirt.model.config import GPT2Config as MinirtConfig

        config = {"model_type": "gpt2", **model_shape(args)}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config) + "\n")
        tensors = random_tensors(MinirtConfig.from_dict(config), 0)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return None
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**model_shape(args))).eval()
    model.save_pretrained(folder)
    return model


def weight_bytes_per_step(config, dtype) -> int:
    """Bytes of weights a decode step reads: every block and the head (kept in fp32), not the
    wte/wpe rows."""
    item = np.dtype(dtype).itemsize
    C, n_inner, V = config.n_embd, config.n_inner, config.vocab_size
    per_block = (
        (C * 3 * C + 3 * C) + (C * C + C) + (C * n_inner + n_inner) + (n_inner * C + C) + 4 * C
    )
    return config.n_layer * per_block * item + V * C * 4 + 2 * C * item


def kv_bytes_per_step(config, dtype, batch: int, kv_len: float) -> float:
    return 2 * config.n_layer * batch * kv_len * config.n_embd * np.dtype(dtype).itemsize


# ----------------------------------------------------------------------------- sections


def section_environment(args, deadline, state) -> dict:
    from minirt.model.fusion import elementwise_chains

    out = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
    for name in ("torch", "transformers", "safetensors", "tokenizers"):
        try:
            out[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 (report any failure to import, don't fail)
            out[name] = f"not importable ({type(exc).__name__})"
    x = np.linspace(-6, 6, 4097, dtype=np.float32)
    if args.backend == "cupy":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        out.update(
            {
                "cupy": cupy.__version__,
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
                "gpu": props["name"].decode()
                if isinstance(props["name"], bytes)
                else str(props["name"]),
                "gpu_memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
            }
        )
        # minirt's own chain, compiled by cupy.fuse (NVRTC), against NumPy running it as written.
        fused = elementwise_chains(cupy).gelu_tanh
        got = cupy.asnumpy(fused(cupy.asarray(x)))
        want = elementwise_chains(np).gelu_tanh(x)
        out["fused_gelu_max_abs_error_vs_numpy"] = float(np.abs(got - want).max())
    else:
        out["fused_gelu"] = "skipped (numpy backend)"
    return out


def fixtures_against_transformers(args) -> dict:
    """Every fixture model's fp32 logits on this backend, against the transformers logits saved
    beside it (tests/fixtures/*/expected.npz): the largest relative error of each."""
    import minirt

    errors = {}
    for folder in sorted((ROOT / "tests" / "fixtures").iterdir()):
        if not (folder / "expected.npz").is_file():
            continue
        with np.load(folder / "expected.npz") as expected:
            names = sorted(k for k in expected.files if k.startswith("seq_"))
            sequences = [expected[k].tolist() for k in names]
            want = expected["logits"]
        got = minirt.load_model(folder, backend=args.backend).logits(sequences)
        errors[folder.name] = max(
            float(
                np.abs(got[b, : len(s)] - want[b, : len(s)]).max() / np.abs(want[b, : len(s)]).max()
            )
            for b, s in enumerate(sequences)
        )
    return errors


def time_for_sections_after(args, name: str) -> float:
    """The least time the sections that run after `name` need (MIN_SECONDS), with a margin of
    a half: what a section that could run long must leave them."""
    later = args.sections[args.sections.index(name) + 1 :]
    return 1.5 * sum(MIN_SECONDS[section] for section in later)


GPU_TEST_FILES = ("tests/model/test_gpu.py", "tests/cupy_path/test_stand_in_against_cupy.py")


def section_gpu_tests(args, deadline, state) -> dict:
    """The `gpu` tests, run by pytest; their whole output is kept in the JSON file (every
    failure's details, for a run that nobody watches)."""
    if args.backend != "cupy":
        return {"skipped": "numpy backend"}
    budget = max(30, min(240, deadline.left() - time_for_sections_after(args, "gpu_tests")))
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-m", "gpu", *GPU_TEST_FILES]
    command += ["-p", "no:cacheprovider"]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        run = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=budget,
            env=environment,
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return {"exit_code": None, "tail": [f"timed out after {budget:.0f} s"], "output": partial}
    return {
        "exit_code": run.returncode,
        "tail": run.stdout.strip().splitlines()[-12:],
        "output": run.stdout[-200_000:],
        "stderr": run.stderr[-20_000:],
    }


def section_correctness(args, deadline, state) -> dict:
    import minirt

    out = {}
    out["fixtures_max_rel_error_vs_transformers"] = fixtures_against_transformers(args)
    folder = Path(state["scratch"]) / "model"
    reference = make_checkpoint(args, folder)
    state["folder"] = folder
    state["reference"] = reference
    out["model_shape"] = model_shape(args)
    if reference is None:
        out["random_model_vs_transformers"] = "skipped (--no-transformers)"
        return out
    import torch

    rng = np.random.default_rng(0)
    V = reference.config.vocab_size
    sequences = [rng.integers(0, V, n).tolist() for n in (40, 3, 17, 1)]
    device = torch_device(args)
    ref_model = reference.to(device)  # stays fp32; timing makes its own copies
    with torch.no_grad():
        want = [
            ref_model(torch.tensor([s], device=device)).logits[0].float().cpu().numpy()
            for s in sequences
        ]
    for dtype in ("float32", "float16"):
        model = minirt.load_model(folder, backend=args.backend, dtype=dtype)
        got = model.logits(sequences)
        errs = [
            float(np.abs(got[b, : len(s)] - want[b]).max() / np.abs(want[b]).max())
            for b, s in enumerate(sequences)
        ]
        out[f"logits_{dtype}_max_rel_error_vs_transformers_fp32"] = max(errs)
    out["fp32_within_1e-4"] = out["logits_float32_max_rel_error_vs_transformers_fp32"] <= 1e-4
    return out


def reference_greedy(reference, sequences, new_tokens: int, device: str) -> list[dict]:
    """transformers' greedy continuation of each prompt alone (no padding), with the raw logits
    of each step: the tokens and, per step, the margin between its two largest logits as a
    fraction of the largest magnitude."""
    import torch

    reference.generation_config.eos_token_id = None  # run every step, as ignore_eos does
    out = []
    with torch.no_grad():
        for sequence in sequences:
            run = reference.generate(
                torch.tensor([sequence], device=device),
                do_sample=False,
                max_new_tokens=new_tokens,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            tokens = run.sequences[0, len(sequence) :].tolist()
            margins = []
            for step_logits in run.logits:
                row = step_logits[0].float()
                top2 = torch.topk(row, 2).values
                margins.append(float((top2[0] - top2[1]) / row.abs().max()))
            out.append({"tokens": tokens, "margins": margins})
    return out


def compare_greedy(ours: list[list[int]], theirs: list[dict], dtype: str) -> dict:
    """Where each of our greedy continuations first parts from the reference's, and whether the
    reference's margin there was clear (over CLEAR_MARGIN[dtype] of its largest logit)."""
    partings = []
    equal_tokens = 0
    for index, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        want = reference["tokens"]
        step = next((i for i, (a, b) in enumerate(zip(mine, want, strict=True)) if a != b), None)
        if step is None:
            equal_tokens += len(want)
            continue
        equal_tokens += step
        margin = reference["margins"][step]
        partings.append(
            {
                "prompt": index,
                "step": step,
                "margin": margin,
                "clear": margin > CLEAR_MARGIN[dtype],
            }
        )
    return {
        "prompts": len(ours),
        "tokens": sum(len(r["tokens"]) for r in theirs),
        "tokens_equal_before_parting": equal_tokens,
        "prompts_identical": len(ours) - len(partings),
        "partings": partings,
        "clear_partings": sum(p["clear"] for p in partings),
    }


def section_greedy(args, deadline, state) -> dict:
    """Greedy tokens, minirt (this backend, fp32 and fp16, one padded batch) against transformers
    (fp32, each prompt alone): on the shipped trained model, whose margins are wide, and on the
    random gpt2-124M shape, whose margins are narrow."""
    if args.no_transformers:
        return {"skipped": "--no-transformers"}
    if "folder" not in state:
        return {"skipped": "needs the correctness section"}
    from transformers import GPT2LMHeadModel

    from minirt import LLM, SamplingParams

    device = torch_device(args)
    new_tokens = 8 if args.quick else 48
    models = {
        "shipped": (SHIPPED_MODEL, GPT2LMHeadModel.from_pretrained(SHIPPED_MODEL).eval()),
        "random": (state["folder"], state["reference"]),
    }
    out = {"new_tokens": new_tokens, "clear_margin": CLEAR_MARGIN}
    for name, (folder, reference) in models.items():
        reference = reference.to(device)
        V = reference.config.vocab_size
        rng = np.random.default_rng(1)
        lengths = (1, 5, 17, 40, 3, 64, 9, 30)
        sequences = [rng.integers(0, V, n).tolist() for n in lengths]
        theirs = reference_greedy(reference, sequences, new_tokens, device)
        for dtype in ("float32", "float16"):
            llm = LLM(folder, backend=args.backend, dtype=dtype, batch_size=len(sequences))
            params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
            ours = [out.outputs[0].token_ids for out in llm.generate(sequences, params)]
            out[f"{name}_{dtype}"] = compare_greedy(ours, theirs, dtype)
    out["no_clear_parting"] = all(
        row["clear_partings"] == 0
        for row in out.values()
        if isinstance(row, dict) and "partings" in row
    )
    return out


def per_launch_us(function, sync, repeats: int = 2000) -> float:
    """Host microseconds per call of `function`, which launches work without waiting for it:
    the mean over `repeats` calls after a warm-up, the device drained before and after."""
    for _ in range(50):
        function()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    elapsed = time.perf_counter() - start
    sync()
    return 1e6 * elapsed / repeats


def transformers_kernels_per_step(reference, dtype: str) -> dict:
    """What transformers runs for one decode step at batch 1 (one token after a 32-token
    prompt, from its KV cache), by torch.profiler: kernels, copies, and host ms of the step."""
    import copy

    import torch
    from torch.profiler import ProfilerActivity, profile

    model = copy.deepcopy(reference).to(device="cuda", dtype=getattr(torch, dtype)).eval()
    ids = torch.zeros((1, 32), dtype=torch.long, device="cuda")
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
        step_ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        for _ in range(3):  # warm-up, on copies of the cache
            model(step_ids, past_key_values=copy.deepcopy(past), use_cache=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            start = time.perf_counter()
            model(step_ids, past_key_values=past, use_cache=True)
            host_ms = 1e3 * (time.perf_counter() - start)
            torch.cuda.synchronize()
    kernels = sum(
        1
        for event in trace.events()
        if event.device_type.name == "CUDA" and not event.name.startswith(("Memcpy", "Memset"))
    )
    return {"kernels": kernels, "host_ms": host_ms}


def minirt_host_profile(
    folder, dtype: str, batch: int, prompt_len: int, rounds: int = 20, backend: str = "cupy"
):
    """Where the host's time in a decode round goes: cProfile over `rounds` decode rounds of
    `GPT2.forward` (each rewound to the same KV length), the 15 largest self times, in ms a
    round, with calls a round."""
    import cProfile
    import pstats

    import minirt
    from minirt.model.batch import Batch

    model = minirt.load_model(folder, backend=backend, dtype=dtype)
    cache = model.new_kv_cache(n_slots=batch, capacity=prompt_len + 1)
    model.forward(Batch([[1] * prompt_len] * batch, model.backend), cache)
    past_lens = np.full(batch, prompt_len)

    def one_round():
        cache.lengths[:] = prompt_len
        logits = model.forward(Batch([[2]] * batch, model.backend, past_lens=past_lens), cache)
        return model.xp.argmax(logits, axis=-1)

    for _ in range(3):
        one_round()
    model.backend.synchronize()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(rounds):
        one_round()
    profiler.disable()
    model.backend.synchronize()
    total_ms = 1e3 * (time.perf_counter() - start) / rounds
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_cc, calls, self_s, _cum_s, _callers) in stats.stats.items():
        rows.append((self_s, f"{Path(file).name}:{line} {name}", calls))
    rows.sort(reverse=True)
    top = [
        {"where": where, "ms_a_round": 1e3 * self_s / rounds, "calls_a_round": calls / rounds}
        for self_s, where, calls in rows[:15]
    ]
    return {"round_ms_profiled": total_ms, "top_self_time": top}


def graph_replay(folder, dtype: str, batch: int, prompt_len: int, rounds: int = 50) -> dict:
    """How much of a decode round's host time a CUDA graph would save: one round of
    `GPT2.forward` and its argmax captured on a stream (cupy.cuda.Stream.begin_capture), then
    replayed, against the same round launched op by op. The round's upload (Batch) is made
    before capture and read by every replay; the KV length is the same each time (the host's
    bookkeeping of lengths is not replayed). An experiment for the next step, not a path minirt
    takes: the replayed picks must equal the eager ones."""
    import cupy

    import minirt
    from minirt.model.batch import Batch

    model = minirt.load_model(folder, backend="cupy", dtype=dtype)
    cache = model.new_kv_cache(n_slots=batch, capacity=prompt_len + 1)
    model.forward(Batch([[1] * prompt_len] * batch, model.backend), cache)
    past_lens = np.full(batch, prompt_len)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        round_batch = Batch([[2]] * batch, model.backend, past_lens=past_lens)

        def one_round():
            cache.lengths[:] = prompt_len
            return cupy.argmax(model.forward(round_batch, cache), axis=-1)

        for _ in range(3):  # warm-up on this stream: its memory pool holds every block
            eager_picks = one_round()
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            one_round()
        stream.synchronize()
        eager_ms = 1e3 * (time.perf_counter() - start) / rounds
        stream.begin_capture()
        graph_picks = one_round()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            graph.launch(stream)
        stream.synchronize()
        graph_ms = 1e3 * (time.perf_counter() - start) / rounds
    return {
        "eager_ms": eager_ms,
        "graph_ms": graph_ms,
        "picks_equal": bool((eager_picks.get() == graph_picks.get()).all()),
    }


def section_launches(args, deadline, state) -> dict:
    """What one launch costs the host on this machine, CuPy's and torch's alike (an add, a sum,
    a matmul, a fused chain), what transformers runs for a decode step, and where minirt's host
    time in a decode round goes. A round bound by its launches costs about kernels x the cost
    of one."""
    if args.backend != "cupy":
        return {"skipped": "numpy backend"}
    import cupy
    import torch

    from minirt.model.fusion import elementwise_chains

    out = {}
    a = cupy.ones((1, 768), dtype=cupy.float32)
    w = cupy.ones((768, 768), dtype=cupy.float32)
    gelu = elementwise_chains(cupy).gelu_tanh
    sync = cupy.cuda.Device().synchronize
    out["cupy_us"] = {
        "add": per_launch_us(lambda: a + a, sync),
        "sum": per_launch_us(lambda: a.sum(axis=-1, keepdims=True), sync),
        "max": per_launch_us(lambda: a.max(axis=-1, keepdims=True), sync),
        "matmul": per_launch_us(lambda: a @ w, sync),
        "fused_gelu": per_launch_us(lambda: gelu(a), sync),
    }
    ta = torch.ones((1, 768), device="cuda")
    tw = torch.ones((768, 768), device="cuda")
    tsync = torch.cuda.synchronize
    out["torch_us"] = {
        "add": per_launch_us(lambda: ta + ta, tsync),
        "sum": per_launch_us(lambda: ta.sum(dim=-1, keepdim=True), tsync),
        "max": per_launch_us(lambda: ta.amax(dim=-1, keepdim=True), tsync),
        "matmul": per_launch_us(lambda: ta @ tw, tsync),
    }
    if "folder" not in state:
        state["reference"] = make_checkpoint(args, Path(state["scratch"]) / "model")
        state["folder"] = Path(state["scratch"]) / "model"
    if state["reference"] is not None:
        out["transformers_decode_step"] = {
            dtype: transformers_kernels_per_step(state["reference"], dtype) for dtype in args.dtypes
        }
    out["minirt_host_profile"] = {
        dtype: minirt_host_profile(state["folder"], dtype, 1, args.prompt_len)
        for dtype in args.dtypes
    }
    # Last: a capture that fails may leave its stream unusable.
    out["graph_replay"] = {}
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            try:
                result = graph_replay(state["folder"], dtype, batch, args.prompt_len)
            except Exception as exc:  # noqa: BLE001 (an experiment: record why it failed)
                result = {"error": f"{type(exc).__name__}: {exc}"}
            out["graph_replay"][f"{dtype}_batch{batch}"] = result
    return out


def minirt_timer(args, folder, dtype, batch):
    """A function that times one `LLM.generate` of `batch` prompts (decode tokens/s, the
    prefill's round taken out), after one warm-up of the same call; and the LLM."""
    from minirt import LLM, SamplingParams

    llm = LLM(folder, backend=args.backend, dtype=dtype, batch_size=batch)
    V = llm.model.config.vocab_size
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, V, args.prompt_len).tolist() for _ in range(batch)]

    def timed(max_new_tokens: int) -> float:
        llm.model.backend.synchronize()
        start = time.perf_counter()
        llm.generate(
            prompts, SamplingParams(max_tokens=max_new_tokens, ignore_eos=True, temperature=0.0)
        )
        llm.model.backend.synchronize()
        return time.perf_counter() - start

    # Warm-up: the timed call itself, once (kernels compiled, the memory pool filled).
    timed(args.new_tokens)

    def measure() -> dict:
        prefill = timed(1)  # one round: the prefill alone
        seconds = timed(args.new_tokens)
        decode = max(seconds - prefill, 1e-9)
        return {
            "tokens_per_s": batch * args.new_tokens / seconds,  # end to end, prefill included
            "decode_tokens_per_s": batch * (args.new_tokens - 1) / decode,
            "step_ms": 1e3 * decode / max(args.new_tokens - 1, 1),  # one decode round
        }

    return measure, llm


def host_overhead(model, batch: int, args) -> dict:
    """CPU vs GPU time of one decode round at kv_len ~ prompt_len, from cupyx.profiler.benchmark.

    The round is enqueued without copying its result back, so cpu_ms is the host's
    time to prepare and launch it and gpu_ms the device's time to run it; a round is
    host-bound when cpu_ms > gpu_ms.
    """
    from cupyx.profiler import benchmark

    from minirt.model.batch import Batch

    cache = model.new_kv_cache(n_slots=batch, capacity=args.prompt_len + 1)
    model.forward(Batch([[1] * args.prompt_len] * batch, model.backend), cache)
    past_lens = np.full(batch, args.prompt_len)

    def one_round():
        cache.lengths[:] = args.prompt_len  # rewind, so every repeat is the same round
        logits = model.forward(
            Batch([[2]] * batch, model.backend, past_lens=past_lens), cache
        )  # [B, V]
        return model.xp.argmax(logits, axis=-1)  # stays on the device

    perf = benchmark(one_round, n_repeat=20, n_warmup=3)
    cpu_ms, gpu_ms = float(np.mean(perf.cpu_times)) * 1e3, float(np.mean(perf.gpu_times)) * 1e3
    return {"cpu_ms": cpu_ms, "gpu_ms": gpu_ms, "host_bound": cpu_ms > gpu_ms}


def transformers_timer(args, reference, dtype, batch):
    """A function that times one greedy `generate` of transformers (PyTorch eager) on the same
    weights and prompt shape, after one warm-up of the same call."""
    import copy

    import torch

    device = torch_device(args)
    # A copy: the fp32 original stays.
    model = copy.deepcopy(reference).to(device=device, dtype=getattr(torch, dtype)).eval()
    V = model.config.vocab_size
    ids = torch.as_tensor(
        np.random.default_rng(batch).integers(0, V, (batch, args.prompt_len)), device=device
    )
    kwargs = dict(
        do_sample=False,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        pad_token_id=0,
    )

    def timed() -> float:
        with torch.no_grad():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(ids, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
        return time.perf_counter() - start

    # Warm-up: the timed call itself, once (each new shape's first kernels, cuBLAS's choices).
    timed()

    def measure() -> dict:
        return {"tokens_per_s": batch * args.new_tokens / timed()}

    return measure


def median_and_range(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": float(np.median(ordered)), "min": ordered[0], "max": ordered[-1]}


def section_timing(args, deadline, state) -> dict:
    """Each dtype and batch size: minirt and transformers timed alternately, `--repeats` times
    each, in one process; medians with their ranges, and the median of the per-pair ratios."""
    if "folder" not in state:
        state["reference"] = make_checkpoint(args, Path(state["scratch"]) / "model")
        state["folder"] = Path(state["scratch"]) / "model"
    if state["reference"] is None:
        args.no_transformers = True
    out = {}
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            key = f"{dtype}_batch{batch}"
            if deadline.left() < 25:
                out[key] = "skipped: deadline"
                continue
            ours, llm = minirt_timer(args, state["folder"], dtype, batch)
            theirs = None
            if not args.no_transformers:
                theirs = transformers_timer(args, state["reference"], dtype, batch)
            runs = []
            for _ in range(args.repeats):
                runs.append((ours(), theirs() if theirs else None))
            mine = [run[0] for run in runs]
            row = {
                "minirt": {
                    name: median_and_range([m[name] for m in mine])["median"] for name in mine[0]
                },
                "minirt_tokens_per_s": median_and_range([m["tokens_per_s"] for m in mine]),
                "repeats": args.repeats,
            }
            if args.backend == "cupy":
                row["minirt"]["host_overhead"] = host_overhead(llm.model, batch, args)
            if theirs:
                speeds = [run[1]["tokens_per_s"] for run in runs]
                row["transformers"] = {"tokens_per_s": median_and_range(speeds)["median"]}
                row["transformers_tokens_per_s"] = median_and_range(speeds)
                ratios = [m["tokens_per_s"] / t for m, t in zip(mine, speeds, strict=True)]
                row["ratio"] = median_and_range(ratios)["median"]
                row["ratio_range"] = median_and_range(ratios)
            out[key] = row
            state["results"]["sections"]["timing"] = {"partial": True, **out}
            write_results(args, state["results"])
    return out


def section_floor(args, deadline, state) -> dict:
    import minirt

    timing = state["results"]["sections"].get("timing", {})
    if "folder" not in state:
        return {"skipped": "needs the timing section"}
    config = minirt.load_checkpoint(state["folder"]).config
    out = {}
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            row = timing.get(f"{dtype}_batch{batch}")
            if not isinstance(row, dict):
                continue
            kv_len = args.prompt_len + args.new_tokens / 2  # the average history a step reads
            step_bytes = weight_bytes_per_step(config, dtype) + kv_bytes_per_step(
                config, dtype, batch, kv_len
            )
            floor_ms = 1e3 * step_bytes / H200_BANDWIDTH
            out[f"{dtype}_batch{batch}"] = {
                "bytes_per_step": step_bytes,
                "floor_ms": floor_ms,
                "measured_step_ms": row["minirt"]["step_ms"],
                "fraction_of_floor": floor_ms / row["minirt"]["step_ms"],
            }
    return out


def run_two_rounds(model, batch: int, prompt_len: int, around=None) -> dict:
    """A prefill round of `batch` prompts, then a decode round, each ending with its greedy
    picks copied to the host (what the engine does with an all-greedy round). `around(name)`
    is a context manager that watches one round; what it yields is kept under the round's
    name."""
    from contextlib import nullcontext

    from minirt.model.batch import Batch

    cache = model.new_kv_cache(n_slots=batch, capacity=prompt_len + 1)
    watched = {}
    for name in ("prefill", "decode"):
        with around(name) if around else nullcontext() as watch:
            # The round's upload (Batch) is part of what is watched.
            if name == "prefill":
                round_batch = Batch([[1] * prompt_len] * batch, model.backend)
            else:
                past_lens = cache.lengths.copy()
                round_batch = Batch([[2]] * batch, model.backend, past_lens=past_lens)
            logits = model.forward(round_batch, cache)
            model.backend.to_numpy(model.xp.argmax(logits, axis=-1))
        watched[name] = watch
    return watched


def gpu_trace(name: str):
    """What the GPU ran inside the block, by torch.profiler's CUPTI trace (which records every
    kernel and copy of the process, CuPy's as much as torch's): kernels, host-to-device and
    device-to-host copies, memsets, and the ten most frequent kernel names."""
    from collections import Counter
    from contextlib import contextmanager

    import cupy
    from torch.profiler import ProfilerActivity, profile

    @contextmanager
    def watch():
        result = {}
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            yield result
            cupy.cuda.Device().synchronize()
        names = Counter()
        kinds = Counter()
        for event in trace.events():
            if event.device_type.name != "CUDA":
                continue
            label = event.name
            if label.startswith("Memcpy HtoD"):
                kinds["uploads"] += 1
            elif label.startswith("Memcpy DtoH"):
                kinds["downloads"] += 1
            elif label.startswith("Memcpy DtoD"):
                kinds["device_copies"] += 1
            elif label.startswith("Memset"):
                kinds["memsets"] += 1
            else:
                kinds["kernels"] += 1
                names[label[:60]] += 1
        result.update(
            {
                k: kinds.get(k, 0)
                for k in ("kernels", "uploads", "downloads", "device_copies", "memsets")
            }
        )
        result["top_kernels"] = names.most_common(10)
        if not kinds:  # the trace saw nothing: say what it did see, for the next session
            result["events_seen"] = [(e.name, e.device_type.name) for e in trace.events()][:20]

    return watch()


def section_counts(args, deadline, state) -> dict:
    """A prefill and a decode round of the timed shape (the first batch size, fp32 and fp16) on
    the strict stand-in: what the host asks of the device each round; on a GPU, beside it, what
    the GPU ran for the same two rounds (`gpu_trace`)."""
    from strict_cupy import StrictCuPy, strict_backend

    import minirt
    from minirt.model.gpt2 import GPT2

    if "folder" not in state:
        return {"skipped": "needs the timing section"}
    checkpoint = minirt.load_checkpoint(state["folder"])
    batch = args.batch_sizes[0]
    out = {"batch": batch, "n_layer": checkpoint.config.n_layer, "findings": []}
    for dtype in args.dtypes:
        stand_in = StrictCuPy()
        model = GPT2(checkpoint, strict_backend(stand_in), np.dtype(dtype))

        def counting(name, stand_in=stand_in):
            return stand_in.counting()

        counted = run_two_rounds(model, batch, args.prompt_len, around=counting)
        row = {}
        for name, counts in counted.items():
            row[name] = {
                "operations": counts.operations,
                "uploads": counts.uploads,
                "downloads": counts.downloads,
                "syncs": counts.syncs,
            }
        out["findings"] += [str(finding) for finding in stand_in.findings]
        if args.backend == "cupy" and not args.no_transformers:
            gpu_model = minirt.load_model(state["folder"], backend="cupy", dtype=dtype)
            run_two_rounds(gpu_model, batch, args.prompt_len)  # compile every kernel first
            traced = run_two_rounds(gpu_model, batch, args.prompt_len, around=gpu_trace)
            for name, seen in traced.items():
                row[name]["gpu"] = seen
        out[dtype] = row
    # The first dtype's rows, where the summary table and older readers look for them.
    out.update(out[args.dtypes[0]])
    return out


SECTIONS = {
    "environment": section_environment,
    "gpu_tests": section_gpu_tests,
    "correctness": section_correctness,
    "greedy": section_greedy,
    "timing": section_timing,
    "floor": section_floor,
    "counts": section_counts,
    "launches": section_launches,
}
MIN_SECONDS = {
    "environment": 5,
    "gpu_tests": 60,
    "correctness": 30,
    "greedy": 20,
    "timing": 60,
    "floor": 1,
    "counts": 5,
    "launches": 30,
}


def write_results(args, results) -> None:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, default=str)
    os.replace(tmp, args.out)


def spread(values: dict | None) -> str:
    """A median's range as 'min-max', or '' where there is none."""
    if not values:
        return ""
    return f"{values['min']:.2f}-{values['max']:.2f}"


def summary_table(results) -> str:
    lines = ["section       status"]
    for name, value in results["sections"].items():
        status = (
            value
            if isinstance(value, str)
            else ("error: " + value["error"] if "error" in value else "ok")
        )
        lines.append(f"{name:13s} {status}")
    timing = results["sections"].get("timing", {})
    floor = results["sections"].get("floor", {})
    if isinstance(timing, dict):
        lines.append("")
        lines.append(
            f"{'dtype':8s} {'batch':>5s} {'minirt tok/s':>13s} {'transformers':>13s} {'ratio':>6s} "
            f"{'floor frac':>10s} {'ratio range':>12s}"
        )
        for key, row in timing.items():
            if not isinstance(row, dict) or "minirt" not in row:
                continue
            dtype, batch = key.split("_batch")
            theirs = row.get("transformers", {}).get("tokens_per_s", float("nan"))
            frac = (
                floor.get(key, {}).get("fraction_of_floor", float("nan"))
                if isinstance(floor, dict)
                else float("nan")
            )
            lines.append(
                f"{dtype:8s} {int(batch):5d} {row['minirt']['tokens_per_s']:13.1f} {theirs:13.1f} "
                f"{row.get('ratio', float('nan')):6.2f} {frac:10.1%} "
                f"{spread(row.get('ratio_range')):>12s}"
            )
    greedy = results["sections"].get("greedy", {})
    if isinstance(greedy, dict) and "no_clear_parting" in greedy:
        lines.append("")
        lines.append(f"greedy against transformers, {greedy['new_tokens']} tokens a prompt:")
        for key, row in greedy.items():
            if isinstance(row, dict) and "partings" in row:
                lines.append(
                    f"  {key:16s} {row['prompts_identical']}/{row['prompts']} prompts identical, "
                    f"{row['tokens_equal_before_parting']}/{row['tokens']} tokens before a parting, "
                    f"{row['clear_partings']} clear partings"
                )
    if isinstance(timing, dict):
        hosts = [
            (key, row["minirt"]["host_overhead"])
            for key, row in timing.items()
            if isinstance(row, dict) and "host_overhead" in row.get("minirt", {})
        ]
        if hosts:
            lines.append("")
            lines.append("one decode round, host (launch) time beside device time:")
            for key, host in hosts:
                lines.append(
                    f"  {key:16s} cpu {host['cpu_ms']:7.3f} ms  gpu {host['gpu_ms']:7.3f} ms"
                )
    counts = results["sections"].get("counts", {})
    if isinstance(counts, dict) and "decode" in counts:
        lines.append("")
        lines.append(
            f"per round, batch {counts['batch']}: the strict stand-in [and the GPU's trace]"
        )
        for dtype in (
            key for key, row in counts.items() if isinstance(row, dict) and "decode" in row
        ):
            for name in ("prefill", "decode"):
                row = counts[dtype][name]
                line = (
                    f"  {dtype:8s} {name:8s} {row['operations']:5d} operations, "
                    f"{row['uploads']} upload, {row['downloads']} download, {row['syncs']} sync"
                )
                gpu = row.get("gpu")
                if gpu:
                    line += (
                        f"  [{gpu['kernels']} kernels, {gpu['uploads']} uploads, "
                        f"{gpu['downloads']} downloads, {gpu['memsets']} memsets]"
                    )
                lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    deadline = Deadline(args.deadline)
    results = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": {}}
    with tempfile.TemporaryDirectory() as scratch:
        state = {"scratch": scratch, "results": results}
        for name in args.sections:
            if deadline.left() < MIN_SECONDS[name]:
                results["sections"][name] = "skipped: deadline"
            else:
                start = time.perf_counter()
                try:
                    results["sections"][name] = SECTIONS[name](args, deadline, state)
                # Any failure is recorded, and the later sections still run.
                except Exception as exc:  # noqa: BLE001
                    results["sections"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                if isinstance(results["sections"][name], dict):
                    results["sections"][name].pop("partial", None)
                    results["sections"][name]["seconds"] = round(time.perf_counter() - start, 1)
            write_results(args, results)
            print(f"[{name}] done, {deadline.left():.0f} s left", flush=True)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_results(args, results)
    print(summary_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
