"""`python -m minirt.inspect`: the top tokens it prints, its one-line errors, and the module run as a command."""

import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import FIXTURES, ROOT, load_expected

import minirt
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.inspect import main as inspect_main


def test_inspect_reports_the_reference_top_token(capsys):
    """The top next token it prints is transformers' argmax for the same prompt."""
    expected = load_expected("base")
    prompt = expected["seq_0"].tolist()
    argv = ["--ids", ",".join(map(str, prompt)), "--top-k", "2", str(FIXTURES / "base")]
    assert run_command(inspect_main, argv) == EXIT_OK
    out = capsys.readouterr().out
    reference_top = int(np.argmax(expected["logits"][0, len(prompt) - 1]))
    first_line = next(line for line in out.splitlines() if line.strip().startswith("id "))
    assert first_line.split()[1] == str(reference_top)
    assert "memory-mapped" in out and "31,616 parameters" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["nope/does/not/exist"], "does not exist"),
        ([str(FIXTURES / "base"), "--backend", "cupy"], "--backend numpy"),
        ([str(FIXTURES / "base"), "--dtype", "int8"], "unknown dtype"),
        ([str(FIXTURES / "base"), "--prompt", "hi"], "needs a tokenizer"),
        ([str(FIXTURES / "base"), "--top-k", "0"], "--top-k"),
        ([str(FIXTURES / "base"), "--batch-invariance"], "--batch-invariance needs a prompt"),
    ],
)
def test_inspect_errors_are_one_line(capsys, argv, fragment):
    if "cupy" in argv:
        try:
            minirt.get_backend("cupy")
            pytest.skip("a usable GPU is present")
        except minirt.BackendError:
            pass
    assert run_command(inspect_main, argv, prog="minirt.inspect") == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_inspect_as_a_module_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "minirt.inspect", str(FIXTURES / "sharded"), "--ids", "1,2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "in 3 files" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "minirt.inspect", "/no/such/folder"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert (
        bad.returncode == EXIT_USAGE
        and bad.stderr.count("\n") == 1
        and "Traceback" not in bad.stderr
    )


def test_inspect_takes_its_model_as_model_too(tiny_lm, capsys):
    assert inspect_main(["--model", str(tiny_lm), "--ids", "5,6"]) == EXIT_OK
    flag = capsys.readouterr().out
    assert inspect_main([str(tiny_lm), "--ids", "5,6"]) == EXIT_OK
    positional = capsys.readouterr().out
    assert flag.startswith(f"model      {tiny_lm}\n")
    assert flag.splitlines()[1] == positional.splitlines()[1]


def test_inspect_refuses_the_model_given_twice_in_one_line(tiny_lm, capsys):
    argv = [str(tiny_lm), "--model", str(tiny_lm)]
    code = run_command(inspect_main, argv, prog="minirt.inspect")
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1
    assert "the model is given twice" in err and "--model" in err


def test_batch_invariance_shows_both_modes_side_by_side(capsys):
    """--batch-invariance: a line a prompt, both modes on it; exact mode's logits never move (the
    default mode's may or may not, by kernel: its cell is one of two forms)."""
    argv = ["--ids", "5,6", "--ids", "7", "--batch-invariance", str(FIXTURES / "base")]
    assert run_command(inspect_main, argv) == EXIT_OK
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  prompt ")]
    assert len(lines) == 2
    assert all(line.endswith("exact: none of 128 moved") for line in lines)
    assert all(
        re.search(r"default: (none of 128 moved|\d+ of 128 moved, by up to )", line)
        for line in lines
    )
