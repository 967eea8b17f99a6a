"""The project's own lint and type configuration holds, for minirt/ and for a user's script.

`ruff check .` and `ruff format --check .` pass with the committed config (pyproject.toml), `mypy` passes on minirt/, and a user script
that uses `LLM`, `SamplingParams` and an output's `.text` type-checks against the installed annotations
(`py.typed`), while the same script with a wrong attribute or a wrong type is caught: the check has teeth.
Skipped cleanly when ruff or mypy is not installed (both come with the `test` extra).
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="needs ruff (the test extra)"
)
needs_mypy = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="needs mypy (the test extra)"
)

USER_SCRIPT = """
from minirt import LLM, CompletionOutput, Logprob, RequestOutput, SamplingParams, TokenEvent

llm = LLM()  # the model shipped with minirt
params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=1, logprobs=2)
outputs: list[RequestOutput] = llm.generate(["To be, or not to be"], params)
first: CompletionOutput = outputs[0].outputs[0]
text: str | None = first.text
reason: str = first.finish_reason
ids: list[int] = first.token_ids + outputs[0].prompt_token_ids
assert first.logprobs is not None
chosen: Logprob = first.logprobs[0][first.token_ids[0]]
rank: int | None = chosen.rank


def show(event: TokenEvent) -> None:
    print(event.index, event.token_id, event.text, end="", flush=True)


llm.generate("ROMEO.", SamplingParams(max_tokens=4), on_token=show)
"""


def run(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    # MYPYPATH: an editable install is an import hook, which mypy does not follow; a wheel needs no such help
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


@needs_ruff
def test_ruff_check_passes_with_the_projects_config():
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_ruff
def test_ruff_format_leaves_every_file_as_it_is():
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_ruff
def test_ruff_format_check_sees_a_file_it_would_change(tmp_path):
    """The check has teeth: a file the formatter would rewrite fails it."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "squeezed.py").write_text("x = {  'a':1,'b' :2 }\n")
    result = run("ruff", "format", "--check", ".", cwd=tmp_path)
    assert result.returncode == 1
    assert "squeezed.py" in result.stdout + result.stderr


@needs_mypy
@pytest.mark.slow
def test_mypy_passes_on_minirt(tmp_path):
    result = run(
        "mypy", "--cache-dir", str(tmp_path / "cache")
    )  # files = ["minirt"], from pyproject.toml
    assert result.returncode == 0 and "Success" in result.stdout, result.stdout + result.stderr


@needs_mypy
@pytest.mark.slow
@pytest.mark.parametrize(
    "mistake",
    [
        None,
        ("first.text", "first.txt"),
        ("reason: str", "reason: int"),
        ("max_tokens=12", "max_tokens='12'"),
        ("on_token=show", "on_token=len"),
    ],
)
def test_a_user_script_type_checks_and_a_wrong_one_does_not(tmp_path, mistake):
    script = USER_SCRIPT if mistake is None else USER_SCRIPT.replace(*mistake)
    assert mistake is None or script != USER_SCRIPT
    (tmp_path / "user.py").write_text(script)
    result = run(
        "mypy",
        "--strict",
        "--follow-imports=silent",
        "--cache-dir",
        str(tmp_path / "cache"),
        "user.py",
        cwd=tmp_path,
    )  # silent: minirt itself is checked (with its own config) above
    assert (result.returncode == 0) == (mistake is None), result.stdout + result.stderr
    assert (
        "import-not-found" not in result.stdout
    )  # it failed on the mistake, not on finding minirt
    if mistake is not None:
        assert "user.py:" in result.stdout and result.stdout.count("error:") == 1, (
            result.stdout
        )  # that one alone
