"""minirt beside llama.cpp (f32 weights, CPU, 2 threads) on the same GPT-2 or Llama checkpoint.

  build DIR       pip-downloads the llama-cpp-python sdist (LLAMA_CPP_PYTHON, sources only) into DIR,
                  unpacks it and builds its vendored llama.cpp (vendor/llama.cpp) with cmake: CPU only,
                  Release, GGML_NATIVE, no CURL/OpenSSL, only TARGETS, -j2, under nice.  Each step is
                  skipped when its output is there.  The sdist has no git metadata: the llama.cpp commit
                  is read from its CHANGELOG and compiled in as the build commit.  ~5.5 min on 2 cores.
  convert M OUT   the vendored convert_hf_to_gguf.py --outtype f32, vendored gguf-py on PYTHONPATH; the
                  project's venv has all it needs (torch, transformers, numpy, tqdm, pyyaml; if yours
                  lacks one, pip install it).  Its GPT-2 reads config.json's n_ctx, which transformers
                  >= 5 no longer writes, so it reads a staging folder of links with n_ctx added.
                  `--shape smollm2-135m` (convert and compare): a random model in that shape with
                  GPT-2's vocabulary (50257 tokens instead of its own 49152; tools/fixtures/
                  reference.py make-shape --gpt2-vocab), made once in /tmp/SHAPE-gpt2vocab, and
                  its GGUF /tmp/SHAPE-gpt2vocab-f32.gguf: the correctness check below reads text
                  pieces of a byte-level vocabulary, and the converter needs a tokenizer.
                  The converter's Llama path imports sentencepiece before it looks for a
                  tokenizer.model: `pip install sentencepiece` (no model of it is used).
  compare         first a correctness check, then each workload on both sides, alternating, --repeats
                  times; medians and min-max, and the ratio of medians (min-max of back-to-back pairs):

    correctness  prompt ids of --text from llama-tokenize vs minirt's tokenizer, then --check-tokens greedy
                 tokens.  llama-simple prints pieces, not ids, so it runs once per length k = 1..n; the bytes
                 run k adds are token k, mapped to its id through the vocabulary (GPT-2's byte-level pieces
                 are unique).  llama-simple uses llama.cpp's default context (f16 KV cache).
    pp512        one 512-token random prompt, logits of its last token only, prompt tokens/s.  llama.cpp:
                 `llama-bench -p 512 -n 0 -r 3` (its KV cache is f16: llama-bench takes no f32 cache type;
                 the mean of --pp-runs runs) and `llama-batched-bench -npp 512 -ntg 1 -npl 1 -ctk f32 -ctv
                 f32` (S_PP, one run).  minirt, the median of --pp-runs runs of:
                 LLM.generate of that prompt with max_new_tokens=1, i.e. one round: the prefill forward
                 into a fresh KV cache and the greedy pick.
    decode       B = 1, 8, 32 parallel sequences, each with its own 128-token random prompt, then 128
                 decode steps of B tokens (one per sequence).  llama.cpp: `llama-batched-bench -npp 128
                 -ntg 128 -npl 1,8,32 -ctk f32 -ctv f32`, S_TG = B*128 / time of the 128 steps.  minirt: the
                 B prompts as one static group (batch_size B), max_new_tokens=129, ignore_eos; round 1 is
                 the prefill (it makes token 1), rounds 2..129 the 128 decode steps, timed from the end of
                 round 1 to the end of round 129 (each LLM.steps step): B*128 / that time.  Same KV
                 positions (128..255) on both sides; minirt's rounds also pick tokens greedily and
                 detokenise, llama-batched-bench samples nothing.

llama.cpp runs with its defaults otherwise: flash attention "auto" (it resolves to on, FLASH_ATTN_EXT,
on this CPU), n_batch 2048, n_ubatch 512, its own warm-up run per call.  --kv-type f16 and
--flash-attn off change llama-batched-bench's cache and -fa (f32 K/V with flash attention is its slow
decode path here: 32 sequences ran at ~190 tok/s, ~270 with -fa off, ~310 with f16 K/V).  Both sides get --threads
threads (-t for llama.cpp; OPENBLAS_NUM_THREADS for NumPy).  The timed work shares the CPU with other
benchmarks, so run compare under the bench lock (the build takes none; it runs under nice -n 10):

    python tools/bench/llama_cpp.py build /tmp/llama-cpp
    python tools/fixtures/reference.py make-124m /tmp/gpt2-124m-random    # if missing (compare/convert do it too)
    python tools/bench/llama_cpp.py convert /tmp/gpt2-124m-random /tmp/gpt2-124m-random-f32.gguf
    flock /tmp/bench.lock python tools/bench/llama_cpp.py compare --model /tmp/gpt2-124m-random \\
        --gguf /tmp/gpt2-124m-random-f32.gguf --llama-dir /tmp/llama-cpp --repeats 3

The BLAS kernel: compare runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default, so that NumPy's
OpenBLAS picks its kernel as on a user's machine; `--blas-env keep` keeps them as this machine sets them
(tools/bench/blas_env.py).  compare prints the kernel above its table.  (llama.cpp's own kernels are
compiled for this CPU, GGML_NATIVE, and read neither variable.)

compare exits 1 when the greedy tokens differ.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist vendoring llama.cpp ggml-org/llama.cpp@0c1e57098
TARGETS = ("llama-bench", "llama-batched-bench", "llama-simple", "llama-tokenize", "llama-server")
REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env  # noqa: E402 (after its folder is on the path)


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """A subprocess that must succeed within `timeout` seconds; stdout (and stderr) captured unless redirected."""
    kwargs.setdefault("capture_output", True)
    return subprocess.run([str(c) for c in cmd], check=True, timeout=timeout, **kwargs)


def source_dir(root: Path) -> Path:
    return root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def vendored_commit(root: Path) -> str | None:
    """The llama.cpp commit the sdist's CHANGELOG names under this release, if any."""
    changelog = (root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "CHANGELOG.md").read_text()
    section = changelog.split(f"## [{LLAMA_CPP_PYTHON}]", 1)[-1].split("\n## [", 1)[0]
    found = re.search(r"ggml-org/llama\.cpp@([0-9a-f]{7,40})", section)
    return found.group(1) if found else None


