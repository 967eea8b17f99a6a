"""What a round may cost the device, counted on the strict stand-in: regression guards for the CuPy
path, each a number chosen from what the code needs (docs/gpu.md has the table).

A decode step of a small model on a GPU is bound by the host: each kernel launch costs some
microseconds, each copy to or from the device more, each sync stalls the queue.  So:

  * one upload per round: the round's integers (ids, positions, slots, lengths, the padded layout,
    the last-token indices), end to end in one array;
  * one download, hence one sync, per round: the greedy picks (or, when a row samples or wants
    logprobs, its logits), and no sync inside `GPT2.forward`;
  * device operations per transformer block at decode, whatever the batch size.  fp32: 33 (was 65,
    below): 2 layer norms x 5 (sum, the fused centring, square, sum, the fused tail), 4 weight
    GEMMs x 2 (the GEMM, the bias), 2 KV scatters (one index array each), the query's scale, 2
    attention matmuls with the 2 copies CuPy makes of the sliced KV, the mask fill, the row max,
    the fused exp, the sum, the fused divide, the GELU, 2 residual adds.  Rows in scattered slots
    read the KV by a gather: 34.  fp16: 40 (was 71), with 7 casts, and 42;
  * masks are built once a round, by the first block, and read by the others: 9 operations for a
    decode step's mask, 9 for each prompt tile's;
  * outside the blocks a decode step costs 14: where the round's keys go in the cache (5, made
    once for every layer: `token_rows`), the embedding (the gather of the ids' columns, the
    positions' gather, their sum), the final layer norm (5) and the head's GEMM, with no gather of
    the last tokens (at decode every token is its row's last).

Counted as CuPy launches them (tests/strict_cupy), the same decode block cost 65 operations before
this work in fp32 and 71 in fp16: the KV writes, indexed by slot and position, were 4 kernels
each.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_request, random_model
from round_costs import blocks_counted, forward_without_syncs, round_costs
from strict_cupy import StrictCuPy, strict_backend

from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.params import SamplingParams
from minirt.model.batch import Batch
from minirt.model.fusion import elementwise_chains

DECODE_BLOCK_OPERATIONS = {"float32": 33, "float16": 40}
GATHERED_DECODE_BLOCK_OPERATIONS = {"float32": 34, "float16": 42}
MASK_OPERATIONS = 9
DECODE_OUTSIDE_THE_BLOCKS = 5 + 3 + 5 + 1
# A prompt round (fp32) per block: 23 whatever the rows (norms, GEMMs, scatters, residuals, MLP),
# and 12 per tile of queries (its slice, scale, 2 matmuls and copies, fill, max, exp, sum, divide,
# and the tile copied into place).
PROMPT_BLOCK_FIXED = 23
PROMPT_BLOCK_PER_TILE = 12

PARAMS = {
    "greedy": SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0),
    "sampled": SamplingParams(max_tokens=5, temperature=0.8, top_k=5, seed=1, ignore_eos=True),
    "logprobs": SamplingParams(max_tokens=5, logprobs=2, ignore_eos=True, temperature=0.0),
}


def decode_block_operations(
    dtype, slots: list[int], past_lens: list[int], fused: bool = True
) -> list[int]:
    """Each block's operations in one decode step of rows in `slots` (holding `past_lens` keys);
    `fused=False` runs the elementwise chains as NumPy does, one operation at a time."""
    stand_in = StrictCuPy()
    backend = strict_backend(stand_in)
    model = random_model(seed=2, backend=backend, dtype=dtype, n_layer=3)
    if not fused:
        model.chains = elementwise_chains(np)
    cache = model.new_kv_cache(n_slots=8, capacity=16)
    model.forward(Batch([[1] * n for n in past_lens], backend, slots=slots), cache)
    step = Batch([[2]] * len(slots), backend, slots=slots, past_lens=cache.lengths[slots])
    blocks: list[int] = []
    monkeypatch = pytest.MonkeyPatch()
    with blocks_counted(stand_in, monkeypatch, blocks):
        model.forward(step, cache)
    monkeypatch.undo()
    assert stand_in.findings == []
    return blocks


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_a_decode_block_costs_the_same_few_operations_at_any_batch_size(dtype, rows):
    slots = list(range(rows))
    blocks = decode_block_operations(dtype, slots, [1 + row % 5 for row in slots])
    budget = DECODE_BLOCK_OPERATIONS[dtype]
    assert blocks == [budget + MASK_OPERATIONS, budget, budget]


def test_a_decode_step_outside_its_blocks_costs_the_embedding_final_norm_and_head():
    stand_in = StrictCuPy()
    backend = strict_backend(stand_in)
    model = random_model(seed=2, backend=backend, n_layer=3)
    cache = model.new_kv_cache(n_slots=4, capacity=16)
    model.forward(Batch([[1, 2], [3], [4, 5, 6]], backend), cache)
    step = Batch([[7], [8], [9]], backend, past_lens=cache.lengths[:3])
    blocks: list[int] = []
    monkeypatch = pytest.MonkeyPatch()
    with stand_in.counting() as counts, blocks_counted(stand_in, monkeypatch, blocks):
        model.forward(step, cache)
    monkeypatch.undo()
    assert counts.operations - sum(blocks) == DECODE_OUTSIDE_THE_BLOCKS


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rows_in_scattered_slots_cost_one_gather_more(dtype):
    blocks = decode_block_operations(dtype, [5, 1, 3], [3, 1, 2])
    budget = GATHERED_DECODE_BLOCK_OPERATIONS[dtype]
    assert blocks == [budget + MASK_OPERATIONS, budget, budget]


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_a_prompt_block_costs_a_few_operations_per_tile_and_its_masks_once(rows):
    stand_in = StrictCuPy()
    backend = strict_backend(stand_in)
    model = random_model(seed=2, backend=backend, n_layer=3)
    cache = model.new_kv_cache(n_slots=8, capacity=16)
    blocks: list[int] = []
    monkeypatch = pytest.MonkeyPatch()
    with blocks_counted(stand_in, monkeypatch, blocks):
        model.forward(Batch([[1] * (2 + row) for row in range(rows)], backend), cache)
    monkeypatch.undo()
    per_block = PROMPT_BLOCK_FIXED + PROMPT_BLOCK_PER_TILE * rows
    assert blocks == [per_block + MASK_OPERATIONS * rows, per_block, per_block]


@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_each_round_uploads_once_downloads_once_and_never_syncs_in_forward(
    kind, policy, monkeypatch
):
    stand_in = StrictCuPy()
    forward_without_syncs(stand_in, monkeypatch)
    model = random_model(seed=2, backend=strict_backend(stand_in), n_layer=2)
    engine = Engine(ModelRunner(model), None, batch_size=3, policy=policy)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11], [12]]
    requests = [make_request(engine, i, p, PARAMS[kind]) for i, p in enumerate(prompts)]
    costs = round_costs(stand_in, engine, requests, monkeypatch)
    assert len(costs) > 5
    for cost in costs:
        assert (cost.counts.uploads, cost.counts.downloads, cost.counts.syncs) == (1, 1, 1), cost
    assert stand_in.findings == []


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_chunked_and_cached_prefills_upload_once_and_a_round_that_gives_no_token_downloads_nothing(
    kind, monkeypatch
):
    """4 tokens a round: the 9-token prompt is fed over three rounds, the first giving no token (no row has
    logits to read back); the prefix cache's copies stay on the device."""
    stand_in = StrictCuPy()
    forward_without_syncs(stand_in, monkeypatch)
    model = random_model(seed=2, backend=strict_backend(stand_in), n_layer=2, n_positions=64)
    engine = Engine(
        ModelRunner(model),
        None,
        batch_size=3,
        policy="continuous",
        round_token_budget=4,
        prefix_cache=True,
    )
    shared = list(range(1, 18))
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [4], shared + [20], shared + [21, 22]]
    requests = [make_request(engine, i, p, PARAMS[kind]) for i, p in enumerate(prompts)]
    costs = round_costs(stand_in, engine, requests, monkeypatch)
    assert costs[0].new_tokens == 0 and costs[0].counts.downloads == 0
    for cost in costs:
        assert cost.counts.uploads == 1 and cost.counts.syncs == int(cost.new_tokens > 0), cost
        assert cost.counts.downloads == int(cost.new_tokens > 0), cost
    assert requests[3].cached_prompt_tokens == 16
    assert stand_in.findings == []


