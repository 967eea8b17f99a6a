"""A bad line of a prompts file fails that request alone, with its own record.

A wrong-typed `stop` or `stop_token_ids`, a lone surrogate escaped in JSON, a line that is not UTF-8 (in a file or
on standard input) and a line over the size limit each get an error record naming the line, while the good lines
give exactly the records they give without the bad ones, the run exits 1 and nothing is a traceback.  A file in
which no line decodes is still refused whole.  A line ends at \\n (or \\r\\n) alone, as JSON Lines says:
a lone \\r, U+2028, U+2029, U+0085, a form feed and the other characters where `str.splitlines` also splits stay
inside their prompt.
"""

import contextlib
import io
import json
import re
import sys
import tempfile
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minirt.cli.command import EXIT_REQUEST_FAILED, EXIT_USAGE, run_command
from minirt.errors import RequestError
from minirt.generate import main
import minirt.cli.prompt_file as prompt_file
from minirt.cli.prompt_file import MAX_LINE_BYTES, numbered_lines, read_prompts
from minirt.engine.params import FIELD_NAMES, SamplingParams

GOOD = [
    "To be",
    "All the world",
    "Now is the winter",
]  # the good lines every case keeps, in this order
CLI = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


class BytesStdin:
    """Standard input as a pipe gives it: bytes beneath, in `.buffer`."""

    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)


