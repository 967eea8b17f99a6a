"""`python -m minirt.generate`: prompts files, records, exit codes, one-line errors, interruption."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from minirt.cli.command import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REQUEST_FAILED,
    EXIT_USAGE,
    run_command,
)
from minirt.cli.progress import Progress
from minirt.cli.prompt_file import read_prompts, unescape_txt
from minirt.generate import main
from minirt.generate import main as generate_main
from minirt.model.gpt2 import GPT2

REQUIRED_FIELDS = {
    "index",
    "id",
    "prompt",
    "text",
    "token_ids",
    "finish_reason",
    "group",
    "rounds_waited",
    "first_round",
    "finish_round",
    "error",
}


def run(argv, capsys):
    code = run_command(main, argv, prog="minirt.generate")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_txt_escapes():
    assert (
        unescape_txt(r"line one\nline two\tand a \\n literal, a \q stays")
        == "line one\nline two\tand a \\n literal, a \\q stays"
    )


def test_txt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first\n\n  \nsecond\\nwith newline\n")
    entries = read_prompts(str(f))
    assert [e.prompt for e in entries] == ["first", "second\nwith newline"]
    assert [e.line for e in entries] == [1, 4]


def test_jsonl_file_good_and_bad_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "a", "id": "x", "max_new_tokens": 3, "stop": ["\n"]}),
                "{not json",
                json.dumps({"id": 7}),
                json.dumps({"prompt": "b", "temprature": 1}),
                json.dumps(["a list"]),
                json.dumps({"prompt": [1, 2, 3]}),
            ]
        )
        + "\n"
    )
    entries = read_prompts(str(f))
    assert entries[0].error is None and entries[0].id == "x"
    assert entries[0].overrides == {"max_new_tokens": 3, "stop": ["\n"]}
    assert "line 2: not valid JSON" in entries[1].error
    assert 'line 3: no "prompt"' in entries[2].error and entries[2].id == "7"
    assert "unknown field temprature" in entries[3].error
    assert "expected a JSON object" in entries[4].error
    assert entries[5].error is None and entries[5].prompt == [1, 2, 3]


def test_records_in_input_order_with_every_field(tiny_lm, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "To be", "id": "a", "max_new_tokens": 9},
        {"prompt": "Shall I", "max_new_tokens": 2},
        {"prompt": "All the", "max_new_tokens": 5, "temperature": 0.8, "seed": 3},
        {"prompt": "x" * 300},
        {"prompt": "Now is", "max_new_tokens": 1},
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out_file = tmp_path / "out.jsonl"
    code, out, err = run(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--batch-size",
            "2",
            "--output",
            str(out_file),
            "--logprobs",
            "--ignore-eos",
            "--trace",
            "--backend",
            "numpy",
        ],
        capsys,
    )
    assert code == EXIT_REQUEST_FAILED  # one prompt is too long for the 64-position context
    records = read_records(out_file)
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4]
    assert all(REQUIRED_FIELDS <= set(r) for r in records)
    assert [r["id"] for r in records] == ["a", "1", "2", "3", "4"]
    assert [len(r["token_ids"]) for r in records] == [9, 2, 5, 0, 1]
    assert (
        records[3]["error"]
        and "context of 64" in records[3]["error"]
        and records[3]["finish_reason"] == "error"
    )
    assert all(
        len(r["logprobs"]) == len(r["token_ids"]) and all(lp <= 0 for lp in r["logprobs"])
        for r in records
    )
    # groups of 2 in arrival order; the refused request takes no row
    served = [r for r in records if not r["error"]]
    assert [
        (r["group"], r["first_round"], r["finish_round"], r["rounds_waited"]) for r in served
    ] == [(1, 1, 9, 0), (1, 1, 2, 0), (2, 10, 14, 9), (2, 10, 10, 9)]
    assert (
        out.index("### [0] a")
        < out.index("### [1]")
        < out.index("### [3]: error")
        < out.index("### [4]")
    )
    assert (
        "requests     5 (4 ok, 1 failed)" in err and "groups       2 (static, batch size 2)" in err
    )
    assert "rounds       14" in err
    assert "utilization  60.7% active rows (17 of 28 row-rounds)" in err
    assert (
        "group 1: 2 members, rounds 1-9" in err
        and "waiting through all 9 rounds of this group: [2]" in err
    )


def test_stdin_txt_and_success_exit(tiny_lm, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("To be\nAll the world\n"))
    code, out, err = run(
        ["--model", str(tiny_lm), "--prompts", "-", "--max-new-tokens", "3", "--backend", "numpy"],
        capsys,
    )
    assert code == EXIT_OK
    assert out.count("### ") == 2 and "requests     2 (2 ok, 0 failed)" in err


def test_flags_are_defaults_and_jsonl_fields_override_them(tiny_lm, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "To be"})
        + "\n"
        + json.dumps({"prompt": "To be", "max_new_tokens": 2})
        + "\n"
    )
    out_file = tmp_path / "o.jsonl"
    code, _, _ = run(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "6",
            "--ignore-eos",
            "--output",
            str(out_file),
            "--quiet",
        ],
        capsys,
    )
    assert code == EXIT_OK
    assert [len(r["token_ids"]) for r in read_records(out_file)] == [6, 2]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--prompts", "/no/such/file.txt"], "does not exist"),
        (["--prompts", "{prompts}", "--model", "/no/such/model"], "does not exist"),
        (
            ["--prompts", "{prompts}", "--temperature", "-1"],
            "bad sampling flag --temperature -1.0: temperature must be",
        ),
        (["--prompts", "{prompts}", "--top-p", "2"], "top_p"),
        (["--prompts", "{prompts}", "--batch-size", "0"], "--batch-size"),
        (["--prompts", "{prompts}", "--output", "/no/such/dir/out.jsonl"], "cannot write --output"),
        (["--prompts", "{empty}"], "holds no prompts"),
        (["--prompts", "{binary}"], "not UTF-8"),
    ],
)
def test_bad_files_and_flags_are_one_line(tiny_lm, tmp_path, capsys, argv, fragment):
    (tmp_path / "p.txt").write_text("hello\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    argv = [
        a.format(
            prompts=tmp_path / "p.txt", empty=tmp_path / "empty.txt", binary=tmp_path / "bin.txt"
        )
        for a in argv
    ]
    if "--model" not in argv:
        argv += ["--model", str(tiny_lm)]
    code, out, err = run(argv, capsys)
    assert code == EXIT_USAGE
    assert len(err.strip().splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_interrupt_keeps_every_final_record(tiny_lm, tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(["To be", "Shall I", "All the", "Now is"]) + "\n")
    out_file = tmp_path / "o.jsonl"
    original = GPT2.forward
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if (
            calls["n"] == 6
        ):  # group 1 (2 x 3 tokens) is done after round 3; interrupt group 2 mid-way
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GPT2, "forward", flaky)
    code, out, err = run(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--batch-size",
            "2",
            "--max-new-tokens",
            "3",
            "--ignore-eos",
            "--output",
            str(out_file),
        ],
        capsys,
    )
    assert code == EXIT_INTERRUPTED
    assert [r["index"] for r in read_records(out_file)] == [0, 1]
    assert "interrupted; 2 of 4 records were final and written" in err


def test_no_model_and_nothing_shipped(tmp_path, capsys, monkeypatch):
    import minirt.loading.checkpoint as checkpoint

    monkeypatch.setattr(
        checkpoint, "SHIPPED_WEIGHTS", [tmp_path / "weights", tmp_path / "elsewhere"]
    )
    (tmp_path / "p.txt").write_text("hi\n")
    code, _, err = run(["--prompts", str(tmp_path / "p.txt")], capsys)
    assert code == EXIT_USAGE and "no model given (--model)" in err


def test_help_has_examples_and_exit_codes():
    result = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0
    assert (
        "examples:" in result.stdout and "exit status:" in result.stdout and "\\n" in result.stdout
    )


def test_module_runs_as_a_subprocess(tiny_lm, tmp_path):
    (tmp_path / "p.txt").write_text("To be\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minirt.generate",
            "--model",
            str(tiny_lm),
            "--prompts",
            str(tmp_path / "p.txt"),
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("### [0]: ") and "backend auto" in result.stderr


def test_continuous_policy_gives_the_same_records_sooner(tiny_lm, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"prompt": p, "max_new_tokens": n})
            for p, n in [("To be", 2), ("Shall I", 5), ("All the", 8), ("Now is", 4)]
        )
        + "\n"
    )
    records = {}
    for policy in ("static", "continuous"):
        out_file = tmp_path / f"{policy}.jsonl"
        code, _, err = run(
            [
                "--model",
                str(tiny_lm),
                "--prompts",
                str(prompts),
                "--batch-size",
                "3",
                "--ignore-eos",
                "--policy",
                policy,
                "--trace",
                "--quiet",
                "--output",
                str(out_file),
            ],
            capsys,
        )
        assert code == EXIT_OK
        records[policy] = read_records(out_file)
    assert [r["token_ids"] for r in records["static"]] == [
        r["token_ids"] for r in records["continuous"]
    ]
    assert [r["first_round"] for r in records["static"]] == [1, 1, 1, 9]
    assert [r["first_round"] for r in records["continuous"]] == [1, 1, 1, 3]
    assert [r["group"] for r in records["continuous"]] == [None] * 4
    assert (
        "continuous batching: 4 requests in up to 3 rows, rounds 1-8" in err
        and "policy       continuous" in err
    )


def draws(line_source: str) -> list[str]:
    """The states a progress bar drew, one per carriage return."""
    return [state for state in line_source.replace("\n", "").split("\r") if state]


def test_the_progress_bar_names_the_running_group_and_draws_its_final_state(
    tiny_lm, tmp_path, capsys, monkeypatch
):
    """5 requests in static groups of 2: three groups.  Before, the bar never drew its final state (the last
    records come after the last round), so it stopped short of 5/5."""
    import minirt.generate as generate

    stream = io.StringIO()

    class Drawn(Progress):
        def __init__(self, total, **_):
            super().__init__(total, stream=stream, enabled=True)

        def update(
            self, stats, done, force=False
        ):  # every round (not ten a second), except that the last
            if (
                force or done < self.total
            ):  # round's draw is skipped, as the rate limit may skip it:
                super().update(stats, done, force=True)  # only the final forced update can show 5/5

    monkeypatch.setattr(generate, "Progress", Drawn)
    (tmp_path / "p.txt").write_text("a\nb\nc\nd\ne\n")
    code, _, _ = run(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(tmp_path / "p.txt"),
            "--batch-size",
            "2",
            "--max-new-tokens",
            "3",
            "--ignore-eos",
        ],
        capsys,
    )
    states = draws(stream.getvalue())
    assert (
        code == EXIT_OK and len(states) == 3 + 3 + 2 + 1
    )  # groups of 3, 3 and 3 rounds, the last skipped; final
    groups = [state.split(" | ")[1] for state in states]
    assert groups == ["group 1"] * 3 + ["group 2"] * 3 + ["group 3"] * 2 + ["3 groups"]
    assert states[-1].startswith("generating [" + "#" * 24 + "] 5/5 requests")


def test_a_continuous_run_prints_no_group_in_its_headers(tiny_lm, tmp_path, capsys):
    """Before: "group None" in every completion's header under continuous batching."""
    (tmp_path / "p.txt").write_text("a\nb\n")
    code, out, _ = run(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(tmp_path / "p.txt"),
            "--policy",
            "continuous",
            "--max-new-tokens",
            "2",
            "--ignore-eos",
        ],
        capsys,
    )
    headers = [line for line in out.splitlines() if line.startswith("### ")]
    assert code == EXIT_OK and len(headers) == 2
    assert all("group" not in h and ", rounds " in h for h in headers), headers
    code, out, _ = run(
        ["--model", str(tiny_lm), "--prompts", str(tmp_path / "p.txt"), "--max-new-tokens", "2"],
        capsys,
    )
    assert all(
        ", group 1, rounds " in line for line in out.splitlines() if line.startswith("### ")
    )  # static: kept