def cmd_build(args) -> int:
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    sdist, src = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz", source_dir(root)
    start = time.perf_counter()
    if not sdist.is_file():
        print(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON} (sources) into {root}", flush=True)
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                "-d",
                root,
            ],
            timeout=1200,
            capture_output=False,
        )
    if not (src / "CMakeLists.txt").is_file():
        print(f"extracting {sdist.name}", flush=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(root, filter="data")
    commit = vendored_commit(root)
    build = src / "build"
    if not (build / "CMakeCache.txt").is_file():
        flags = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DGGML_CUDA=OFF",
            "-DGGML_METAL=OFF",
            "-DGGML_VULKAN=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_SERVER=ON",  # llama-server: tools/serve_bench.py
            f"-DLLAMA_BUILD_COMMIT={commit or 'unknown'}",
        ]
        run(
            ["nice", "-n", "10", "cmake", "-S", src, "-B", build, *flags],
            timeout=900,
            capture_output=False,
        )
    run(
        ["nice", "-n", "10", "cmake", "--build", build, "--target", *TARGETS, "-j2"],
        timeout=4 * 3600,
        capture_output=False,
    )  # make skips what is up to date
    version = run([build / "bin" / "llama-bench", "--version"], timeout=60)
    print(
        f"\nbuilt {', '.join(TARGETS)} in {build / 'bin'} ({time.perf_counter() - start:.0f} s this run)"
    )
    print(
        f"llama-cpp-python {LLAMA_CPP_PYTHON} vendors ggml-org/llama.cpp@{commit or '? (not in its CHANGELOG)'}; "
        f"--version: {(version.stdout + version.stderr).decode().strip()}"
    )
    return 0


