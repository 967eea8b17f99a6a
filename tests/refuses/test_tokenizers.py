"""A model's tokenizer and generation defaults are checked against the model when it loads.

A tokenizer.json that cannot be read (cut short, random bytes, bytes that are not UTF-8, valid JSON of the wrong
shape) is refused at load in one line naming the file; so are vocab.json + merges.txt that cannot build a BPE;
so is a tokenizer whose size is not the model's vocab_size, bigger (ids the model cannot take) or smaller (ids
the model makes that it could not decode), in a line giving both sizes; and so is a generation_config.json that
is not JSON, not an object, or holds a value minirt cannot use, even one that greedy decoding would ignore.  On
the command line each is exit 2 and one line on standard error, with an existing --output left as it was.

The positive controls: the matching tokenizer loads and serves text (from tokenizer.json, or from vocab.json +
merges.txt); a folder with no tokenizer files loads and serves token-id prompts while each text prompt fails with
its own error; and valid generation configs give the defaults Hugging Face gives (do_sample absent or false:
greedy; true: temperature 1.0, top_k 50, top_p 1.0 unless given).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from minirt.cli.command import EXIT_OK, EXIT_REQUEST_FAILED, EXIT_USAGE, run_command
from minirt.errors import CheckpointError, TokenizerError
from minirt.generate import main as generate_main
from minirt.llm import LLM
from minirt.llm import generation_defaults
from minirt.engine.params import SamplingParams
from tiny_random_model import train_tokenizer
from conftest import completions

OLD = b'{"an": "existing record"}\n'
FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
)  # what minirt reads from generation_config.json
STRUCTURE = (
    "model",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "padding",
    "truncation",
)  # tokenizer.json's top-level parts
FIXTURE_SCOPED = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def model(tmp_path, tiny_lm) -> Path:
    """A copy of the tiny model (config vocab_size == its tokenizer's size) to break."""
    return Path(shutil.copytree(tiny_lm, tmp_path / "model"))


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """Where a command-line run reads its prompts and writes --output: outside the model folder."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "p.txt").write_text("To be\nShall I\n")
    return folder


def vocab_size(folder: Path) -> int:
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def refused_at_load(folder: Path, error: type, file_name: str) -> str:
    """LLM(folder) raises `error` in one line naming folder/file_name; the line."""
    with pytest.raises(error) as caught:
        LLM(folder)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "\n" not in message, message
    assert str(folder / file_name) in message, message
    return message


def sizes_in(message: str, folder: Path) -> set[int]:
    """The whole numbers in a message, once the paths (which may hold digits) are taken out."""
    return {int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", message.replace(str(folder), ""))}


def refused_by_the_command_line(folder: Path, run_dir: Path, file_name: str) -> str:
    """`minirt.generate` on the model: exit 2, one line naming folder/file_name, an existing --output unchanged."""
    output = run_dir / "out.jsonl"
    output.write_bytes(OLD)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(
            generate_main,
            [
                "--model",
                str(folder),
                "--prompts",
                str(run_dir / "p.txt"),
                "--backend",
                "numpy",
                "--output",
                str(output),
                "--quiet",
            ],
            prog="minirt.generate",
        )
    lines = err.getvalue().splitlines()
    assert code == EXIT_USAGE and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("minirt.generate: error: ") and "Traceback" not in err.getvalue()
    assert str(folder / file_name) in lines[0], lines[0]
    assert out.getvalue() == "" and output.read_bytes() == OLD
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "out.jsonl",
        "p.txt",
    ]  # no partial file left behind
    return lines[0]


def trained_tokenizer(target: int):
    """A byte-level BPE made as the tiny model's is, with about `target` tokens."""
    return train_tokenizer(target)


# --- tokenizer.json that cannot be read -------------------------------------------------------------------------

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
NON_NULL_SCALARS = JSON_SCALARS.filter(lambda v: v is not None)


@st.composite
def corrupt_tokenizer_files(draw, good: bytes) -> bytes:
    """tokenizer.json's bytes cut short, random, made not UTF-8, or valid JSON of the wrong shape."""
    parsed = json.loads(good)
    kind = draw(
        st.sampled_from(
            ["cut", "random", "not_utf8", "not_an_object", "no_model", "wrong_part", "wrong_vocab"]
        )
    )
    if kind == "cut":  # anywhere before the closing brace: never a whole JSON value
        return good[: draw(st.integers(0, len(good.rstrip()) - 1))]
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "not_utf8":  # a byte that no UTF-8 text holds there, put anywhere
        at = draw(st.integers(0, len(good)))
        return good[:at] + draw(st.sampled_from([b"\xff", b"\xfe", b"\x80", b"\xc3"])) + good[at:]
    if kind == "not_an_object":
        value = draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
    elif kind == "no_model":
        value = draw(
            st.dictionaries(
                st.text(max_size=10).filter(lambda k: k != "model"), JSON_VALUES, max_size=4
            )
        )
        value.update(draw(st.sampled_from([{}, {k: v for k, v in parsed.items() if k != "model"}])))
    elif (
        kind == "wrong_part"
    ):  # one part that must be an object or a list (or null) given as a scalar
        value = {**parsed, draw(st.sampled_from(STRUCTURE)): draw(NON_NULL_SCALARS)}
    else:
        part = draw(st.sampled_from(["vocab", "merges"]))
        value = {**parsed, "model": {**parsed["model"], part: draw(NON_NULL_SCALARS)}}
    return json.dumps(value).encode()


@settings(max_examples=60, **FIXTURE_SCOPED)
@given(data=st.data())
def test_a_corrupt_tokenizer_json_is_refused_at_load_in_one_line_naming_it(model, tiny_lm, data):
    good = (tiny_lm / "tokenizer.json").read_bytes()
    (model / "tokenizer.json").write_bytes(data.draw(corrupt_tokenizer_files(good)))
    message = refused_at_load(model, TokenizerError, "tokenizer.json")
    assert "not a valid tokenizer file" in message


@settings(max_examples=12, **FIXTURE_SCOPED)
@given(data=st.data())
def test_the_command_line_refuses_a_corrupt_tokenizer_json_and_keeps_the_output(
    model, run_dir, tiny_lm, data
):
    good = (tiny_lm / "tokenizer.json").read_bytes()
    (model / "tokenizer.json").write_bytes(data.draw(corrupt_tokenizer_files(good)))
    assert "not a valid tokenizer file" in refused_by_the_command_line(
        model, run_dir, "tokenizer.json"
    )


# --- tokenizer of the wrong size ----------------------------------------------------------------------------------


@settings(max_examples=25, **FIXTURE_SCOPED)
@given(target=st.integers(258, 450))
def test_a_trained_tokenizer_larger_than_the_vocabulary_is_refused_with_both_sizes(model, target):
    """A tokenizer with more ids than the model has rows makes ids it cannot embed.  (One with
    fewer loads: Qwen2.5's vocabulary is padded past its tokenizer; tests/loading covers it.)"""
    tok = trained_tokenizer(target)
    n_tokens, n_model = tok.get_vocab_size(with_added_tokens=True), vocab_size(model)
    assume(n_tokens > n_model)
    tok.save(str(model / "tokenizer.json"))
    message = refused_at_load(model, TokenizerError, "tokenizer.json")
    assert {n_tokens, n_model} <= sizes_in(message, model), message


@settings(max_examples=15, **FIXTURE_SCOPED)
@given(extra=st.integers(1, 60))
def test_added_tokens_beyond_the_models_vocabulary_are_refused_with_both_sizes(
    model, tiny_lm, extra
):
    """The common real case: tokens added to a tokenizer whose model's embedding was never resized."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_lm / "tokenizer.json"))
    tok.add_tokens([f"<extra_{i}>" for i in range(extra)])
    tok.save(str(model / "tokenizer.json"))
    n_model = vocab_size(model)
    message = refused_at_load(model, TokenizerError, "tokenizer.json")
    assert {n_model + extra, n_model} <= sizes_in(message, model), message


@pytest.mark.parametrize("delta", [1, 25])
def test_the_command_line_refuses_a_tokenizer_larger_than_the_vocabulary(model, run_dir, delta):
    n_model = vocab_size(model)
    tok = trained_tokenizer(n_model + delta)
    assert (
        tok.get_vocab_size(with_added_tokens=True) == n_model + delta
    )  # the corpus allows this many
    tok.save(str(model / "tokenizer.json"))
    line = refused_by_the_command_line(model, run_dir, "tokenizer.json")
    assert {n_model + delta, n_model} <= sizes_in(line, model), line


def test_gpt2s_vocab_json_and_merges_txt_do_not_fit_a_small_model(model):
    from conftest import DATA

    (model / "tokenizer.json").unlink()
    shutil.copy(DATA / "gpt2-vocab" / "encoder.json", model / "vocab.json")
    shutil.copy(DATA / "gpt2-vocab" / "vocab.bpe", model / "merges.txt")
    message = refused_at_load(model, TokenizerError, "vocab.json")
    assert {50257, vocab_size(model)} <= sizes_in(message, model), message


def test_a_tokenizer_whose_ids_reach_past_the_models_vocabulary_is_refused(model):
    """As many tokens as the model has rows, but one of its ids is past the last row: encoding its token gives an id
    the model cannot embed (before: IndexError out of LLM.generate, a traceback from the command line)."""
    raw = json.loads((model / "tokenizer.json").read_text())
    vocab = raw["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = vocab_size(model) + 1000
    (model / "tokenizer.json").write_text(json.dumps(raw))
    refused_at_load(model, TokenizerError, "tokenizer.json")


# --- vocab.json + merges.txt ---------------------------------------------------------------------------------------


def write_vocab_and_merges(model: Path, tiny_lm: Path) -> tuple[str, str]:
    """The tiny model's own tokenizer as vocab.json + merges.txt (its tokenizer.json removed): they match it."""
    raw = json.loads((tiny_lm / "tokenizer.json").read_text())
    (model / "tokenizer.json").unlink(missing_ok=True)
    vocab = json.dumps(raw["model"]["vocab"])
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in raw["model"]["merges"])
    (model / "vocab.json").write_text(vocab)
    (model / "merges.txt").write_text(merges)
    return vocab, merges