def test_help_shows_the_real_defaults_and_where_they_come_from():
    """Before, --help said greedy and 64 tokens, while the shipped model (the default) samples 100 tokens at
    temperature 0.8: its generation_config.json, read here with json, is what --help must show."""
    shipped = json.loads(
        (ROOT / "weights" / "shakespeare-gpt2-tiny" / "generation_config.json").read_text()
    )
    assert shipped["do_sample"] is True
    result = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    # Each option's help, keyed by its first flag: its line and the lines under it (a long flag's help starts
    # on the next line).
    lines: dict[str, str] = {}
    flag = None
    for line in result.stdout.splitlines():
        if line.startswith("  --"):
            flag = line.split()[0].rstrip(",")
            lines[flag] = line
        elif flag is not None and line.startswith("   "):
            lines[flag] += " " + line
        else:
            flag = None
    # Without a generation_config.json: greedy and vLLM's 16 tokens (docs/api.md, "Defaults").
    for flag, field, fallback in [
        ("--max-tokens", "max_new_tokens", "16"),
        ("--temperature", "temperature", "0"),
        ("--top-k", "top_k", "0"),
    ]:
        line = " ".join(lines[flag].split())
        assert (
            f"generation_config.json, else {fallback}; the shipped model's: {shipped[field]})"
            in line
        ), line