def test_prompt_logprobs_cost_one_upload_and_one_download_per_prompt_scored(monkeypatch):
    """Each admitted request that asks for prompt logprobs is scored in a pass of its own."""
    stand_in = StrictCuPy()
    forward_without_syncs(stand_in, monkeypatch)
    model = random_model(seed=2, backend=strict_backend(stand_in), n_layer=2)
    engine = Engine(ModelRunner(model), None, batch_size=3)
    params = SamplingParams(max_tokens=3, prompt_logprobs=0, ignore_eos=True, temperature=0.0)
    requests = [make_request(engine, i, p, params) for i, p in enumerate([[1, 2], [3], [4, 5]])]
    costs = round_costs(stand_in, engine, requests, monkeypatch)
    first = costs[0].counts
    assert (first.uploads, first.downloads) == (1 + 3, 1 + 3)
    assert all((c.counts.uploads, c.counts.downloads) == (1, 1) for c in costs[1:])
    assert stand_in.findings == []


def test_the_budgets_hold_only_with_the_chains_fused():
    """Run as written, one operation at a time, the chains cost a decode block 22 operations more:
    GELU's 9 operations become 1, each layer norm's centring 2 become 1 and its tail's 6 become 1,
    softmax's subtract and exp become 1, and its divide and zeroing 1."""
    fused = decode_block_operations("float32", [0, 1], [2, 3])
    unfused = decode_block_operations("float32", [0, 1], [2, 3], fused=False)
    assert fused[1] == DECODE_BLOCK_OPERATIONS["float32"]
    assert unfused[1] == fused[1] + 8 + 2 * (1 + 5) + 1 + 1
