"""The prefix cache and chunked prefill: neither changes a request's tokens.

The references are invariants: a request's tokens (greedy and seeded sampling) and logprobs with the cache
and chunking are those it gets alone, with neither; the keys and values copied from the cache are the ones
its own prefill computes; the cache's bookkeeping (what it holds, what it evicts, how much a request took
from it) is held to counts made by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_request, random_model, serve_all
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.params import SamplingParams
from minirt.engine.prefix_cache import BLOCK_TOKENS, PrefixCache
from minirt.model.batch import Batch
from conftest import completions

MODEL = random_model(seed=11, vocab_size=60, n_positions=160, n_embd=16, n_head=2, n_layer=2)
B = BLOCK_TOKENS


def prompt(seed: int, length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 60, length)]


def params(max_new: int, seed: int | None = None) -> SamplingParams:
    if seed is None:
        return SamplingParams(max_tokens=max_new, ignore_eos=True, logprobs=0, temperature=0.0)
    return SamplingParams(
        max_tokens=max_new, ignore_eos=True, temperature=1.0, seed=seed, logprobs=0
    )


def alone(prompt_ids, sampling: SamplingParams):
    """The request served by itself: no cache, no chunking, its own group."""
    engine = Engine(
        ModelRunner(MODEL), None, batch_size=1, prefix_cache=False, chunked_prefill=False
    )
    request = make_request(engine, 0, prompt_ids, sampling)
    serve_all(engine, [request])
    assert request.error is None
    return request.token_ids, request.logprobs


# ------------------------------------------------------------------ the cache alone


def kv_of(prompt_ids):
    """A slot holding the prompt's keys and values, computed by a prefill."""
    cache = MODEL.new_kv_cache(n_slots=1, capacity=len(prompt_ids))
    MODEL.forward(Batch([prompt_ids], MODEL.backend), cache)
    return cache


def test_a_prompt_finds_its_full_blocks_but_always_leaves_its_last_token_to_prefill():
    ids = prompt(1, 3 * B)
    cache = PrefixCache()
    cache.set_limit(10_000)
    assert cache.insert(ids, kv_of(ids), 0) == 3
    assert cache.positions == 3 * B
    # The same prompt: its last token must be fed, so two blocks of three.
    assert cache.cached_tokens(ids) == 2 * B
    # A longer prompt starting with it takes all three; one differing in block 2 takes only block 1.
    assert cache.cached_tokens(ids + [5, 6]) == 3 * B
    changed = list(ids)
    changed[B + 3] = (changed[B + 3] % 59) + 1
    assert cache.cached_tokens(changed + [5]) == B
    # One differing in its first token finds nothing.
    assert cache.cached_tokens([(ids[0] % 59) + 1] + ids[1:]) == 0
    # A prompt shorter than a block has nothing to find.
    assert cache.cached_tokens(ids[: B - 1]) == 0


def test_the_keys_and_values_copied_into_a_slot_are_those_its_prefill_computes():
    ids = prompt(2, 2 * B + 5)
    source = kv_of(ids)
    cache = PrefixCache()
    cache.set_limit(10_000)
    cache.insert(ids, source, 0)
    target = MODEL.new_kv_cache(n_slots=3, capacity=len(ids))
    assert cache.use(ids, target, 2) == 2 * B
    assert target.lengths[2] == 2 * B
    np.testing.assert_array_equal(target.keys[:, 2, :, : 2 * B], source.keys[:, 0, :, : 2 * B])
    np.testing.assert_array_equal(target.values[:, 2, :, : 2 * B], source.values[:, 0, :, : 2 * B])
    # Nothing past the copied prefix, and no other slot, was written.
    assert not target.keys[:, 2, :, 2 * B :].any() and not target.keys[:, :2].any()
    assert (cache.queried_tokens, cache.hit_tokens) == (len(ids), 2 * B)


