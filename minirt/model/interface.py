"""What the engine knows of a model: a small interface, the same for every family.

Owns: `ModelConfig` and `Model`, the protocols the runner (minirt/engine/runner.py) and the rest
of minirt are typed on, so that a second family (minirt/model/registry.py lists them) is one new
module, not edits in the engine.  A config says the sizes the engine budgets and checks with:
layers, query heads, K/V heads (the KV cache and the KV budget are shaped by those), head size,
context, vocabulary, and the special tokens.  A model puts its weights on a backend and runs a
forward pass over a round's batch and a KV cache.

Must not know: any one family's weights, names or arithmetic; files, requests or sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

from .backend import Backend
from .batch import Batch
from .kv_cache import KVCache


class ModelConfig(Protocol):
    """The sizes and ids every family's config gives."""

    # config.json's model_type: the family (minirt/model/registry.py).
    @property
    def model_type(self) -> str: ...

    # V: the vocabulary.
    @property
    def vocab_size(self) -> int: ...

    # P: the context, the most positions a request may fill.
    @property
    def n_positions(self) -> int: ...

    # C: the width of the residual stream (and of the head's input).
    @property
    def n_embd(self) -> int: ...

    @property
    def n_layer(self) -> int: ...

    # H: query heads.
    @property
    def n_head(self) -> int: ...

    # G: key/value heads (G = H unless the family groups its queries).
    @property
    def n_kv_head(self) -> int: ...

    # D: the size of one head.
    @property
    def head_dim(self) -> int: ...

    # How many numbers its checkpoint holds (a tied head counted once).
    @property
    def n_weights(self) -> int: ...

    # The head is the token embedding when the checkpoint has no lm_head.weight.
    @property
    def tie_word_embeddings(self) -> bool: ...

    # One line of its sizes and switches, as `minirt inspect` shows them.
    @property
    def summary(self) -> str: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    # Every end id config.json names (Llama 3's several), eos_token_id first; () for none.
    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...


class Model(Protocol):
    """A model on a backend: one forward pass a round, KV caches for its rows, scoring."""

    @property
    def config(self) -> ModelConfig: ...

    # The folder it was loaded from.
    @property
    def folder(self) -> Path: ...

    @property
    def backend(self) -> Backend: ...

    # The compute dtype (a NumPy dtype).
    @property
    def dtype(self) -> Any: ...

    # Its weights on the backend, by the checkpoint's names (the head apart).
    @property
    def params(self) -> Mapping[str, Any]: ...

    # Learned numbers, a tied head counted once.
    @property
    def n_params(self) -> int: ...

    def forward(self, batch: Batch, kv_cache: KVCache | None = None, logits_at=None) -> Any:
        """fp32 logits [M, V] of one round, on the backend."""
        ...

    def logits(self, token_ids) -> Any:
        """Whole sequences scored without a KV cache: NumPy fp32 [B, T, V]."""
        ...

    def new_kv_cache(self, n_slots: int, capacity: int) -> KVCache:
        """KV buffers for n_slots requests of up to `capacity` positions each."""
        ...
