"""A built wheel, not the source tree: the shipped model travels inside the package, so `minirt generate` and
`minirt evaluate` run with no --model from any directory.  Slow: it builds the wheel with pip."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

# The wheel build counts against the first test: it gets more than the suite's per-test limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel pip builds from this checkout, unpacked as an installed package would be: its site folder."""
    wheels, site = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = wheels.glob("minirt-*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    return site


def run_installed(site, cwd, *argv):
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of any minirt the environment already has
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_the_wheel_carries_the_shipped_model_byte_for_byte(installed):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        packaged = installed / "minirt" / "weights" / "shakespeare-gpt2-tiny" / name
        assert (
            packaged.read_bytes()
            == (ROOT / "weights" / "shakespeare-gpt2-tiny" / name).read_bytes()
        ), name


def test_the_wheel_carries_the_round_grid_page(installed, tmp_path):
    packaged = installed / "minirt" / "server" / "static" / "rounds.html"
    assert (
        packaged.read_bytes()
        == (ROOT / "minirt" / "server" / "static" / "rounds.html").read_bytes()
    )
    # The page is read through the package, as `minirt serve` reads it (no web stack needed for that).
    code = "from importlib import resources; print(len(resources.files('minirt.server').joinpath('static/rounds.html').read_text()))"
    done = run_installed(installed, tmp_path, "-c", code)
    assert done.returncode == 0 and int(done.stdout) == len(packaged.read_text()), done


def test_an_installed_minirt_runs_the_shipped_model_from_anywhere(installed, tmp_path):
    where = run_installed(installed, tmp_path, "-c", "import minirt; print(minirt.__file__)")
    assert where.stdout.startswith(str(installed)), where  # the wheel's copy, not the source tree
    (tmp_path / "p.txt").write_text("ROMEO:\nTo be, or not to be\n")
    done = run_installed(
        installed,
        tmp_path,
        "-m",
        "minirt",
        "generate",
        "--prompts",
        "p.txt",
        "--max-new-tokens",
        "4",
        "--backend",
        "numpy",
        "--output",
        "out.jsonl",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [len(r["token_ids"]) for r in records] == [4, 4] and all(
        r["error"] is None for r in records
    )
    done = run_installed(
        installed, tmp_path, "-m", "minirt", "evaluate", "--text", "p.txt", "--backend", "numpy"
    )
    assert done.returncode == 0 and "perplexity" in done.stdout, done.stderr
    done = run_installed(
        installed, tmp_path, "-c", "from minirt import LLM; print(LLM().model.folder)"
    )
    assert done.stdout.strip() == str(installed / "minirt" / "weights" / "shakespeare-gpt2-tiny"), (
        done.stderr
    )
