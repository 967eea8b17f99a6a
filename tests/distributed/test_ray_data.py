"""Scale-out on Ray Data gives the records of one process, with any number of workers.

The expected records come from the single-process run of the same prompts (`python -m minirt.generate`
without --ray), an independent path through the same engine: no Ray, one LLM, one queue.  On a local Ray
cluster that the tests start themselves (with more logical CPUs than this machine's 2 cores, so the read
stage and two actors can all be scheduled), 2 workers must give, for every index exactly once, the same
records: every field equal (the group and round fields replayed as one process schedules them), logprobs
within 1e-5.  A worker killed mid-run is restarted by Ray and its batch retried: still every index exactly once.

Marked `ray` and skipped cleanly without the `[ray]` extra; CI installs it and runs them.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs ray (pip install -e .[ray])")
pytestmark = pytest.mark.ray

from minirt.cli.command import EXIT_OK, EXIT_REQUEST_FAILED, EXIT_USAGE, run_command  # noqa: E402
from minirt.errors import MinirtError  # noqa: E402
from minirt.distributed import ray_data as distributed  # noqa: E402 (after the importorskip above)
from minirt.distributed import serve_on_ray as scale_out  # noqa: E402
from minirt.generate import main as generate_main  # noqa: E402
from conftest import FIXTURES, completions  # noqa: E402

WHAT_A_REQUEST_PRODUCED = (
    "index",
    "id",
    "prompt",
    "text",
    "token_ids",
    "finish_reason",
    "error",
    "prompt_tokens",
    "prompt_token_ids",
)
TIMINGS = ("arrival_s", "first_token_s", "finish_s")
WHERE_IT_RAN = (
    "group",
    "rounds_waited",
    "first_round",
    "finish_round",
)  # the worker's; replayed by the command


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for this module: 4 logical CPUs on 2 cores, so that the read stage and 2 actors fit."""
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def workload(n: int = 110, seed: int = 0) -> list[str]:
    """n JSONL lines: sampled and seeded, greedy, some with their own max_new_tokens, a token-id prompt, one bad."""
    rng = random.Random(seed)
    words = [
        "ROMEO",
        "JULIET",
        "To be",
        "All the world",
        "Now is the winter",
        "Friends, Romans",
        "O",
        "Café",
    ]
    lines = []
    for i in range(n):
        if i == 37:
            lines.append('{"prompt": "a bad line", "temperature": -1}')
            continue
        row: dict = {"prompt": f"{rng.choice(words)} {i}."}
        if i % 3 == 0:
            row["max_new_tokens"] = rng.randint(1, 12)
        if i % 2 == 0:
            row.update(temperature=1.0, top_k=40)
        if i % 4 == 0:
            row["seed"] = rng.randint(0, 10**6)
        if i % 10 == 0:
            row["id"] = f"q{i}"
        if i == 50:
            row["prompt"] = [5, 6, 7]
        lines.append(json.dumps(row, ensure_ascii=False))
        if i % 25 == 0:
            lines.append("")  # a blank line: skipped, and it takes no index
    return lines


