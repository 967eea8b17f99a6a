"""The benchmark tools' BLAS environment (tools/bench/blas_env.py) and their peak-RSS reading.

The tools time their work with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset by default (the kernel a
user's NumPy picks), or kept (`--blas-env keep`), and print what threadpoolctl reports.  The suite
itself keeps both variables as the machine sets them: nothing here changes this process's
environment; each check runs in a child.
"""

import json
import os
import platform
import re
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
    # The machine first, then the BLAS it ran with.
    assert lines[0] == blas_env.machine()
    assert lines[1].startswith("BLAS: ") and "OPENBLAS_CORETYPE=unset" in lines[1]
    header = next(line for line in lines if line.startswith("| batch |"))
    rows = [line for line in lines if line.startswith(("| 1 |", "| 8 |", "| 32 |"))]
    assert len(rows) == 3
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == header.count("|") - 1
        # The tiny model's GEMMs may round to 0.00 ms or 0 GB/s; its whole step does not.
        assert all(float(cell.rstrip("x")) >= 0 for cell in cells)
        assert float(cells[1]) > 0


@pytest.mark.parametrize("choice", ["unset", "keep"])
def test_the_matrix_hands_its_blas_choice_to_every_child(choice, monkeypatch):
    """bench.py's parent starts each measurement as a child of its own: the child must be told the
    parent's --blas-env, or it would re-execute itself under the default."""
    import argparse

    import bench

    started = []

    class Done:
        returncode = 0
        stdout = '{"rate": 1.0}\n'
        stderr = ""

    def fake_run(command, **kwargs):
        started.append(command)
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = argparse.Namespace(model="m", dtype="float32", seed=0, timeout=1, blas_env=choice)
    bench.run_child("minirt", "short-b1", args)
    command = started[0]
    assert command[command.index("--blas-env") + 1] == choice


def test_a_child_measures_under_the_choice_it_is_given():
    """A minirt child of the matrix, on the tiny fixture, reports the BLAS it ran with."""
    forced = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    fixture = str(ROOT / "tests/fixtures/base")
    for choice, expected in (
        ("keep", "OPENBLAS_CORETYPE=Haswell"),
        ("unset", "OPENBLAS_CORETYPE=unset"),
    ):
        out = child(
            [
                str(BENCH / "bench.py"),
                "--child",
                "minirt",
                "short-b1",
                "--model",
                fixture,
                "--blas-env",
                choice,
            ],
            forced,
        )
        assert expected in json.loads(out.strip().splitlines()[-1])["blas"]


