"""Serving under load, side by side: `minirt serve` (continuous batching), llama.cpp's own `llama-server`, and
`minirt serve --policy static`, each fed the same Poisson stream of streaming completions through the `openai`
client, in alternating runs.

    python tools/bench/llama_cpp.py build /tmp/llama-cpp        # llama-server among its targets
    python tools/fixtures/reference.py make-124m /tmp/gpt2-124m-random
    python tools/bench/llama_cpp.py convert /tmp/gpt2-124m-random /tmp/gpt2-124m-random-f32.gguf
    flock /tmp/bench.lock python tools/bench/serve_bench.py --model /tmp/gpt2-124m-random \\
        --gguf /tmp/gpt2-124m-random-f32.gguf --llama-dir /tmp/llama-cpp --repeats 3

The load: --requests completions (default 128), prompts of random token ids with lengths drawn uniformly from
--prompt-lens (32:512), --max-tokens new tokens each (64, or drawn uniformly from a span such as 8:128; with
ignore_eos, so every request makes exactly its number on every server), arriving as a Poisson process at --rate requests/s (the gaps drawn from an exponential
distribution, seeded: every run and every side gets the same arrivals and prompts), sent by --clients client
threads (16), each with its own openai client, streaming, stream_options.include_usage.  Bounded: at most
--requests requests, and a run is cut off after --max-seconds (what had not finished counts as failed);
servers bind to 127.0.0.1 only.

Each request records when it was sent, its first streamed chunk (time to first token), its last (time per
output token = (last - first) / (tokens - 1)), and its token count from the usage.  A run reports:

    throughput   generated tokens / the run's wall time (first send to last finish)
    TTFT         p50 and p99 of time to first token, seconds (queue time included)
    TPOT         p50 and p99 of time per output token, seconds
    busy rows    the requests in flight on average, sum of end-to-end times / wall time (Little's law):
                 the rate is right when this is about the servers' 8 rows
    failures     requests that errored, were cut off, or made fewer than --max-tokens tokens

The servers, each with --threads threads (2) and 8 rows:
    minirt       python -m minirt.serve --model M --batch-size 8 (continuous batching, its defaults otherwise)
    llama        llama-server -m GGUF --parallel 8 -c 8192 (1024 positions a slot, the model's context)
                 -ctk f32 -ctv f32 -t THREADS (continuous batching is its default; flash attention its "auto")
    static       python -m minirt.serve --model M --batch-size 8 --policy static
    watched      as minirt, with a round-grid page's feed open all along (GET /rounds/events, read by a thread)
    baseline     as minirt, but run from another checkout (--baseline-tree DIR, e.g. a `git worktree` of an
                 earlier commit): what a change costs, side by side
    chunked      as minirt, with --max-round-tokens --chunk-tokens (256): a long prompt is fed in chunks
                 beside the decoding rows
    unchunked    as minirt, with --no-chunked-prefill: each prompt is fed whole in one round
    invariant    as minirt, with --batch-invariant (exact batch invariance): what it costs under load
    ray1, ray2   as minirt, with --replicas 1 (2): the engine in Ray Serve replicas behind the same
                 server, each replica --threads threads: what the Ray path costs, and what a
                 second replica gives on the same cores
    ray2-pow2    as ray2, with --prefix-cache (each replica its own cache), routed by power of two
                 choices
    ray2-prefix  as ray2-pow2, routed with --routing prefix (each prefix to the replica that holds it)

Prompts that share prefixes (prefix caching, prefix routing): --shared-prefixes K draws K random
prefixes of --prefix-len tokens (256); each prompt is one of them, drawn at random, followed by its
own random tokens (their number drawn from --prompt-lens).  The table then adds the cached share:
the prompt tokens the usage reports as cached (prompt_tokens_details.cached_tokens) over all prompt
tokens.  Prefix routing against power of two choices on 2 replicas:

    flock /tmp/bench.lock python tools/bench/serve_bench.py --model weights/shakespeare-gpt2-tiny \
        --sides ray2-pow2,ray2-prefix --threads 1 --shared-prefixes 4 --prefix-len 256 \
        --prompt-lens 16:64 --max-tokens 32 --requests 96 --rate 8 --repeats 3

Long prompts beside decoding rows (chunked prefill): --long-prompts N more requests of --long-prompt-len
tokens (1000) and --long-max-tokens new tokens (4), arriving as their own Poisson process at --long-rate
per second from the start.  The table then adds, for the main (decoding) requests alone, the p99 of
their per-request TPOT and the p99 of their inter-token gaps (each streamed chunk's time since the one
before: what a reader of the stream waits for a token; vLLM's ITL):

    flock /tmp/bench.lock python tools/bench/serve_bench.py --sides unchunked,chunked --rows 12 \
        --requests 8 --rate 1000 --prompt-lens 16:32 --max-tokens 160 \
        --long-prompts 12 --long-prompt-len 1000 --long-rate 0.5 --clients 24 --repeats 3

What the round grid costs with no page open:
    git worktree add /tmp/minirt-before COMMIT_BEFORE_THE_PAGE
    flock /tmp/bench.lock python tools/bench/serve_bench.py --model weights/shakespeare-gpt2-tiny \\
        --sides minirt,baseline,watched --baseline-tree /tmp/minirt-before --requests 256 --rate 40 \\
        --prompt-lens 16:128 --repeats 5

Both run the same f32 arithmetic on the same random gpt2-124M (llama.cpp's f32 GGUF of it), with f32 KV caches.
Each repeat runs the sides in turn (minirt, llama, static, then again); the table gives each figure's median over
the repeats with its min-max, and the ratios of medians.

The BLAS kernel: run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default (`--blas-env unset`, the kernel
NumPy's OpenBLAS picks on a user's machine); the minirt servers inherit it.  The kernel is printed above the
table.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py, llama_cpp.py

import blas_env
from llama_cpp import ensure_model, source_dir

REPO = Path(__file__).resolve().parent.parent.parent
SIDES = (
    "minirt", "llama", "static", "watched", "baseline", "chunked", "unchunked", "invariant",
    "ray1", "ray2", "ray2-pow2", "ray2-prefix",
)  # fmt: skip
# The sides served by Ray Serve replicas: their --replicas, and their other flags.
REPLICA_SIDES = {
    "ray1": ["--replicas", "1"],
    "ray2": ["--replicas", "2"],
    "ray2-pow2": ["--replicas", "2", "--prefix-cache"],
    "ray2-prefix": ["--replicas", "2", "--prefix-cache", "--routing", "prefix"],
}
# The sides run when --sides is not given.
DEFAULT_SIDES = ("minirt", "llama", "static")
ROWS = 8
READY_TIMEOUT_S = 180.0


@dataclass
class Outcome:
    """One request's times (seconds from the run's start) and tokens."""

    sent: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    error: str | None = None
    # A main request, or one of --long-prompts.
    long: bool = False
    # Seconds between consecutive streamed chunks.
    gaps: list[float] = field(default_factory=list)
    # The usage's prompt tokens, and how many of them it reports as cached.
    prompt_tokens: int = 0
    cached_tokens: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def span(text: str) -> tuple[int, int]:
    """'64' or '8:128' as (low, high)."""
    low, _, high = text.partition(":")
    return int(low), int(high or low)


def workload(args, vocab_size: int) -> list[tuple[float, list[int], int]]:
    """(arrival in seconds, prompt token ids, new tokens) per request: Poisson arrivals, prompt
    lengths and new tokens uniform in their spans."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    low, high = span(args.prompt_lens)
    gaps = rng.exponential(1.0 / args.rate, size=args.requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    lengths = rng.integers(low, high + 1, size=args.requests)
    fewest, most = span(args.max_tokens)
    new_tokens = rng.integers(fewest, most + 1, size=args.requests)
    # Below the last id, which GPT-2 gives <|endoftext|>.
    prefixes = [
        rng.integers(0, vocab_size - 1, size=args.prefix_len).tolist()
        for _ in range(args.shared_prefixes)
    ]
    work = []
    for at, n, m in zip(arrivals, lengths, new_tokens, strict=True):
        prompt = rng.integers(0, vocab_size - 1, size=int(n)).tolist()
        if prefixes:
            prompt = prefixes[int(rng.integers(len(prefixes)))] + prompt
        work.append((float(at), prompt, int(m), False))
    if args.long_prompts:
        gaps = rng.exponential(1.0 / args.long_rate, size=args.long_prompts)
        for at in np.cumsum(gaps):
            prompt = rng.integers(0, vocab_size - 1, size=args.long_prompt_len).tolist()
            work.append((float(at), prompt, args.long_max_tokens, True))
    return work


def start_server(side: str, args, port: int) -> subprocess.Popen:
    """One side's server on 127.0.0.1:port, ready (its /health answers 200)."""
    threads = str(args.threads)
    if side == "llama":
        binary = source_dir(args.llama_dir.resolve()) / "build" / "bin" / "llama-server"
        command = [
            str(binary), "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(ROWS), "-c", str(ROWS * 1024), "-ctk", "f32", "-ctv", "f32",
            "-t", threads, "--alias", "bench",
        ]  # fmt: skip
    else:
        policy = "static" if side == "static" else "continuous"
        command = [
            sys.executable, "-m", "minirt.serve", "--model", str(args.model.resolve()), "--port", str(port),
            "--batch-size", str(args.rows), "--policy", policy, "--served-model-name", "bench",
        ]  # fmt: skip
        if side == "chunked":
            command += ["--max-round-tokens", str(args.chunk_tokens)]
        if side == "unchunked":
            command += ["--no-chunked-prefill"]
        if side == "invariant":
            command += ["--batch-invariant"]
        command += REPLICA_SIDES.get(side, [])
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    tree = REPO
    if side == "baseline":
        # That checkout's minirt, ahead of the one installed here.
        tree = args.baseline_tree.resolve()
        env["PYTHONPATH"] = str(tree)
    process = subprocess.Popen(
        command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_healthy(process, port)
    return process


def wait_healthy(process: subprocess.Popen, port: int) -> None:
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"no server answered on port {port} within {READY_TIMEOUT_S:.0f} s")


class FeedWatcher:
    """A round-grid page's feed, open on a server for a whole run: a thread reads GET /rounds/events."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/rounds/events"
        self.rounds = 0
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self) -> None:
        import httpx

        try:
            with httpx.stream("GET", self.url, timeout=None) as stream:
                for line in stream.iter_lines():
                    if line.startswith('data: {"type":"round"') or line.startswith(
                        'data: {"type": "round"'
                    ):
                        self.rounds += 1
        except httpx.HTTPError:
            # The server stopped: the stream ends.
            pass


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def one_request(client, prompt: list[int], max_tokens: int, start: float, long: bool) -> Outcome:
    """A streamed completion: its first and last chunk's times, the gaps between its chunks, and
    its tokens from the usage."""
    outcome = Outcome(sent=time.perf_counter() - start, long=long)
    try:
        stream = client.completions.create(
            model="bench",
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            now = time.perf_counter() - start
            if chunk.choices and chunk.choices[0].text and outcome.first is None:
                outcome.first = now
            if chunk.choices:
                if outcome.last is not None:
                    outcome.gaps.append(now - outcome.last)
                outcome.last = now
            if chunk.usage is not None:
                outcome.tokens = chunk.usage.completion_tokens
                outcome.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                outcome.cached_tokens = (details.cached_tokens or 0) if details else 0
    except Exception as exc:  # noqa: BLE001 (a failure is counted, not fatal)
        outcome.error = f"{type(exc).__name__}: {exc}"[:200]
    if outcome.error is None and outcome.tokens != max_tokens:
        outcome.error = f"made {outcome.tokens} tokens, not {max_tokens}"
    return outcome


def run_load(port: int, work, args) -> tuple[list[Outcome], float]:
    """The whole workload against one server: the outcomes, and the wall time."""
    import openai

    jobs: queue.Queue = queue.Queue()
    for job in enumerate(work):
        jobs.put(job)
    outcomes: dict[int, Outcome] = {}
    start = time.perf_counter()
    deadline = start + args.max_seconds

    def client_thread():
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="none",
            max_retries=0,
            timeout=args.max_seconds,
        )
        while True:
            try:
                index, (arrival, prompt, max_tokens, long) = jobs.get_nowait()
            except queue.Empty:
                return
            delay = start + arrival - time.perf_counter()
            if time.perf_counter() + max(delay, 0) > deadline:
                outcomes[index] = Outcome(sent=arrival, error="not sent: --max-seconds ran out")
                continue
            time.sleep(max(delay, 0))
            outcomes[index] = one_request(client, prompt, max_tokens, start, long)

    threads = [threading.Thread(target=client_thread, daemon=True) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()) + 5)
    wall = time.perf_counter() - start
    for index in range(len(work)):
        outcomes.setdefault(index, Outcome(sent=work[index][0], error="cut off by --max-seconds"))
    return [outcomes[k] for k in range(len(work))], wall


def percentile(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def summary(outcomes: list[Outcome]) -> dict:
    done = [o for o in outcomes if o.error is None and o.first is not None and o.last is not None]
    ends = [o.last for o in done]
    wall = (max(ends) - min(o.sent for o in outcomes)) if ends else float("nan")
    ttft = [o.first - o.sent for o in done]
    tpot = [(o.last - o.first) / (o.tokens - 1) for o in done if o.tokens > 1]
    figures = {
        "throughput": sum(o.tokens for o in done) / wall,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "busy_rows": sum(o.last - o.sent for o in done) / wall,
        "failures": len(outcomes) - len(done),
    }
    if any(o.cached_tokens for o in done):
        figures["cached_share"] = sum(o.cached_tokens for o in done) / sum(
            o.prompt_tokens for o in done
        )
    if any(o.long for o in outcomes):
        main = [o for o in done if not o.long]
        figures["tpot_p99_main"] = percentile(
            [(o.last - o.first) / (o.tokens - 1) for o in main if o.tokens > 1], 99
        )
        figures["itl_p99_main"] = percentile([gap for o in main for gap in o.gaps], 99)
    return figures


FIGURES = (
    ("throughput", "throughput (tok/s)", "{:.1f}"),
    ("ttft_p50", "TTFT p50 (s)", "{:.3f}"),
    ("ttft_p99", "TTFT p99 (s)", "{:.3f}"),
    ("tpot_p50", "TPOT p50 (ms)", "{:.1f}"),
    ("tpot_p99", "TPOT p99 (ms)", "{:.1f}"),
    ("tpot_p99_main", "TPOT p99, main requests (ms)", "{:.1f}"),
    ("itl_p99_main", "inter-token gap p99, main requests (ms)", "{:.1f}"),
    ("cached_share", "cached share of prompt tokens", "{:.3f}"),
    ("busy_rows", "busy rows", "{:.1f}"),
    ("failures", "failures", "{:.0f}"),
)


def shown(key: str, values: list[float], fmt: str) -> str:
    scale = 1000.0 if key.startswith(("tpot", "itl")) else 1.0
    scaled = [v * scale for v in values]
    median = fmt.format(statistics.median(scaled))
    if len(scaled) == 1:
        return median
    return f"{median} ({fmt.format(min(scaled))}-{fmt.format(max(scaled))})"


def table(runs: dict[str, list[dict]], sides: list[str]) -> str:
    lines = ["| figure | " + " | ".join(sides) + " |", "|---|" + "---|" * len(sides)]
    for key, label, fmt in FIGURES:
        if not all(key in run for side in sides for run in runs[side]):
            continue
        cells = [shown(key, [run[key] for run in runs[side]], fmt) for side in sides]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_repeat(runs: dict[str, list[dict]], side: str, base: str, keys: tuple[str, ...]) -> str:
    """`side` over `base` for each figure, per repeat (the sides ran back to back): the median of
    those ratios and their range."""
    parts = []
    for key in keys:
        if key not in runs[side][0]:
            continue
        ratios = [run[key] / other[key] for run, other in zip(runs[side], runs[base], strict=True)]
        low = min(ratios)
        high = max(ratios)
        parts.append(f"{key} {statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})")
    return f"{side} / {base}, per repeat: " + ", ".join(parts)


def ratio_lines(runs: dict[str, list[dict]]) -> list[str]:
    def median(side: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[side])

    lines = []
    if "minirt" in runs and "llama" in runs:
        throughput = median("minirt", "throughput") / median("llama", "throughput")
        ttft = median("minirt", "ttft_p99") / median("llama", "ttft_p99")
        lines.append(
            f"minirt / llama-server: throughput {throughput:.2f}x (target >= 0.9), p99 TTFT {ttft:.2f}x (target <= 1)"
        )
    for side in ("watched", "baseline", "invariant", "ray1", "ray2"):
        if "minirt" in runs and side in runs:
            keys = ("throughput", "tpot_p50", "ttft_p99")
            lines.append(per_repeat(runs, side, "minirt", keys))
    if "chunked" in runs and "unchunked" in runs:
        keys = ("itl_p99_main", "tpot_p99_main", "throughput")
        lines.append(per_repeat(runs, "chunked", "unchunked", keys))
    if "ray2-pow2" in runs and "ray2-prefix" in runs:
        lines.append(per_repeat(runs, "ray2-prefix", "ray2-pow2", ("throughput", "ttft_p99")))
    if "minirt" in runs and "static" in runs:
        ttft = median("static", "ttft_p99") / median("minirt", "ttft_p99")
        lines.append(f"static / continuous: p99 TTFT {ttft:.2f}x (continuous wins when > 1)")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, default=Path("/tmp/gpt2-124m-random"))
    p.add_argument("--gguf", type=Path, default=Path("/tmp/gpt2-124m-random-f32.gguf"))
    p.add_argument("--llama-dir", type=Path, default=Path("/tmp/llama-cpp"))
    p.add_argument(
        "--sides",
        default=",".join(DEFAULT_SIDES),
        help=f"which, in order, from {','.join(SIDES)} (default {','.join(DEFAULT_SIDES)})",
    )
    p.add_argument(
        "--baseline-tree",
        type=Path,
        help="the checkout the side 'baseline' runs minirt from (a git worktree of an earlier commit)",
    )
    p.add_argument("--requests", type=int, default=128)
    p.add_argument(
        "--rate", type=float, default=1.0, help="requests per second, Poisson (default 1.0)"
    )
    p.add_argument("--prompt-lens", default="32:512", metavar="LOW:HIGH")
    p.add_argument(
        "--max-tokens",
        default="64",
        metavar="N|LOW:HIGH",
        help="new tokens a request (default 64; 8:128 draws each uniformly)",
    )
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rows", type=int, default=ROWS, help=f"minirt's --batch-size (default {ROWS})")
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=256,
        help="the side 'chunked': its --max-round-tokens (default 256)",
    )
    p.add_argument(
        "--shared-prefixes",
        type=int,
        default=0,
        metavar="K",
        help="every prompt starts with one of K random prefixes (default 0: none)",
    )
    p.add_argument("--prefix-len", type=int, default=256, metavar="TOKENS")
    p.add_argument("--long-prompts", type=int, default=0, metavar="N", help="long-prompt requests")
    p.add_argument("--long-prompt-len", type=int, default=1000, metavar="TOKENS")
    p.add_argument("--long-max-tokens", type=int, default=4, metavar="N")
    p.add_argument("--long-rate", type=float, default=0.5, metavar="PER_S")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--max-seconds", type=float, default=600.0, help="a run is cut off after this (default 600)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    blas_env.add_blas_env_argument(p)
    args = p.parse_args()
    blas_env.run_under(args.blas_env)
    sides = args.sides.split(",")
    unknown = set(sides) - set(SIDES)
    if unknown:
        p.error(f"unknown sides {sorted(unknown)}; choose from {','.join(SIDES)}")
    if "baseline" in sides and (
        args.baseline_tree is None or not (args.baseline_tree / "minirt").is_dir()
    ):
        p.error("the side 'baseline' needs --baseline-tree DIR, a checkout with minirt/ in it")
    ensure_model(args.model)
    config = json.loads((args.model / "config.json").read_text())
    work = workload(args, config["vocab_size"])
    print(
        f"{args.requests} requests, prompts {args.prompt_lens} tokens, {args.max_tokens} new tokens, "
        f"Poisson at {args.rate:g}/s, {args.clients} clients, {args.rows} rows, {args.threads} threads a server\n"
        f"{args.long_prompts} long prompts of {args.long_prompt_len} tokens ({args.long_max_tokens} new) at "
        f"{args.long_rate:g}/s\n"
        f"{args.shared_prefixes} shared prefixes of {args.prefix_len} tokens\n"
        f"minirt's {blas_env.report()}",
        flush=True,
    )
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side in sides:
            port = free_port()
            server = start_server(side, args, port)
            watcher = FeedWatcher(port) if side == "watched" else None
            try:
                outcomes, wall = run_load(port, work, args)
            finally:
                stop_server(server)
            if watcher is not None:
                watcher.thread.join(10)
                print(f"  the feed carried {watcher.rounds} rounds", flush=True)
            figures = summary(outcomes)
            runs[side].append(figures)
            errors = sorted({o.error for o in outcomes if o.error})[:3]
            print(
                f"run {repeat + 1} {side}: {json.dumps({k: round(v, 4) for k, v in figures.items()})} wall {wall:.1f} s {errors or ''}",
                flush=True,
            )
    print()
    print(table(runs, sides))
    for line in ratio_lines(runs):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
