"""`python -m minirt.generate --ray ADDRESS --workers N`: the command's side of a run on Ray Data.

Owns: `serve_on_ray`, which checks what it can before Ray starts (the model folder, the prompts
files, the --output path, a local backend), serves through `ray_data.generate_dataset`, and reports
as generate does without --ray: each record in input order to --output (`RecordSink`: one JSONL
file, replaced only by a run that wrote records, or a folder of shards), each completion to standard
output, a summary, and exit status 1 if any request failed.  `OneProcessSchedule` replays the run
on the engine (its scheduler and loop, with a runner that computes nothing) from what the workers
report, so that each record's group and round fields are those one process gives: the file is the
file of one process, but for the timing fields (seconds from each worker batch's start).

Must not know: Ray itself (minirt/distributed/ray_data.py alone imports it), the layers, or
sampling."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from ..model.backend import get_backend
from ..loading.checkpoint import load_checkpoint
from ..cli.command import EXIT_OK, EXIT_REQUEST_FAILED
from ..cli.output_file import OutputFile
from .ray_data import PromptsDatasource, connect, generate_dataset, worker_errors_as_one_line
from ..errors import MinirtError
from ..cli.plural import plural
from ..cli.records import completion_block
from ..engine.engine import Engine
from ..engine.model_free_runner import Ending, ModelFreeRunner
from ..engine.request import Request, Status
from ..engine.params import SamplingParams

# Records per file of a folder --output.
SHARD_RECORDS = 100_000


class RecordSink:
    """Where records go, in input order: one JSONL file (replaced only by a run that wrote records,
    as without --ray), or a folder of shards part-00000.jsonl, part-00001.jsonl, ... of
    SHARD_RECORDS records each."""

    def __init__(self, output: str | None):
        self.folder: str | None = None
        if output and (output.endswith(os.sep) or Path(output).is_dir()):
            self.folder = output
        if self.folder is not None:
            try:
                Path(self.folder).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise MinirtError(
                    f"cannot make the --output folder {self.folder} ({exc.strerror})"
                ) from None
        self.file: OutputFile | None = None
        if output and self.folder is None:
            self.file = OutputFile(output)
        self.written = 0

    def write(self, line: str) -> None:
        if self.folder is not None and self.written % SHARD_RECORDS == 0:
            self.close_file(interrupted=False)
            self.file = OutputFile(
                str(Path(self.folder) / f"part-{self.written // SHARD_RECORDS:05d}.jsonl")
            )
        if self.file is not None:
            self.file.write(line + "\n")
        self.written += 1

    def close_file(self, interrupted: bool) -> None:
        if self.file is not None:
            self.file.close(interrupted=interrupted)
            self.file = None


class OneProcessSchedule:
    """The `group`, `rounds_waited`, `first_round` and `finish_round` that one process gives each
    request, found by replaying the run on the engine itself (its scheduler, KV owner and loop
    over `step()`) with a runner that computes nothing (minirt/engine/model_free_runner.py),
    from what the workers report: which requests ran, their prompt lengths and max_new_tokens
    (a request's KV need), and how many tokens each produced before it stopped (or failed).
    Records go in in input order and come out in input order with those four fields replaced.
    Continuous batching is replayed with the workers' chunked prefill, but without their prefix
    caches: a cache hit only makes a prefill feed fewer tokens, which moves rounds only where a
    round's token budget binds.  Static groups are replayed as records arrive (a group is chosen
    once batch_size requests wait, or at the end); continuous batching may admit a later request
    first, so it is replayed at the end."""

    SCHEDULED = ("group", "rounds_waited", "first_round", "finish_round")

    def __init__(
        self, policy: str, batch_size: int, round_tokens: int, chunked_prefill: bool = True
    ):
        self.policy = policy
        self.batch_size = batch_size
        self.round_tokens = round_tokens
        self.chunked_prefill = chunked_prefill
        self.runner = ModelFreeRunner()
        # Made with the first row: the KV budget and the context come from the workers.
        self.engine: Engine | None = None
        # In input order, their four fields not known yet.
        self.pending: deque[tuple[dict[str, Any], Request | None]] = deque()
        self.stubs = 0

    def add(self, record: dict[str, Any], row: dict[str, Any]) -> None:
        if self.engine is None:
            self.runner.n_positions = int(row["n_positions"])
            self.engine = Engine(
                self.runner,
                None,
                batch_size=self.batch_size,
                policy=self.policy,
                round_token_budget=self.round_tokens,
                kv_budget_tokens=int(row["kv_budget"]),
                chunked_prefill=self.chunked_prefill,
                # No round grid is drawn from its steps.
                round_records=False,
            )
        stub = None
        # It ran, so it was queued in one process too.
        if record["first_round"] is not None:
            stub = Request(
                index=self.stubs,
                id=record["id"],
                prompt=None,
                prompt_ids=[0] * record["prompt_tokens"],
                params=SamplingParams(max_tokens=int(row["max_new_tokens"]), ignore_eos=True),
            )
            self.stubs += 1
            failed_mid_run = record["finish_reason"] == "error"
            self.runner.endings[stub] = Ending(len(record["token_ids"]), fails=failed_mid_run)
            # In one process, every request of the run was there when it started.
            self.engine.add_request(stub, arrival_s=0.0, arrival_round=0)
        self.pending.append((record, stub))

    def ready(self, final: bool = False) -> Iterator[dict[str, Any]]:
        """The records whose four fields are now known, in input order (all of them when
        `final`)."""
        engine = self.engine
        while engine is not None and engine.has_unfinished():
            # Static: a new group is chosen from what waits.
            choosing = not engine.scheduler.running
            short = choosing and len(engine.scheduler.waiting) < self.batch_size
            # More records may join the choice.
            if not final and (self.policy != "static" or short):
                break
            engine.step()
        while self.pending and (self.pending[0][1] is None or self.pending[0][1].finished):
            record, stub = self.pending.popleft()
            if stub is not None:
                record.update({name: getattr(stub, name) for name in self.SCHEDULED})
            yield record

    def drain(self) -> Iterator[dict[str, Any]]:
        """After an interruption: every record still waiting for its schedule, in input order, its
        four fields None (not known: the requests before it never all arrived); kept, not lost."""
        while self.pending:
            record, _ = self.pending.popleft()
            yield {**record, **dict.fromkeys(self.SCHEDULED)}


class RayProgress:
    """'records N/total | T tokens | tok/s' on standard error, redrawn at most ten times a
    second."""

    def __init__(self, total: int | None, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.tokens = 0
        self.last = 0.0
        self.start = time.perf_counter()
        # The characters the bar's line holds now (0: nothing drawn), for `clear` to wipe.
        self.drawn_width = 0

    def update(self, written: int, tokens: int) -> None:
        self.tokens += tokens
        now = time.perf_counter()
        if self.enabled and (now - self.last >= 0.1 or written == self.total):
            self.last = now
            line = (
                f"generating on ray: {written}/{self.total} records | "
                f"{plural(self.tokens, 'token')} | {self.tokens / (now - self.start):.1f} tok/s"
            )
            print("\r" + line, end="", file=sys.stderr, flush=True)
            self.drawn_width = len(line)

    def clear(self) -> None:
        """Wipe the bar's line before a completion is printed on the same screen; the next update
        draws the bar again."""
        if self.enabled and self.drawn_width:
            print("\r" + " " * self.drawn_width + "\r", end="", file=sys.stderr, flush=True)
            self.drawn_width = 0
            self.last = 0.0

    def close(self) -> None:
        if self.enabled and self.drawn_width:
            print(file=sys.stderr)


def request_from_record(record: dict[str, Any]):
    """A finished request rebuilt from its record, for the completion block standard output
    shows."""
    # The label says "sample k" only when there are several.
    if "sample" in record:
        samples = 2
    else:
        samples = 1
    request = Request(
        index=record["index"],
        id=record["id"],
        prompt=record["prompt"],
        prompt_ids=record.get("prompt_token_ids") or [],
        params=SamplingParams(n=samples),
        sample=record.get("sample", 0),
    )
    for name in (
        "text",
        "token_ids",
        "finish_reason",
        "error",
        "group",
        "first_round",
        "finish_round",
    ):
        setattr(request, name, record[name])
    request.status = Status.FINISHED
    return request


def records_dataset(args, model_folder: Path, source, cpus: int):
    """The run's Dataset of records, every flag meaning what it means without --ray."""
    llm_kwargs = {
        "backend": args.backend,
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "policy": args.policy,
        "round_token_budget": args.max_round_tokens,
        "kv_budget_tokens": args.kv_budget_tokens,
        "prefix_cache": args.prefix_cache,
        "chunked_prefill": args.chunked_prefill,
        "batch_invariant": args.batch_invariant,
    }
    if args.kv_budget_mib is not None:
        llm_kwargs["kv_budget_mib"] = args.kv_budget_mib
    return generate_dataset(
        source,
        str(model_folder),
        workers=args.workers,
        cpus_per_worker=cpus,
        fmt=args.format,
        overrides=args.overrides,
        logprobs=args.logprobs is not None,
        **llm_kwargs,
    )


