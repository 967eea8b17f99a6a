"""minirt: a GPT-2 inference runtime written from scratch in NumPy (CPU) and CuPy (GPU).

Start here:
  * `load_model(model, backend="numpy", dtype="float32")` loads a checkpoint
    (a folder, or a hub id found in the local Hugging Face cache);
  * `model.logits(token_ids)` scores sequences of different lengths in one
    padded batch;
  * `load_tokenizer(folder)` turns text into ids and back;
  * `LLM(model).generate(prompts, SamplingParams(...))` serves prompts in
    static groups, or with `policy="continuous"` (`python -m minirt.generate`
    is the same on the command line; `python -m minirt.rounds` counts rounds).

Where things live (each module's docstring says what it owns):
  config.py      the hyperparameters, checked            checkpoint.py  finding and reading weights
  tokenizer.py   text <-> ids                            backend.py     numpy or cupy (`xp`)
  batch.py       one round's padded batch metadata       kv_cache.py    per-request key/value buffers
  model.py       the layers and the forward pass       sampling.py    SamplingParams, choosing a token
  request.py     one request's own state and stops      engine.py      the serving loop
  llm.py         the Python API                         generate.py    the command line
  prompt_file.py reading .txt / .jsonl prompts          report.py      output, progress, trace, summary
  scheduler.py   static groups or continuous batching   rounds.py      simulating both, counted in rounds
  evaluate.py    loss and perplexity of a text          inspect.py     describe a checkpoint
"""

from .backend import get_backend
from .checkpoint import load_checkpoint
from .config import GPT2Config
from .errors import BackendError, CheckpointError, MinirtError, TokenizerError
from .llm import LLM
from .model import GPT2, InputError, load_model
from .sampling import RequestError, SamplingParams
from .tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "LLM", "SamplingParams", "RequestError", "GPT2", "GPT2Config", "Tokenizer", "get_backend", "load_checkpoint", "load_model", "load_tokenizer",
    "MinirtError", "CheckpointError", "BackendError", "TokenizerError", "InputError",
]
__version__ = "0.1.0"
