"""One round's batch metadata: what a forward pass needs to know about each row, on the host
and on the backend.

Owns: `Batch`, built once per round from each row's new tokens, its KV slot and the keys that slot
already holds, with everything derived from those numbers; `DeviceArrays`, the part of it that the
layers read on the backend, moved there in one upload; `attention_mask` and `KeyMask`, the masks
built once a round for every layer; and `check_token_ids`, the one check of what a model may be
fed.

Row b brings `new_lens[b]` new tokens (its whole prompt at prefill, one per decode step) and
already has `past_lens[b]` keys in its slot.  What keeps padding from mattering is an explicit
per-row number here:

  * positions: row b's tokens sit at past_lens[b] + 0, 1, ..., where its own history ends,
    whatever its neighbours;
  * the packed layout: only real tokens go through the weight GEMMs, as N = sum(new_lens) rows; a
    decode step's attention alone lays them out padded, [B, T, ...] with T = max(new_lens)
    (`padded` / `packed` convert), while a prompt's attends row by row (`query_tiles`,
    `mask_tile`);
  * kv_lens = past_lens + new_lens, from which the mask "causal AND key-is-real" is built.

A row may also say it is `decoding`: its one new token is a generated one, not part of a prompt.
Only exact batch invariance (minirt/model/invariant.py) reads it, to attend that query alone.

Shape letters are those of minirt/model/layers.py: B rows, T new tokens per row (padded), N real
tokens, L key positions attended (max(kv_lens)), H heads.

Must not know: weights, layers, requests, sampling or scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .backend import Backend
from ..errors import InputError


def check_token_ids(
    seq, vocab_size: int, subject: str, max_len: int | None = None, field: str | None = None
) -> list[int]:
    """`seq` as a list of plain ints inside the vocabulary (and at most `max_len` of them, if
    given), or an InputError that names `subject` (and whose `field` is `field`, by default
    `subject`: the request field the ids came in)."""
    if field is None:
        field = subject
    items = list(seq) if hasattr(seq, "__iter__") and not isinstance(seq, (str, bytes)) else None
    # 2.0 and true are not ids either.
    if items is None or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in items
    ):
        raise InputError(f"{subject} is not a list of integer token ids", field)
    ids = [int(t) for t in items]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        # 10**100 is not worth 101 digits.
        shown = bad[0] if abs(bad[0]) < 10**12 else f"{str(bad[0])[:12]}..."
        message = f"{subject} token id {shown} is outside the vocabulary [0, {vocab_size})"
        raise InputError(message, field)
    if max_len is not None and len(ids) > max_len:
        raise InputError(
            f"{subject} has {len(ids)} tokens, more than the model's context of {max_len}", field
        )
    return ids


def attention_mask(xp, past_lens, kv_lens, seq_len: int, max_kv_len: int, first_query: int = 0):
    """Which keys each query may see: query t of row b (position past_lens[b] + t) sees key j when
    j <= its position (causal) and j < kv_lens[b] (key-is-real: this row's token, not padding or
    stale).  `first_query` > 0 gives the mask of the queries first_query, first_query + 1, ... (one
    tile of them)."""
    query_pos = past_lens[:, None] + (first_query + xp.arange(seq_len))[None, :]  # [B, T]
    key_pos = xp.arange(max_kv_len)  # [L]
    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, T, L]
    key_is_real = key_pos[None, :] < kv_lens[:, None]  # [B, L]
    return (causal & key_is_real[:, None, :])[:, None, :, :]  # [B, 1, T, L]


@dataclass(frozen=True)
class KeyMask:
    """A mask as attention reads it: which keys are hidden, and which queries see any key at all.
    Built once per round (or per tile), and read by every layer."""

    # [..., T, L] True where the query must not see the key.
    hidden: Any
    # [..., T, 1] True where the query sees at least one key.
    sees_a_key: Any


def key_mask(visible) -> KeyMask:
    """The KeyMask of a boolean mask [..., T, L] of visible keys."""
    return KeyMask(hidden=~visible, sees_a_key=visible.any(axis=-1, keepdims=True))


def contiguous_span(slots: np.ndarray) -> tuple[int, int] | None:
    """(first, end) when the slots are first, first + 1, ..., end - 1, so that the KV read is a
    view, not a gather; else None."""
    B = len(slots)
    first = int(slots[0]) if B else 0
    if B and np.array_equal(slots, np.arange(first, first + B)):
        return (first, first + B)
    return None


def check_slots(slots: np.ndarray, past_lens: np.ndarray) -> None:
    """A round's rows each hold a KV slot of their own, and slots and lengths count from 0: two
    rows in one slot would write the same keys (a scatter CuPy leaves undefined), and a negative
    index wraps around."""
    if len(set(slots.tolist())) < len(slots):
        raise InputError(f"two rows of a round share a KV slot: {slots.tolist()}")
    if (slots < 0).any() or (past_lens < 0).any():
        raise InputError("KV slots and past lengths are counts from 0; a round got a negative one")


@dataclass(frozen=True)
class DeviceArrays:
    """The round's numbers that the layers read, moved to the backend once: per token [N], in
    packed order, and per row [B].  Those with a host twin on `Batch` share its name."""

    # [N] the ids fed to the embedding
    token_ids: Any
    # [N] each token's position in its own sequence
    positions: Any
    # [N] the KV slot of each token's row: where `LayerKV.write` puts its key
    token_slots: Any
    # [N] each token's row in the padded layout [B, T, ...]
    rows: Any
    # [N] each token's column in the padded layout [B, T, ...]
    cols: Any
    # [B] each row's KV slot
    slots: Any
    # [B] keys each row's slot held before this round
    past_lens: Any
    # [B] keys each row's slot holds once this round's tokens are written
    kv_lens: Any
    # [M] the packed index of each non-empty row's last token
    last_index: Any


def last_token_index(new_lens: np.ndarray, wants_logits: Sequence[bool] | None) -> np.ndarray:
    """The packed index of each non-empty row's last token, whose logits give its next token:
    [M], one per non-empty row that wants logits (every row, by default)."""
    B = len(new_lens)
    if wants_logits is None:
        wanted = np.ones(B, dtype=bool)  # [B]
    else:
        wanted = np.asarray(wants_logits, dtype=bool).reshape(B)  # [B]
    return (np.cumsum(new_lens) - 1)[(new_lens > 0) & wanted]  # [M]


def row_counts(counts, default: np.ndarray) -> np.ndarray:
    """A count a row [B] as int64, shaped as `default`, which it is when not given."""
    if counts is None:
        return default  # [B]
    return np.asarray(counts, np.int64).reshape(default.shape)  # [B]


def row_flags(flags: Sequence[bool] | None, batch_size: int) -> np.ndarray:
    """A flag a row [B] as a boolean array; all False when not given."""
    if flags is None:
        return np.zeros(batch_size, dtype=bool)  # [B]
    return np.asarray(flags, dtype=bool).reshape(batch_size)  # [B]


def uploaded_once(backend: Backend, host_arrays: dict[str, np.ndarray]) -> DeviceArrays:
    """The round's integer arrays (all int64), end to end in one host array, moved to the backend
    in one upload and cut into views there: one host-to-device copy per round, not one per
    array."""
    lengths = np.array([len(array) for array in host_arrays.values()])  # [fields]
    ends = np.cumsum(lengths)  # [fields]
    starts = ends - lengths  # [fields]
    joined = backend.asarray(np.concatenate(list(host_arrays.values())))  # [sum of lengths]
    views = {
        name: joined[int(start) : int(end)]
        for name, start, end in zip(host_arrays, starts, ends, strict=True)
    }
    return DeviceArrays(**views)


class Batch:
    """The metadata of one forward pass: host numbers (NumPy) per row [B] and per token [N], and
    `device`, what the layers read on the backend; `mask`, built from those.  `wants_logits[b]`
    says whether row b's last token gives logits (by default every row's does; a row fed a chunk
    of its prompt that does not end it needs none)."""

    def __init__(
        self,
        token_lists: Sequence[Sequence[int]],
        backend: Backend,
        slots=None,
        past_lens=None,
        wants_logits: Sequence[bool] | None = None,
        decoding: Sequence[bool] | None = None,
    ):
        B = len(token_lists)
        self.backend = backend
        self.new_lens = np.array([len(tokens) for tokens in token_lists], dtype=np.int64)  # [B]
        # By default nothing in any slot, and row b in slot b.
        self.past_lens = row_counts(past_lens, np.zeros(B, np.int64))  # [B]
        self.slots = row_counts(slots, np.arange(B, dtype=np.int64))  # [B]
        check_slots(self.slots, self.past_lens)
        # Which rows feed a generated token (not a prompt's): exact mode's attention takes such a
        # query alone (minirt/model/invariant.py).  By default none does.
        self.decoding = row_flags(decoding, B)  # [B]
        # Keys per row once this round's tokens are written.
        self.kv_lens = self.past_lens + self.new_lens  # [B]
        self.batch_size = B
        # T, at least 1, so that shapes stay valid.
        self.seq_len = max(int(self.new_lens.max()), 1) if B else 1
        # L: the key positions attention looks at.
        self.max_kv_len = int(self.kv_lens.max()) if B else 0
        self.slot_span = contiguous_span(self.slots)

        # Each real token's padded place, row by row.
        rows, cols = np.nonzero(np.arange(self.seq_len)[None, :] < self.new_lens[:, None])  # [N]
        self.rows = rows  # [N]
        self.cols = cols  # [N]
        self.n_tokens = int(rows.size)  # N
        # No padding at all: packed and padded are one layout.
        self.all_real = self.n_tokens == B * self.seq_len
        # Each token's position in its own sequence.
        self.positions = self.past_lens[rows] + cols  # [N]
        # The packed index of each row's first token.
        self.first_index = np.cumsum(self.new_lens) - self.new_lens  # [B]
        self.last_index = last_token_index(self.new_lens, wants_logits)  # [M]

        # The ids fed to the embedding, in packed order (the model checks them against its
        # vocabulary).
        self.token_ids = np.array(
            [t for tokens in token_lists for t in tokens], dtype=np.int64
        )  # [N]
        self.device = self.upload()
        # Each prompt tile's KeyMask (and exact mode's, minirt/model/invariant.py), by what it is
        # for: made by the round's first layer and read by the others.
        self.masks: dict[tuple, KeyMask] = {}

    def upload(self) -> DeviceArrays:
        """What the layers read on the backend, in one upload."""
        host_arrays = {
            "token_ids": self.token_ids,
            "positions": self.positions,
            "token_slots": self.slots[self.rows],
            "rows": self.rows,
            "cols": self.cols,
            "slots": self.slots,
            "past_lens": self.past_lens,
            "kv_lens": self.kv_lens,
            "last_index": self.last_index,
        }
        return uploaded_once(self.backend, host_arrays)

    @cached_property
    def mask(self):
        """The whole round's mask [B, 1, T, L], built once: each layer of a decode step reads it."""
        device = self.device
        return attention_mask(
            self.backend.xp, device.past_lens, device.kv_lens, self.seq_len, self.max_kv_len
        )

    @cached_property
    def key_mask(self) -> KeyMask:
        """The round's mask as attention reads it, built once for every layer."""
        return key_mask(self.mask)

    def mask_tile(self, row: int, first: int, end: int, n_keys: int) -> KeyMask:
        """One row's mask [1, end - first, n_keys]: its queries first..end-1 against its keys
        0..n_keys-1; made once a round, whatever the number of layers."""

        def make() -> KeyMask:
            one = slice(row, row + 1)
            past_lens = self.device.past_lens[one]  # [1]
            kv_lens = self.device.kv_lens[one]  # [1]
            xp = self.backend.xp
            visible = attention_mask(xp, past_lens, kv_lens, end - first, n_keys, first)[0]
            return key_mask(visible)

        return self.cached_mask(("tile", row, first, end, n_keys), make)

    def cached_mask(self, key: tuple, make) -> KeyMask:
        """The round's mask `key`, made by `make()` the first time a layer asks for it."""
        if key not in self.masks:
            self.masks[key] = make()
        return self.masks[key]

    def query_tiles(self, n_head: int, scratch_bytes: int):
        """(row, first, end, n_keys) for each tile of a row's new tokens (queries first..end-1): as
        many queries as keep one fp32 score tile [H, queries, n_keys] within `scratch_bytes`,
        against only the keys the tile may see, 0..past_len + end - 1.  Each row goes alone, so no
        score is spent on padding, and no tile computes the scores wholly above the causal
        diagonal."""
        for row in range(self.batch_size):
            new_len = int(self.new_lens[row])
            past_len = int(self.past_lens[row])
            # Queries per tile.
            size = max(1, scratch_bytes // max(1, n_head * (past_len + new_len) * 4))
            for first in range(0, new_len, size):
                end = min(new_len, first + size)
                yield row, first, end, past_len + end

    def padded(self, packed):
        """Packed per-token rows [N, ...] -> the padded layout [B, T, ...] (padding is zero), on the
        backend."""
        shape = (self.batch_size, self.seq_len, *packed.shape[1:])
        if self.all_real:
            return packed.reshape(shape)  # [B, T, ...] a view
        padded = self.backend.xp.zeros(shape, dtype=packed.dtype)  # [B, T, ...]
        padded[self.device.rows, self.device.cols] = packed
        return padded

    def packed(self, padded):
        """The padded layout [B, T, ...] -> packed real-token rows [N, ...], on the backend."""
        if self.all_real:
            return padded.reshape(self.batch_size * self.seq_len, *padded.shape[2:])  # [N, ...]
        return padded[self.device.rows, self.device.cols]  # [N, ...]

    def unpack_on_host(self, packed: np.ndarray) -> np.ndarray:
        """Host rows [N, ...] in packed order -> NumPy [B, T, ...] (padding zero), for results
        handed to users."""
        shape = (self.batch_size, self.seq_len, *packed.shape[1:])
        # No padding: the same numbers, viewed [B, T, ...] (no second copy of big logits).
        if self.all_real:
            return packed.reshape(shape)
        padded = np.zeros(shape, dtype=packed.dtype)  # [B, T, ...]
        padded[self.rows, self.cols] = packed
        return padded
