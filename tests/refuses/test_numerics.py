"""Non-finite numbers never leak out as garbage.

* A row whose logits hold NaN or inf fails that request alone, with finish_reason "error" and a message that
  says so, whatever its batch: NaN weights, inf weights, and float16 overflow (the same weights served in float32).
  Before, greedy quietly picked token 0 and sampling repeated one token.
* Records are strict JSON: a non-finite log-probability is null, never a bare NaN or Infinity.
* `evaluate` on a model whose loss is not finite says so in one line and exits non-zero.
"""

import json
import math
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from minirt.cli.command import EXIT_USAGE, run_command
from minirt.evaluate import main as evaluate_main
from minirt.generate import main as generate_main
from minirt.cli.records import record
from minirt.engine.request import Request
from minirt.engine.params import SamplingParams
from conftest import completions


def strict(line: str) -> dict:
    """json.loads that refuses NaN, Infinity and -Infinity, as strict JSON readers do."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_model(tiny_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("nan") / "model"
    shutil.copytree(tiny_lm, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["ln_f.weight"][:] = np.nan  # every logit becomes NaN
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@settings(max_examples=200, deadline=None)
@given(logprobs=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=8))
def test_a_record_is_strict_json_whatever_its_logprobs_hold(logprobs):
    request = Request(
        index=0,
        id="0",
        prompt="x",
        prompt_ids=[1],
        params=SamplingParams(temperature=0.0, max_tokens=64),
        want_logprobs=True,
    )
    request.token_ids, request.logprobs, request.finish_reason = (
        [1] * len(logprobs),
        logprobs,
        "length",
    )
    line = json.dumps(record(request), allow_nan=False)
    got = strict(line)["logprobs"]
    assert got == [round(lp, 6) if math.isfinite(lp) else None for lp in logprobs]


def test_generate_on_a_nan_model_fails_each_request_in_strict_json(nan_model, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text('{"prompt": "To be"}\n{"prompt": "Shall I"}\n')
    out = tmp_path / "o.jsonl"
    code = run_command(
        generate_main,
        [
            "--model",
            str(nan_model),
            "--prompts",
            str(tmp_path / "p.jsonl"),
            "--backend",
            "numpy",
            "--logprobs",
            "--max-new-tokens",
            "3",
            "--output",
            str(out),
            "--quiet",
        ],
    )
    records = [strict(line) for line in out.read_text().splitlines()]
    assert code == 1 and len(records) == 2
    assert all(r["finish_reason"] == "error" and "not finite" in r["error"] for r in records)
    assert "Traceback" not in capsys.readouterr().err


def test_evaluate_on_a_nan_model_says_so_and_exits_non_zero(nan_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question. " * 3)
    for extra in ([], ["--json"]):
        code = run_command(
            evaluate_main,
            ["--model", str(nan_model), "--text", str(text), "--backend", "numpy", *extra],
            prog="minirt.evaluate",
        )
        captured = capsys.readouterr()
        assert code == EXIT_USAGE and captured.out == ""
        assert (
            captured.err.count("\n") == 1
            and "not finite" in captured.err
            and "Traceback" not in captured.err
        )


# ------------------------------------------------------------------ non-finite logits fail their own request only

POISONED_TOKEN = 7


def poisoned_copy(source, folder, value):
    """The untied-head fixture with one embedding row set to `value`: a row that feeds that token goes non-finite,
    and only that row (the head is untied, so the other rows' logits never touch the poisoned numbers)."""
    shutil.copytree(source, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("wte.weight"))
    tensors[name][POISONED_TOKEN] = value
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module", params=[np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def poisoned(request, tmp_path_factory):
    from conftest import FIXTURES
    from minirt import LLM

    clean = LLM(FIXTURES / "untied_head")
    folder = poisoned_copy(
        FIXTURES / "untied_head", tmp_path_factory.mktemp("poisoned") / "model", request.param
    )
    return clean, LLM(folder)


def outcome(r) -> tuple:
    return r.token_ids, r.finish_reason, r.error


@settings(max_examples=25, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=6), min_size=1, max_size=5),
    temperature=st.sampled_from([0.0, 0.9]),
    batch_size=st.integers(1, 4),
    policy=st.sampled_from(["static", "continuous"]),
)
def test_a_non_finite_row_fails_alone_and_its_peers_are_served_as_on_a_clean_model(
    poisoned, prompts, temperature, batch_size, policy
):
    clean, bad = poisoned
    params = SamplingParams(max_tokens=5, temperature=temperature, seed=3)
    bad.engine.batch_size, bad.engine.policy = batch_size, policy
    together = completions(bad.generate(prompts, params))
    bad.engine.batch_size, bad.engine.policy = 1, "static"
    for prompt, got in zip(prompts, together, strict=True):
        assert outcome(got) == outcome(
            completions(bad.generate([prompt], params))[0]
        )  # batching never changes a result
        reference = completions(clean.generate([prompt], params))[0]
        if (
            POISONED_TOKEN in prompt
        ):  # its prefill row is not finite: it fails in its first round, with nothing served
            assert (
                got.finish_reason == "error" and "not finite" in got.error and got.token_ids == []
            )
            assert got.finish_round == got.first_round
        elif (
            POISONED_TOKEN not in reference.token_ids[:-1]
        ):  # it never feeds the token: the clean result
            assert outcome(got) == outcome(reference)
        else:  # it fails in the round after it produced the poisoned token, keeping what it had
            assert got.finish_reason == "error" and "not finite" in got.error
            assert (
                got.token_ids
                == reference.token_ids[: reference.token_ids.index(POISONED_TOKEN) + 1]
            )


