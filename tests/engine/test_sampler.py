"""temperature, top_k and top_p against an independent, brute-force computation of the filtered distribution."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minirt.errors import RequestError
from minirt.engine.params import SamplingParams
from minirt.engine.sampler import (
    choose_token,
    derived_seed,
    filtered_distribution,
    log_softmax,
    request_rng,
)
from conftest import completions


def brute_force_distribution(logits, temperature, top_k, top_p):
    """The filtered distribution by the definitions, with plain Python and the math module."""
    scaled = [x / temperature for x in logits]
    ids = list(range(len(scaled)))
    if top_k:
        kth = sorted(scaled, reverse=True)[min(top_k, len(scaled)) - 1]
        ids = [i for i in ids if scaled[i] >= kth]
    top = max(scaled[i] for i in ids)
    weights = {i: math.exp(scaled[i] - top) for i in ids}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p < 1:
        ranked = sorted(probs, key=lambda i: (-scaled[i], i))  # by logit, ties by id
        kept, mass = [], 0.0
        for i in ranked:
            if mass >= top_p:
                break
            kept.append(i)
            mass += probs[i]
        total = sum(probs[i] for i in kept)
        probs = {i: probs[i] / total for i in kept}
    return [probs.get(i, 0.0) for i in range(len(logits))]


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=30),
    temperature=st.floats(0.05, 5),
    top_k=st.integers(0, 35),
    top_p=st.floats(0.01, 1.0),
)
def test_filtered_distribution_matches_the_definition(logits, temperature, top_k, top_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=64)
    got = filtered_distribution(np.array(logits, dtype=np.float32), params)
    want = brute_force_distribution(
        [float(np.float32(x)) for x in logits], temperature, top_k, top_p
    )
    # Where the running total lands within rounding of top_p, the two computations may
    # legitimately keep one token more or less; such boundary cases say nothing.
    kept = sorted((p for p in want if p > 0), reverse=True)
    assume(all(abs(sum(kept[:i]) - top_p) > 1e-9 for i in range(len(kept) + 1)))
    assert abs(got.sum() - 1) < 1e-9
    # Boundary ties may be resolved differently only when two probabilities are equal to ~1e-12;
    # the brute force ranks ties by id exactly as the implementation does.
    assert np.allclose(got, want, atol=1e-9)


def test_hand_computed_example():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = filtered_distribution(logits, SamplingParams(temperature=1.0, top_p=0.8, max_tokens=64))
    assert np.allclose(
        p, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0]
    )  # 0.5+0.2 < 0.8, so 0.15 joins
    p = filtered_distribution(logits, SamplingParams(temperature=1.0, top_k=2, max_tokens=64))
    assert np.allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    p = filtered_distribution(logits, SamplingParams(temperature=0.5, max_tokens=64))
    squared = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert np.allclose(p, squared / squared.sum())


def test_sampling_frequencies_follow_the_distribution():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.95, max_tokens=64)
    want = np.array(brute_force_distribution(logits.tolist(), 0.9, 4, 0.95))
    rng = request_rng(123)
    n = 20000
    counts = np.bincount(
        [choose_token(logits, params, rng, want_logprob=False)[0] for _ in range(n)], minlength=6
    )
    assert counts[want == 0].sum() == 0  # filtered tokens are never drawn
    observed = counts / n
    assert np.all(np.abs(observed - want) < 4 * np.sqrt(want * (1 - want) / n) + 1e-12)


def test_greedy_is_argmax_and_draws_nothing():
    rng = request_rng(5)
    state = rng.bit_generator.state
    token, logprob = choose_token(
        np.array([0.1, 3.0, 3.0, -1.0]), SamplingParams(temperature=0, max_tokens=64), rng
    )
    assert token == 1  # ties go to the lowest id
    assert rng.bit_generator.state == state
    assert logprob == pytest.approx(
        3.0 - math.log(math.exp(0.1) + 2 * math.exp(3.0) + math.exp(-1.0))
    )


def test_logprob_is_under_the_raw_distribution_not_the_filtered_one():
    logits = np.array([1.0, 2.0, 3.0])
    token, logprob = choose_token(
        logits, SamplingParams(temperature=0.5, top_k=1, max_tokens=64), request_rng(0)
    )
    assert token == 2
    assert logprob == pytest.approx(float(log_softmax(logits)[2]))


def test_logprob_is_under_the_raw_model_not_the_biased_logits():
    """A logit_bias changes the choice, not the logprob: choose_token on its own (no caller's
    log-softmax) takes it from the raw logits."""
    logits = np.array([1.0, 2.0, 3.0])
    token, logprob = choose_token(
        logits, SamplingParams(temperature=0, logit_bias={0: 10.0}, max_tokens=64), None
    )
    assert token == 0
    assert logprob == pytest.approx(1.0 - math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0)))


def test_same_seed_same_stream_and_derived_seeds_differ():
    logits = np.zeros(50)
    params = SamplingParams(temperature=1.0, max_tokens=64)
    r1, r2, r3 = request_rng(7), request_rng(7), request_rng(8)
    draws = [choose_token(logits, params, r1)[0] for _ in range(20)]
    assert draws == [choose_token(logits, params, r2)[0] for _ in range(20)]
    assert draws != [choose_token(logits, params, r3)[0] for _ in range(20)]
    seeds = {derived_seed(0, i) for i in range(100)} | {derived_seed(1, i) for i in range(100)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"max_tokens": 0}, "max_tokens"),
        # max_new_tokens is the same field, refused in its name.
        ({"max_new_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "max_new_tokens": 6}, "name one field"),
        # max_tokens given as its default, or as a float or a bool equal to the other: still two values.
        ({"max_tokens": 16, "max_new_tokens": 32}, "name one field"),
        ({"max_tokens": 16.0, "max_new_tokens": 16}, "name one field"),
        ({"max_tokens": True, "max_new_tokens": 1}, "name one field"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -3}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": [3]}, "stop"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"max_new_tokens": True}, "max_tokens"),
        # vLLM's prompt_logprobs N >= 1 is not offered; 0 and None only.
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
    ],
)
def test_bad_parameters_are_refused(fields, fragment):
    with pytest.raises(RequestError, match=fragment):
        SamplingParams(**fields)


def test_updated_refuses_unknown_fields_and_accepts_lists():
    params = SamplingParams(temperature=0.0, max_tokens=64).updated(
        stop=["a", "b"], stop_token_ids=[1, 2]
    )
    assert params.stop == ("a", "b") and params.stop_token_ids == (1, 2)
    assert SamplingParams(stop="x", temperature=0.0, max_tokens=64).stop == ("x",)
    with pytest.raises(RequestError, match="unknown sampling field"):
        SamplingParams(temperature=0.0, max_tokens=64).updated(temprature=1.0)


# ------------------------------------------------------------------ top-p at an exact boundary
# Powers of two make every probability and partial sum exact in binary: with n equal logits, each token has
# 1/n, and top_p = k/n is reached exactly by the k-th token.  The smallest set whose mass reaches top_p is
# those k tokens, no more (the property test above skips cases within 1e-9 of the boundary, so it cannot tell
# `<` from `<=` there).


@pytest.mark.parametrize("n, k", [(4, 2), (4, 1), (4, 3), (8, 2), (8, 3), (8, 5), (16, 7), (2, 1)])
def test_top_p_reached_exactly_keeps_exactly_those_tokens(n, k):
    probs = filtered_distribution(
        np.zeros(n, dtype=np.float32), SamplingParams(temperature=1.0, top_p=k / n, max_tokens=64)
    )
    assert np.count_nonzero(probs) == k  # ties ranked by id: the first k ids, each 1/k
    assert np.array_equal(probs, np.array([1 / k] * k + [0.0] * (n - k)))


@pytest.mark.reference
@pytest.mark.parametrize("n, k", [(4, 2), (8, 3), (8, 5), (16, 7)])
def test_top_p_boundary_agrees_with_transformers(n, k):
    torch = pytest.importorskip("torch")
    warpers = pytest.importorskip("transformers.generation.logits_process")
    scores = torch.zeros((1, n), dtype=torch.float32)
    kept_by_them = torch.isfinite(warpers.TopPLogitsWarper(top_p=k / n)(None, scores)).sum().item()
    probs = filtered_distribution(
        np.zeros(n, dtype=np.float32), SamplingParams(temperature=1.0, top_p=k / n, max_tokens=64)
    )
    assert np.count_nonzero(probs) == kept_by_them == k


class FixedDraw:
    """A random stream that always returns the same uniform number: the draw's boundaries, by hand."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize(
    "u, want", [(0.0, 1), (0.1, 1), (0.25, 2), (0.5, 3), (0.75, 4), (0.999, 4)]
)
def test_a_draw_maps_u_to_the_token_whose_interval_holds_it(u, want):
    """Token i is drawn when cumulative[i-1] <= u < cumulative[i] (inverse CDF, in id order).  top_k=4 over
    logits [0, 1, 1, 1, 1] keeps tokens 1-4 at exactly 1/4 each, cumulative [0, .25, .5, .75, 1]: token 0 has
    probability 0 and u = 0 must not draw it, and a u exactly on a boundary belongs to the next token up."""
    logits = np.array([0.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    token, _ = choose_token(
        logits, SamplingParams(temperature=1.0, top_k=4, max_tokens=64), FixedDraw(u)
    )
    assert token == want


# ------------------------------------------------------------------ a seeded stream, pinned


def documented_derived_seed(seed: int, index: int) -> int:
    """A derived seed as the sampler's docs give it: numpy's SeedSequence of [seed, index], its
    first 64-bit word, halved (so that it is below 2**63)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0]) >> 1


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    run_seed=st.integers(0, 2**32),
    temperature=st.floats(0.3, 2.0),
)
def test_a_seeded_request_draws_what_numpys_generator_gives_by_hand(
    tiny_lm, seed, run_seed, temperature
):
    """Each sampled token, end to end through `LLM.generate`, is the hand-sampled one: softmax of
    the model's own logits (a separate forward of the whole sequence) over T, drawn with one
    `numpy.random.default_rng(s).random()` a token, where s is the request's seed, sample k > 0
    of it draws from the seed derived from (seed, k), and an unseeded request from the seed
    derived from (the run's seed, its index).  Nothing of minirt's sampler is called here."""
    from conftest import hand_decode

    from minirt import LLM

    llm = LLM(tiny_lm, batch_size=3, seed=run_seed)
    prompts = [[5, 6, 7], [8, 9]]
    seeded = SamplingParams(max_tokens=6, temperature=temperature, seed=seed, n=2, ignore_eos=True)
    unseeded = SamplingParams(max_tokens=6, temperature=temperature, ignore_eos=True)
    outputs = completions(llm.generate(prompts, [seeded, unseeded]))
    streams = [
        (prompts[0], seed),
        (prompts[0], documented_derived_seed(seed, 1)),
        (prompts[1], documented_derived_seed(run_seed, 1)),
    ]
    assert [(o.index, o.sample) for o in outputs] == [(0, 0), (0, 1), (1, 0)]
    for output, (prompt_ids, stream_seed) in zip(outputs, streams, strict=True):
        rng = np.random.default_rng(stream_seed)
        want = hand_decode(llm.model, prompt_ids, 6, rng=rng, temperature=temperature)
        assert output.token_ids == want
