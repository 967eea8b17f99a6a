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
anything is timed (`run_under`), so that every process it starts inherits it, and prints `report()`:
the machine (`machine()`: the CPU's model and vendor, the cores this process may use, its vector
extensions and its L2 and L3 caches, since a figure holds for one kind of machine only; Intel Xeons
and AMD EPYCs rank minirt and transformers differently) and what threadpoolctl finds: the BLAS
library, its version, kernel and threads.

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


# The vector extensions that decide a BLAS kernel's speed, as /proc/cpuinfo's flags name them.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_info(text: str | None = None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none, as on macOS)."""
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, str]:
    """{level: size} of the first CPU's unified (or data) caches at levels 2 and 3, as sysfs writes
    them ('1024K'); {} where sysfs has none."""
    sizes: dict[int, str] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return sizes
    for entry in entries:
        folder = os.path.join(root, entry)
        try:
            with open(os.path.join(folder, "level"), encoding="ascii") as f:
                level = int(f.read())
            with open(os.path.join(folder, "type"), encoding="ascii") as f:
                kind = f.read().strip()
            with open(os.path.join(folder, "size"), encoding="ascii") as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if level >= 2 and kind in ("Unified", "Data"):
            sizes[level] = size
    return sizes


def machine() -> str:
    """One line: 'machine: AMD EPYC (AuthenticAMD), 2 cores, avx2 fma avx512f ..., L2 1024K a core,
    L3 32768K'."""
    import platform

    info = cpu_info()
    model = info.get("model name") or platform.processor() or platform.machine()
    vendor = info.get("vendor_id")
    named = f"{model} ({vendor})" if vendor else model
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 0
    flags = set(info.get("flags", "").split())
    vectors = " ".join(flag for flag in VECTOR_FLAGS if flag in flags) or "no AVX2"
    caches = cache_sizes()
    cache_text = ", ".join(
        f"L{level} {size}{' a core' if level == 2 else ''}"
        for level, size in sorted(caches.items())
    )
    parts = [named, f"{cores} cores", vectors] + ([cache_text] if cache_text else [])
    return "machine: " + ", ".join(parts)


def report() -> str:
    """Two lines: the machine, then the BLAS that threadpoolctl finds in this process and the two
    variables."""
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
    return f"{machine()}\nBLAS: {described} ({variables})"


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
