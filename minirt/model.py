"""GPT-2, written out by hand: the layers as pure functions, and the model that runs them.

Owns: the arithmetic of GPT-2 (embeddings, layer norm, attention, GELU, MLP,
head) over a padded batch, and `GPT2`, which holds the weights on a backend
and runs one forward pass of a round.

Read it top to bottom: each layer is one function, its tensors carry their
shapes in comments, and parameter names are the checkpoint's own
(`h.3.attn.c_attn.weight`).  Shape letters:

    B  rows in the batch          T  new tokens per row this round (padded)
    N  real tokens in the round   L  key positions attended (longest row's kv_len)
    C  n_embd                     H  n_head      D  head_dim = C // H
    I  n_inner (MLP width)        V  vocab_size

Real tokens travel packed, as [N, C] rows with no padding, so every weight
GEMM is 2-D and no compute is spent on padding.  Only attention needs the
rows apart: there the queries are laid out padded, [B, H, T, D], beside each
row's keys from the KV cache, and the mask says who may see whom.  At decode
(one token per row) packed and padded are the same and nothing moves.

Every function takes `xp`, the array module (numpy or cupy), and uses nothing
NumPy-only, so the GPU runs this same code.  Numerically delicate steps
(layer-norm statistics, softmax, logits) are done in float32 whatever the
compute dtype, so float16 weights stay accurate.

Must not know: files, tokenizers, requests, sampling or scheduling.
"""

from __future__ import annotations

import math

import numpy as np

from .backend import Backend, get_backend, resolve_dtype
from .batch import RoundInputs, prepare_round
from .checkpoint import Checkpoint, load_checkpoint
from .config import GPT2Config
from .errors import MinirtError
from .kv_cache import KVCache

# ---------------------------------------------------------------------------- layers


def embed(xp, wte, wpe, token_ids, positions):
    """Token embedding plus position embedding, for the round's real tokens."""
    return wte[token_ids] + wpe[positions]  # [N, C]


def layer_norm(xp, x, weight, bias, eps: float):
    """Normalise each token's features to mean 0, variance 1, then scale and shift."""
    x32 = x.astype(xp.float32, copy=False)  # [N, C] statistics in fp32
    mean = x32.mean(axis=-1, keepdims=True)  # [N, 1]
    centered = x32 - mean  # [N, C]
    variance = (centered * centered).mean(axis=-1, keepdims=True)  # [N, 1]
    normed = centered / xp.sqrt(variance + eps)  # [N, C]
    return (normed * weight + bias).astype(x.dtype, copy=False)  # [N, C]


def linear(xp, x, weight, bias):
    """A 2-D weight GEMM, [tokens, in] @ [in, out]: Hugging Face's Conv1D layout."""
    return x @ weight + bias  # [N, out]


def erf(xp, x):
    """The error function, from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).

    NumPy has no erf; this formula is accurate to fp32 precision and runs on
    any array module.
    """
    sign = xp.sign(x)  # [...]
    a = xp.abs(x)  # [...]
    t = 1.0 / (1.0 + 0.3275911 * a)  # [...]
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))  # [...]
    return sign * (1.0 - poly * xp.exp(-a * a))  # [...]


def gelu(xp, x, form: str = "tanh"):
    """GELU.  GPT-2 uses the tanh approximation; 'erf' is the exact form."""
    if form == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)  # [N, I]
        return 0.5 * x * (1.0 + xp.tanh(inner))  # [N, I]
    return 0.5 * x * (1.0 + erf(xp, x * (1.0 / math.sqrt(2.0))))  # [N, I]


def attention_mask(xp, past_lens, kv_lens, seq_len: int, kv_len: int):
    """Which keys each query may see: causal AND key-is-real.

    Query t of row b is the token at position past_lens[b] + t.  It may see
    key j when j <= that position (causal) and j < kv_lens[b] (the key holds a
    real token of this row, not padding or a stale slot entry).
    """
    query_pos = past_lens[:, None] + xp.arange(seq_len)[None, :]  # [B, T]
    key_pos = xp.arange(kv_len)  # [L]
    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, T, L]
    key_is_real = key_pos[None, :] < kv_lens[:, None]  # [B, L]
    return (causal & key_is_real[:, None, :])[:, None, :, :]  # [B, 1, T, L]


