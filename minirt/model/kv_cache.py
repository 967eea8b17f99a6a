"""Per-request key/value buffers, preallocated once and filled in place.

Owns: `KVCache`, a pool of slots, and `LayerKV`, one layer's view of it.  Each slot is one
request's own buffer, keys[layer, slot, kv_head, position, head_dim] (and the same for values), with
its own length (`lengths[slot]`).  The engine gives a request a slot when it is admitted; it keeps
it until it finishes.  Shape letters are those of minirt/model/layers.py (S slots, K positions per
slot, the capacity; G the K/V heads, which are fewer than the query heads in a family that groups
its queries: the cache, and so the KV budget, shrinks by that ratio).

  * Prefill writes a request's prompt keys at positions 0..prompt_len-1 of its slot; each decode
    step writes one more, at `lengths[slot]`.
  * Nothing is concatenated or reallocated per step: the capacity is chosen up front, so a step
    costs the attention, not a copy of the history.  (A continuous pool that must grow for
    requests that arrive later is made anew, larger, and takes over the old one's slots:
    `copy_from`, a rare event, never a per-step cost.)
  * A round's writes go by one index per token and head, its row in the layer's buffer seen as
    rows of head_dim numbers (`token_rows`, made once a round for every layer): one scatter each
    for keys and values.
  * Only real tokens are written.  Positions past a slot's length hold zeros (the pool starts
    zeroed, and a slot is zeroed when a new request takes it), and the attention mask
    (key-is-real) never lets a query see them.

Must not know: the layers' arithmetic, requests, sampling or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .batch import Batch


class KVCache:
    """Keys and values for `n_slots` requests, `capacity` positions each."""

    def __init__(
        self, xp, n_layer: int, n_kv_head: int, head_dim: int, n_slots: int, capacity: int, dtype
    ):
        self.xp = xp
        self.capacity = capacity
        shape = (n_layer, n_slots, n_kv_head, capacity, head_dim)
        self.keys = xp.zeros(shape, dtype=dtype)  # [n_layer, S, G, K, D]
        self.values = xp.zeros(shape, dtype=dtype)  # [n_layer, S, G, K, D]
        # Host-side: the keys each slot holds.
        self.lengths = np.zeros(n_slots, dtype=np.int64)  # [S]
        # Host-side: has any request written to this slot?
        self.written = np.zeros(n_slots, dtype=bool)  # [S]
        # The round's `token_rows`, made once by `prepare_round` for every layer.
        self.round_rows: Any = None

    @staticmethod
    def bytes_needed(
        n_layer: int, n_kv_head: int, head_dim: int, n_slots: int, capacity: int, dtype
    ) -> int:
        """Memory for keys + values, for budgeting before anything is allocated."""
        return 2 * n_layer * n_slots * n_kv_head * capacity * head_dim * np.dtype(dtype).itemsize

    def copy_from(self, smaller: KVCache) -> None:
        """Take over a smaller cache's slots, the same slot numbers in this larger one (a
        continuous pool that grows): its keys, values and lengths, and which slots were
        written.  Positions past a slot's old capacity stay zero, as a fresh cache's are."""
        rows = len(smaller.lengths)
        capacity = smaller.capacity
        self.keys[:, :rows, :, :capacity] = smaller.keys  # [n_layer, rows, H, capacity, D]
        self.values[:, :rows, :, :capacity] = smaller.values  # [n_layer, rows, H, capacity, D]
        self.lengths[:rows] = smaller.lengths  # [rows]
        self.written[:rows] = smaller.written  # [rows]

    def reset_slot(self, slot: int, overwritten: int = 0) -> None:
        """Give a slot to a new request: length 0 and zeroed storage (the mask hides old entries,
        but attention still multiplies them by a zero weight, and 0 x inf is NaN: an earlier
        occupant's overflow must not leak).  A slot nobody has written is zero already (fresh
        `zeros`), and is not touched: zeroing it again would only fault in pages of memory that the
        request may never use.  Positions below `overwritten` are not zeroed: the caller writes
        them next (a cached prefix, `write_positions`)."""
        if self.written[slot]:
            self.keys[:, slot, :, overwritten:] = 0
            self.values[:, slot, :, overwritten:] = 0
        self.lengths[slot] = 0
        self.written[slot] = False

    def read_positions(self, slot: int, start: int, end: int):
        """Copies of one slot's keys and values at positions start..end-1, every layer:
        [n_layer, H, end - start, D] each (what a prefix cache keeps of a finished prompt)."""
        keys = self.keys[:, slot, :, start:end].copy()  # [n_layer, H, end - start, D]
        values = self.values[:, slot, :, start:end].copy()  # [n_layer, H, end - start, D]
        return keys, values

    def write_positions(self, slot: int, start: int, keys, values) -> None:
        """Put keys and values [n_layer, H, n, D] at positions start..start+n-1 of a slot (a
        cached prefix copied into a new request's slot); the slot then holds start + n keys."""
        end = start + keys.shape[2]
        if end > self.capacity:
            raise ValueError(
                f"KV slot {slot} would hold {end} positions, but the cache was allocated with "
                f"capacity {self.capacity}"
            )
        self.keys[:, slot, :, start:end] = keys  # [n_layer, H, n, D]
        self.values[:, slot, :, start:end] = values  # [n_layer, H, n, D]
        self.lengths[slot] = end
        self.written[slot] = True

    def prepare_round(self, batch: Batch) -> None:
        """Before a round writes: refuse one that would write past a slot's capacity, and note
        every slot it writes (from now on a new occupant must get it zeroed, even if the round then
        fails part-way)."""
        n_slots = len(self.lengths)
        if (beyond := batch.slots >= n_slots).any():
            raise ValueError(
                f"KV slot {int(batch.slots[beyond][0])} is not in the cache, which has "
                f"{n_slots} slots"
            )
        if (over := batch.kv_lens > self.capacity).any():
            row = int(np.argmax(over))
            raise ValueError(
                f"KV slot {int(batch.slots[row])} would hold {int(batch.kv_lens[row])} positions, "
                f"but the cache was allocated with capacity {self.capacity}"
            )
        self.written[batch.slots] = True
        n_kv_head = self.keys.shape[2]
        self.round_rows = token_rows(self.xp, batch, n_kv_head, self.capacity)  # [N, G]

    def layer(self, i: int) -> LayerKV:
        """Layer i's part of the pool, which is what one attention layer reads and writes."""
        return LayerKV(self.keys[i], self.values[i], self.round_rows)

    def advance(self, batch: Batch) -> None:
        """After the forward pass: each row's slot now holds its new tokens too."""
        self.lengths[batch.slots] = batch.kv_lens


def token_rows(xp, batch: Batch, n_kv_head: int, capacity: int):
    """Where this round's keys go: for each new token and K/V head, its row in one layer's keys
    seen as rows of D numbers, [S * G * K, D].  One index array, so that a write is one scatter (on
    CuPy an index of two arrays, slot and position, costs four kernels)."""
    slots = batch.device.token_slots[:, None]  # [N, 1]
    heads = xp.arange(n_kv_head)[None, :]  # [1, G]
    positions = batch.device.positions[:, None]  # [N, 1]
    return (slots * n_kv_head + heads) * capacity + positions  # [N, G]


@dataclass(frozen=True)
class LayerKV:
    """One layer's keys and values for every slot: views into the pool, and where this round's
    new keys go in them (`token_rows`)."""

    keys: Any  # [S, G, K, D] C-contiguous
    values: Any  # [S, G, K, D] C-contiguous
    rows: Any  # [N, G]

    def write(self, new_keys, new_values) -> None:
        """Store this round's keys and values [N, G, D], each token at its own position in its
        row's slot."""
        S, G, K, D = self.keys.shape
        # Views, since the layer's buffers are contiguous (a copy would drop the write).
        assert self.keys.flags.c_contiguous and self.values.flags.c_contiguous
        key_rows = self.keys.reshape(S * G * K, D)  # [S * G * K, D]
        value_rows = self.values.reshape(S * G * K, D)  # [S * G * K, D]
        key_rows[self.rows] = new_keys  # [N, G, D]
        value_rows[self.rows] = new_values  # [N, G, D]

    def read_row(self, slot: int, n_keys: int):
        """The first n_keys keys and values [G, n_keys, D] of one slot: views, no copy."""
        return self.keys[slot, :, :n_keys], self.values[slot, :, :n_keys]

    def read_rows(self, slots: list[int], n_keys: int):
        """The first n_keys keys and values [n, G, n_keys, D] of these slots: a view when they
        are one slot or consecutive ones, else a gather."""
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            end = first + len(slots)
            return self.keys[first:end, :, :n_keys], self.values[first:end, :, :n_keys]
        # A host index: one upload, as a decode step's gather of the round's slots.
        index = np.asarray(slots, dtype=np.int64)  # [n]
        return self.keys[index, :, :n_keys], self.values[index, :, :n_keys]

    def read(self, batch: Batch):
        """Keys and values [B, G, L, D] of the round's rows: a view when their slots are contiguous,
        else a gather."""
        span = batch.slot_span
        L = batch.max_kv_len
        if span is not None:
            return self.keys[span[0] : span[1], :, :L], self.values[span[0] : span[1], :, :L]
        slots = batch.device.slots  # [B]
        return self.keys[slots, :, :L], self.values[slots, :, :L]
