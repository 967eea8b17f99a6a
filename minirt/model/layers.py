"""GPT-2's layers, written out by hand as pure functions, and the weights they read.

Owns: the arithmetic of GPT-2 over one round's packed tokens (embeddings, layer norm, attention,
GELU, MLP, head), and the small dataclasses that carry each layer's weights, named as in the
checkpoint (`blocks[3].attn.c_attn.weight` is `h.3.attn.c_attn.weight`).  Read it top to bottom.
Shape letters:

    B  rows in the batch          T  new tokens per row this round (padded)
    N  real tokens in the round   L  key positions attended, max(kv_lens)
    C  n_embd                     H  n_head      D  head_dim = C // H
    I  n_inner (MLP width)        V  vocab_size  M  positions whose logits are asked for
    S  KV slots in the cache      K  positions per KV slot (the cache's capacity)
    P  n_positions (the context)

Real tokens travel packed, [N, C], so every weight GEMM is 2-D and none runs on padding.  A
prompt's attention takes each row alone; a decode step's lays the rows out padded [B, H, 1, L]
(minirt/model/batch.py builds the masks).  With a KV cache the keys are each row's history plus
this round's; scoring whole sequences needs none.  Layers take `xp` (numpy or cupy), so the GPU
runs this same code; layer-norm statistics, softmax and logits are fp32.

The runs of elementwise arithmetic (GELU; layer norm's centring, and its normalise, scale and
shift; softmax's subtract and exp, and its divide) are chains, each one function written once:
NumPy runs it as written, and CuPy compiles it into one kernel (`elementwise_chains`, with
`cupy.fuse`).  A decode step on a GPU is bound by how many kernels it launches, not by its
arithmetic.

Must not know: files, tokenizers, requests, sampling or scheduling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .batch import Batch, KeyMask
from .config import GPT2Config
from .kv_cache import LayerKV


# Scratch per tile of a prompt, however long: attention's fp32 scores [H, queries, keys] (a tile is
# at least one query), and the MLP's hidden activations [tokens, I] (so [N, I] never exists).
# 8 MiB each measured fastest.
ATTENTION_SCRATCH_BYTES = 8 * 2**20
MLP_SCRATCH_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Linear:
    """A Hugging Face Conv1D, stored [in, out] so that `x @ weight` needs no transpose."""

    weight: Any  # [in, out]
    bias: Any  # [out]


@dataclass(frozen=True)
class LayerNorm:
    """The scale `weight` and the shift `bias` applied after normalising."""

    weight: Any  # [C]
    bias: Any  # [C]


@dataclass(frozen=True)
class Attention:
    # Queries, keys and values side by side.
    c_attn: Linear  # [C, 3C]
    c_proj: Linear  # [C, C]


@dataclass(frozen=True)
class MLP:
    c_fc: Linear  # [C, I]
    c_proj: Linear  # [I, C]


@dataclass(frozen=True)
class Block:
    """One transformer block: blocks[i].<field> is the checkpoint's h.{i}.<field>."""

    ln_1: LayerNorm
    attn: Attention
    ln_2: LayerNorm
    mlp: MLP


def block_weights(params: dict[str, Any], i: int) -> Block:
    """Block i's arrays, picked out of the loaded weights by name."""

    def pair(name: str) -> tuple[Any, Any]:
        return params[f"h.{i}.{name}.weight"], params[f"h.{i}.{name}.bias"]

    attn = Attention(c_attn=Linear(*pair("attn.c_attn")), c_proj=Linear(*pair("attn.c_proj")))
    mlp = MLP(c_fc=Linear(*pair("mlp.c_fc")), c_proj=Linear(*pair("mlp.c_proj")))
    return Block(ln_1=LayerNorm(*pair("ln_1")), attn=attn, ln_2=LayerNorm(*pair("ln_2")), mlp=mlp)


def embed(wte_t, wpe, token_ids, positions):
    """Token plus position embedding of the round's real tokens; a token's is a column of the
    [C, V] table."""
    return wte_t[:, token_ids].T.astype(wpe.dtype, copy=False) + wpe[positions]  # [N, C]


# ------------------------------------------------------------------ elementwise chains
#
# Each chain takes `xp` and arrays, and does elementwise arithmetic alone: no reduction, no index,
# no matmul (what cupy.fuse can compile into one kernel).  A chain either returns one new array,
# or works in place in its first argument and returns nothing: cupy.fuse writes every value a
# function returns to an output array of its own, so returning the argument it updated would cost
# a GPU a second array (NumPy too works best in place: no new array of a prompt tile's scores).
# `elementwise_chains` binds them.


