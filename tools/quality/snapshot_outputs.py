"""Snapshot every command-line output minirt produces, so two versions of the code can be diffed.

A refactor that promises "no behaviour change" is checked by running this
before and after it and comparing the two folders:

    python tools/quality/snapshot_outputs.py --out /tmp/before        # on the old commit
    python tools/quality/snapshot_outputs.py --out /tmp/after         # on the new one
    diff -r /tmp/before /tmp/after && echo identical

Each case is one command, run as a subprocess from the repository root: its
exit status, standard output, standard error and any file it wrote (the
`--output` JSONL records, an SVG).  Only what is timing goes: the summary's
`speed`, `first token` and `wall time` lines, the records' `arrival_s`,
`first_token_s` and `finish_s`, `inspect`'s load and forward times, and
`evaluate`'s seconds.  Everything else must match byte for byte.

The cases cover the shipped model (default flags, JSONL settings, both
policies, a KV budget that binds and refuses, bad lines, stop flags, stdin),
every fixture in tests/fixtures (greedy, seeded sampling, logprobs, both
policies, fp16), a tiny random model with a real tokenizer (stop strings, text,
empty and non-ASCII prompts), `rounds` (text, JSON, workloads, SVG),
`evaluate`, `inspect` and every command's `--help`.  `--with-124m` adds the README's mixed-length run
on a random gpt2-124M (needs transformers, about a minute).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TIMING_LINE = re.compile(r"^(speed |wall time |loaded in |time  |scored \d+ prompt|first token )")
SECONDS_FIELD = re.compile(r'"(seconds|arrival_s|first_token_s|finish_s)": (null|[0-9.e+-]+)')


def normalise(text: str) -> str:
    """Drop the lines that are timings and evaluate's JSON seconds; keep everything else exactly."""
    kept = "".join(line for line in text.splitlines(keepends=True) if not TIMING_LINE.match(line))
    return SECONDS_FIELD.sub(lambda m: f'"{m.group(1)}": "(timing)"', kept)


def run_case(
    out_dir: Path,
    work: Path,
    name: str,
    argv: list[str],
    stdin: str | None = None,
    files: tuple[str, ...] = (),
) -> None:
    """Run `python -m minirt.<argv>` and write what it did to out_dir/name.txt."""
    for f in files:
        (work / f).unlink(missing_ok=True)
    argv = [a.replace("{work}", str(work)) for a in argv]
    result = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    shown = [a.replace(str(work), "{work}") for a in argv]
    parts = [
        f"$ python -m {' '.join(shown)}",
        f"exit {result.returncode}",
        "--- stdout",
        normalise(result.stdout),
        "--- stderr",
        normalise(result.stderr),
    ]
    for f in files:
        path = work / f
        content = path.read_text(encoding="utf-8") if path.is_file() else "(not written)\n"
        if f.endswith(".json"):
            content = (
                json.dumps({k: v for k, v in json.loads(content).items() if k != "seconds"}) + "\n"
            )
        else:
            content = normalise(content)
        parts += [f"--- file {f}", content]
    (out_dir / f"{name}.txt").write_text(
        "\n".join(parts).replace(str(work), "{work}").replace(str(ROOT), "{root}"), encoding="utf-8"
    )
    print(f"{name}: exit {result.returncode}", file=sys.stderr)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def fixture_prompts(name: str) -> list[list[int]]:
    with np.load(FIXTURES / name / "expected.npz") as data:
        seqs = [data[k].tolist() for k in sorted(data.files) if k.startswith(("seq_", "prompt_"))]
    return seqs


