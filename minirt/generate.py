"""`python -m minirt.generate --prompts FILE`: serve a file of prompts, in static groups or with
continuous batching.

Owns: the command line, in the steps that `main` calls in order:

    parse_args      flags, checked before anything is loaded
    model_folder    where the model is, and --output refused if writing it could change a file
                    there
    load            the model, and the check that needs it (--stop-token-id)
    build_requests  the prompts file, and each request's sampling parameters
                    (built-in defaults < the model's generation_config.json
                    < flags < the request's own JSONL fields)
    serve           the requests, through the `LLM` API's loop over the engine's steps
                    (`LLM.steps`), reporting each step's tokens and final records as they come
    report          the summary on standard error (serve has already printed the completions
                    in input order, the JSONL records, the progress bar and the static groups'
                    grids) and the exit status

and what keeps the records safe around them: Ctrl-C and SIGTERM end a run with every final record
written; --output is replaced only by a run that started and wrote a record (never by one refused
at the start, nor by one interrupted before any record was final), and never when it is the
prompts file or in the model folder.

Must not know: the engine, the layers, the KV cache or sampling arithmetic.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .loading.checkpoint import resolve_model_folder, shipped_model_folder
from .cli.command import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REQUEST_FAILED,
    EXIT_TERMINATED,
    add_version_flag,
    parse_command_line,
    run_command,
)
from .cli.output_file import OutputFile, writing_changes
from .cli.signals import StopSignals
from .cli.serving_flags import add_serving_flags, kv_budget_arguments, llm_from_flags
from .errors import MinirtError, Terminated, require_at_least_one
from .llm import LLM, RunStats
from .cli.prompt_file import FORMATS, PromptEntry, read_prompts
from .cli.sampling_flags import (
    add_sampling_flags,
    check_flags_for_model,
    flag_overrides,
    sampling_defaults,
)
from .cli.requests_from_prompts import build_requests
from .cli.run_refusals import refuse_budgets_no_request_fits, refuse_text_without_a_tokenizer
from .cli.records import OrderedOutput
from .cli.progress import Progress
from .cli.grids import continuous_grid, group_grid
from .cli.summary import summary
from .engine.request import Request
from .engine.params import SamplingParams


EPILOG = (
    r"""
examples:
  python -m minirt.generate --prompts examples/prompts.txt
  python -m minirt.generate --prompt "ROMEO:" --prompt "To be, or not to be" --max-tokens 30
  python -m minirt.generate --prompts examples/prompts.txt --stream    # each one as its tokens come
  python -m minirt.generate --prompts examples/prompts.jsonl --output out.jsonl """
    r"""--ray local --workers 2
  python -m minirt.generate --model gpt2 --prompts examples/prompts.jsonl --output out.jsonl --trace
  python -m minirt.generate --prompts examples/prompts.txt --policy continuous """
    r"""--batch-size 4 --trace
  python -m minirt.generate --model /path/to/gpt2-folder --prompts - """
    r"""--temperature 0.8 --top-p 0.95 --seed 1
  echo 'Once upon a time' | python -m minirt.generate --model gpt2 --prompts - --max-tokens 40

prompts files:
  .txt    one prompt per line; write a newline inside a prompt as \n, a tab as \t,
          a backslash as \\; blank lines are skipped
  .jsonl  one object per line: {"prompt": "...", "id": "q1", "max_tokens": 20, "stop": ["\n"]}
          any sampling field may be set per request: max_tokens, temperature, top_k, top_p,
          seed, stop, stop_token_ids, ignore_eos, repetition_penalty, presence_penalty,
          frequency_penalty, min_p, logit_bias, logprobs, prompt_logprobs, n; "prompt" may be
          token ids: {"prompt": [464, 318]}
  -       standard input (JSONL if the first line starts with "{", text otherwise)
  a line ends at \n (or \r\n); a bad line (not JSON or UTF-8, a bad field, over 1 MiB) fails alone