def generate(
    model: Path, prompts: bytes, suffix: str = ".jsonl", stdin: bool = False, flags: tuple = ()
):
    """Run `python -m minirt.generate` in-process on these bytes (a file, or standard input), with any more
    `flags`: (exit status, the records, stderr).  Standard output and error encode strictly, as a real UTF-8
    terminal or pipe does."""
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / f"prompts{suffix}", Path(tmp) / "out.jsonl"
        source.write_bytes(prompts)
        argv = [
            "--model",
            str(model),
            "--backend",
            "numpy",
            "--max-new-tokens",
            "3",
            "--output",
            str(out),
            "--prompts",
            "-" if stdin else str(source),
            *flags,
        ]
        stdout, stderr = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2))
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            mock.patch.object(sys, "stdin", BytesStdin(prompts)),
        ):
            code = run_command(main, argv, prog="minirt.generate")
        records = (
            [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
            if out.exists()
            else []
        )  # not splitlines(): a record may hold U+2028 raw
    stderr.flush()
    return code, records, stderr.buffer.getvalue().decode("utf-8")


def jsonl(objects) -> list[bytes]:
    return [json.dumps(obj).encode() for obj in objects]


@pytest.fixture(scope="module")
def good_tokens(tiny_lm):
    """The token ids each good line gets in a run of the good lines alone."""
    code, records, _ = generate(tiny_lm, b"\n".join(jsonl({"prompt": p} for p in GOOD)) + b"\n")
    assert code == 0 and all(r["error"] is None for r in records)
    return [r["token_ids"] for r in records]


def check_bad_line_alone(
    model: Path, good_tokens, lines: list[bytes], bad_at: int, error_start: str, **kw
):
    """Insert lines[...] as they are; the line at `bad_at` is the bad one: it alone fails, with `error_start`.
    Returns its record."""
    code, records, err = generate(model, b"\n".join(lines) + b"\n", **kw)
    assert code == EXIT_REQUEST_FAILED and "Traceback" not in err, err
    assert len(records) == len(GOOD) + 1
    bad = records[bad_at]
    assert bad["finish_reason"] == "error" and bad["error"].startswith(error_start), bad["error"]
    assert bad["token_ids"] == []
    good = [r for i, r in enumerate(records) if i != bad_at]
    assert [r["error"] for r in good] == [None] * len(GOOD)
    # The good lines give no id: each record's is its index.
    assert [r["id"] for r in good] == [str(r["index"]) for r in good]
    assert [r["token_ids"] for r in good] == good_tokens  # exactly as in a run without the bad line
    return bad


# ----------------------------------------------------------------------------- stop, stop_token_ids

not_a_stop_list = (
    st.integers()
    | st.floats()
    | st.booleans()
    | st.dictionaries(st.text(max_size=3), json_scalars)
    | st.lists(json_values, min_size=1).filter(
        lambda v: not all(isinstance(s, str) and s for s in v)
    )
)
not_a_token_id_list = (
    st.text()
    | st.integers()
    | st.floats()
    | st.booleans()
    | st.dictionaries(st.text(max_size=3), json_scalars)
    | st.lists(json_values, min_size=1).filter(
        lambda v: not all(type(t) is int and t >= 0 for t in v)
    )
)


@settings(max_examples=300, deadline=None)
@given(stop=not_a_stop_list, ids=not_a_token_id_list)
def test_a_wrong_typed_stop_or_stop_token_ids_is_a_request_error(stop, ids):
    with pytest.raises(RequestError, match="^stop must be a list of non-empty strings, got "):
        SamplingParams(stop=stop, temperature=0.0, max_tokens=64)
    with pytest.raises(RequestError, match="^stop_token_ids must be a list of token ids, got "):
        SamplingParams(stop_token_ids=ids, temperature=0.0, max_tokens=64)


def test_good_stops_still_become_tuples():
    assert SamplingParams(stop="\n", temperature=0.0, max_tokens=64).stop == (
        "\n",
    ) and SamplingParams(stop=["a", "b"], temperature=0.0, max_tokens=64).stop == (
        "a",
        "b",
    )
    assert SamplingParams(
        stop=None, stop_token_ids=None, temperature=0.0, max_tokens=64
    ) == SamplingParams(temperature=0.0, max_tokens=64)
    assert SamplingParams(stop_token_ids=[3, 4], temperature=0.0, max_tokens=64).stop_token_ids == (
        3,
        4,
    )
    hash(SamplingParams(stop=["x"], stop_token_ids=[1], temperature=0.0, max_tokens=64))
    with pytest.raises(
        RequestError, match=r"got \[''\]$"
    ):  # the message of an existing bad line, unchanged
        SamplingParams(stop=[""], temperature=0.0, max_tokens=64)


@CLI
@given(
    field=st.sampled_from(["stop", "stop_token_ids"]), data=st.data(), at=st.integers(0, len(GOOD))
)
def test_a_wrong_typed_stop_fails_its_line_alone(tiny_lm, good_tokens, field, data, at):
    value = data.draw(not_a_stop_list if field == "stop" else not_a_token_id_list)
    lines = jsonl({"prompt": p} for p in GOOD)
    lines.insert(at, json.dumps({"prompt": "To be", field: value}).encode())
    check_bad_line_alone(
        tiny_lm, good_tokens, lines, at, f"line {at + 1}: {field} must be a list of "
    )


# ----------------------------------------------------------------------------- fields of the wrong JSON type


def is_integer(value) -> bool:
    return type(value) is int  # a JSON integer; true and false are no numbers


def is_number(value) -> bool:
    return type(value) in (int, float)


def is_token_id_list(value) -> bool:
    return isinstance(value, list) and all(is_integer(t) for t in value)


# The JSON types each field of a line takes, written out here from docs/generate.md and the fields' meanings (not
# read from minirt): "prompt" a string or token ids, "id" a string or an integer, each sampling field its own.
# A value of any other type is a wrong type; a right type with a bad value (an empty stop string, a temperature
# of -1) is a bad value, tested elsewhere.
ACCEPTS = {
    "prompt": lambda v: isinstance(v, str) or is_token_id_list(v),
    "id": lambda v: isinstance(v, str) or is_integer(v),
    "max_tokens": is_integer,
    # The same field, by its other name (Hugging Face's).
    "max_new_tokens": is_integer,
    "top_k": is_integer,
    "n": is_integer,
    "seed": lambda v: v is None or is_integer(v),
    "logprobs": lambda v: v is None or is_integer(v),
    "temperature": is_number,
    "top_p": is_number,
    "min_p": is_number,
    "repetition_penalty": is_number,
    "presence_penalty": is_number,
    "frequency_penalty": is_number,
    "ignore_eos": lambda v: isinstance(v, bool),
    "prompt_logprobs": lambda v: v is None or is_integer(v),
    "stop": lambda v: (
        v is None
        or isinstance(v, str)
        or isinstance(v, list)
        and all(isinstance(x, str) for x in v)
    ),
    "stop_token_ids": lambda v: v is None or is_token_id_list(v),
    "logit_bias": lambda v: v is None or isinstance(v, (dict, list)),
}


def test_the_table_of_types_covers_every_field_a_line_may_set():
    assert set(ACCEPTS) == {"prompt", "id", "max_new_tokens", *FIELD_NAMES}


def strings_of(value) -> list[str]:
    """Every string inside a record's value (the record is JSON: strings, numbers, lists, objects)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [key, *strings_of(item)]]
    if isinstance(value, list):
        return [s for item in value for s in strings_of(item)]
    return []


def check_a_wrong_typed_field_fails_alone(tiny_lm, good_tokens, field: str, value, at: int) -> None:
    """A line whose `field` holds `value`, of a type the field never takes, inserted at `at` among the good
    lines: it alone fails, naming the field and showing the value in JSON, and no Python spelling of the value
    appears anywhere in its record."""
    bad_line = {"prompt": "To be", "id": "bad", field: value}
    lines = jsonl({"prompt": p} for p in GOOD)
    lines.insert(at, json.dumps(bad_line).encode())
    bad = check_bad_line_alone(tiny_lm, good_tokens, lines, at, f"line {at + 1}: ")
    said = bad["error"].removeprefix(f"line {at + 1}: ")
    # It names the field first, as the line spells it.
    assert said.startswith((f'"{field}" ', f"{field} ")), said
    # It shows the value as the line wrote it, in JSON (a long one cut short, ending in "...").
    shown = said.partition(", got ")[2]
    written = json.dumps(value, ensure_ascii=False)
    assert shown == written or (shown.endswith("...") and written.startswith(shown[:-3])), said
    # The record's id: the line's own, unless the id is what is wrong; then the default, its index.
    assert bad["id"] == (str(at) if field == "id" else "bad")
    # Python's spelling of the value ({'a': 1}, True, None, 'text') appears nowhere in the record.
    python_spelling = repr(value)
    if python_spelling != written:
        assert not [s for s in strings_of(bad) if python_spelling in s], (python_spelling, bad)


# One value of each JSON type, and lists and objects holding each: every field is tried with every type it
# does not take, whatever the random draws below happen to try.
EVERY_TYPE = [None, True, 7, 1.5, "text", ["a"], [True], {"a": 1}]
WRONG_TYPED = [
    (field, value) for field in sorted(ACCEPTS) for value in EVERY_TYPE if not ACCEPTS[field](value)
]


@pytest.mark.parametrize(
    "field, value",
    WRONG_TYPED,
    ids=[f"{field}={json.dumps(value)}" for field, value in WRONG_TYPED],
)
def test_each_wrong_json_type_of_each_field_fails_its_line_alone(
    tiny_lm, good_tokens, field, value
):
    check_a_wrong_typed_field_fails_alone(tiny_lm, good_tokens, field, value, at=1)


# Nested and odd values too, for every field: 10 draws each (the values above already try every type).
@pytest.mark.parametrize("field", sorted(ACCEPTS))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), at=st.integers(0, len(GOOD)))
def test_a_field_of_the_wrong_json_type_fails_its_line_alone_and_no_record_holds_a_python_repr(
    tiny_lm, good_tokens, field, data, at
):
    value = data.draw(json_values.filter(lambda v: not ACCEPTS[field](v)), label="value")
    check_a_wrong_typed_field_fails_alone(tiny_lm, good_tokens, field, value, at)


@settings(max_examples=300, deadline=None)
@given(request_id=json_values)
def test_an_id_is_kept_exactly_as_a_string_or_an_integer_and_refused_as_anything_else(request_id):
    entry = prompt_file.parse_jsonl_object(4, {"prompt": "To be", "id": request_id})
    if isinstance(request_id, str):
        assert (entry.id, entry.error) == (request_id, None)  # "" too
    elif is_integer(request_id):
        assert (entry.id, entry.error) == (f"{request_id:d}", None)  # 0 too: "0"
    else:
        assert entry.id is None  # the record takes its index, never a repr of the value
        assert entry.error == (
            'line 4: "id" must be a string or an integer (leave it out and the request is named by '
            f"its index), got {prompt_file.json_text(request_id)}"
        )
        assert entry.prompt == "To be"  # the good prompt stays in the record


def test_falsy_but_valid_ids_and_an_empty_prompt_are_kept_as_given(tiny_lm):
    """`"id": 0` and `"id": ""` are ids, not "no id": a record keeps them, never its index instead; and an empty
    prompt is a prompt (it starts from BOS, as the token-id prompt [BOS] does), not a missing one."""
    bos = json.loads((tiny_lm / "config.json").read_text())["bos_token_id"]
    lines = [
        {"prompt": "To be", "id": "x"},
        {"prompt": "To be", "id": ""},
        {"prompt": "To be", "id": 0},
        {"prompt": "To be", "id": -7},
        {"prompt": "To be"},
        {"prompt": "", "id": "empty"},
        {"prompt": [bos], "id": "bos"},
    ]
    code, records, err = generate(tiny_lm, b"\n".join(jsonl(lines)) + b"\n")
    assert code == 0, err
    assert [r["id"] for r in records] == ["x", "", "0", "-7", "4", "empty", "bos"]
    assert [r["error"] for r in records] == [None] * len(lines)
    assert records[5]["prompt"] == "" and records[5]["token_ids"] == records[6]["token_ids"]


def test_a_falsy_sampling_field_of_a_line_overrides_the_flags(tiny_lm, good_tokens):
    """`"temperature": 0` is greedy, not "no temperature given": under --temperature 1.5 such lines give the
    greedy run's tokens, and the same lines without it give other tokens (the flag does change them)."""
    flags = ("--temperature", "1.5", "--seed", "3")
    hot_lines = b"\n".join(jsonl({"prompt": p} for p in GOOD)) + b"\n"
    _, hot, _ = generate(tiny_lm, hot_lines, flags=flags)
    greedy_lines = b"\n".join(jsonl({"prompt": p, "temperature": 0} for p in GOOD)) + b"\n"
    code, greedy, err = generate(tiny_lm, greedy_lines, flags=flags)
    assert code == 0, err
    assert [r["token_ids"] for r in greedy] == good_tokens
    assert [r["token_ids"] for r in hot] != good_tokens


def test_an_integer_too_long_to_read_fails_its_line_alone(tiny_lm, good_tokens):
    lines = jsonl({"prompt": p} for p in GOOD)
    lines.insert(1, b'{"prompt": "To be", "seed": ' + b"7" * 5000 + b"}")
    check_bad_line_alone(
        tiny_lm, good_tokens, lines, 1, "line 2: an integer too long to read (thousands of digits)"
    )


def test_a_line_that_is_no_object_is_told_in_json_words(tiny_lm, good_tokens):
    lines = jsonl({"prompt": p} for p in GOOD)
    lines.insert(2, b"null")
    check_bad_line_alone(
        tiny_lm, good_tokens, lines, 2, 'line 3: expected a JSON object with a "prompt", got null'
    )


# ----------------------------------------------------------------------------- lone surrogates

surrogates = st.integers(0xD800, 0xDFFF).map(chr)


@CLI
@given(
    where=st.sampled_from(["prompt", "id", "stop", "stop nested", "field name"]),
    surrogate=surrogates,
    cut=st.integers(0, 5),
    at=st.integers(0, len(GOOD)),
)
def test_a_lone_surrogate_fails_its_line_alone(tiny_lm, good_tokens, where, surrogate, cut, at):
    text = "To be or"[:cut] + surrogate + "To be or"[cut:]
    obj = {"prompt": "To be", "id": "q", "stop": ["\n"]}
    field = f'"{where}"'
    if where in ("prompt", "id", "stop"):
        obj[where] = [text] if where == "stop" else text
    elif where == "stop nested":
        obj["stop"], field = ["\n", [[text]]], '"stop"'
    else:
        obj[text], field = 1, "a field name"
    lines = jsonl({"prompt": p} for p in GOOD)
    lines.insert(
        at, json.dumps(obj).encode()
    )  # ensure_ascii: the surrogate travels as a \\udXXX escape
    assert b"\\ud" in lines[at]
    check_bad_line_alone(
        tiny_lm,
        good_tokens,
        lines,
        at,
        f"line {at + 1}: {field} is not valid Unicode (a lone surrogate)",
    )


def test_a_surrogate_pair_is_one_good_character(tiny_lm):
    code, records, _ = generate(
        tiny_lm, json.dumps({"prompt": "To be \U0001f600", "id": "\U0001f600"}).encode()
    )
    assert code == 0 and records[0]["id"] == "\U0001f600" and records[0]["error"] is None


# ----------------------------------------------------------------------------- bytes that are not UTF-8


def not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


bad_bytes = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"\n" not in b and b"\r" not in b and not_utf8(b)
)


