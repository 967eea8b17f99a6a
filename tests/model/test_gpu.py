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

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, make_request, random_model, serve_all
from minirt.model import backend as backend_module
from minirt.model.backend import get_backend
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.errors import BackendError
from minirt.engine.params import SamplingParams
from conftest import completions

# MINIRT_GPU_TESTS_ON_STAND_IN=1 runs these tests on tests/strict_cupy instead of a GPU, so that
# their own code runs in the default suite (tests/cupy_path/test_gpu_tests_on_the_stand_in.py).
ON_STAND_IN = bool(os.environ.get("MINIRT_GPU_TESTS_ON_STAND_IN"))


def cupy_backend_or_none():
    if ON_STAND_IN:
        from strict_cupy import strict_backend

        return strict_backend()
    try:
        return get_backend("cupy")[0]
    except BackendError:
        return None


CUPY = cupy_backend_or_none()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUPY is None, reason="needs CuPy and a usable NVIDIA GPU"),
]
SETTINGS = settings(
    max_examples=3 if ON_STAND_IN else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FP16_TOLERANCE = 3e-2


@pytest.fixture(autouse=True)
def backend_cupy_is_the_device(monkeypatch):
    """`--backend cupy` and `load_model(..., backend="cupy")` reach this module's device.  On the
    stand-in, a sync inside GPT2.forward is a finding too, and a test leaves none."""
    if CUPY is None:
        yield
        return
    monkeypatch.setattr(backend_module, "cupy_backend", lambda: CUPY)
    if ON_STAND_IN:
        import minirt.model.decoder as decoder_module

        # Every family's forward pass (GPT-2's and the Llama family's) is DecoderModel's.
        forward = decoder_module.DecoderModel.forward

        def forward_without_syncs(self, *args, **kwargs):
            with CUPY.xp.no_syncs("GPT2.forward"):
                return forward(self, *args, **kwargs)

        monkeypatch.setattr(decoder_module.DecoderModel, "forward", forward_without_syncs)
    yield
    if ON_STAND_IN:
        assert [str(finding) for finding in CUPY.xp.findings] == []


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
    sp = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
    runs = {}
    for name, model in (("cpu", cpu), ("gpu", gpu)):
        engine = Engine(ModelRunner(model), None, batch_size=3)
        requests = [make_request(engine, i, p, sp) for i, p in enumerate(prompts)]
        serve_all(engine, requests)
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
        max_tokens=6, temperature=0.9, top_k=20, top_p=0.95, seed=seed, ignore_eos=True
    )
    outputs = []
    for model in (cpu, gpu):
        engine = Engine(ModelRunner(model), None, batch_size=4)
        requests = [make_request(engine, i, p, sp) for i, p in enumerate(prompts)]
        serve_all(engine, requests)
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
    greedy = [
        SimpleNamespace(
            params=SamplingParams(temperature=0.0, max_tokens=64), rng=None, want_logprobs=False
        )
        for _ in rows
    ]
    got = choose_tokens(CUPY, CUPY.asarray(host), greedy)
    greedy_params = SamplingParams(temperature=0.0, max_tokens=64)
    assert [choice.token for choice in got] == [
        choose_token(row, greedy_params, None, want_logprob=False)[0] for row in host
    ]
    assert all(choice.logprob is None and choice.top is None for choice in got)


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


LLAMA_FAMILY = ["llama3_rope_scaling", "qwen3_norms", "qwen2_bias", "mistral_gqa"]


@pytest.mark.parametrize("name", LLAMA_FAMILY)
def test_llama_family_logits_on_the_gpu_match_transformers(name):
    """RoPE (Llama 3's scaling), grouped queries, RMSNorm, SwiGLU, Qwen's bias and norms through
    the same layer code on the device: fp32 within 1e-4 of transformers."""
    import minirt
    from conftest import load_expected

    expected = load_expected(name)
    n_seqs = sum(k.startswith("seq_") for k in expected)
    seqs = [expected[f"seq_{b}"].tolist() for b in range(n_seqs)]
    got = minirt.load_model(FIXTURES / name, backend="cupy").logits(seqs)
    for b, seq in enumerate(seqs):
        ref = expected["logits"][b, : len(seq)]
        assert np.abs(got[b, : len(seq)] - ref).max() <= 1e-4 * np.abs(ref).max()


