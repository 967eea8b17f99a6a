"""The Llama family's hyperparameters (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2, Qwen3), from
a Hugging Face `config.json`, read as transformers reads it and checked.

Owns: `LlamaConfig`, the fields minirt/model/llama.py uses, and `LlamaConfig.from_dict`, which
reads the four model types' configs (their differences: Qwen2's biases on the Q/K/V projections,
Qwen3's per-head Q/K norms, Mistral's and Qwen's sliding window, Llama's `attention_bias` and
`mlp_bias`), both the field names of transformers 4 (`rope_theta`, `rope_scaling`) and of
transformers 5 (`rope_parameters`), and refuses in one line naming the field whatever the layers
do not compute (an unknown `rope_type`, an activation other than SiLU, ...).

A sliding window (Mistral 7B v0.1's 4096 of a 32768 context) is kept by shortening the context
to the window: a request that fits the window sees every key, which is exactly what the window
lets it see, and a longer one is refused as any request past the context is.

Must not know: weights, tensors, backends or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError
from .config import read_positive_int, read_token_id
from .rope import RopeSettings

# What each model_type's checkpoints are saved from, for messages.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# The activations transformers spells SiLU by.
SILU_NAMES = ("silu", "swish")

# The rope_type values minirt/model/rope.py computes ("default" is none).
ROPE_TYPES = ("default", "linear", "llama3")

REQUIRED_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)

# What transformers' config classes assume for a field config.json leaves out (save_pretrained
# writes only the fields that differ from these): Mistral's 8 K/V heads and 4096-token window,
# Qwen's 32 K/V heads, Qwen3's head_dim of 128.  A field given as null keeps its own meaning.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "qwen2": {"num_key_value_heads": 32},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128},
}

# Options that change the computation in ways the layers do not implement.
UNSUPPORTED_WHEN_TRUE = {
    "is_encoder_decoder": "an encoder-decoder model",
    "add_cross_attention": "cross-attention",
}


@dataclass(frozen=True)
class LlamaConfig:
    """The numbers that fix every tensor's shape, and the switches the Llama layers honour.  The
    names of the ModelConfig protocol (n_embd, n_head, ...) are minirt's; the comments give
    config.json's."""

    # "llama", "mistral", "qwen2" or "qwen3" (config.json's model_type).
    model_type: str
    vocab_size: int
    # max_position_embeddings, or the sliding window when shorter.
    n_positions: int
    # hidden_size
    n_embd: int
    # num_hidden_layers
    n_layer: int
    # num_attention_heads
    n_head: int
    # num_key_value_heads (grouped-query attention when fewer than n_head)
    n_kv_head: int
    # head_dim (hidden_size / num_attention_heads unless given: Qwen3's is not)
    head_dim: int
    # intermediate_size: the SwiGLU MLP's width
    n_inner: int
    rms_norm_eps: float
    rope: RopeSettings
    tie_word_embeddings: bool
    # Biases on the Q, K, V projections (Qwen2; Llama's attention_bias), and on the output one
    # (attention_bias alone).
    qkv_bias: bool
    o_bias: bool
    # mlp_bias: biases on the gate, up and down projections.
    mlp_bias: bool
    # Qwen3's RMSNorm of each query and key head, before the rotation.
    qk_norm: bool
    bos_token_id: int | None
    # The first of config.json's end ids; `eos_token_ids`, all of them.
    eos_token_id: int | None
    eos_token_ids: tuple[int, ...] = ()
    # max_position_embeddings as written, when a sliding window shortened the context.
    max_position_embeddings: int | None = None

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.model_type]

    @property
    def n_weights(self) -> int:
        """How many numbers the checkpoint holds (a tied head counted once)."""
        C = self.n_embd
        D = self.head_dim
        I = self.n_inner  # noqa: E741 (I: the MLP's width)
        H = self.n_head
        G = self.n_kv_head
        attention = C * (H + 2 * G) * D + H * D * C
        attention += (H + 2 * G) * D * self.qkv_bias + C * self.o_bias + 2 * D * self.qk_norm
        mlp = 3 * C * I + (2 * I + C) * self.mlp_bias
        block = 2 * C + attention + mlp
        head = 0 if self.tie_word_embeddings else self.vocab_size * C
        return self.vocab_size * C + head + self.n_layer * block + C

    @property
    def summary(self) -> str:
        """Its sizes and switches in one line (`minirt inspect`'s config line)."""
        rope = f"rope theta {self.rope.theta:g}"
        if self.rope.rope_type != "default":
            rope += f", {self.rope.rope_type} scaling x{self.rope.factor:g}"
        extras = [
            name
            for name, on in (
                ("Q/K/V bias", self.qkv_bias),
                ("output bias", self.o_bias),
                ("MLP bias", self.mlp_bias),
                ("Q/K norms", self.qk_norm),
                ("tied head", self.tie_word_embeddings),
            )
            if on
        ]
        context = f"context {self.n_positions}"
        if self.max_position_embeddings is not None:
            written = self.max_position_embeddings
            context += f" (the sliding window; max_position_embeddings {written})"
        return (
            f"{self.architecture}: {self.n_layer} layers, {self.n_embd} wide, {self.n_head} query "
            f"heads / {self.n_kv_head} K/V heads (head_dim {self.head_dim}), SwiGLU MLP "
            f"{self.n_inner}, vocab {self.vocab_size}, {context}, {rope}, "
            f"RMSNorm eps {self.rms_norm_eps:g}" + "".join(f", {extra}" for extra in extras)
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> LlamaConfig:
        """Validate a parsed config.json of the Llama family and build the config, or raise
        CheckpointError naming the field."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object, found {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type not in ARCHITECTURES:
            raise CheckpointError(f"{source}: model_type {model_type!r} is not of the Llama family")
        raw = {**FAMILY_DEFAULTS[model_type], **raw}
        refuse_unsupported(raw, source)
        sizes: dict[str, Any] = read_llama_sizes(raw, source)
        eos_ids = read_token_ids(raw, "eos_token_id", source)
        return cls(
            model_type=model_type,
            **sizes,
            n_positions=context_length(raw, model_type, source),
            rms_norm_eps=read_epsilon(raw, source),
            rope=read_rope(raw, source),
            tie_word_embeddings=read_flag(raw, "tie_word_embeddings", False, source),
            **read_biases(raw, model_type, source),
            qk_norm=model_type == "qwen3",
            bos_token_id=read_token_id(raw, "bos_token_id", source),
            eos_token_id=eos_ids[0] if eos_ids else None,
            eos_token_ids=eos_ids,
            max_position_embeddings=shortened_from(raw, model_type, source),
        )


def refuse_unsupported(raw: dict[str, Any], source: str) -> None:
    """An option on that the layers do not implement, or an activation other than SiLU."""
    for option, meaning in UNSUPPORTED_WHEN_TRUE.items():
        if raw.get(option):
            raise CheckpointError(
                f"{source}: {option} is true ({meaning}), which minirt does not implement"
            )
    activation = raw.get("hidden_act", "silu")
    if activation not in SILU_NAMES:
        raise CheckpointError(
            f"{source}: hidden_act {activation!r} is not supported; the Llama family's MLP is "
            "SwiGLU, and minirt implements it with SiLU ('silu')"
        )
    tp = raw.get("pretraining_tp", 1)
    if tp not in (None, 1):
        raise CheckpointError(
            f"{source}: pretraining_tp is {tp!r}; minirt computes the MLP whole (pretraining_tp 1)"
        )


def read_llama_sizes(raw: dict[str, Any], source: str) -> dict[str, int]:
    """The sizes, by minirt's names: vocab, width, layers, query heads, K/V heads, head_dim, the
    MLP's width."""
    sizes = {name: read_positive_int(raw, name, source) for name in REQUIRED_SIZES}
    n_head = sizes["num_attention_heads"]
    n_kv_head = n_head
    if raw.get("num_key_value_heads") is not None:
        n_kv_head = read_positive_int(raw, "num_key_value_heads", source)
    if n_head % n_kv_head:
        raise CheckpointError(
            f"{source}: num_attention_heads ({n_head}) must be a multiple of "
            f"num_key_value_heads ({n_kv_head}): each K/V head serves a whole group of query heads"
        )
    if raw.get("head_dim") is not None:
        head_dim = read_positive_int(raw, "head_dim", source)
    elif sizes["hidden_size"] % n_head:
        raise CheckpointError(
            f"{source}: hidden_size ({sizes['hidden_size']}) must be divisible by "
            f"num_attention_heads ({n_head}) when config.json gives no head_dim"
        )
    else:
        head_dim = sizes["hidden_size"] // n_head
    if head_dim % 2:
        raise CheckpointError(
            f"{source}: head_dim is {head_dim}, but the rotary embedding turns features in pairs: "
            "it must be even"
        )
    return {
        "vocab_size": sizes["vocab_size"],
        "n_embd": sizes["hidden_size"],
        "n_layer": sizes["num_hidden_layers"],
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "head_dim": head_dim,
        "n_inner": sizes["intermediate_size"],
    }


def read_epsilon(raw: dict[str, Any], source: str) -> float:
    eps = raw.get("rms_norm_eps", 1e-6)
    # nan and inf fail too.
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1):
        raise CheckpointError(
            f"{source}: rms_norm_eps must be a small positive number, found {eps!r}"
        )
    return float(eps)


