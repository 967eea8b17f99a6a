"""Scale-out on Ray Data: the same records as one process, from any number of worker processes or
machines.

Owns: reading prompts as a Ray Dataset (`PromptsDatasource`: one file, a folder or a glob, streamed
in chunks of lines, every row keeping its global input index), the worker that serves them
(`GenerateWorker`: one `LLM` per actor, loaded once, serving each batch in static groups), and
`generate_dataset`, the one function that turns prompts into a Dataset of records.  It is the only
module that imports ray (`pip install -e ".[ray]"` from a clone).

Why the records are those of one process: a request's tokens never depend on its batch or its
neighbours, and a request without a seed of its own gets one derived from the run's seed and its
global index.  So however the rows are split between workers, each request is made exactly as one
process makes it (the same index, line number, id and parameters) and gives the same tokens, text
and finish reason (its timings are seconds from its worker batch's start).  Four fields describe
where it ran: a worker counts `group`, `rounds_waited`, `first_round` and `finish_round` within the
batch of rows it served, and the command replays one process's schedule from them
(serve_on_ray.OneProcessSchedule).

Fault tolerance is Ray's: an actor that dies is restarted and its batch retried, so every index
comes out exactly once.

Must not know: the layers, the KV cache, sampling, or how the command line reports.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Iterable, Iterator

import numpy as np
import ray
from ray.data import ActorPoolStrategy, Dataset, DataContext
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ..errors import MinirtError
from .prompt_chunks import LINES_PER_CHUNK, Chunk, chunk_rows, plan_chunks, prompt_files
from .ray_cluster import check_answers, start_ray
from ..cli.plural import plural
from ..cli.prompt_file import PromptEntry, parse_jsonl_object

DEFAULT_WORKERS = 2
# A worker serves rows in batches of this many static groups (batch_size rows each).
GROUPS_PER_BATCH = 4


# ----------------------------------------------------------------------------- reading prompts


class PromptsDatasource(Datasource):
    """Prompts files as a Ray Dataset with columns `index` (the global input index) and `entry` (the
    parsed line, as JSON): each read task streams one chunk of lines."""

    def __init__(self, source: str, fmt: str = "auto", entries_per_chunk: int = LINES_PER_CHUNK):
        self.chunks = plan_chunks(prompt_files(source), fmt, entries_per_chunk)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(c.size for c in self.chunks)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
        return [
            ReadTask(
                partial(chunk_block, chunk),
                BlockMetadata(
                    num_rows=chunk.entries,
                    size_bytes=chunk.size,
                    exec_stats=None,
                    input_files=(chunk.path,),
                ),
            )
            for chunk in self.chunks
        ]

    @property
    def total(self) -> int:
        return sum(c.entries for c in self.chunks)


def chunk_block(chunk: Chunk) -> list:
    """A read task's output: one chunk's rows as one block."""
    rows = list(chunk_rows(chunk))
    return [
        BlockAccessor.batch_to_block(
            {
                "index": np.array([r["index"] for r in rows], dtype=np.int64),
                "entry": np.array([r["entry"] for r in rows], dtype=object),
            }
        )
    ]


def entries_dataset(prompts, fmt: str = "auto") -> tuple[Dataset, int | None]:
    """(a Dataset of `index` and `entry` rows, how many rows or None if unknown) from a prompts
    file, folder or glob; a list of prompts (strings or token-id lists); or a Dataset with `index`
    and `prompt` columns (and optionally `id` and any sampling field)."""
    if isinstance(prompts, Dataset):
        return prompts.map(entry_row), None
    if isinstance(prompts, (str, os.PathLike)):
        prompts = PromptsDatasource(str(prompts), fmt)
    if isinstance(prompts, PromptsDatasource):
        return ray.data.read_datasource(prompts), prompts.total
    if isinstance(prompts, (list, tuple)):
        rows = [
            {"index": i, "entry": json.dumps(asdict(PromptEntry(i + 1, p)))}
            for i, p in enumerate(prompts)
        ]
        return ray.data.from_items(rows), len(rows)
    raise TypeError(
        "prompts must be a path, a list of prompts or a ray.data.Dataset, "
        f"got {type(prompts).__name__}"
    )


def entry_row(row: dict[str, Any]) -> dict[str, Any]:
    """A user's Dataset row ({"index", "prompt", optional "id" and sampling fields}) as an entry
    row.  The row is read as a JSONL line is (`parse_jsonl_object`), so a field of the wrong type
    fails that row alone, naming the field.  A null, as an Arrow table holds for a value one row
    lacks, is a field left out: that row gets the default (a null prompt: no prompt, its error)."""
    fields = {name: plain_value(value) for name, value in row.items()}
    index = fields.pop("index", None)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise MinirtError(
            f"a Dataset row's index must be an integer >= 0 (its place in the input), got "
            f"{index!r}; give every row its index"
        )
    given = {name: value for name, value in fields.items() if value is not None}
    entry = parse_jsonl_object(index + 1, given)
    return {"index": index, "entry": json.dumps(asdict(entry), ensure_ascii=False)}


def plain_value(value):
    """A Dataset value as json.loads would have made it: lists for arrays, Python numbers for
    NumPy's."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


