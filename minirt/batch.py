"""Batch metadata: what one forward pass needs to know about each row.

Owns: `RoundInputs`, the padded input layout of one round, and
`prepare_round`, which builds it from each row's new tokens and its KV slot.

A round feeds B rows.  Row b brings `new_lens[b]` new tokens (its whole prompt
at prefill, one token per decode step) and already has `past_lens[b]` keys in
its KV slot.  Rows are right-padded to the longest, T.  Everything that keeps
padding from mattering is here, as explicit per-row numbers:

  * positions: row b's tokens sit at past_lens[b] + 0, 1, ..., so every row's
    positions start where its own history ends, whatever the padding;
  * which tokens are real, so only those are written to the KV cache;
  * kv_lens = past_lens + new_lens, from which the layers build the mask
    "causal AND key-is-real".

All arrays here are small host-side NumPy arrays; the model moves them to the
backend once per round.

Must not know: weights, layers, requests, sampling or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD_TOKEN = 0  # any valid id: padded slots are computed, then ignored


@dataclass(frozen=True)
class RoundInputs:
    """The padded batch for one forward pass (host-side NumPy arrays)."""

    input_ids: np.ndarray  # [B, T] int64, PAD_TOKEN where a row has no token
    positions: np.ndarray  # [B, T] int64, past_lens[b] + t for real tokens, 0 for padding
    slots: np.ndarray  # [B] int64, the KV slot each row reads and writes
    past_lens: np.ndarray  # [B] int64, keys already cached per row
    new_lens: np.ndarray  # [B] int64, real (non-padding) tokens per row in this round

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def kv_lens(self) -> np.ndarray:
        """[B] keys per row once this round's tokens are written."""
        return self.past_lens + self.new_lens

    @property
    def max_kv_len(self) -> int:
        """L: how many key positions the attention must look at (the longest row)."""
        return int(self.kv_lens.max()) if self.batch_size else 0

    def real_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) of every real token, in row-major order; padding excluded."""
        cols = np.arange(self.seq_len)  # [T]
        is_real = cols[None, :] < self.new_lens[:, None]  # [B, T]
        return np.nonzero(is_real)  # ([N_real], [N_real])

    def first_token_offsets(self) -> np.ndarray:
        """[B] where each row's tokens start among the packed real tokens (real_tokens() order)."""
        return np.cumsum(self.new_lens) - self.new_lens  # [B]

    def last_tokens(self) -> np.ndarray:
        """[B'] packed index of each row's last real token: where next-token logits come from.

        A row with no new tokens has none; it is left out.
        """
        return (np.cumsum(self.new_lens) - 1)[self.new_lens > 0]  # [B']

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Per-token rows [N, ...] in real_tokens() order -> the padded layout [B, T, ...] (padding zero)."""
        rows, cols = self.real_tokens()
        padded = np.zeros((self.batch_size, self.seq_len, *packed.shape[1:]), dtype=packed.dtype)  # [B, T, ...]
        padded[rows, cols] = packed
        return padded

    def contiguous_slots(self) -> tuple[int, int] | None:
        """(first, stop) when the slots are first, first+1, ...; the KV read is then a view."""
        if self.batch_size == 0:
            return None
        first = int(self.slots[0])
        if np.array_equal(self.slots, np.arange(first, first + self.batch_size)):
            return first, first + self.batch_size
        return None


def prepare_round(token_lists: list[list[int]], slots, past_lens) -> RoundInputs:
    """Right-pad each row's new tokens and compute its positions from its own history.

    token_lists[b] are row b's new tokens, slots[b] its KV slot, past_lens[b]
    the keys that slot already holds.
    """
    batch = len(token_lists)
    new_lens = np.array([len(tokens) for tokens in token_lists], dtype=np.int64)  # [B]
    seq_len = max(int(new_lens.max()), 1) if batch else 1  # T (at least 1, so shapes stay valid)
    slots = np.asarray(slots, dtype=np.int64).reshape(batch)  # [B]
    past_lens = np.asarray(past_lens, dtype=np.int64).reshape(batch)  # [B]

    input_ids = np.full((batch, seq_len), PAD_TOKEN, dtype=np.int64)  # [B, T]
    positions = np.zeros((batch, seq_len), dtype=np.int64)  # [B, T]
    for row, tokens in enumerate(token_lists):
        n = len(tokens)
        input_ids[row, :n] = tokens
        positions[row, :n] = past_lens[row] + np.arange(n)
    return RoundInputs(input_ids=input_ids, positions=positions, slots=slots, past_lens=past_lens, new_lens=new_lens)
