"""Each layer function against an independent computation (math module, plain loops, torch)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import requires_reference
from minirt.model.batch import attention_mask, key_mask
from minirt.model.fusion import elementwise_chains, erf
from minirt.model.layers import LayerNorm, gelu, layer_norm, softmax_attention

# The chains as NumPy runs them: the functions as written.
CHAINS = elementwise_chains(np)


def test_gelu_tanh_matches_the_formula_elementwise():
    xs = np.linspace(-8, 8, 301, dtype=np.float64)
    want = [0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) for x in xs]
    assert np.allclose(gelu(CHAINS, xs, "tanh"), want, rtol=1e-12, atol=1e-12)


def test_erf_and_exact_gelu_against_math_erf():
    xs = np.linspace(-6, 6, 1201)
    assert np.abs(erf(np, xs) - np.array([math.erf(x) for x in xs])).max() < 2e-7
    want = np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in xs])
    assert np.abs(gelu(CHAINS, xs, "erf") - want).max() < 1e-6


@requires_reference
def test_gelu_forms_against_torch():
    import torch

    xs = torch.linspace(-10, 10, 2001, dtype=torch.float32)
    for form, approximate in (("tanh", "tanh"), ("erf", "none")):
        ref = torch.nn.functional.gelu(xs, approximate=approximate).numpy()
        assert np.abs(gelu(CHAINS, xs.numpy(), form) - ref).max() < 2e-6


def test_layer_norm_against_hand_statistics():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    got = layer_norm(np, CHAINS, x, LayerNorm(w, b), 1e-5)
    for row in range(3):
        values = [float(v) for v in x[row]]
        mean = sum(values) / 7
        var = sum((v - mean) ** 2 for v in values) / 7  # biased, as GPT-2's LayerNorm
        want = [
            (v - mean) / math.sqrt(var + 1e-5) * float(w[i]) + float(b[i])
            for i, v in enumerate(values)
        ]
        assert np.allclose(got[row], want, rtol=1e-5, atol=1e-5)


def test_layer_norm_keeps_fp16_but_computes_in_fp32():
    x = (
        (np.arange(8, dtype=np.float32) * 1000).astype(np.float16).reshape(1, 8)
    )  # variance overflows fp16
    out = layer_norm(
        np, CHAINS, x, LayerNorm(np.ones(8, np.float16), np.zeros(8, np.float16)), 1e-5
    )
    assert out.dtype == np.float16 and np.isfinite(out).all()
    assert abs(float(out[0, -1]) - 1.5275) < 1e-2


def test_attention_mask_is_causal_and_key_is_real_by_hand():
    # Row 0: 2 keys cached, 2 new real tokens, padded to T=3 -> kv_len 4.
    # Row 1: fresh, 1 real token, padded to T=3 -> kv_len 1.
    mask = attention_mask(np, np.array([2, 0]), np.array([4, 1]), seq_len=3, max_kv_len=5)[
        :, 0
    ]  # [B, T, L]
    want_row0 = [
        [1, 1, 1, 0, 0],  # query at position 2 sees keys 0..2
        [1, 1, 1, 1, 0],  # position 3 sees 0..3
        [1, 1, 1, 1, 0],
    ]  # a padded query: causal would allow key 4, key-is-real does not
    want_row1 = [
        [1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],  # padded queries see only the real key 0
        [1, 0, 0, 0, 0],
    ]
    assert mask[0].astype(int).tolist() == want_row0
    assert mask[1].astype(int).tolist() == want_row1


def test_softmax_attention_against_a_plain_loop():
    rng = np.random.default_rng(1)
    B, H, T, L, D = 2, 3, 2, 4, 5
    q, k, v = (rng.standard_normal(s) for s in ((B, H, T, D), (B, H, L, D), (B, H, L, D)))
    mask = rng.random((B, 1, T, L)) < 0.6
    mask[0, 0, 0] = False  # one query with no visible key at all
    got = softmax_attention(np, CHAINS, q, k, v, key_mask(mask), scale=0.5)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                visible = [j for j in range(L) if mask[b, 0, t, j]]
                if not visible:
                    assert np.all(got[b, h, t] == 0)
                    continue
                scores = [0.5 * float(q[b, h, t] @ k[b, h, j]) for j in visible]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                want = sum(w * v[b, h, j] for w, j in zip(weights, visible, strict=True)) / sum(
                    weights
                )
                assert np.allclose(got[b, h, t], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_attention_all_masked_has_no_nan(dtype):
    q = np.ones((1, 1, 2, 4), dtype)
    k = np.full((1, 1, 3, 4), 60000, dtype)  # huge scores: overflow in fp16 if not handled
    v = np.ones((1, 1, 3, 4), dtype)
    mask = np.zeros((1, 1, 2, 3), bool)
    mask[0, 0, 1, :2] = True
    out = softmax_attention(np, CHAINS, q, k, v, key_mask(mask), scale=1.0)
    assert np.isfinite(out).all()
    assert np.all(out[0, 0, 0] == 0) and np.allclose(out[0, 0, 1], 1.0)


# ------------------------------------------------------------------ padding queries, and attention scores in the hundreds


def test_a_padding_query_never_reads_past_its_rows_keys():
    """Row 0 has 1 real token beside a row of 3, so its queries 1 and 2 are padding.  Causally they could see
    keys 1 and 2, which are not its row's (NaN keys and huge values here); key-is-real hides them, so every
    output, padding included, stays finite and a padding query averages only its row's real key."""
    from minirt.model.backend import numpy_backend
    from minirt.model.batch import Batch

    batch = Batch([[5], [6, 7, 8]], numpy_backend())
    rng = np.random.default_rng(0)
    q, keys, values = (
        rng.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(3)
    )  # [B, H, T|L, D]
    keys[0, :, 1:], values[0, :, 1:] = (
        np.nan,
        1e6,
    )  # past row 0's one real key: stale (values must stay finite:
    # a masked value still meets its zero weight in `weights @ values`, which is why a taken slot is zeroed)
    out = softmax_attention(
        np, CHAINS, q, keys, values, key_mask(batch.mask), scale=0.5
    )  # [B, H, T, D]
    assert np.isfinite(out).all()
    assert np.allclose(
        out[0, :, 1:], values[0, :, :1]
    )  # one visible key: its value, for every query of row 0


