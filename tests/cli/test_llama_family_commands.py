"""The commands on Llama-family folders: `python -m minirt.generate --model FOLDER` with text
prompts (each tokenizer kind: byte-level BPE with Llama 3's template, SentencePiece byte
fallback with Mistral's), `minirt inspect`, and a KV budget counted in K/V heads.

Expected values: transformers' encoding and logits of the same texts (the fixtures'
expected.npz: seq_b is `tokenizer(text)["input_ids"]`, BOS included, and its logits), and hand
arithmetic for the budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES
from minirt.cli.command import EXIT_OK, run_command
from minirt.generate import main as generate_main
from minirt.inspect import main as inspect_main

# The texts the chat fixtures' seq_0.. were encoded from (tools/fixtures/llama_fixtures.py).
TEXTS = [
    "Hello world, how are you today?",
    "Café 日本語 😀",
    "a",
    "The quick brown fox jumps over the lazy dog.\nThe user asks the assistant.",
]


def generate(argv, capsys) -> tuple[int, str]:
    code = run_command(generate_main, argv, prog="minirt.generate")
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["llama_chat_byte_level", "mistral_chat_byte_fallback"])
def test_generate_encodes_as_transformers_and_picks_its_first_token(name, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in TEXTS))
    out = tmp_path / "out.jsonl"
    argv = ["--model", str(FIXTURES / name), "--prompts", str(prompts), "--output", str(out)]
    code, err = generate([*argv, "--max-tokens", "1", "--temperature", "0"], capsys)
    assert code == EXIT_OK, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    expected = np.load(FIXTURES / name / "expected.npz")
    for b, record in enumerate(records):
        sequence = expected[f"seq_{b}"]
        # BOS added as transformers' tokenizer(text) adds it; the rest its ids.
        assert record["prompt_tokens"] == len(sequence), (name, b)
        first = int(expected["logits"][b, len(sequence) - 1].argmax())
        assert record["token_ids"] == [first], (name, b)


def test_a_kv_budget_counts_kv_heads_not_query_heads(tmp_path, capsys):
    """llama_gqa2: 2 layers, 2 K/V heads of 16 (its 4 query heads share them), fp32: one
    position's keys and values are 2 x 2 x 2 x 16 x 4 = 512 bytes (a head per query head would
    be 1024).  0.0195 MiB = 20447 bytes hold 39 positions (19 at 1024): three 13-position rows
    at once, and a 40-position one is refused."""
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": [5], "max_new_tokens": 13}] * 4 + [{"prompt": [5], "max_new_tokens": 40}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    argv = ["--model", str(FIXTURES / "llama_gqa2"), "--prompts", str(prompts)]
    argv += ["--batch-size", "4", "--kv-budget", "0.0195MiB", "--ignore-eos", "--output", str(out)]
    code, err = generate([*argv, "--backend", "numpy"], capsys)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["error"] is None for r in records] == [True] * 4 + [False], err
    assert [r["first_round"] for r in records[:4]] == [1, 1, 1, 14]
    assert code != EXIT_OK and "39" in records[4]["error"]


def test_inspect_names_the_architecture_and_its_grouped_heads(capsys):
    code = run_command(inspect_main, ["--model", str(FIXTURES / "qwen3_norms")], prog="inspect")
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "Qwen3ForCausalLM: 2 layers, 64 wide, 4 query heads / 2 K/V heads (head_dim 24)" in out
    assert "Q/K norms" in out and "tied to the token embedding" in out