def test_colliding_keys_cost_a_miss_never_another_prompts_keys():
    # Every block has the same key: only the tokens can tell them apart.
    cache = PrefixCache(key_function=lambda parent, tokens: 0)
    cache.set_limit(10_000)
    first = prompt(3, 2 * B)
    second = prompt(4, 2 * B)
    assert cache.insert(first, kv_of(first), 0) == 1  # block 2's key is block 1's: taken
    assert (
        cache.insert(second, kv_of(second), 0) == 0
    )  # its first block's key is taken by other tokens
    assert cache.cached_tokens(second + [1]) == 0
    assert cache.cached_tokens(first + [1]) == B


def test_a_block_found_after_another_parent_is_not_used():
    # A key of the block's own tokens alone: the parent check is all that tells X+Y's Y from Z+Y's.
    cache = PrefixCache(key_function=lambda parent, tokens: hash(tokens))
    cache.set_limit(10_000)
    x, y, z = prompt(13, B), prompt(14, B), prompt(15, B)
    cache.insert(x + y, kv_of(x + y), 0)
    cache.insert(z, kv_of(z), 0)
    # Z is found; Y is there, but computed after X, so its keys are not Z+Y's.
    assert cache.cached_tokens(z + y + [1]) == B
    assert cache.insert(z + y, kv_of(z + y), 0) == 0  # nor does Z+Y's Y replace X+Y's
    assert cache.cached_tokens(x + y + [1]) == 2 * B


def test_the_least_recently_used_blocks_go_first_and_a_prefix_keeps_its_head():
    cache = PrefixCache()
    cache.set_limit(4 * B)
    a = prompt(5, 2 * B)
    b = prompt(6, 2 * B)
    cache.insert(a, kv_of(a), 0)
    cache.insert(b, kv_of(b), 0)
    assert cache.positions == 4 * B
    # `a` used again: `b` is now the least recent.
    assert cache.cached_tokens(a + [1]) == 2 * B
    cache.use(a + [1], MODEL.new_kv_cache(n_slots=1, capacity=2 * B + 1), 0)
    cache.set_limit(3 * B)
    # One block went: b's second (a prefix's tail goes before its head).
    assert cache.cached_tokens(b + [1]) == B and cache.cached_tokens(a + [1]) == 2 * B
    cache.set_limit(B)
    assert cache.cached_tokens(a + [1]) == B and cache.cached_tokens(b + [1]) == 0
    assert cache.evicted_blocks == 3
    cache.set_limit(0)
    assert cache.positions == 0


def test_a_prefix_too_big_for_the_limit_keeps_what_fits_without_evicting_its_own_blocks():
    cache = PrefixCache()
    cache.set_limit(2 * B)
    ids = prompt(7, 4 * B)
    assert cache.insert(ids, kv_of(ids), 0) == 2
    assert cache.cached_tokens(ids) == 2 * B


# ------------------------------------------------------------------ in the engine


def test_two_requests_with_one_prefix_the_second_copies_it_and_gets_the_same_tokens():
    prefix = prompt(8, 3 * B + 4)
    first = prefix + prompt(9, 5)
    second = prefix + prompt(10, 7)
    engine = Engine(ModelRunner(MODEL), None, batch_size=2, policy="continuous", prefix_cache=True)
    requests = [make_request(engine, i, p, params(6)) for i, p in enumerate([first, second])]
    serve_all(engine, requests[:1])
    stats = serve_all(engine, requests[1:])
    # The cache outlives a run: the second run's request finds the first's three full blocks.
    assert [r.cached_prompt_tokens for r in requests] == [0, 3 * B]
    assert stats.cached_prompt_tokens == 3 * B and stats.prompt_tokens == len(second)
    for request, ids in zip(requests, [first, second], strict=True):
        tokens, logprobs = alone(ids, params(6))
        assert request.token_ids == tokens
        np.testing.assert_allclose(request.logprobs, logprobs, rtol=0, atol=1e-5)