@CLI
@given(
    junk=bad_bytes, at=st.integers(0, len(GOOD)), how=st.sampled_from(["stdin", ".txt", ".jsonl"])
)
def test_a_line_that_is_not_utf8_fails_alone(tiny_lm, good_tokens, junk, at, how):
    lines = list(map(str.encode, GOOD)) if how == ".txt" else jsonl({"prompt": p} for p in GOOD)
    lines.insert(at, junk)
    check_bad_line_alone(
        tiny_lm,
        good_tokens,
        lines,
        at,
        f"line {at + 1}: not UTF-8 text (bad byte at offset ",
        suffix=how if how != "stdin" else ".jsonl",
        stdin=how == "stdin",
    )


def test_a_file_where_no_line_decodes_is_refused_whole_but_stdin_line_by_line(tiny_lm):
    junk = b"\xff\xfe bad\n\n\x80 worse\n"
    code, records, err = generate(tiny_lm, junk, suffix=".txt")
    assert code == EXIT_USAGE and records == [] and len(err.strip().splitlines()) == 1
    assert "not UTF-8 text (bad byte at offset 0); save it as UTF-8" in err
    code, records, err = generate(tiny_lm, junk, stdin=True)
    assert code == EXIT_REQUEST_FAILED and [r["error"] for r in records] == [
        "line 1: not UTF-8 text (bad byte at offset 0 of the line); save it as UTF-8",
        "line 3: not UTF-8 text (bad byte at offset 0 of the line); save it as UTF-8",
    ]


