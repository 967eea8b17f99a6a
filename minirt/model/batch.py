"""One round's batch metadata: what a forward pass needs to know about each row, on the host and on the backend.

Owns: `Batch`, built once per round from each row's new tokens, its KV slot and the keys that slot already
holds, with everything derived from those numbers; `attention_mask`; and `check_token_ids`, the one check of
what a model may be fed.

Row b brings `new_lens[b]` new tokens (its whole prompt at prefill, one per decode step) and already has
`past_lens[b]` keys in its slot.  What keeps padding from mattering is an explicit per-row number here:

  * positions: row b's tokens sit at past_lens[b] + 0, 1, ..., where its own history ends, whatever its
    neighbours;
  * the packed layout: only real tokens go through the weight GEMMs, as N = sum(new_lens) rows; a decode
    step's attention alone lays them out padded, [B, T, ...] with T = max(new_lens) (`padded` / `packed`
    convert), while a prompt's attends row by row (`query_tiles`, `mask_tile`);
  * kv_lens = past_lens + new_lens, from which the mask "causal AND key-is-real" is built.

Must not know: weights, layers, requests, sampling or scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from .backend import Backend
from ..errors import InputError


def check_token_ids(seq, vocab_size: int, subject: str, max_len: int | None = None) -> list[int]:
    """`seq` as a list of plain ints inside the vocabulary (and at most `max_len` of them, if given), or an
    InputError that names `subject`."""
    items = list(seq) if hasattr(seq, "__iter__") and not isinstance(seq, (str, bytes)) else None
    if items is None or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in items
    ):
        raise InputError(
            f"{subject} is not a list of integer token ids"
        )  # 2.0 and true are not ids either
    ids = [int(t) for t in items]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        shown = (
            bad[0] if abs(bad[0]) < 10**12 else f"{str(bad[0])[:12]}..."
        )  # 10**100 is not worth 101 digits
        raise InputError(f"{subject} token id {shown} is outside the vocabulary [0, {vocab_size})")
    if max_len is not None and len(ids) > max_len:
        raise InputError(
            f"{subject} has {len(ids)} tokens, more than the model's context of {max_len}"
        )
    return ids


def attention_mask(xp, past_lens, kv_lens, seq_len: int, max_kv_len: int, first_query: int = 0):
    """Which keys each query may see: query t of row b (position past_lens[b] + t) sees key j when
    j <= its position (causal) and j < kv_lens[b] (key-is-real: this row's token, not padding or stale).
    `first_query` > 0 gives the mask of the queries first_query, first_query + 1, ... (one tile of them)."""
    query_pos = past_lens[:, None] + (first_query + xp.arange(seq_len))[None, :]  # [B, T]
    key_pos = xp.arange(max_kv_len)  # [L]
    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, T, L]
    key_is_real = key_pos[None, :] < kv_lens[:, None]  # [B, L]
    return (causal & key_is_real[:, None, :])[:, None, :, :]  # [B, 1, T, L]


class Batch:
    """The metadata of one forward pass: host numbers (NumPy) per row [B] and per token [N], and what the layers
    read, moved to the backend once: token_ids, token_positions, token_slots [N]; row_slots [B]; mask."""

    def __init__(
        self, token_lists: Sequence[Sequence[int]], backend: Backend, slots=None, past_lens=None
    ):
        B = len(token_lists)
        self.backend = backend
        self.new_lens = np.array([len(tokens) for tokens in token_lists], dtype=np.int64)  # [B]
        self.past_lens = (
            np.zeros(B, np.int64)
            if past_lens is None
            else np.asarray(past_lens, np.int64).reshape(B)
        )
        self.slots = (
            np.arange(B, dtype=np.int64)
            if slots is None
            else np.asarray(slots, np.int64).reshape(B)
        )
        self.kv_lens = (
            self.past_lens + self.new_lens
        )  # [B] keys per row once this round's tokens are written
        self.batch_size = B
        self.seq_len = (
            max(int(self.new_lens.max()), 1) if B else 1
        )  # T (at least 1, so shapes stay valid)
        self.max_kv_len = int(self.kv_lens.max()) if B else 0  # L: key positions attention looks at
        first = (
            int(self.slots[0]) if B else 0
        )  # slots first, first+1, ...: the KV read is a view, not a gather
        self.slot_span = (
            (first, first + B)
            if B and np.array_equal(self.slots, np.arange(first, first + B))
            else None
        )

        rows, cols = np.nonzero(
            np.arange(self.seq_len)[None, :] < self.new_lens[:, None]
        )  # [N] each, row by row
        self.n_tokens = int(rows.size)  # N
        self.all_real = (
            self.n_tokens == B * self.seq_len
        )  # no padding at all: packed and padded are one layout
        self.positions = (
            self.past_lens[rows] + cols
        )  # [N] each token's position in its own sequence
        self.first_index = (
            np.cumsum(self.new_lens) - self.new_lens
        )  # [B] packed index of each row's first token
        self.last_index = (np.cumsum(self.new_lens) - 1)[
            self.new_lens > 0
        ]  # [B'] of its last: next-token logits

        flat_ids = np.array([t for tokens in token_lists for t in tokens], dtype=np.int64)  # [N]
        self._rows, self._cols = (
            backend.asarray(rows),
            backend.asarray(cols),
        )  # [N], [N] padded place of each token
        self.token_ids = backend.asarray(flat_ids)  # [N]
        self.token_positions = backend.asarray(self.positions)  # [N]
        self.token_slots = backend.asarray(self.slots[rows])  # [N] the KV slot of each token's row
        self.row_slots = backend.asarray(self.slots)  # [B]
        self._past_lens, self._kv_lens = (
            backend.asarray(self.past_lens),
            backend.asarray(self.kv_lens),
        )  # [B], [B]

    @cached_property
    def mask(self):
        """The whole round's mask [B, 1, T, L], built once: every layer of a decode step reads it."""
        return attention_mask(
            self.backend.xp, self._past_lens, self._kv_lens, self.seq_len, self.max_kv_len
        )

    def mask_tile(self, row: int, first: int, end: int, n_keys: int):
        """One row's mask [1, end - first, n_keys]: its queries first..end-1 against its keys 0..n_keys-1."""
        one = slice(row, row + 1)
        return attention_mask(
            self.backend.xp, self._past_lens[one], self._kv_lens[one], end - first, n_keys, first
        )[0]

    def query_tiles(self, n_head: int, scratch_bytes: int):
        """(row, first, end, n_keys) for each tile of a row's new tokens (queries first..end-1): as many queries as
        keep one fp32 score tile [H, queries, n_keys] within `scratch_bytes`, against only the keys the tile may
        see, 0..past_len + end - 1.  Each row goes alone, so no score is spent on padding, and no tile computes
        the scores wholly above the causal diagonal."""
        for row in range(self.batch_size):
            new_len, past_len = int(self.new_lens[row]), int(self.past_lens[row])
            size = max(
                1, scratch_bytes // max(1, n_head * (past_len + new_len) * 4)
            )  # queries per tile
            for first in range(0, new_len, size):
                end = min(new_len, first + size)
                yield row, first, end, past_len + end

    def padded(self, packed):
        """Packed per-token rows [N, ...] -> the padded layout [B, T, ...] (padding is zero), on the backend."""
        if self.all_real:
            return packed.reshape(
                self.batch_size, self.seq_len, *packed.shape[1:]
            )  # [B, T, ...] a view
        shape = (self.batch_size, self.seq_len, *packed.shape[1:])
        padded = self.backend.xp.zeros(shape, dtype=packed.dtype)  # [B, T, ...]
        padded[self._rows, self._cols] = packed
        return padded

    def packed(self, padded):
        """The padded layout [B, T, ...] -> packed real-token rows [N, ...], on the backend."""
        if self.all_real:
            return padded.reshape(self.batch_size * self.seq_len, *padded.shape[2:])  # [N, ...]
        return padded[self._rows, self._cols]  # [N, ...]

    def unpack_on_host(self, packed: np.ndarray) -> np.ndarray:
        """Host rows [N, ...] in packed order -> NumPy [B, T, ...] (padding zero), for results handed to users."""
        if (
            self.all_real
        ):  # no padding: the same numbers, viewed [B, T, ...] (no second copy of big logits)
            return packed.reshape(self.batch_size, self.seq_len, *packed.shape[1:])
        rows, cols = self.backend.to_numpy(self._rows), self.backend.to_numpy(self._cols)
        padded = np.zeros(
            (self.batch_size, self.seq_len, *packed.shape[1:]), dtype=packed.dtype
        )  # [B, T, ...]
        padded[rows, cols] = packed
        return padded
