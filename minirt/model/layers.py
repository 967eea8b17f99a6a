"""The layers of a decoder-only transformer, written out by hand as pure functions.

Owns: the arithmetic that every model family here composes (a linear layer, layer norm, GELU,
the MLP, attention over one round's padded batch and its KV cache, the head), and the small
dataclasses of the weights they read.  A model's file composes them: minirt/model/gpt2.py is
GPT-2's (its fused Q/K/V, learned positions, pre-norm blocks).  Read it top to bottom.  Shape
letters:

    B  rows in the batch          T  new tokens per row this round (padded)
    N  real tokens in the round   L  key positions attended, max(kv_lens)
    C  n_embd                     H  n_head      D  head_dim = C // H
    G  n_kv_head (K/V heads; each serves H / G query heads)
    I  n_inner (MLP width)        V  vocab_size  M  positions whose logits are asked for
    S  KV slots in the cache      K  positions per KV slot (the cache's capacity)

Real tokens travel packed, [N, C], so every weight GEMM is 2-D and none runs on padding.  A
prompt's attention takes each row alone; a decode step's lays the rows out padded [B, H, 1, L]
(minirt/model/batch.py builds the masks).  With a KV cache the keys are each row's history plus
this round's; scoring whole sequences needs none.  Layers take `xp` (numpy or cupy), so the GPU
runs this same code; layer-norm statistics, softmax and logits are fp32.  Their elementwise runs
are called by name from `chains` (minirt/model/fusion.py: one kernel each on a GPU).

Must not know: files, checkpoints' names, tokenizers, requests, sampling or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .batch import Batch, KeyMask
from .fusion import Chains
from .kv_cache import LayerKV


# Scratch per tile of a prompt, however long: attention's fp32 scores [H, queries, keys] (a tile is
# at least one query), and the MLP's hidden activations [tokens, I] (so [N, I] never exists).
# 8 MiB each measured fastest.
ATTENTION_SCRATCH_BYTES = 8 * 2**20
MLP_SCRATCH_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Linear:
    """A linear layer, stored [in, out] so that `x @ weight` needs no transpose (GPT-2's Conv1D
    is stored so in its checkpoint)."""

    weight: Any  # [in, out]
    # None: the layer has no bias (most of a Llama block's).
    bias: Any = None  # [out]


@dataclass(frozen=True)
class LayerNorm:
    """The scale `weight` and the shift `bias` applied after normalising."""

    weight: Any  # [C]
    bias: Any  # [C]


# ------------------------------------------------------------------ the layers


def layer_norm(xp, chains: Chains, x, ln: LayerNorm, eps: float, tiles=None):
    """Normalise each token's features to mean 0, variance 1, then scale and shift.  With `tiles`
    (exact batch invariance), a call of fixed height at a time, so that a GPU's reduction kernel
    sees the same shape whatever the batch."""
    if tiles is not None:
        return tiles.rowwise(x, lambda rows: layer_norm(xp, chains, rows, ln, eps))
    # The statistics in fp32.
    x32 = x.astype(xp.float32, copy=False)  # [N, C]
    n = x.shape[-1]
    centered = chains.centered_on_mean(x32, x32.sum(axis=-1, keepdims=True), n)  # [N, C]
    square_total = xp.square(centered).sum(axis=-1, keepdims=True)  # [N, 1]
    # Variance 1; then scaled and shifted, in place.
    chains.normalize_scale_shift(centered, square_total, n, eps, ln.weight, ln.bias)  # [N, C]
    return centered.astype(x.dtype, copy=False)  # [N, C]


def rms_norm(xp, chains: Chains, x, weight, eps: float, tiles=None):
    """RMSNorm, a Llama block's normalisation: each token's features over their root mean square,
    then scaled by `weight` [features]; unlike layer norm, no mean is taken away and nothing is
    added.  Over the last axis, so it also normalises each head of [N, heads, D] (Qwen3's query
    and key norms).  The statistics in fp32.  With `tiles`, a call of fixed height at a time, as
    `layer_norm`."""
    if tiles is not None:
        return tiles.rowwise(x, lambda rows: rms_norm(xp, chains, rows, weight, eps))
    x32 = x.astype(xp.float32, copy=False)  # [N, ..., C]
    square_total = xp.square(x32).sum(axis=-1, keepdims=True)  # [N, ..., 1]
    normalized = chains.rms_normalize_scale(x32, square_total, x.shape[-1], eps, weight)
    return normalized.astype(x.dtype, copy=False)  # [N, ..., C]


def linear(x, fc: Linear, tiles=None):
    """A 2-D weight GEMM, [tokens, in] @ [in, out], and the bias added in place (no second
    [N, out] array).  With `tiles` (exact batch invariance, minirt/model/invariant.py's
    RowTiles) the product runs in calls of fixed heights."""
    out = x @ fc.weight if tiles is None else tiles.product(x, fc.weight)  # [N, out]
    if fc.bias is not None:
        out += fc.bias  # [N, out]
    return out


def gelu(chains: Chains, x, form: str = "tanh"):
    """GELU.  GPT-2 uses the tanh approximation; 'erf' is the exact form."""
    if form == "tanh":
        return chains.gelu_tanh(x)  # [N, I]
    return chains.gelu_erf(x)  # [N, I]


def softmax_attention(xp, chains: Chains, q, keys, values, mask: KeyMask, scale: float):
    """Attention of queries [..., H, T, D] against keys and values [..., G, L, D], G dividing H:
    with grouped queries (G < H) each K/V head g serves the H / G query heads g * H / G, ...,
    which are laid out [..., G, H / G, T, D] against the keys viewed [..., G, 1, L, D], so that
    no key is copied for each head it serves (a copy would be H / G times the KV cache, every
    layer, every round); each head's product is the same [T, D] @ [D, L] call either way.  The
    mask [..., 1, T, L] gains the group axis the same way."""
    n_head = q.shape[-3]
    n_kv_head = keys.shape[-3]
    if n_kv_head == n_head:
        return softmax_over_keys(xp, chains, q, keys, values, mask, scale)  # [..., H, T, D]
    group = n_head // n_kv_head
    grouped_q = q.reshape(*q.shape[:-3], n_kv_head, group, *q.shape[-2:])  # [..., G, H/G, T, D]
    shared_keys = keys[..., None, :, :]  # [..., G, 1, L, D]
    shared_values = values[..., None, :, :]  # [..., G, 1, L, D]
    grouped_mask = KeyMask(mask.hidden[..., None, :, :], mask.sees_a_key[..., None, :, :])
    out = softmax_over_keys(
        xp, chains, grouped_q, shared_keys, shared_values, grouped_mask, scale
    )  # [..., G, H/G, T, D]
    return out.reshape(q.shape)  # [..., H, T, D]


def softmax_over_keys(xp, chains: Chains, q, keys, values, mask: KeyMask, scale: float):
    """softmax(q k^T * scale, over visible keys) @ v in fp32, for [B, H, T, D] or [H, T, D] (or
    those with a group axis, keys broadcast over it): a hidden score is the lowest finite float
    (no -inf arithmetic), so its exp is exactly 0 once the row's max is subtracted; the output is
    divided, not the scores; a query that sees no key gets zeros."""
    # No keys at all (rows with nothing in them): nothing to see.
    if keys.shape[-2] == 0:
        return xp.zeros_like(q)
    # fp32, since fp16 dot products can overflow 65504.
    q32 = q.astype(xp.float32, copy=False) * xp.float32(scale)  # [B, H, T, D] fp32
    # No copy when already fp32.
    keys32 = keys.astype(xp.float32, copy=False)  # [B, H, L, D]
    # A new array, which we may overwrite.
    scores = q32 @ xp.swapaxes(keys32, -1, -2)  # [B, H, T, L] fp32
    # Hidden keys at the lowest finite float.
    xp.copyto(scores, xp.finfo(xp.float32).min, where=mask.hidden)  # [B, H, T, L]
    # Unnormalised weights, in place: the max 1 in each row that sees a key, a hidden key's 0.
    chains.shift_and_exp(scores, scores.max(axis=-1, keepdims=True))  # [B, H, T, L]
    # At least 1 where any key is visible.
    total = scores.sum(axis=-1, keepdims=True)  # [B, H, T, 1]
    # No 4-D fp16 matmul: it runs as slow GEMVs on CuPy.
    values32 = values.astype(xp.float32, copy=False)  # [B, H, L, D]
    out = chains.weighted_mean_or_zero(scores @ values32, total, mask.sees_a_key)  # [B, H, T, D]
    return out.astype(q.dtype, copy=False)


def prompt_attention(xp, chains: Chains, q, k, v, batch: Batch, kv: LayerKV | None, scale: float):
    """Attention of a round with prompts (or of whole sequences scored), packed [N, H, D] in and
    out: each row alone (no score spent on padding), a tile of its queries at a time
    (`Batch.query_tiles`): scratch stays within ATTENTION_SCRATCH_BYTES, and no tile lies above
    the causal diagonal.  Keys: the row's slot, or this round."""
    out = xp.empty_like(q)  # [N, H, D]
    for row, first, end, n_keys in batch.query_tiles(q.shape[1], ATTENTION_SCRATCH_BYTES):
        # The row's first token in the packed order.
        start = int(batch.first_index[row])
        if kv is not None:
            # The slot's keys: the row's history and this round's.
            keys, values = kv.read_row(int(batch.slots[row]), n_keys)  # [G, n_keys, D]
        else:
            # This round's alone.
            keys = k[start : start + n_keys].transpose(1, 0, 2)  # [G, n_keys, D]
            values = v[start : start + n_keys].transpose(1, 0, 2)  # [G, n_keys, D]
        queries = q[start + first : start + end].transpose(1, 0, 2)  # [H, end - first, D]
        # Built by the round's first layer, read by the others.
        mask = batch.mask_tile(row, first, end, n_keys)  # [1, end - first, n_keys]
        tile = softmax_attention(
            xp, chains, queries, keys, values, mask, scale
        )  # [H, end - first, D]
        out[start + first : start + end] = tile.transpose(1, 0, 2)  # [end - first, H, D]
    return out