# ----------------------------------------------------------------------------- huge lines


@pytest.mark.parametrize("how", ["stdin", ".txt", ".jsonl"])
def test_a_huge_line_fails_alone(tiny_lm, good_tokens, how):
    huge = b"x" * (3 * MAX_LINE_BYTES)
    lines = list(map(str.encode, GOOD)) if how == ".txt" else jsonl({"prompt": p} for p in GOOD)
    lines.insert(1, huge if how == ".txt" else json.dumps({"prompt": huge.decode()}).encode())
    check_bad_line_alone(
        tiny_lm,
        good_tokens,
        lines,
        1,
        f"line 2: longer than {MAX_LINE_BYTES} bytes, the most a line may hold; shorten it",
        suffix=how if how != "stdin" else ".txt",
        stdin=how == "stdin",
    )


def test_a_huge_line_is_read_past_without_being_held(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b"first\n" + b"y" * (40 * MAX_LINE_BYTES) + b"\r\nlast\n")
    tracemalloc.start()
    try:
        entries = read_prompts(str(prompts))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(e.line, e.prompt, e.error is None) for e in entries] == [
        (1, "first", True),
        (2, None, False),
        (3, "last", True),
    ]
    assert peak < 8 * MAX_LINE_BYTES  # a 40 MiB line, never held whole