def test_a_request_whose_prefix_was_evicted_while_it_waited_prefills_in_full_and_gets_its_tokens():
    prefix = prompt(11, 2 * B + 8)  # 40 tokens: two full blocks
    late = prefix + [3]
    # A budget of 64 positions, one row: while the 40-token request runs (43 positions) one block fits beside
    # it; the 60-token request after it (63 positions) leaves room for none, evicting it before `late` runs.
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=1,
        kv_budget_tokens=64,
        policy="static",
        prefix_cache=True,
    )
    made = [
        make_request(engine, 0, prefix, params(4)),
        make_request(engine, 1, prompt(12, 60), params(4)),
        make_request(engine, 2, late, params(4)),
    ]
    serve_all(engine, made)
    assert [r.cached_prompt_tokens for r in made] == [0, 0, 0]
    assert made[2].token_ids == alone(late, params(4))[0]
    # Without the long request between them, the block kept is found.
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=1,
        kv_budget_tokens=64,
        policy="static",
        prefix_cache=True,
    )
    made = [make_request(engine, 0, prefix, params(4)), make_request(engine, 2, late, params(4))]
    serve_all(engine, made)
    assert [r.cached_prompt_tokens for r in made] == [0, B]
    assert made[1].token_ids == alone(late, params(4))[0]


def test_the_cache_never_holds_more_than_the_budget_leaves_beside_the_kv_cache():
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=2,
        kv_budget_tokens=200,
        policy="continuous",
        prefix_cache=True,
    )
    prompts = [prompt(20 + i, 30 + 17 * i) for i in range(5)]
    made = [make_request(engine, i, p, params(5)) for i, p in enumerate(prompts)]
    for request in made:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
        allocated = (
            0
            if engine.kv_cache is None
            else len(engine.kv_cache.lengths) * engine.kv_cache.capacity
        )
        assert engine.prefix_cache.positions + allocated <= 200


def test_chunked_prefill_feeds_decode_rows_first_and_gives_the_first_token_when_the_prompt_ends():
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=2,
        policy="continuous",
        round_token_budget=8,
        prefix_cache=False,
    )
    short = make_request(engine, 0, prompt(30, 3), params(10))
    long = make_request(engine, 1, prompt(31, 20), params(2))
    engine.add_request(short)
    engine.add_request(long)
    fed = []
    while engine.has_unfinished():
        output = engine.step()
        fed.append(sorted(r.index for r in output.new_tokens))
    # Round 1: the short prompt (3) and 5 tokens of the long one; then the short row decodes (1) and the
    # long one takes 7 a round: 5 + 7 + 7 = 19, then the last token with its first output token in round 4.
    assert long.prefill_rounds == 4 and long.first_round == 1
    assert fed[:4] == [[0], [0], [0], [0, 1]]
    assert long.finish_round == 5 and short.finish_round == 10
    assert long.token_ids == alone(long.prompt_ids, params(2))[0]
    assert short.token_ids == alone(short.prompt_ids, params(10))[0]


# ------------------------------------------------------------------ the property


