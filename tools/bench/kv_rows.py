"""How many positions, and rows of a given length, one KV budget holds for each model.

For each model folder, minirt loads it (`LLM(..., kv_budget_mib=...)`, the same engine the CLI's
`--kv-budget 64MiB` makes) and this prints what the engine itself reports: one position's keys and
values in bytes (`kv_bytes_per_position`) and the positions the budget holds
(`kv_budget_positions`), with the rows of `--row-len` positions (prompt and new tokens) that fit.
Beside them, the arithmetic, 2 (K and V) x layers x K/V heads x head_dim x 4 (fp32) bytes a
position, and the same with as many K/V heads as query heads (no grouped-query attention): what
the budget would hold if each query head kept its own keys and values.

    python tools/bench/kv_rows.py /tmp/gpt2-124m-random /tmp/smollm2-135m-random \\
        /tmp/qwen2.5-0.5b-random --kv-budget-mib 64 --row-len 32

Needs no torch.  Loading maps the weights (a 2 GB checkpoint loads in seconds, warm).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))


def kv_sizes(config) -> tuple[int, int, int, int]:
    """(layers, query heads, K/V heads, head_dim) of a GPT-2 or Llama-family config."""
    heads = config.n_head
    kv_heads = getattr(config, "n_kv_head", heads)  # GPT-2: one K/V head per query head
    head_dim = getattr(config, "head_dim", None) or config.n_embd // heads
    return config.n_layer, heads, kv_heads, head_dim


def budget_row(model_dir: str, budget_mib: float, row_len: int, dtype_bytes: int = 4) -> dict:
    """What the engine reports for one model under `budget_mib`, and the arithmetic beside it."""
    from minirt import LLM

    llm = LLM(model_dir, backend="numpy", dtype="float32", kv_budget_mib=budget_mib)
    layers, heads, kv_heads, head_dim = kv_sizes(llm.model.config)
    per_position = llm.engine.kv_bytes_per_position
    without_gqa = 2 * layers * heads * head_dim * dtype_bytes
    positions = llm.engine.kv_budget_positions
    positions_without = int(budget_mib * 2**20) // without_gqa
    return {
        "model": model_dir,
        "shape": f"{layers} layers, {heads} heads, {kv_heads} K/V heads, head_dim {head_dim}",
        "bytes": per_position,
        "arithmetic": 2 * layers * kv_heads * head_dim * dtype_bytes,
        "bytes_without": without_gqa,
        "positions": positions,
        "positions_without": positions_without,
        "rows": positions // row_len,
        "rows_without": positions_without // row_len,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("models", nargs="+", help="model folders")
    parser.add_argument("--kv-budget-mib", type=float, default=64.0, help="(default 64)")
    parser.add_argument(
        "--row-len", type=int, default=32, help="positions a row needs (default 32)"
    )
    args = parser.parse_args()
    print(f"KV budget {args.kv_budget_mib:g} MiB, fp32; rows of {args.row_len} positions")
    print(
        "| model | shape | KV bytes a position (engine / arithmetic) | without GQA "
        "| positions held | without GQA | rows | without GQA | GQA's gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        r = budget_row(model, args.kv_budget_mib, args.row_len)
        gain = r["positions"] / r["positions_without"]
        print(
            f"| {Path(r['model']).name} | {r['shape']} | {r['bytes']:,} / {r['arithmetic']:,} "
            f"| {r['bytes_without']:,} | {r['positions']:,} | {r['positions_without']:,} "
            f"| {r['rows']} | {r['rows_without']} | {gain:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