def test_a_llama_in_float16_stays_within_the_stated_tolerance():
    """An fp16 file (its weights exactly fp16) computed in fp16 on the device, against NumPy's
    fp32 on the same weights: within FP16_TOLERANCE; greedy generation through the engine gives
    the same tokens where NumPy's margins are clear."""
    import minirt

    folder = FIXTURES / "llama_mha_odd_head"
    seqs = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3], list(range(40))]
    ref = minirt.load_model(folder, dtype="float32").logits(seqs)
    got = minirt.load_model(folder, backend="cupy", dtype="float16").logits(seqs)
    for b, seq in enumerate(seqs):
        n = len(seq)
        assert np.abs(got[b, :n] - ref[b, :n]).max() <= FP16_TOLERANCE * np.abs(ref[b, :n]).max()


def test_weights_and_kv_live_on_the_device():
    xp = CUPY.xp
    model = random_model(seed=0, backend=CUPY, dtype=np.float16)
    assert all(isinstance(a, xp.ndarray) and a.dtype == np.float16 for a in model.params.values())
    assert model.head_weight.dtype == np.float32
    cache = model.new_kv_cache(n_slots=2, capacity=8)
    assert isinstance(cache.keys, xp.ndarray) and cache.keys.dtype == np.float16


# ------------------------------------------------------------------ the device paths beyond scoring
#
# Each compares a GPU run with the NumPy run of the same weights (fp32): token for token up to the
# first step where NumPy's own top two logits lie within the tolerance (a near-tie either backend
# may break its own way), log-probabilities within LOGPROB_TOLERANCE there.

LOGPROB_TOLERANCE = 1e-3


def agreed_prefix(cpu_model, prompt, want_tokens, got_tokens) -> int:
    """How many tokens the two runs must share: up to NumPy's first near-tie.  Asserts they do."""
    seq = list(prompt)
    for step, token in enumerate(want_tokens):
        logits = cpu_model.logits([seq])[0, -1]
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] <= 2e-4 * np.abs(logits).max():
            return step
        assert got_tokens[step] == token, f"step {step}: {got_tokens[: step + 1]} vs {want_tokens}"
        seq.append(token)
    return len(want_tokens)


def assert_runs_agree(cpu_model, want, got):
    for ref, mine in zip(want, got, strict=True):
        shared = agreed_prefix(cpu_model, ref.prompt_ids, ref.token_ids, mine.token_ids)
        if ref.logprobs is not None:
            assert np.allclose(
                mine.logprobs[:shared], ref.logprobs[:shared], atol=LOGPROB_TOLERANCE
            )
        if ref.prompt_logprobs is not None:
            assert mine.prompt_logprobs[0] is None
            assert np.allclose(
                mine.prompt_logprobs[1:], ref.prompt_logprobs[1:], atol=LOGPROB_TOLERANCE
            )


def served_on(model, prompts, params, **settings):
    engine = Engine(ModelRunner(model), None, **settings)
    requests = [make_request(engine, i, p, params) for i, p in enumerate(prompts)]
    serve_all(engine, requests)
    return requests


UNEVEN_PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11], [12], [13, 14, 15, 16], [17]]