def serve_on_ray(args, model_folder: Path, signals) -> int:
    """`python -m minirt.generate --ray ADDRESS --workers N`: the records of the run without --ray,
    in input order to --output (a file, or a folder of shards) and as completions to standard
    output; exit 1 if any failed."""
    start = time.perf_counter()
    source = checked_source(args, model_folder)
    # A bad --output path fails here, before Ray starts.
    sink = RecordSink(args.output)
    cpus = worker_cpus(args)
    try:
        print(connect(args.ray, args.workers, cpus), file=sys.stderr)
        records, total = records_dataset(args, model_folder, source, cpus)
    except BaseException:
        # Nothing was written: an existing --output stays as it was.
        sink.close_file(interrupted=True)
        raise
    progress = RayProgress(total, enabled=not args.no_progress and sys.stderr.isatty())
    failed = write_records(args, records, sink, progress, signals)
    print(
        f"requests     {sink.written} ({sink.written - failed} ok, {failed} failed)\n"
        f"tokens       {progress.tokens} generated\n"
        f"workers      {args.workers} on Ray ({args.ray}), {plural(total, 'row')} read in "
        "chunks\n"
        f"wall time    {time.perf_counter() - start:.2f} s, model loads included",
        file=sys.stderr,
    )
    if failed:
        return EXIT_REQUEST_FAILED
    return EXIT_OK


