"""Exact batch invariance on the CuPy path, through the strict stand-in: the same numbers as the
NumPy backend's exact mode, and a report of every call whose order of arithmetic a GPU library
picks by shape (a matmul: cuBLAS; an adding reduction: CuPy's reduction kernels) and whose shape
changes with the batch.  In exact mode the only such calls are the weight products and layer
norm, in calls of the heights the probe checked on that very library at load; in the default
mode they are everywhere, which is what the report is for."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from conftest import ROOT
from strict_cupy import StrictCuPy, strict_backend

import minirt
import minirt.model.backend as backend_module
from minirt import SamplingParams

SHIPPED = ROOT / "weights" / "shakespeare-gpt2-tiny"


@pytest.fixture
def stand_in(monkeypatch) -> StrictCuPy:
    xp = StrictCuPy()
    monkeypatch.setattr(backend_module, "cupy_backend", lambda: strict_backend(xp))
    return xp


def test_the_stand_in_logs_matmuls_and_adding_reductions_only(stand_in):
    xp = stand_in
    a = xp.ones((3, 4), dtype=np.float32)
    with xp.logging_shapes() as log:
        a.sum(axis=-1)
        xp.sum(a, axis=0)
        a.max(axis=-1)
        a @ xp.ones((4, 2), dtype=np.float32)
        a + a
    assert [(call.kind, call.shapes) for call in log] == [
        ("sum", ((3, 4), -1)),
        ("sum", ((3, 4), 0)),
        ("matmul", ((3, 4), (4, 2))),
    ]


def batch_shaped_calls(xp: StrictCuPy, batch_invariant: bool, heights=None) -> set[str]:
    """The functions in minirt whose logged calls changed shape between a request served beside
    one peer and beside three (every prompt 20 tokens, so that a row's own calls are the same
    shapes in both).  With `heights`, each of those calls must also be one of that many rows."""
    llm = minirt.LLM(SHIPPED, backend="cupy", batch_size=8, batch_invariant=batch_invariant)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def shapes(n_peers: int) -> dict[str, set]:
        prompts = [rng.integers(0, 4096, 20).tolist() for _ in range(n_peers + 1)]
        with xp.logging_shapes() as log:
            llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        by_place = defaultdict(set)
        for call in log:
            by_place[call.where].add((call.kind, call.shapes))
        return by_place

    one_peer, three_peers = shapes(1), shapes(3)
    if heights is not None:
        for place in set(one_peer) | set(three_peers):
            if one_peer.get(place) != three_peers.get(place):
                for _kind, call_shapes in one_peer.get(place, set()) | three_peers[place]:
                    assert call_shapes[0][0] in heights, (place, call_shapes)
    return {
        place.split(" in ")[-1]
        for place in set(one_peer) | set(three_peers)
        if one_peer.get(place) != three_peers.get(place)
    }


def test_in_exact_mode_only_the_probed_weight_products_change_shape_with_the_batch(
    stand_in, monkeypatch
):
    """With every height in play (whatever this machine's kernel passes: the heights a row's batch
    picks are then sure to differ), the places whose shapes follow the batch are the two the probe
    checks at load: the weight products and layer norm, each call of them one of the heights."""
    import minirt.model.invariant as invariant
    from minirt.model.invariant import CANDIDATE_HEIGHTS, RowTiles

    every_height = RowTiles(stand_in, CANDIDATE_HEIGHTS)
    monkeypatch.setattr(invariant, "probe_row_tiles", lambda xp, *_: every_height)
    shaped = batch_shaped_calls(stand_in, batch_invariant=True, heights=CANDIDATE_HEIGHTS)
    assert shaped == {"product", "layer_norm"}


def test_in_the_default_mode_the_report_names_every_batch_shaped_call(stand_in):
    assert batch_shaped_calls(stand_in, batch_invariant=False) == {
        "linear",
        "lm_head",
        "layer_norm",
        "softmax_over_keys",
    }


def test_exact_mode_on_the_stand_in_gives_numpys_exact_numbers(stand_in):
    prompts = ["ROMEO:", "To be or not", ""]
    params = [
        SamplingParams(max_tokens=6, temperature=0.0, logprobs=3),
        SamplingParams(max_tokens=5, temperature=1.0, seed=4, logprobs=3),
        SamplingParams(max_tokens=4, temperature=0.0, logprobs=3),
    ]
    want = minirt.LLM(backend="numpy", batch_invariant=True).generate(prompts, params)
    llm = minirt.LLM(backend="cupy", batch_invariant=True)
    assert llm.model.xp is stand_in
    got = llm.generate(prompts, params)
    for mine, theirs in zip(got, want, strict=True):
        assert mine.outputs[0].token_ids == theirs.outputs[0].token_ids
        assert mine.outputs[0].logprobs == theirs.outputs[0].logprobs
    assert stand_in.findings == []
