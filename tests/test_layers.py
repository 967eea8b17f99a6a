"""Each layer function against an independent computation (math module, plain loops, torch)."""

import math

import numpy as np
import pytest

from conftest import requires_reference
from minirt.batch import attention_mask
from minirt.model import LayerNorm, erf, gelu, layer_norm, softmax_attention


def test_gelu_tanh_matches_the_formula_elementwise():
    xs = np.linspace(-8, 8, 301, dtype=np.float64)
    want = [0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))) for x in xs]
    assert np.allclose(gelu(np, xs, "tanh"), want, rtol=1e-12, atol=1e-12)


def test_erf_and_exact_gelu_against_math_erf():
    xs = np.linspace(-6, 6, 1201)
    assert np.abs(erf(np, xs) - np.array([math.erf(x) for x in xs])).max() < 2e-7
    want = np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in xs])
    assert np.abs(gelu(np, xs, "erf") - want).max() < 1e-6


@requires_reference
def test_gelu_forms_against_torch():
    import torch

    xs = torch.linspace(-10, 10, 2001, dtype=torch.float32)
    for form, approximate in (("tanh", "tanh"), ("erf", "none")):
        ref = torch.nn.functional.gelu(xs, approximate=approximate).numpy()
        assert np.abs(gelu(np, xs.numpy(), form) - ref).max() < 2e-6


def test_layer_norm_against_hand_statistics():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    got = layer_norm(np, x, LayerNorm(w, b), 1e-5)
    for row in range(3):
        values = [float(v) for v in x[row]]
        mean = sum(values) / 7
        var = sum((v - mean) ** 2 for v in values) / 7  # biased, as GPT-2's LayerNorm
        want = [(v - mean) / math.sqrt(var + 1e-5) * float(w[i]) + float(b[i]) for i, v in enumerate(values)]
        assert np.allclose(got[row], want, rtol=1e-5, atol=1e-5)


def test_layer_norm_keeps_fp16_but_computes_in_fp32():
    x = (np.arange(8, dtype=np.float32) * 1000).astype(np.float16).reshape(1, 8)  # variance overflows fp16
    out = layer_norm(np, x, LayerNorm(np.ones(8, np.float16), np.zeros(8, np.float16)), 1e-5)
    assert out.dtype == np.float16 and np.isfinite(out).all()
    assert abs(float(out[0, -1]) - 1.5275) < 1e-2


def test_attention_mask_is_causal_and_key_is_real_by_hand():
    # Row 0: 2 keys cached, 2 new real tokens, padded to T=3 -> kv_len 4.
    # Row 1: fresh, 1 real token, padded to T=3 -> kv_len 1.
    mask = attention_mask(np, np.array([2, 0]), np.array([4, 1]), seq_len=3, max_kv_len=5)[:, 0]  # [B, T, L]
    want_row0 = [[1, 1, 1, 0, 0],   # query at position 2 sees keys 0..2
                 [1, 1, 1, 1, 0],   # position 3 sees 0..3
                 [1, 1, 1, 1, 0]]   # a padded query: causal would allow key 4, key-is-real does not
    want_row1 = [[1, 0, 0, 0, 0],
                 [1, 0, 0, 0, 0],   # padded queries see only the real key 0
                 [1, 0, 0, 0, 0]]
    assert mask[0].astype(int).tolist() == want_row0
    assert mask[1].astype(int).tolist() == want_row1


def test_softmax_attention_against_a_plain_loop():
    rng = np.random.default_rng(1)
    B, H, T, L, D = 2, 3, 2, 4, 5
    q, k, v = (rng.standard_normal(s) for s in ((B, H, T, D), (B, H, L, D), (B, H, L, D)))
    mask = rng.random((B, 1, T, L)) < 0.6
    mask[0, 0, 0] = False  # one query with no visible key at all
    got = softmax_attention(np, q, k, v, mask, scale=0.5)
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
                want = sum(w * v[b, h, j] for w, j in zip(weights, visible)) / sum(weights)
                assert np.allclose(got[b, h, t], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_attention_all_masked_has_no_nan(dtype):
    q = np.ones((1, 1, 2, 4), dtype)
    k = np.full((1, 1, 3, 4), 60000, dtype)  # huge scores: overflow in fp16 if not handled
    v = np.ones((1, 1, 3, 4), dtype)
    mask = np.zeros((1, 1, 2, 3), bool)
    mask[0, 0, 1, :2] = True
    out = softmax_attention(np, q, k, v, mask, scale=1.0)
    assert np.isfinite(out).all()
    assert np.all(out[0, 0, 0] == 0) and np.allclose(out[0, 0, 1], 1.0)