def test_vocab_json_and_merges_txt_that_fit_the_model_load(model, tiny_lm):
    write_vocab_and_merges(model, tiny_lm)
    llm = LLM(model)
    assert llm.tokenizer.vocab_size == vocab_size(model) and "vocab.json" in llm.tokenizer.source
    (out,) = completions(
        llm.generate(["To be, or not to be"], SamplingParams(max_tokens=3, temperature=0.0))
    )
    assert out.error is None and len(out.token_ids) == 3


@settings(max_examples=20, **FIXTURE_SCOPED)
@given(data=st.data())
def test_a_vocab_json_cut_short_is_refused_in_one_line(model, tiny_lm, data):
    vocab, _ = write_vocab_and_merges(model, tiny_lm)
    (model / "vocab.json").write_text(vocab[: data.draw(st.integers(0, len(vocab) - 1))])
    refused_at_load(model, TokenizerError, "vocab.json")


@settings(max_examples=20, **FIXTURE_SCOPED)
@given(
    bad_line=st.one_of(
        st.text(
            st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8
        ),  # one token, not a pair
        st.lists(st.sampled_from(["Ġ", "t", "h", "e"]), min_size=3, max_size=4).map(
            " ".join
        ),  # three or more
        st.just("Ġt zzzzzzzzzzzz"),  # a token the vocabulary does not have
    ),
    at=st.integers(0, 50),
)
def test_a_bad_line_in_merges_txt_is_refused_in_one_line_naming_it(model, tiny_lm, bad_line, at):
    _, merges = write_vocab_and_merges(model, tiny_lm)
    lines = merges.splitlines(keepends=True)
    lines.insert(1 + at, bad_line + "\n")
    (model / "merges.txt").write_text("".join(lines))
    refused_at_load(model, TokenizerError, "merges.txt")


