"""The Llama family (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2, Qwen3): its weights on a
backend, its composition of the layers, and `Llama.forward(batch, kv_cache)`.

Owns: what a Llama block does that GPT-2's does not, in the order a token meets it:

  * no position embedding at the bottom: the token's position turns its queries and keys in
    every layer instead (RoPE, minirt/model/rope.py), by the position the round's metadata
    gives it (`Batch.positions`), so a padded row is rotated as it would be alone;
  * RMSNorm where GPT-2 has layer norm (`rms_norm`), and Qwen3's RMSNorm of each query and key
    head before the rotation;
  * grouped-query attention: n_kv_head K/V heads, each serving n_head / n_kv_head query heads, so
    the KV cache (and the KV budget) is that many times smaller;
  * the SwiGLU MLP, down(SiLU(gate(x)) * up(x)) (`swiglu_mlp`);
  * no biases, except Qwen2's on Q/K/V (and Llama's attention_bias / mlp_bias when set).

It also owns the checkpoint's tensor names and shapes (`expected_shapes`: `model.` prefix
dropped, `layers.3.self_attn.q_proj.weight`) and how they are laid out on the backend: Hugging
Face's `nn.Linear` stores [out, in]; minirt stores each projection [in, out], Q, K and V side by
side in one weight and gate and up in another, so that each is one GEMM.

Must not know: files, tokenizers, requests, sampling or scheduling.  minirt/model/registry.py
picks this file for the model types llama, mistral, qwen2 and qwen3; the forward pass around
these layers is minirt/model/decoder.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from .backend import Backend
from .batch import Batch
from .decoder import DecoderModel
from .fusion import Chains, elementwise_chains
from .invariant import RowTiles, attend_exactly, probe_model_tiles
from .kv_cache import KVCache, LayerKV
from .layers import Linear, attend, linear, rms_norm, swiglu_mlp
from .llama_config import LlamaConfig
from .rope import RotaryTables, inverse_frequencies, rotary_tables, rotate


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every learned tensor of a Llama-family checkpoint (the `model.` prefix dropped), with the
    shape the config implies; the head, `lm_head.weight`, is optional (tied) and added by the
    loader."""
    V = config.vocab_size
    C = config.n_embd
    I = config.n_inner  # noqa: E741 (I: the MLP's width)
    H = config.n_head
    G = config.n_kv_head
    D = config.head_dim
    # nn.Linear weights, [out, in].
    block = {
        "input_layernorm.weight": (C,),
        "self_attn.q_proj.weight": (H * D, C),
        "self_attn.k_proj.weight": (G * D, C),
        "self_attn.v_proj.weight": (G * D, C),
        "self_attn.o_proj.weight": (C, H * D),
        "post_attention_layernorm.weight": (C,),
        "mlp.gate_proj.weight": (I, C),
        "mlp.up_proj.weight": (I, C),
        "mlp.down_proj.weight": (C, I),
    }
    if config.qkv_bias:
        block |= {"self_attn.q_proj.bias": (H * D,), "self_attn.k_proj.bias": (G * D,)}
        block |= {"self_attn.v_proj.bias": (G * D,)}
    if config.o_bias:
        block["self_attn.o_proj.bias"] = (C,)
    if config.qk_norm:
        block |= {"self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,)}
    if config.mlp_bias:
        block |= {"mlp.gate_proj.bias": (I,), "mlp.up_proj.bias": (I,)}
        block["mlp.down_proj.bias"] = (C,)
    blocks = {
        f"layers.{i}.{name}": shape for i in range(config.n_layer) for name, shape in block.items()
    }
    return {"embed_tokens.weight": (V, C), **blocks, "norm.weight": (C,)}


@dataclass(frozen=True)
class Attention:
    """A Llama block's attention weights, as minirt lays them out: Q, K and V side by side."""

    qkv: Linear  # [C, (H + 2G) D]
    o_proj: Linear  # [H D, C]
    # Qwen3's RMSNorm scales of each query and key head, or None.
    q_norm: Any  # [D]
    k_norm: Any  # [D]


@dataclass(frozen=True)
class Block:
    """One block: norms, attention, and the SwiGLU MLP (gate and up side by side)."""

    input_norm: Any  # [C]
    attn: Attention
    post_attention_norm: Any  # [C]
    gate_up: Linear  # [C, 2I]
    down: Linear  # [I, C]


class LoadedWeights(Protocol):
    """What the model is built from (minirt/loading's `Checkpoint`)."""

    @property
    def config(self) -> LlamaConfig: ...

    @property
    def folder(self) -> Path: ...

    # Canonical name -> host array in the file's precision.
    @property
    def tensors(self) -> Mapping[str, Any]: ...

    @property
    def head_is_tied(self) -> bool: ...


class BlockLoader:
    """Block i's weights from a checkpoint's tensors, laid out [in, out] on the backend in the
    compute dtype (module docstring)."""

    def __init__(self, tensors: Mapping[str, Any], backend: Backend, dtype):
        self.tensors = tensors
        self.backend = backend
        self.dtype = dtype

    def vector(self, name: str):
        return self.backend.asarray(self.tensors[name]).astype(self.dtype, copy=False)

    def side_by_side(self, names: list[str]) -> Linear:
        """The projections `names` ([out_k, in] each) as one [in, sum of out_k] weight, and their
        biases joined the same way (None when they have none)."""
        weights = [self.tensors[f"{name}.weight"] for name in names]
        joined = weights[0] if len(weights) == 1 else np.concatenate(weights, axis=0)
        weight = self.backend.transposed(joined, self.dtype)  # [in, out]
        if f"{names[0]}.bias" not in self.tensors:
            return Linear(weight)
        biases = np.concatenate([self.tensors[f"{name}.bias"] for name in names])  # [out]
        return Linear(weight, self.backend.asarray(biases).astype(self.dtype))

    def block(self, i: int) -> Block:
        prefix = f"layers.{i}."
        attn = prefix + "self_attn."
        norms = [f"{attn}q_norm.weight", f"{attn}k_norm.weight"]
        q_norm, k_norm = (self.vector(name) if name in self.tensors else None for name in norms)
        mlp = prefix + "mlp."
        return Block(
            input_norm=self.vector(prefix + "input_layernorm.weight"),
            attn=Attention(
                qkv=self.side_by_side([f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj"]),
                o_proj=self.side_by_side([f"{attn}o_proj"]),
                q_norm=q_norm,
                k_norm=k_norm,
            ),
            post_attention_norm=self.vector(prefix + "post_attention_layernorm.weight"),
            gate_up=self.side_by_side([f"{mlp}gate_proj", f"{mlp}up_proj"]),
            down=self.side_by_side([f"{mlp}down_proj"]),
        )


def self_attention(
    xp,
    chains: Chains,
    x,
    attn: Attention,
    config: LlamaConfig,
    batch: Batch,
    kv: LayerKV | None,
    rotary: RotaryTables,
    tiles: RowTiles | None = None,
):
    """A Llama block's attention: the Q/K/V projection, split into H query heads and G K/V heads,
    Qwen3's per-head norms, the rotation by each token's position, attention over the round and
    the cache (each K/V head serving H / G query heads), the output projection."""
    N = x.shape[0]
    H = config.n_head
    G = config.n_kv_head
    D = config.head_dim
    qkv = linear(x, attn.qkv, tiles)  # [N, (H + 2G) D]
    q = qkv[:, : H * D].reshape(N, H, D)  # [N, H, D]
    k = qkv[:, H * D : (H + G) * D].reshape(N, G, D)  # [N, G, D]
    v = qkv[:, (H + G) * D :].reshape(N, G, D)  # [N, G, D]
    if attn.q_norm is not None:
        q = rms_norm(xp, chains, q, attn.q_norm, config.rms_norm_eps, tiles)  # [N, H, D]
        k = rms_norm(xp, chains, k, attn.k_norm, config.rms_norm_eps, tiles)  # [N, G, D]
    q = rotate(xp, chains, q, rotary)  # [N, H, D]
    k = rotate(xp, chains, k, rotary)  # [N, G, D]
    attention = attend if tiles is None else attend_exactly
    out = attention(xp, chains, q, k, v, batch, kv, 1.0 / math.sqrt(D))  # [N, H, D]
    return linear(out.reshape(N, H * D), attn.o_proj, tiles)  # [N, C]


def llama_block(
    xp,
    chains: Chains,
    x,
    block: Block,
    config: LlamaConfig,
    batch: Batch,
    kv: LayerKV | None,
    rotary: RotaryTables,
    tiles: RowTiles | None = None,
):
    """Pre-norm residual block: x + attn(rms_norm(x)), then x + swiglu(rms_norm(x))."""
    eps = config.rms_norm_eps
    normed = rms_norm(xp, chains, x, block.input_norm, eps, tiles)  # [N, C]
    x = x + self_attention(xp, chains, normed, block.attn, config, batch, kv, rotary, tiles)
    normed = rms_norm(xp, chains, x, block.post_attention_norm, eps, tiles)  # [N, C]
    return x + swiglu_mlp(xp, chains, normed, block.gate_up, block.down, tiles)  # [N, C]


class Llama(DecoderModel):
    """A Llama-family model's weights on a backend, and its layers of the forward pass over one
    round (the pass itself is minirt/model/decoder.py's)."""

    def __init__(
        self, checkpoint: LoadedWeights, backend: Backend, dtype, batch_invariant: bool = False
    ):
        self.config = checkpoint.config
        self.folder = checkpoint.folder
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        tensors = checkpoint.tensors
        with np.errstate(over="ignore"):
            loader = BlockLoader(tensors, backend, self.dtype)
            self.blocks = [loader.block(i) for i in range(self.config.n_layer)]
            self.norm = loader.vector("norm.weight")  # [C]
            # The head [C, V] fp32, contiguous (as GPT-2's, docs/performance.md); a tied model's
            # embeddings are its columns, an untied one's the rows of its own table.
            self.head_weight = backend.transposed(tensors["lm_head.weight"], np.float32)
            self.embedding = (
                None if checkpoint.head_is_tied else loader.vector("embed_tokens.weight")
            )
        self.params = self.named_params()
        self.tables = [self.embedding] if self.embedding is not None else []
        # SwiGLU, RMSNorm, the rotation, softmax: one kernel each on CuPy.
        self.chains = elementwise_chains(self.xp)
        self.frequencies = backend.asarray(
            inverse_frequencies(self.config.rope, self.config.head_dim)
        )
        self.batch_invariant = batch_invariant
        self.tiles: RowTiles | None = None
        self.head_tiles: RowTiles | None = None
        if batch_invariant:
            self.tiles, self.head_tiles = self.probed_tiles()

    def named_params(self) -> dict[str, Any]:
        """The weights as they sit on the backend, by names of minirt's layout (Q/K/V joined as
        qkv, gate and up as gate_up)."""
        params: dict[str, Any] = {"norm.weight": self.norm}
        for i, block in enumerate(self.blocks):
            named = {
                "input_layernorm.weight": block.input_norm,
                "self_attn.qkv.weight": block.attn.qkv.weight,
                "self_attn.qkv.bias": block.attn.qkv.bias,
                "self_attn.o_proj.weight": block.attn.o_proj.weight,
                "self_attn.o_proj.bias": block.attn.o_proj.bias,
                "self_attn.q_norm.weight": block.attn.q_norm,
                "self_attn.k_norm.weight": block.attn.k_norm,
                "post_attention_layernorm.weight": block.post_attention_norm,
                "mlp.gate_up.weight": block.gate_up.weight,
                "mlp.gate_up.bias": block.gate_up.bias,
                "mlp.down_proj.weight": block.down.weight,
                "mlp.down_proj.bias": block.down.bias,
            }
            params |= {f"layers.{i}.{k}": v for k, v in named.items() if v is not None}
        return params

    def probed_tiles(self) -> tuple[RowTiles, RowTiles]:
        """Exact mode's heights (minirt/model/invariant.py), probed on one weight of each shape
        and on RMSNorm (and Qwen3's per-head norm)."""
        block = self.blocks[0]
        weights = [block.attn.qkv.weight, block.attn.o_proj.weight, block.gate_up.weight]
        weights.append(block.down.weight)
        eps = self.config.rms_norm_eps
        row_functions = [
            ("RMSNorm", self.config.n_embd, lambda rows: self.normed(rows, block.input_norm))
        ]
        if block.attn.q_norm is not None:
            H = self.config.n_head
            D = self.config.head_dim

            def head_norm(rows):
                heads = rows.reshape(len(rows), H, D)  # [h, H, D]
                return rms_norm(self.xp, self.chains, heads, block.attn.q_norm, eps)

            row_functions.append(("per-head RMSNorm", H * D, head_norm))
        return probe_model_tiles(self.xp, self.dtype, weights, self.head_weight, row_functions)

    def normed(self, rows, weight):
        return rms_norm(self.xp, self.chains, rows, weight, self.config.rms_norm_eps)

    def embed(self, token_ids):
        """The round's tokens' embeddings [N, C]: rows of the table, or, tied, columns of the
        [C, V] head."""
        if self.embedding is not None:
            return self.embedding[token_ids]  # [N, C]
        return self.head_weight[:, token_ids].T.astype(self.dtype)  # [N, C]

    def hidden_states(self, batch: Batch, kv_cache: KVCache | None):
        """The round's tokens embedded, through every block (each rotating queries and keys by
        the tokens' own positions), and the last RMSNorm: [N, C]."""
        xp = self.xp
        chains = self.chains
        config = self.config
        device = batch.device
        # Each token's rotation, from its own position: once a round, read by every layer.
        rotary = rotary_tables(xp, self.frequencies, device.positions, self.dtype)  # [N, 1, D]
        x = self.embed(device.token_ids)  # [N, C]
        for i, block in enumerate(self.blocks):
            kv = None if kv_cache is None else kv_cache.layer(i)
            x = llama_block(xp, chains, x, block, config, batch, kv, rotary, self.tiles)
        return rms_norm(xp, chains, x, self.norm, config.rms_norm_eps, self.tiles)  # [N, C]
