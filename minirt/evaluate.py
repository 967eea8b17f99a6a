"""`python -m minirt.evaluate --text FILE`: mean token loss and perplexity, from minirt's own
forward pass.

Owns: the sliding-window definition of a text's loss, and the command around it.

A text longer than the context is scored in windows of `window` tokens that
start every `stride` tokens.  The first window scores all of its
predictions; each later window scores only the tokens no earlier window
scored, so every token after the first is predicted exactly once, with at
least `window - stride` tokens of context once the text is long enough.
The loss is the mean, over those predictions, of -log p(token | context),
in nats; the perplexity is its exponential.  Windows are scored several at
a time in one padded batch, and the head runs only on scored positions.

Must not know: sampling, serving or scheduling.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from .model.backend import BACKEND_NAMES
from .model.batch import Batch
from .cli.command import EXIT_OK, add_version_flag, parse_command_line, run_command
from .cli.plural import plural
from .errors import MinirtError
from .loading.checkpoint import shipped_model_folder
from .llm import LLM
from .model.interface import Model
from .engine.sampler import log_softmax

# A cap on the fp32 logits held at once (their float64 log-softmax is twice that).
HEAD_BYTES_PER_BATCH = 128 * 2**20


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, stop, first scored target) for each window over a text of n_tokens.

    A window covers ids[start:stop]; it predicts targets start+1 .. stop-1 and
    scores those from `first` on (absolute indices).
    """
    # Windows must overlap, or boundary tokens go unscored.
    if window < 2 or not 1 <= stride < window:
        raise MinirtError(
            f"need window >= 2 and 1 <= stride < window, got window {window}, stride {stride}"
        )
    spans = []
    scored_through = 0
    start = 0
    while n_tokens >= 2:
        stop = min(start + window, n_tokens)
        spans.append((start, stop, max(scored_through + 1, start + 1)))
        scored_through = stop - 1
        if stop == n_tokens:
            break
        start += stride
    return spans