def gelu_tanh(xp, x):
    """GPT-2's GELU, the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in
    place in one new array."""
    out = 0.044715 * x  # [N, I]
    out *= x
    out *= x
    out += x
    out *= math.sqrt(2.0 / math.pi)
    xp.tanh(out, out=out)
    out += 1.0
    out *= x
    # A power of two: the same number as 0.5 x times the rest.
    out *= 0.5  # [N, I]
    return out


def erf(xp, x):
    """The error function, from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): NumPy has none."""
    sign = xp.sign(x)  # [...]
    a = xp.abs(x)  # [...]
    t = 1.0 / (1.0 + 0.3275911 * a)  # [...]
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )  # [...]
    return sign * (1.0 - poly * xp.exp(-a * a))  # [...]


def gelu_erf(xp, x):
    """The exact GELU, 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + erf(xp, x * (1.0 / math.sqrt(2.0))))  # [N, I]


def centered_on_mean(xp, x, total, n):
    """Each token's features less their mean, from their sum over the n features."""
    return x - total / n  # [N, C] mean 0


def normalize_scale_shift(xp, centered, square_total, n, eps, weight, bias):
    """Layer norm's tail, in place in `centered`: the centred features over their standard
    deviation (from the sum of their squares), then scaled and shifted."""
    centered /= xp.sqrt(square_total / n + eps)  # [N, C] variance 1
    centered *= weight
    centered += bias


def shift_and_exp(xp, scores, row_max):
    """Softmax's unnormalised weights, in place in `scores`: exp(score - the row's max), so each
    row's largest is 1."""
    scores -= row_max  # [..., L]
    xp.exp(scores, out=scores)


def weighted_mean_or_zero(xp, weighted, total, sees_a_key):
    """Attention's output: the weighted sum of values over the weights' total, or zeros for a
    query that sees no key."""
    return xp.where(sees_a_key, weighted / total, 0.0)  # [..., D]


@dataclass(frozen=True)
class Chains:
    """The chains bound to one array module, each called with its arrays alone."""

    gelu_tanh: Callable
    gelu_erf: Callable
    centered_on_mean: Callable
    normalize_scale_shift: Callable
    shift_and_exp: Callable
    weighted_mean_or_zero: Callable


def elementwise_chains(xp) -> Chains:
    """The chains for `xp`: on CuPy each compiled into one kernel (cupy.fuse); on NumPy the
    functions as written.  Make them once per model: CuPy caches each compiled kernel on its
    fused function."""
    fuse = getattr(xp, "fuse", None)

    def bound(chain):
        def run(*arrays):
            return chain(xp, *arrays)

        run.__name__ = chain.__name__
        if fuse is None:
            return run
        return fuse(kernel_name=f"minirt_{chain.__name__}")(run)

    return Chains(
        gelu_tanh=bound(gelu_tanh),
        gelu_erf=bound(gelu_erf),
        centered_on_mean=bound(centered_on_mean),
        normalize_scale_shift=bound(normalize_scale_shift),
        shift_and_exp=bound(shift_and_exp),
        weighted_mean_or_zero=bound(weighted_mean_or_zero),
    )


# ------------------------------------------------------------------ the layers


def layer_norm(xp, chains: Chains, x, ln: LayerNorm, eps: float):
    """Normalise each token's features to mean 0, variance 1, then scale and shift."""
    # The statistics in fp32.
    x32 = x.astype(xp.float32, copy=False)  # [N, C]
    n = x.shape[-1]
    centered = chains.centered_on_mean(x32, x32.sum(axis=-1, keepdims=True), n)  # [N, C]
    square_total = xp.square(centered).sum(axis=-1, keepdims=True)  # [N, 1]
    # Variance 1; then scaled and shifted, in place.
    chains.normalize_scale_shift(centered, square_total, n, eps, ln.weight, ln.bias)  # [N, C]
    return centered.astype(x.dtype, copy=False)  # [N, C]


def linear(x, fc: Linear):
    """A 2-D weight GEMM, [tokens, in] @ [in, out], and the bias added in place (no second
    [N, out] array)."""
    out = x @ fc.weight  # [N, out]
    out += fc.bias  # [N, out]
    return out


def gelu(chains: Chains, x, form: str = "tanh"):
    """GELU.  GPT-2 uses the tanh approximation; 'erf' is the exact form."""
    if form == "tanh":
        return chains.gelu_tanh(x)  # [N, I]
    return chains.gelu_erf(x)  # [N, I]