def generate(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(generate_main, argv, prog="minirt.generate")
    return code, out.getvalue(), err.getvalue()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def untimed(record: dict) -> dict:
    """A record without its timing fields (seconds from the start of a run: no two runs agree on them)."""
    return {k: v for k, v in record.items() if k not in TIMINGS}


def produced(record: dict) -> dict:
    return {k: record.get(k) for k in WHAT_A_REQUEST_PRODUCED}


def same_logprobs(got: list[dict], want: list[dict]) -> bool:
    """Each token's logprob within 1e-5: a row's logits agree to ~1e-5 whatever its neighbours (the contract), and
    a request's neighbours in a worker's batch are not those it has in one process."""
    return all(
        len(g["logprobs"]) == len(w["logprobs"])
        and all(abs(a - b) <= 1e-5 for a, b in zip(g["logprobs"], w["logprobs"], strict=True))
        for g, w in zip(got, want, strict=True)
    )


@pytest.fixture(scope="module")
def prompts_and_single_run(tiny_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("\n".join(workload()) + "\n", encoding="utf-8")
    single = folder / "single.jsonl"
    code, _, err = generate(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--output",
            str(single),
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "--logprobs",
            "--quiet",
            "--no-progress",
        ]
    )
    assert code == EXIT_REQUEST_FAILED, err  # the bad line fails alone
    return prompts, records(single)


def test_two_workers_give_the_records_of_one_process(
    local_ray, tiny_lm, prompts_and_single_run, tmp_path
):
    prompts, single = prompts_and_single_run
    out = tmp_path / "ray.jsonl"
    code, stdout, err = generate(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--output",
            str(out),
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "--logprobs",
            "--ray",
            "local",
            "--workers",
            "2",
            "--no-progress",
        ]
    )
    assert code == EXIT_REQUEST_FAILED, err  # as without --ray: 1, because one request failed
    got = records(out)
    assert len(single) == 110 and [r["index"] for r in got] == list(
        range(110)
    )  # each once, in input order
    assert [produced(r) for r in got] == [produced(r) for r in single] and same_logprobs(
        got, single
    )
    assert all(
        set(r) == set(s) for r, s in zip(got, single, strict=True)
    )  # the same fields, none added
    assert where(got) == where(single)
    assert got[37]["error"] == single[37]["error"] and "temperature" in got[37]["error"]
    assert stdout.count("### [") == 110 and "requests     110 (109 ok, 1 failed)" in err


def where(records: list[dict]) -> list[list]:
    return [[r[k] for k in WHERE_IT_RAN] for r in records]


def test_where_each_request_ran_is_one_process_schedule(local_ray, tiny_lm, prompts_and_single_run):
    """The workers count groups and rounds within their own batches of 4 groups (and a failed line takes no row,
    so their groups after row 37 hold other members); the command replays one process's schedule from them."""
    prompts, single = prompts_and_single_run
    dataset, _ = distributed.generate_dataset(
        str(prompts), str(tiny_lm), overrides={"max_new_tokens": 8}, logprobs=True, seed=3
    )
    rows = list(dataset.iter_rows())
    raw = [json.loads(row["record"]) for row in rows]
    assert where(raw[:32]) == where(single[:32]) and where(raw) != where(
        single
    )  # the first batch alone matches
    schedule = scale_out.OneProcessSchedule("static", 8, 2048)
    replayed = []
    for record, row in zip(raw, rows, strict=True):
        schedule.add(record, row)
        replayed += schedule.ready()
    replayed += schedule.ready(final=True)
    assert where(replayed) == where(single)


def test_an_interrupted_replay_keeps_every_record():
    """Records whose schedule is not known yet (their group has not filled) are drained, not lost."""
    schedule = scale_out.OneProcessSchedule("static", 8, 2048)
    row = {"kv_budget": 1000, "n_positions": 64, "max_new_tokens": 4}
    for i in range(3):
        schedule.add(
            {
                "index": i,
                "id": str(i),
                "prompt_tokens": 2,
                "group": 1,
                "rounds_waited": 0,
                "first_round": 1,
                "finish_round": 4,
                "text": "x",
                "token_ids": [0, 0, 0, 0],
                "finish_reason": "length",
            },
            row,
        )
    assert list(schedule.ready()) == []  # 3 waiting of a group of 8: more may join it
    drained = list(schedule.drain())
    assert [(r["index"], r["text"], r["group"], r["first_round"]) for r in drained] == [
        (i, "x", None, None) for i in range(3)
    ]


