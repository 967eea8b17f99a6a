"""Exact batch invariance, end to end: with `LLM(batch_invariant=True)` a request's logits are
bitwise those of its run alone, whatever its batch, its row, the policy, the chunking, the prefix
cache and when it arrived; greedy and seeded.  The default mode is shown not to promise it (the
same check finds its logits moved), so the check can fail.

The property is checked under the BLAS kernel this process runs (CI forces Haswell's), and once
more in a subprocess with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (the kernel a user's
NumPy picks) and one with a single BLAS thread.

Each request's logits are read where the engine hands them to the sampler (ModelRunner's
pick_tokens, by tools/bench/changed_tokens.py's `logits_seen`), through the public path: LLM, its
engine's add_request and step."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT

import minirt
from minirt import SamplingParams

sys.path.insert(0, str(ROOT / "tools" / "bench"))
from changed_tokens import logits_seen  # the one reader of a run's logits

SHIPPED = ROOT / "weights" / "shakespeare-gpt2-tiny"


def serve(llm, prompts, params, arrivals) -> tuple[dict[int, list[bytes]], dict[int, list[int]]]:
    """Each request's logits and tokens, the requests entering the engine at their arrival steps
    (request i before step arrivals[i])."""
    engine = llm.engine
    requests = llm.make_requests([{"prompt_token_ids": p} for p in prompts], params)
    engine.start_run()
    step = 0
    with logits_seen() as seen:
        while step <= max(arrivals) or engine.has_unfinished():
            for request, arrival in zip(requests, arrivals, strict=True):
                if arrival == step:
                    engine.add_request(request)
            if engine.has_unfinished():
                engine.step()
            step += 1
    assert all(request.error is None for request in requests)
    return seen, {request.index: list(request.token_ids) for request in requests}


def alone(exact_llm, prompt, params) -> tuple[list[bytes], list[int]]:
    seen, tokens = serve(exact_llm, [prompt], [params], [0])
    return seen[0], tokens[0]


@st.composite
def compositions(draw):
    """A batch: prompts (some sharing a prefix, for the cache; or all of one length), each's
    sampling (greedy, or seeded at temperature 1 with top-p), its arrival step, and the engine's
    settings."""
    rng_seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(rng_seed)
    n = draw(st.integers(1, 6))
    shared = rng.integers(0, 4096, size=draw(st.integers(0, 40))).tolist()
    # Sometimes every prompt as long as the others: their decode steps then share one call.
    same_length = draw(st.integers(1, 50)) if draw(st.booleans()) else None
    prompts = []
    for _ in range(n):
        length = same_length or draw(st.integers(1, 50))
        own = rng.integers(0, 4096, size=length).tolist()
        with_prefix = same_length is None and draw(st.booleans())
        prompts.append((shared if with_prefix else []) + own)
    params = [
        SamplingParams(max_tokens=draw(st.integers(1, 10)), temperature=0.0, ignore_eos=True)
        if draw(st.booleans())
        else SamplingParams(
            max_tokens=draw(st.integers(1, 10)),
            temperature=1.0,
            top_p=0.9,
            seed=draw(st.integers(0, 1000)),
            ignore_eos=True,
        )
        for _ in range(n)
    ]
    arrivals = [draw(st.integers(0, 6)) for _ in range(n)]
    policy = draw(st.sampled_from(["static", "continuous"]))
    engine = {
        "policy": policy,
        "batch_size": draw(st.integers(1, 8)),
        "prefix_cache": draw(st.booleans()),
    }
    if policy == "continuous":
        # From chunks of 16 prompt tokens a round to none at all.
        engine["round_token_budget"] = draw(st.sampled_from([16, 24, 64, 512]))
    return prompts, params, arrivals, engine


@pytest.fixture(scope="module")
def exact_alone():
    return minirt.LLM(SHIPPED, backend="numpy", batch_size=1, batch_invariant=True)


@settings(
    max_examples=int(os.environ.get("MINIRT_INVARIANCE_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(compositions())
def test_exact_mode_gives_every_request_its_solo_logits_bitwise(exact_alone, composition):
    prompts, params, arrivals, engine = composition
    llm = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True, **engine)
    seen, tokens = serve(llm, prompts, params, arrivals)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        solo_logits, solo_tokens = alone(exact_alone, prompt, sampling)
        assert tokens[i] == solo_tokens, (i, engine)
        assert seen[i] == solo_logits, (i, engine)


# A Llama-family model: grouped-query attention, RoPE, Qwen3's per-head norms (a probed row
# function of their own), SwiGLU.
QWEN3 = ROOT / "tests" / "fixtures" / "qwen3_norms"


@pytest.fixture(scope="module")
def exact_qwen3_alone():
    return minirt.LLM(QWEN3, backend="numpy", batch_size=1, batch_invariant=True)


@settings(
    max_examples=int(os.environ.get("MINIRT_INVARIANCE_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(compositions())
def test_exact_mode_holds_on_a_llama_family_model(exact_qwen3_alone, composition):
    prompts, params, arrivals, engine = composition
    vocab = exact_qwen3_alone.model.config.vocab_size
    # Its context is 128: prompts of its vocabulary, within it.
    prompts = [[token % vocab for token in prompt][:90] for prompt in prompts]
    llm = minirt.LLM(QWEN3, backend="numpy", batch_invariant=True, **engine)
    seen, tokens = serve(llm, prompts, params, arrivals)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        solo_logits, solo_tokens = alone(exact_qwen3_alone, prompt, sampling)
        assert tokens[i] == solo_tokens, (i, engine)
        assert seen[i] == solo_logits, (i, engine)


def test_the_default_mode_moves_logits_with_the_batch_so_the_check_has_teeth():
    """The same check on the default mode finds a request's logits moved by its peers: alone, a
    decode step's products are GEMVs of one row; beside 3 peers, a GEMM's."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 4096, size=12 + 5 * i).tolist() for i in range(4)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    solo_llm = minirt.LLM(SHIPPED, backend="numpy", batch_size=1)
    solo, _ = serve(solo_llm, prompts[:1], [params], [0])
    batched, _ = serve(minirt.LLM(SHIPPED, backend="numpy"), prompts, [params] * 4, [0] * 4)
    assert len(solo[0]) == len(batched[0]) == 6
    assert solo[0] != batched[0]
    # And exact mode, on the same batch, does not move them.
    exact_solo, _ = serve(
        minirt.LLM(SHIPPED, backend="numpy", batch_size=1, batch_invariant=True),
        prompts[:1],
        [params],
        [0],
    )
    exact_batched, _ = serve(
        minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True), prompts, [params] * 4, [0] * 4
    )
    assert exact_solo[0] == exact_batched[0]