def softmax_attention(xp, chains: Chains, q, keys, values, mask: KeyMask, scale: float):
    """softmax(q k^T * scale, over visible keys) @ v in fp32, for [B, H, T, D] or [H, T, D]: a
    hidden score is the lowest finite float (no -inf arithmetic), so its exp is exactly 0 once the
    row's max is subtracted; the output is divided, not the scores; a query that sees no key gets
    zeros."""
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
            keys, values = kv.read_row(int(batch.slots[row]), n_keys)  # [H, n_keys, D]
        else:
            # This round's alone.
            keys = k[start : start + n_keys].transpose(1, 0, 2)  # [H, n_keys, D]
            values = v[start : start + n_keys].transpose(1, 0, 2)  # [H, n_keys, D]
        queries = q[start + first : start + end].transpose(1, 0, 2)  # [H, end - first, D]
        # Built by the round's first layer, read by the others.
        mask = batch.mask_tile(row, first, end, n_keys)  # [1, end - first, n_keys]
        tile = softmax_attention(
            xp, chains, queries, keys, values, mask, scale
        )  # [H, end - first, D]
        out[start + first : start + end] = tile.transpose(1, 0, 2)  # [end - first, H, D]
    return out


def attention(
    xp, chains: Chains, x, attn: Attention, config: GPT2Config, batch: Batch, kv: LayerKV | None
):
    """Fused QKV projection, keys into the cache (if any), masked attention, output projection."""
    N = x.shape[0]
    H = config.n_head
    D = config.head_dim
    C = config.n_embd
    qkv = linear(x, attn.c_attn).reshape(N, 3, H, D)  # [N, 3, H, D]
    q = qkv[:, 0]  # [N, H, D]
    k = qkv[:, 1]  # [N, H, D]
    v = qkv[:, 2]  # [N, H, D]
    if kv is not None:
        # Each token into its row's slot, at its own position.
        kv.write(k, v)
    scale = 1.0 / math.sqrt(D) if config.scale_attn_weights else 1.0
    if kv is None or batch.seq_len > 1:
        out = prompt_attention(xp, chains, q, k, v, batch, kv, scale)  # [N, H, D]
    else:
        # A decode step: one query per row, all rows in one softmax, against the rows' whole
        # histories.
        keys, values = kv.read(batch)  # [B, H, L, D]
        queries = batch.padded(q).transpose(0, 2, 1, 3)  # [B, H, 1, D]
        out = softmax_attention(xp, chains, queries, keys, values, batch.key_mask, scale)
        out = batch.packed(out.transpose(0, 2, 1, 3))  # [N, H, D]
    # The heads side by side again.
    return linear(out.reshape(N, C), attn.c_proj)  # [N, C]


def mlp(xp, chains: Chains, x, weights: MLP, gelu_form: str):
    """Expand to n_inner, GELU, project back, a tile of tokens at a time: each hidden [tokens, I]
    array stays within MLP_SCRATCH_BYTES (GELU makes a second one; in a CPU's cache its passes are
    cheap), however long."""
    # Tokens per tile.
    rows = max(1, MLP_SCRATCH_BYTES // (weights.c_fc.weight.shape[1] * x.itemsize))
    if x.shape[0] <= rows:
        # One tile (every decode step): no copy into an output array.
        hidden = gelu(chains, linear(x, weights.c_fc), gelu_form)  # [N, I]
        return linear(hidden, weights.c_proj)  # [N, C]
    out = xp.empty_like(x)  # [N, C]
    for first in range(0, x.shape[0], rows):
        hidden = gelu(chains, linear(x[first : first + rows], weights.c_fc), gelu_form)  # [rows, I]
        out[first : first + rows] = linear(hidden, weights.c_proj)  # [rows, C]
    return out


def transformer_block(
    xp, chains: Chains, x, block: Block, config: GPT2Config, batch: Batch, kv: LayerKV | None
):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""
    eps = config.layer_norm_epsilon
    normed = layer_norm(xp, chains, x, block.ln_1, eps)  # [N, C]
    x = x + attention(xp, chains, normed, block.attn, config, batch, kv)  # [N, C]
    normed = layer_norm(xp, chains, x, block.ln_2, eps)  # [N, C]
    return x + mlp(xp, chains, normed, block.mlp, config.gelu_form)  # [N, C]


def lm_head(xp, hidden, head_weight):
    """Hidden states -> fp32 logits, 1024 rows at a time into one array (scoring 8 x 1024 ran 15%
    faster so).  The [C, V] head stays fp32 for fp16 compute too: fp16 resolves logits of tens to
    ~0.03, enough to flip a pick."""
    hidden = hidden.astype(np.float32, copy=False)  # [M, C] fp32
    logits = xp.empty((len(hidden), head_weight.shape[1]), np.float32)  # [M, V] fp32
    for first in range(0, len(hidden), 1024):
        rows = slice(first, first + 1024)
        xp.matmul(hidden[rows], head_weight, out=logits[rows])  # [rows, V]
    return logits  # [M, V] fp32