@pytest.mark.parametrize(
    "policy, flags",
    [
        ("static", ["--kv-budget", "40"]),
        ("continuous", ["--batch-size", "5", "--max-round-tokens", "24"]),
        ("continuous", ["--kv-budget", "60", "--batch-size", "6"]),
        ("static", ["--n", "3", "--temperature", "1"]),
    ],
)
def test_the_file_is_the_file_of_one_process(
    local_ray, tiny_lm, prompts_and_single_run, tmp_path, policy, flags
):
    """Every field but the timing ones, under either policy, with the KV budget or round budget binding (and
    without the prefix cache, the default: each worker's cache would be its own, and the replay has none)."""
    prompts, _ = prompts_and_single_run
    common = [
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "10",
        "--policy",
        policy,
        "--quiet",
        "--no-progress",
        *flags,
    ]
    assert generate([*common, "--output", str(tmp_path / "one.jsonl")])[0] == EXIT_REQUEST_FAILED
    assert (
        generate([*common, "--output", str(tmp_path / "ray.jsonl"), "--ray", "local"])[0]
        == EXIT_REQUEST_FAILED
    )
    one, on_ray = records(tmp_path / "one.jsonl"), records(tmp_path / "ray.jsonl")
    assert [untimed(r) for r in one] == [untimed(r) for r in on_ray]


def test_a_killed_worker_is_replaced_and_every_index_comes_once(
    local_ray, tiny_lm, prompts_and_single_run
):
    prompts, single = prompts_and_single_run
    dataset, total = distributed.generate_dataset(
        str(prompts),
        str(tiny_lm),
        workers=2,
        rows_per_batch=4,
        overrides={"max_new_tokens": 8},
        logprobs=True,
        seed=3,
    )
    rows, killed = [], None
    for row in dataset.iter_rows():
        rows.append(row)
        if killed is None and len(rows) == 8:  # mid-run: some batches done, most to come
            killed = worker_pids()[0]
            os.kill(killed, signal.SIGKILL)
    assert killed is not None and total == 110
    assert killed not in worker_pids()  # it really died; Ray started another in its place
    assert [int(r["index"]) for r in rows] == list(range(110))
    assert [produced(json.loads(r["record"])) for r in rows] == [produced(r) for r in single]
    assert same_logprobs([json.loads(r["record"]) for r in rows], single)