@pytest.mark.parametrize("extra", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_the_limit_counts_the_line_without_its_ending(tmp_path, extra, ending):
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b"a" + ending + b"z" * (MAX_LINE_BYTES + extra) + ending + b"b" + ending)
    entries = read_prompts(str(prompts))
    assert [e.line for e in entries] == [1, 2, 3] and entries[2].prompt == "b"
    assert (entries[1].error is None) == (extra <= 0)


# ----------------------------------------------------------------------------- normal files read as before

line_texts = st.text(
    alphabet=st.sampled_from(list("ab{} \\\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029é\U0001f600")),
    max_size=40,
)


def editor_lines(text: str) -> list[str]:
    """The lines of a text as JSON Lines defines them: ended by \\n or \\r\\n, and by nothing else."""
    return re.split("\r?\n", text)


@settings(max_examples=300, deadline=None)
@given(text=line_texts, chunk=st.integers(1, 9))
def test_lines_are_numbered_as_an_editor_numbers_them(text, chunk):
    with mock.patch.object(
        prompt_file, "READ_CHUNK", chunk
    ):  # every chunk boundary, \r\n split across two
        lines, first_bad = numbered_lines(io.BytesIO(text.encode("utf-8")))
    got = [(line.number, line.text) for line in lines if line.text.strip()]
    assert got == [(n, t) for n, t in enumerate(editor_lines(text), start=1) if t.strip()]
    assert first_bad is None and all(line.error is None for line in lines)


