"""minirt: a GPT-2 inference runtime written from scratch in NumPy (CPU) and CuPy (GPU).

Start here:
  * `load_model(model, backend="numpy", dtype="float32")` loads a checkpoint
    (a folder, or a hub id found in the local Hugging Face cache);
  * `model.logits(token_ids)` scores sequences of different lengths in one
    padded batch;
  * `load_tokenizer(folder)` turns text into ids and back.

Where things live (each module's docstring says what it owns):
  config.py      the hyperparameters, checked            checkpoint.py  finding and reading weights
  tokenizer.py   text <-> ids                            backend.py     numpy or cupy (`xp`)
  batch.py       one round's padded batch metadata       kv_cache.py    per-request key/value buffers
  model.py       the layers and the forward pass
"""

from .backend import get_backend
from .checkpoint import load_checkpoint
from .config import GPT2Config
from .errors import BackendError, CheckpointError, MinirtError, TokenizerError
from .model import GPT2, InputError, load_model
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "GPT2", "GPT2Config", "Tokenizer", "get_backend", "load_checkpoint", "load_model", "load_tokenizer",
    "MinirtError", "CheckpointError", "BackendError", "TokenizerError", "InputError",
]
__version__ = "0.1.0"
