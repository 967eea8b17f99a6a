"""What the commands share: errors and exit codes, output files, prompt files, flags, progress and
reports.

    command.py              run_command (one-line errors, exit codes), --version and quiet help
    signals.py              Ctrl-C and SIGTERM, never cutting a record in half
    output_file.py          writing --output without losing or clobbering anything
    stdout.py               what to do when standard output fails or its reader goes
    prompt_file.py          reading .txt and .jsonl prompts files
    sampling_flags.py       the sampling flags, and the order settings override each other
    requests_from_prompts.py    prompts-file entries turned into requests
    kv_budget.py            --kv-budget SIZE, in tokens or memory
    records.py              each request's completion and JSONL record, in input order
    progress.py             the progress bar
    grids.py                the round grid (--trace)
    summary.py              the closing counts
    simulation.py           `minirt rounds`: the engine's schedulers without a model
    round_tables.py         `minirt rounds` as text
    svg.py                  `minirt rounds --svg`
    plural.py               counts in words ("1 group", "3 groups")

The commands themselves are minirt/generate.py, evaluate.py, rounds.py and inspect.py.
Must not know: Ray (minirt/distributed/) or the server (tests/project/test_layout.py holds this).
"""