# ----------------------------------------------------------------------------- characters str.splitlines splits at

NOT_LINE_ENDINGS = (
    "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines ends a line at each; a file does not
)
plain_texts = st.text(
    alphabet=st.sampled_from(list('ab \t\\{}"é\U0001f600' + NOT_LINE_ENDINGS)), max_size=8
)
endings = st.sampled_from(["\n", "\r\n"])
odd_prompts = st.builds(
    lambda a, odd, b: a + odd + b, plain_texts, st.sampled_from(NOT_LINE_ENDINGS), plain_texts
)


def txt_line(prompt: str) -> str:
    """A prompt as a .txt line: its backslashes, newlines and tabs escaped."""
    return prompt.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


@settings(max_examples=300, deadline=None)
@given(data=st.data(), how=st.sampled_from([".jsonl", ".txt", "stdin"]))
def test_a_prompt_holding_a_character_str_splitlines_splits_at_is_one_request(
    tmp_path_factory, data, how
):
    """Each prompt is one line (JSONL written by json.dumps(ensure_ascii=False), or escaped .txt; standard input
    carries JSONL), after 0-2 blank lines, each line ended by \\n or \\r\\n at random."""
    prompts = data.draw(
        st.lists(odd_prompts | st.builds(lambda p: p + "\n\r", odd_prompts), min_size=1, max_size=5)
    )  # "\n\r" inside a prompt: escaped, so no line ending either
    if (
        how == ".txt"
    ):  # a .txt line that is all spaces is blank; one ending in \r would lose it to a \r\n
        prompts = [p + "x" for p in prompts]
    text, expected = "", []
    for i, prompt in enumerate(prompts):
        for _ in range(data.draw(st.integers(0, 2), label="blank lines")):
            text += data.draw(st.sampled_from(["", " "])) + data.draw(endings)
        number = len(editor_lines(text))  # the lines so far, and the one about to start
        expected.append((number, prompt, None if how == ".txt" else str(i)))
        line = (
            txt_line(prompt)
            if how == ".txt"
            else json.dumps({"prompt": prompt, "id": str(i)}, ensure_ascii=False)
        )
        text += line + data.draw(endings)
    if how == "stdin":
        with mock.patch.object(sys, "stdin", BytesStdin(text.encode("utf-8"))):
            entries = read_prompts("-")
    else:
        source = tmp_path_factory.getbasetemp() / f"odd{how}"
        source.write_bytes(text.encode("utf-8"))
        entries = read_prompts(str(source))
    assert [(e.line, e.prompt, e.id) for e in entries] == expected
    assert all(e.error is None for e in entries)