def test_a_start_up_hook_that_sets_a_variable_again_cannot_make_the_re_execution_loop(tmp_path):
    """A sitecustomize that puts OPENBLAS_CORETYPE back on every start: the tool re-executes once,
    then runs, and its report says the variable is set (it does not hide what it could not undo)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nos.environ.setdefault('OPENBLAS_CORETYPE', 'Haswell')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop(blas_env.MARKER, None)
    out = child([str(BENCH / "blas_env.py")], env)
    assert "OPENBLAS_CORETYPE=Haswell" in out


@pytest.mark.parametrize("tool", ["bench.py", "llama_cpp.py", "measure_load.py", "ray_bench.py"])
def test_every_bench_tool_re_executes_under_its_choice_before_it_times(tool):
    """The contract each tool keeps: it calls blas_env.run_under with its --blas-env choice (the
    tests above show what run_under does; this holds that every tool calls it)."""
    assert "blas_env.run_under(args.blas_env)" in (BENCH / tool).read_text()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo (Linux)")
def test_the_report_names_the_machine_as_lscpu_and_nproc_see_it():
    """Every tool prints the machine beside the BLAS kernel: its CPU model, the cores it may use, its vector
    extensions and caches, each held to lscpu and nproc (the independent readings)."""
    import re
    import shutil

    if shutil.which("lscpu") is None or shutil.which("nproc") is None:
        pytest.skip("needs lscpu and nproc")
    lscpu = subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=True, env={"LC_ALL": "C"}
    ).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    fields = {name.strip(): value.strip() for name, value in fields.items()}
    described = blas_env.machine()
    assert described.startswith(f"machine: {fields['Model name']} ")
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    assert f", {cores} cores, " in described
    for flag in ("avx2", "avx512f", "amx_tile"):
        assert (f" {flag}" in described) == (flag in fields.get("Flags", "").split())
    # lscpu: "L2 cache: 2 MiB (2 instances)"; the report gives one core's share.
    l2 = re.match(r"([\d.]+) (KiB|MiB) \((\d+) instances?\)", fields["L2 cache"])
    if l2:
        kib = float(l2.group(1)) * (1024 if l2.group(2) == "MiB" else 1) / int(l2.group(3))
        assert f"L2 {kib:.0f}K a core" in described
    # And the tool's own report leads with it.
    assert child([str(BENCH / "blas_env.py")], dict(os.environ)).splitlines()[0] == described


def test_the_round_profile_counts_every_operation_of_every_round():
    """tools/bench/round_profile.py on the tiny fixture (2 layers): the machine and BLAS first; then each
    operation's calls as the model makes them (4 weight products a layer a round, 2 layer norms a layer and
    the final one, one head a round), and shares of the run that add up to 100%."""
    out = child(
        [str(BENCH / "round_profile.py"), "--model", str(ROOT / "tests/fixtures/base")],
        dict(os.environ),
    )
    lines = out.splitlines()
    assert lines[0] == blas_env.machine() and lines[1].startswith("BLAS: ")
    rows = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 8 and cells[1] in ("prefill", "decode", "both"):
            rows[(cells[0], cells[1])] = cells
    rounds = 32  # short-b8: 32 new tokens, round 1 the prefill
    layers = 2
    assert rows[("linear", "prefill")][3] == str(4 * layers)
    assert rows[("linear", "decode")][3] == str(4 * layers * (rounds - 1))
    assert rows[("layer_norm", "decode")][3] == str((2 * layers + 1) * (rounds - 1))
    assert rows[("lm_head", "decode")][3] == str(rounds - 1)
    assert rows[("the rest", "both")][3] == f"{rounds} rounds"
    shares = [float(cells[2].rstrip("%")) for cells in rows.values()]
    assert abs(sum(shares) - 100) < 0.5 and all(share >= 0 for share in shares)
    # Page faults a call: a count, never negative; the weights' rate only where a weight is read.
    assert all(float(cells[6]) >= 0 for key, cells in rows.items() if key[0] != "the rest")
    for (name, phase), cells in rows.items():
        assert (cells[7] != "") == (name in ("linear", "lm_head")), (name, phase, cells)


def test_the_round_profile_counts_the_page_faults_of_fresh_memory_and_none_of_reused():
    """round_profile's page-fault column: an operation that touches 32 MiB of freshly mapped memory, page
    by page, is charged at least one fault a touched page (8192 of 4 KiB; where transparent huge pages
    are "always", 16 of 2 MiB); one that rewrites memory already touched is charged next to none (the
    interpreter's own allocations may fault a page in a long-running process)."""
    import mmap

    import round_profile

    page = mmap.PAGESIZE
    size = 32 * 2**20

    def touch_fresh():
        fresh = mmap.mmap(-1, size)
        for offset in range(0, size, page):
            fresh[offset] = 1
        fresh.close()

    kept = bytearray(size)
    # Touched once before the clock: a large bytearray is calloc's, pages not yet faulted in.
    for offset in range(0, size, page):
        kept[offset] = 1

    def touch_kept():
        for offset in range(0, size, page):
            kept[offset] = 2

    clock = round_profile.Clock()
    clock.wrap("fresh", touch_fresh)()
    clock.wrap("kept", touch_kept)()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    huge_pages_always = thp.exists() and "[always]" in thp.read_text()
    smallest_fault = 2 * 2**20 if huge_pages_always else page
    assert clock.page_faults[("fresh", "prefill")] >= size // smallest_fault
    assert clock.page_faults[("kept", "prefill")] <= 2


def test_changed_tokens_compares_by_hand():
    """changed_tokens.compare on made-up runs: vectors equal by bytes, requests by their tokens."""
    import changed_tokens

    solo = ({0: [b"a", b"b"], 1: [b"c"]}, {0: [5, 6], 1: [7]})
    together = ({0: [b"a", b"x"], 1: [b"c"]}, {0: [5, 6], 1: [8]})
    assert changed_tokens.compare(solo, together) == (2, 3, 1)
    assert changed_tokens.compare(solo, solo) == (3, 3, 0)


def test_changed_tokens_finds_nothing_changed_in_exact_mode():
    """The tool end to end on a few requests: in exact mode every batching leaves every logit vector
    as it was alone (the property tests/engine/test_exact_batch_invariance.py proves), and the table
    has a row a batching."""
    out = child(
        [str(BENCH / "changed_tokens.py"), "--requests", "4", "--modes", "exact"], dict(os.environ)
    )
    rows = [line for line in out.splitlines() if line.startswith("| exact |")]
    assert [row.split("|")[2].strip() for row in rows] == [
        "static-8",
        "static-32",
        "continuous-8",
        "continuous-16-chunked",
        "prefix-cache",
    ]
    for row in rows:
        equal, requests = row.split("|")[3:5]
        vectors = re.match(r" (\d+) of (\d+) \(100\.0%\) ", equal)
        assert vectors and vectors.group(1) == vectors.group(2)
        assert requests.strip() == "0 of 4 (0.0%)"


def test_invariance_cost_runs_and_fills_its_table():
    out = child(
        [
            str(BENCH / "invariance_cost.py"),
            "--model",
            str(ROOT / "tests/fixtures/base"),
            "--repeats",
            "1",
            "--workloads",
            "decode-b1",
            "decode-b8",
        ],
        dict(os.environ),
    )
    rows = [line for line in out.splitlines() if line.startswith("| decode-")]
    assert len(rows) == 2 and all(row.rstrip().endswith("| yes |") for row in rows)
    assert "exact mode's weight products ran in calls of (" in out


# ---------------------------------------------------------------------------- the Llama family (#41)


def reference_shapes() -> dict:
    """tools/fixtures/reference.py's SHAPES, read from its source (importing it needs torch)."""
    import ast

    tree = ast.parse((ROOT / "tools/fixtures/reference.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SHAPES":
            return ast.literal_eval(node.value)
    raise AssertionError("reference.py has no SHAPES")


def test_the_bench_tools_offer_the_shapes_reference_py_makes():
    import bench
    import llama_cpp

    shapes = reference_shapes()
    assert tuple(shapes) == bench.SHAPES == llama_cpp.SHAPES
    smollm2, qwen = shapes["smollm2-135m"], shapes["qwen2.5-0.5b"]
    assert (smollm2["hidden_size"], smollm2["num_key_value_heads"], smollm2["vocab_size"]) == (
        576,
        3,
        49152,
    )
    assert (qwen["hidden_size"], qwen["num_key_value_heads"], qwen["vocab_size"]) == (
        896,
        2,
        151936,
    )


def test_bench_shape_makes_its_checkpoint_in_tmp_unless_a_model_is_given(monkeypatch):
    import argparse
    import types

    import bench

    made = []
    fake = types.ModuleType("reference")
    fake.make_shape = lambda name, folder: made.append((name, folder)) or folder
    fake.make_gpt2_124m = lambda folder: made.append(("gpt2", folder)) or folder
    monkeypatch.setitem(sys.modules, "reference", fake)
    args = argparse.Namespace(model=None, shape="qwen2.5-0.5b", scratch=None)
    assert bench.default_model(args) == "/tmp/qwen2.5-0.5b-random"
    args = argparse.Namespace(model=None, shape=None, scratch=None)
    assert bench.default_model(args) == "/tmp/gpt2-124m-random"
    assert bench.default_model(argparse.Namespace(model="m", shape="x", scratch=None)) == "m"
    assert [name for name, _ in made] == ["qwen2.5-0.5b", "gpt2"]


def test_transformers_pads_with_the_first_eos_id_of_a_list():
    import bench

    assert bench.pad_token_id([151645, 151643]) == 151645
    assert bench.pad_token_id(50256) == 50256
    assert bench.pad_token_id(None) == bench.pad_token_id([]) == 0


def test_llama_cpp_shape_picks_its_own_folder_and_gguf():
    import argparse

    import llama_cpp

    args = argparse.Namespace(shape="smollm2-135m", model=None, gguf=None)
    llama_cpp.shape_defaults(args)
    assert (str(args.model), str(args.gguf)) == (
        "/tmp/smollm2-135m-gpt2vocab",
        "/tmp/smollm2-135m-gpt2vocab-f32.gguf",
    )
    args = argparse.Namespace(shape=None, model=None, gguf=Path("g.gguf"))
    llama_cpp.shape_defaults(args)
    assert (str(args.model), str(args.gguf)) == ("/tmp/gpt2-124m-random", "g.gguf")


def test_kv_rows_reads_the_engines_bytes_a_position_and_gqas_gain():
    """On the tiny grouped-query fixture, the engine's bytes a position are the arithmetic's, and
    the budget holds heads / K/V heads times the positions it would without GQA."""
    import kv_rows

    row = kv_rows.budget_row(str(ROOT / "tests/fixtures/llama_gqa2"), 1.0, 16)
    config = json.loads((ROOT / "tests/fixtures/llama_gqa2/config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    assert kv_heads < heads
    assert row["bytes"] == row["arithmetic"]
    assert row["bytes_without"] == row["bytes"] * heads // kv_heads
    assert row["positions"] == 2**20 // row["bytes"]
    assert row["rows"] == row["positions"] // 16


def test_a_minirt_child_of_the_matrix_runs_a_llama_family_model():
    """The matrix's minirt side on a tiny Qwen2 fixture (no torch): every request at full length."""
    out = child(
        [
            str(BENCH / "bench.py"),
            "--child",
            "minirt",
            "short-b8",
            "--model",
            str(ROOT / "tests/fixtures/qwen2_bias"),
        ],
        dict(os.environ),
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["tokens"]) == 8 and all(len(t) == 32 for t in result["tokens"])
    assert result["rate"] > 0
