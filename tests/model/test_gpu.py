"""CuPy against NumPy, on random configs, batches and paddings (marked `gpu`; skipped without a GPU).

Tolerances:
  * fp32: max |cupy - numpy| / max |numpy| <= 1e-4.  Both compute in fp32; only
    the order of sums differs (cuBLAS vs OpenBLAS), ~1e-6 in practice.
  * fp16: <= 3e-2 of max |logit|, against NumPy fp32 on the *same fp16-rounded
    weights*, so only compute rounding is measured.  fp16 keeps 11 significant
    bits (unit roundoff 4.9e-4); activations are rounded at every layer output
    and residual add, and a GEMM of K terms can lose ~sqrt(K) units, so a few
    layers of width <= 96 stay within ~1e-2 with margin to 3e-2.  Layer-norm
    statistics, softmax and the logits are fp32 on both sides.
  * greedy tokens must agree wherever the NumPy top-2 margin exceeds the
    tolerance in logits (a near-tie may legitimately flip).
  * seeded sampling draws its uniforms on the host from each request's own
    stream, so fp32 outputs must be identical.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, random_model
from minirt.model.backend import get_backend
from minirt.engine.engine import Engine
from minirt.errors import BackendError
from minirt.engine.params import SamplingParams


def cupy_backend_or_none():
    try:
        return get_backend("cupy")[0]
    except BackendError:
        return None


CUPY = cupy_backend_or_none()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUPY is None, reason="needs CuPy and a usable NVIDIA GPU"),
]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FP16_TOLERANCE = 3e-2

configs = st.fixed_dictionaries(
    {
        "n_head": st.integers(1, 4),
        "head_dim": st.sampled_from([4, 8, 16, 24]),
        "n_layer": st.integers(1, 3),
        "vocab_size": st.integers(5, 300),
        "seed": st.integers(0, 1000),
    }
)
batches = st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=20), min_size=1, max_size=6)


def model_pair(cfg, dtype_gpu):
    fields = dict(
        n_head=cfg["n_head"],
        n_embd=cfg["n_head"] * cfg["head_dim"],
        n_layer=cfg["n_layer"],
        vocab_size=cfg["vocab_size"],
        n_positions=32,
    )
    rounded = (
        np.float16 if dtype_gpu == np.float16 else None
    )  # the reference sees the weights the GPU sees
    cpu = random_model(seed=cfg["seed"], rounded_to=rounded, **fields)
    gpu = random_model(
        seed=cfg["seed"], dtype=dtype_gpu, backend=CUPY, rounded_to=rounded, **fields
    )
    return cpu, gpu


def ids_for(batch, vocab):
    return [[t % vocab for t in row] for row in batch]


@SETTINGS
@given(cfg=configs, batch=batches, dtype=st.sampled_from([np.float32, np.float16]))
def test_logits_equal_numpy_within_the_stated_tolerance(cfg, batch, dtype):
    cpu, gpu = model_pair(cfg, dtype)
    seqs = [row or [1] for row in ids_for(batch, cfg["vocab_size"])]
    ref, got = cpu.logits(seqs), gpu.logits(seqs)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    tolerance = 1e-4 if dtype == np.float32 else FP16_TOLERANCE
    for b, seq in enumerate(seqs):
        n = len(seq)
        assert np.abs(got[b, :n] - ref[b, :n]).max() <= tolerance * np.abs(ref[b, :n]).max()


@SETTINGS
@given(cfg=configs, batch=batches, dtype=st.sampled_from([np.float32, np.float16]))
def test_greedy_tokens_agree_where_margins_are_clear(cfg, batch, dtype):
    cpu, gpu = model_pair(cfg, dtype)
    prompts = [row or [2] for row in ids_for(batch, cfg["vocab_size"])]
    sp = SamplingParams(max_new_tokens=6, ignore_eos=True)
    runs = {}
    for name, model in (("cpu", cpu), ("gpu", gpu)):
        engine = Engine(model, None, batch_size=3)
        requests = [engine.make_request(i, p, sp) for i, p in enumerate(prompts)]
        engine.serve(requests)
        runs[name] = requests
    tolerance = 1e-4 if dtype == np.float32 else FP16_TOLERANCE
    for ref, got in zip(runs["cpu"], runs["gpu"], strict=True):
        seq = list(ref.prompt_ids)
        for step, token in enumerate(ref.token_ids):
            logits = cpu.logits([seq])[0, -1]
            top2 = np.sort(logits)[-2:]
            if top2[1] - top2[0] <= 2 * tolerance * np.abs(logits).max():
                break  # a near-tie: the two backends may choose differently from here on
            assert got.token_ids[step] == token
            seq.append(token)


@SETTINGS
@given(cfg=configs, batch=batches, seed=st.integers(0, 2**31))
def test_seeded_sampling_gives_the_same_tokens(cfg, batch, seed):
    cpu, gpu = model_pair(cfg, np.float32)
    prompts = [row or [3] for row in ids_for(batch, cfg["vocab_size"])]
    sp = SamplingParams(
        max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.95, seed=seed, ignore_eos=True
    )
    outputs = []
    for model in (cpu, gpu):
        engine = Engine(model, None, batch_size=4)
        requests = [engine.make_request(i, p, sp) for i, p in enumerate(prompts)]
        engine.serve(requests)
        outputs.append([r.token_ids for r in requests])
    assert outputs[0] == outputs[1]


@SETTINGS
@given(
    rows=st.lists(
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=5, max_size=5),
        min_size=1,
        max_size=4,
    )
)
def test_the_device_argmax_shortcut_picks_what_the_host_would(rows):
    """All-greedy rounds take the argmax on the GPU (only B ids cross); it must match the host's pick, ties included."""
    from types import SimpleNamespace

    from minirt.engine.sampler import choose_token, choose_tokens

    host = np.array(rows, dtype=np.float32)
    greedy = [SimpleNamespace(params=SamplingParams(), rng=None, want_logprobs=False) for _ in rows]
    got = choose_tokens(CUPY, CUPY.asarray(host), greedy)
    assert got == [
        (*choose_token(row, SamplingParams(), None, want_logprob=False), None) for row in host
    ]


@pytest.mark.parametrize("scratch", [None, 3000], ids=["one tile", "a few tokens a tile"])
def test_fixture_logits_on_the_gpu_match_transformers(scratch, monkeypatch):
    import minirt
    from conftest import load_expected

    if (
        scratch is not None
    ):  # many attention and MLP tiles, as in test_fixtures, on the device this time
        monkeypatch.setattr(minirt.model.layers, "ATTENTION_SCRATCH_BYTES", scratch)
        monkeypatch.setattr(minirt.model.layers, "MLP_SCRATCH_BYTES", scratch)

    expected = load_expected("base")
    seqs = [
        expected[f"seq_{b}"].tolist() for b in range(sum(k.startswith("seq_") for k in expected))
    ]
    got = minirt.load_model(FIXTURES / "base", backend="cupy").logits(seqs)
    for b, seq in enumerate(seqs):
        ref = expected["logits"][b, : len(seq)]
        assert np.abs(got[b, : len(seq)] - ref).max() <= 1e-4 * np.abs(ref).max()


def test_weights_and_kv_live_on_the_device():
    import cupy

    model = random_model(seed=0, backend=CUPY, dtype=np.float16)
    assert all(isinstance(a, cupy.ndarray) and a.dtype == np.float16 for a in model.params.values())
    assert model.head_weight.dtype == np.float32
    cache = model.new_kv_cache(n_slots=2, capacity=8)
    assert isinstance(cache.keys, cupy.ndarray) and cache.keys.dtype == np.float16