# --- positive controls ---------------------------------------------------------------------------------------------


def test_the_matching_tokenizer_loads_and_serves_text(model):
    llm = LLM(model)
    assert (
        llm.tokenizer is not None
        and llm.tokenizer.vocab_size == vocab_size(model) == llm.model.config.vocab_size
    )
    (out,) = completions(
        llm.generate(["To be, or not to be"], SamplingParams(max_tokens=4, temperature=0.0))
    )
    assert (
        out.error is None and out.finish_reason in ("length", "stop") and isinstance(out.text, str)
    )


def test_a_folder_without_tokenizer_files_serves_token_ids_and_fails_only_text_prompts(model):
    (model / "tokenizer.json").unlink()
    llm = LLM(model)
    assert llm.tokenizer is None
    ids, text = completions(
        llm.generate([[1, 2, 3], "To be"], SamplingParams(max_tokens=3, temperature=0.0))
    )
    assert ids.error is None and ids.finish_reason == "length" and len(ids.token_ids) == 3
    assert text.finish_reason == "error" and "no tokenizer" in text.error and text.token_ids == []


def test_the_command_line_without_tokenizer_files_serves_token_ids_and_refuses_text(model, run_dir):
    """Token-id prompts run; a file of text prompts alone would fail every request, so it is refused
    (exit 2, no records: docs/refusals.md), while text lines beside token-id ones fail one by one."""
    (model / "tokenizer.json").unlink()
    (run_dir / "ids.jsonl").write_text('{"prompt": [1, 2, 3], "max_new_tokens": 2}\n')
    (run_dir / "mixed.jsonl").write_text(
        '{"prompt": [1, 2, 3], "max_new_tokens": 2}\n{"prompt": "To be"}\n'
    )
    for prompts, want in (
        ("ids.jsonl", EXIT_OK),
        ("mixed.jsonl", EXIT_REQUEST_FAILED),
        ("p.txt", EXIT_USAGE),
    ):
        output = run_dir / f"{prompts}.out"
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            code = run_command(
                generate_main,
                [
                    "--model",
                    str(model),
                    "--prompts",
                    str(run_dir / prompts),
                    "--backend",
                    "numpy",
                    "--output",
                    str(output),
                    "--quiet",
                ],
                prog="minirt.generate",
            )
        assert code == want and "Traceback" not in err.getvalue(), err.getvalue()
        if want == EXIT_USAGE:
            assert "every prompt is text" in err.getvalue() and not output.exists()
            continue
        records = [json.loads(line) for line in output.read_text().splitlines()]
        assert len(records) == len((run_dir / prompts).read_text().splitlines())
        # The token-id prompt runs; a text prompt fails alone.
        assert [r["finish_reason"] == "error" for r in records] == [
            not isinstance(json.loads(line)["prompt"], list)
            for line in (run_dir / prompts).read_text().splitlines()
        ], records


