"""A tiny GPT-2 with random weights and a real byte-level BPE tokenizer, made with NumPy and tokenizers alone.

Used by the tests: a model with a tokenizer, so text, EOS and stop strings are
real, yet small enough to make in a fraction of a second.  Its weights are
random, so its text is noise; its tokenizer is trained on a few lines of
Shakespeare below.

    python tools/tiny_random_model.py /tmp/tiny-random-gpt2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minirt.loading.checkpoint import expected_shapes  # noqa: E402 (after the sys.path insert above)
from minirt.model.config import GPT2Config  # noqa: E402 (after the sys.path insert above)

CORPUS = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. "
    "Now is the winter of our discontent made glorious summer by this sun of York. "
    "All the world's a stage, and all the men and women merely players. Café, naïve, 日本語, 🤗. "
) * 20


def random_tensors(config: GPT2Config, seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the config, drawn at scales that keep activations healthy and logits spread."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            tensors[name] = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            tensors[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name in ("wte.weight", "wpe.weight"):
            tensors[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return tensors


def train_tokenizer(vocab_target: int = 300):
    """A byte-level BPE (GPT-2's kind) trained on CORPUS, with about `vocab_target` tokens and <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    return tok


def write_tiny_lm(
    folder: Path, seed: int = 0, n_positions: int = 64, vocab_target: int = 300
) -> Path:
    """A model folder: config.json, model.safetensors, tokenizer.json.  Its EOS is the tokenizer's <|endoftext|>."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_target)
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": tok.get_vocab_size(),
        "n_positions": n_positions,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "bos_token_id": eos,
        "eos_token_id": eos,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = random_tensors(GPT2Config.from_dict(config), seed)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/tiny_random_model.py FOLDER")
    print(f"wrote {write_tiny_lm(Path(sys.argv[1]))}")