@pytest.mark.parametrize(
    "setting",
    ["the kernel NumPy picks (both OPENBLAS_ variables unset)", "one BLAS thread"],
)
def test_exact_mode_holds_under_the_users_kernel_and_one_thread(setting):
    """The property test again, in a fresh process (OpenBLAS reads its variables once, at load)."""
    env = dict(os.environ)
    if setting.startswith("the kernel"):
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    else:
        env["OPENBLAS_NUM_THREADS"] = "1"
    env["MINIRT_INVARIANCE_EXAMPLES"] = "6"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::test_exact_mode_gives_every_request_its_solo_logits_bitwise",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


def test_exact_mode_holds_in_float16():
    """fp16 compute goes through the same calls (NumPy's fp16 products are its own loops, probed
    as any BLAS): three prompts, continuous and chunked, each bitwise its fp16 run alone."""
    model = ROOT / "tests" / "fixtures" / "base"
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 128, size=n).tolist() for n in (5, 17, 30)]
    params = [
        SamplingParams(max_tokens=6, temperature=1.0, seed=i, ignore_eos=True) for i in range(3)
    ]
    settings = {"backend": "numpy", "dtype": "float16", "batch_invariant": True}
    llm = minirt.LLM(model, policy="continuous", round_token_budget=16, **settings)
    seen, tokens = serve(llm, prompts, params, [0, 0, 1])
    solo_llm = minirt.LLM(model, batch_size=1, **settings)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        assert alone(solo_llm, prompt, sampling) == (seen[i], tokens[i])


def test_long_prompts_near_the_context_end_in_a_wide_chunked_cached_batch(exact_alone):
    """Beyond what the property test draws: 12 requests at once (decode products in more than one
    call), prompts of 60-220 tokens (attention blocks 0-3), some sharing a 70-token prefix, run to
    within a few positions of the shipped model's 256, chunked 64 tokens a round, cached."""
    rng = np.random.default_rng(9)
    shared = rng.integers(0, 4096, size=70).tolist()
    prompts = []
    for i in range(12):
        own = rng.integers(0, 4096, size=int(rng.integers(60, 150))).tolist()
        prompts.append(shared + own if i % 3 == 0 else own)
    params = [
        SamplingParams(max_tokens=256 - len(p) - 2, temperature=1.0, seed=i, ignore_eos=True)
        for i, p in enumerate(prompts)
    ]
    llm = minirt.LLM(
        SHIPPED,
        backend="numpy",
        batch_invariant=True,
        policy="continuous",
        batch_size=12,
        round_token_budget=64,
        prefix_cache=True,
    )
    seen, tokens = serve(llm, prompts, params, [0] * 6 + [3] * 6)
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        assert alone(exact_alone, prompt, sampling) == (seen[i], tokens[i]), i