SHAPES = ("smollm2-135m", "qwen2.5-0.5b")  # tools/fixtures/reference.py's, by name


def ensure_model(folder: Path, shape: str | None = None) -> Path:
    """The checkpoint folder, made if missing: a random gpt2-124M, or with `shape`, a random model
    in that shape with GPT-2's vocabulary."""
    if not (folder / "config.json").is_file():
        what = f"a random {shape} with GPT-2's vocabulary" if shape else "the random gpt2-124M"
        print(f"{folder} is missing: making {what} there", flush=True)
        make = ["make-shape", shape, folder, "--gpt2-vocab"] if shape else ["make-124m", folder]
        run([sys.executable, REPO / "tools" / "fixtures" / "reference.py", *make], timeout=900)
    return folder


def shape_defaults(args) -> None:
    """--model and --gguf left out: /tmp/gpt2-124m-random(-f32.gguf), or with --shape,
    /tmp/SHAPE-gpt2vocab(-f32.gguf)."""
    stem = f"/tmp/{args.shape}-gpt2vocab" if args.shape else "/tmp/gpt2-124m-random"
    if getattr(args, "model", None) is None:
        args.model = Path(stem)
    if getattr(args, "gguf", "absent") is None:
        args.gguf = Path(f"{stem}-f32.gguf")


def cmd_convert(args) -> int:
    """The converter's GPT-2 reads config.json's n_ctx, which transformers >= 5 no longer writes: it is given a
    staging folder of links to the checkpoint's files with n_ctx (= n_positions) added to config.json
    (a Llama-family config, without n_positions, is left as it is)."""
    src = source_dir(args.llama_dir.resolve())
    model = ensure_model(args.model.resolve(), args.shape)
    paths = [str(src / "gguf-py"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    with tempfile.TemporaryDirectory(prefix="gguf-staging-") as staging:
        for file in model.iterdir():
            if file.name != "config.json":
                (Path(staging) / file.name).symlink_to(file)
        config = json.loads((model / "config.json").read_text())
        if "n_positions" in config:  # GPT-2
            config = {"n_ctx": config["n_positions"], **config}
        (Path(staging) / "config.json").write_text(json.dumps(config, indent=2))
        run(
            [
                sys.executable,
                src / "convert_hf_to_gguf.py",
                staging,
                "--outtype",
                "f32",
                "--outfile",
                args.out,
            ],
            timeout=1800,
            env=env,
            capture_output=False,
        )
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB)")
    return 0


# ---------------------------------------------------------------------------- compare


def llama_prompt_ids(bin_dir: Path, gguf: Path, text: str) -> list[int]:
    out = run(
        [
            bin_dir / "llama-tokenize",
            "-m",
            gguf,
            "-p",
            text,
            "--ids",
            "--no-escape",
            "--log-disable",
        ],
        timeout=120,
    )
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def llama_greedy_ids(
    bin_dir: Path, gguf: Path, text: str, n: int, piece_ids: dict[bytes, int], eos: int
) -> list[int]:
    """llama-simple's greedy tokens: run k (k = 1..n) prints the prompt, k new pieces and a newline; the
    bytes run k adds to run k-1 are token k.  Nothing added means it stopped at end-of-text."""
    prompt, ids, previous = text.encode(), [], b""
    for k in range(1, n + 1):
        out = run([bin_dir / "llama-simple", "-m", gguf, "-n", k, text], timeout=300).stdout
        if not (out.startswith(prompt) and out.endswith(b"\n")):
            raise SystemExit(
                f"llama-simple printed {out[:200]!r}..., not the prompt followed by its continuation"
            )
        generated = out[len(prompt) : -1]
        piece = generated[len(previous) :]
        if not piece:
            return ids + [eos]
        if not generated.startswith(previous) or piece not in piece_ids:
            raise SystemExit(
                f"llama-simple's run {k} added {piece!r} to run {k - 1}: not one vocabulary piece"
            )
        ids.append(piece_ids[piece])
        previous = generated
    return ids


def llama_pp(
    bin_dir: Path, gguf: Path, n_prompt: int, runs: int, flags: list
) -> tuple[float, dict]:
    """llama-bench's prompt tok/s: the mean of `runs` repetitions (its -r), and its record."""
    out = run(
        [
            bin_dir / "llama-bench",
            "-m",
            gguf,
            "-p",
            n_prompt,
            "-n",
            0,
            "-r",
            runs,
            *flags,
            "-o",
            "json",
        ],
        timeout=600,
    )
    result = json.loads(out.stdout)[0]
    return result["avg_ts"], result


def llama_batched(
    bin_dir: Path, gguf: Path, n_prompt: int, n_gen: int, batches: list[int], flags: list
) -> dict:
    """llama-batched-bench's result row (S_PP, S_TG, ...) for each number of parallel sequences."""
    n_ctx = max(batches) * (
        n_prompt + n_gen
    )  # every sequence's own prompt and generation fit in the KV cache
    out = run(
        [
            bin_dir / "llama-batched-bench",
            "-m",
            gguf,
            "-c",
            n_ctx,
            "-npp",
            n_prompt,
            "-ntg",
            n_gen,
            "-npl",
            ",".join(map(str, batches)),
            *flags,
            "--output-format",
            "jsonl",
        ],
        timeout=1800,
    )
    lines = (out.stdout + out.stderr).decode().splitlines()
    rows = {row["pl"]: row for row in (json.loads(line) for line in lines if line.startswith("{"))}
    if sorted(rows) != sorted(batches):
        raise SystemExit(
            f"llama-batched-bench measured {sorted(rows)} parallel sequences, not {batches}"
        )
    return rows


def minirt_pp(llm, prompt: list[int], runs: int) -> float:
    """One round, `runs` times: the prefill of one prompt into a fresh KV cache, and the greedy pick
    of its first token; prompt tok/s, the median of the runs (one run varies by up to 2x here)."""
    from minirt import SamplingParams

    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0))
        rates.append(len(prompt) / (time.perf_counter() - start))
    return statistics.median(rates)