def softmax_attention(xp, q, keys, values, mask, scale: float):
    """softmax(q k^T * scale, over visible keys) @ v, with no NaN for a row that sees no key.

    Everything here runs in fp32, whatever the compute dtype: scores, softmax and
    the weighted sum (the result is cast back).

    Masked scores are set with `where` to the most negative finite float (never
    -inf arithmetic), and the probabilities are zeroed with `where` again, so a
    query with no visible key gets all-zero weights and a zero output.
    """
    q32 = q.astype(xp.float32, copy=False)  # [B, H, T, D]; fp16 dot products can overflow 65504
    keys32 = keys.astype(xp.float32, copy=False)  # [B, H, L, D] (no copy when already fp32)
    scores = (q32 @ keys32.transpose(0, 1, 3, 2)) * scale  # [B, H, T, L] fp32
    lowest = xp.finfo(xp.float32).min
    scores = xp.where(mask, scores, lowest)  # [B, H, T, L]
    scores = scores - scores.max(axis=-1, keepdims=True)  # [B, H, T, L] max is 0 per visible row
    weights = xp.where(mask, xp.exp(scores), 0.0)  # [B, H, T, L]
    total = weights.sum(axis=-1, keepdims=True)  # [B, H, T, 1]; >= 1 if any key is visible
    weights = weights / xp.maximum(total, 1.0)  # [B, H, T, L]; rows with no key stay 0
    values32 = values.astype(xp.float32, copy=False)  # [B, H, L, D]; a 4-D fp16 matmul would fall back to slow GEMVs on CuPy
    return (weights @ values32).astype(q.dtype, copy=False)  # [B, H, T, D]


def to_padded(xp, packed, batch):
    """Packed per-token rows [N, ...] -> the padded layout [B, T, ...] (padding is zero)."""
    if batch.all_real:
        return packed.reshape(batch.batch_size, batch.seq_len, *packed.shape[1:])  # [B, T, ...] a view
    padded = xp.zeros((batch.batch_size, batch.seq_len, *packed.shape[1:]), dtype=packed.dtype)  # [B, T, ...]
    padded[batch.token_rows, batch.token_cols] = packed
    return padded


def to_packed(xp, padded, batch):
    """The padded layout [B, T, ...] -> packed real-token rows [N, ...]."""
    if batch.all_real:
        return padded.reshape(batch.batch_size * batch.seq_len, *padded.shape[2:])  # [N, ...]
    return padded[batch.token_rows, batch.token_cols]  # [N, ...]


def causal_self_attention(xp, x, p, config: GPT2Config, cache: KVCache, layer: int, batch):
    """Fused QKV projection, cache write, masked attention over the cache, output projection."""
    N, H, D, C = x.shape[0], config.n_head, config.head_dim, config.n_embd
    qkv = linear(xp, x, p["attn.c_attn.weight"], p["attn.c_attn.bias"])  # [N, 3C]
    qkv = qkv.reshape(N, 3, H, D)  # [N, 3, H, D]
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # each [N, H, D]
    cache.write(layer, k, v, batch.token_slots, batch.token_positions)  # each token into its row's slot
    keys, values = cache.read(layer, batch.slot_index, batch.slot_span, batch.kv_len)  # each [B, H, L, D]
    q = to_padded(xp, q, batch).transpose(0, 2, 1, 3)  # [B, H, T, D]
    scale = 1.0 / math.sqrt(D) if config.scale_attn_weights else 1.0
    out = softmax_attention(xp, q, keys, values, batch.mask, scale)  # [B, H, T, D]
    out = to_packed(xp, out.transpose(0, 2, 1, 3), batch).reshape(N, C)  # [N, C] heads side by side again
    return linear(xp, out, p["attn.c_proj.weight"], p["attn.c_proj.bias"])  # [N, C]


def mlp(xp, x, p, config: GPT2Config):
    """Expand to n_inner, GELU, project back."""
    hidden = gelu(xp, linear(xp, x, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]), config.gelu_form)  # [N, I]
    return linear(xp, hidden, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])  # [N, C]


def transformer_block(xp, x, p, config: GPT2Config, cache: KVCache, layer: int, batch):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""
    eps = config.layer_norm_epsilon
    x = x + causal_self_attention(xp, layer_norm(xp, x, p["ln_1.weight"], p["ln_1.bias"], eps), p, config, cache, layer, batch)  # [N, C]
    x = x + mlp(xp, layer_norm(xp, x, p["ln_2.weight"], p["ln_2.bias"], eps), p, config)  # [N, C]
    return x  # [N, C]


