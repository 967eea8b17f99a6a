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

from .backend import Backend
from .config import GPT2Config
from .batch import Batch
from .decoder import DecoderModel
from .fusion import Chains, elementwise_chains
from .kv_cache import KVCache, LayerKV
from .invariant import RowTiles, attend_exactly, probe_model_tiles
from .layers import LayerNorm, Linear, attend, layer_norm, linear, mlp


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


class GPT2(DecoderModel):
    """GPT-2's weights on a backend, and its layers of the forward pass over one round (the pass
    itself is minirt/model/decoder.py's)."""

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
        # Beside params: the head, and the embedding when untied (n_params counts them).
        self.tables = [self.wte_t]
        # Exact batch invariance: the weight products in calls of fixed heights, which the BLAS
        # is probed for here (minirt/model/invariant.py).
        self.batch_invariant = batch_invariant
        self.tiles: RowTiles | None = None
        self.head_tiles: RowTiles | None = None
        if batch_invariant:
            self.tiles, self.head_tiles = self.probed_tiles()

    def probed_tiles(self) -> tuple[RowTiles, RowTiles]:
        """Exact mode's heights for the blocks' weight products and for the head: those at which
        the BLAS gives a row the same bits wherever it sits, probed on one weight of each shape
        (minirt/model/invariant.py).  Layer norm runs in calls of the same heights; its rows are
        checked too."""
        block = self.blocks[0]
        weights = [block.attn.c_attn.weight, block.attn.c_proj.weight]
        weights += [block.mlp.c_fc.weight, block.mlp.c_proj.weight]
        eps = self.config.layer_norm_epsilon

        def norm(rows):
            return layer_norm(self.xp, self.chains, rows, block.ln_1, eps)

        row_functions = [("layer norm", self.config.n_embd, norm)]
        return probe_model_tiles(self.xp, self.dtype, weights, self.head_weight, row_functions)

    def hidden_states(self, batch: Batch, kv_cache: KVCache | None):
        """The round's tokens embedded (token plus learned position), through every block, and
        the last layer norm: [N, C]."""
        xp = self.xp
        device = batch.device
        x = embed(self.wte_t, self.wpe, device.token_ids, device.positions)  # [N, C]
        for i, block in enumerate(self.blocks):
            kv = None if kv_cache is None else kv_cache.layer(i)
            x = transformer_block(xp, self.chains, x, block, self.config, batch, kv, self.tiles)
        eps = self.config.layer_norm_epsilon
        return layer_norm(xp, self.chains, x, self.ln_f, eps, self.tiles)  # [N, C]
