"""Sampling values whose arithmetic could overflow, and flag values that every request would fail on.

The bounds (docs/refusals.md, "Sampling values"): logit_bias in [-100, 100] and presence and frequency
penalties in [-2, 2], as OpenAI has them; repetition_penalty in [0.01, 100]; temperature any finite
number >= 0.  Outside them a value is refused, naming its field: a JSONL line fails alone, a flag is exit 2
before anything runs.  Inside them the sampler's arithmetic is defined for any finite float32 logits: the
probabilities a token is drawn from are finite and sum to 1, and numpy never warns.  The expected values
are the bounds themselves, the definition of a distribution, and hand-made logits whose answer is known.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from minirt.engine.params import SamplingParams
from minirt.engine.sampler import choose_token, filtered_distribution, processed_logits, request_rng
from minirt.errors import RequestError

# (field, lowest allowed, highest allowed)
BOUNDS = [
    ("logit_bias", -100.0, 100.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repetition_penalty", 0.01, 100.0),
]


def params_with(field: str, value: float) -> SamplingParams:
    """SamplingParams with one bounded field set (a logit_bias on token 5)."""
    if field == "logit_bias":
        return SamplingParams(logit_bias={5: value}, temperature=0.0, max_tokens=64)
    return SamplingParams(**{field: value})


@settings(max_examples=300, deadline=None)
@given(
    bound=st.sampled_from(BOUNDS),
    value=st.floats(allow_nan=True, allow_infinity=True),
)
def test_a_value_outside_its_bounds_is_refused_naming_the_field(bound, value):
    field, low, high = bound
    inside = low <= value <= high
    if inside:
        params_with(field, value)
        return
    with pytest.raises(RequestError) as refused:
        params_with(field, value)
    message = str(refused.value)
    assert message.startswith(field) and "\n" not in message
    # The bounds are in the message: the user learns what would work.
    assert f"{low:g}" in message and f"{high:g}" in message


@pytest.mark.parametrize("field, low, high", BOUNDS)
def test_the_bounds_themselves_are_allowed(field, low, high):
    params_with(field, low)
    params_with(field, high)


# Any finite float32 logits: the model's numbers are checked finite before sampling.
float32_logits = st.lists(
    st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=7, max_size=7
).map(lambda values: np.array(values, dtype=np.float32))

extreme_params = st.fixed_dictionaries(
    {
        "temperature": st.one_of(st.floats(0.0, 1e308), st.sampled_from([1e-5, 1e-4, 1e300])),
        "top_k": st.integers(0, 8),
        "top_p": st.floats(1e-9, 1.0, exclude_min=False),
        "min_p": st.floats(0.0, 1.0),
        "repetition_penalty": st.sampled_from([0.01, 0.5, 1.0, 2.0, 100.0]),
        "presence_penalty": st.floats(-2.0, 2.0),
        "frequency_penalty": st.floats(-2.0, 2.0),
        "logit_bias": st.dictionaries(st.integers(0, 6), st.floats(-100.0, 100.0), max_size=3),
    }
)


@settings(max_examples=400, deadline=None)
@given(
    logits=float32_logits,
    fields=extreme_params,
    prompt=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    output=st.lists(st.integers(0, 6), max_size=40),
    seed=st.integers(0, 2**32),
)
def test_any_allowed_values_give_a_defined_draw_and_no_warning(
    logits, fields, prompt, output, seed
):
    params = SamplingParams(**fields)
    with warnings.catch_warnings():
        # An overflow, an invalid value or a division by zero in numpy fails the test.
        warnings.simplefilter("error")
        processed = processed_logits(logits, params, prompt, output)
        assert np.isfinite(processed).all()
        if not params.greedy:
            probs = filtered_distribution(processed, params)
            assert np.isfinite(probs).all() and (probs >= 0).all()
            assert abs(probs.sum() - 1.0) < 1e-9
        token, logprob = choose_token(logits, params, request_rng(seed), True, prompt, output)
    assert 0 <= token < logits.size
    assert logprob is not None and np.isfinite(logprob) and logprob <= 0


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.floats(-15.0, 15.0), min_size=50, max_size=50),
    forced=st.integers(0, 49),
    temperature=st.floats(0.05, 2.0),
    seed=st.integers(0, 2**32),
)
def test_a_bias_of_100_forces_its_token_and_minus_100_bans_it(logits, forced, temperature, seed):
    """GPT-2's logits at one position span some tens (26 for the shipped model); +100 on a token then
    leaves every other one at least 70 / T below it, and -100 puts it 70 / T below all of them."""
    logits = np.array(logits, dtype=np.float32)
    rng = request_rng(seed)
    forcing = SamplingParams(temperature=temperature, logit_bias={forced: 100}, max_tokens=64)
    assert choose_token(logits, forcing, rng, False)[0] == forced
    banning = SamplingParams(temperature=temperature, logit_bias={forced: -100}, max_tokens=64)
    assert choose_token(logits, banning, rng, False)[0] != forced
    assert (
        choose_token(
            logits,
            SamplingParams(logit_bias={forced: -100}, temperature=0.0, max_tokens=64),
            None,
            False,
        )[0]
        != forced
    )


def run_generate(tmp_path, flags, prompts_text="To be\nShall I\n", suffix="txt"):
    """`python -m minirt.generate` on the shipped model in a subprocess (numpy's warnings would go to
    its standard error): (exit status, stderr lines, the --output file's bytes)."""
    prompts = tmp_path / f"p.{suffix}"
    prompts.write_text(prompts_text)
    output = tmp_path / "out.jsonl"
    output.write_bytes(b'{"an": "existing record"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--backend", "numpy", "--prompts", str(prompts)]
        + ["--output", str(output), "--max-new-tokens", "4", "--quiet", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    return done.returncode, done.stderr.splitlines(), output.read_bytes()


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--logit-bias", "5=1.7e308", "--temperature", "0.5"], "logit_bias"),
        (["--logit-bias", "5=100.5"], "logit_bias"),
        (["--frequency-penalty=-1e308"], "frequency_penalty"),
        (["--presence-penalty", "2.01"], "presence_penalty"),
        (["--repetition-penalty", "1e-300"], "repetition_penalty"),
        (["--repetition-penalty", "1e300"], "repetition_penalty"),
        # Every request would fail on these: the model has 4096 tokens and a tokenizer.
        (["--logit-bias", "99999999999=1"], "--logit-bias"),
        (["--logit-bias", "4096=1"], "--logit-bias"),
        (["--stop-token-id", "4096"], "--stop-token-id"),
    ],
)
def test_a_bad_sampling_flag_is_exit_2_before_anything_runs(tmp_path, flags, named):
    status, stderr, output = run_generate(tmp_path, flags)
    assert status == 2
    assert len(stderr) == 1, stderr
    assert named in stderr[0] and "bad sampling flag" in stderr[0]
    assert "Traceback" not in stderr[0] and "Warning" not in stderr[0]
    # The run never started: the existing --output is untouched.
    assert output == b'{"an": "existing record"}\n'


def test_the_largest_allowed_values_run_without_a_warning(tmp_path):
    """At the bounds, at a tiny temperature: a defined result, the forced token every time (once seen,
    the repetition penalty 0.01 and the negative penalties push it further up)."""
    flags = ["--logit-bias", "17=100", "--frequency-penalty=-2", "--presence-penalty=-2"]
    flags += ["--repetition-penalty", "0.01", "--temperature", "1e-5", "--seed", "7"]
    status, stderr, output = run_generate(tmp_path, flags)
    assert status == 0
    assert not [line for line in stderr if "Warning" in line or "Traceback" in line], stderr
    records = [json.loads(line) for line in output.splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["token_ids"] == [17, 17, 17, 17]


def test_a_negative_number_in_scientific_notation_is_told_to_use_equals(tmp_path):
    """argparse takes -1e308 for a flag; the one line says how to write it."""
    status, stderr, _ = run_generate(tmp_path, ["--frequency-penalty", "-1e308"])
    assert status == 2 and len(stderr) == 1
    assert "a negative value is written --frequency-penalty=-1e308" in stderr[0]


def test_a_line_with_an_overflowing_value_fails_alone(tmp_path):
    lines = [
        {"prompt": "To be", "id": "good-1"},
        {"prompt": "Shall I", "id": "bad", "logit_bias": {"5": 1.7e308}, "temperature": 0.5},
        {"prompt": "Shall I", "id": "also-bad", "frequency_penalty": -1e308},
        {"prompt": "Once upon", "id": "good-2", "temperature": 0.5, "seed": 1},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    status, stderr, output = run_generate(tmp_path, [], prompts_text=text, suffix="jsonl")
    # A failed request is exit 1; the others are served.
    assert status == 1
    assert not [line for line in stderr if "Warning" in line or "Traceback" in line], stderr
    records = {record["id"]: record for record in map(json.loads, output.splitlines())}
    assert set(records) == {"good-1", "bad", "also-bad", "good-2"}
    assert records["bad"]["finish_reason"] == "error" and "logit_bias" in records["bad"]["error"]
    assert records["also-bad"]["finish_reason"] == "error"
    assert "frequency_penalty" in records["also-bad"]["error"]
    for good in ("good-1", "good-2"):
        assert records[good]["finish_reason"] == "length" and len(records[good]["token_ids"]) == 4


def test_stop_strings_for_a_model_without_a_tokenizer_are_exit_2(tmp_path):
    """tests/fixtures/base has no tokenizer: every request would fail on --stop, so the flag is refused;
    token-id prompts and --stop-token-id still run."""
    model = ROOT / "tests" / "fixtures" / "base"
    prompts = '{"prompt": [1, 2, 3]}\n'
    status, stderr, output = run_generate(
        tmp_path, ["--model", str(model), "--stop", "x"], prompts_text=prompts, suffix="jsonl"
    )
    assert status == 2 and len(stderr) == 1
    assert "--stop" in stderr[0] and "stop strings need a tokenizer" in stderr[0]
    assert output == b'{"an": "existing record"}\n'
    status, stderr, output = run_generate(
        tmp_path,
        ["--model", str(model), "--stop-token-id", "3"],
        prompts_text=prompts,
        suffix="jsonl",
    )
    assert status == 0, stderr


@pytest.mark.parametrize(
    "field", ["temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty"]
)
@pytest.mark.parametrize("value", [np.complex128(1j), np.complex64(0.5 + 0j), 1j])
def test_a_complex_number_is_refused_naming_the_field(field, value):
    """np.complex128 is an np.number, and float() of it drops the imaginary part with a ComplexWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RequestError, match=f"^{field} must be"):
            SamplingParams(**{field: value})
    with pytest.raises(RequestError, match="^logit_bias"):
        SamplingParams(logit_bias={5: value}, temperature=0.0, max_tokens=64)


@pytest.mark.parametrize(
    "bias",
    [{"38": -100, "038": 100}, {5: 100, "05": 100}, [[5, 1], [5, 2]], {38: -100, "38": 100}],
)
def test_a_token_given_two_biases_is_refused_not_summed(bias):
    """Two keys that name one token would add up past the range (or cancel a ban): ambiguous, refused."""
    with pytest.raises(RequestError, match="names token (38|5) twice"):
        SamplingParams(logit_bias=bias, temperature=0.0, max_tokens=64)


@pytest.mark.parametrize("key", ["\u0663", " 5", "5 ", "+5", "5.0", "1e3", "-1", ""])
def test_a_logit_bias_key_is_ascii_digits_alone(key):
    with pytest.raises(RequestError, match="^logit_bias must map token ids"):
        SamplingParams(logit_bias={key: 1}, temperature=0.0, max_tokens=64)


@pytest.mark.parametrize(
    "flags, shown",
    [
        (["--logit-bias", "5=nan"], "--logit-bias 5=nan: logit_bias"),
        (["--stop-token-id=-1"], "--stop-token-id -1: stop_token_ids"),
        (["--stop", ""], '--stop "": stop must be'),
        (
            ["--logit-bias", "5=1", "--logit-bias", "5=2"],
            "--logit-bias 5=1.0 5=2.0: logit_bias names token 5",
        ),
    ],
)
def test_a_bad_sampling_flag_is_shown_as_it_was_given(tmp_path, flags, shown):
    status, stderr, output = run_generate(tmp_path, flags)
    assert status == 2 and len(stderr) == 1
    assert f"bad sampling flag {shown}" in stderr[0]
    # Never Python's spelling of the field: ((5, nan),), (-1,), [''].
    assert "((" not in stderr[0] and "(-1,)" not in stderr[0] and "['']" not in stderr[0]
    assert output == b'{"an": "existing record"}\n'