def lm_head(xp, hidden, head_weight):
    """Hidden states -> next-token logits, computed and returned in fp32.

    `head_weight` is kept in fp32 even when the model computes in fp16: logits
    of tens are only resolved to ~0.03 in fp16, enough to flip a greedy choice.
    """
    return hidden.astype(xp.float32, copy=False) @ head_weight.T  # [N, V] fp32


# ---------------------------------------------------------------------------- the model


class BatchOnDevice:
    """A round's metadata moved to the backend once, shared by every layer."""

    def __init__(self, xp, backend: Backend, inputs: RoundInputs):
        self.inputs = inputs
        self.batch_size, self.seq_len = inputs.batch_size, inputs.seq_len
        rows, cols = inputs.real_tokens()  # [N] each: where each packed token sits in the padded layout
        self.all_real = bool(rows.size == inputs.batch_size * inputs.seq_len)  # no padding: packed == padded
        self.token_rows, self.token_cols = backend.asarray(rows), backend.asarray(cols)  # [N], [N]
        self.token_ids = backend.asarray(inputs.input_ids[rows, cols])  # [N]
        self.token_positions = backend.asarray(inputs.positions[rows, cols])  # [N] = past_lens[row] + col
        self.token_slots = backend.asarray(inputs.slots[rows])  # [N] the KV slot of each token's row
        self.slot_index = backend.asarray(inputs.slots)  # [B]
        self.slot_span = inputs.contiguous_slots()  # (first, stop) when the KV read can be a view
        self.kv_len = inputs.max_kv_len  # L, the longest row's keys after this round
        self.mask = attention_mask(
            xp, backend.asarray(inputs.past_lens), backend.asarray(inputs.kv_lens), inputs.seq_len, inputs.max_kv_len
        )  # [B, 1, T, L]


