"""What the commands share: errors and exit codes, output files, prompt files, flags, progress and
reports.

    command.py    run_command (one-line errors, exit codes), --version and quiet help
    signals.py    Ctrl-C and SIGTERM, never cutting a record in half
    output_file.py, stdout.py   writing --output and standard output without losing or clobbering
    prompt_file.py              reading .txt and .jsonl prompts files
    sampling_flags.py, requests_from_prompts.py, kv_budget.py
                                flags, and prompts turned into requests
    records.py, progress.py, grids.py, summary.py                what a generate run shows
    simulation.py, round_tables.py, svg.py                       `minirt rounds` without a model
    plural.py                   counts in words ("1 group", "3 groups")

The commands themselves are minirt/generate.py, evaluate.py, rounds.py and inspect.py.
Must not know: Ray (minirt/distributed/) or the server (tests/project/test_layout.py holds this).
"""
