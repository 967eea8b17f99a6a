"""The GPT-2 hyperparameters, read from a Hugging Face `config.json` and checked.

Owns: `GPT2Config`, the fields the layers use, and the validation that turns a
config the layers cannot honour into a clear, one-line refusal instead of
silently wrong numbers.

Must not know: weights, tensors, backends or tokenizers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError

# Activation names Hugging Face uses for GPT-2's MLP, grouped by the formula.
# The tanh approximation is what GPT-2 was trained with ("gelu_new").
GELU_TANH_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")
GELU_ERF_NAMES = ("gelu", "gelu_python")

# Options that change the computation in ways the layers do not implement.
# Each is refused when switched on, rather than computed wrongly.
UNSUPPORTED_WHEN_TRUE = {
    "scale_attn_by_inverse_layer_idx": "attention scaled by 1/(layer index + 1)",
    "reorder_and_upcast_attn": "the reordered, upcast attention of Mistral-style training",
    "add_cross_attention": "cross-attention (an encoder-decoder GPT-2)",
    "is_encoder_decoder": "an encoder-decoder model",
}


@dataclass(frozen=True)
class GPT2Config:
    """The numbers that fix every tensor's shape, and the few switches the layers honour."""

    vocab_size: int  # V: rows of wte and of the head
    n_positions: int  # P: the context length, rows of wpe
    n_embd: int  # C: the width of the residual stream
    n_layer: int  # number of transformer blocks
    n_head: int  # H: attention heads; head_dim = C // H
    n_inner: int  # I: the MLP's hidden width (4 * C unless the config says otherwise)
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True  # divide attention scores by sqrt(head_dim)
    tie_word_embeddings: bool = True  # head = wte when lm_head.weight is absent
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def gelu_form(self) -> str:
        """'tanh' or 'erf': which GELU formula the activation name stands for."""
        return "tanh" if self.activation_function in GELU_TANH_NAMES else "erf"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> GPT2Config:
        """Validate a parsed config.json and build the config, or raise CheckpointError."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object, found {type(raw).__name__}")

        model_type = raw.get("model_type")
        if model_type is not None and model_type != "gpt2":
            raise CheckpointError(
                f"{source}: model_type is {model_type!r}, but minirt runs GPT-2 only (model_type 'gpt2')"
            )
        for option, meaning in UNSUPPORTED_WHEN_TRUE.items():
            if raw.get(option):
                raise CheckpointError(
                    f"{source}: {option} is true ({meaning}), which minirt does not implement; "
                    f"use a checkpoint with {option} false"
                )

        def positive_int(name: str, default: Any = None) -> int:
            value = raw.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                found = "missing" if name not in raw else repr(value)
                raise CheckpointError(f"{source}: {name} must be a positive integer, found {found}")
            return value

        # Old configs (and the original OpenAI release) spell n_positions as n_ctx.
        if "n_positions" not in raw and "n_ctx" in raw:
            raw = {**raw, "n_positions": raw["n_ctx"]}
        vocab_size = positive_int("vocab_size")
        n_positions = positive_int("n_positions")
        n_embd = positive_int("n_embd")
        n_layer = positive_int("n_layer")
        n_head = positive_int("n_head")
        if n_embd % n_head:
            raise CheckpointError(
                f"{source}: n_embd ({n_embd}) must be divisible by n_head ({n_head})"
            )
        n_inner = 4 * n_embd if raw.get("n_inner") is None else positive_int("n_inner")

        eps = raw.get("layer_norm_epsilon", 1e-5)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1) or not math.isfinite(eps):
            raise CheckpointError(
                f"{source}: layer_norm_epsilon must be a small positive number, found {eps!r}"
            )

        activation = raw.get("activation_function", "gelu_new")
        if activation not in GELU_TANH_NAMES + GELU_ERF_NAMES:
            raise CheckpointError(
                f"{source}: activation_function {activation!r} is not supported; "
                f"minirt implements the GELU forms {', '.join(GELU_TANH_NAMES + GELU_ERF_NAMES)}"
            )

        def flag(name: str, default: bool) -> bool:
            value = raw.get(name, default)
            if not isinstance(value, bool):
                raise CheckpointError(f"{source}: {name} must be true or false, found {value!r}")
            return value

        def optional_token_id(name: str) -> int | None:
            value = raw.get(name)
            if value is None:
                return None
            if isinstance(value, list) and len(value) == 1:  # some configs wrap a single id in a list
                value = value[0]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"{source}: {name} must be a token id (an integer >= 0), found {value!r}")
            # An id outside the vocabulary (a tiny model that kept GPT-2's 50256) is not an
            # error here; the tokenizer module decides which special ids are usable.
            return value

        return cls(
            vocab_size=vocab_size,
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_inner=n_inner,
            layer_norm_epsilon=float(eps),
            activation_function=activation,
            scale_attn_weights=flag("scale_attn_weights", True),
            tie_word_embeddings=flag("tie_word_embeddings", True),
            bos_token_id=optional_token_id("bos_token_id"),
            eos_token_id=optional_token_id("eos_token_id"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> GPT2Config:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no config.json here; a model folder needs config.json beside its weights") from None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read config ({exc.strerror})") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        return cls.from_dict(raw, source=str(path))
