"""The suite's own reliability: a hang fails fast and names its test.

A bug that makes a scheduler loop for ever would otherwise hold the suite until CI's 90 minutes run out.
pytest-timeout (in the `test` extra) gives every test the limit in pyproject.toml's [tool.pytest.ini_options].
"""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import ROOT


def test_the_suite_has_a_per_test_limit(pytestconfig):
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    limit = float(pytestconfig.getini("timeout"))
    # Generous, but far below CI's 90 minutes.
    assert 60 <= limit <= 300


def test_a_hanging_test_fails_fast_and_names_itself(tmp_path):
    """A test that loops for ever, under the project's configuration with the limit lowered to 3 s."""
    (tmp_path / "test_hang.py").write_text(
        "def test_loops_for_ever():\n    while True:\n        pass\n"
    )
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path / "test_hang.py"),
            "-c",
            str(ROOT / "pyproject.toml"),
        ]
        + ["--rootdir", str(tmp_path), "-o", "timeout=3", "-p", "no:cacheprovider", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - start < 45
    assert done.returncode == 1, done.stdout[-2000:]
    assert "Timeout" in done.stdout and "test_loops_for_ever" in done.stdout