# --- generation_config.json ------------------------------------------------------------------------------------------

FINITE = dict(allow_nan=False, allow_infinity=False)
GOOD = {  # values minirt can use (and Hugging Face would accept)
    "temperature": st.one_of(st.floats(0.05, 5.0), st.integers(1, 3)),
    "top_k": st.integers(0, 500),
    "top_p": st.floats(0.01, 1.0, exclude_min=False),
    "min_p": st.floats(0.0, 1.0),
    "repetition_penalty": st.floats(0.5, 2.0),
    "max_new_tokens": st.integers(1, 4096),
}
NOT_A_NUMBER = st.one_of(
    st.booleans(),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)
BIG = 10**15  # magnitudes past int64 are a separate (known) failure, below
BAD = {  # values it cannot: out of range, or of the wrong type
    "temperature": st.one_of(
        st.floats(max_value=-1e-9, min_value=-1e300),
        st.integers(-BIG, -1),
        st.sampled_from([float("nan"), float("inf"), float("-inf")]),
        NOT_A_NUMBER,
    ),
    "top_k": st.one_of(st.integers(max_value=-1), st.floats(**FINITE), NOT_A_NUMBER),
    "top_p": st.one_of(
        st.floats(max_value=0.0, min_value=-1e300),
        st.floats(min_value=1.0, exclude_min=True, **FINITE),
        st.integers(-BIG, 0),
        st.integers(2, BIG),
        st.just(float("nan")),
        NOT_A_NUMBER,
    ),
    "min_p": st.one_of(
        st.floats(max_value=-1e-9, min_value=-1e300),
        st.floats(min_value=1.0001, **FINITE),
        NOT_A_NUMBER,
    ),
    "repetition_penalty": st.one_of(st.floats(max_value=0.0, min_value=-1e300), NOT_A_NUMBER),
    "max_new_tokens": st.one_of(st.integers(max_value=0), st.floats(**FINITE), NOT_A_NUMBER),
}
DO_SAMPLE = st.sampled_from([None, True, False])  # None: the key is absent


