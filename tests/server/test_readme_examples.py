"""The README's "Serving over HTTP" examples run as pasted (the URL aside: the test's server has a port of its
own), against the shipped model, and print what `LLM.generate` gives offline for the same requests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from minirt import LLM, SamplingParams
from serving import Server, serve_tests
from conftest import completions

pytestmark = serve_tests

README_URL = "http://127.0.0.1:8000"


def examples() -> dict[str, str]:
    """The blocks between <!-- serve-example --> markers, by language."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(
        r"<!-- serve-example -->\n```(\w+)\n(.*?)```\n<!-- /serve-example -->", text, re.S
    )
    found = {language: code for language, code in blocks}
    assert set(found) == {"bash", "python"}, "the README's serve examples moved"
    return found


@pytest.fixture(scope="module")
def server():
    with Server() as running:
        yield running
        assert running.stop() == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_curl_example_gives_the_offline_greedy_completion(server):
    code = examples()["bash"]
    assert README_URL in code
    done = subprocess.run(
        ["bash", "-c", code.replace(README_URL, server.url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (expected,) = completions(
        LLM().generate(["ROMEO:"], SamplingParams(max_tokens=20, temperature=0.0))
    )
    assert json.loads(done.stdout)["choices"][0]["text"] == expected.text


def test_the_openai_example_prints_the_offline_completions(server):
    code = examples()["python"]
    assert README_URL in code
    done = subprocess.run(
        [sys.executable, "-c", code.replace(README_URL, server.url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    llm = LLM()
    (greedy,) = completions(
        llm.generate(["ROMEO:"], SamplingParams(max_tokens=20, temperature=0.0))
    )
    # OpenAI's default temperature, 1.0, with the example's seed.
    (sampled,) = completions(
        llm.generate(["JULIET:"], SamplingParams(max_tokens=20, temperature=1.0, seed=1))
    )
    assert done.stdout == greedy.text + "\n" + sampled.text + "\n"
