"""Counts that can never work are refused as flags, and a huge batch size costs nothing.

`python -m minirt.rounds` refuses a batch size, KV budget or round token budget below 1, a --batch-sizes list
holding one, a negative --seed, a list with an empty item (4,,8), an output or prompt length above MAX_LENGTH and
a --workload above MAX_WORKLOAD, before it simulates anything: one line on stderr, exit 2.  A batch size of
10**9 with a few requests allocates nothing per requested row: neither `rounds` nor the engine's continuous
pool, whose rows never outnumber the requests it could ever hold.
"""

import contextlib
import io
import json
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_request, random_model, serve_all
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.model.gpt2 import GPT2
from minirt.rounds import MAX_LENGTH, MAX_WORKLOAD, main, parse_lengths
from minirt.engine.params import SamplingParams
from conftest import completions

FAST = settings(max_examples=60, deadline=None)
not_a_count = st.integers(-(10**12), 0)


def rounds(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m minirt.rounds`, run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_command(main, argv, prog="minirt.rounds")
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def assert_one_line_refusal(argv: list[str], fragment: str) -> None:
    code, out, err = rounds(argv)
    assert code == EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and err.startswith("minirt.rounds: error: ") and fragment in err, (
        err
    )
    assert "Traceback" not in err


@FAST
@given(
    flag=st.sampled_from(["--batch-size", "--max-round-tokens"]),
    value=not_a_count,
    source=st.sampled_from([["--lengths", "2,5"], ["--workload", "3"]]),
)
def test_a_count_below_one_is_one_line(flag, value, source):
    assert_one_line_refusal(source + [flag, str(value)], f"{flag} must be at least 1, got {value}")


@FAST
@given(
    sizes=st.lists(st.integers(-5, 9), min_size=1, max_size=5).filter(lambda v: min(v) < 1),
    source=st.sampled_from([["--lengths", "2,5"], ["--workload", "3"]]),
)
def test_batch_sizes_holding_a_zero_are_one_line(sizes, source):
    text = ",".join(map(str, sizes))
    assert_one_line_refusal(
        source + [f"--batch-sizes={text}"],
        f"--batch-sizes: every batch size must be an integer >= 1, got {text!r}",
    )


@pytest.mark.parametrize(
    "budget, fragment",
    [
        ("0", "a number of tokens must be a whole number >= 1"),
        ("-3", "expected a number of tokens"),
        ("2.5", "a number of tokens must be a whole number >= 1"),
        ("x", "expected a number of tokens"),
        ("512MiB", "give a number of tokens (2048) here, not a memory size"),
    ],
)  # no model: tokens only
def test_a_kv_budget_that_is_not_a_number_of_tokens_is_one_line(budget, fragment):
    assert_one_line_refusal(
        ["--lengths", "2,5", f"--kv-budget={budget}"], f"--kv-budget: {fragment}"
    )


def test_a_kv_budget_in_tokens_means_the_same_in_rounds_and_generate(tiny_lm):
    """`--kv-budget 9` is 9 KV positions in both: the same groups form in a simulation and in a real run."""
    from minirt import LLM, SamplingParams

    llm = LLM(tiny_lm, batch_size=3, kv_budget_tokens=9)
    assert llm.engine.kv_budget_positions == 9
    outputs = completions(
        llm.generate(
            [[1], [2], [3]], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
        )
    )
    code, out, _ = rounds(["--lengths", "4,4,4", "--batch-size", "3", "--kv-budget", "9", "--json"])
    static = json.loads(out)["policies"]["static"]["requests"]
    assert code == 0 and [o.first_round for o in outputs] == [r["first_round"] for r in static] == [
        1,
        1,
        5,
    ]


def test_batch_sizes_that_are_not_integers_and_a_negative_seed_are_one_line():
    assert_one_line_refusal(
        ["--workload", "3", "--batch-sizes", "4,x"], "--batch-sizes: expected comma-separated"
    )
    assert_one_line_refusal(
        ["--workload", "3", "--seed", "-1"], "--seed must be an integer >= 0, got -1"
    )


def test_existing_refusals_keep_their_words():
    assert_one_line_refusal(
        ["--lengths", "2,5", "--batch-size", "0"], "--batch-size must be at least 1, got 0"
    )
    code, _, err = rounds(["--lengths", "2,0"])  # argparse's: usage, then the error
    assert (
        code == EXIT_USAGE
        and "argument --lengths: every length must be an integer >= 1, got '2,0'" in err
    )


# ----------------------------------------------------------------------------- empty items, caps

LIST_FLAGS = {
    "--lengths": ["--batch-size", "2"],
    "--prompt-lengths": ["--lengths", "2,5,3"],
    "--batch-sizes": ["--workload", "3"],
}  # each list flag, beside what makes the rest of a good command


@FAST
@given(
    flag=st.sampled_from(sorted(LIST_FLAGS)),
    values=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_list_with_an_empty_item_is_one_line(flag, values, data):
    items = [str(v) for v in values]
    for _ in range(
        data.draw(st.integers(1, 2), label="empty items")
    ):  # anywhere: first, between, last
        items.insert(data.draw(st.integers(0, len(items))), data.draw(st.sampled_from(["", " "])))
    text = ",".join(items)
    assert_one_line_refusal(
        LIST_FLAGS[flag] + [f"{flag}={text}"],
        f"{flag}: {text!r} has an empty item (two commas in a row, or one at an end)",
    )


@FAST
@given(
    flag=st.sampled_from(["--lengths", "--prompt-lengths"]),
    values=st.lists(st.integers(1, 9), max_size=3),
    huge=st.integers(MAX_LENGTH + 1, 10**40),
    at=st.integers(0, 3),
)
def test_a_length_above_the_cap_is_one_line(flag, values, huge, at):
    values.insert(min(at, len(values)), huge)
    argv = LIST_FLAGS[flag] + [flag, ",".join(map(str, values))]
    assert_one_line_refusal(argv, f"{flag}: every length must be at most {MAX_LENGTH}, got {huge}")


@FAST
@given(n=st.integers(MAX_WORKLOAD + 1, 10**40))
def test_a_workload_above_the_cap_is_one_line(n):
    assert_one_line_refusal(
        ["--workload", str(n)], f"--workload takes at most {MAX_WORKLOAD} requests, got {n}"
    )


def test_the_caps_themselves_are_allowed_and_named_in_help():
    assert parse_lengths(f"{MAX_LENGTH},1", "--lengths") == [
        MAX_LENGTH,
        1,
    ]  # a run of it would take seconds
    code, out, err = rounds(
        [
            "--lengths",
            "2",
            "--prompt-lengths",
            str(MAX_LENGTH),
            "--max-round-tokens",
            str(MAX_LENGTH),
            "--json",
        ]
    )
    assert code == EXIT_OK and err == ""
    assert json.loads(out)["policies"]["continuous"]["total_rounds"] == 2
    code, out, _ = rounds(["--help"])
    assert code == EXIT_OK and f"at most {MAX_LENGTH}" in out and f"N <= {MAX_WORKLOAD}" in out
    assert (
        "--workload needs at least 1 request, got 0" in rounds(["--workload", "0"])[2]
    )  # kept as it was
    assert (
        "must be an integer >= 1, got '2,,0'" in rounds(["--lengths", "2,,0"])[2]
    )  # the first refusal, as before


# ----------------------------------------------------------------------------- huge batch sizes


def test_a_huge_batch_size_finishes_at_once():
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "minirt.rounds", "--lengths", "2,5", "--batch-size", "1000000000"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert time.perf_counter() - start < 10 and "total rounds 5" in result.stdout


@FAST
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6), huge=st.integers(7, 10**12))
def test_a_huge_batch_size_gives_the_rounds_of_one_row_per_request(lengths, huge):
    def report(batch_size):
        code, out, _ = rounds(
            ["--lengths", ",".join(map(str, lengths)), "--batch-size", str(batch_size), "--json"]
        )
        assert code == EXIT_OK
        return {name: policy["requests"] for name, policy in json.loads(out)["policies"].items()}

    assert report(huge) == report(len(lengths))


@pytest.fixture(scope="module")
def model():
    return random_model(seed=3, vocab_size=60, n_positions=32)


@settings(max_examples=20, deadline=None)
@given(
    n_requests=st.integers(1, 5),
    batch_size=st.sampled_from([6, 1000, 10**9]),
    policy=st.sampled_from(["static", "continuous"]),
)
def test_the_kv_cache_never_has_more_slots_than_requests(model, n_requests, batch_size, policy):
    sizes = []
    original = GPT2.new_kv_cache
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    prompts = [[1 + i, 2 + i] for i in range(n_requests)]

    def serve(engine):
        requests = [make_request(engine, i, p, params) for i, p in enumerate(prompts)]
        stats = serve_all(engine, requests)
        return [r.token_ids for r in requests], stats

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            GPT2,
            "new_kv_cache",
            lambda self, n_slots, capacity: (
                sizes.append(n_slots) or original(self, n_slots, capacity)
            ),
        )
        tokens, stats = serve(
            Engine(
                ModelRunner(model), None, batch_size=batch_size, policy=policy, kv_budget_mib=10**6
            )
        )
    assert (
        sizes and max(sizes) <= n_requests
    )  # at most 2 slots for 2 requests, whatever the batch size
    assert stats.kv_limited_rows == []  # nothing held the pool down but the queue
    same, _ = serve(Engine(ModelRunner(model), None, batch_size=n_requests, policy=policy))
    assert tokens == same


def test_generate_with_a_huge_batch_size_allocates_two_slots(tiny_lm, tmp_path, monkeypatch):
    from minirt.generate import main as generate

    sizes = []
    original = GPT2.new_kv_cache
    monkeypatch.setattr(
        GPT2,
        "new_kv_cache",
        lambda self, n_slots, capacity: sizes.append(n_slots) or original(self, n_slots, capacity),
    )
    (tmp_path / "p.txt").write_text("To be\nAll the world\n")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = run_command(
            generate,
            [
                "--model",
                str(tiny_lm),
                "--backend",
                "numpy",
                "--max-new-tokens",
                "3",
                "--prompts",
                str(tmp_path / "p.txt"),
                "--batch-size",
                "1000000000",
                "--policy",
                "continuous",
                "--kv-budget",
                "1000000MiB",
            ],
            prog="minirt.generate",
        )
    assert code == EXIT_OK and sizes == [2]