def minirt_decode(llm, prompts: list[list[int]], n_gen: int) -> float:
    """Decode tokens / s of one static group: n_gen decode rounds after the prefill round, timed between the
    end of round 1 and the end of round n_gen + 1."""
    from minirt import SamplingParams

    params = SamplingParams(max_tokens=n_gen + 1, ignore_eos=True, temperature=0.0)
    requests = [llm.make_request(i, p, params) for i, p in enumerate(prompts)]
    round_ends: dict[int, float] = {}
    with llm.steps(requests) as steps:
        for step in steps:
            if step.round_number is not None:
                round_ends[step.round_number] = time.perf_counter()
    assert all(len(r.token_ids) == n_gen + 1 for r in requests) and max(round_ends) == n_gen + 1
    return len(prompts) * n_gen / (round_ends[n_gen + 1] - round_ends[1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def cmd_compare(args) -> int:
    # Before NumPy loads: the chosen BLAS environment (a fresh process), then the threads.
    blas_env.run_under(args.blas_env)
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, str(REPO))
    import numpy as np

    from minirt import LLM, SamplingParams, load_checkpoint

    bin_dir = source_dir(args.llama_dir.resolve()) / "build" / "bin"
    checkpoint = load_checkpoint(ensure_model(args.model, args.shape))
    llms = {
        b: LLM(checkpoint, backend="numpy", dtype="float32", batch_size=b)
        for b in {1, *args.batches}
    }
    llm = llms[1]
    vocab, eos = llm.model.config.vocab_size, llm.tokenizer.eos_token_id
    rng = np.random.default_rng(args.seed)
    print(
        f"model {args.model}: {llm.model.n_params / 1e6:.0f}M parameters, float32; gguf {args.gguf}; "
        f"llama.cpp {vendored_commit(args.llama_dir.resolve())} (llama-cpp-python {LLAMA_CPP_PYTHON}); "
        f"{args.threads} threads each\nminirt's {blas_env.report()}\n",
        flush=True,
    )

    ours_prompt, theirs_prompt = (
        llm.prompt_ids(args.text),
        llama_prompt_ids(bin_dir, args.gguf, args.text),
    )
    piece_ids = {llm.tokenizer.token_bytes(i): i for i in range(vocab)}
    greedy = SamplingParams(max_tokens=args.check_tokens, temperature=0.0)
    ours = llm.generate([args.text], greedy)[0].outputs[0].token_ids
    theirs = llama_greedy_ids(bin_dir, args.gguf, args.text, args.check_tokens, piece_ids, eos)
    print(
        f"prompt {args.text!r}: ids {'equal' if ours_prompt == theirs_prompt else 'DIFFER'} "
        f"(minirt {ours_prompt}, llama.cpp {theirs_prompt})"
    )
    print(f"greedy, {args.check_tokens} new tokens:\n  minirt    {ours}\n  llama.cpp {theirs}")
    print(
        f"  {'MATCH' if ours == theirs else 'MISMATCH'}: {llm.tokenizer.decode(ours)!r}\n",
        flush=True,
    )

    pp_prompt = rng.integers(0, vocab, size=args.pp).tolist()
    decode_prompts = {b: rng.integers(0, vocab, size=(b, args.npp)).tolist() for b in args.batches}
    for b in llms:  # warm-up (the llama.cpp tools warm up on their own)
        minirt_decode(llms[b], [pp_prompt[: args.npp]] * b, 2)
    flags = [
        "-t",
        args.threads,
        "-fa",
        args.flash_attn,
    ]  # llama-bench takes no f32 KV cache: its own is f16
    batched_flags = [*flags, "-ctk", args.kv_type, "-ctv", args.kv_type]
    pp_names = (
        f"pp{args.pp}, llama-bench (f16 KV)",
        f"pp{args.pp}, llama-batched-bench ({args.kv_type} KV)",
    )
    rows: dict[str, tuple[list[float], list[float]]] = {
        name: ([], []) for name in (*pp_names, *(f"decode, {b} seq" for b in args.batches))
    }

    def add(name: str, theirs: float, ours: float) -> None:
        rows[name][0].append(theirs)
        rows[name][1].append(ours)

    for repeat in range(args.repeats):  # each repeat: llama.cpp, then minirt, workload by workload
        bench_pp, info = llama_pp(bin_dir, args.gguf, args.pp, args.pp_runs, flags)
        batched_pp = llama_batched(bin_dir, args.gguf, args.pp, 1, [1], batched_flags)[1][
            "speed_pp"
        ]
        ours_pp = minirt_pp(llm, pp_prompt, args.pp_runs)
        add(pp_names[0], bench_pp, ours_pp)
        add(pp_names[1], batched_pp, ours_pp)
        batched = llama_batched(bin_dir, args.gguf, args.npp, args.ntg, args.batches, batched_flags)
        for b in args.batches:
            add(
                f"decode, {b} seq",
                batched[b]["speed_tg"],
                minirt_decode(llms[b], decode_prompts[b], args.ntg),
            )
        print(
            f"repeat {repeat + 1}/{args.repeats} (llama.cpp vs minirt, tok/s): "
            + ", ".join(f"{name} {a[-1]:.1f} vs {m[-1]:.1f}" for name, (a, m) in rows.items()),
            flush=True,
        )

    print(
        f"\nllama.cpp: flash attention {args.flash_attn}, batched-bench KV {args.kv_type}, "
        f"n_batch {info['n_batch']}, n_ubatch {info['n_ubatch']}, cpu {info['cpu_info']}.  "
        f"pp: one {args.pp}-token prompt, prompt tok/s (llama-bench: the mean of {args.pp_runs} runs, "
        f"minirt: their median; llama-batched-bench: one run); "
        f"decode: {args.npp}-token prompts, {args.ntg} decode steps, decode tok/s.  "
        f"Medians of {args.repeats} (min-max).\n"
    )
    print("| workload | llama.cpp | minirt | minirt/llama.cpp |")
    print("|---|---|---|---|")
    for name, (theirs_all, ours_all) in rows.items():
        ratios = [
            o / t for o, t in zip(ours_all, theirs_all, strict=True)
        ]  # each pair measured back to back
        print(
            f"| {name} | {summary(theirs_all)} | {summary(ours_all)} | "
            f"{statistics.median(ours_all) / statistics.median(theirs_all):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    return 0 if ours == theirs else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "build", help="download llama-cpp-python's sdist and build its vendored llama.cpp"
    )
    p.add_argument("dir", type=Path, help="where the sdist goes and is built (e.g. /tmp/llama-cpp)")
    p.set_defaults(func=cmd_build)
    p = sub.add_parser(
        "convert", help="convert a Hugging Face GPT-2 or Llama-family folder to an f32 GGUF"
    )
    p.add_argument(
        "model",
        type=Path,
        help="checkpoint folder (made with tools/fixtures/reference.py make-124m, or make-shape "
        "--gpt2-vocab with --shape, if missing)",
    )
    p.add_argument("out", type=Path, help="the .gguf file to write")
    p.add_argument(
        "--llama-dir",
        type=Path,
        default=Path("/tmp/llama-cpp"),
        help="the build DIR (default: that)",
    )
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser(
        "compare",
        help="greedy tokens, then pp512 and decode speeds, llama.cpp beside minirt "
        "(run it under flock /tmp/bench.lock)",
    )
    p.add_argument(
        "--model",
        type=Path,
        help="checkpoint folder (default /tmp/gpt2-124m-random, or /tmp/SHAPE-gpt2vocab)",
    )
    p.add_argument("--gguf", type=Path, help="its f32 GGUF (default: the folder's name -f32.gguf)")
    p.add_argument("--llama-dir", type=Path, default=Path("/tmp/llama-cpp"), help="the build DIR")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per side (default 3)")
    p.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    p.add_argument(
        "--kv-type",
        choices=["f32", "f16"],
        default="f32",
        help="llama-batched-bench's KV cache (default f32, as minirt's; f16 is llama.cpp's default)",
    )
    p.add_argument(
        "--flash-attn",
        choices=["auto", "on", "off"],
        default="auto",
        help="llama.cpp's -fa (default auto, llama.cpp's default: on here)",
    )
    p.add_argument("--pp", type=int, default=512, help="prompt-processing length (default 512)")
    p.add_argument(
        "--pp-runs",
        type=int,
        default=3,
        help="prefills per repeat: llama-bench's -r, minirt's median of as many (default 3)",
    )
    p.add_argument(
        "--npp", type=int, default=128, help="decode: prompt tokens per sequence (default 128)"
    )
    p.add_argument(
        "--ntg", type=int, default=128, help="decode: decode steps per sequence (default 128)"
    )
    p.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=[1, 8, 32],
        help="parallel sequences (default 1 8 32)",
    )
    p.add_argument("--text", default="Hello, my name is", help="the correctness check's prompt")
    p.add_argument(
        "--check-tokens", type=int, default=32, help="greedy tokens compared (default 32)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    blas_env.add_blas_env_argument(p)
    p.set_defaults(func=cmd_compare)
    for p in (sub.choices["convert"], sub.choices["compare"]):
        p.add_argument(
            "--shape",
            choices=SHAPES,
            help="a random model in this shape with GPT-2's vocabulary (made if missing)",
        )
    args = parser.parse_args()
    shape_defaults(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