@st.composite
def generation_configs(draw, bad_field: str | None = None) -> dict:
    """A generation_config.json's content: some of the fields minirt reads (given, null or absent), keys it does
    not read, a do_sample or none; with `bad_field`, that field holds a value minirt cannot use."""
    raw = {
        "_from_model_config": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "transformers_version": "4.44.0",
    }
    do_sample = draw(DO_SAMPLE)
    if do_sample is not None:
        raw["do_sample"] = do_sample
    for name in FIELDS:
        choice = draw(st.sampled_from(["absent", "null", "given"]))
        if choice != "absent":
            raw[name] = draw(GOOD[name]) if choice == "given" else None
    if bad_field is not None:
        raw[bad_field] = draw(BAD[bad_field])
    return raw


def expected_params(raw: dict) -> SamplingParams | None:
    """What Hugging Face's rules give: greedy unless do_sample is true, whose unset fields default to 1.0/50/1.0;
    None for greedy (then only greedy-ness and max_new_tokens are checked)."""
    given_ = {k: raw[k] for k in FIELDS if raw.get(k) is not None}
    if raw.get("do_sample") is not True:
        return None
    return SamplingParams(**{"temperature": 1.0, "top_k": 50, "top_p": 1.0, **given_})


def write_generation_config(folder: Path, value) -> None:
    """`value` as JSON (NaN and Infinity as Python writes them, which Python's reader takes back)."""
    (folder / "generation_config.json").write_text(json.dumps(value))


def write_generation_text(folder: Path, data: str | bytes) -> None:
    (folder / "generation_config.json").write_bytes(
        data.encode() if isinstance(data, str) else data
    )