def test_continuous_batching_reuses_zeroed_slots_and_gathers_their_keys():
    """Seven requests through 3 rows: freed slots are taken again (zeroed first) and read out of
    order (a gather, not a view)."""
    cpu = random_model(seed=4)
    gpu = random_model(seed=4, backend=CUPY)
    params = SamplingParams(max_tokens=7, ignore_eos=True, logprobs=2, temperature=0.0)
    settings = {"batch_size": 3, "policy": "continuous"}
    want = served_on(cpu, UNEVEN_PROMPTS, params, **settings)
    got = served_on(gpu, UNEVEN_PROMPTS, params, **settings)
    assert_runs_agree(cpu, want, got)


def test_a_decode_round_with_an_empty_row_pads_and_packs_by_scatter():
    """A decode step whose rows are not all real (here one brings no token) lays the queries out
    padded and back by scatter and gather (the branches of Batch.padded and packed)."""
    from minirt.model.batch import Batch

    cpu = random_model(seed=8)
    gpu = random_model(seed=8, backend=CUPY)
    logits = []
    for model in (cpu, gpu):
        cache = model.new_kv_cache(n_slots=3, capacity=8)
        model.forward(Batch([[1, 2], [3], [4, 5, 6]], model.backend), cache)
        step = Batch([[7], [], [8]], model.backend, past_lens=cache.lengths.copy())
        assert not step.all_real
        logits.append(model.backend.to_numpy(model.forward(step, cache)))
    assert logits[1].shape == (2, 50)
    assert np.abs(logits[1] - logits[0]).max() <= 1e-4 * np.abs(logits[0]).max()


def test_static_groups_and_prompt_logprobs():
    cpu = random_model(seed=5)
    gpu = random_model(seed=5, backend=CUPY)
    params = SamplingParams(
        max_tokens=5, ignore_eos=True, prompt_logprobs=0, logprobs=1, temperature=0.0
    )
    want = served_on(cpu, UNEVEN_PROMPTS, params, batch_size=3)
    got = served_on(gpu, UNEVEN_PROMPTS, params, batch_size=3)
    assert_runs_agree(cpu, want, got)


def test_sampling_with_penalties_draws_what_numpy_draws():
    cpu = random_model(seed=6)
    gpu = random_model(seed=6, backend=CUPY)
    params = SamplingParams(
        max_tokens=6,
        temperature=0.9,
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        presence_penalty=0.2,
        seed=8,
        ignore_eos=True,
    )
    want = served_on(cpu, UNEVEN_PROMPTS, params, batch_size=3, policy="continuous")
    got = served_on(gpu, UNEVEN_PROMPTS, params, batch_size=3, policy="continuous")
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_evaluate_scores_a_text_as_numpy_does():
    from minirt.evaluate import text_loss

    cpu = random_model(seed=7, n_positions=16)
    gpu = random_model(seed=7, n_positions=16, backend=CUPY)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 50, 80)]
    want_total, want_count = text_loss(cpu, ids, window=12, stride=5)
    got_total, got_count = text_loss(gpu, ids, window=12, stride=5)
    assert got_count == want_count and abs(got_total - want_total) <= 1e-4 * abs(want_total)


def test_llm_and_the_commands_with_backend_cupy(tmp_path, capsys):
    import minirt
    from minirt.generate import main as generate

    prompts = ["ROMEO:", "To be", ""]
    params = SamplingParams(max_tokens=8, logprobs=1, temperature=0.0)
    cpu = minirt.LLM(backend="numpy")
    gpu = minirt.LLM(backend="cupy")
    assert gpu.model.backend.name == "cupy"
    want = completions(cpu.generate(prompts, params))
    got = completions(gpu.generate(prompts, params))
    for ref, mine in zip(want, got, strict=True):
        agreed_prefix(cpu.model, ref.prompt_token_ids, ref.token_ids, mine.token_ids)
    out = tmp_path / "out.jsonl"
    argv = ["--prompts", "examples/prompts.jsonl", "--backend", "cupy", "--output", str(out)]
    assert generate([*argv, "--policy", "continuous", "--batch-size", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows and all(row["finish_reason"] in ("stop", "length") for row in rows)
    capsys.readouterr()
