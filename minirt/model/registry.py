"""Which model class runs a checkpoint, picked from its config.json.

Owns: `FAMILIES`, the model families minirt runs, each by config.json's `model_type` (how its
config is read, the checkpoint architecture and tensors it reads, the prefix its tensor names
carry, its model class): GPT-2 (minirt/model/gpt2.py) and the Llama family, "llama",
"mistral", "qwen2" and "qwen3" (minirt/model/llama.py);
`family_for`, which picks one for a parsed config.json (an old GPT-2 config has no model_type:
GPT-2) or refuses, in one line, a family minirt does not run; and `build_model`, which builds a
loaded checkpoint's model.  Adding a family is one entry here and one module beside
minirt/model/gpt2.py.

Must not know: files (minirt/loading/ reads them), requests or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CheckpointError
from .backend import Backend
from .config import GPT2Config
from .gpt2 import GPT2, expected_shapes
from .interface import Model, ModelConfig
from .llama import Llama
from .llama import expected_shapes as llama_shapes
from .llama_config import ARCHITECTURES as LLAMA_ARCHITECTURES
from .llama_config import LlamaConfig


@dataclass(frozen=True)
class ModelFamily:
    """One family: how its config is read, which tensors its checkpoints hold, and the class
    that runs it (built as `model_class(checkpoint, backend, dtype, batch_invariant=...)`)."""

    model_type: str
    # The Hugging Face class its checkpoints are saved from, for messages.
    architecture: str
    # A parsed config.json (and where it came from, for messages) -> its checked config.
    read_config: Callable[[dict[str, Any], str], ModelConfig]
    # Every learned tensor's canonical name, and the shape the config implies.
    expected_shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    # (a loaded checkpoint, a backend, the compute dtype) -> the model.
    model_class: Callable[..., Model]
    # The prefix its checkpoints put before the canonical names (dropped when read).
    prefix: str
    # The canonical name of its token embedding (the head when tied).
    embedding: str


FAMILIES = {
    "gpt2": ModelFamily(
        model_type="gpt2",
        architecture="GPT2LMHeadModel",
        read_config=GPT2Config.from_dict,
        expected_shapes=expected_shapes,
        model_class=GPT2,
        prefix="transformer.",
        embedding="wte.weight",
    ),
    **{
        model_type: ModelFamily(
            model_type=model_type,
            architecture=architecture,
            read_config=LlamaConfig.from_dict,
            expected_shapes=llama_shapes,
            model_class=Llama,
            prefix="model.",
            embedding="embed_tokens.weight",
        )
        for model_type, architecture in LLAMA_ARCHITECTURES.items()
    },
}

# A config.json without a model_type (OpenAI's original GPT-2 release) is GPT-2's.
DEFAULT_MODEL_TYPE = "gpt2"


def family_for(raw: dict[str, Any], source: str) -> ModelFamily:
    """The family of a parsed config.json, or a CheckpointError naming its model_type."""
    model_type = raw.get("model_type", DEFAULT_MODEL_TYPE)
    if model_type is None:
        model_type = DEFAULT_MODEL_TYPE
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        known = ", ".join(repr(name) for name in FAMILIES)
        raise CheckpointError(
            f"{source}: model_type is {model_type!r}, which minirt does not run; "
            f"it runs the model types {known} (docs/models.md)"
        )
    return family


def family_of(config: ModelConfig) -> ModelFamily:
    """The family of a checked config (each config class says its model_type)."""
    return FAMILIES[config.model_type]


def build_model(checkpoint: Any, backend: Backend, dtype, batch_invariant: bool = False) -> Model:
    """The model of a loaded checkpoint (minirt/loading's `Checkpoint`), on a backend: its
    family's class (`batch_invariant`: exact batch invariance, minirt/model/invariant.py)."""
    model_class = family_of(checkpoint.config).model_class
    return model_class(checkpoint, backend, dtype, batch_invariant=batch_invariant)
