"""The BLAS environment a benchmark's timed work runs under, and the report of what it got.

These machines set OPENBLAS_CORETYPE (to Haswell) and OPENBLAS_L2_SIZE, because older OpenBLAS builds
compute wrong results or crash on this processor without them.  A current NumPy does not need them, and
a user's machine does not set them: there NumPy's OpenBLAS picks its kernel itself (SkylakeX, with
AVX-512, on this processor).  So a benchmark measures, by default, with both variables unset, in its own
command alone; the tests and CI keep them as the machine sets them.  Both are unset, as a user has
neither (measured here, `--gemm`: the slow case is the two together, Haswell with an L2 size of 512;
either one alone unset gave the fast GEMM).

Each tool in tools/bench takes `--blas-env unset` (the default: the kernel NumPy picks) or `--blas-env
keep` (the variables as this machine sets them), re-executes itself once under that environment before
anything is timed (`run_under`), so that every process it starts inherits it, and prints `report()`,
which says what threadpoolctl finds: the BLAS library, its version, kernel and threads.

    python tools/bench/blas_env.py                      # the report under the kernel NumPy picks
    python tools/bench/blas_env.py --blas-env keep      # ... and under the machine's variables
    python tools/bench/blas_env.py --gemm               # and one fp32 GEMM's speed under it
    env -u OPENBLAS_CORETYPE python tools/bench/blas_env.py --blas-env keep --gemm
                                                        # only one of the two unset
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CHOICES = ("unset", "keep")
# Set on the re-executed process (and so on everything it starts): it already runs under this choice.
MARKER = "MINIRT_BENCH_BLAS_ENV"


def add_blas_env_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--blas-env",
        choices=CHOICES,
        default="unset",
        help="unset (the default): time with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, "
        "so NumPy's OpenBLAS picks its kernel, as on a user's machine; "
        "keep: with both as this machine sets them",
    )


def environment_for(choice: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the two variables unset, or kept."""
    if choice not in CHOICES:
        raise ValueError(f"--blas-env must be one of {', '.join(CHOICES)}, not {choice!r}")
    env = dict(os.environ if base is None else base)
    if choice == "unset":
        for name in BLAS_VARIABLES:
            env.pop(name, None)
    return env


def run_under(choice: str) -> None:
    """Re-execute this script once under the chosen environment, unless it already runs under it.
    Call it before anything is timed; OpenBLAS reads the variables when NumPy first loads it, so a
    fresh process is the only way to change them.  Once only: the re-executed process carries
    MARKER, so a start-up hook that sets a variable again cannot make it loop (report() then shows
    the variable as it is).  The interpreter's own options (-O, -X ...) are kept."""
    if os.environ.get(MARKER) == choice:
        return
    wanted = environment_for(choice)
    wanted[MARKER] = choice
    sys.stdout.flush()
    os.execve(sys.executable, list(sys.orig_argv), wanted)


def report() -> str:
    """One line: the BLAS that threadpoolctl finds in this process, and the two variables."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        raise SystemExit(
            "tools/bench: threadpoolctl reports the BLAS kernel, and it is not installed: "
            "pip install threadpoolctl (it comes with the test and reference extras)"
        ) from None
    # A matrix product, so that NumPy's BLAS is loaded and its threads started.
    np.ones((2, 2)) @ np.ones((2, 2))
    libraries = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    if not libraries:
        described = "threadpoolctl finds no BLAS library in this process"
    else:
        described = "; ".join(describe_library(info) for info in libraries)
    variables = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in BLAS_VARIABLES)
    return f"BLAS: {described} ({variables})"


def describe_library(info: dict) -> str:
    """threadpoolctl's record of one library, as 'openblas 0.3.31, kernel SkylakeX, 2 threads'."""
    kernel = info.get("architecture") or "not reported"
    threads = info.get("num_threads")
    return f"{info.get('internal_api')} {info.get('version')}, kernel {kernel}, {threads} threads"


def gemm_gflops(repeats: int = 21) -> str:
    """One fp32 GEMM, [512, 768] @ [768, 3072] (a 512-token prompt's MLP expansion in gpt2-124M):
    the median of `repeats` runs, in GFLOP/s, with the range."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 768)).astype(np.float32)
    weight = rng.standard_normal((768, 3072)).astype(np.float32)
    x @ weight
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        x @ weight
        rates.append(2 * 512 * 768 * 3072 / (time.perf_counter() - start) / 1e9)
    median = statistics.median(rates)
    return f"fp32 GEMM [512, 768] @ [768, 3072]: {median:.0f} GFLOP/s ({min(rates):.0f}-{max(rates):.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Print the BLAS kernel NumPy uses under a benchmark's environment.",
        epilog="examples:\n  python tools/bench/blas_env.py\n"
        "  python tools/bench/blas_env.py --blas-env keep\n"
        "  python tools/bench/blas_env.py --gemm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_blas_env_argument(parser)
    parser.add_argument(
        "--gemm", action="store_true", help="also time one fp32 GEMM under that environment"
    )
    args = parser.parse_args()
    run_under(args.blas_env)
    print(report())
    if args.gemm:
        print(gemm_gflops())
    return 0


if __name__ == "__main__":
    sys.exit(main())