class GPT2:
    """GPT-2's weights on a backend, and the forward pass over one round."""

    def __init__(self, checkpoint: Checkpoint, backend: Backend, dtype):
        self.config = checkpoint.config
        self.folder = checkpoint.folder
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        self.head_is_tied = checkpoint.head_is_tied
        converted = {}  # id(host array) -> backend array: the tied head is converted once
        self.params = {}
        for name, host in checkpoint.tensors.items():
            if id(host) not in converted:
                # No copy on NumPy when the file's dtype is the compute dtype: the
                # array stays a read-only view of the memory-mapped file.
                converted[id(host)] = backend.asarray(host).astype(self.dtype, copy=False)
            self.params[name] = converted[id(host)]
        head = checkpoint.tensors["lm_head.weight"]  # [V, C], file precision
        self.head_weight = (self.params["lm_head.weight"] if self.dtype == np.float32
                            else backend.asarray(head).astype(np.float32))  # [V, C] fp32 for fp32 logits
        n = self.config.n_layer
        self.blocks = [
            {name[len(f"h.{i}."):]: array for name, array in self.params.items() if name.startswith(f"h.{i}.")}
            for i in range(n)
        ]  # blocks[i]["attn.c_attn.weight"] is params["h.{i}.attn.c_attn.weight"]

    @property
    def n_params(self) -> int:
        """Learned numbers, counting a tied head once."""
        seen, total = set(), 0
        for array in self.params.values():
            if id(array) not in seen:
                seen.add(id(array))
                total += int(array.size)
        return total

    def new_kv_cache(self, n_slots: int, capacity: int) -> KVCache:
        """Preallocate KV buffers for n_slots requests of up to `capacity` positions each."""
        c = self.config
        if capacity > c.n_positions:
            raise ValueError(f"KV capacity {capacity} exceeds the model's context of {c.n_positions} positions")
        return KVCache(self.xp, c.n_layer, c.n_head, c.head_dim, n_slots, capacity, self.dtype)

    def forward(self, inputs: RoundInputs, cache: KVCache):
        """One forward pass of a round: writes each row's new keys and returns the final hidden states.

        Returns a backend array [N, C] (after ln_f), one row per real token in
        `inputs.real_tokens()` order (row by row, left to right).  Each slot's
        length is advanced by its row's new tokens.
        """
        xp, c = self.xp, self.config
        cache.check_room(inputs)
        if int((inputs.positions).max(initial=0)) >= c.n_positions:
            raise ValueError(f"a position reaches {int(inputs.positions.max())}, past the context of {c.n_positions}")
        batch = BatchOnDevice(xp, self.backend, inputs)
        x = embed(xp, self.params["wte.weight"], self.params["wpe.weight"], batch.token_ids, batch.token_positions)  # [N, C]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(xp, x, p, c, cache, layer, batch)  # [N, C]
        x = layer_norm(xp, x, self.params["ln_f.weight"], self.params["ln_f.bias"], c.layer_norm_epsilon)  # [N, C]
        cache.advance(inputs)
        return x  # [N, C]

    def head(self, hidden):
        """Final hidden states [..., C] -> fp32 logits [..., V] (a backend array)."""
        flat = hidden.reshape(-1, self.config.n_embd)  # [N, C]
        logits = lm_head(self.xp, flat, self.head_weight)  # [N, V]
        return logits.reshape(*hidden.shape[:-1], self.config.vocab_size)  # [..., V]

    def next_token_logits(self, inputs: RoundInputs, cache: KVCache) -> np.ndarray:
        """Run a round and return, for each row that brought tokens, the logits after its last one.

        Only those positions go through the head (the head is the biggest GEMM
        of a small model), and only they cross back to the host: NumPy fp32
        [B', V], where B' counts the rows with new_lens > 0, in row order.
        """
        return self.backend.to_numpy(self.head(self._last_hidden(inputs, cache)))  # [B', V]

    def _last_hidden(self, inputs: RoundInputs, cache: KVCache):
        """Run the round; keep the hidden state of each row's last token, [B', C]."""
        hidden = self.forward(inputs, cache)  # [N, C]
        last = inputs.last_tokens()  # [B']
        if last.size == hidden.shape[0]:  # decode: every token is some row's last
            return hidden
        return hidden[self.backend.asarray(last)]  # [B', C]

    def greedy_next_tokens(self, inputs: RoundInputs, cache: KVCache) -> np.ndarray:
        """Run a round and return each row's argmax token [B'] (int64, host).

        The argmax runs on the backend, so on a GPU only B integers cross to the
        host per round instead of B x V logits.  Ties go to the lowest id, as
        with NumPy's argmax on the host.
        """
        logits = self.head(self._last_hidden(inputs, cache))  # [B', V] on the backend
        return self.backend.to_numpy(self.xp.argmax(logits, axis=-1)).astype(np.int64)  # [B']

    def check_token_ids(self, token_ids) -> list[list[int]]:
        """Validate a list of token-id lists; returns them as plain int lists."""
        if isinstance(token_ids, np.ndarray) or not isinstance(token_ids, (list, tuple)):
            raise InputError("token_ids must be a list of token-id lists, one per sequence")
        rows = []
        V, P = self.config.vocab_size, self.config.n_positions
        for b, seq in enumerate(token_ids):
            try:
                ids = [int(t) for t in seq]
            except (TypeError, ValueError):
                raise InputError(f"sequence {b} is not a list of integer token ids") from None
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise InputError(f"sequence {b} has token id {bad[0]}, outside the vocabulary [0, {V})")
            if len(ids) > P:
                raise InputError(f"sequence {b} has {len(ids)} tokens, more than the model's context of {P}")
            rows.append(ids)
        return rows

    def logits(self, token_ids) -> np.ndarray:
        """Score whole sequences of different lengths in one padded batch.

        Returns NumPy fp32 logits [B, max_len, V].  Row b's first
        len(token_ids[b]) positions are that sequence's logits; the rest
        (padding) are unspecified.
        """
        rows = self.check_token_ids(token_ids)
        max_len = max((len(r) for r in rows), default=0)
        if not rows or max_len == 0:
            return np.zeros((len(rows), max_len, self.config.vocab_size), dtype=np.float32)
        cache = self.new_kv_cache(n_slots=len(rows), capacity=max_len)
        inputs = prepare_round(rows, slots=np.arange(len(rows)), past_lens=np.zeros(len(rows)))
        hidden = self.forward(inputs, cache)  # [N, C]
        return inputs.unpack(self.backend.to_numpy(self.head(hidden)))  # [B, T, V]


class InputError(MinirtError, ValueError):
    """Token ids the model cannot take (out of vocabulary, too long, not integers)."""


def load_model(model, backend: str = "numpy", dtype: str = "float32") -> GPT2:
    """Load a GPT-2 checkpoint (a folder or a hub id in the local cache) onto a backend.

    >>> m = load_model("gpt2")                     # doctest: +SKIP
    >>> m.logits([[464, 3290], [15496]]).shape     # doctest: +SKIP
    (2, 2, 50257)
    """
    chosen, _note = get_backend(backend)
    return GPT2(load_checkpoint(model), chosen, resolve_dtype(dtype))