def worker_pids() -> list[int]:
    """The processes of minirt's worker actors (Ray names them ray::MapWorker(MapBatches(GenerateWorker)))."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"MapBatches(GenerateWorker)" in cmdline:
                pids.append(int(proc.name))
    return sorted(pids)


def test_a_folder_output_holds_the_records_in_shards(
    local_ray, tiny_lm, prompts_and_single_run, tmp_path, monkeypatch
):
    prompts, single = prompts_and_single_run
    monkeypatch.setattr(scale_out, "SHARD_RECORDS", 40)
    out = tmp_path / "shards"
    code, _, err = generate(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--output",
            f"{out}{os.sep}",
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "--logprobs",
            "--ray",
            "local",
            "--quiet",
        ]
    )
    assert code == EXIT_REQUEST_FAILED, err
    shards = sorted(out.iterdir())
    assert [p.name for p in shards] == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    got = [r for shard in shards for r in records(shard)]
    assert [len(records(p)) for p in shards] == [40, 40, 30]
    assert [produced(r) for r in got] == [produced(r) for r in single] and same_logprobs(
        got, single
    )


def test_the_api_takes_a_list_or_a_dataset(local_ray, tiny_lm):
    from minirt import LLM, SamplingParams

    prompts = ["To be", "ROMEO.", [5, 6, 7], "All the world"]
    params = SamplingParams(max_tokens=6, temperature=1.0, top_k=20)
    want = completions(LLM(tiny_lm, seed=9).generate(prompts, params))
    overrides = {"max_new_tokens": 6, "temperature": 1.0, "top_k": 20}
    from_list, _ = distributed.generate_dataset(prompts, str(tiny_lm), overrides=overrides, seed=9)
    rows = [{"index": i, "prompt": p} for i, p in enumerate(prompts)][
        ::-1
    ]  # any order in: records by index
    from_rows, _ = distributed.generate_dataset(
        ray.data.from_items(rows), str(tiny_lm), overrides=overrides, seed=9
    )
    for dataset in (from_list, from_rows):
        got = sorted(
            (json.loads(r["record"]) for r in dataset.iter_rows()), key=lambda r: r["index"]
        )
        assert [(r["index"], r["token_ids"], r["text"]) for r in got] == [
            (o.index, o.token_ids, o.text) for o in want
        ]


def test_a_llama_family_model_runs_on_ray_data_as_in_one_process(local_ray):
    """A Llama-family folder (RoPE, grouped queries, a byte-fallback SentencePiece tokenizer)
    through the Ray Data path: the records of one process, and its first token transformers'."""
    from minirt import LLM, SamplingParams

    folder = FIXTURES / "mistral_chat_byte_fallback"
    prompts = ["Hello world, how are you today?", "Café 日本語 😀", [5, 6, 7]]
    params = SamplingParams(max_tokens=5, temperature=1.0, top_k=20)
    want = completions(LLM(folder, seed=4).generate(prompts, params))
    overrides = {"max_new_tokens": 5, "temperature": 1.0, "top_k": 20}
    dataset, _ = distributed.generate_dataset(prompts, str(folder), overrides=overrides, seed=4)
    got = sorted((json.loads(r["record"]) for r in dataset.iter_rows()), key=lambda r: r["index"])
    assert [(r["index"], r["token_ids"], r["text"]) for r in got] == [
        (o.index, o.token_ids, o.text) for o in want
    ]
    # Greedy, the first token is transformers' pick after its own encoding (BOS included).
    expected = np.load(folder / "expected.npz")
    dataset, _ = distributed.generate_dataset(
        prompts[:2], str(folder), overrides={"max_new_tokens": 1, "temperature": 0.0}
    )
    got = sorted((json.loads(r["record"]) for r in dataset.iter_rows()), key=lambda r: r["index"])
    for b, record in enumerate(got):
        sequence = expected[f"seq_{b}"]
        assert record["prompt_tokens"] == len(sequence)
        assert record["token_ids"] == [int(expected["logits"][b, len(sequence) - 1].argmax())]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--prompts", "-"], "--ray reads prompts from files"),
        (["--prompt", "x", "--trace"], "no --trace or --stream"),
        (["--prompt", "x", "--workers", "0"], "--workers must be at least 1"),
        (["--prompts", "/no/such/dir/*.jsonl"], "no file matches"),
    ],
)
def test_bad_ray_flags_are_one_line(argv, fragment):
    code, out, err = generate(["--ray", "local", *argv])
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1 and fragment in err, err


def test_an_address_where_nothing_answers_is_one_line_at_once():
    start = time.perf_counter()
    code, out, err = generate(
        ["--prompt", "x", "--ray", "127.0.0.1:1"]
    )  # port 1 on this machine: closed
    assert (
        code == EXIT_USAGE
        and err.count("\n") == 1
        and "--ray 127.0.0.1:1: nothing answers there" in err
    ), err
    assert time.perf_counter() - start < 30


def test_ok_exit_without_failures(local_ray, tiny_lm, tmp_path):
    start = time.perf_counter()
    code, out, err = generate(
        [
            "--model",
            str(tiny_lm),
            "--prompt",
            "To be",
            "--prompt",
            "ROMEO.",
            "--ray",
            "local",
            "--max-new-tokens",
            "3",
        ]
    )
    assert code == EXIT_OK and out.count("### [") == 2, err
    assert time.perf_counter() - start < 120