def test_a_prompt_holding_u2028_runs_as_one_request_and_later_lines_keep_their_numbers(tiny_lm):
    prompts = ["To be\u2028or not", "All the\x85world", "Now\u2029is\x0cthe winter"]
    lines = [
        json.dumps({"prompt": p, "id": f"q{i}"}, ensure_ascii=False).encode()
        for i, p in enumerate(prompts)
    ]
    code, records, err = generate(tiny_lm, b"\r\n".join(lines + [b'{"prompt": 5}']) + b"\n")
    assert code == EXIT_REQUEST_FAILED and "Traceback" not in err, err
    assert [(r["id"], r["prompt"], r["error"]) for r in records] == [
        ("q0", prompts[0], None),
        ("q1", prompts[1], None),
        ("q2", prompts[2], None),
        ("3", None, 'line 4: "prompt" must be a string (or a list of token ids), got 5'),
    ]  # a record's id: its index
    code, records, _ = generate(tiny_lm, "\n".join(prompts).encode(), suffix=".txt")
    assert code == 0 and [r["prompt"] for r in records] == prompts


def test_a_lone_carriage_return_ends_no_line(tmp_path):
    """JSON Lines ends a line at \\n alone: a lone \\r stays in a .txt prompt, and in JSONL it is whitespace."""
    txt = tmp_path / "p.txt"
    txt.write_bytes(b"To be\ror not\x0cto be\r\nlast\r\r\n")
    assert [(e.line, e.prompt) for e in read_prompts(str(txt))] == [
        (1, "To be\ror not\x0cto be"),
        (2, "last\r"),
    ]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(b'{"prompt": "a",\r"id": "x"}\r\n{"prompt": "b"}\r{"prompt": "c"}\n')
    first, second = read_prompts(str(jsonl))
    assert (first.line, first.prompt, first.id, first.error) == (1, "a", "x", None)
    assert second.line == 2 and second.error.startswith("line 2: not valid JSON (Extra data")


def test_a_text_stdin_without_bytes_beneath_still_works(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("To be\n\nAll the world\n"))
    assert [(e.line, e.prompt) for e in read_prompts("-")] == [(1, "To be"), (3, "All the world")]


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_a_byte_order_mark_at_the_start_is_skipped(tiny_lm, suffix, stdin):
    """Some Windows editors start a UTF-8 file with EF BB BF.  Before, it broke line 1 of a .jsonl file ("not
    valid JSON") and stayed as U+FEFF at the start of a .txt prompt.  Only the very first one is a mark: a
    U+FEFF inside a later line is that line's text and stays."""
    bom = b"\xef\xbb\xbf"
    lines = (
        [b'{"prompt": "To be"}', b'{"prompt": "\xef\xbb\xbfShall I"}']
        if suffix == ".jsonl"
        else [b"To be", b"\xef\xbb\xbfShall I"]
    )
    code, records, _ = generate(
        tiny_lm, bom + b"\n".join(lines) + b"\n", suffix=suffix, stdin=stdin
    )
    assert code == 0 and [r["error"] for r in records] == [None, None]
    assert [r["prompt"] for r in records] == ["To be", "\ufeffShall I"]
    _, plain, _ = generate(tiny_lm, b"\n".join(lines) + b"\n", suffix=suffix, stdin=stdin)
    assert [r["token_ids"] for r in records] == [
        r["token_ids"] for r in plain
    ]  # as if the mark were not there
