"""`python -m minirt.generate --ray ADDRESS --workers N`: the command's side of a run on Ray Data.

Owns: `serve_on_ray`, which checks what it can before Ray starts (the model folder, the prompts files, the
--output path, a local backend), serves through `distributed.generate_dataset`, and reports as generate does
without --ray: each record in input order to --output (`RecordSink`: one JSONL file, replaced only by a run that
wrote records, or a folder of shards), each completion to standard output, a summary, and exit status 1 if
any request failed.

Must not know: Ray itself (minirt/distributed.py alone imports it), the layers, or sampling.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .backend import get_backend
from .checkpoint import load_checkpoint
from .cli import EXIT_OK, EXIT_REQUEST_FAILED, OutputFile
from .distributed import PromptsDatasource, connect, generate_dataset, worker_errors_as_one_line
from .errors import MinirtError
from .report import completion_block
from .request import Request, Status
from .sampling import SamplingParams

SHARD_RECORDS = 100_000  # records per file of a folder --output


class RecordSink:
    """Where records go, in input order: one JSONL file (replaced only by a run that wrote records, as without
    --ray), or a folder of shards part-00000.jsonl, part-00001.jsonl, ... of SHARD_RECORDS records each."""

    def __init__(self, output: str | None):
        self.make_file = OutputFile
        self.folder = output if output and (output.endswith(os.sep) or Path(output).is_dir()) else None
        if self.folder is not None:
            try:
                Path(self.folder).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise MinirtError(f"cannot make the --output folder {self.folder} ({exc.strerror})") from None
        self.file = OutputFile(output) if output and self.folder is None else None
        self.written = 0

    def write(self, line: str) -> None:
        if self.folder is not None and self.written % SHARD_RECORDS == 0:
            self.close_file(interrupted=False)
            self.file = self.make_file(str(Path(self.folder) / f"part-{self.written // SHARD_RECORDS:05d}.jsonl"))
        if self.file is not None:
            self.file.write(line + "\n")
        self.written += 1

    def close_file(self, interrupted: bool) -> None:
        if self.file is not None:
            self.file.close(interrupted=interrupted)
            self.file = None


def request_from_record(record: dict[str, Any]):
    """A finished request rebuilt from its record, for the completion block standard output shows."""
    request = Request(index=record["index"], id=record["id"], prompt=record["prompt"],
                      prompt_ids=record.get("prompt_token_ids") or [], params=SamplingParams())
    for name in ("text", "token_ids", "finish_reason", "error", "group", "first_round", "finish_round"):
        setattr(request, name, record[name])
    request.status = Status.FINISHED
    return request


def serve_on_ray(args, model_folder: Path, signals) -> int:
    """`python -m minirt.generate --ray ADDRESS --workers N`: the records of the run without --ray, in input order
    to --output (a file, or a folder of shards) and as completions to standard output; exit 1 if any failed."""
    start = time.perf_counter()
    load_checkpoint(model_folder)  # a bad model folder is one line here, not an error in every worker
    if args.ray == "local":
        get_backend(args.backend)  # and so is a backend this machine (where the workers run) does not have
    source = PromptsDatasource(args.prompts, args.format) if args.prompts else args.prompt  # a bad file: here
    sink = RecordSink(args.output)  # a bad --output path fails here, before Ray starts
    cpus = args.worker_cpus or (max(1, (os.cpu_count() or 1) // args.workers) if args.ray == "local" else 1)
    try:
        print(connect(args.ray, args.workers, cpus), file=sys.stderr)
        llm_kwargs = {"backend": args.backend, "dtype": args.dtype, "batch_size": args.batch_size,
                      "seed": args.seed, "policy": args.policy, "round_token_budget": args.max_round_tokens,
                      "kv_budget_tokens": args.kv_budget_tokens}
        if args.kv_budget_mib is not None:
            llm_kwargs["kv_budget_mib"] = args.kv_budget_mib
        records, total = generate_dataset(source, str(model_folder), workers=args.workers, cpus_per_worker=cpus,
                                          fmt=args.format, overrides=args.overrides, logprobs=args.logprobs,
                                          **llm_kwargs)
    except BaseException:
        sink.close_file(interrupted=True)  # nothing was written: an existing --output stays as it was
        raise
    failed, interrupted = 0, True
    try:
        for row in worker_errors_as_one_line(records.iter_rows()):
            with signals.held():
                sink.write(row["record"])
            failed += bool(row["failed"])
            if not args.quiet:
                block = completion_block(request_from_record(json.loads(row["record"])), sys.stdout.isatty())
                print(block, flush=True)
        interrupted = False
    finally:
        with signals.held():
            sink.close_file(interrupted=interrupted)
    print(f"requests     {sink.written} ({sink.written - failed} ok, {failed} failed)\n"
          f"workers      {args.workers} on Ray ({args.ray}), {total} rows read in chunks\n"
          f"wall time    {time.perf_counter() - start:.2f} s, model loads included", file=sys.stderr)
    return EXIT_REQUEST_FAILED if failed else EXIT_OK