# ----------------------------------------------------------------------------- serving


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker is made with: the model, `LLM(...)`'s settings, the run's sampling
    overrides."""

    model: str | None
    llm_kwargs: dict[str, Any]
    overrides: dict[str, Any]
    logprobs: bool


class GenerateWorker:
    """One worker actor: loads the model once, then serves each batch of rows in static groups.
    `worker_class` gives each run its own subclass that carries the run's `config` (so no
    constructor argument has to live in Ray's object store, where a restarted actor could fail to
    find it)."""

    config: WorkerConfig

    def __init__(self) -> None:
        # The worker's imports, made in its own process.
        from ..loading.checkpoint import shipped_model_folder  # noqa: PLC0415 (see above)
        from ..llm import LLM  # noqa: PLC0415
        from ..cli.sampling_flags import sampling_defaults  # noqa: PLC0415

        self.llm = LLM(self.config.model or shipped_model_folder(), **self.config.llm_kwargs)
        self.defaults = sampling_defaults(self.llm.defaults, self.config.overrides)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ..cli.records import record  # noqa: PLC0415
        from ..cli.requests_from_prompts import build_requests  # noqa: PLC0415

        indexes = [int(i) for i in batch["index"]]
        entries = [PromptEntry(**json.loads(text)) for text in batch["entry"]]
        requests = build_requests(
            self.llm, entries, self.defaults, self.config.logprobs, indexes=indexes
        )
        self.llm.run(requests)
        lines = [
            json.dumps(record(r, self.llm.tokenizer), ensure_ascii=False, allow_nan=False)
            for r in requests
        ]
        engine = self.llm.engine
        n_positions = self.llm.model.config.n_positions
        return {
            # A prompt's n samples: n rows.
            "index": np.array([r.index for r in requests], dtype=np.int64),
            "record": np.array(lines, dtype=object),
            "failed": np.array([r.error is not None for r in requests]),
            # What replaying one process's schedule needs (serve_on_ray.OneProcessSchedule).
            "max_new_tokens": np.array([r.params.max_tokens for r in requests], dtype=np.int64),
            "kv_budget": np.full(len(requests), engine.kv_budget_positions, dtype=np.int64),
            "n_positions": np.full(len(requests), n_positions, dtype=np.int64),
        }


def worker_class(config: WorkerConfig) -> type[GenerateWorker]:
    return type("GenerateWorker", (GenerateWorker,), {"config": config})


def generate_dataset(
    prompts,
    model: str | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    rows_per_batch: int | None = None,
    cpus_per_worker: float = 1.0,
    fmt: str = "auto",
    overrides: dict[str, Any] | None = None,
    logprobs: bool = False,
    **llm_kwargs,
) -> tuple[Dataset, int | None]:
    """Serve prompts on `workers` actors: (a Dataset of records in input order, how many or None).

    `prompts`: a prompts file (.txt or .jsonl), a folder of them, a glob; a list of prompts; or a
    Dataset with an `index` and a `prompt` column (and optionally `id` and any sampling field, as in
    a JSONL line). `overrides`: sampling fields for every request (as the command-line flags); a
    row's own fields win. `llm_kwargs`: what `LLM(...)` takes (backend, dtype, batch_size,
    kv_budget_mib, kv_budget_tokens, seed, policy, round_token_budget).  Each output row has
    `index`, `record` (the JSON line of that request, its `group` and round fields counted within
    its worker's batch: `serve_on_ray.OneProcessSchedule` replays them as one process gives them),
    `failed`, and what that replay needs (`max_new_tokens`, `kv_budget`, `n_positions`).

        import ray, json
        from minirt.distributed.ray_data import generate_dataset
        ray.init()
        records, total = generate_dataset(
            "prompts.jsonl", workers=4, overrides={"max_tokens": 40}, seed=1
        )
        for row in records.iter_rows():
            print(json.loads(row["record"])["text"])
    """
    if not isinstance(workers, int) or workers < 1:
        raise MinirtError(f"workers must be at least 1, got {workers!r}")
    # Records leave in input order.
    DataContext.get_current().execution_options.preserve_order = True
    entries, total = entries_dataset(prompts, fmt)
    # Small batches: spread wide.
    rows_per_batch = rows_per_batch or GROUPS_PER_BATCH * llm_kwargs.get("batch_size", 8)
    records = entries.map_batches(
        worker_class(WorkerConfig(model, llm_kwargs, overrides or {}, logprobs)),
        batch_size=rows_per_batch,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=workers),
        num_cpus=cpus_per_worker,
        # Ray Data's actor pool restarts an actor that dies and retries its batch (max_restarts
        # and max_task_retries are -1 there by default): test_ray_data.py kills one mid-run.
        runtime_env=worker_env(cpus_per_worker),
    )
    return records, total


def worker_env(cpus_per_worker: float) -> dict[str, Any]:
    """Each worker's BLAS keeps to its share of a machine's cores."""
    threads = str(max(1, int(cpus_per_worker)))
    return {"env_vars": {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}}


# ----------------------------------------------------------------------------- the command line


def connect(address: str, workers: int, cpus_per_worker: float = 1.0) -> str:
    """Start a local Ray instance ('local') or join a cluster ('auto', 'ray://host:port'); a
    one-line MinirtError when that fails.  Locally, Ray gets enough logical CPUs for the read stage
    beside every worker."""
    # Asked first, even with Ray already started in this process: a HOST:PORT where nothing
    # answers is the user's mistake whatever else holds.
    check_answers(address)
    if ray.is_initialized():
        return "ray: already initialized"
    # Ray Data's plan and progress lines: the command says what it needs to.
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    start_ray(address, int(workers * cpus_per_worker) + 2)
    # The command draws its own.
    DataContext.get_current().enable_progress_bars = False
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return f"ray: {address}, {plural(workers, 'worker')}, {plural(cpus, 'logical CPU')}"


def worker_errors_as_one_line(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The rows; a worker's failure (a model it cannot load, a backend it does not have) as one
    MinirtError line: minirt's own message when the worker raised one, else the first line of
    Ray's."""
    try:
        yield from rows
    except ray.exceptions.RayError as exc:
        text = str(exc)
        ours = re.findall(r"^minirt\.errors\.\w+: (.+)$", text, re.MULTILINE)
        if ours:
            message = ours[-1]
        else:
            message = (text.splitlines() or [type(exc).__name__])[0][:300]
        raise MinirtError(f"a Ray worker failed: {message}") from None