sampling defaults: the model folder's generation_config.json (the flags above show the shipped """
    r"""model's),
else greedy and 16 new tokens (docs/api.md, "Defaults"); flags override those, and a JSONL """
    r"""line's own
fields override the flags.

exit status:
  0    every request succeeded
  1    the run finished, but at least one request failed (its record carries the error)
  2    a bad flag, prompts file, model or backend, or an --output that is the prompts file or
       inside the model folder: nothing was generated, and an existing --output file is untouched
  74   writing --output or standard output failed (a full disk, /dev/full): the records before the
       failure are kept, whole
  130  interrupted (Ctrl-C); every record already final was written (none final: --output untouched)
  141  standard output was closed (| head): the run stops, unless --output still gets every record
  143  terminated (SIGTERM); every record already final was written
"""
)


def build_parser(prog: str = "python -m minirt.generate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Generate completions for a file of prompts with a model (GPT-2 or the Llama "
        "family), served in static groups (or with continuous batching, --policy continuous).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_input_flags(p)
    add_serving_flags(p, default_policy="static")
    add_sampling_flags(
        p.add_argument_group("sampling (defaults for every request; a JSONL line may override any)")
    )
    add_output_flags(p.add_argument_group("output"))
    add_ray_flags(
        p.add_argument_group(
            'scale-out on Ray Data (from a clone: pip install -e ".[ray]"; docs/ray.md)'
        )
    )
    add_version_flag(p)
    return p


def add_input_flags(p) -> None:
    """Where the prompts and the model come from."""
    p.add_argument(
        "--prompts", metavar="FILE", help="a .txt or .jsonl prompts file, or - for standard input"
    )
    p.add_argument(
        "--prompt",
        action="append",
        metavar="TEXT",
        help="a prompt itself (repeatable), not --prompts",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="prompts file format (default: from the file name)",
    )
    p.add_argument(
        "--model",
        help="a model folder or a hub id in the local Hugging Face cache "
        "(default: the model shipped in weights/)",
    )


def add_ray_flags(r) -> None:
    r.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="serve on Ray: local (starts one here), auto (the running "
        "cluster), or ray://HOST:PORT; --output FILE gets the same records, DIR/ gets them in "
        "shards",
    )
    r.add_argument(
        "--workers",
        type=int,
        default=2,
        metavar="N",
        help="with --ray: worker actors, each loading the model once (default 2)",
    )
    r.add_argument(
        "--worker-cpus",
        type=int,
        metavar="N",
        help="with --ray: CPUs (and BLAS threads) per worker "
        "(default: local, this machine's cores / --workers; on a cluster, 1)",
    )


def add_output_flags(o) -> None:
    o.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="write one JSON record per request, in input order, as each is final",
    )
    o.add_argument(
        "--logprobs",
        nargs="?",
        const=0,
        type=int,
        metavar="N",
        help="add each chosen token's log-probability to the records; with N, also the N most "
        "likely tokens at each step (top_logprobs)",
    )
    o.add_argument(
        "--trace",
        action="store_true",
        help="print the round grid on standard error (each static group's, or the continuous "
        "run's)",
    )
    o.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        help="show each completion as its tokens "
        "come, in input order (default: only a single prompt, on a terminal)",
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument(
        "--quiet",
        action="store_true",
        help="print no completions on standard output (records still go to --output)",
    )


def check_flags(args) -> None:
    """The checks that need no model and that argparse cannot make."""
    refuse_empty_values(args)
    require_at_least_one(args.batch_size, "--batch-size")
    require_at_least_one(args.max_round_tokens, "--max-round-tokens")
    # Memory, or a number of tokens.
    args.kv_budget_mib, args.kv_budget_tokens = kv_budget_arguments(args.kv_budget)
    if args.seed < 0:
        raise MinirtError(f"--seed must be at least 0, got {args.seed}")
    if (args.prompts is None) == (args.prompt is None):
        raise MinirtError(
            "give the prompts one way: --prompts FILE (- for standard input), or --prompt TEXT"
        )
    require_at_least_one(args.workers, "--workers")
    if args.worker_cpus is not None:
        require_at_least_one(args.worker_cpus, "--worker-cpus")
    if args.ray is not None and (args.prompts == "-" or args.trace or args.stream):
        raise MinirtError(
            "--ray reads prompts from files (a file, a folder or a glob), not -, and has no "
            "--trace or --stream: those show one process's rounds"
        )
    if (
        args.output is not None
        and args.prompts not in (None, "-")
        and os.path.realpath(args.output) == os.path.realpath(args.prompts)
    ):
        raise MinirtError(
            f"--output {args.output} is the prompts file; write the records somewhere else"
        )