@st.composite
def workloads(draw):
    """Prompts sharing prefixes of random lengths (some none), each arriving after a random number of steps."""
    n_prefixes = draw(st.integers(1, 3))
    prefixes = [
        prompt(100 + draw(st.integers(0, 50)), draw(st.integers(1, 3 * B + 5)))
        for _ in range(n_prefixes)
    ]
    n = draw(st.integers(1, 7))
    items = []
    for index in range(n):
        prefix = prefixes[draw(st.integers(0, n_prefixes - 1))]
        cut = draw(st.integers(0, len(prefix)))
        suffix = prompt(200 + index, draw(st.integers(0, 12)))
        ids = (prefix[:cut] + suffix) or [7]
        seed = draw(st.one_of(st.none(), st.integers(0, 1000)))
        items.append((ids, draw(st.integers(1, 6)), seed, draw(st.integers(0, 6))))
    return items


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    workload=workloads(),
    policy=st.sampled_from(["static", "continuous"]),
    rows=st.integers(1, 4),
    round_tokens=st.integers(1, 40),
    kv_budget=st.one_of(st.none(), st.integers(160, 400)),
    prefix_cache=st.booleans(),
    chunked=st.booleans(),
)
def test_neither_the_cache_nor_chunking_nor_arrival_changes_a_requests_tokens(
    workload, policy, rows, round_tokens, kv_budget, prefix_cache, chunked
):
    if not chunked and policy == "continuous":
        # Unchunked, a prompt over the round's budget is refused: give it room.
        round_tokens = max(round_tokens, max(len(ids) for ids, *_ in workload))
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=rows,
        policy=policy,
        round_token_budget=round_tokens,
        kv_budget_tokens=kv_budget,
        prefix_cache=prefix_cache,
        chunked_prefill=chunked,
    )
    made = [
        make_request(engine, i, ids, params(n, seed))
        for i, (ids, n, seed, _) in enumerate(workload)
    ]
    arrivals = sorted(range(len(made)), key=lambda i: workload[i][3])
    step = 0
    while arrivals or engine.has_unfinished():
        while arrivals and workload[arrivals[0]][3] <= step:
            engine.add_request(made[arrivals.pop(0)])
        engine.step()
        step += 1
    for request, (ids, n, seed, _) in zip(made, workload, strict=True):
        assert request.error is None, request.error
        tokens, logprobs = alone(ids, params(n, seed))
        assert request.token_ids == tokens
        np.testing.assert_allclose(request.logprobs, logprobs, rtol=0, atol=1e-5)
        if not prefix_cache:
            assert request.cached_prompt_tokens == 0
        assert request.cached_prompt_tokens % B == 0 and request.cached_prompt_tokens < len(ids)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_llm_reports_cached_prompt_tokens_and_can_turn_the_cache_off(policy):
    from conftest import completion_of
    from minirt.cli.records import record

    prefix = prompt(40, 2 * B + 1)
    # Off unless asked for.
    engine = Engine(ModelRunner(MODEL), None, batch_size=1, policy=policy)
    assert engine.prefix_cache is None
    for enabled, expected in ((True, [0, 2 * B]), (False, [0, 0])):
        engine = Engine(ModelRunner(MODEL), None, batch_size=1, policy=policy, prefix_cache=enabled)
        made = [make_request(engine, i, prefix + [i + 1], params(3)) for i in range(2)]
        serve_all(engine, made)
        outputs = [completion_of(r) for r in made]
        assert [o.cached_prompt_tokens for o in outputs] == expected
        assert [record(r)["cached_prompt_tokens"] for r in made] == expected


def test_continuous_batching_waits_for_a_prefix_in_flight_rather_than_computing_it_twice():
    prefix = prompt(50, 2 * B + 3)
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=4,
        policy="continuous",
        round_token_budget=20,
        prefix_cache=True,
    )
    first = make_request(engine, 0, prefix + [1], params(3))
    second = make_request(engine, 1, prefix + [2], params(3))
    other = make_request(engine, 2, prompt(51, 10), params(3))
    serve_all(engine, [first, second, other])
    # By hand, 20 tokens a round: round 1 feeds 20 of the first's 36; the second shares two blocks with it and
    # waits, and nothing is left for the third.  Round 2 ends the first prompt (16) and starts the third (4).
    # Round 3: the second is admitted with its 32 tokens cached and feeds its last 4 beside the others.
    assert [r.first_round for r in (first, second, other)] == [1, 3, 2]
    assert [r.cached_prompt_tokens for r in (first, second, other)] == [0, 32, 0]
    for request in (first, second, other):
        assert request.token_ids == alone(request.prompt_ids, params(3))[0]


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_the_budget_holds_at_the_moment_a_kv_cache_is_allocated(policy, monkeypatch):
    budget = 180
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=4,
        kv_budget_tokens=budget,
        policy=policy,
        prefix_cache=True,
    )
    allocate = engine.runner.model.new_kv_cache
    seen = []

    def checked(n_slots, capacity):
        running = engine.kv_cache is not None and any(
            r.slot is not None for r in engine.scheduler.running
        )
        held = len(engine.kv_cache.lengths) * engine.kv_cache.capacity if running else 0
        seen.append(engine.prefix_cache.positions)
        assert engine.prefix_cache.positions + held + n_slots * capacity <= budget
        return allocate(n_slots=n_slots, capacity=capacity)

    monkeypatch.setattr(engine.runner.model, "new_kv_cache", checked)
    prefix = prompt(60, 2 * B + 8)
    serve_all(engine, [make_request(engine, 0, prefix, params(4))])
    made = [
        make_request(engine, i, prefix[: 2 * B] + prompt(61 + i, 5), params(4)) for i in range(4)
    ]
    serve_all(engine, made)
    # The first run left two blocks; before the 4 x 40 positions of the second run's KV cache are allocated, the
    # cache is cut to the 20 they leave: one block.
    assert seen == [0, B]
    for request in made:
        assert request.token_ids == alone(request.prompt_ids, params(4))[0]


