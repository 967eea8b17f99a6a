"""Shared test helpers: fixture paths, random numpy-only models, reference availability."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from minirt.backend import numpy_backend
from minirt.batch import prepare_round
from minirt.checkpoint import Checkpoint, expected_shapes
from minirt.config import GPT2Config
from minirt.model import GPT2

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))  # tools/reference.py, for live transformers comparisons


def reference_available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:
        return False
    return True


requires_reference = pytest.mark.skipif(not reference_available(), reason="torch/transformers not installed (pip install -e .[reference])")


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|: the contract's measure."""
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def random_model(seed: int = 0, dtype=np.float32, backend=None, **fields) -> GPT2:
    """A GPT-2 with random weights made in NumPy alone (for invariants, no reference needed)."""
    raw = {"vocab_size": 50, "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2}
    raw.update(fields)
    config = GPT2Config.from_dict(raw, source="test")
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
    tensors["lm_head.weight"] = tensors["wte.weight"]
    checkpoint = Checkpoint(folder=Path("."), config=config, tensors=tensors,
                            file_dtypes={k: "F32" for k in tensors}, head_is_tied=True)
    return GPT2(checkpoint, backend or numpy_backend(), dtype)


def greedy_decode(model: GPT2, prompts: list[list[int]], steps: int, slots=None) -> list[list[int]]:
    """Batched greedy decoding with the KV cache: one prefill round, then one token per round.

    A minimal loop for tests (the serving engine is elsewhere): every row stays
    active for all steps.
    """
    slots = np.arange(len(prompts)) if slots is None else np.asarray(slots)
    cache = model.new_kv_cache(n_slots=int(slots.max()) + 1, capacity=max(len(p) for p in prompts) + steps)
    inputs = prepare_round(prompts, slots=slots, past_lens=np.zeros(len(prompts)))
    logits = model.next_token_logits(inputs, cache)  # [B, V]
    outputs = [[int(t)] for t in logits.argmax(axis=-1)]
    for _ in range(steps - 1):
        inputs = prepare_round([[out[-1]] for out in outputs], slots=slots, past_lens=cache.lengths[slots])
        logits = model.next_token_logits(inputs, cache)  # [B, V]
        for out, token in zip(outputs, logits.argmax(axis=-1)):
            out.append(int(token))
    return outputs


def load_expected(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").is_file())


CORPUS = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. "
    "Now is the winter of our discontent made glorious summer by this sun of York. "
    "All the world's a stage, and all the men and women merely players. Café, naïve, 日本語, 🤗. "
) * 20


def write_tiny_lm(folder: Path, seed: int = 0, n_positions: int = 64, vocab_target: int = 300) -> Path:
    """A small model folder with a real byte-level BPE tokenizer and random weights (NumPy only).

    Its config's eos_token_id is the tokenizer's <|endoftext|>, so EOS handling is real.
    """
    import json

    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_target, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")
    config = {"model_type": "gpt2", "vocab_size": vocab, "n_positions": n_positions, "n_embd": 32, "n_layer": 2,
              "n_head": 4, "bos_token_id": eos, "eos_token_id": eos}
    (folder / "config.json").write_text(json.dumps(config))
    model = random_model(seed=seed, **{k: v for k, v in config.items() if k not in ("model_type", "bos_token_id", "eos_token_id")})
    tensors = {name: np.ascontiguousarray(array) for name, array in model.params.items() if name != "lm_head.weight"}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
