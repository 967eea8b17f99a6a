"""The GPT-2 hyperparameters, from a Hugging Face `config.json`, checked.

Owns: `GPT2Config`, the fields the layers use, and the validation that turns a config the layers
cannot honour into a clear, one-line refusal instead of silently wrong numbers.

Must not know: weights, tensors, backends or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import CheckpointError


# Activation names Hugging Face uses for GPT-2's MLP, grouped by formula; GPT-2 was trained with
# tanh ("gelu_new").
GELU_TANH_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")
GELU_ERF_NAMES = ("gelu", "gelu_python")


# Options that change the computation in ways the layers do not implement: refused when on, not
# computed wrongly.
UNSUPPORTED_WHEN_TRUE = {
    "scale_attn_by_inverse_layer_idx": "attention scaled by 1/(layer index + 1)",
    "reorder_and_upcast_attn": "the reordered, upcast attention of Mistral-style training",
    "add_cross_attention": "cross-attention (an encoder-decoder GPT-2)",
    "is_encoder_decoder": "an encoder-decoder model",
}


# n_inner is optional.
REQUIRED_SIZES = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")


@dataclass(frozen=True)
class GPT2Config:
    """The numbers that fix every tensor's shape, and the few switches the layers honour."""

    # The family (minirt/model/registry.py).
    model_type: ClassVar[str] = "gpt2"

    # V: rows of wte and of the head.
    vocab_size: int
    # P: the context length, rows of wpe.
    n_positions: int
    # C: the width of the residual stream.
    n_embd: int
    # The number of transformer blocks.
    n_layer: int
    # H: attention heads; head_dim = C // H.
    n_head: int
    # I: the MLP's hidden width (4 * C unless the config says otherwise).
    n_inner: int
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    # Divide attention scores by sqrt(head_dim).
    scale_attn_weights: bool = True
    # The head is wte when lm_head.weight is absent.
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """GPT-2's one end id, as the families with several give theirs."""
        return () if self.eos_token_id is None else (self.eos_token_id,)

    @property
    def n_kv_head(self) -> int:
        """G: GPT-2 has a key/value head for each query head."""
        return self.n_head

    @property
    def n_weights(self) -> int:
        """How many numbers the checkpoint holds (a tied head counted once): Python integers, so
        never overflows."""
        C = self.n_embd
        I = self.n_inner  # noqa: E741 (I: the MLP's inner width, as in layers.py's shapes)
        # Two norms, attention, the MLP.
        block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * I + I) + (I * C + C)
        return (self.vocab_size + self.n_positions) * C + self.n_layer * block + 2 * C

    @property
    def summary(self) -> str:
        """Its sizes and switches in one line (`minirt inspect`'s config line)."""
        layers = "layer" if self.n_layer == 1 else "layers"
        heads = "head" if self.n_head == 1 else "heads"
        return (
            f"{self.n_layer} {layers}, {self.n_embd} wide, {self.n_head} {heads} "
            f"(head_dim {self.head_dim}), MLP {self.n_inner}, vocab {self.vocab_size}, "
            f"context {self.n_positions}, {self.activation_function} ({self.gelu_form}), "
            f"eps {self.layer_norm_epsilon:g}"
        )

    @property
    def gelu_form(self) -> str:
        """'tanh' or 'erf': which GELU formula the activation name stands for."""
        return "tanh" if self.activation_function in GELU_TANH_NAMES else "erf"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> GPT2Config:
        """Validate a parsed config.json and build the config, or raise CheckpointError."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object, found {type(raw).__name__}")
        refuse_other_models_and_options(raw, source)
        sizes = read_sizes(raw, source)
        eps = raw.get("layer_norm_epsilon", 1e-5)
        # nan and inf fail too.
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1):
            raise CheckpointError(
                f"{source}: layer_norm_epsilon must be a small positive number, found {eps!r}"
            )
        activation = raw.get("activation_function", "gelu_new")
        if activation not in GELU_TANH_NAMES + GELU_ERF_NAMES:
            raise CheckpointError(
                f"{source}: activation_function {activation!r} is not supported; minirt implements "
                f"the GELU forms {', '.join(GELU_TANH_NAMES + GELU_ERF_NAMES)}"
            )
        flags = {
            name: read_flag(raw, name, source)
            for name in ("scale_attn_weights", "tie_word_embeddings")
        }
        token_ids = {
            name: read_token_id(raw, name, source) for name in ("bos_token_id", "eos_token_id")
        }
        # Each checked above; Any: a mix of types.
        read: dict[str, Any] = {**sizes, **flags, **token_ids}
        return cls(**read, layer_norm_epsilon=float(eps), activation_function=activation)


def refuse_other_models_and_options(raw: dict[str, Any], source: str) -> None:
    """An option switched on that the layers do not implement (which family a config.json is,
    minirt/model/registry.py decides before this reads it)."""
    for option, meaning in UNSUPPORTED_WHEN_TRUE.items():
        if raw.get(option):
            raise CheckpointError(
                f"{source}: {option} is true ({meaning}), which minirt does not implement; "
                f"use a checkpoint with {option} false"
            )


def read_sizes(raw: dict[str, Any], source: str) -> dict[str, int]:
    """The sizes that fix every tensor's shape, by field name: REQUIRED_SIZES, then n_inner."""
    # Old configs (and OpenAI's original release) spell it n_ctx.
    if "n_positions" not in raw and "n_ctx" in raw:
        raw = {**raw, "n_positions": raw["n_ctx"]}
    sizes = {name: read_positive_int(raw, name, source) for name in REQUIRED_SIZES}
    if sizes["n_embd"] % sizes["n_head"]:
        raise CheckpointError(
            f"{source}: n_embd ({sizes['n_embd']}) must be divisible by n_head ({sizes['n_head']})"
        )
    if raw.get("n_inner") is None:
        sizes["n_inner"] = 4 * sizes["n_embd"]
    else:
        sizes["n_inner"] = read_positive_int(raw, "n_inner", source)
    return sizes


def read_positive_int(raw: dict[str, Any], name: str, source: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        if name not in raw:
            found = "missing"
        elif len(repr(value)) < 40:
            found = repr(value)
        else:
            found = f"{repr(value)[:37]}..."
        raise CheckpointError(
            f"{source}: {name} must be a positive integer below 2**63, found {found}"
        )
    return value


def read_flag(raw: dict[str, Any], name: str, source: str) -> bool:
    # GPT-2's two switches are on unless the config turns them off.
    value = raw.get(name, True)
    if not isinstance(value, bool):
        raise CheckpointError(f"{source}: {name} must be true or false, found {value!r}")
    return value


def read_token_id(raw: dict[str, Any], name: str, source: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    # Some configs wrap a single id in a list.
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(
            f"{source}: {name} must be a token id (an integer >= 0), found {value!r}"
        )
    # An id outside the vocabulary (a tiny model that kept GPT-2's 50256) is no error: see
    # `special_ids`, below.
    return value


def special_ids(
    eos_token_id: int | None,
    bos_token_id: int | None,
    vocab_size: int,
    endoftext: int | None = None,
) -> tuple[int | None, int | None]:
    """The (EOS, BOS) a runtime uses: each config id when it lies inside the vocabulary, else
    `<|endoftext|>` (GPT-2's id 50256, when the vocabulary has it); BOS falls back to EOS.  Used
    with and without a tokenizer."""

    def usable(token_id: int | None, fallback: int | None) -> int | None:
        return token_id if token_id is not None and 0 <= token_id < vocab_size else fallback

    eos = usable(eos_token_id, endoftext)
    return eos, usable(bos_token_id, endoftext if endoftext is not None else eos)
