"""What each round of a run costs on the strict stand-in: counts per round, and per transformer
block (the helpers of the budget tests, and of tools/quality/round_costs.py)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import minirt.model.gpt2 as gpt2_module
from minirt.engine.engine import Engine
from strict_cupy import Counts, StrictCuPy


@dataclass
class RoundCost:
    """One round: everything it cost, and each transformer block's operations within it."""

    round_number: int
    new_tokens: int
    counts: Counts
    block_operations: list[int] = field(default_factory=list)


@contextmanager
def blocks_counted(stand_in: StrictCuPy, monkeypatch, into: list[int]):
    """Each transformer block's device operations, appended to `into` as the block runs."""
    block = gpt2_module.transformer_block

    def counted_block(*args, **kwargs):
        with stand_in.counting() as counts:
            result = block(*args, **kwargs)
        into.append(counts.operations)
        return result

    monkeypatch.setattr(gpt2_module, "transformer_block", counted_block)
    yield
    monkeypatch.setattr(gpt2_module, "transformer_block", block)


def forward_without_syncs(stand_in: StrictCuPy, monkeypatch) -> None:
    """From now on a device sync inside `GPT2.forward` is a finding."""
    forward = gpt2_module.GPT2.forward

    def checked_forward(self, *args, **kwargs):
        with stand_in.no_syncs("GPT2.forward"):
            return forward(self, *args, **kwargs)

    monkeypatch.setattr(gpt2_module.GPT2, "forward", checked_forward)


def round_costs(stand_in: StrictCuPy, engine: Engine, requests, monkeypatch) -> list[RoundCost]:
    """Serve `requests` one `step()` at a time, counting each round."""
    engine.start_run()
    for request in requests:
        engine.add_request(request)
    costs = []
    while engine.has_unfinished():
        blocks: list[int] = []
        with stand_in.counting() as counts, blocks_counted(stand_in, monkeypatch, blocks):
            output = engine.step()
        if output.round_number is None:
            continue
        costs.append(RoundCost(output.round_number, len(output.new_tokens), counts, blocks))
    return costs