def shipped_cases(out: Path, work: Path) -> None:
    g = ["minirt.generate", "--backend", "numpy"]
    run_case(out, work, "shipped_default_txt", g + ["--prompts", "examples/prompts.txt"])
    run_case(
        out,
        work,
        "shipped_jsonl_records",
        g
        + [
            "--prompts",
            "examples/prompts.jsonl",
            "--output",
            "{work}/o.jsonl",
            "--logprobs",
            "--trace",
        ],
        files=("o.jsonl",),
    )
    run_case(
        out,
        work,
        "shipped_jsonl_continuous",
        g
        + [
            "--prompts",
            "examples/prompts.jsonl",
            "--policy",
            "continuous",
            "--batch-size",
            "3",
            "--trace",
            "--output",
            "{work}/o.jsonl",
        ],
        files=("o.jsonl",),
    )
    run_case(
        out,
        work,
        "shipped_mixed_greedy",
        g
        + [
            "--prompts",
            "examples/mixed_lengths.jsonl",
            "--batch-size",
            "4",
            "--ignore-eos",
            "--temperature",
            "0",
            "--trace",
            "--output",
            "{work}/o.jsonl",
        ],
        files=("o.jsonl",),
    )
    run_case(
        out,
        work,
        "shipped_mixed_continuous_tokens",
        g
        + [
            "--prompts",
            "examples/mixed_lengths.jsonl",
            "--policy",
            "continuous",
            "--batch-size",
            "5",
            "--max-round-tokens",
            "12",
            "--ignore-eos",
            "--trace",
            "--quiet",
            "--output",
            "{work}/o.jsonl",
        ],
        files=("o.jsonl",),
    )
    for policy in (
        "static",
        "continuous",
    ):  # 0.5 MiB: 85 positions; some requests never fit, others share
        run_case(
            out,
            work,
            f"shipped_kv_budget_{policy}",
            g
            + [
                "--prompts",
                "examples/prompts.jsonl",
                "--kv-budget",
                "0.5MiB",
                "--policy",
                policy,
                "--trace",
                "--output",
                "{work}/o.jsonl",
            ],
            files=("o.jsonl",),
        )
    bad = write_jsonl(
        work / "bad.jsonl",
        [
            {"prompt": "ROMEO:", "max_new_tokens": 5},
            {"prompt": "x " * 400},
            {"prompt": [1, 2, 3], "max_new_tokens": 4},
            {"prompt": [1, 99999]},
            {"prompt": "", "max_new_tokens": 3},
            {"prompt": "KING", "temperature": -1},
            {"prompt": "KING", "temprature": 1},
            {"id": "no-prompt"},
            {"prompt": "Now", "stop_token_ids": [99999]},
            {
                "prompt": "Now",
                "stop": ["\n"],
                "seed": 3,
                "temperature": 1.1,
                "top_p": 0.9,
                "max_new_tokens": 40,
            },
        ],
    )
    with open(bad, "a", encoding="utf-8") as f:
        f.write("{not json\n[1, 2]\n")
    run_case(
        out,
        work,
        "shipped_bad_lines",
        g + ["--prompts", bad, "--output", "{work}/o.jsonl", "--logprobs", "--max-new-tokens", "8"],
        files=("o.jsonl",),
    )
    run_case(
        out,
        work,
        "shipped_stop_flags",
        g
        + [
            "--prompts",
            "examples/prompts.txt",
            "--stop",
            "\\n",
            "--stop",
            "the",
            "--stop-token-id",
            "5",
            "--top-p",
            "0.9",
            "--seed",
            "5",
            "--max-new-tokens",
            "30",
        ],
    )
    run_case(
        out,
        work,
        "shipped_stdin_jsonl",
        g + ["--prompts", "-", "--max-new-tokens", "6", "--temperature", "0"],
        stdin='{"prompt": "HAMLET."}\n{"prompt": "OTHELLO.", "id": "o"}\n',
    )
    run_case(
        out,
        work,
        "shipped_stdin_txt",
        g + ["--prompts", "-", "--max-new-tokens", "6", "--top-k", "3"],
        stdin="First line\\nsecond\nThird\n",
    )
    for label, flags in [
        ("batch0", ["--batch-size", "0"]),
        ("temperature", ["--temperature", "-1"]),
        ("top_p", ["--top-p", "2"]),
        ("round_tokens", ["--max-round-tokens", "0"]),
        ("missing_prompts", ["--prompts", "/no/such/file.txt"]),
        ("missing_model", ["--model", "/no/such/model"]),
        ("output_dir", ["--output", "/no/such/dir/o.jsonl"]),
    ]:
        argv = (
            g + (["--prompts", "examples/prompts.txt"] if "--prompts" not in flags else []) + flags
        )
        run_case(out, work, f"shipped_error_{label}", argv)