def text_loss(
    model: Model, ids: list[int], window: int, stride: int, progress=None
) -> tuple[float, int]:
    """(total negative log-likelihood in nats, number of predictions) of a token sequence."""
    spans = windows(len(ids), window, stride)
    per_batch = max(1, HEAD_BYTES_PER_BATCH // (window * model.config.vocab_size * 4))
    token_ids = np.asarray(ids, dtype=np.int64)  # [n_tokens]
    total = 0.0
    count = 0
    for first in range(0, len(spans), per_batch):
        group = spans[first : first + per_batch]
        # One row per window, no KV cache.
        batch = Batch([ids[start:stop] for start, stop, _ in group], model.backend)
        # The packed tokens that are scored, [S]: the hidden state at absolute position t
        # predicts target t + 1.
        scored = np.concatenate(
            [
                batch.first_index[w] + np.arange(s0 - 1 - start, stop - 1 - start)
                for w, (start, stop, s0) in enumerate(group)
            ]
        )
        targets = np.concatenate([token_ids[s0:stop] for start, stop, s0 in group])  # [S]
        # [S, V] fp32
        logits = model.backend.to_numpy(model.forward(batch, logits_at=scored))
        total -= float(log_softmax(logits)[np.arange(len(targets)), targets].sum())
        count += len(targets)
        if progress:
            progress(first + len(group), len(spans))
    return total, count


def build_parser(prog: str = "python -m minirt.evaluate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Mean token loss and perplexity of a text under a model (GPT-2 or the Llama "
        "family), computed by minirt's forward pass.",
        epilog="""examples:
  python -m minirt.evaluate --text weights/shakespeare-gpt2-tiny/validation.txt
  python -m minirt.evaluate --model gpt2 --text wiki.txt --stride 512 --json

The text is tokenized whole.  Longer than the context, it is scored with a sliding
window (default: the model's context, stride half of it); each token after the first
is predicted once.  Loss is in nats per token; perplexity = exp(loss).""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--text", required=True, metavar="FILE", help="a UTF-8 text file, or - for standard input"
    )
    p.add_argument(
        "--model", help="a model folder or cached hub id (default: the model shipped in weights/)"
    )
    p.add_argument("--window", type=int, help="tokens per window (default: the model's context)")
    p.add_argument(
        "--stride", type=int, help="tokens between window starts (default: half the window)"
    )
    p.add_argument(
        "--backend", choices=BACKEND_NAMES, default="auto", help="array backend (default auto)"
    )
    p.add_argument("--dtype", default="float32", help="compute dtype (default float32)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_version_flag(p)
    return p


def check_flags(args) -> None:
    """The checks that need no model, made before anything is read or loaded.  An empty or zero
    value is refused, never taken as the flag left out (an unset shell variable gives "")."""
    if args.text == "":
        raise MinirtError("--text is empty; give a UTF-8 text file, or - for standard input")
    if args.model == "":
        raise MinirtError(
            "--model is empty; give a model folder or a hub id, or leave --model out for the "
            "model shipped in weights/"
        )
    # A window scores its predictions, so it needs 2 tokens; the windows must overlap.
    if args.window is not None and args.window < 2:
        raise MinirtError(
            f"--window must be at least 2 tokens (leave it out for the model's context), "
            f"got {args.window}"
        )
    if args.stride is not None and args.stride < 1:
        raise MinirtError(
            f"--stride must be at least 1 token (leave it out for half the window), "
            f"got {args.stride}"
        )
    if args.window is not None and args.stride is not None and args.stride >= args.window:
        raise MinirtError(
            f"--stride must be less than --window, so that the windows overlap; got --stride "
            f"{args.stride} and --window {args.window}"
        )


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise MinirtError(f"text file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise MinirtError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    except OSError as exc:
        raise MinirtError(f"{path}: cannot read ({exc.strerror})") from None


def load_scorer(args) -> LLM:
    """The model to score with (no --model: the one minirt ships); it must have a tokenizer."""
    if args.model is None:
        model = shipped_model_folder()
    else:
        model = args.model
    llm = LLM(model, backend=args.backend, dtype=args.dtype)
    if llm.tokenizer is None:
        raise MinirtError(f"{llm.model.folder} has no tokenizer, so it cannot score text")
    return llm


def window_and_stride(args, n_positions: int) -> tuple[int, int]:
    """--window (no --window: the model's context) and --stride (none: half the window)."""
    if args.window is None:
        window = n_positions
    else:
        window = args.window
    if window > n_positions:
        raise MinirtError(f"--window {window} is longer than the model's context of {n_positions}")
    if args.stride is None:
        stride = max(1, window // 2)
    else:
        stride = args.stride
    return window, stride


def main(argv: list[str] | None = None, prog: str = "python -m minirt.evaluate") -> int:
    args = parse_command_line(build_parser(prog), argv)
    check_flags(args)
    text = read_text(args.text)
    llm = load_scorer(args)
    window, stride = window_and_stride(args, llm.model.config.n_positions)
    assert llm.tokenizer is not None  # load_scorer refused a model without one
    ids = llm.tokenizer.encode(text)
    if len(ids) < 2:
        raise MinirtError(
            f"{args.text} has {plural(len(ids), 'token')}; at least 2 are needed to score a "
            "prediction"
        )
    interactive = sys.stderr.isatty() and not args.json

    def progress(done: int, total: int) -> None:
        if interactive:
            print(f"\rscoring windows {done}/{total}", end="", file=sys.stderr, flush=True)

    start = time.perf_counter()
    total, count = text_loss(llm.model, ids, window, stride, progress)
    seconds = time.perf_counter() - start
    if interactive:
        print(file=sys.stderr)
    loss = total / count
    # NaN or infinite weights, or an fp16 overflow: no perplexity to report.
    if not math.isfinite(loss):
        raise MinirtError(
            f"{llm.model.folder}: the loss over {plural(count, 'prediction')} is {loss}, because "
            "the model's logits are not finite (NaN or infinite weights, or an fp16 overflow); "
            "check the checkpoint"
        )
    result = {
        "model": str(llm.model.folder),
        "backend": f"{llm.model.backend.name} {llm.model.dtype.name}",
        "text": args.text,
        "tokens": len(ids),
        "predictions": count,
        "window": window,
        "stride": stride,
        "loss": loss,
        "perplexity": perplexity(loss),
        "seconds": seconds,
    }
    show(result, args.json)
    return EXIT_OK


def show(result: dict, as_json: bool) -> None:
    """The result on standard output: one JSON object, or a line per fact."""
    if as_json:
        # Strict JSON: an infinite perplexity is null.
        if result["perplexity"] < math.inf:
            shown = result
        else:
            shown = {**result, "perplexity": None}
        print(json.dumps(shown))
        return
    tokens = plural(result["tokens"], "token", spec=",")
    predictions = plural(result["predictions"], "prediction", spec=",")
    print(f"model        {result['model']}")
    print(f"backend      {result['backend']}")
    print(
        f"text         {result['text']}: {tokens}, {predictions} "
        f"(window {result['window']}, stride {result['stride']})"
    )
    print(f"loss         {result['loss']:.4f} nats/token")
    print(f"perplexity   {result['perplexity']:.2f}")
    print(f"time         {result['seconds']:.2f} s")


def perplexity(loss: float) -> float:
    """exp(loss); a finite loss past 709.78 nats gives inf (float's range), not an OverflowError."""
    if loss < 709.0:
        return math.exp(loss)
    return float("inf")


if __name__ == "__main__":
    sys.exit(run_command(main, prog="minirt.evaluate"))