def attend(xp, chains: Chains, q, k, v, batch: Batch, kv: LayerKV | None, scale: float):
    """Attention of one round, packed [N, H, D] queries and [N, G, D] keys and values in, [N, H,
    D] out: this round's keys into the cache (if any), then each query against the keys its row
    may see.  A round with prompts takes each row alone (`prompt_attention`); a decode step, one
    query per row, puts all rows in one softmax against their whole histories."""
    if kv is not None:
        # Each token into its row's slot, at its own position.
        kv.write(k, v)
    if kv is None or batch.seq_len > 1:
        return prompt_attention(xp, chains, q, k, v, batch, kv, scale)  # [N, H, D]
    keys, values = kv.read(batch)  # [B, G, L, D]
    queries = batch.padded(q).transpose(0, 2, 1, 3)  # [B, H, 1, D]
    out = softmax_attention(xp, chains, queries, keys, values, batch.key_mask, scale)
    return batch.packed(out.transpose(0, 2, 1, 3))  # [N, H, D]


def mlp(xp, chains: Chains, x, up: Linear, down: Linear, gelu_form: str, tiles=None):
    """down(GELU(up(x))): expand to n_inner, GELU, project back, a tile of tokens at a time: each
    hidden [tokens, I] array stays within MLP_SCRATCH_BYTES (GELU makes a second one; in a CPU's
    cache its passes are cheap), however long."""
    # Tokens per tile (in exact mode, a height its products are called with: one call a tile).
    rows = max(1, MLP_SCRATCH_BYTES // (up.weight.shape[1] * x.itemsize))
    if tiles is not None:
        rows = tiles.tallest_within(rows)
    if x.shape[0] <= rows:
        # One tile (every decode step): no copy into an output array.
        hidden = gelu(chains, linear(x, up, tiles), gelu_form)  # [N, I]
        return linear(hidden, down, tiles)  # [N, C]
    out = xp.empty_like(x)  # [N, C]
    for first in range(0, x.shape[0], rows):
        hidden = gelu(chains, linear(x[first : first + rows], up, tiles), gelu_form)  # [rows, I]
        out[first : first + rows] = linear(hidden, down, tiles)  # [rows, C]
    return out


def swiglu_mlp(xp, chains: Chains, x, gate_up: Linear, down: Linear, tiles=None):
    """A Llama block's MLP, down(SiLU(gate(x)) * up(x)): the gate and up projections side by side
    in one weight [C, 2I] (one GEMM), the gated product, back down; a tile of tokens at a time,
    as `mlp`, so that the hidden [tokens, 2I] stays within MLP_SCRATCH_BYTES."""
    inner = gate_up.weight.shape[1] // 2
    tile_tokens = max(1, MLP_SCRATCH_BYTES // (gate_up.weight.shape[1] * x.itemsize))
    if tiles is not None:
        tile_tokens = tiles.tallest_within(tile_tokens)

    def tile(tokens):
        both = linear(tokens, gate_up, tiles)  # [tokens, 2I]
        hidden = chains.silu_times(both[:, :inner], both[:, inner:])  # [tokens, I]
        return linear(hidden, down, tiles)  # [tokens, C]

    n_tokens = len(x)
    if n_tokens <= tile_tokens:
        return tile(x)  # [N, C]
    out = xp.empty_like(x)  # [N, C]
    for start in range(0, n_tokens, tile_tokens):
        out[start : start + tile_tokens] = tile(x[start : start + tile_tokens])  # [tokens, C]
    return out


def lm_head(xp, hidden, head_weight, tiles=None):
    """Hidden states -> fp32 logits, 1024 rows at a time into one array (scoring 8 x 1024 ran 15%
    faster so).  The [C, V] head stays fp32 for fp16 compute too: fp16 resolves logits of tens to
    ~0.03, enough to flip a pick.  With `tiles`, in calls of fixed heights (as `linear`)."""
    hidden = hidden.astype(np.float32, copy=False)  # [M, C] fp32
    logits = xp.empty((len(hidden), head_weight.shape[1]), np.float32)  # [M, V] fp32
    for first in range(0, len(hidden), 1024):
        rows = slice(first, first + 1024)
        if tiles is None:
            xp.matmul(hidden[rows], head_weight, out=logits[rows])  # [rows, V]
        else:
            logits[rows] = tiles.product(hidden[rows], head_weight)  # [rows, V]
    return logits  # [M, V] fp32