def test_prompts_that_end_in_one_round_enter_the_cache_in_slot_order():
    """By hand: a pool of 2 rows x 53 positions in a budget of 154 leaves the cache 48
    positions.  In round 2 two prompts end: slot 0's (20 tokens, 1 block) and slot 1's (50
    tokens, 3 blocks).  Slot 0's goes in first; slot 1's 48 positions then evict it, so the
    last request, which shares slot 1's first 48 tokens, copies all 48 (in the other order,
    slot 1's first block would be evicted for slot 0's, and it would copy none)."""
    model = random_model(seed=1, vocab_size=50, n_positions=128)
    shared = [(i * 7) % 50 for i in range(50)]
    prompts = [[1, 2], shared, [(i * 3 + 1) % 50 for i in range(20)], shared[:48] + [9] * 5]
    engine = Engine(
        ModelRunner(model),
        None,
        batch_size=2,
        policy="continuous",
        kv_budget_tokens=154,
        round_token_budget=40,
        prefix_cache=True,
    )
    made = [
        make_request(engine, i, p, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0))
        for i, (p, n) in enumerate(zip(prompts, [1, 2, 1, 1], strict=True))
    ]
    serve_all(engine, made)
    assert (engine.kv_budget_positions, made[1].slot, made[2].slot) == (154, 1, 0)
    assert [(r.first_round, r.finish_round) for r in made] == [(1, 1), (1, 3), (2, 2), (3, 3)]
    assert made[3].cached_prompt_tokens == 48


# ------------------------------------------------------------------ a pool that grows beside the cache