def fixture_cases(out: Path, work: Path) -> None:
    for name in sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").is_file()):
        prompts = fixture_prompts(name)
        rows = [{"prompt": p, "max_new_tokens": 6 + 5 * (i % 4)} for i, p in enumerate(prompts)]
        rows += [
            {"prompt": p[:3], "temperature": 0.9, "top_k": 5, "top_p": 0.9, "max_new_tokens": 7}
            for p in prompts[:3]
        ]
        rows += [
            {"prompt": prompts[0][:2], "seed": 11, "temperature": 1.3, "max_new_tokens": 9},
            {"prompt": [], "max_new_tokens": 3},
        ]
        path = write_jsonl(work / f"{name}.jsonl", rows)
        g = [
            "minirt.generate",
            "--backend",
            "numpy",
            "--model",
            str(FIXTURES / name),
            "--prompts",
            path,
            "--ignore-eos",
            "--output",
            "{work}/o.jsonl",
        ]
        run_case(
            out,
            work,
            f"fixture_{name}_static",
            g + ["--batch-size", "3", "--logprobs", "--trace"],
            files=("o.jsonl",),
        )
        run_case(
            out,
            work,
            f"fixture_{name}_continuous",
            g + ["--batch-size", "4", "--policy", "continuous", "--trace"],
            files=("o.jsonl",),
        )
        # fp16 compute: its own rounding at every layer, and the logprobs show it to the last digit.
        run_case(
            out,
            work,
            f"fixture_{name}_float16",
            g + ["--batch-size", "3", "--dtype", "float16", "--logprobs", "3"],
            files=("o.jsonl",),
        )
        greedy = write_jsonl(
            work / f"{name}_greedy.jsonl", [{"prompt": p, "max_new_tokens": 32} for p in prompts]
        )
        run_case(
            out,
            work,
            f"fixture_{name}_greedy32",
            [
                "minirt.generate",
                "--backend",
                "numpy",
                "--model",
                str(FIXTURES / name),
                "--prompts",
                greedy,
                "--ignore-eos",
                "--batch-size",
                "8",
                "--quiet",
                "--output",
                "{work}/o.jsonl",
            ],
            files=("o.jsonl",),
        )


