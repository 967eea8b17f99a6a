"""What each round asks of the device, with minirt's CuPy path on the strict stand-in for CuPy.

For this tree, or another checkout's minirt (`--tree`), so two versions can be set side by side:
a 12-layer model (tiny widths: counts do not depend on them) serves 4 requests of uneven prompts
in one static group, greedy and then sampling with logprobs, fp32 and fp16, and this prints the
prefill round and a decode round: device operations (in all and in the second block, the first
also building the round's masks), uploads, downloads and syncs.  docs/gpu.md has the table.

    python tools/quality/round_costs.py
    git worktree add /tmp/old 4c58639 && python tools/quality/round_costs.py --tree /tmp/old
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Per-round device costs of minirt's CuPy path, counted on the strict stand-in.",
        epilog="example: python tools/quality/round_costs.py --tree /tmp/old-checkout",
    )
    parser.add_argument("--tree", default=str(ROOT), help="the checkout whose minirt runs")
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks (default 12)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    tree = str(Path(args.tree).resolve())
    sys.path.insert(0, tree)
    # The stand-in and its helpers come from this tree, whichever minirt runs.
    for folder in ("tests", "tests/cupy_path", "tools/fixtures"):
        sys.path.insert(1, str(ROOT / folder))
    import numpy as np
    import pytest
    from round_costs import round_costs
    from strict_cupy import StrictCuPy, strict_backend

    import minirt
    from conftest import random_model
    from minirt.engine.engine import Engine
    from minirt.engine.runner import ModelRunner
    from minirt.engine.params import SamplingParams
    from minirt.request_maker import RequestMaker

    if not minirt.__file__.startswith(tree):
        print(f"round_costs.py: minirt came from {minirt.__file__}, not {tree}", file=sys.stderr)
        return 1
    print(f"minirt from {tree}, {args.layers} blocks, 4 requests in one static group")
    kinds = {
        "greedy": SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0),
        "sampled+logprobs": SamplingParams(
            max_tokens=4, ignore_eos=True, temperature=0.8, seed=1, logprobs=2
        ),
    }
    monkeypatch = pytest.MonkeyPatch()
    for dtype in (np.float32, np.float16):
        for label, params in kinds.items():
            stand_in = StrictCuPy()
            model = random_model(
                seed=0,
                backend=strict_backend(stand_in),
                dtype=dtype,
                n_layer=args.layers,
                n_positions=64,
            )
            engine = Engine(ModelRunner(model), None, batch_size=4)
            prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3]]
            maker = RequestMaker.for_model(model.config, None)
            requests = [maker.make(i, p, params) for i, p in enumerate(prompts)]
            costs = round_costs(stand_in, engine, requests, monkeypatch)
            for name, cost in (("prefill", costs[0]), ("decode", costs[1])):
                counts = cost.counts
                print(
                    f"{np.dtype(dtype).name:8} {label:17} {name:8} "
                    f"operations {counts.operations:5} (block 2: {cost.block_operations[1]:3})  "
                    f"uploads {counts.uploads}  downloads {counts.downloads}  syncs {counts.syncs}"
                )
            monkeypatch.undo()
            if stand_in.findings:
                print("findings:", *[str(f) for f in stand_in.findings], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
