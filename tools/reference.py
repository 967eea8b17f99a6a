"""Reference models built with Hugging Face transformers (a tool, never imported by minirt/).

Owns: building seeded, random-weight GPT2LMHeadModels in any config, saving
them in the layouts minirt must read (prefix or not, tied or not, F32/F16/BF16,
one file or shards), and computing the reference's logits and greedy tokens.

Used by tools/make_fixtures.py (which commits small fixtures under tests/) and
by the tests' live comparisons whenever torch and transformers import.

Random weights are drawn wider than transformers' default init (std 0.02), so
logits spread out and greedy decoding has clear top-2 margins instead of near-ties.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()  # tiny vocabularies make transformers warn about GPT-2's 50256

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def build_model(seed: int = 0, **config_fields) -> GPT2LMHeadModel:
    """A seeded random-weight GPT2LMHeadModel with every parameter drawn at a useful scale."""
    fields = {
        "n_layer": 2,
        "n_embd": 32,
        "n_head": 4,
        "vocab_size": 128,
        "n_positions": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    fields.update(config_fields)
    config = GPT2Config(**fields)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            elif name.endswith(("wte.weight", "wpe.weight")):
                param.copy_(0.5 * noise)
            else:  # a projection stored [in, out] (lm_head, if untied, is [V, C])
                fan_in = param.shape[0] if not name.startswith("lm_head") else param.shape[1]
                param.copy_(noise / math.sqrt(fan_in))
    return model


def round_weights(model: GPT2LMHeadModel, file_dtype: str) -> GPT2LMHeadModel:
    """Round the weights to the file's precision and back, so the fp32 reference sees what the file holds."""
    if file_dtype != "F32":
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(TORCH_DTYPES[file_dtype]).float())
    return model


def save_checkpoint(
    model: GPT2LMHeadModel,
    folder: Path,
    file_dtype: str = "F32",
    prefix: bool = True,
    keep_mask_buffers: bool = False,
    shards: int = 1,
) -> None:
    """Write config.json and the weights the way Hugging Face lays them out, with variations."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    for noisy in ("transformers_version", "dtype", "torch_dtype", "_name_or_path"):
        config.pop(noisy, None)
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tensors = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # tied: the head is wte, as save_pretrained writes it
        stored = (
            name if prefix or not name.startswith("transformer.") else name[len("transformer.") :]
        )
        tensors[stored] = param.detach().to(TORCH_DTYPES[file_dtype]).contiguous().clone()
    if keep_mask_buffers:  # old checkpoints carry the causal-mask buffers; minirt must skip them
        n = model.config.n_positions
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
        for i in range(model.config.n_layer):
            p = "transformer." if prefix else ""
            tensors[f"{p}h.{i}.attn.bias"] = mask.clone()
            tensors[f"{p}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)

    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        shard_name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(
            {n: tensors[n] for n in part}, str(folder / shard_name), metadata={"format": "pt"}
        )
        weight_map.update({n: shard_name for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True) + "\n"
    )


def reference_logits(model: GPT2LMHeadModel, sequences: list[list[int]]) -> np.ndarray:
    """fp32 logits, each sequence run alone (no padding at all): [B, max_len, V], zeros past each length."""
    max_len = max(len(s) for s in sequences)
    out = np.zeros((len(sequences), max_len, model.config.vocab_size), dtype=np.float32)
    with torch.no_grad():
        for b, seq in enumerate(sequences):
            if seq:
                out[b, : len(seq)] = model(torch.tensor([seq])).logits[0].float().numpy()
    return out


def reference_greedy(
    model: GPT2LMHeadModel, prompt: list[int], steps: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens by full recompute, with each step's top-2 logit margin."""
    tokens, margins = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([tokens])).logits[0, -1].float()
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            tokens.append(int(torch.argmax(logits)))
    return tokens[len(prompt) :], margins


GPT2_VOCAB = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpt2-vocab"


def make_gpt2_124m(folder: Path, seed: int = 0) -> Path:
    """A random-weight gpt2-124M (transformers' own init), written by save_pretrained, unless already there.

    OpenAI's real GPT-2 vocabulary goes beside it (as vocab.json + merges.txt),
    so text prompts work; the weights are random, so the text that comes out is not.
    """
    import shutil

    folder = Path(folder)
    if not ((folder / "config.json").is_file() and (folder / "model.safetensors").is_file()):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(
            GPT2Config()
        )  # the gpt2 defaults: 12 x 768, 50257 tokens, 1024 positions
        model.save_pretrained(folder)
    if not (folder / "vocab.json").is_file():
        shutil.copy(GPT2_VOCAB / "encoder.json", folder / "vocab.json")
        shutil.copy(GPT2_VOCAB / "vocab.bpe", folder / "merges.txt")
    return folder


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "make-124m":
        raise SystemExit(
            "usage: python tools/reference.py make-124m FOLDER   "
            "(a random-weight gpt2-124M with GPT-2's vocabulary)"
        )
    print(f"wrote {make_gpt2_124m(Path(sys.argv[2]))}")