def tiny_cases(out: Path, work: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools" / "fixtures"))
    from tiny_random_model import write_tiny_lm

    tiny = write_tiny_lm(work / "tiny")
    rows = [
        {"prompt": "To be, or not", "max_new_tokens": 24, "stop": ["the", "zz"]},
        {"prompt": "Shall I", "max_new_tokens": 24},
        {"prompt": "", "max_new_tokens": 5},
        {"prompt": "Café 日本語 🤗", "max_new_tokens": 16, "temperature": 1.0, "seed": 5},
        {"prompt": "All the world", "max_new_tokens": 16, "temperature": 1.0},
        {"prompt": "Now is", "max_new_tokens": 9, "stop": [" "]},
        {"prompt": "x" * 300},
    ]
    path = write_jsonl(work / "tiny.jsonl", rows)
    for policy in ("static", "continuous"):
        run_case(
            out,
            work,
            f"tiny_{policy}",
            [
                "minirt.generate",
                "--backend",
                "numpy",
                "--model",
                str(tiny),
                "--prompts",
                path,
                "--batch-size",
                "2",
                "--policy",
                policy,
                "--logprobs",
                "--trace",
                "--output",
                "{work}/o.jsonl",
            ],
            files=("o.jsonl",),
        )
    run_case(
        out,
        work,
        "tiny_eos_stops",
        [
            "minirt.generate",
            "--backend",
            "numpy",
            "--model",
            str(tiny),
            "--prompts",
            path,
            "--batch-size",
            "3",
            "--temperature",
            "1.5",
            "--max-new-tokens",
            "40",
            "--output",
            "{work}/o.jsonl",
        ],
        files=("o.jsonl",),
    )
    text = work / "tiny.txt"
    text.write_text(
        "Shall I compare thee to a summer's day? Thou art more lovely. " * 12, encoding="utf-8"
    )
    run_case(
        out,
        work,
        "tiny_evaluate",
        [
            "minirt.evaluate",
            "--backend",
            "numpy",
            "--model",
            str(tiny),
            "--text",
            str(text),
            "--stride",
            "20",
        ],
    )
    run_case(
        out,
        work,
        "tiny_inspect",
        [
            "minirt.inspect",
            str(tiny),
            "--prompt",
            "To be",
            "--prompt",
            "",
            "--ids",
            "1,2",
            "--top-k",
            "4",
        ],
    )


def rounds_cases(out: Path, work: Path) -> None:
    r = ["minirt.rounds"]
    run_case(out, work, "rounds_seed_text", r + ["--lengths", "2,5,8,4", "--batch-size", "3"])
    run_case(
        out, work, "rounds_seed_json", r + ["--lengths", "2,5,8,4", "--batch-size", "3", "--json"]
    )
    run_case(
        out,
        work,
        "rounds_prompts_budgets",
        r
        + [
            "--lengths",
            "2,5,8,4,9,1,3",
            "--prompt-lengths",
            "3,9,1,4,6,2,8",
            "--batch-size",
            "3",
            "--kv-budget",
            "30",
            "--max-round-tokens",
            "12",
        ],
    )
    run_case(
        out,
        work,
        "rounds_prompts_budgets_json",
        r
        + [
            "--lengths",
            "2,5,8,4,9,1,3",
            "--prompt-lengths",
            "3,9,1,4,6,2,8",
            "--batch-size",
            "4",
            "--kv-budget",
            "25",
            "--json",
        ],
    )
    run_case(
        out,
        work,
        "rounds_workload_text",
        r + ["--workload", "200", "--seed", "0", "--batch-sizes", "4,8,16"],
    )
    run_case(
        out,
        work,
        "rounds_workload_json",
        r + ["--workload", "60", "--seed", "3", "--batch-sizes", "2,5", "--json"],
    )
    run_case(
        out,
        work,
        "rounds_workload_svg",
        r + ["--workload", "40", "--seed", "0", "--batch-sizes", "8", "--svg", "{work}/w.svg"],
        files=("w.svg",),
    )
    run_case(
        out,
        work,
        "rounds_seed_svg",
        r + ["--lengths", "2,5,8,4", "--batch-size", "3", "--svg", "{work}/s.svg"],
        files=("s.svg",),
    )
    run_case(out, work, "rounds_error", r + ["--lengths", "2,0"])
    run_case(out, work, "rounds_error_batch", r + ["--lengths", "2,5", "--batch-size", "0"])


def evaluate_inspect_cases(out: Path, work: Path) -> None:
    run_case(
        out,
        work,
        "shipped_evaluate",
        [
            "minirt.evaluate",
            "--backend",
            "numpy",
            "--text",
            "weights/shakespeare-gpt2-tiny/validation.txt",
            "--json",
        ],
    )
    run_case(
        out,
        work,
        "shipped_inspect",
        [
            "minirt.inspect",
            "weights/shakespeare-gpt2-tiny",
            "--prompt",
            "ROMEO:",
            "--prompt",
            "To be",
            "--top-k",
            "5",
        ],
    )
    for name in ("base", "sharded", "untied_head"):
        run_case(
            out,
            work,
            f"fixture_{name}_inspect",
            ["minirt.inspect", str(FIXTURES / name), "--ids", "1,2,3", "--ids", "4"],
        )


def help_cases(out: Path, work: Path) -> None:
    """Every command's --help, as a user reads it."""
    run_case(out, work, "help_minirt", ["minirt", "--help"])
    for command in ("generate", "evaluate", "rounds", "inspect"):
        run_case(out, work, f"help_{command}", [f"minirt.{command}", "--help"])


def gpt2_124m_case(out: Path, work: Path) -> None:
    folder = work / "gpt2-124m-random"
    subprocess.run(
        [sys.executable, "tools/fixtures/reference.py", "make-124m", str(folder)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    run_case(
        out,
        work,
        "gpt2_124m_mixed",
        [
            "minirt.generate",
            "--backend",
            "numpy",
            "--model",
            str(folder),
            "--prompts",
            "examples/mixed_lengths.jsonl",
            "--batch-size",
            "4",
            "--ignore-eos",
            "--trace",
            "--output",
            "{work}/o.jsonl",
        ],
        files=("o.jsonl",),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for the snapshot (one .txt per case)")
    parser.add_argument(
        "--with-124m", action="store_true", help="also the mixed-length run on a random gpt2-124M"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shipped_cases(out, work)
        fixture_cases(out, work)
        tiny_cases(out, work)
        rounds_cases(out, work)
        evaluate_inspect_cases(out, work)
        help_cases(out, work)
        if args.with_124m:
            gpt2_124m_case(out, work)
    print(f"wrote {len(list(out.glob('*.txt')))} cases to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