@pytest.fixture(scope="module")
def sharp_attention_model(tmp_path_factory):
    """The base fixture with its query and key projections scaled by 12: attention scores in the hundreds,
    where exp() overflows float32 unless the row's maximum is subtracted first."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from conftest import FIXTURES

    folder = tmp_path_factory.mktemp("sharp") / "model"
    shutil.copytree(FIXTURES / "base", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("attn.c_attn.weight")]:
        C = tensors[name].shape[0]
        tensors[name][:, : 2 * C] *= 12.0  # q and k columns
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_scores_in_the_hundreds_still_give_finite_logits(sharp_attention_model):
    from minirt import load_model

    model = load_model(sharp_attention_model)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]
    layer0 = model.blocks[
        0
    ].attn.c_attn  # the first layer's scores, by hand in float64, to show they are large
    x = model.wte_t[:, prompts[0]].T.astype(np.float64) + model.wpe[: len(prompts[0])]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    x = x * model.blocks[0].ln_1.weight + model.blocks[0].ln_1.bias
    C = x.shape[1]
    qk = x @ layer0.weight[:, : 2 * C] + layer0.bias[: 2 * C]
    assert (
        np.abs(qk[:, :C] @ qk[:, C:].T).max() / math.sqrt(C // model.config.n_head) > 100
    )  # per head they are big
    assert np.isfinite(model.logits(prompts)).all()


@requires_reference
def test_scores_in_the_hundreds_match_transformers(sharp_attention_model):
    import torch
    from transformers import GPT2LMHeadModel

    from conftest import relative_error
    from minirt import load_model

    prompts = [[1, 2, 3, 4, 5, 6, 7, 8]]
    reference = GPT2LMHeadModel.from_pretrained(
        sharp_attention_model, local_files_only=True, torch_dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = reference(torch.tensor(prompts)).logits.numpy()
    got = load_model(sharp_attention_model).logits(prompts)
    assert relative_error(got, want) < 1e-4


# ------------------------------------------------------------------ attention a tile of queries at a time


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), min_size=1, max_size=4),
    scratch=st.integers(1, 4000),
    seed=st.integers(0, 2**16),
    cached=st.booleans(),
)
def test_prompt_attention_is_each_querys_softmax_over_the_keys_it_may_see(
    rows, scratch, seed, cached
):
    """For any rows (past keys, new tokens), any scratch budget (so any tiling), every query's output is the
    softmax over exactly its visible keys, j <= its position (its own row's keys only), computed here in
    float64 by a plain loop.  With a KV cache the keys are the slot's history plus this round; the slots are
    shuffled, and what lies past a row's end (stale keys: NaN, huge values) must not matter.  Without one
    (scoring whole sequences, no history), they are the round's own tokens."""
    from minirt.model.backend import numpy_backend
    from minirt.model.batch import Batch
    from minirt.model.kv_cache import LayerKV, token_rows
    from minirt.model.layers import prompt_attention

    if not cached:
        rows = [(0, n) for _, n in rows]
    rng = np.random.default_rng(seed)
    past, slots = [p for p, _ in rows], rng.permutation(len(rows)).tolist()
    batch = Batch([[1] * n for _, n in rows], numpy_backend(), slots=slots, past_lens=past)
    N, H, D, capacity = batch.n_tokens, 2, 3, 16
    q, k, v = (rng.standard_normal((N, H, D)).astype(np.float32) for _ in range(3))
    cache = LayerKV(
        np.full((len(rows), H, capacity, D), np.nan, np.float32),
        np.full((len(rows), H, capacity, D), 1e6, np.float32),
        token_rows(np, batch, H, capacity),
    )
    for b, slot in enumerate(slots):  # each slot's history: random keys and values at 0..past-1
        cache.keys[slot, :, : past[b]] = rng.standard_normal((H, past[b], D))
        cache.values[slot, :, : past[b]] = rng.standard_normal((H, past[b], D))
    if cached:
        cache.write(k, v)
    import minirt.model.layers

    budget, minirt.model.layers.ATTENTION_SCRATCH_BYTES = (
        minirt.model.layers.ATTENTION_SCRATCH_BYTES,
        scratch,
    )
    try:
        got = prompt_attention(
            np, CHAINS, q, k, v, batch, cache if cached else None, 0.5
        )  # [N, H, D]
    finally:
        minirt.model.layers.ATTENTION_SCRATCH_BYTES = budget
    for b, slot in enumerate(slots):
        first = int(batch.first_index[b])
        keys = (
            cache.keys[slot] if cached else k[first : first + rows[b][1]].transpose(1, 0, 2)
        )  # [H, *, D]
        values = cache.values[slot] if cached else v[first : first + rows[b][1]].transpose(1, 0, 2)
        for t in range(rows[b][1]):
            visible = list(range(past[b] + t + 1))
            for h in range(H):
                scores = np.array(
                    [0.5 * float(q[first + t, h].astype(np.float64) @ keys[h, j]) for j in visible]
                )
                weights = np.exp(scores - scores.max())
                want = (weights[:, None] * values[h, visible].astype(np.float64)).sum(
                    0
                ) / weights.sum()
                assert np.allclose(got[first + t, h], want, rtol=1e-5, atol=1e-6)


def test_query_tiles_skip_padding_and_what_lies_above_the_diagonal():
    """A fresh 10-token row at one query a tile: tile t needs keys 0..t only, never the other 9 - t; rows go
    one at a time, each with its own key count (no padding to the longest row)."""
    from minirt.model.backend import numpy_backend
    from minirt.model.batch import Batch

    batch = Batch([list(range(10))], numpy_backend())
    assert list(batch.query_tiles(n_head=1, scratch_bytes=40)) == [
        (0, t, t + 1, t + 1) for t in range(10)
    ]
    resumed = Batch([[1, 2], [3], []], numpy_backend(), past_lens=[5, 1, 4])  # kv_lens 7, 2 and 4
    assert list(resumed.query_tiles(n_head=1, scratch_bytes=7 * 4)) == [
        (0, 0, 1, 6),
        (0, 1, 2, 7),
        (1, 0, 1, 2),
    ]
    assert list(resumed.query_tiles(n_head=2, scratch_bytes=10**6)) == [(0, 0, 2, 7), (1, 0, 1, 2)]


# ------------------------------------------------------------------ the [C, V] head and its block loops


def test_the_mlp_keeps_each_hidden_tile_within_its_scratch(monkeypatch):
    """The MLP's hidden activations [tokens, I] come a tile at a time, each within
    MLP_SCRATCH_BYTES, and the tiles together give the untiled result."""
    import minirt.model.layers as layers

    rng = np.random.default_rng(1)
    C = 8
    inner = 32
    N = 50
    up = layers.Linear(
        rng.standard_normal((C, inner)).astype(np.float32), np.zeros(inner, np.float32)
    )
    down = layers.Linear(
        rng.standard_normal((inner, C)).astype(np.float32), np.zeros(C, np.float32)
    )
    x = rng.standard_normal((N, C)).astype(np.float32)
    untiled = layers.mlp(np, CHAINS, x, up, down, "tanh")
    # Ten tokens' hidden activations fit.
    scratch = 10 * inner * 4
    monkeypatch.setattr(layers, "MLP_SCRATCH_BYTES", scratch)
    seen = []
    real_gelu = layers.gelu

    def recording_gelu(chains, hidden, form="tanh"):
        seen.append(hidden.nbytes)
        return real_gelu(chains, hidden, form)

    monkeypatch.setattr(layers, "gelu", recording_gelu)
    tiled = layers.mlp(np, CHAINS, x, up, down, "tanh")
    assert len(seen) == 5 and max(seen) <= scratch
    np.testing.assert_allclose(tiled, untiled, rtol=1e-5, atol=1e-4)


def test_a_blocked_transpose_equals_the_transpose_across_many_blocks():
    """`Backend.transposed` copies 256 rows at a time: 1000 rows span four blocks, the last one partial."""
    from minirt.model.backend import numpy_backend

    rows = np.random.default_rng(0).standard_normal((1000, 7)).astype(np.float32)
    for dtype in (np.float32, np.float16):
        got = numpy_backend().transposed(rows, dtype)
        assert got.flags.c_contiguous and got.dtype == dtype
        np.testing.assert_array_equal(got, rows.T.astype(dtype))


def test_the_head_in_row_chunks_equals_one_product():
    """`lm_head` writes 1024 rows at a time: 2500 rows span three chunks, the last one partial."""
    from minirt.model.layers import lm_head

    rng = np.random.default_rng(1)
    hidden, head = (
        rng.standard_normal((2500, 8)).astype(np.float16),
        rng.standard_normal((8, 11)).astype(np.float32),
    )
    got = lm_head(np, hidden, head)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, hidden.astype(np.float64) @ head, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fixture", ["fp16_file", "untied_head"])
def test_float16_embeddings_stay_float16(fixture):
    """A tied model gathers its embeddings from the fp32 head: they must be cast to the compute dtype, so the
    activations of an fp16 model stay fp16 (an untied model's come from its own fp16 table)."""
    from conftest import FIXTURES
    from minirt import load_model
    from minirt.model.gpt2 import embed

    model = load_model(FIXTURES / fixture, dtype="float16")
    ids, positions = np.array([1, 2, 3]), np.array([0, 1, 2])
    x = embed(model.wte_t, model.wpe, ids, positions)
    assert x.dtype == np.float16
    want = model.wte_t[:, ids].T.astype(np.float32) + model.wpe[positions].astype(np.float32)
    np.testing.assert_allclose(x.astype(np.float32), want, rtol=1e-3, atol=1e-3)


def test_a_round_with_history_but_no_cache_is_refused():
    """Without a KV cache there are no past keys to attend to: a round that claims some is an error, not a
    silent read of another row's tokens."""
    from conftest import random_model
    from minirt.model.batch import Batch
    from minirt.errors import InputError

    model = random_model(seed=0)
    with pytest.raises(InputError, match="needs the KV cache"):
        model.forward(Batch([[1, 2], [3, 4, 5]], model.backend, past_lens=[2, 0]))


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_attention_is_attention_with_each_kv_head_repeated(n_kv_head):
    """With G K/V heads for H = 4 query heads, a prompt round and then a decode round through a
    cache of G heads give what full attention gives with each K/V head copied to its H / G query
    heads (K/V head g serving query heads g * H / G, ...), through a cache of H heads; the
    grouped cache is H / G times smaller."""
    from minirt.model.backend import numpy_backend
    from minirt.model.batch import Batch
    from minirt.model.kv_cache import KVCache
    from minirt.model.layers import attend

    rng = np.random.default_rng(7)
    H, D, group = 4, 8, 4 // n_kv_head
    backend = numpy_backend()
    grouped = KVCache(np, 1, n_kv_head, D, n_slots=2, capacity=8, dtype=np.float32)
    full = KVCache(np, 1, H, D, n_slots=2, capacity=8, dtype=np.float32)
    assert grouped.keys.nbytes * group == full.keys.nbytes
    assert KVCache.bytes_needed(1, n_kv_head, D, 2, 8, np.float32) == 2 * grouped.keys.nbytes
    rounds = [
        Batch([[1, 2, 3], [4, 5]], backend, slots=[0, 1], past_lens=[0, 0]),
        Batch([[6], [7]], backend, slots=[0, 1], past_lens=[3, 2]),
    ]
    for batch in rounds:
        N = batch.n_tokens
        q = rng.standard_normal((N, H, D)).astype(np.float32)
        k = rng.standard_normal((N, n_kv_head, D)).astype(np.float32)
        v = rng.standard_normal((N, n_kv_head, D)).astype(np.float32)
        outs = []
        for cache, keys, values in (
            (grouped, k, v),
            (full, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)),
        ):
            cache.prepare_round(batch)
            outs.append(attend(np, CHAINS, q, keys, values, batch, cache.layer(0), 0.5))
            cache.advance(batch)
        assert np.allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    assert grouped.keys.shape[2] == n_kv_head
