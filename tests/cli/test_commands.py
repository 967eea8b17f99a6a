"""One `minirt` command (the console script, or `python -m minirt`) for the four tools, and `--version` on each.

The version printed is checked against pyproject.toml (an independent source), and each subcommand against
running its own module, which stays the documented entry point (`python -m minirt.generate`)."""

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from inspect import signature as inspect_signature

import pytest
from conftest import ROOT

import minirt
from minirt import LLM
from minirt.__main__ import SUBCOMMANDS, main
from minirt.__main__ import main as minirt_main
from minirt.cli.command import EXIT_INTERRUPTED, EXIT_OK, EXIT_STDOUT_CLOSED

tomllib = pytest.importorskip(
    "tomllib"
)  # Python 3.11+: reads pyproject.toml, the version's other source

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_console_script_is_this_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["minirt"].partition(":")
    assert module == "minirt.__main__" and callable(getattr(sys.modules[module], function))


def test_python_dash_m_minirt_prints_the_packages_version():
    done = subprocess.run(
        [sys.executable, "-m", "minirt", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == f"minirt {VERSION}\n" and done.stderr == ""


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_version_and_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"minirt {VERSION}\n"
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(
        f"usage: minirt {name} "
    )  # as it was run
    module = importlib.import_module(f"minirt.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(
        f"usage: python -m minirt.{name} "
    )


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in SUBCOMMANDS) and "examples:" in out


@pytest.mark.parametrize(
    "argv, what",
    [
        ([], "a subcommand is missing"),
        (["train"], "unknown subcommand 'train'"),
        (["--prompts", "p.txt"], "unknown subcommand '--prompts'"),
    ],
)
def test_a_missing_or_unknown_subcommand_is_one_line_and_exit_2(argv, what, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and what in err and "generate, evaluate, rounds, inspect" in err


def test_minirt_generate_is_python_dash_m_minirt_generate(tmp_path):
    """The same run through both entry points (the shipped model, greedy): identical records."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\nThe king\n")
    records = []
    for entry in (["-m", "minirt", "generate"], ["-m", "minirt.generate"]):
        out = tmp_path / f"out{len(records)}.jsonl"
        done = subprocess.run(
            [
                sys.executable,
                *entry,
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "5",
                "--temperature",
                "0",
                "--backend",
                "numpy",
                "--output",
                str(out),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        records.append([json.loads(line)["token_ids"] for line in out.read_text().splitlines()])
    assert records[0] == records[1] and all(len(ids) == 5 for ids in records[0])


def test_a_subcommands_errors_name_the_command_it_was_run_as(capsys):
    assert main(["generate", "--prompts", "/no/such/file.txt", "--backend", "numpy"]) == 2
    assert capsys.readouterr().err.startswith(
        "minirt generate: error: prompts file /no/such/file.txt does not exist"
    )


def test_auto_is_the_default_backend_everywhere(tiny_lm):
    """The API and every command pick CuPy when a GPU is usable and NumPy otherwise, unless told."""
    assert LLM(tiny_lm).backend_note.startswith("backend auto:")  # the note only `auto` leaves
    assert inspect_signature(minirt.load_model).parameters["backend"].default == "auto"
    assert inspect_signature(minirt.get_backend).parameters["name"].default == "auto"
    for name in ("generate", "evaluate", "inspect"):
        assert (
            importlib.import_module(f"minirt.{name}").build_parser().get_default("backend")
            == "auto"
        ), name


def test_inspect_without_a_model_describes_the_shipped_one(capsys):
    assert importlib.import_module("minirt.inspect").main(["--ids", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "shakespeare-gpt2-tiny" in out.splitlines()[0] and "most likely next tokens" in out


def run_into_a_gone_reader(argv: list[str]) -> subprocess.CompletedProcess:
    """Run `python ARGV` with standard output on a pipe whose reader has gone before anything
    is written: what `head` does once it has its lines."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [sys.executable, *argv],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(writer)


HELP_FORMS = [["-h"], ["--help"], ["--version"]] + [
    [name, flag] for name in sorted(SUBCOMMANDS) for flag in ("--help", "--version")
]


@pytest.mark.parametrize("argv", HELP_FORMS, ids=" ".join)
def test_help_into_a_closed_pipe_exits_quietly_with_0(argv):
    """`minirt -h | head -3`: before, sometimes "standard output was closed" and exit 141 (or
    Python's "Exception ignored ... BrokenPipeError")."""
    done = run_into_a_gone_reader(["-m", "minirt", *argv])
    assert (done.returncode, done.stderr) == (EXIT_OK, "")


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_modules_help_into_a_closed_pipe_exits_quietly(name):
    done = run_into_a_gone_reader(["-m", f"minirt.{name}", "--help"])
    assert (done.returncode, done.stderr) == (EXIT_OK, "")


@pytest.fixture
def closed_stdout(monkeypatch):
    """Standard output on a pipe whose reader has gone, as after `| head -3`."""
    reader, writer = os.pipe()
    os.close(reader)
    stream = os.fdopen(writer, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    yield stream
    monkeypatch.undo()
    try:
        stream.close()
    except OSError:
        pass


def test_help_written_to_a_closed_stdout_in_process(closed_stdout, capsys):
    assert minirt_main(["-h"]) == EXIT_OK
    with pytest.raises(SystemExit) as exit_:
        minirt_main(["rounds", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().err == ""


def test_completions_cut_by_head_still_exit_141(tiny_lm, tmp_path):
    """Only help and --version are quiet: a run whose output is cut short says so."""
    (tmp_path / "p.txt").write_text("a\nb\n")
    argv = ["-m", "minirt", "generate", "--model", str(tiny_lm)]
    argv += ["--prompts", str(tmp_path / "p.txt"), "--max-new-tokens", "2"]
    done = run_into_a_gone_reader(argv)
    assert done.returncode == EXIT_STDOUT_CLOSED
    assert "standard output was closed" in done.stderr


@pytest.mark.parametrize(
    "command",
    [["rounds", "--lengths", "2,5,8,4", "--batch-size", "3"], ["inspect"]],
    ids=["rounds", "inspect"],
)
def test_a_report_whose_reader_has_gone_ends_quietly_with_141(command):
    """`minirt rounds ... | head -2`: a report cut short by its reader exits as GNU tools do, 141
    (128 + SIGPIPE) and not a word; a run of completions still says how far it got (above)."""
    done = run_into_a_gone_reader(["-m", "minirt", *command])
    assert (done.returncode, done.stderr) == (EXIT_STDOUT_CLOSED, "")


# A module whose import lets a weak reference's callback run, and Ctrl-C arrive inside it:
# Python cannot raise from such a callback, so it reports the KeyboardInterrupt as "Exception
# ignored" (with a traceback) and the import goes on (seen in CI inside importlib's own locks).
CTRL_C_IN_A_CALLBACK = """
import os, signal, weakref


class Held:
    pass


def callback(_reference):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):  # the handler runs between these bytecodes, inside the callback
        pass


held = Held()
reference = weakref.ref(held, callback)
del held
"""


def test_ctrl_c_inside_an_imports_callback_is_the_one_line_not_exception_ignored(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "ctrl_c_in_a_callback.py").write_text(CTRL_C_IN_A_CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    from minirt.__main__ import import_interruptibly

    handler = signal.getsignal(signal.SIGINT)
    hook = sys.unraisablehook
    assert import_interruptibly("ctrl_c_in_a_callback") is None
    assert capsys.readouterr().err == ""
    # The handlers are back as they were, for Ctrl-C and for what Python cannot raise.
    assert signal.getsignal(signal.SIGINT) is handler
    assert sys.unraisablehook is hook


@pytest.mark.parametrize("delay_s", [0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
def test_ctrl_c_in_a_commands_first_instant_is_one_line_never_a_traceback(delay_s, tmp_path):
    """While `minirt generate` is still importing (NumPy, the model code), Ctrl-C: one line and
    130, or, before Python has its handler at all, death by the signal; never a traceback."""
    (tmp_path / "p.txt").write_text("a\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "minirt", "generate", "--prompts", str(tmp_path / "p.txt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    time.sleep(delay_s)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    if "init_import_site" in err:
        # Python itself was still starting (its site module), before any code of minirt's.
        return
    assert "Traceback" not in err, err
    assert process.returncode in (EXIT_INTERRUPTED, -signal.SIGINT, 0), (process.returncode, err)
    if process.returncode == EXIT_INTERRUPTED:
        assert "interrupted" in err.strip().splitlines()[-1], err