def test_float16_overflow_fails_the_request_where_float32_serves_it(tmp_path):
    """The same weights: finite in float32, past float16's 65504 in the residual stream."""
    from conftest import FIXTURES
    from minirt import LLM

    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "base", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("h.0.mlp.c_proj.weight"))
    tensors[name] *= 1e6
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    prompts = [[1, 2, 3], [4, 5]]
    assert np.isfinite(LLM(folder).model.logits(prompts)[0]).all()  # float32 really is finite
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_tokens=4, temperature=temperature, seed=1)
        served = completions(LLM(folder).generate(prompts, params))
        assert all(r.finish_reason == "length" and len(r.token_ids) == 4 for r in served)
        failed = completions(LLM(folder, dtype="float16").generate(prompts, params))
        assert all(
            r.finish_reason == "error" and "not finite" in r.error and "float16" in r.error
            for r in failed
        )


def test_inspect_on_a_nan_model_says_so_in_one_line(nan_model, capsys):
    from minirt.inspect import main as inspect_main

    code = run_command(
        inspect_main,
        [str(nan_model), "--ids", "1,2,3", "--backend", "numpy"],
        prog="minirt.inspect",
    )
    err = capsys.readouterr().err
    assert (
        code == EXIT_USAGE and err.count("\n") == 1 and "not finite" in err
    )  # before: "logprob nan", exit 0


def test_evaluate_reports_an_infinite_perplexity_for_a_huge_finite_loss(tiny_lm, tmp_path, capsys):
    """A loss past 709.78 nats is finite, but exp() of it is not a float: inf, not an OverflowError traceback."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_lm, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["ln_f.weight"] *= 1e5  # finite logits in the millions: the loss is huge but finite
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question. " * 3)
    code = run_command(
        evaluate_main,
        ["--model", str(folder), "--text", str(text), "--backend", "numpy", "--json"],
        prog="minirt.evaluate",
    )
    result = strict(capsys.readouterr().out)
    assert (
        code == 0 and 709.8 < result["loss"] < math.inf and result["perplexity"] is None
    )  # strict JSON: null
    code = run_command(
        evaluate_main, ["--model", str(folder), "--text", str(text), "--backend", "numpy"]
    )
    assert code == 0 and "perplexity   inf" in capsys.readouterr().out


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_non_finite_logit_is_enough_to_fail_a_row(tmp_path, value, temperature):
    """One head row poisoned: every row has a single non-finite logit among finite ones.  Greedy argmax would
    pick it (NaN compares as the largest) and sampling would draw from garbage; the row must fail instead."""
    from conftest import FIXTURES
    from minirt import LLM

    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "untied_head", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["lm_head.weight"][5] = value
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    logits = LLM(folder).model.logits([[1, 2, 3]])[0, -1]
    assert np.isfinite(logits).sum() == logits.size - 1  # exactly one logit is not finite
    got = completions(
        LLM(folder).generate(
            [[1, 2, 3], [4]], SamplingParams(max_tokens=3, temperature=temperature, seed=0)
        )
    )
    assert all(
        r.finish_reason == "error" and "not finite" in r.error and r.token_ids == [] for r in got
    )