def read_flag(raw: dict[str, Any], name: str, default: bool, source: str) -> bool:
    value = raw.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"{source}: {name} must be true or false, found {value!r}")
    return value


def read_biases(raw: dict[str, Any], model_type: str, source: str) -> dict[str, bool]:
    """Which projections carry biases: Qwen2's Q/K/V always; Llama's and Qwen3's as
    attention_bias says (all four); Llama's MLP as mlp_bias says; Mistral's none."""
    attention_bias = False
    if model_type in ("llama", "qwen3"):
        attention_bias = read_flag(raw, "attention_bias", False, source)
    mlp_bias = read_flag(raw, "mlp_bias", False, source) if model_type == "llama" else False
    return {
        "qkv_bias": attention_bias or model_type == "qwen2",
        "o_bias": attention_bias,
        "mlp_bias": mlp_bias,
    }


def read_token_ids(raw: dict[str, Any], name: str, source: str) -> tuple[int, ...]:
    """A token id field that may be one id or a list of them (Llama 3's several end ids)."""
    value = raw.get(name)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    ids = [read_token_id({name: one}, name, source) for one in values]
    return tuple(token for token in ids if token is not None)


def read_rope(raw: dict[str, Any], source: str) -> RopeSettings:
    """The rotary embedding's base and scaling: transformers 5's `rope_parameters`, or
    transformers 4's `rope_theta` and `rope_scaling` (whose type may be spelt `type`)."""
    parameters = raw.get("rope_parameters")
    field = "rope_parameters"
    if parameters is None:
        parameters = raw.get("rope_scaling") or {}
        field = "rope_scaling"
    if not isinstance(parameters, dict):
        raise CheckpointError(f"{source}: {field} must be an object, found {parameters!r}")
    # A top-level rope_theta counts where the object gives none (transformers folds it in).
    if "rope_theta" in raw:
        parameters = {"rope_theta": raw["rope_theta"], **parameters}
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{source}: {field} has rope_type {rope_type!r}, which minirt does not implement; "
            f"it computes {', '.join(repr(name) for name in ROPE_TYPES)}"
        )
    settings: dict[str, Any] = {"rope_type": rope_type}
    settings["theta"] = read_rope_number(parameters, "rope_theta", 10000.0, field, source)
    if rope_type in ("linear", "llama3"):
        settings["factor"] = read_rope_number(parameters, "factor", None, field, source)
    if rope_type == "llama3":
        for name, default in (("low_freq_factor", 1.0), ("high_freq_factor", 4.0)):
            settings[name] = read_rope_number(parameters, name, default, field, source)
        original = parameters.get("original_max_position_embeddings")
        settings["original_max_position_embeddings"] = read_positive_int(
            {"original_max_position_embeddings": original},
            "original_max_position_embeddings",
            f"{source} ({field})",
        )
        if settings["high_freq_factor"] <= settings["low_freq_factor"]:
            raise CheckpointError(
                f"{source}: {field}'s high_freq_factor must be above its low_freq_factor"
            )
    return RopeSettings(**settings)


