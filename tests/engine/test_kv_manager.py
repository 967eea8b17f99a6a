"""The KV owner (minirt/engine/kv_manager.py) on its own: slots handed out lowest first, a pool
that grows keeping the slots held and their keys, a slot reused after growth zeroed, and the
prefix cache's share of the budget, counted by hand at each allocation (both pools count while a
pool grows; a budget exactly full keeps every block that fits it)."""

import numpy as np

from minirt.engine.kv_manager import KVManager
from minirt.engine.params import SamplingParams
from minirt.engine.prefix_cache import PrefixCache
from minirt.engine.request import Request
from minirt.model.kv_cache import KVCache

BLOCK = 4


def numbers_cache(rows: int, capacity: int) -> KVCache:
    """One layer, one K/V head of width 2: small enough to read every number."""
    return KVCache(np, 1, 1, 2, rows, capacity, np.float32)


def request(index: int, prompt_len: int = 1) -> Request:
    return Request(
        index=index,
        id=str(index),
        prompt=None,
        prompt_ids=[100 * index + t for t in range(prompt_len)],
        params=SamplingParams(max_tokens=1, temperature=0.0),
    )


def fill(manager: KVManager, req: Request, value: float) -> None:
    """Write `value` into every position of the request's prompt in its slot (what its prefill
    would leave there)."""
    assert manager.cache is not None and req.slot is not None
    shape = (1, 1, req.prompt_len, 2)  # [n_layer, H, n, D]
    manager.cache.write_positions(req.slot, 0, np.full(shape, value), np.full(shape, -value))


def test_slots_go_lowest_first_and_a_freed_one_is_taken_next():
    manager = KVManager(100)
    manager.allocate(3, 5)
    a, b, c, d = (request(i) for i in range(4))
    for req in (a, b, c):
        manager.admit(req)
    assert [a.slot, b.slot, c.slot] == [0, 1, 2]
    manager.free(b)
    manager.admit(d)
    assert d.slot == 1 and manager.free_slots == []


def test_a_grown_pool_keeps_the_held_slots_and_zeroes_a_slot_reused_after_growth():
    """2 rows of 4, A in slot 0 and B in slot 1 (both written); B leaves; the pool grows to 4 rows
    of 8 while A holds slot 0: A keeps slot 0 and its keys, slots 1-3 are free, and C, taking
    slot 1 (B's, copied over with B's keys), finds it zeroed."""
    manager = KVManager(1000, new_cache=numbers_cache)
    manager.allocate(2, 4)
    a, b, c = request(1, 3), request(2, 4), request(3, 2)
    manager.admit(a)
    manager.admit(b)
    fill(manager, a, 7.0)
    fill(manager, b, 9.0)
    manager.free(b)
    manager.allocate(4, 8)
    cache = manager.cache
    assert isinstance(cache, KVCache) and cache.keys.shape == (1, 4, 1, 8, 2)
    assert a.slot == 0 and manager.free_slots == [1, 2, 3]
    assert (cache.keys[0, 0, 0, :3] == 7.0).all() and (cache.keys[0, 0, 0, 3:] == 0).all()
    assert (cache.values[0, 0, 0, :3] == -7.0).all()
    assert (cache.keys[0, 1, 0, :4] == 9.0).all()  # B's keys came over with its slot
    manager.admit(c)
    assert c.slot == 1
    assert not cache.keys[0, 1].any() and not cache.values[0, 1].any()
    assert cache.lengths.tolist() == [3, 0, 0, 0]


def test_a_pool_made_while_no_slot_is_held_replaces_the_old_one():
    manager = KVManager(1000, new_cache=numbers_cache)
    manager.allocate(2, 4)
    a = request(1, 3)
    manager.admit(a)
    fill(manager, a, 5.0)
    manager.free(a)
    manager.allocate(3, 6)
    assert manager.free_slots == [0, 1, 2]
    assert manager.cache is not None and not manager.cache.keys.any()


def prefix_manager(budget: int) -> tuple[KVManager, PrefixCache]:
    prefix = PrefixCache(block_tokens=BLOCK)
    return KVManager(budget, new_cache=numbers_cache, prefix_cache=prefix), prefix


def cache_prompt(manager: KVManager, req: Request) -> None:
    """Admit a request, write its prompt and hand the prefix cache its blocks; then free it."""
    manager.admit(req)
    fill(manager, req, float(req.index))
    manager.insert_prompt(req)
    manager.free(req)


