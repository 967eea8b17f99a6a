"""minirt: an inference runtime for GPT-2 and the Llama family (Llama 2/3, SmolLM2, TinyLlama,
Mistral, Qwen2, Qwen3), written from scratch in NumPy (CPU) and CuPy (GPU).

`LLM(model).generate(prompts, SamplingParams(...))` serves prompts in static groups (or with
`policy="continuous"`); `LLM(model).chat(messages)` renders the model's chat template first;
`load_model(model).logits(token_ids)` scores sequences in one padded batch.
docs/walkthrough.md follows one request through the modules in the order to read them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each name the package exports, and the module it lives in.  They are imported when first used
# (PEP 562), so that `import minirt` alone, and the `minirt` command before it knows its
# subcommand, load nothing heavy: a Ctrl-C in a command's first instant is then the command's
# own one line, not a traceback from inside an import.
EXPORTS = {
    "LLM": ".llm",
    "SamplingParams": ".engine.params",
    "RequestOutput": ".engine.output",
    "CompletionOutput": ".engine.output",
    "Logprob": ".engine.output",
    "TokenEvent": ".engine.output",
    "GPT2": ".model.gpt2",
    "GPT2Config": ".model.config",
    "Tokenizer": ".loading.tokenizer",
    "get_backend": ".model.backend",
    "load_checkpoint": ".loading.checkpoint",
    "load_model": ".llm",
    "load_tokenizer": ".loading.tokenizer",
    "MinirtError": ".errors",
    "CheckpointError": ".errors",
    "BackendError": ".errors",
    "TokenizerError": ".errors",
    "RequestError": ".errors",
    "InputError": ".errors",
}

# The same names, written out so that linters and type checkers see them.
__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "TokenEvent",
    "GPT2",
    "GPT2Config",
    "Tokenizer",
    "get_backend",
    "load_checkpoint",
    "load_model",
    "load_tokenizer",
    "MinirtError",
    "CheckpointError",
    "BackendError",
    "TokenizerError",
    "RequestError",
    "InputError",
]

if TYPE_CHECKING:
    from .engine.output import CompletionOutput, Logprob, RequestOutput, TokenEvent
    from .engine.params import SamplingParams
    from .errors import (
        BackendError,
        CheckpointError,
        InputError,
        MinirtError,
        RequestError,
        TokenizerError,
    )
    from .llm import LLM, load_model
    from .loading.checkpoint import load_checkpoint
    from .loading.tokenizer import Tokenizer, load_tokenizer
    from .model.backend import get_backend
    from .model.config import GPT2Config
    from .model.gpt2 import GPT2


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'minirt' has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name], __name__), name)
    # Found once: the next lookup is a plain attribute.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])


__version__ = "0.1.0"
