"""minirt's CuPy path, run on the strict stand-in (no GPU, no CuPy): the model, the engine, `LLM`
and the commands with `--backend cupy` give exactly what the NumPy backend gives, and do nothing
CuPy would refuse or do differently (no finding).

Exactly, not within a tolerance: the stand-in computes with NumPy in the same order, so any
difference is minirt taking another path on "cupy" (which a GPU would then take too)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_request, random_model, serve_all
from round_costs import forward_without_syncs
from strict_cupy import StrictCuPy, strict_backend

import minirt
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.params import SamplingParams
from minirt.evaluate import text_loss
from minirt.model import backend as backend_module
from conftest import completions

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def stand_in(monkeypatch) -> StrictCuPy:
    """A fresh stand-in, with syncs inside GPT2.forward reported; its findings must stay empty."""
    stand_in = StrictCuPy()
    forward_without_syncs(stand_in, monkeypatch)
    yield stand_in
    assert [str(f) for f in stand_in.findings] == []


def model_pair(stand_in: StrictCuPy, dtype=np.float32, **fields):
    """The same random weights on NumPy and on the stand-in."""
    cpu = random_model(seed=3, dtype=dtype, **fields)
    device = random_model(seed=3, dtype=dtype, backend=strict_backend(stand_in), **fields)
    return cpu, device


def served(model, prompts, params, **engine_settings):
    """Serve the prompts offline and return the finished requests, in input order.  `params` is
    one SamplingParams per prompt."""
    engine = Engine(ModelRunner(model), None, **engine_settings)
    pairs = enumerate(zip(prompts, params, strict=True))
    requests = [make_request(engine, i, prompt, settings) for i, (prompt, settings) in pairs]
    serve_all(engine, requests)
    return requests


def outcome(request) -> tuple:
    return (
        request.token_ids,
        request.finish_reason,
        request.error,
        request.logprobs,
        request.top_logprobs,
        request.prompt_logprobs,
    )


# ------------------------------------------------------------------ the model


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_padded_logits_with_an_empty_row(stand_in, dtype):
    cpu, device = model_pair(stand_in, dtype)
    rows = [[1, 2, 3, 4], [], [5], [6, 7]]
    np.testing.assert_array_equal(device.logits(rows), cpu.logits(rows))


@SETTINGS
@given(
    rows=st.lists(st.lists(st.integers(0, 49), max_size=12), min_size=1, max_size=5),
    dtype=st.sampled_from([np.float32, np.float16]),
    scratch=st.sampled_from([None, 600]),
)
def test_scored_logits_equal_numpys_in_any_batch_and_tiling(rows, dtype, scratch):
    """Any rows (empty ones too), fp32 or fp16, one attention and MLP tile or many."""
    import minirt.model.layers as layers

    stand_in = StrictCuPy()
    cpu, device = model_pair(stand_in, dtype)
    budgets = (layers.ATTENTION_SCRATCH_BYTES, layers.MLP_SCRATCH_BYTES)
    if scratch is not None:
        layers.ATTENTION_SCRATCH_BYTES = scratch
        layers.MLP_SCRATCH_BYTES = scratch
    try:
        np.testing.assert_array_equal(device.logits(rows), cpu.logits(rows))
    finally:
        layers.ATTENTION_SCRATCH_BYTES, layers.MLP_SCRATCH_BYTES = budgets
    assert stand_in.findings == []


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_a_decode_round_with_an_empty_row(stand_in, dtype):
    """The scatter branches of Batch.padded and packed: a decode step whose rows are not all
    real (the engine never makes one; the API allows it)."""
    from minirt.model.batch import Batch

    cpu, device = model_pair(stand_in, dtype)
    logits = []
    for model in (cpu, device):
        cache = model.new_kv_cache(n_slots=3, capacity=8)
        model.forward(Batch([[1, 2], [3], [4, 5, 6]], model.backend), cache)
        step = Batch([[7], [], [8]], model.backend, past_lens=cache.lengths.copy())
        with stand_in.counting() as counts:
            logits.append(model.backend.to_numpy(model.forward(step, cache)))
    np.testing.assert_array_equal(logits[1], logits[0])
    assert counts.by_name["scatter"] > 0


# ------------------------------------------------------------------ the engine


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_batching_with_uneven_lengths_and_slot_reuse(stand_in, policy, dtype):
    """Seven requests of uneven prompts and lengths through 3 rows: static groups, or a continuous
    pool whose freed slots are taken again (zeroed, then gathered out of order)."""
    cpu, device = model_pair(stand_in, dtype)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11], [12], [13, 14, 15, 16], [17]]
    params = [
        SamplingParams(max_tokens=2 + 3 * (i % 3), ignore_eos=True, temperature=0.0)
        for i in range(7)
    ]
    want = [outcome(r) for r in served(cpu, prompts, params, batch_size=3, policy=policy)]
    with stand_in.counting() as counts:
        got = [outcome(r) for r in served(device, prompts, params, batch_size=3, policy=policy)]
    assert got == want
    if policy == "continuous":
        # The paths this is here for: a reused slot zeroed, and KV read from scattered slots.
        assert counts.by_name["fill"] > 0 and counts.by_name["gather"] > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_sampling_with_penalties_and_logprobs(stand_in, dtype):
    cpu, device = model_pair(stand_in, dtype)
    params = SamplingParams(
        max_tokens=8,
        temperature=0.9,
        top_k=12,
        top_p=0.9,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.2,
        logit_bias=((3, 2.0),),
        logprobs=3,
        seed=11,
        ignore_eos=True,
    )
    prompts = [[1, 2, 3], [4, 4, 4, 4], [5]]
    want = [
        outcome(r) for r in served(cpu, prompts, [params] * 3, batch_size=2, policy="continuous")
    ]
    got = [
        outcome(r) for r in served(device, prompts, [params] * 3, batch_size=2, policy="continuous")
    ]
    assert got == want
    assert all(logprobs for _, _, _, logprobs, top, _ in got)


def test_prompt_logprobs(stand_in):
    cpu, device = model_pair(stand_in)
    params = SamplingParams(max_tokens=3, prompt_logprobs=0, ignore_eos=True, temperature=0.0)
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    want = [outcome(r) for r in served(cpu, prompts, [params] * 3, batch_size=3)]
    got = [outcome(r) for r in served(device, prompts, [params] * 3, batch_size=3)]
    assert got == want and got[0][5][1] is not None


def test_a_row_whose_logits_are_not_finite_fails_alone(stand_in):
    """One greedy pick per round crosses to the host: a row with NaN logits still fails alone."""
    cpu, device = model_pair(stand_in)
    for model in (cpu, device):
        model.head_weight[:, 7] = np.nan if model is cpu else model.xp.float32("nan")
    prompts = [[1, 2], [3], [4, 5, 6]]
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    want = [outcome(r) for r in served(cpu, prompts, [params] * 3, batch_size=3)]
    got = [outcome(r) for r in served(device, prompts, [params] * 3, batch_size=3)]
    assert got == want
    assert all(error is not None for _, _, error, _, _, _ in got)


def test_evaluate_text_loss(stand_in):
    cpu, device = model_pair(stand_in, n_positions=16)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 50, 60)]
    assert text_loss(device, ids, window=12, stride=5) == text_loss(cpu, ids, window=12, stride=5)


# ------------------------------------------------------------------ LLM and the commands


@pytest.fixture
def cupy_is_the_stand_in(monkeypatch, stand_in):
    """`--backend cupy` (and "auto") picks the stand-in, as it would pick a GPU."""
    monkeypatch.setattr(backend_module, "cupy_backend", lambda: strict_backend(stand_in))
    return stand_in


def test_llm_end_to_end(cupy_is_the_stand_in):
    prompts = ["ROMEO:", "To be", ""]
    params = [
        SamplingParams(max_tokens=6, temperature=0.0),
        SamplingParams(max_tokens=5, temperature=0.8, seed=2, logprobs=2),
        SamplingParams(max_tokens=4, stop=["\n"], prompt_logprobs=0, temperature=0.0),
    ]
    want = completions(minirt.LLM(backend="numpy").generate(prompts, params), top_n=2)
    llm = minirt.LLM(backend="cupy")
    assert llm.model.backend.name == "cupy" and llm.model.xp is cupy_is_the_stand_in
    got = completions(llm.generate(prompts, params), top_n=2)
    keys = ("text", "token_ids", "finish_reason", "logprobs", "top_logprobs", "prompt_logprobs")
    for mine, theirs in zip(got, want, strict=True):
        assert {k: getattr(mine, k) for k in keys} == {k: getattr(theirs, k) for k in keys}
        # vLLM's shape too: each token's {id: Logprob} with its rank and text.
        assert mine.output.logprobs == theirs.output.logprobs


def records(path) -> list[dict]:
    timing = ("arrival_s", "first_token_s", "finish_s")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_generate_with_backend_cupy(cupy_is_the_stand_in, tmp_path, capsys, policy):
    from minirt.generate import main

    outputs = {}
    for backend in ("numpy", "cupy"):
        out = tmp_path / f"{backend}.jsonl"
        argv = ["--prompts", "examples/prompts.jsonl", "--backend", backend, "--output", str(out)]
        assert main([*argv, "--policy", policy, "--batch-size", "2", "--logprobs", "2"]) == 0
        outputs[backend] = records(out)
    assert outputs["cupy"] == outputs["numpy"]
    capsys.readouterr()


def test_evaluate_and_inspect_with_backend_cupy(cupy_is_the_stand_in, tmp_path, capsys):
    from minirt.evaluate import main as evaluate
    from minirt.inspect import main as inspect

    validation = ROOT / "weights" / "shakespeare-gpt2-tiny" / "validation.txt"
    text = tmp_path / "text.txt"
    text.write_text(validation.read_text(encoding="utf-8")[:1500], encoding="utf-8")
    results = {}
    for backend in ("numpy", "cupy"):
        flags = ["--text", str(text), "--backend", backend, "--window", "64", "--stride", "40"]
        assert evaluate([*flags, "--json"]) == 0
        results[backend] = json.loads(capsys.readouterr().out)
    for result in results.values():
        result.pop("seconds", None)
        result.pop("backend", None)
    assert results["cupy"] == results["numpy"]
    assert inspect(["--backend", "cupy"]) == 0
    assert "compute    cupy, float32" in capsys.readouterr().out