def test_the_prefix_cache_holds_what_the_budget_leaves_and_a_budget_exactly_full_keeps_all():
    """Budget 48; a cache of 2 x 8 leaves 32 positions: eight blocks of 4 fit exactly (all kept);
    a ninth evicts the least recently used one.  With no cache, the whole budget is the
    prefix cache's."""
    manager, prefix = prefix_manager(48)
    assert prefix.limit_positions == 48
    manager.allocate(2, 8)
    assert prefix.limit_positions == 32
    cache_prompt(manager, request(1, 8))  # two blocks
    cache_prompt(manager, request(2, 8))
    cache_prompt(manager, request(3, 8))
    cache_prompt(manager, request(4, 8))
    assert prefix.positions == 32 and prefix.evicted_blocks == 0
    cache_prompt(manager, request(5, 4))
    assert prefix.positions == 32 and prefix.evicted_blocks == 1
    # A prompt uses a cached block only with a token after it to prefill.
    assert prefix.cached_tokens(request(5, 4).prompt_ids + [1]) == 4
    assert prefix.cached_tokens(request(2, 8).prompt_ids + [1]) == 8
    # The least recent: request 1's second block (a prefix's first block is touched as the most
    # recent of its chain, so that its deeper blocks go first).
    assert prefix.cached_tokens(request(1, 8).prompt_ids + [1]) == 4
    manager.release()
    assert manager.cache is None and prefix.limit_positions == 48


def test_while_a_pool_grows_both_pools_count_against_the_budget():
    """Budget 64; a pool of 2 x 8 (16) lets the prefix cache hold 48, and it holds 32.  Growing
    to 4 x 8 (32) while a request holds a slot holds both pools at once: 48 positions, so the
    prefix cache is cut to 16 first; after, with the old pool gone, it may hold 32 again (what
    it dropped stays dropped)."""
    manager, prefix = prefix_manager(64)
    manager.allocate(2, 8)
    assert prefix.limit_positions == 48
    for index in range(1, 5):
        cache_prompt(manager, request(index, 8))
    assert prefix.positions == 32
    manager.admit(request(9, 1))
    manager.allocate(4, 8)
    assert prefix.positions == 16 and prefix.evicted_blocks == 4
    assert prefix.limit_positions == 32


def test_a_request_admitted_with_a_cached_prefix_has_it_copied_into_its_slot():
    """A prompt of 9 whose first 8 tokens (two blocks) are cached starts prefilled at 8, with
    those keys in its slot, and nothing past them."""
    manager, prefix = prefix_manager(1000)
    manager.allocate(2, 12)
    first = request(1, 8)
    cache_prompt(manager, first)
    later = Request(
        index=2,
        id="2",
        prompt=None,
        prompt_ids=first.prompt_ids + [55],
        params=SamplingParams(max_tokens=1, temperature=0.0),
    )
    manager.admit(later)
    cache = manager.cache
    assert isinstance(cache, KVCache)
    assert later.prefilled == 8 and later.cached_prompt_tokens == 8
    assert (cache.keys[0, later.slot, 0, :8] == 1.0).all()
    assert not cache.keys[0, later.slot, 0, 8:].any()
    assert cache.lengths[later.slot] == 8


# ------------------------------------------------------------------ through the engine


def greedy_by_recompute(model, prompt_ids: list[int], n: int) -> list[int]:
    """n greedy tokens, each from the logits of the whole sequence so far, recomputed without a
    KV cache, a batch or a scheduler."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(np.argmax(model.logits([ids])[0][len(ids) - 1])))
    return ids[len(prompt_ids) :]


def test_a_slot_freed_before_the_pool_grew_is_clean_for_its_next_occupant():
    """A (slot 0) and L (slot 1) run in a pool of 2 rows; A finishes, and what it left in slot 0
    is poisoned (NaN keys, inf values: what an fp16 overflow would leave).  Three requests arrive:
    the pool grows to 4 rows while L holds slot 1, taking slot 0's numbers over with it, and the
    first newcomer takes slot 0.  It decodes beside L, whose longer history makes every row's
    attention read past the newcomer's own keys (0 x NaN is NaN unless the slot was zeroed), so
    its tokens are those of a recompute only if the poison never reaches it."""
    from conftest import make_request, random_model

    from minirt.engine.engine import Engine
    from minirt.engine.runner import ModelRunner

    model = random_model(seed=5, vocab_size=60, n_positions=48)
    engine = Engine(ModelRunner(model), None, batch_size=4, policy="continuous")

    def greedy(n):
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)

    first = make_request(engine, 0, [1, 2, 3], greedy(2))
    long = make_request(engine, 1, [4, 5, 6, 7, 8, 9], greedy(20))
    engine.add_request(first)
    engine.add_request(long)
    engine.step()
    engine.step()
    assert first.finished and (first.slot, long.slot) == (0, 1) and engine.free_slots == [0]
    cache = engine.kv_cache
    assert cache.keys.shape[1] == 2
    cache.keys[:, 0] = np.nan
    cache.values[:, 0] = np.inf
    newcomers = {
        2: ([10, 11], 5),
        3: ([12], 5),
        4: ([13, 14, 15], 4),
    }
    made = [make_request(engine, i, p, greedy(n)) for i, (p, n) in newcomers.items()]
    for request in made:
        engine.add_request(request)
    engine.step()
    assert engine.kv_cache.keys.shape[1] == 4 and [r.slot for r in made] == [0, 2, 3]
    while engine.has_unfinished():
        engine.step()
    for request, (prompt_ids, n) in zip(made, newcomers.values(), strict=True):
        assert request.error is None, request.error
        assert request.token_ids == greedy_by_recompute(model, prompt_ids, n)
    assert long.token_ids == greedy_by_recompute(model, [4, 5, 6, 7, 8, 9], 20)
