"""`python -m minirt.inspect MODEL`: check a checkpoint loads, describe it, and show its next-token
guesses.

Owns: the command-line report on one model: where it was found, its config,
its weights (count, file precision, tied head, whether they were memory-mapped),
how long loading took, its tokenizer, and for each prompt the most likely next
tokens, all computed by minirt's own forward pass in one padded batch.

Must not know: how loading or the forward pass work inside.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .model.backend import BACKEND_NAMES, resolve_dtype
from .loading.checkpoint import load_checkpoint, shipped_model_folder
from .cli.command import EXIT_OK, add_version_flag, parse_command_line, run_command
from .cli.plural import plural
from .errors import MinirtError, require_at_least_one
from .llm import LLM
from .engine.sampler import log_softmax

# Its output is a report: a reader that stops early (`| head`) ends it without a word.
REPORT = True

EXAMPLES = """examples:
  python -m minirt.inspect --prompt "ROMEO:" --top-k 5            # the model shipped with minirt
  python -m minirt.inspect tests/fixtures/base --ids 5,6,7 --ids 9
  python -m minirt.inspect gpt2 --prompt "The capital of France is" --top-k 5
  python -m minirt.inspect /path/to/gpt2-folder --dtype float16
  python -m minirt.inspect --prompt "ROMEO:" --batch-invariance   # alone vs batched, both modes

MODEL is a folder with config.json and model.safetensors (or sharded weights),
or a hub id (gpt2, openai-community/gpt2-medium, ...) already in the local
Hugging Face cache; minirt never downloads.  --model MODEL says the same, as
generate and evaluate take it.
"""


def parse_ids(text: str) -> list[int]:
    """The token ids of one --ids (5,6,7; a space beside a comma is fine).  Nothing between two
    commas (5,,6), or nothing at all, is refused in one line (a MinirtError, which argparse lets
    through), never read as fewer ids; so is a space inside an id (5 6 is not 56)."""
    parts = [part.strip() for part in text.split(",")]
    if parts == [""]:
        raise MinirtError(
            "--ids is empty; give comma-separated token ids like 5,6,7 (for a prompt of text, "
            "--prompt TEXT)"
        )
    if "" in parts:
        raise MinirtError(
            f"--ids: {text!r} has an empty item (two commas in a row, or one at an end); "
            "give token ids like 5,6,7"
        )
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids like 5,6,7, got {text!r}"
        ) from None


def build_parser(prog: str = "python -m minirt.inspect") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Load a checkpoint (GPT-2 or the Llama family) with minirt, describe it, and "
        "show the next-token predictions for prompts.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="TEXT",
        help="a prompt to score (repeatable; needs a tokenizer)",
    )
    parser.add_argument(
        "--ids",
        action="append",
        default=[],
        type=parse_ids,
        metavar="IDS",
        help="a prompt as token ids, e.g. 5,6,7 (repeatable)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=5,
        metavar="K",
        help="how many next tokens to show per prompt (default 5)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default="auto",
        help="array backend (default auto: cupy if a GPU is usable)",
    )
    parser.add_argument(
        "--dtype", default="float32", help="compute dtype: float32 (default), float16 or float64"
    )
    parser.add_argument(
        "--batch-invariance",
        action="store_true",
        help="also score each prompt alone and as row 3 of a padded batch of 8, in the default "
        "mode and in exact mode (batch_invariant=True), and say how many of its next-token "
        "logits moved, and by how much (docs/batch-invariance.md)",
    )
    add_version_flag(parser)
    return parser


def add_model_arguments(parser) -> None:
    """MODEL, or --model MODEL as generate and evaluate take it."""
    parser.add_argument(
        "model",
        nargs="?",
        help="a model folder, or a hub id in the local Hugging Face cache "
        "(default: the model shipped with minirt)",
    )
    parser.add_argument(
        "--model",
        dest="model_flag",
        metavar="MODEL",
        help="the same as MODEL, as generate and evaluate take it",
    )


def describe_token(tokenizer, token_id: int) -> str:
    if tokenizer is None:
        return f"id {token_id}"
    return f"{tokenizer.decode([token_id])!r} ({token_id})"


def model_argument(args) -> str | None:
    """The model asked for, as MODEL or as --model (not both); None: the shipped one.  An empty
    one (an unset shell variable) is refused, not taken for the shipped one."""
    for given, name in ((args.model, "MODEL"), (args.model_flag, "--model")):
        if given == "":
            raise MinirtError(
                f"{name} is empty; give a model folder or a hub id, or leave it out for the "
                "model shipped with minirt"
            )
    if args.model is not None and args.model_flag is not None:
        raise MinirtError(
            f"the model is given twice ({args.model} and --model {args.model_flag}); "
            "give it once, as MODEL or as --model MODEL"
        )
    if args.model_flag is not None:
        return args.model_flag
    return args.model


def main(argv: list[str] | None = None, prog: str = "python -m minirt.inspect") -> int:
    args = parse_command_line(build_parser(prog), argv)
    require_at_least_one(args.top_k, "--top-k")
    model = model_argument(args)
    dtype = resolve_dtype(args.dtype)
    start = time.perf_counter()
    # No model given: the one minirt ships.
    if model is None:
        checkpoint = load_checkpoint(shipped_model_folder())
    else:
        checkpoint = load_checkpoint(model)
    llm = LLM(checkpoint, backend=args.backend, dtype=args.dtype)
    load_seconds = time.perf_counter() - start
    describe(checkpoint, llm, dtype, load_seconds)

    prompts: list[tuple[str, list[int]]] = [(f"ids {ids}", ids) for ids in args.ids]
    if args.prompt:
        if llm.tokenizer is None:
            raise MinirtError(
                f"--prompt needs a tokenizer, and {checkpoint.folder} has none; "
                "pass token ids with --ids instead"
            )
        prompts += [(repr(text), llm.tokenizer.encode(text)) for text in args.prompt]
    if prompts:
        show_next_tokens(llm, prompts, args.top_k)
    if args.batch_invariance:
        if not prompts:
            raise MinirtError("--batch-invariance needs a prompt: give --prompt TEXT or --ids IDS")
        exact = LLM(checkpoint, backend=args.backend, dtype=args.dtype, batch_invariant=True)
        show_batch_invariance({"default": llm, "exact": exact}, prompts)
    return EXIT_OK


def describe(checkpoint, llm: LLM, dtype, load_seconds: float) -> None:
    """Where the model was found, its config, its weights and its tokenizer."""
    model = llm.model
    c = llm.model.config
    files = sorted({str(p) for p in checkpoint.folder.glob("*.safetensors")})
    file_dtypes = ", ".join(sorted(set(checkpoint.file_dtypes.values())))
    mapped = model.backend.name == "numpy" and all(
        not a.flags.owndata for a in model.params.values()
    )
    print(f"model      {checkpoint.folder}")
    print(f"config     {c.summary}")
    if checkpoint.head_is_tied:
        head = "tied to the token embedding"
    else:
        head = "untied (lm_head.weight)"
    print(
        f"weights    {plural(model.n_params, 'parameter', spec=',')} in "
        f"{plural(len(files), 'file')}, {file_dtypes}; head {head}"
    )
    if mapped:
        weights = "memory-mapped, not copied (the head: one [C, V] fp32 copy)"
    else:
        weights = "converted on load"
    print(f"compute    {model.backend.name}, {dtype.name}; weights {weights}")
    print(f"loaded in  {load_seconds:.3f} s")
    describe_tokenizer(llm.tokenizer)


def describe_tokenizer(tokenizer) -> None:
    if tokenizer is not None:
        print(
            f"tokenizer  {tokenizer.source}: {plural(tokenizer.vocab_size, 'token')}, "
            f"eos {tokenizer.eos_token_id}, bos {tokenizer.bos_token_id}"
        )
    else:
        print(
            "tokenizer  none (the folder has no tokenizer.json, vocab.json + merges.txt or "
            "encoder.json + vocab.bpe; prompts must be token-id lists)"
        )


def show_next_tokens(llm: LLM, prompts: list[tuple[str, list[int]]], top_k: int) -> None:
    """Score every prompt in one padded batch and print each one's most likely next tokens."""
    # Checked; an empty prompt starts from BOS.
    sequences = [llm.prompt_ids(ids) for _, ids in prompts]
    start = time.perf_counter()
    # [B, max_len, V], one padded batch
    logits = llm.model.logits(sequences)
    seconds = time.perf_counter() - start
    print(f"\nscored {plural(len(sequences), 'prompt')} in one padded batch in {seconds:.3f} s")
    k = min(top_k, llm.model.config.vocab_size)
    for (label, _), seq, row in zip(prompts, sequences, logits, strict=True):
        # Nothing to rank: say so, as generate and evaluate do.
        if not np.isfinite(row[len(seq) - 1]).all():
            raise MinirtError(
                f"prompt {label}: the model's logits are not finite (NaN or inf): its weights hold "
                "NaN/inf, or float16 overflowed (try float32); check the checkpoint"
            )
        # [V] after the prompt's last token
        logprobs = log_softmax(row[len(seq) - 1])
        top = np.argsort(-logprobs)[:k]
        print(f"\nprompt {label} ({plural(len(seq), 'token')}): most likely next tokens")
        for token_id in top:
            token = describe_token(llm.tokenizer, int(token_id))
            print(
                f"  {token:32s} logprob {logprobs[token_id]:8.3f}   "
                f"p {np.exp(logprobs[token_id]):6.1%}"
            )


