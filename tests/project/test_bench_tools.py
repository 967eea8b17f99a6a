"""The benchmark tools' BLAS environment (tools/bench/blas_env.py) and their peak-RSS reading.

The tools time their work with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default (the kernel a
user's NumPy picks), or kept (`--blas-env keep`), and print what threadpoolctl reports.  The suite
itself keeps both variables as the machine sets them: nothing here changes this process's
environment; each check runs in a child.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "tools" / "bench"
sys.path.insert(0, str(BENCH))

import blas_env  # noqa: E402 (after its folder is on the path)

VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# What threadpoolctl says in a child with exactly this environment: the independent reading.
THREADPOOLCTL_KERNEL = (
    "import numpy, threadpoolctl; numpy.ones((2, 2)) @ numpy.ones((2, 2)); "
    "print([i['architecture'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas'][0])"
)


def child(args, env):
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout


def test_unset_drops_both_variables_and_keeps_everything_else():
    base = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512", "OTHER": "1", "PATH": "/x"}
    assert blas_env.environment_for("unset", base) == {"OTHER": "1", "PATH": "/x"}
    assert blas_env.environment_for("keep", base) == base
    # The base itself is not changed.
    assert base["OPENBLAS_CORETYPE"] == "Haswell"
    with pytest.raises(ValueError, match="unset, keep"):
        blas_env.environment_for("forget", base)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="OPENBLAS_CORETYPE=Haswell is x86-64's")
def test_the_report_names_the_kernel_that_threadpoolctl_sees_under_each_choice():
    forced = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    clean = {name: value for name, value in forced.items() if name not in VARIABLES}
    picked = child(["-c", THREADPOOLCTL_KERNEL], clean).strip()
    # Default: the tool re-executes itself without the variables, whatever its parent had.
    unset = child([str(BENCH / "blas_env.py")], forced)
    assert f"kernel {picked}," in unset
    assert "OPENBLAS_CORETYPE=unset, OPENBLAS_L2_SIZE=unset" in unset
    kept = child([str(BENCH / "blas_env.py"), "--blas-env", "keep"], forced)
    assert "kernel Haswell," in kept and "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512" in kept


@pytest.mark.parametrize(
    "tool",
    [
        ["bench.py"],
        ["llama_cpp.py", "compare"],
        ["measure_load.py"],
        ["ray_bench.py"],
    ],
)
def test_every_bench_tool_takes_blas_env_with_unset_as_its_default(tool):
    help_text = child([str(BENCH / tool[0]), *tool[1:], "--help"], dict(os.environ))
    assert "--blas-env {unset,keep}" in help_text
    assert "unset (the default)" in " ".join(help_text.split())


def test_a_childs_peak_rss_is_its_own_not_its_parents():
    """bench.py's children report VmHWM: a parent holding 400 MB does not lend them its peak (as
    ru_maxrss can, across fork and exec)."""
    parent = (
        "import subprocess, sys, numpy\n"
        "held = numpy.ones(100 * 2**20, numpy.float32)  # 400 MB, touched\n"
        "code = 'import sys; sys.path.insert(0, sys.argv[1]); import bench; print(bench.peak_rss_mb())'\n"
        "out = subprocess.run([sys.executable, '-c', code, sys.argv[1]], capture_output=True, text=True, check=True)\n"
        "print(out.stdout.strip().splitlines()[-1])\n"
    )
    reported = float(child(["-c", parent, str(BENCH)], dict(os.environ)).strip())
    assert 10 < reported < 300, reported


def test_the_decode_floor_runs_and_fills_its_table():
    """`bench.py --decode-floor` on the tiny fixture: the kernel line, then a row per batch size with a
    number in every column of its header."""
    out = child(
        [
            str(BENCH / "bench.py"),
            "--decode-floor",
            "--model",
            str(ROOT / "tests/fixtures/base"),
            "--steps",
            "2",
        ],
        dict(os.environ),
    )
    lines = out.splitlines()
    assert lines[0].startswith("BLAS: ") and "OPENBLAS_CORETYPE=unset" in lines[0]
    header = next(line for line in lines if line.startswith("| batch |"))
    rows = [line for line in lines if line.startswith(("| 1 |", "| 8 |", "| 32 |"))]
    assert len(rows) == 3
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == header.count("|") - 1
        assert all(float(cell.rstrip("x")) > 0 for cell in cells)