@pytest.mark.parametrize(
    "budget, cached",
    [
        # While the pool grows, the old pool (1 x 12) and the new (2 x 37) are both held: 86
        # positions.  102 leaves the cache 16, one block exactly (the prefix's head is kept).
        (102, B),
        # 106 leaves 20: still one block, not the two that 106 - 74 (the new pool alone) holds.
        (106, B),
        # 118 leaves 32: both blocks exactly.
        (118, 2 * B),
    ],
)
def test_a_pool_that_grows_under_a_tight_budget_keeps_what_fits_and_the_tokens_stay(budget, cached):
    """A first run caches a 36-token prompt's two full blocks.  In the next, a short request
    (12 positions) runs alone in a pool of one row; then a request sharing those two blocks
    arrives, needing 37 positions: the pool grows to 2 rows of 37 in that round (budget // 37 is
    2), and the prefix cache gives up what the two pools leave no room for, by hand above.  The
    newcomer waits no round, copies what is left, and both get their tokens alone without the
    cache."""
    from conftest import completion_of

    shared = prompt(70, 2 * B)
    engine = Engine(
        ModelRunner(MODEL),
        None,
        batch_size=4,
        policy="continuous",
        kv_budget_tokens=budget,
        prefix_cache=True,
    )
    serve_all(engine, [make_request(engine, 0, shared + prompt(71, 4), params(1))])
    assert engine.prefix_cache.positions == 2 * B
    engine.start_run()
    short = make_request(engine, 0, prompt(72, 3), params(10))
    engine.add_request(short)
    engine.step()
    assert (len(engine.kv_cache.lengths), engine.kv_cache.capacity) == (1, 12)
    newcomer = make_request(engine, 1, shared + prompt(73, 3), params(3))
    engine.add_request(newcomer)
    engine.step()
    assert (len(engine.kv_cache.lengths), engine.kv_cache.capacity) == (2, 37)
    while engine.has_unfinished():
        allocated = len(engine.kv_cache.lengths) * engine.kv_cache.capacity
        assert engine.prefix_cache.positions + allocated <= budget
        engine.step()
    outputs = [completion_of(r) for r in (short, newcomer)]
    assert [o.cached_prompt_tokens for o in outputs] == [0, cached]
    assert [(o.first_round, o.rounds_waited) for o in outputs] == [(1, 0), (2, 0)]
    for output in outputs:
        tokens, logprobs = alone(output.prompt_token_ids, params(len(output.token_ids)))
        assert output.token_ids == tokens
        np.testing.assert_allclose(output.logprobs, logprobs, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ through LLM, with a tokenizer's model


def llm_alone(folder, token_ids, sampling):
    """What `LLM.generate` gives the prompt alone: one row, no prefix cache, no chunking."""
    from minirt import LLM

    llm = LLM(folder, batch_size=1, prefix_cache=False, chunked_prefill=False)
    (output,) = completions(llm.generate([token_ids], sampling))
    return output


@pytest.mark.parametrize(
    "policy, first_rounds, cached",
    [
        # One group, all admitted in round 1: nothing is cached yet when they start.
        ("static", [1, 1, 1], [0, 0, 0]),
        # The first is admitted alone; the others wait a round for its two blocks to be in.
        ("continuous", [1, 2, 2], [0, 2 * B, 2 * B]),
    ],
)
def test_prompts_sharing_a_prefix_that_arrive_together_get_their_tokens_alone(
    tiny_lm, policy, first_rounds, cached
):
    from minirt import LLM

    shared = prompt(80, 2 * B + 3)
    prompts = [shared + prompt(81 + i, 2 + i) for i in range(3)]
    sampling = [params(5), params(5, seed=17), params(4, seed=18)]
    llm = LLM(tiny_lm, batch_size=4, policy=policy, prefix_cache=True)
    outputs = completions(llm.generate(prompts, sampling))
    assert [o.first_round for o in outputs] == first_rounds
    assert [o.cached_prompt_tokens for o in outputs] == cached
    # Again, now that the cache holds the prefix: all three start in round 1, each copying the
    # same two blocks into its own slot in that one round.
    again = completions(llm.generate(prompts, sampling))
    assert [o.first_round for o in again] == [1, 1, 1]
    assert [o.cached_prompt_tokens for o in again] == [2 * B] * 3
    references = [llm_alone(tiny_lm, ids, sp) for ids, sp in zip(prompts, sampling, strict=True)]
    for output, reference in zip(outputs + again, references * 2, strict=True):
        assert output.error is None and output.token_ids == reference.token_ids
        np.testing.assert_allclose(output.logprobs, reference.logprobs, rtol=0, atol=1e-5)


def test_a_hit_after_the_slot_its_blocks_came_from_was_reused_gives_the_tokens_without_cache(
    tiny_lm,
):
    """One row, so every request takes slot 0 in turn: the first leaves its prompt's two
    blocks in the cache, the second (another prompt, as long) overwrites the slot, and the third
    starts with the first's blocks.  What it copies must be the first prompt's keys and values,
    kept apart from the slot they came from: its tokens and logprobs are those it gets alone,
    without the cache."""
    from minirt import LLM

    shared = prompt(90, 2 * B)
    prompts = [shared + prompt(91, 5), prompt(92, 2 * B + 5), shared + prompt(93, 4)]
    sampling = params(6)
    llm = LLM(tiny_lm, batch_size=1, policy="continuous", prefix_cache=True)
    requests = [llm.make_request(i, ids, sampling) for i, ids in enumerate(prompts)]
    llm.run(requests)
    assert [r.slot for r in requests] == [0, 0, 0]
    assert [r.first_round for r in requests] == [1, 7, 13]
    assert [r.cached_prompt_tokens for r in requests] == [0, 0, 2 * B]
    for request, ids in zip(requests, prompts, strict=True):
        reference = llm_alone(tiny_lm, ids, sampling)
        assert request.error is None and request.token_ids == reference.token_ids
        np.testing.assert_allclose(request.logprobs, reference.logprobs, rtol=0, atol=1e-5)
