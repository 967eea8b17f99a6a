"""Exact batch invariance's parts (minirt/model/invariant.py): the cuts of a weight product into
calls of fixed heights, checked by hand and as an invariant; the probe, which refuses a BLAS whose
rows move with their place or their peers (a patched matmul plays that BLAS), and keeps only the
heights that agree; and exact mode's numbers, which are the default mode's up to rounding."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, relative_error

import minirt
from minirt import SamplingParams
from minirt.errors import MinirtError
from minirt.model import invariant
from minirt.model.invariant import (
    CANDIDATE_HEIGHTS,
    BatchInvarianceError,
    RowTiles,
    describe_blas,
    probe_row_tiles,
)

SHIPPED = ROOT / "weights" / "shakespeare-gpt2-tiny"
LADDER = RowTiles(np, CANDIDATE_HEIGHTS)


@pytest.mark.parametrize(
    "n_rows, cuts",
    [
        (0, []),
        (1, [(0, 8)]),
        (8, [(0, 8)]),
        (9, [(0, 8), (8, 8)]),
        (40, [(0, 32), (32, 8)]),
        (100, [(0, 64), (64, 32), (96, 8)]),
        (4100, [(0, 2048), (2048, 2048), (4096, 8)]),
    ],
)
def test_cuts_by_hand(n_rows, cuts):
    assert LADDER.cuts(n_rows) == cuts


def test_with_the_shortest_height_alone_every_call_is_8_rows():
    assert RowTiles(np, (8,)).cuts(20) == [(0, 8), (8, 8), (16, 8)]


@given(st.integers(0, 10_000))
def test_cuts_cover_the_rows_once_in_the_plans_heights(n_rows):
    cuts = LADDER.cuts(n_rows)
    if n_rows == 0:
        assert cuts == []
        return
    ends = [first + height for first, height in cuts]
    assert [first for first, _ in cuts] == [0, *ends[:-1]]
    assert all(height in CANDIDATE_HEIGHTS for _, height in cuts)
    # Only the last call is padded, and by less than the shortest height.
    assert all(end <= n_rows for end in ends[:-1])
    assert ends[-1] - n_rows in range(8)
    # Heights never grow: the tallest first.
    assert [h for _, h in cuts] == sorted((h for _, h in cuts), reverse=True)


def test_capped_and_tallest_within():
    assert LADDER.capped(256).heights == (256, 128, 64, 32, 16, 8)
    assert RowTiles(np, (64, 8)).capped(4).heights == (8,)
    assert LADDER.tallest_within(682) == 512
    assert LADDER.tallest_within(3) == 8


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**16))
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(n_rows, seed):
    """Under the heights this BLAS passes, each row of a product is bitwise the row's product
    alone (itself in a call of the shortest height); and the product is x @ w."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((48, 40)).astype(np.float32)
    tiles = probe_row_tiles(np, [(weight, 2048)])
    x = rng.standard_normal((n_rows, 48)).astype(np.float32)
    together = tiles.product(x, weight)
    for row in rng.integers(0, n_rows, size=3):
        alone = tiles.product(x[row : row + 1], weight)
        assert np.array_equal(together[row], alone[0])
    assert relative_error(together, x @ weight) < 1e-6


def perturbing_matmul(when):
    """np.matmul, but the result's row 0 moved by one ulp in the calls `when(rows)` picks: a BLAS
    whose rows depend on the size of their call."""
    real = np.matmul

    def matmul(a, b, *args, **kwargs):
        result = real(a, b, *args, **kwargs)
        if result.ndim == 2 and when(result.shape[0]):
            result[0] = np.nextafter(result[0], np.inf)
        return result

    return matmul


def test_a_blas_whose_rows_move_with_the_call_is_refused_at_load(monkeypatch):
    monkeypatch.setattr(np, "matmul", perturbing_matmul(lambda rows: rows == 8))
    with pytest.raises(BatchInvarianceError) as refused:
        minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True)
    message = str(refused.value)
    assert "\n" not in message and isinstance(refused.value, MinirtError)
    # It names the BLAS, its kernel and the product, and what to do.
    assert describe_blas() in message
    assert re.search(r"\[8, 192\] @ \[192, \d+\]", message)
    assert "run without batch invariance" in message
    # The default mode does not probe: it loads.
    minirt.LLM(SHIPPED, backend="numpy")


def test_heights_that_disagree_with_the_shortest_are_dropped(monkeypatch):
    """A BLAS whose calls of more than 32 rows round differently: exact mode keeps only the
    heights up to 32 of those this BLAS passes unperturbed."""
    passed = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True).model.tiles.heights
    monkeypatch.setattr(np, "matmul", perturbing_matmul(lambda rows: rows > 32))
    llm = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True)
    kept = tuple(height for height in passed if height <= 32)
    assert llm.model.tiles.heights == llm.model.head_tiles.heights == kept