def test_prompts_given_on_the_command_line_run_as_a_file_of_them_would(tiny_lm, tmp_path, capsys):
    """--prompt TEXT, repeatable: the same records as a .txt file holding those prompts (text with a backslash
    or a tab is taken as it is: no .txt escapes on the command line)."""
    texts = ["To be", "Shall I\tcompare", "a \\n b"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    common = [
        "--model",
        str(tiny_lm),
        "--max-new-tokens",
        "3",
        "--ignore-eos",
        "--backend",
        "numpy",
    ]
    flags = [arg for text in texts for arg in ("--prompt", text)]
    assert run([*common, *flags, "--output", str(tmp_path / "a.jsonl")], capsys)[0] == EXIT_OK
    assert (
        run(
            [
                *common,
                "--prompts",
                str(tmp_path / "p.jsonl"),
                "--output",
                str(tmp_path / "b.jsonl"),
            ],
            capsys,
        )[0]
        == 0
    )
    given, from_file = read_records(tmp_path / "a.jsonl"), read_records(tmp_path / "b.jsonl")
    assert [r["prompt"] for r in given] == texts
    assert [r["token_ids"] for r in given] == [r["token_ids"] for r in from_file]


@pytest.mark.parametrize(
    "argv", [[], ["--prompt", "hi", "--prompts", "p.txt"]], ids=["neither", "both"]
)
def test_prompts_come_one_way(tiny_lm, argv, capsys):
    code, _, err = run(["--model", str(tiny_lm), *argv], capsys)
    assert code == EXIT_USAGE and err.count("\n") == 1 and "give the prompts one way" in err


def test_a_prompt_that_names_a_file_is_still_text_but_gets_a_hint(
    tiny_lm, tmp_path, capsys, monkeypatch
):
    # A short relative path: the tiny model's context holds its text whatever tmp_path is.
    monkeypatch.chdir(tmp_path)
    prompts = Path("p.txt")
    prompts.write_text("To be\n")
    argv = ["--model", str(tiny_lm), "--prompt", str(prompts), "--max-new-tokens", "2"]
    code, out, err = run_generate(argv, capsys)
    assert code == EXIT_OK and out.startswith("### [0]: ")
    # Generated from the path's text, as before.
    assert f"\n{prompts}" in out
    note = (
        f"note: --prompt takes the prompt's text; {prompts} is a file: "
        f"use --prompts {prompts} to read it"
    )
    assert [line for line in err.splitlines() if "note:" in line] == [
        f"python -m minirt.generate: {note}".removeprefix("python -m ")
    ]


def test_a_prompt_that_is_no_file_gets_no_hint(tiny_lm, capsys):
    argv = ["--model", str(tiny_lm), "--prompt", "To be", "--max-new-tokens", "2"]
    code, _, err = run_generate(argv, capsys)
    assert code == EXIT_OK and "note:" not in err


def test_prompts_text_that_is_no_file_suggests_prompt(tiny_lm, capsys):
    argv = ["--model", str(tiny_lm), "--prompts", "To be, or not to be"]
    code, out, err = run_generate(argv, capsys)
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
    assert err.startswith(
        "minirt.generate: error: prompts file To be, or not to be does not exist; "
        "pass a .txt or .jsonl file, or - for standard input"
    )
    assert "use --prompt 'To be, or not to be'" in err


def run_generate(argv, capsys):
    code = run_command(generate_main, argv, prog="minirt.generate")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_kv_budget_in_a_fraction_of_a_mib_runs_as_its_positions_counted_by_hand(
    tiny_lm, tmp_path, capsys
):
    """--kv-budget 0.0195MiB on tiny_lm: 0.0195 x 2**20 = 20447 bytes, and one position's keys
    and values are 2 x 2 layers x 32 x 4 bytes = 512: 39 positions.  Four requests needing 13
    positions each run 3 and then 1 (39 holds 3 rows exactly), and one needing 40 is refused."""
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": [5], "max_new_tokens": 13}] * 4 + [{"prompt": [5], "max_new_tokens": 40}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out_file = tmp_path / "out.jsonl"
    argv = ["--model", str(tiny_lm), "--prompts", str(prompts), "--batch-size", "4"]
    argv += ["--kv-budget", "0.0195MiB", "--ignore-eos", "--output", str(out_file)]
    code, _, err = run([*argv, "--backend", "numpy"], capsys)
    assert code == EXIT_REQUEST_FAILED
    records = read_records(out_file)
    assert [r["first_round"] for r in records] == [1, 1, 1, 14, None]
    assert [r["rounds_waited"] for r in records] == [0, 0, 0, 13, None]
    assert "over the budget of 39" in records[4]["error"]
    assert "held 1 group below 4 rows (rows: 3)" in err


def test_batch_invariant_flag_gives_each_prompt_its_solo_logprobs(tmp_path, capsys):
    """`--batch-invariant`: five prompts batched three at a time, continuous, chunked, cached, get
    the tokens and logprobs (to the bit, as JSON carries them) they get served one at a time."""
    prompts = ["ROMEO:\nI", "JULIET:\nO Romeo, Romeo", "ROMEO:\nI dreamt", "To be", "All:\nSpeak"]
    prompts_file = tmp_path / "p.txt"
    # The .txt format's "\\n" is a newline within a prompt.
    prompts_file.write_text("\n".join(p.replace("\n", "\\n") for p in prompts) + "\n")
    common = ["--prompts", str(prompts_file), "--batch-invariant", "--backend", "numpy"]
    common += ["--logprobs", "--max-tokens", "6", "--temperature", "1.0", "--seed", "5"]
    runs = {
        "together": ["--batch-size", "3", "--policy", "continuous", "--max-round-tokens", "8"]
        + ["--prefix-cache"],
        "alone": ["--batch-size", "1"],
    }
    records = {}
    for name, flags in runs.items():
        out_file = tmp_path / f"{name}.jsonl"
        code, _out, err = run([*common, *flags, "--output", str(out_file)], capsys)
        assert code == EXIT_OK, err
        records[name] = read_records(out_file)
    for together, alone in zip(records["together"], records["alone"], strict=True):
        assert together["token_ids"] == alone["token_ids"]
        assert together["logprobs"] == alone["logprobs"]
    # One prompt a group alone; together, the continuous pool held several at once.
    assert len({r["group"] for r in records["alone"]}) == len(prompts)
    assert min(r["first_round"] for r in records["together"][1:]) <= 1


def test_batch_invariant_on_a_blas_that_cannot_keep_it_is_one_line(capsys, monkeypatch):
    import numpy as np

    real = np.matmul

    def matmul(a, b, *args, **kwargs):
        result = real(a, b, *args, **kwargs)
        if result.ndim == 2 and result.shape[0] == 8:
            result[0] = np.nextafter(result[0], np.inf)
        return result

    monkeypatch.setattr(np, "matmul", matmul)
    code, out, err = run(["--prompt", "ROMEO:", "--batch-invariant", "--backend", "numpy"], capsys)
    assert code == EXIT_USAGE and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "exact batch invariance is not available on" in err
