"""What a request with the largest parameters the server allows costs the requests beside it.

A server runs rounds on one thread, so a request's own parameters (sampling controls, logprobs, stop
strings, logit_bias, an echoed prompt) are paid for in every round it shares with others.  The bounds
in docs/serving.md's Limits table keep that cost bounded; this tool measures it.  A *peer* (a greedy
stream of --peer-tokens tokens) runs beside a *neighbour* that holds the other rows:

    alone     the peer with nobody beside it
    plain     beside a neighbour of n = rows - 1 greedy choices: a prompt, max_tokens, nothing else
    maximal   beside the same neighbour (same n, prompt and max_tokens) with every parameter at its
              largest allowed value: sampled with top_k, top_p, min_p, three penalties and a seed,
              logprobs 20 with echo (the prompt's logprobs too), 4 stop strings of 1,000 characters,
              300 stop_token_ids, 300 logit_bias entries

The peer's time per output token (its stream's inter-token gaps after the first) is a round's time.
`maximal / plain` is what the parameters cost beyond the rows they hold (their fair share: the same
rows with default parameters); `plain / alone` is what the rows cost, for comparison.  Each repeat runs
the three in turn on one server; the table gives medians over the repeats with their range.

    python tools/bench/fair_share.py                                  # the shipped tiny model
    python tools/fixtures/reference.py make-124m /tmp/gpt2-124m-random
    python tools/bench/fair_share.py --model /tmp/gpt2-124m-random --repeats 5

The tiny model is the worst case: its forward is so cheap that the per-row work of the parameters is
most of a round.  Bounded: one server on 127.0.0.1, three requests at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # blas_env.py

import blas_env

REPO = Path(__file__).resolve().parent.parent.parent
SIDES = ("alone", "plain", "maximal")
READY_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args, port: int) -> subprocess.Popen:
    import httpx

    command = [
        sys.executable, "-m", "minirt.serve", "--port", str(port),
        "--batch-size", str(args.rows), "--served-model-name", "bench",
    ]  # fmt: skip
    if args.model is not None:
        command += ["--model", str(args.model.resolve())]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not answer within {READY_TIMEOUT_S:.0f} s")


def model_limits(args) -> tuple[int, int]:
    """(the context length, the vocabulary size) of the model, from its config.json."""
    from minirt.loading.checkpoint import shipped_model_folder

    folder = args.model if args.model is not None else shipped_model_folder()
    config = json.loads((folder / "config.json").read_text())
    return config["n_positions"], config["vocab_size"]


def neighbour_body(side: str, args, context: int, vocab: int) -> dict:
    """The neighbour: n = rows - 1 choices of one prompt; plain, or with every parameter at its most."""
    prompt_len = context // 2
    # Token ids below the last (GPT-2 gives the last to <|endoftext|>), so the prompt needs no tokenizer.
    prompt = [(i * 7919) % (vocab - 1) for i in range(prompt_len)]
    body = {
        "model": "bench",
        "prompt": prompt,
        "n": args.rows - 1,
        "max_tokens": context - prompt_len,
        "ignore_eos": True,
        "temperature": 0,
    }
    if side == "plain":
        return body
    # The ids the stop_token_ids and logit_bias name: the vocabulary's last 300 (below its last).
    named = list(range(vocab - 301, vocab - 1))
    return {
        **body,
        "temperature": 0.8,
        "top_k": 50,
        "top_p": 0.9,
        "min_p": 0.01,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.2,
        "seed": 1,
        "logprobs": 20,
        "echo": True,
        # Four stop strings of 1,000 characters that no completion holds.
        "stop": [chr(0x2200 + k) * 1000 for k in range(4)],
        "stop_token_ids": named,
        # The named ids banned, so that no stop token id ends the neighbour early; every entry is
        # applied each round.
        "logit_bias": {str(token): -100 for token in named},
    }


def stream_gaps(url: str, body: dict, started: threading.Event | None = None) -> list[float]:
    """Stream a completion; the seconds between its chunks after the first."""
    import httpx

    times = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as answer:
        if answer.status_code != 200:
            raise SystemExit(f"a request was refused: {answer.status_code} {answer.read()[:300]!r}")
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if "error" in json.loads(line[len("data: ") :]):
                    raise SystemExit(f"a request failed: {line[:300]}")
                times.append(time.perf_counter())
                if started is not None:
                    started.set()
    return [b - a for a, b in zip(times[1:], times[2:], strict=False)]


def one_side(side: str, url: str, args, context: int, vocab: int) -> float:
    """The peer's median time per output token, in seconds, beside `side`'s neighbour."""
    import httpx

    peer = {
        "model": "bench",
        "prompt": [11, 12, 13, 14],
        "max_tokens": args.peer_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    if side == "alone":
        return statistics.median(stream_gaps(url, peer))
    # Not streamed: echo with logprobs is answered whole.
    neighbour = neighbour_body(side, args, context, vocab)
    answers: list = []

    def run_neighbour():
        answers.append(httpx.post(f"{url}/v1/completions", json=neighbour, timeout=600))

    thread = threading.Thread(target=run_neighbour)
    thread.start()
    # The peer joins once the neighbour's choices hold their rows.
    deadline = time.monotonic() + 120
    while running(url) < args.rows - 1:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit(f"the {side} neighbour never held its rows: {answers[:1]}")
        time.sleep(0.005)
    gaps = stream_gaps(url, peer)
    thread.join()
    answer = answers[0]
    if answer.status_code != 200:
        raise SystemExit(f"the {side} neighbour was refused: {answer.text[:300]}")
    finishes = {choice["finish_reason"] for choice in answer.json()["choices"]}
    if finishes != {"length"}:
        raise SystemExit(f"the {side} neighbour ended early ({finishes}): its rows were not held")
    return statistics.median(gaps)


def running(url: str) -> float:
    """The server's requests holding a row, from /metrics."""
    import httpx

    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("minirt:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description="What a request with the largest allowed parameters costs the peers beside it.",
        epilog="examples:\n  python tools/bench/fair_share.py\n"
        "  python tools/bench/fair_share.py --model /tmp/gpt2-124m-random --repeats 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, help="a model folder (default: the shipped model)")
    parser.add_argument("--rows", type=int, default=8, help="the server's --batch-size (8)")
    parser.add_argument("--peer-tokens", type=int, default=48, help="the peer's tokens (48)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of the three sides (5)")
    blas_env.add_blas_env_argument(parser)
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads of the server (2)")
    args = parser.parse_args()
    blas_env.run_under(args.blas_env)
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
    print(blas_env.report())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(args, port)
    try:
        context, vocab = model_limits(args)
        # A warm-up of each side, not timed.
        for side in SIDES:
            one_side(side, url, args, context, vocab)
        results: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:
                results[side].append(one_side(side, url, args, context, vocab))
    finally:
        process.terminate()
        process.wait(60)
    print(
        f"model {args.model or 'shipped'}, context {context}, vocab {vocab}, {args.rows} rows; "
        f"the neighbour: {args.rows - 1} choices of a {context // 2}-token prompt; "
        f"medians of {args.repeats} repeats (min-max)"
    )
    print(f"{'side':<10} {'peer ms/token':>24}")
    for side in SIDES:
        values = [1000 * v for v in results[side]]
        print(
            f"{side:<10} {statistics.median(values):>10.2f} ({min(values):.2f}-{max(values):.2f})"
        )
    maximal = statistics.median(results["maximal"])
    plain = statistics.median(results["plain"])
    alone = statistics.median(results["alone"])
    ratios = [m / p for m, p in zip(results["maximal"], results["plain"], strict=True)]
    print(
        f"maximal / plain: {maximal / plain:.2f} (per repeat {min(ratios):.2f}-{max(ratios):.2f}); "
        f"plain / alone: {plain / alone:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
