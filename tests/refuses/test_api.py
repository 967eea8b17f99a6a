"""The Python API checks its arguments.

* `LLM.generate` raises TypeError or ValueError naming the argument for prompts that are None, bytes, numbers,
  or token-id lists holding floats (before, int() silently truncated 2.7 to 2), and for params that are not
  SamplingParams; ids or params of another length than the prompts are a ValueError (zip dropped prompts).
* `SamplingParams` names the field it refuses; `LLM(seed=...)` refuses a seed that is not an integer >= 0.
* Errors that mean "bad value" are ValueErrors, so callers can catch them as such.
* A prompts file's ids are checked the same way, but there a bad line fails alone, with its own record.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from minirt import LLM, SamplingParams
from minirt.cli.command import run_command
from minirt.generate import main as generate_main
from conftest import completions


@pytest.fixture(scope="module")
def llm():
    return LLM(FIXTURES / "base")  # vocabulary 128, no tokenizer: prompts are token ids


def not_an_int(value) -> bool:
    return not isinstance(value, (int, np.integer)) or isinstance(value, bool)


BAD_ITEMS = st.one_of(
    st.none(),
    st.binary(max_size=4),
    st.floats(allow_nan=True),
    st.booleans(),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.integers(0, 100),
)
BAD_IDS = st.lists(
    st.one_of(
        st.integers(0, 127), st.floats(0, 127), st.booleans(), st.text(max_size=2), st.none()
    ),
    min_size=1,
    max_size=5,
).filter(lambda ids: any(not_an_int(t) for t in ids))


@settings(max_examples=150, deadline=None)
@given(
    bad=st.one_of(
        BAD_ITEMS,
        st.lists(BAD_ITEMS, min_size=1, max_size=3),
        st.lists(BAD_IDS, min_size=1, max_size=3),
    ),
    good_first=st.booleans(),
)
def test_generate_names_a_bad_prompt(llm, bad, good_first):
    prompts = [[1, 2, 3], *bad] if good_first and isinstance(bad, list) else bad
    with pytest.raises((TypeError, ValueError)) as exc:
        completions(llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0)))
    assert "prompts" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "prompts, fragment",
    [
        (None, "got NoneType"),
        (b"hello", "got bytes"),
        ([b"hello"], "prompts[0] must be a string or a list of integer token ids, got bytes"),
        ([[1, 2.0]], "prompts[0]"),  # before: int(2.0) made it token 2
        ([[1, 2], [3, 2.7]], "prompts[1]"),  # before: token 2
        ([1, 2, 3], "wrap one token-id prompt in a list"),
        ([[True, 2]], "prompts[0]"),
    ],
)
def test_generate_refuses_prompts_that_are_not_strings_or_integer_ids(llm, prompts, fragment):
    with pytest.raises(TypeError) as exc:
        completions(llm.generate(prompts))
    assert fragment in str(exc.value)


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 127), min_size=1, max_size=4), min_size=1, max_size=3),
    container=st.sampled_from([list, tuple, np.array]),
)
def test_well_formed_prompts_are_served_as_their_plain_int_lists(llm, prompts, container):
    """The positive control: tuples and integer arrays are ids too, and give what plain lists give."""
    params = SamplingParams(max_tokens=2, temperature=0.0)
    got = completions(llm.generate([container(p) for p in prompts], params))
    want = completions(llm.generate([list(p) for p in prompts], params))
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert all(
        r.error is None and r.prompt_token_ids == list(p) for r, p in zip(got, prompts, strict=True)
    )


@pytest.mark.parametrize("params", [{"temperature": 1}, [None], ["greedy"], 0.5])
def test_generate_names_bad_params(llm, params):
    with pytest.raises(TypeError, match="params"):
        completions(llm.generate([[1, 2]], params))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.one_of(
        st.integers(max_value=-1), st.floats(), st.booleans(), st.text(max_size=3), st.none()
    )
)
def test_a_bad_run_seed_is_refused_when_the_llm_is_made(seed):
    with pytest.raises(ValueError, match="seed"):
        LLM(FIXTURES / "base", seed=seed)


FIELDS_AND_BAD_VALUES = {
    "max_tokens": st.one_of(
        st.integers(max_value=0), st.floats(), st.text(max_size=2), st.booleans()
    ),
    # vLLM's prompt_logprobs N >= 1 is not offered: 0 or None only.
    "prompt_logprobs": st.one_of(
        st.integers(min_value=1), st.integers(max_value=-1), st.booleans(), st.text(max_size=2)
    ),
    "temperature": st.one_of(
        st.floats(max_value=-1e-9),
        st.just(float("nan")),
        st.just(float("inf")),
        st.text(max_size=2),
        st.booleans(),
    ),
    # -1 is vLLM's "no limit", as 0 is.
    "top_k": st.one_of(st.integers(max_value=-2), st.floats(), st.booleans()),
    "top_p": st.one_of(st.floats(max_value=0), st.floats(min_value=1.0001), st.text(max_size=2)),
    "seed": st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=2), st.booleans()),
    "stop": st.one_of(
        st.integers(),
        st.dictionaries(st.text(max_size=2), st.integers(), min_size=1, max_size=2),
        st.lists(st.one_of(st.integers(), st.just("")), min_size=1, max_size=2),
    ),
    "stop_token_ids": st.one_of(
        st.integers(),
        st.text(min_size=1, max_size=2),
        st.lists(st.one_of(st.floats(), st.integers(max_value=-1)), min_size=1, max_size=2),
    ),
    "ignore_eos": st.one_of(st.integers(), st.text(max_size=2), st.none()),
}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), field=st.sampled_from(sorted(FIELDS_AND_BAD_VALUES)))
def test_sampling_params_names_the_field_it_refuses(data, field):
    value = data.draw(FIELDS_AND_BAD_VALUES[field], label=field)
    with pytest.raises(ValueError) as exc:
        SamplingParams(**{field: value})
    assert str(exc.value).startswith(field) and "\n" not in str(exc.value)


def test_float_ids_in_a_prompts_file_fail_their_own_line(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [1, 2.5]}\n{"prompt": [1, 2]}\n{"prompt": [1, true]}\n')
    out = tmp_path / "o.jsonl"
    code = run_command(
        generate_main,
        [
            "--model",
            str(FIXTURES / "base"),
            "--prompts",
            str(prompts),
            "--backend",
            "numpy",
            "--max-new-tokens",
            "2",
            "--output",
            str(out),
            "--quiet",
        ],
    )
    import json

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 1 and [r["finish_reason"] for r in records] == ["error", "length", "error"]
    assert (
        "prompt" in records[0]["error"]
        and "prompt" in records[2]["error"]
        and records[1]["error"] is None
    )
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------ numpy integers, LLM's own arguments, ids anywhere


def test_numpy_integers_are_counts_and_seeds_like_python_ints():
    """Before: batch_size=np.int64(2) was refused with "must be at least 1, got 2"."""
    llm = LLM(
        FIXTURES / "base", batch_size=np.int64(2), round_token_budget=np.int32(64), seed=np.int64(3)
    )
    want = completions(
        LLM(FIXTURES / "base", batch_size=2, seed=3).generate(
            [[1, 2], [3]], SamplingParams(temperature=1.0, max_tokens=64)
        )
    )
    got = completions(llm.generate([[1, 2], [3]], SamplingParams(temperature=1.0, max_tokens=64)))
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"batch_size": 2.0}, ValueError, "batch size must be at least 1, got 2.0"),
        ({"kv_budget_mib": float("inf")}, ValueError, "KV budget"),  # before: OverflowError
        (
            {"kv_budget_mib": "a"},
            ValueError,
            "KV budget",
        ),  # before: TypeError comparing str and int
        ({"kv_budget_mib": None}, ValueError, "KV budget"),
        ({"dtype": "int8"}, ValueError, "dtype"),  # BackendError is a ValueError now
        ({"backend": "tpu"}, ValueError, "backend"),
    ],
)
def test_llm_names_a_bad_argument_as_a_value_error(kwargs, error, fragment):
    with pytest.raises(error) as exc:
        LLM(FIXTURES / "base", **kwargs)
    assert fragment in str(exc.value)


def test_llm_of_none_is_the_shipped_model_and_a_wrong_type_is_a_type_error():
    """LLM(None) must never become a hub lookup of "None": no model means the shipped one."""
    from conftest import ROOT

    assert (
        LLM(None).model.folder == LLM().model.folder == ROOT / "weights" / "shakespeare-gpt2-tiny"
    )
    for wrong in (5, 2.5, ["gpt2"]):
        with pytest.raises(TypeError, match="model must be a folder, a hub id or a Checkpoint"):
            LLM(wrong)


@pytest.mark.parametrize("kwargs", [{"ids": 5}, {"ids": (i for i in "ab")}, {"ids": "xy"}])
def test_generate_checks_ids(llm, kwargs):
    with pytest.raises(TypeError, match="ids must be a list"):
        llm.generate([[1, 2], [3]], **kwargs)


def test_generate_takes_no_logprobs_flag_logprobs_are_asked_for_in_sampling_params(llm):
    """One way to ask for logprobs, vLLM's: SamplingParams(logprobs=...)."""
    with pytest.raises(TypeError, match="logprobs"):
        llm.generate([[1, 2]], logprobs=True)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ({"text": "hi"}, "'text'"),
        ({"prompt": "hi", "prompt_token_ids": [1]}, "'prompt', 'prompt_token_ids'"),
        ({}, "no keys"),
        ({"prompt_token_ids": [1, "a"]}, "list holding non-integers"),
        ({"prompt": 5}, "got int"),
        # Each key takes its own kind: text is never taken for ids, nor ids for text.
        ({"prompt": [1, 2]}, r'\["prompt"\] must be a string, got list'),
        ({"prompt_token_ids": "abc"}, r'\["prompt_token_ids"\] must be a list of token ids'),
    ],
)
def test_a_prompt_dict_vllm_would_not_take_is_a_type_error_naming_it(llm, prompt, message):
    with pytest.raises(TypeError, match=message) as refused:
        llm.generate(["fine", prompt])
    assert "prompts[1]" in str(refused.value)


def test_vllm_options_minirt_lacks_are_refused_with_minirts_name_or_the_reason(llm):
    with pytest.raises(TypeError) as refused:
        LLM(FIXTURES / "base", max_num_seqs=4, tensor_parallel_size=2, swap_space=4)
    message = str(refused.value)
    assert "max_num_seqs: minirt calls it batch_size" in message
    assert "tensor_parallel_size: minirt runs a model on one device" in message
    assert "swap_space: no such option" in message and "\n" not in message


def test_a_huge_id_is_shown_short(llm):
    got = completions(llm.generate([[1, 10**100]]))[0]
    assert got.finish_reason == "error" and "100000000000..." in got.error and len(got.error) < 120


def test_float_ids_are_refused_wherever_ids_enter(llm):
    """generate checks types first; scoring and make_request (the command line's way in) go through
    check_token_ids, which must refuse a float too, not truncate it."""
    from minirt.errors import InputError

    with pytest.raises(InputError, match="not a list of integer token ids"):
        llm.model.logits([[1, 2.0]])
    request = llm.make_request(0, [1, 2.5])
    assert request.finish_reason == "error" and "not a list of integer token ids" in request.error
    assert llm.make_request(1, [1, np.int64(2)]).error is None  # NumPy integers are ids