# The batch a prompt is scored in for --batch-invariance: 8 rows, it at row 3.
BATCH_ROWS = 8
ITS_ROW = 3


def show_batch_invariance(llms: dict[str, LLM], prompts: list[tuple[str, list[int]]]) -> None:
    """For each prompt and each mode: its next-token logits scored alone, then as row ITS_ROW of a
    padded batch of BATCH_ROWS (the other rows random prompts, seeded), and how many of them moved
    bitwise, by up to how much."""
    first = next(iter(llms.values()))
    vocab_size = first.model.config.vocab_size
    rng = np.random.default_rng(0)
    peers = [
        rng.integers(0, vocab_size, size=int(rng.integers(3, 41))).tolist()
        for _ in range(BATCH_ROWS - 1)
    ]
    print(
        f"\nbatch invariance: each prompt's next-token logits scored alone, then as row {ITS_ROW} "
        f"of a padded batch of {BATCH_ROWS} (the others random prompts of 3-40 tokens)"
    )
    for label, ids in prompts:
        sequence = first.prompt_ids(ids)
        last = len(sequence) - 1
        batch = [*peers[:ITS_ROW], sequence, *peers[ITS_ROW:]]
        cells = []
        for mode, llm in llms.items():
            alone = llm.model.logits([sequence])[0, last]  # [V]
            batched = llm.model.logits(batch)[ITS_ROW, last]  # [V]
            moved = alone.view(np.uint32) != batched.view(np.uint32)  # [V] bitwise
            if moved.any():
                largest = float(np.max(np.abs(alone - batched)))
                cells.append(
                    f"{mode}: {int(moved.sum())} of {vocab_size} moved, by up to {largest:.1e}"
                )
            else:
                cells.append(f"{mode}: none of {vocab_size} moved")
        print(f"  prompt {label}: " + "; ".join(cells))


if __name__ == "__main__":
    sys.exit(run_command(main, prog="minirt.inspect", quiet_when_cut=REPORT))
