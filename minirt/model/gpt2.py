"""GPT-2: its weights on a backend, its composition of the layers, and the one way through them,
`GPT2.forward(batch, kv_cache)`.

Owns: what makes GPT-2 GPT-2 and no other family: the names and shapes of its checkpoint's
tensors (`expected_shapes`, `block_weights`: `blocks[3].attn.c_attn.weight` is
`h.3.attn.c_attn.weight`), learned position embeddings added to the token's (`embed`), the fused
Q/K/V projection (`self_attention`), the pre-norm block (`transformer_block`), and `GPT2`, which
takes a loaded checkpoint's tensors onto a backend in the compute dtype (the head stored [C, V]
in fp32), runs one round's forward pass, allocates KV caches, and scores whole sequences without
one (`logits`).  The layers themselves are minirt/model/layers.py's; minirt/model/registry.py
picks this file for a config.json whose model_type is "gpt2".

Must not know: files, tokenizers, requests, sampling or scheduling.  It takes any object with
`config`, `folder`, `tensors` and `head_is_tied` (minirt/loading/checkpoint.py's `Checkpoint` is
one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from ..errors import InputError
from .backend import Backend
from .config import GPT2Config
from .batch import Batch, check_token_ids
from .fusion import Chains, elementwise_chains
from .kv_cache import KVCache, LayerKV
from .invariant import (
    HEAD_TILE_ROWS,
    RowTiles,
    attend_exactly,
    candidate_heights,
    probe_row_tiles,
)
from .layers import LayerNorm, Linear, attend, layer_norm, linear, lm_head, mlp


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every learned tensor of GPT2LMHeadModel, with the shape the config implies (the loader
    checks each tensor of a checkpoint against it)."""
    V = config.vocab_size
    P = config.n_positions
    C = config.n_embd
    I = config.n_inner  # noqa: E741 (I: the MLP's inner width)
    # One block's tensors.  The projections are Hugging Face `Conv1D`s, stored [in, out]:
    # `x @ weight`, no transpose.
    block = {
        "ln_1.weight": (C,),
        "ln_1.bias": (C,),
        "attn.c_attn.weight": (C, 3 * C),
        "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C),
        "attn.c_proj.bias": (C,),
        "ln_2.weight": (C,),
        "ln_2.bias": (C,),
        "mlp.c_fc.weight": (C, I),
        "mlp.c_fc.bias": (I,),
        "mlp.c_proj.weight": (I, C),
        "mlp.c_proj.bias": (C,),
    }
    blocks = {
        f"h.{i}.{name}": shape for i in range(config.n_layer) for name, shape in block.items()
    }
    return {
        "wte.weight": (V, C),
        "wpe.weight": (P, C),
        **blocks,
        "ln_f.weight": (C,),
        "ln_f.bias": (C,),
    }


@dataclass(frozen=True)
class Attention:
    """GPT-2's attention weights: queries, keys and values side by side in one projection."""

    c_attn: Linear  # [C, 3C]
    c_proj: Linear  # [C, C]


@dataclass(frozen=True)
class MLP:
    """GPT-2's MLP: up to n_inner (c_fc), back down (c_proj)."""

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


def self_attention(
    xp,
    chains: Chains,
    x,
    attn: Attention,
    config: GPT2Config,
    batch: Batch,
    kv: LayerKV | None,
    tiles: RowTiles | None = None,
):
    """GPT-2's attention: the fused Q/K/V projection, split into heads, attention over the round
    and the cache (`attend`; with `tiles`, exact mode's `attend_exactly`), the heads side by side
    again, the output projection."""
    N = x.shape[0]
    H = config.n_head
    D = config.head_dim
    C = config.n_embd
    qkv = linear(x, attn.c_attn, tiles).reshape(N, 3, H, D)  # [N, 3, H, D]
    q = qkv[:, 0]  # [N, H, D]
    k = qkv[:, 1]  # [N, H, D]
    v = qkv[:, 2]  # [N, H, D]
    scale = 1.0 / math.sqrt(D) if config.scale_attn_weights else 1.0
    attention = attend if tiles is None else attend_exactly
    out = attention(xp, chains, q, k, v, batch, kv, scale)  # [N, H, D]
    return linear(out.reshape(N, C), attn.c_proj, tiles)  # [N, C]


