"""GPT-2's weights on a backend, and the one way through them: `GPT2.forward(batch, kv_cache)`.

Owns: `GPT2`, which takes a loaded checkpoint's tensors onto a backend in the compute dtype (the
head stored [C, V] in fp32), runs one round's forward pass over minirt/model/layers.py, allocates
KV caches, and scores whole sequences without one (`logits`).

Must not know: files, tokenizers, requests, sampling or scheduling.  It takes any object with
`config`, `folder`, `tensors` and `head_is_tied` (minirt/loading/checkpoint.py's `Checkpoint` is
one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from ..errors import InputError
from .backend import Backend
from .config import GPT2Config
from .batch import Batch, check_token_ids
from .kv_cache import KVCache
from .layers import (
    LayerNorm,
    block_weights,
    elementwise_chains,
    embed,
    layer_norm,
    lm_head,
    transformer_block,
)


class LoadedWeights(Protocol):
    """What the model is built from: a checkpoint's config and tensors (minirt/loading's
    `Checkpoint`).  The members are read-only, so that a dict of NumPy arrays is a Mapping."""

    @property
    def config(self) -> GPT2Config: ...

    @property
    def folder(self) -> Path: ...

    # Canonical name -> host array in the file's precision.
    @property
    def tensors(self) -> Mapping[str, Any]: ...

    # The head is wte (no lm_head.weight of its own).
    @property
    def head_is_tied(self) -> bool: ...


class GPT2:
    """GPT-2's weights on a backend, and the forward pass over one round."""

    def __init__(self, checkpoint: LoadedWeights, backend: Backend, dtype):
        self.config = checkpoint.config
        self.folder = checkpoint.folder
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        # A weight past float16's range becomes inf: forward checks.
        with np.errstate(over="ignore"):
            # No copy on NumPy when the file's dtype is the compute dtype: a view of the mapped
            # file.
            self.params = {
                name: backend.asarray(host).astype(self.dtype, copy=False)
                for name, host in checkpoint.tensors.items()
                if name not in ("wte.weight", "lm_head.weight")
            }
            # The head [M, C] @ [C, V] (a decode step's biggest GEMM) runs faster on a contiguous
            # [C, V] than on the file's [V, C] transposed (1.1-1.2x at batch 8-32 under OpenBLAS's
            # SkylakeX kernel, docs/performance.md): stored once so, fp32.  A
            # tied model's embeddings are its columns; an untied model's are a [C, V] view of its
            # own table (no copy on NumPy).
            tensors = checkpoint.tensors
            self.head_weight = backend.transposed(tensors["lm_head.weight"], np.float32)  # [C, V]
            if checkpoint.head_is_tied:
                self.wte_t = self.head_weight  # [C, V] fp32
            else:
                wte = backend.asarray(tensors["wte.weight"]).astype(self.dtype, copy=False)
                self.wte_t = wte.T  # [C, V]
        # GELU, layer norm's tail, softmax's exp: one kernel each on CuPy, made once here.
        self.chains = elementwise_chains(self.xp)
        p = self.params
        self.wpe = p["wpe.weight"]  # [P, C]
        self.blocks = [block_weights(p, i) for i in range(self.config.n_layer)]
        self.ln_f = LayerNorm(p["ln_f.weight"], p["ln_f.bias"])

    @property
    def n_params(self) -> int:
        """Learned numbers, counting a tied head once."""
        tables = {id(a): a for a in (self.head_weight, self.wte_t)}.values()
        return sum(int(array.size) for array in [*self.params.values(), *tables])

    def new_kv_cache(self, n_slots: int, capacity: int) -> KVCache:
        """Preallocate KV buffers for n_slots requests of up to `capacity` positions each."""
        c = self.config
        if capacity > c.n_positions:
            raise ValueError(
                f"KV capacity {capacity} exceeds the model's context of {c.n_positions} positions"
            )
        return KVCache(self.xp, c.n_layer, c.n_head, c.head_dim, n_slots, capacity, self.dtype)

    def forward(self, batch: Batch, kv_cache: KVCache | None = None, logits_at=None):
        """One forward pass of a round; returns fp32 logits [M, V] on the backend.  `logits_at`
        picks the packed tokens whose logits come back: by default each row's last token, where its
        next token comes from (the head, the biggest GEMM of a small model, runs on those alone).
        With a `kv_cache`, each row's new keys are written to its slot and the slot's length
        advances.  Everything fed in is checked here, on the host: on CuPy an index out of range
        wraps around silently, where NumPy raises."""
        xp = self.xp
        c = self.config
        self.check_round(batch)
        at = self.rows_for_logits(batch, logits_at)  # [M] or None: each row's last token
        # Without a cache there is no history to attend to.
        if kv_cache is None and batch.past_lens.any():
            raise InputError(
                "a round with past keys (past_lens > 0) needs the KV cache that holds them"
            )
        if kv_cache is not None:
            kv_cache.prepare_round(batch)
        # NaN/inf weights, float16 overflow: callers check.
        with np.errstate(over="ignore", invalid="ignore"):
            device = batch.device
            x = embed(self.wte_t, self.wpe, device.token_ids, device.positions)  # [N, C]
            for i, block in enumerate(self.blocks):
                kv = None if kv_cache is None else kv_cache.layer(i)
                x = transformer_block(xp, self.chains, x, block, c, batch, kv)  # [N, C]
            x = layer_norm(xp, self.chains, x, self.ln_f, c.layer_norm_epsilon)  # [N, C]
            if kv_cache is not None:
                kv_cache.advance(batch)
            if at is None:
                # At decode every token is some row's last: no gather.
                if batch.last_index.size != batch.n_tokens:
                    x = x[device.last_index]  # [M, C]
            elif at.size != batch.n_tokens or not np.array_equal(at, np.arange(batch.n_tokens)):
                x = x[self.backend.asarray(at)]  # [M, C]
            return lm_head(xp, x, self.head_weight)  # [M, V] fp32

    def check_round(self, batch: Batch) -> None:
        """Refuse (InputError) a round whose token ids or positions the model has no row for."""
        c = self.config
        if int(batch.positions.max(initial=0)) >= c.n_positions:
            raise InputError(
                f"a position reaches {int(batch.positions.max())}, "
                f"past the context of {c.n_positions}"
            )
        ids = batch.token_ids  # [N]
        outside = (ids < 0) | (ids >= c.vocab_size)  # [N]
        if outside.any():
            bad = int(ids[outside][0])
            raise InputError(
                f"token id {bad} is outside the vocabulary [0, {c.vocab_size}) of this model"
            )

    @staticmethod
    def rows_for_logits(batch: Batch, logits_at) -> np.ndarray | None:
        """`logits_at` as packed token indices [M], each within the round's N tokens (an
        InputError otherwise); None for the default, each row's last token."""
        if logits_at is None:
            return None
        at = np.asarray(logits_at)
        # An empty list reads as float64: no index at all.
        if at.size == 0:
            at = at.astype(np.int64)
        if at.ndim != 1 or at.dtype.kind not in "iu":
            raise InputError("logits_at must be a 1-D list of integer token indices")
        at = at.astype(np.int64)  # [M]
        outside = (at < 0) | (at >= batch.n_tokens)  # [M]
        if outside.any():
            raise InputError(
                f"logits_at index {int(at[outside][0])} is outside the round's "
                f"{batch.n_tokens} tokens"
            )
        return at

    def logits(self, token_ids) -> np.ndarray:
        """Score whole sequences of different lengths in one padded batch, without a KV cache:
        NumPy fp32 logits [B, max_len, V], where row b's first len(token_ids[b]) positions are its
        logits (padding: 0)."""
        if isinstance(token_ids, np.ndarray) or not isinstance(token_ids, (list, tuple)):
            raise InputError("token_ids must be a list of token-id lists, one per sequence")
        V = self.config.vocab_size
        P = self.config.n_positions
        rows = [
            check_token_ids(seq, V, f"sequence {b}", max_len=P) for b, seq in enumerate(token_ids)
        ]
        # Nothing to score.
        if not any(rows):
            return np.zeros((len(rows), 0, V), dtype=np.float32)
        batch = Batch(rows, self.backend)
        logits = self.forward(batch, logits_at=np.arange(batch.n_tokens))  # [N, V]
        return batch.unpack_on_host(self.backend.to_numpy(logits))  # [B, T, V]
