"""What every decoder-only family's model does the same way: one round's forward pass around the
family's own layers, its checks, its KV caches, and scoring whole sequences.

Owns: `DecoderModel`, the base class of minirt/model/gpt2.py's `GPT2` and minirt/model/llama.py's
`Llama`.  Its `forward` checks what the round feeds in, readies the KV cache, asks the family for
the final hidden states of the round's tokens (`hidden_states`: its embedding, its blocks, its
last norm), advances the cache and runs the head on the tokens whose logits are asked for.  A
family sets `config`, `folder`, `backend`, `xp`, `dtype`, `params`, `head_weight` ([C, V] fp32),
`head_tiles` and `tables` (its embedding tables beside `params`) in its constructor.

Must not know: any one family's weights, names or arithmetic; files, tokenizers, requests,
sampling or scheduling.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from .batch import Batch, check_token_ids
from .kv_cache import KVCache
from .layers import lm_head


class DecoderModel:
    """The forward pass, checks, KV caches and scoring shared by the families (module docstring
    says what a family sets)."""

    config: Any
    backend: Any
    xp: Any
    dtype: Any
    params: dict[str, Any]
    head_weight: Any
    head_tiles: Any
    tables: list[Any]

    def hidden_states(self, batch: Batch, kv_cache: KVCache | None):
        """The round's real tokens through the family's embedding, blocks and last norm: [N, C]
        on the backend."""
        raise NotImplementedError

    @property
    def n_params(self) -> int:
        """Learned numbers, counting a tied head once."""
        tables = {id(a): a for a in (self.head_weight, *self.tables)}.values()
        return sum(int(array.size) for array in [*self.params.values(), *tables])

    def new_kv_cache(self, n_slots: int, capacity: int) -> KVCache:
        """Preallocate KV buffers for n_slots requests of up to `capacity` positions each: one
        key and one value per K/V head (fewer than the query heads under grouped-query
        attention, so the cache shrinks by that ratio)."""
        c = self.config
        if capacity > c.n_positions:
            raise ValueError(
                f"KV capacity {capacity} exceeds the model's context of {c.n_positions} positions"
            )
        return KVCache(self.xp, c.n_layer, c.n_kv_head, c.head_dim, n_slots, capacity, self.dtype)

    def forward(self, batch: Batch, kv_cache: KVCache | None = None, logits_at=None):
        """One forward pass of a round; returns fp32 logits [M, V] on the backend.  `logits_at`
        picks the packed tokens whose logits come back: by default each row's last token, where its
        next token comes from (the head, the biggest GEMM of a small model, runs on those alone).
        With a `kv_cache`, each row's new keys are written to its slot and the slot's length
        advances.  Everything fed in is checked here, on the host: on CuPy an index out of range
        wraps around silently, where NumPy raises."""
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
            x = self.hidden_states(batch, kv_cache)  # [N, C]
            if kv_cache is not None:
                kv_cache.advance(batch)
            if at is None:
                # At decode every token is some row's last: no gather.
                if batch.last_index.size != batch.n_tokens:
                    x = x[batch.device.last_index]  # [M, C]
            elif at.size != batch.n_tokens or not np.array_equal(at, np.arange(batch.n_tokens)):
                x = x[self.backend.asarray(at)]  # [M, C]
            return lm_head(self.xp, x, self.head_weight, self.head_tiles)  # [M, V] fp32

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