# What to give instead of an empty value, for each flag that names a file, a model or a cluster.
INSTEAD_OF_EMPTY = {
    "--model": "give a model folder or a hub id, or leave --model out for the model shipped in "
    "weights/",
    "--output": "give a file for the records (out.jsonl), or leave --output out",
    "--prompts": "give a .txt or .jsonl file, or - for standard input",
    "--ray": "give local, auto or ray://HOST:PORT, or leave --ray out to serve in this process",
}


def refuse_empty_values(args) -> None:
    """An empty value (an unset shell variable: --model "$MODEL") is a bad value, never the flag
    left out: one line, before anything is read or loaded."""
    for flag, instead in INSTEAD_OF_EMPTY.items():
        if getattr(args, flag[2:]) == "":
            raise MinirtError(f"{flag} is empty; {instead}")


def note_prompt_files(args, prog: str) -> None:
    """A --prompt that names a file is still the prompt's text; say how to read the file."""
    # Named as its errors are: `minirt generate`, or `minirt.generate` for python -m.
    name = prog.removeprefix("python -m ")
    for text in args.prompt or ():
        if os.path.isfile(text):
            print(
                f"{name}: note: --prompt takes the prompt's text; {text} is a file: "
                f"use --prompts {text} to read it",
                file=sys.stderr,
            )


def parse_args(argv: list[str] | None, prog: str = "python -m minirt.generate"):
    """The flags, with every check that needs no model: a bad flag stops here, before anything is
    loaded."""
    args = parse_command_line(build_parser(prog), argv)
    check_flags(args)
    note_prompt_files(args, prog)
    args.overrides = flag_overrides(args)
    sampling_defaults(SamplingParams(), args.overrides)
    return args


def serve(
    llm: LLM, requests: list[Request], args, output: OrderedOutput, progress: Progress
) -> RunStats | KeyboardInterrupt:
    """Serve the requests, writing each record as soon as the input order allows.  If Ctrl-C or
    SIGTERM stops the run, every record already final is written and the interruption is
    returned."""

    try:
        # The loop over the engine's steps (LLM.steps), one round a step: its tokens, the records
        # it made final, the progress bar, and with --trace the grid of each static group that
        # ended.
        with llm.steps(requests) as steps:
            for step in steps:
                for request in step.new_tokens:
                    output.token(request)
                for request in step.finished:
                    output.final(request)
                assert llm.last_stats is not None  # set when the run started
                if step.round_number is not None:
                    progress.update(llm.last_stats, output.done)
                for group in step.ended_groups:
                    if args.trace:
                        progress.close()
                        print(group_grid(group, step.waiting), file=sys.stderr)
        stats = llm.last_stats
        assert stats is not None  # set when the run started
        # The final state: the last records come after the last round.
        progress.update(stats, output.done, force=True)
        return stats
    except KeyboardInterrupt as interruption:
        # Kept, even out of order.
        output.flush_out_of_order([r for r in requests if r.finished])
        return interruption
    finally:
        progress.close()


def model_folder(args) -> Path:
    """The folder the model is loaded from; --output is refused (before it is opened) if writing it
    could change a file there: a path inside it, a link to one of its files, anywhere in a
    hub-cache entry's repo folder.  (An empty --model or --output was refused by
    `refuse_empty_values`.)"""
    # No --model: the one minirt ships.
    if args.model is None:
        folder = resolve_model_folder(shipped_model_folder())
    else:
        folder = resolve_model_folder(args.model)
    if args.output is not None:
        why = writing_changes(args.output, folder)
    else:
        why = None
    if why:
        raise MinirtError(
            f"--output {args.output} {why} the model folder {folder}; "
            "write the records somewhere else"
        )
    return folder


