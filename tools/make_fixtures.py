"""Make the reference fixtures under tests/fixtures/ with Hugging Face transformers.

Each fixture is a tiny random-weight GPT2LMHeadModel saved as a model folder
(config.json + safetensors) plus `expected.npz`, holding what transformers
computes for it:

    seq_{b}       the token ids of sequence b (lengths differ, so minirt must pad)
    logits        [B, max_len, V] fp32 reference logits, each sequence run alone
    greedy_{g}    32 greedy tokens after prompt g (full recompute in transformers)
    prompt_{g}    that prompt
    margin_{g}    the reference's top-2 logit margin at each greedy step

The configs cover the odd corners minirt must get right: n_head not a power
of two, n_inner other than 4 * n_embd, a tiny vocabulary, a short context,
fp16 and bf16 files, tensor names without the `transformer.` prefix, causal-mask
buffers to skip, an untied head, the exact (erf) GELU, and sharded weights.

Run from the repository root (needs the `reference` extra):

    python tools/make_fixtures.py            # rewrites tests/fixtures/
    python tools/make_fixtures.py --check    # recomputes and compares, writes nothing
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import (
    build_model,
    reference_greedy,
    reference_logits,
    round_weights,
    save_checkpoint,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GREEDY_STEPS = 32
MIN_MARGIN = 1e-3  # a top-2 gap below this is a near-tie; fixtures are drawn to avoid them

# name -> (config fields, save options, seed)
FIXTURE_SPECS = {
    "base": ({}, {}, 1),
    "odd_heads": ({"n_embd": 48, "n_head": 3, "n_inner": 72, "vocab_size": 101}, {}, 2),
    "tiny_vocab_short_ctx": (
        {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 11, "n_positions": 8},
        {},
        3,
    ),
    "fp16_file": ({"n_head": 2}, {"file_dtype": "F16"}, 4),
    "bf16_file": ({"n_embd": 24, "n_head": 6}, {"file_dtype": "BF16"}, 5),
    "no_prefix_with_mask_buffers": ({}, {"prefix": False, "keep_mask_buffers": True}, 6),
    "untied_head": ({"tie_word_embeddings": False, "n_layer": 3}, {}, 7),
    "erf_gelu_eps_noscale": (
        {
            "activation_function": "gelu",
            "layer_norm_epsilon": 1e-3,
            "scale_attn_weights": False,
            "n_embd": 20,
            "n_head": 5,
        },
        {},
        8,
    ),
    "sharded": ({"n_layer": 3}, {"shards": 3}, 9),
}


def sequences_for(vocab_size: int, n_positions: int, rng: np.random.Generator) -> list[list[int]]:
    """Sequences of different lengths: the full context, a single token, and some in between."""
    lengths = sorted(
        {n_positions, 1, max(1, n_positions // 2), max(1, n_positions // 3), min(5, n_positions)},
        reverse=True,
    )
    rng.shuffle(lengths)
    return [rng.integers(0, vocab_size, size=n).tolist() for n in lengths]


def make_fixture(name: str, out_dir: Path) -> dict[str, np.ndarray]:
    fields, save_options, seed = FIXTURE_SPECS[name]
    model = round_weights(build_model(seed=seed, **fields), save_options.get("file_dtype", "F32"))
    save_checkpoint(model, out_dir, **save_options)
    cfg = model.config
    rng = np.random.default_rng(seed)
    sequences = sequences_for(cfg.vocab_size, cfg.n_positions, rng)
    arrays = {f"seq_{b}": np.array(s, dtype=np.int64) for b, s in enumerate(sequences)}
    arrays["logits"] = reference_logits(model, sequences)
    if cfg.n_positions >= GREEDY_STEPS + 8:
        found = 0
        for _attempt in range(50):  # draw prompts until two have no near-tie in 32 steps
            prompt = rng.integers(0, cfg.vocab_size, size=int(rng.integers(1, 8))).tolist()
            tokens, margins = reference_greedy(model, prompt, GREEDY_STEPS)
            if min(margins) >= MIN_MARGIN:
                arrays[f"prompt_{found}"] = np.array(prompt, dtype=np.int64)
                arrays[f"greedy_{found}"] = np.array(tokens, dtype=np.int64)
                arrays[f"margin_{found}"] = np.array(margins, dtype=np.float32)
                found += 1
                if found == 2:
                    break
        if found < 2:
            raise SystemExit(f"{name}: could not draw prompts without near-ties; change the seed")
    np.savez_compressed(out_dir / "expected.npz", **arrays)
    return arrays


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tools/make_fixtures.py --only base odd_heads",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="recompute into a temporary folder and compare with the committed fixtures",
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(FIXTURE_SPECS), help="make just these fixtures"
    )
    args = parser.parse_args()
    names = args.only or list(FIXTURE_SPECS)
    if args.check:
        worst = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                fresh = make_fixture(name, Path(tmp) / name)
                committed = np.load(FIXTURES / name / "expected.npz")
                diff = float(np.abs(fresh["logits"] - committed["logits"]).max())
                worst = max(worst, diff)
                print(f"{name:32s} max |fresh - committed| logits = {diff:.3g}")
        return 0 if worst < 1e-5 else 1
    for name in names:
        target = FIXTURES / name
        if target.exists():
            shutil.rmtree(target)
        arrays = make_fixture(name, target)
        size = sum(p.stat().st_size for p in target.iterdir())
        greedy = sum(1 for k in arrays if k.startswith("greedy_"))
        print(
            f"{name:32s} {size / 1024:7.1f} KiB  {len([k for k in arrays if k.startswith('seq_')])} sequences, "
            f"{greedy} greedy prompts"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
