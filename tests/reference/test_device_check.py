"""The CPU side of tools/bench/device_check.py: argument parsing, the NumPy run, the byte counts, the JSON."""

import json
import time

import numpy as np
import pytest

from conftest import ROOT, random_model, requires_reference
from device_check import kv_bytes_per_step, parse_args, summary_table, weight_bytes_per_step


# Every section of the script, in the order it runs them by default (written out here, not read
# from the script, so that a section dropped or reordered there fails these tests).
EVERY_SECTION = [
    "environment",
    "gpu_tests",
    "correctness",
    "greedy",
    "timing",
    "floor",
    "counts",
    "launches",
]


def test_arguments():
    args = parse_args(["--batch-sizes", "1,8,64", "--dtypes", "float16", "--out", "x.json"])
    assert args.batch_sizes == [1, 8, 64] and args.dtypes == ["float16"] and args.backend == "cupy"
    assert args.sections == EVERY_SECTION
    quick = parse_args(["--quick", "--new-tokens", "64"])
    assert quick.new_tokens == 4
    with pytest.raises(SystemExit):
        parse_args(["--sections", "environment,bogus"])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_weight_bytes_count_every_block_tensor_and_an_fp32_head(dtype):
    model = random_model(
        seed=0, vocab_size=97, n_embd=24, n_head=3, n_layer=2, n_inner=40, n_positions=16
    )
    item = np.dtype(dtype).itemsize
    blocks = sum(a.size for name, a in model.params.items() if name.startswith("h.")) * item
    want = blocks + model.params["ln_f.weight"].size * 2 * item + 97 * 24 * 4
    assert weight_bytes_per_step(model.config, dtype) == want
    assert kv_bytes_per_step(model.config, dtype, batch=3, kv_len=10) == 2 * 2 * 3 * 10 * 24 * item


@requires_reference
def test_numpy_run_writes_every_section(tmp_path):
    from device_check import main

    out = tmp_path / "dc.json"
    assert (
        main(
            [
                "--backend",
                "numpy",
                "--quick",
                "--batch-sizes",
                "1,2",
                "--dtypes",
                "float32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    sections = results["sections"]
    assert list(sections) == EVERY_SECTION
    assert sections["correctness"]["fp32_within_1e-4"] is True
    # NumPy's greedy tokens are transformers' on the shipped model, where every margin is wide.
    assert sections["greedy"]["shipped_float32"]["prompts_identical"] == 8
    assert sections["greedy"]["no_clear_parting"] is True
    assert sections["timing"]["float32_batch2"]["minirt"]["tokens_per_s"] > 0
    assert sections["timing"]["float32_batch2"]["ratio"] > 0
    assert 0 < sections["floor"]["float32_batch1"]["fraction_of_floor"]
    table = summary_table(results)
    assert "float32      2" in table and "timing        ok" in table


def test_a_section_that_fails_is_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
    import device_check

    def broken(args, deadline, state):
        raise RuntimeError("simulated failure")

    monkeypatch.setitem(device_check.SECTIONS, "environment", broken)
    out = tmp_path / "dc.json"
    assert (
        device_check.main(
            ["--backend", "numpy", "--quick", "--sections", "environment,floor", "--out", str(out)]
        )
        == 0
    )
    sections = json.loads(out.read_text())["sections"]
    assert sections["environment"]["error"] == "RuntimeError: simulated failure"
    assert sections["floor"]["skipped"] == "needs the timing section"


def test_the_whole_script_runs_on_the_cpu_without_torch(tmp_path):
    """What a GPU session runs, start to end on NumPy with no torch (the default suite): every
    section, every fixture against its saved transformers logits, the stand-in's counts."""
    from device_check import main

    out = tmp_path / "dc.json"
    argv = ["--backend", "numpy", "--quick", "--no-transformers", "--batch-sizes", "1,2"]
    assert main([*argv, "--out", str(out)]) == 0
    sections = json.loads(out.read_text())["sections"]
    assert list(sections) == EVERY_SECTION
    assert sections["greedy"] == {"skipped": "--no-transformers", "seconds": 0.0}
    assert not any("error" in section for section in sections.values() if isinstance(section, dict))
    fixtures = sections["correctness"]["fixtures_max_rel_error_vs_transformers"]
    assert len(fixtures) >= 9 and max(fixtures.values()) <= 1e-5
    assert sections["timing"]["float32_batch2"]["minirt"]["tokens_per_s"] > 0
    counts = sections["counts"]
    assert counts["findings"] == []
    for name in ("prefill", "decode"):
        assert (counts[name]["uploads"], counts[name]["downloads"], counts[name]["syncs"]) == (
            1,
            1,
            1,
        )


def test_greedy_partings_are_found_at_the_first_difference_and_judged_by_its_margin():
    """By hand: prompt 0 equal throughout, prompt 1 parts at step 2 where the reference's margin
    was wide (0.2 of its largest logit), prompt 2 at step 0 where it was a near-tie (1e-6)."""
    from device_check import compare_greedy

    theirs = [
        {"tokens": [5, 6, 7], "margins": [0.5, 0.5, 0.5]},
        {"tokens": [1, 2, 3], "margins": [0.5, 0.5, 0.2]},
        {"tokens": [9, 9, 9], "margins": [1e-6, 0.5, 0.5]},
    ]
    ours = [[5, 6, 7], [1, 2, 4], [8, 9, 9]]
    result = compare_greedy(ours, theirs, "float32")
    assert result["prompts_identical"] == 1
    assert result["tokens_equal_before_parting"] == 3 + 2 + 0
    assert result["tokens"] == 9
    assert [(p["prompt"], p["step"], p["clear"]) for p in result["partings"]] == [
        (1, 2, True),
        (2, 0, False),
    ]
    assert result["clear_partings"] == 1
    # The same near-tie is no clear parting in fp16 either, nor a margin of 0.02 (under 3%).
    theirs[1]["margins"][2] = 0.02
    assert compare_greedy(ours, theirs, "float16")["clear_partings"] == 0


def test_per_launch_time_is_the_mean_over_the_timed_calls():
    from device_check import per_launch_us

    calls = []

    def launch():
        calls.append(None)
        time.sleep(0.001)

    us = per_launch_us(launch, sync=lambda: None, repeats=20)
    assert len(calls) == 50 + 20  # the warm-up, then the timed calls
    assert 1000 <= us < 20000


def test_the_host_profile_names_the_forward_pass(tmp_path):
    """The cProfile of decode rounds, run on NumPy: its top self times are per round, and the
    layer functions a round calls once per block are counted once per block."""
    from device_check import minirt_host_profile

    folder = ROOT / "tests" / "fixtures" / "base"
    result = minirt_host_profile(folder, "float32", 2, 5, rounds=4, backend="numpy")
    assert result["round_ms_profiled"] > 0
    top = result["top_self_time"]
    assert len(top) == 15
    assert all(row["ms_a_round"] >= 0 for row in top)
    assert top == sorted(top, key=lambda row: -row["ms_a_round"])
