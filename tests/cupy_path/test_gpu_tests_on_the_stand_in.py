"""The `gpu` tests (tests/model/test_gpu.py) cannot run here, so their own code is checked by
running them on the strict stand-in instead of a GPU: each must pass there, none skip, and the
stand-in finds nothing.  On a GPU they compare against NumPy with their stated tolerances; here
both sides compute alike, so a failure means the test itself (or the path it drives) is broken."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_every_gpu_test_passes_on_the_stand_in():
    env = {**os.environ, "MINIRT_GPU_TESTS_ON_STAND_IN": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "tests/model/test_gpu.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    # tests/model/test_gpu.py holds 12 (one of them twice, parametrized).
    assert passed >= 12 and "skipped" not in summary, summary
