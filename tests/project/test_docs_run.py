"""Every Python example in docs/api.md, and README's "From Python", runs as pasted (on the shipped model): an
example that calls an API which has changed fails here, not in a reader's terminal.

Each block runs in a fresh interpreter from an empty folder, as a reader's script would; its standard output is
checked only where the prose beside it promises something (the defaults example below)."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import ROOT, run_script

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(name: str) -> list[str]:
    return PYTHON_BLOCK.findall((ROOT / name).read_text(encoding="utf-8"))


# README's second block talks to a running server (its serve tests run it); the first is "From Python".
BLOCKS = [("docs/api.md", k, block) for k, block in enumerate(python_blocks("docs/api.md"))] + [
    ("README.md", 0, python_blocks("README.md")[0])
]


def run_block(block: str, tmp_path) -> subprocess.CompletedProcess:
    return run_script(block, tmp_path, "example.py")


def test_the_blocks_are_found():
    """The pattern has teeth: api.md holds six examples (its chat one too), and README's first is the
    vLLM-shaped one."""
    assert len(BLOCKS) == 7
    assert any("llm.chat(" in block for _, _, block in BLOCKS)
    assert "out.outputs[0]" in BLOCKS[-1][2]


@pytest.mark.parametrize("name, number, block", BLOCKS, ids=[f"{n}#{k}" for n, k, _ in BLOCKS])
def test_each_python_example_runs_as_pasted(tmp_path, name, number, block):
    result = run_block(block, tmp_path)
    assert result.returncode == 0, f"{name}, Python example {number + 1}:\n{result.stderr}"
    assert "Traceback" not in result.stderr


def test_the_defaults_example_prints_what_its_table_says(tmp_path):
    """docs/api.md, "Defaults": no params gives the shipped model's 100 tokens at temperature 0.8; SamplingParams()
    gives vLLM's 16 (the model emits no EOS that early on this prompt: the counts are exact)."""
    [block] = [b for b in python_blocks("docs/api.md") if "as_configured" in b]
    result = run_block(block, tmp_path)
    assert result.returncode == 0, result.stderr
    defaults, counts = result.stdout.splitlines()
    assert "max_tokens=100" in defaults and "temperature=0.8" in defaults and "top_k=40" in defaults
    assert counts.split() == ["100", "16"]