def test_the_probe_asks_each_weight_only_heights_it_gets(monkeypatch):
    """The head is probed up to HEAD_TILE_ROWS rows, not 2048 (a 2048-row call of a large vocabulary
    would cost the load seconds)."""
    asked = []
    real = invariant.host_product

    def recording(xp, rows, weight):
        asked.append((weight.shape, rows.shape[0]))
        return real(xp, rows, weight)

    monkeypatch.setattr(invariant, "host_product", recording)
    llm = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True)
    head_shape = llm.model.head_weight.shape
    assert max(rows for shape, rows in asked if shape == head_shape) == 256
    assert max(rows for shape, rows in asked if shape != head_shape) == 2048


def test_exact_mode_computes_the_same_numbers_up_to_rounding():
    """Exact mode changes the order of the sums, not what is summed: its logits are the default
    mode's within float32 rounding, and greedy tokens agree."""
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(0, 4096, 10 + 30 * i).tolist()} for i in range(4)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=5)
    default = minirt.LLM(SHIPPED, backend="numpy").generate(prompts, params)
    exact = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True).generate(prompts, params)
    for mine, theirs in zip(exact, default, strict=True):
        assert mine.outputs[0].token_ids == theirs.outputs[0].token_ids
        steps = zip(mine.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True)
        for my_step, their_step in steps:
            assert my_step.keys() == their_step.keys()
            for token, logprob in my_step.items():
                assert abs(logprob.logprob - their_step[token].logprob) < 1e-4
    scored = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True).model.logits(
        [p["prompt_token_ids"] for p in prompts]
    )
    reference = minirt.LLM(SHIPPED, backend="numpy").model.logits(
        [p["prompt_token_ids"] for p in prompts]
    )
    assert relative_error(scored, reference) < 1e-5


def test_an_mlp_tile_in_exact_mode_is_one_call_of_a_probed_height(monkeypatch):
    """The MLP's tiles (MLP_SCRATCH_BYTES of hidden activations) are cut to a height of the plan,
    so that each is one product call: on 5,000 rows of the shipped model (a tile of 2,730 rows by
    scratch, 2,048 by height), every call but the last tile's is 2,048 rows."""
    from minirt.model.layers import mlp

    llm = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True)
    heights = []
    real = RowTiles.product

    def recording(self, x, weight):
        heights.append(x.shape[0])
        return real(self, x, weight)

    monkeypatch.setattr(RowTiles, "product", recording)
    tiles = RowTiles(np, CANDIDATE_HEIGHTS)
    block = llm.model.blocks[0]
    x = np.random.default_rng(0).standard_normal((5000, 192)).astype(np.float32)
    chains = llm.model.chains
    mlp(np, chains, x, block.mlp.c_fc, block.mlp.c_proj, "tanh", tiles)
    # Two products a tile: 2048, 2048, then the 904 left.
    assert heights == [2048, 2048, 2048, 2048, 904, 904]


def test_a_generated_token_attends_alone_and_a_prompt_in_blocks(monkeypatch):
    """Exact mode's decode rounds send generated tokens to `attend_alone` (one call per length),
    never through the prompt's blocks of 64 queries (right too, but 64 times the work)."""
    calls = {"alone": 0, "blocks": 0}
    for name, key in (("attend_alone", "alone"), ("attend_in_aligned_blocks", "blocks")):
        real = getattr(invariant, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            calls[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(invariant, name, counted)
    llm = minirt.LLM(SHIPPED, backend="numpy", batch_invariant=True)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9, 10]}], params)
    layers = llm.model.config.n_layer
    # Prefill: each prompt's one block, every layer.  Then 3 decode rounds, the two rows (equally
    # long) in one call a layer.
    assert calls == {"blocks": 2 * layers, "alone": 3 * layers}


def test_the_probe_checks_row_wise_functions_too():
    """A row-wise function (layer norm's place) whose row 0 moves in calls of more than 16 rows loses
    those heights; one whose row 0 moves at 8 rows is refused, named."""
    weight = np.ones((4, 3), np.float32)

    def moving_when(condition):
        def function(rows):
            out = rows * 2.0
            if condition(len(rows)):
                out[0] = np.nextafter(out[0], np.inf)
            return out

        return function

    tiles = probe_row_tiles(
        np, [(weight, 64)], (64, 32, 16, 8), [("norm", 4, moving_when(lambda m: m > 16))]
    )
    assert tiles.heights == (16, 8)
    with pytest.raises(BatchInvarianceError, match=r"\[8, 4\] norm changes with its place"):
        probe_row_tiles(
            np, [(weight, 64)], (64, 32, 16, 8), [("norm", 4, moving_when(lambda m: m == 8))]
        )