def test_dataset_rows_with_nulls_are_rows_with_those_fields_left_out(local_ray, tiny_lm):
    """An Arrow table holds a null wherever a row lacks a value its column has elsewhere.  Each null is a
    field left out (the row gets the default, as a JSONL line without it does); a null prompt fails its
    row alone; a value of the wrong type fails its row naming the field.  The reference is LLM.generate
    in this process on each row's non-null fields."""
    import pyarrow as pa

    from minirt import LLM, SamplingParams

    table = pa.table(
        {
            "index": [0, 1, 2, 3, 4],
            "prompt": ["To be", None, "ROMEO.", "All the world", "O"],
            "id": ["first", "second", None, None, "fifth"],
            "seed": [5, None, 7, None, 3],
            "temperature": [0.9, 1.0, None, 1.2, 0.0],
            "stop": [None, None, ["."], None, None],
            "max_new_tokens": [4, 4, 5, None, 3],
        }
    )
    got, _ = distributed.generate_dataset(
        ray.data.from_arrow(table), str(tiny_lm), overrides={"max_new_tokens": 6}, seed=9
    )
    records = sorted((json.loads(r["record"]) for r in got.iter_rows()), key=lambda r: r["index"])
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4]
    llm = LLM(tiny_lm, seed=9)
    rows = table.to_pylist()
    for row, record in zip(rows, records, strict=True):
        given = {
            k: v for k, v in row.items() if v is not None and k not in ("index", "prompt", "id")
        }
        want_id = row["id"] if row["id"] is not None else str(row["index"])
        assert record["id"] == want_id
        if row["prompt"] is None:
            assert record["finish_reason"] == "error" and 'no "prompt" field' in record["error"]
            continue
        params = SamplingParams(**{"max_new_tokens": 6, "temperature": 0.0, **given})
        # The row's own index, as in one process: its derived seed depends on it.
        requests = llm.make_requests([row["prompt"]] * (row["index"] + 1), params)
        llm.run(requests)
        expected = requests[row["index"]]
        assert record["error"] is None
        assert (record["token_ids"], record["text"]) == (expected.token_ids, expected.text)


def test_a_dataset_row_of_the_wrong_type_fails_alone_and_a_row_without_an_index_is_one_line(
    local_ray, tiny_lm
):
    rows = [
        {"index": 0, "prompt": "To be", "id": "ok", "seed": 1},
        {"index": 1, "prompt": "To be", "id": "bad", "seed": "one"},
    ]
    got, _ = distributed.generate_dataset(ray.data.from_items(rows), str(tiny_lm), seed=9)
    records = {r["id"]: r for r in map(json.loads, (row["record"] for row in got.iter_rows()))}
    assert records["ok"]["error"] is None
    assert records["bad"]["finish_reason"] == "error"
    assert (
        records["bad"]["error"].startswith("line 2: seed must be")
        and "'one'" not in records["bad"]["error"]
    )
    no_index = ray.data.from_items([{"index": None, "prompt": "To be"}])
    got, _ = distributed.generate_dataset(no_index, str(tiny_lm), seed=9)
    with pytest.raises(MinirtError, match="index must be an integer >= 0"):
        list(distributed.worker_errors_as_one_line(got.iter_rows()))


def test_every_serving_flag_reaches_the_workers_llm(monkeypatch):
    """`generate --ray` builds each worker's LLM from the same flags as one process: --prefix-cache,
    --no-chunked-prefill and --batch-invariant among them, none dropped on the way."""
    from minirt.generate import build_parser

    args = build_parser().parse_args(
        [
            "--prompt",
            "x",
            "--ray",
            "auto",
            "--prefix-cache",
            "--no-chunked-prefill",
            "--batch-invariant",
        ]
    )
    args.kv_budget_mib, args.kv_budget_tokens = None, None
    args.overrides = {}
    args.format = "txt"
    captured = {}
    monkeypatch.setattr(scale_out, "generate_dataset", lambda *a, **kw: captured.update(kw))
    scale_out.records_dataset(args, Path("model"), source=[], cpus=1)
    assert captured["prefix_cache"] is True
    assert captured["chunked_prefill"] is False
    assert captured["batch_invariant"] is True