def refused_generation_config(folder: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        generation_defaults(folder)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "\n" not in message, message
    assert str(folder / "generation_config.json") in message and message.endswith(
        "fix or remove the file"
    ), message
    return message


def not_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return True
    return False


NOT_JSON = st.one_of(
    st.binary(max_size=80).filter(not_json),
    st.text(max_size=40).map(str.encode).filter(not_json),
    st.builds(
        lambda raw, n: json.dumps(raw).encode()[:n], generation_configs(), st.integers(0, 60)
    ).filter(not_json),
    st.just(b"\xef\xbb\xbf{}"),  # a byte-order mark: transformers' reader refuses it too
)


@settings(max_examples=40, **FIXTURE_SCOPED)
@given(content=NOT_JSON)
def test_a_generation_config_that_is_not_json_is_refused_in_one_line(model, content):
    write_generation_text(model, content)
    refused_generation_config(model)


@settings(max_examples=30, **FIXTURE_SCOPED)
@given(
    content=st.one_of(
        JSON_VALUES.filter(lambda v: not isinstance(v, dict)),
        st.builds(
            lambda raw, d: {**raw, "do_sample": d},
            generation_configs(),
            st.one_of(
                st.integers(),
                st.floats(**FINITE),
                st.text(max_size=5),
                st.lists(st.booleans(), max_size=2),
            ),
        ),
    )
)
def test_a_generation_config_that_is_not_an_object_or_whose_do_sample_is_not_a_bool_is_refused(
    model, content
):
    write_generation_config(model, content)
    assert "do_sample" in refused_generation_config(model)


@settings(max_examples=80, **FIXTURE_SCOPED)
@given(data=st.data(), field=st.sampled_from(FIELDS))
def test_a_value_minirt_cannot_use_is_refused_even_when_greedy_ignores_it(model, data, field):
    raw = data.draw(generation_configs(bad_field=field))
    write_generation_config(model, raw)
    assert field in refused_generation_config(model)


def test_llm_refuses_a_bad_generation_config_at_load(model):
    write_generation_config(model, {"do_sample": False, "top_p": 2})
    assert "top_p" in refused_at_load(model, CheckpointError, "generation_config.json")


@pytest.mark.parametrize(
    "content",
    [
        '{"temperature": "hot"}',
        '{"top_k": -1}',
        '{"top_k": 2.5}',
        '{"top_p": 0}',
        '{"max_new_tokens": 0}',
        '{"do_sample": "yes"}',
        "[]",
        '{"temperature": 0.7,',
    ],
)
def test_the_command_line_refuses_a_bad_generation_config_and_keeps_the_output(
    model, run_dir, content
):
    write_generation_text(model, content)
    refused_by_the_command_line(model, run_dir, "generation_config.json")


@settings(max_examples=60, **FIXTURE_SCOPED)
@given(raw=generation_configs())
def test_valid_generation_configs_give_hugging_faces_defaults(model, raw):
    write_generation_config(model, raw)
    got = generation_defaults(model)
    want = expected_params(raw)
    # The file's max_new_tokens is SamplingParams' max_tokens; without it, vLLM's and OpenAI's 16.
    assert got.max_tokens == (raw.get("max_new_tokens") or 16)
    if want is None:
        assert got.greedy and got.temperature == 0, (raw, got)
    else:
        assert got == want, (raw, got)


def test_a_repetition_penalty_applies_to_greedy_decoding_too(model):
    """transformers applies generation_config.json's repetition_penalty whatever do_sample says (its
    RepetitionPenaltyLogitsProcessor is not a sampling warper), so a greedy default keeps it."""
    write_generation_config(model, {"repetition_penalty": 1.3, "max_new_tokens": 8})
    assert generation_defaults(model) == SamplingParams(
        temperature=0.0, repetition_penalty=1.3, max_tokens=8
    )


def test_no_generation_config_is_greedy_with_16_tokens(model):
    """Hugging Face's reading (no do_sample: greedy) and vLLM's length (16 tokens)."""
    assert not (model / "generation_config.json").exists()
    assert generation_defaults(model) == SamplingParams(temperature=0.0, max_tokens=16)
    write_generation_config(model, {"do_sample": True})
    assert generation_defaults(model) == SamplingParams(
        temperature=1.0, top_k=50, top_p=1.0, max_tokens=16
    )
    # What LLM serves with.
    assert LLM(model).defaults == SamplingParams(
        temperature=1.0, top_k=50, top_p=1.0, max_tokens=16
    )


@pytest.mark.reference
@settings(max_examples=25, **FIXTURE_SCOPED)
@given(raw=generation_configs())
def test_sampling_defaults_agree_with_transformers_generation_config(model, raw):
    transformers = pytest.importorskip("transformers")
    config_class = transformers.GenerationConfig
    write_generation_config(model, raw)
    theirs = config_class.from_pretrained(str(model))
    if hasattr(
        config_class, "_get_default_generation_params"
    ):  # transformers 5: unset fields stay None
        defaults = config_class._get_default_generation_params()
    else:  # transformers 4: GenerationConfig() holds them
        defaults = {
            k: getattr(config_class(), k) for k in ("do_sample", "temperature", "top_k", "top_p")
        }
    effective = {
        k: defaults[k] if getattr(theirs, k) is None else getattr(theirs, k)
        for k in ("do_sample", "temperature", "top_k", "top_p")
    }
    ours = generation_defaults(model)
    if effective["do_sample"]:
        assert (ours.temperature, ours.top_k, ours.top_p) == (
            effective["temperature"],
            effective["top_k"],
            effective["top_p"],
        ), (raw, effective, ours)
    else:
        assert ours.greedy, (raw, ours)
    if raw.get("max_new_tokens") is not None:
        assert ours.max_tokens == theirs.max_new_tokens
    if raw.get("repetition_penalty") is not None:
        assert ours.repetition_penalty == theirs.repetition_penalty


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_number_too_big_for_numpy_is_refused_in_one_line(model, field):
    write_generation_text(
        model, '{"%s": 1%s}' % (field, "0" * 400)
    )  # an integer past float's range
    assert field in refused_generation_config(model)


# --- a tokenizer.json that loads but misbehaves on some text -------------------------------------------------------


def edit_tokenizer_json(folder: Path, **parts) -> None:
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw.update(parts)
    (folder / "tokenizer.json").write_text(json.dumps(raw))


def test_a_tokenizer_that_panics_on_a_prompt_fails_that_request_alone(model, run_dir, capsys):
    """An empty Replace pattern makes the Rust library panic (a PanicException, which is no Exception)."""
    edit_tokenizer_json(
        model, normalizer={"type": "Replace", "pattern": {"String": ""}, "content": "aa"}
    )
    got = completions(
        LLM(model).generate(["To be", [1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0))
    )
    assert (
        got[0].finish_reason == "error" and "tokenizer.json failed on this prompt" in got[0].error
    )
    assert got[1].error is None and len(got[1].token_ids) == 2  # its peer is served
    out = run_dir / "o.jsonl"
    code = run_command(
        generate_main,
        [
            "--model",
            str(model),
            "--prompts",
            str(run_dir / "p.txt"),
            "--backend",
            "numpy",
            "--max-new-tokens",
            "2",
            "--output",
            str(out),
            "--quiet",
        ],
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 1 and all(r["finish_reason"] == "error" for r in records) and len(records) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "parts",
    [
        {
            "truncation": {
                "direction": "Right",
                "max_length": 2,
                "strategy": "LongestFirst",
                "stride": 0,
            }
        },
        {
            "truncation": {
                "direction": "Right",
                "max_length": 2,
                "strategy": "LongestFirst",
                "stride": 5,
            }
        },
        {
            "padding": {
                "strategy": {"Fixed": 20},
                "direction": "Right",
                "pad_to_multiple_of": None,
                "pad_id": 5,
                "pad_type_id": 0,
                "pad_token": "x",
            }
        },
    ],
)
def test_truncation_and_padding_in_tokenizer_json_never_change_a_prompt(model, tiny_lm, parts):
    """transformers feeds a prompt whole unless asked; before, minirt ran 2 of 9 tokens, or 20 with padding."""
    prompt = "To be, or not to be, that is the question"
    want = LLM(tiny_lm).prompt_ids(prompt)
    edit_tokenizer_json(model, **parts)
    assert LLM(model).prompt_ids(prompt) == want and len(want) > 2


def test_a_token_id_prompt_is_shown_and_recorded_as_its_decoded_text(tiny_lm, run_dir, capsys):
    """Before: a model with a tokenizer printed "None" in place of an id prompt, and recorded "prompt": null.
    Now it shows the prompt's text (decoded by the tokenizers library itself, here) and records its ids too."""
    from tokenizers import Tokenizer as Reference

    want = Reference.from_file(str(tiny_lm / "tokenizer.json")).decode([5, 6, 7])
    (run_dir / "ids.jsonl").write_text('{"prompt": [5, 6, 7]}\n{"prompt": "To be"}\n')
    code = run_command(
        generate_main,
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(run_dir / "ids.jsonl"),
            "--backend",
            "numpy",
            "--max-new-tokens",
            "2",
            "--output",
            str(run_dir / "o.jsonl"),
        ],
    )
    out = capsys.readouterr().out
    assert code == 0 and f"\n{want}" in out and "None" not in out and want.strip()
    ids_record, text_record = (
        json.loads(line) for line in (run_dir / "o.jsonl").read_text().splitlines()
    )
    assert ids_record["prompt"] == want and ids_record["prompt_token_ids"] == [5, 6, 7]
    assert (
        text_record["prompt"] == "To be" and "prompt_token_ids" not in text_record
    )  # a text prompt: as given