def checked_source(args, model_folder: Path):
    """What the prompts come from, once everything that can be checked here has been: a bad model
    folder, backend or prompts file is one line here, not an error in every worker."""
    load_checkpoint(model_folder)
    # The workers run on this machine: it must have their backend.
    if args.ray == "local":
        get_backend(args.backend)
    if args.prompts is not None:
        return PromptsDatasource(args.prompts, args.format)
    return args.prompt


def worker_cpus(args) -> int:
    """CPUs per worker: --worker-cpus, else this machine's share (local), else 1."""
    if args.worker_cpus is not None:
        return args.worker_cpus
    if args.ray == "local":
        return max(1, (os.cpu_count() or 1) // args.workers)
    return 1


def write_records(args, records, sink: RecordSink, progress: RayProgress, signals) -> int:
    """Every record, in input order, to the sink and as a completion to standard output; how many
    failed.  Ctrl-C or SIGTERM: the records already final are written, scheduled or not."""
    schedule = OneProcessSchedule(
        args.policy, args.batch_size, args.max_round_tokens, args.chunked_prefill
    )
    failed = 0
    interrupted = True

    def emit(final: bool) -> None:
        for record in schedule.ready(final):
            with signals.held():
                sink.write(json.dumps(record, ensure_ascii=False, allow_nan=False))
            if not args.quiet:
                # The bar's line is wiped first when the completions share its screen.
                if sys.stdout.isatty():
                    progress.clear()
                block = completion_block(request_from_record(record), sys.stdout.isatty())
                print(block, flush=True)
            progress.update(sink.written, len(record["token_ids"]))

    try:
        for row in worker_errors_as_one_line(records.iter_rows()):
            schedule.add(json.loads(row["record"]), row)
            failed += bool(row["failed"])
            emit(final=False)
        emit(final=True)
        interrupted = False
    except KeyboardInterrupt:
        with signals.held():
            for record in schedule.drain():
                sink.write(json.dumps(record, ensure_ascii=False, allow_nan=False))
        raise
    finally:
        progress.close()
        with signals.held():
            sink.close_file(interrupted=interrupted)
    return failed