def load(args, folder: Path) -> tuple[LLM, float]:
    """The model, and the check that needs it: it refuses the run before anything is served."""
    start = time.perf_counter()
    llm = llm_from_flags(args, folder)
    load_seconds = time.perf_counter() - start
    check_flags_for_model(llm.check_params, args.overrides)
    return llm, load_seconds


def prompt_entries(args) -> list[PromptEntry]:
    """The prompts as given (--prompt), or read from the prompts file (a bad one stops here,
    before loading)."""
    if args.prompt is not None:
        return [PromptEntry(n, text) for n, text in enumerate(args.prompt, 1)]
    return read_prompts(args.prompts, args.format)


def main(argv: list[str] | None = None, prog: str = "python -m minirt.generate") -> int:
    # Ctrl-C and SIGTERM, for this run only.
    with StopSignals() as signals:
        args = parse_args(argv, prog)
        # The same records, from worker processes on Ray.
        if args.ray is not None:
            # Imported here: ray is imported only with --ray.
            from .distributed.serve_on_ray import serve_on_ray  # noqa: PLC0415 (see above)

            return serve_on_ray(args, model_folder(args), signals)
        entries = prompt_entries(args)
        # And an --output in the model folder, and a bad --output path, stop here.
        folder = model_folder(args)
        records = OutputFile(args.output) if args.output is not None else None
        try:
            llm, load_seconds = load(args, folder)
            refuse_text_without_a_tokenizer(llm, entries)
            defaults = sampling_defaults(llm.defaults, args.overrides)
            requests = build_requests(llm, entries, defaults, args.logprobs is not None)
            refuse_budgets_no_request_fits(llm, requests)
            # Said once nothing can refuse the run any more, so that a refusal is one line.
            if llm.backend_note:
                print(llm.backend_note, file=sys.stderr)
        except BaseException:
            # The run never started: an existing --output stays as it was.
            if records is not None:
                records.discard()
            raise
        output, progress = ordered_output(args, requests, records, llm, signals)
        stats = None
        try:
            stats = serve(llm, requests, args, output, progress)
        finally:
            if records is not None:
                with signals.held():
                    records.close(interrupted=isinstance(stats, KeyboardInterrupt))
        return report(stats, requests, output, args, load_seconds)


def ordered_output(
    args, requests: list[Request], records: OutputFile | None, llm: LLM, signals: StopSignals
) -> tuple[OrderedOutput, Progress]:
    """Where the run's completions and records go, and its progress bar (on a terminal, unless
    streaming): a bar on the completions' screen clears its line before each of them."""
    if args.stream is not None:
        stream = args.stream
    else:
        stream = len(requests) == 1 and sys.stdout.isatty()
    progress = Progress(
        len(requests), enabled=not (args.no_progress or stream) and sys.stderr.isatty()
    )
    if sys.stdout.isatty():
        before_write = progress.clear
    else:
        before_write = None
    output = OrderedOutput(
        len(requests),
        None if args.quiet else sys.stdout,
        records,
        color=sys.stdout.isatty(),
        hold=signals.held,
        tokenizer=llm.tokenizer,
        stream=stream,
        before_write=before_write,
    )
    return output, progress


def report(
    stats: RunStats | KeyboardInterrupt,
    requests: list[Request],
    output: OrderedOutput,
    args,
    load_seconds: float,
) -> int:
    """What is left to say once the records are out: the continuous grid, the summary; the exit
    status."""
    if isinstance(stats, KeyboardInterrupt):
        terminated = isinstance(stats, Terminated)
        if terminated:
            stopped = "terminated"
        else:
            stopped = "interrupted"
        print(
            f"minirt.generate: {stopped}; {output.done} of {len(requests)} records were final "
            "and written",
            file=sys.stderr,
        )
        if terminated:
            return EXIT_TERMINATED
        return EXIT_INTERRUPTED
    if output.stdout_failure:
        print(f"minirt.generate: error: {output.stdout_failure}", file=sys.stderr)
        return output.stdout_failure.exit_code
    if args.trace and args.policy == "continuous":
        print(continuous_grid(requests, stats), file=sys.stderr)
    print(summary(stats, load_seconds), file=sys.stderr, end="")
    if stats.failed:
        return EXIT_REQUEST_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_command(main, prog="minirt.generate"))
