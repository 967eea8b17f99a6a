"""An empty or zero value is a bad value, never the flag left out.

`--model ""` (an unset shell variable, say) used to run the shipped model, `evaluate --window 0` the model's
context, `inspect --ids 5,,6` the prompt [5, 6], `rounds --svg ""` no drawing at all.  Each is refused now, in
every command, as any bad flag is: exit 2 and one line on standard error naming the flag, no traceback, before
anything is loaded (the model named beside it does not exist, so a check made after loading would say that
instead), and an existing --output file is left as it was.  The empty values that mean something stay: an
empty --prompt is an empty prompt, which starts from the beginning-of-text token (docs/generate.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from minirt.cli.command import EXIT_OK, EXIT_USAGE

OLD = b'{"an": "existing record"}\n'

# The arguments each case starts from: a model that does not exist, so that a check made only after loading
# would be told as "does not exist" instead.
GENERATE = ["--model", "{missing}", "--prompts", "{prompts}"]
EVALUATE = ["--model", "{missing}", "--text", "{text}"]

# (command, its arguments, what the one line must say, naming the flag).  {model} is a model that loads,
# {missing} one that does not exist, {prompts} and {text} small files.
REFUSED = [
    ("generate", ["--model", "", "--prompts", "{prompts}"], "error: --model is empty; "),
    ("generate", ["--model", "{missing}", "--prompts", ""], "error: --prompts is empty; "),
    ("generate", ["--model", "{missing}", "--prompt", "hi", "--output", ""], "--output is empty; "),
    ("generate", [*GENERATE, "--ray", ""], "error: --ray is empty; "),
    ("generate", [*GENERATE, "--kv-budget", "0"], "error: --kv-budget: a number of tokens must be"),
    ("generate", [*GENERATE, "--kv-budget", "0MiB"], "error: --kv-budget: a memory size must be"),
    ("generate", [*GENERATE, "--kv-budget", ""], "error: --kv-budget: expected a number of tokens"),
    ("generate", [*GENERATE, "--format", ""], "error: argument --format: invalid choice: ''"),
    ("evaluate", ["--model", "", "--text", "{text}"], "error: --model is empty; "),
    ("evaluate", ["--model", "{missing}", "--text", ""], "error: --text is empty; "),
    ("evaluate", [*EVALUATE, "--window", "0"], "error: --window must be at least 2 tokens"),
    ("evaluate", [*EVALUATE, "--window", "1"], "error: --window must be at least 2 tokens"),
    ("evaluate", [*EVALUATE, "--stride", "0"], "error: --stride must be at least 1 token"),
    ("evaluate", [*EVALUATE, "--stride", "-3"], "error: --stride must be at least 1 token"),
    (
        "evaluate",
        [*EVALUATE, "--window", "8", "--stride", "8"],
        "error: --stride must be less than",
    ),
    ("inspect", ["", "--ids", "5"], "error: MODEL is empty; "),
    ("inspect", ["--model", "", "--ids", "5"], "error: --model is empty; "),
    ("inspect", ["{missing}", "--ids", ""], "error: --ids is empty; "),
    ("inspect", ["{missing}", "--ids", "5,,6"], "error: --ids: '5,,6' has an empty item"),
    ("inspect", ["{missing}", "--ids", "5,6,"], "error: --ids: '5,6,' has an empty item"),
    ("inspect", ["{missing}", "--ids", "5 6"], "error: argument --ids: expected comma-separated"),
    ("rounds", ["--lengths", "2,3", "--svg", ""], "error: --svg is empty; "),
    ("rounds", ["--lengths", ""], "error: argument --lengths: every length must be"),
    ("rounds", ["--lengths", "2 5"], "error: argument --lengths: expected comma-separated"),
    ("rounds", ["--lengths", "2,3", "--kv-budget", "0"], "error: --kv-budget: a number of tokens"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("empty_values")
    (folder / "p.txt").write_text("To be\nShall I\n")
    (folder / "text.txt").write_text("To be, or not to be, that is the question.\n")
    return folder


def command_line(command: str, argv: list[str], files: Path, model: Path) -> list[str]:
    """`python -m minirt.COMMAND ARGV`, the placeholders filled in (an empty argument stays empty)."""
    names = {
        "{model}": str(model),
        "{missing}": str(files / "no such model"),
        "{prompts}": str(files / "p.txt"),
        "{text}": str(files / "text.txt"),
    }
    filled = [names.get(word, word) for word in argv]
    if command in ("generate", "evaluate", "inspect"):
        filled += ["--backend", "numpy"]
    return [sys.executable, "-m", f"minirt.{command}", *filled]


def folder_state(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


@pytest.mark.parametrize(
    "command, argv, said", REFUSED, ids=[f"{c} {' '.join(a)!r}" for c, a, _ in REFUSED]
)
def test_an_empty_or_zero_value_is_refused_in_one_line_naming_the_flag(
    tiny_lm, tmp_path, files, command, argv, said
):
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    words = command_line(command, argv, files, tiny_lm)
    if command == "generate" and "--output" not in argv:
        words += ["--output", str(out)]
    before = folder_state(tmp_path)
    # Run in a folder of its own (an empty name must not become the current folder, nor a file in it), with
    # this checkout's minirt first on the path.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert said in lines[0] and proc.stdout == ""
    # The old records, and nothing new (no partial file, no SVG).
    assert folder_state(tmp_path) == before


def test_an_empty_generate_prompt_is_an_empty_prompt(tiny_lm, tmp_path):
    """`--prompt ""` is documented: an empty prompt, which starts from BOS (as the token-id prompt [BOS] does)."""
    bos = json.loads((tiny_lm / "config.json").read_text())["bos_token_id"]
    out = tmp_path / "out.jsonl"
    prompts = tmp_path / "bos.jsonl"
    prompts.write_text(json.dumps({"prompt": [bos]}) + "\n")
    common = ["--max-new-tokens", "3", "--quiet", "--no-progress"]
    empty = command_line("generate", ["--model", "{model}", "--prompt", ""], tmp_path, tiny_lm)
    subprocess.run([*empty, *common, "--output", str(out)], cwd=ROOT, check=True, timeout=120)
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    by_ids = command_line(
        "generate", ["--model", "{model}", "--prompts", str(prompts)], tmp_path, tiny_lm
    )
    subprocess.run([*by_ids, *common, "--output", str(out)], cwd=ROOT, check=True, timeout=120)
    (reference,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["prompt"], record["error"]) == ("", None)
    assert record["token_ids"] == reference["token_ids"] and len(record["token_ids"]) == 3


def test_an_empty_inspect_prompt_is_scored_from_bos(tiny_lm):
    words = command_line("inspect", ["{model}", "--prompt", ""], ROOT, tiny_lm)
    proc = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "prompt '' (1 token): most likely next tokens" in proc.stdout