def transformer_block(
    xp,
    chains: Chains,
    x,
    block: Block,
    config: GPT2Config,
    batch: Batch,
    kv: LayerKV | None,
    tiles: RowTiles | None = None,
):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).  `tiles`: exact batch
    invariance's (minirt/model/invariant.py), or None."""
    eps = config.layer_norm_epsilon
    normed = layer_norm(xp, chains, x, block.ln_1, eps, tiles)  # [N, C]
    x = x + self_attention(xp, chains, normed, block.attn, config, batch, kv, tiles)  # [N, C]
    normed = layer_norm(xp, chains, x, block.ln_2, eps, tiles)  # [N, C]
    mlp_out = mlp(
        xp, chains, normed, block.mlp.c_fc, block.mlp.c_proj, config.gelu_form, tiles
    )  # [N, C]
    return x + mlp_out  # [N, C]


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

    def __init__(
        self, checkpoint: LoadedWeights, backend: Backend, dtype, batch_invariant: bool = False
    ):
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
        # Exact batch invariance: the weight products in calls of fixed heights, which the BLAS
        # is probed for here (minirt/model/invariant.py).
        self.batch_invariant = batch_invariant
        self.tiles: RowTiles | None = None
        self.head_tiles: RowTiles | None = None
        if batch_invariant:
            self.tiles, self.head_tiles = self.probed_tiles()

    def probed_tiles(self) -> tuple[RowTiles, RowTiles]:
        """Exact mode's heights for the blocks' weight products and for the head: those at which
        the BLAS gives a row the same bits wherever it sits, probed on one weight of each shape.
        The head's calls are kept to HEAD_TILE_ROWS rows: taller ones would only speed up scoring
        every position, and would cost the probe a second or more."""
        block = self.blocks[0]
        heights = candidate_heights(self.xp, self.dtype)
        one_of_each_shape = {
            weight.shape: (weight, max(heights))
            for weight in (
                block.attn.c_attn.weight,
                block.attn.c_proj.weight,
                block.mlp.c_fc.weight,
                block.mlp.c_proj.weight,
            )
        }
        one_of_each_shape[("head",)] = (self.head_weight, HEAD_TILE_ROWS)
        # Layer norm runs in calls of the same heights; its rows are checked too.
        eps = self.config.layer_norm_epsilon

        def norm(rows):
            return layer_norm(self.xp, self.chains, rows, block.ln_1, eps)

        row_functions = [("layer norm", self.config.n_embd, norm)]
        tiles = probe_row_tiles(self.xp, list(one_of_each_shape.values()), heights, row_functions)
        return tiles, tiles.capped(HEAD_TILE_ROWS)

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
        return KVCache(self.xp, c.n_layer, c.n_kv_head, c.head_dim, n_slots, capacity, self.dtype)

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
                x = transformer_block(xp, self.chains, x, block, c, batch, kv, self.tiles)
            eps = c.layer_norm_epsilon
            x = layer_norm(xp, self.chains, x, self.ln_f, eps, self.tiles)  # [N, C]
            if kv_cache is not None:
                kv_cache.advance(batch)
            if at is None:
                # At decode every token is some row's last: no gather.
                if batch.last_index.size != batch.n_tokens:
                    x = x[device.last_index]  # [M, C]
            elif at.size != batch.n_tokens or not np.array_equal(at, np.arange(batch.n_tokens)):
                x = x[self.backend.asarray(at)]  # [M, C]
            return lm_head(xp, x, self.head_weight, self.head_tiles)  # [M, V] fp32

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
