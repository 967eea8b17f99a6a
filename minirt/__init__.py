"""minirt: a GPT-2 inference runtime written from scratch in NumPy (CPU) and CuPy (GPU).

`LLM(model).generate(prompts, SamplingParams(...))` serves prompts in static groups (or with
`policy="continuous"`); `load_model(model).logits(token_ids)` scores sequences in one padded batch.
docs/walkthrough.md follows one request through the modules in the order to read them.
"""

from .model.backend import get_backend
from .loading.checkpoint import load_checkpoint
from .model.config import GPT2Config
from .errors import (
    BackendError,
    CheckpointError,
    InputError,
    MinirtError,
    RequestError,
    TokenizerError,
)
from .llm import LLM
from .engine.output import RequestOutput, TokenEvent
from .model.gpt2 import GPT2
from .llm import load_model
from .engine.params import SamplingParams
from .loading.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
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
__version__ = "0.1.0"