def read_rope_number(
    parameters: dict[str, Any], name: str, default: float | None, field: str, source: str
) -> float:
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e12:
        raise CheckpointError(
            f"{source}: {field}'s {name} must be a positive number, found {value!r}"
        )
    return float(value)


def sliding_window(raw: dict[str, Any], model_type: str, source: str) -> int | None:
    """The sliding window the config switches on, or None: Mistral's `sliding_window`; Qwen's
    only with `use_sliding_window` true; Llama has none."""
    if model_type == "llama":
        return None
    if model_type in ("qwen2", "qwen3") and not read_flag(raw, "use_sliding_window", False, source):
        return None
    if raw.get("sliding_window") is None:
        return None
    return read_positive_int(raw, "sliding_window", source)


def context_length(raw: dict[str, Any], model_type: str, source: str) -> int:
    """max_position_embeddings, or the sliding window when that is shorter (module docstring)."""
    context = read_positive_int(raw, "max_position_embeddings", source)
    window = sliding_window(raw, model_type, source)
    return context if window is None else min(context, window)


def shortened_from(raw: dict[str, Any], model_type: str, source: str) -> int | None:
    """max_position_embeddings when a sliding window shortened the context, else None."""
    context = read_positive_int(raw, "max_position_embeddings", source)
    window = sliding_window(raw, model_type, source)
    return context if window is not None and window < context else None
