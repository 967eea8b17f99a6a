"""The KV owner: the budget of key/value positions, the KV cache allocated now, its slots, and the
prefix cache's share of the budget.

Owns: `KVManager`, one per run, owned by the scheduler (minirt/engine/scheduler.py) as vLLM's
scheduler owns its KV cache manager.  The scheduler decides who runs and at what KV shape; it
asks the manager:

    cached_tokens(request)              how much of a waiting prompt the prefix cache holds now
    shared_in_flight(request, others)   how much of it the prompts still being fed will leave
                                        in the cache once they are in
    allocate(rows, capacity)            a new group's cache, or the continuous pool made or
                                        grown (the slots that requests hold keep their numbers
                                        and their keys); room is made first, so the budget holds
                                        at the moment of allocation
    admit(request)                      a free slot for an admitted request, zeroed, with the
                                        cached start of its prompt copied in
    free(request)                       a finished or aborted request gives its slot back
    release()                           the static group is over: its cache goes (a run's
                                        manager goes with its run)

and the engine, after a round's forward pass, `insert_prompt(request)`: a prompt now all in its
slot gives the prefix cache its blocks.

The budget.  Every position allocated in the KV cache counts, and the prefix cache may hold what
is left (`PrefixCache.set_limit`): while a continuous pool grows, the old pool and the new one are
both held (the new one takes over the old one's slots), so both count until the old one goes.

The numbers themselves are made by `new_cache(rows, capacity)`: the model's `new_kv_cache` in the
engine, or `PositionsOnly` (below) where only the bookkeeping is wanted (`python -m minirt.rounds`,
the Ray path's replay of rounds, a scheduler built alone in a test).

Must not know: the layers' arithmetic, the policies (who runs), sampling, text or files.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from .prefix_cache import PrefixCache
from .request import Request


class SlotStore(Protocol):
    """What the manager needs of a KV cache (minirt/model/kv_cache.py's `KVCache`, or
    `PositionsOnly`): its slots' lengths, their capacity, a slot made ready for a new request,
    a smaller cache's slots taken over, and positions read and written (for the prefix cache)."""

    lengths: Any  # [S] host-side
    capacity: int

    def reset_slot(self, slot: int, overwritten: int = 0) -> None: ...

    def copy_from(self, smaller: Any) -> None: ...

    def read_positions(self, slot: int, start: int, end: int) -> tuple[Any, Any]: ...

    def write_positions(self, slot: int, start: int, keys: Any, values: Any) -> None: ...


class PositionsOnly:
    """A KV cache of positions without numbers: slots and their lengths, nothing to compute with.
    What the manager allocates when only the bookkeeping is simulated."""

    def __init__(self, rows: int, capacity: int):
        self.lengths = np.zeros(rows, dtype=np.int64)  # [S]
        self.capacity = capacity

    def reset_slot(self, slot: int, overwritten: int = 0) -> None:
        self.lengths[slot] = 0

    def copy_from(self, smaller: PositionsOnly) -> None:
        self.lengths[: len(smaller.lengths)] = smaller.lengths

    def read_positions(self, slot: int, start: int, end: int) -> tuple[None, None]:
        return None, None

    def write_positions(self, slot: int, start: int, keys, values) -> None:
        return None


class KVManager:
    """The KV budget, the KV cache allocated now and its free slots, and the prefix cache."""

    def __init__(
        self,
        budget_positions: int,
        new_cache: Callable[[int, int], SlotStore] = PositionsOnly,
        prefix_cache: PrefixCache | None = None,
    ):
        self.budget_positions = budget_positions
        self.new_cache = new_cache
        self.prefix_cache = prefix_cache
        # The cache allocated now (a static group's, or the continuous pool), and its slots that
        # no request holds, lowest first.
        self.cache: SlotStore | None = None
        self.free_slots: list[int] = []
        # With no KV cache allocated, the prefix cache may hold the whole budget.
        self.limit_prefix_cache()

    # ------------------------------------------------------------------ asked while planning

    def cached_tokens(self, request: Request) -> int:
        """How many of a waiting request's first prompt tokens the prefix cache holds now."""
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.cached_tokens(request.prompt_ids)

    def shared_in_flight(self, request: Request, in_flight: list[Request]) -> int:
        """How many of a waiting request's first prompt tokens, in whole blocks, the prompts
        still being fed share with it (the cache will hold them once those are in)."""
        if self.prefix_cache is None:
            return 0
        others = [other.prompt_ids for other in in_flight]
        return self.prefix_cache.shared_with(request.prompt_ids, others)

    # ------------------------------------------------------------------ the cache and its slots

    def allocated_positions(self) -> int:
        """KV positions of the cache allocated now: rows x positions per row (0 without)."""
        if self.cache is None:
            return 0
        return len(self.cache.lengths) * self.cache.capacity

    def slots_held(self) -> bool:
        """Whether requests hold slots of the cache allocated now, so that a larger one takes
        them over (a continuous pool that grows) rather than replacing it."""
        return self.cache is not None and len(self.free_slots) < len(self.cache.lengths)

    def allocate(self, rows: int, capacity: int) -> None:
        """A KV cache of `rows` slots of `capacity` positions: a new one, or the one held now
        grown to it (its held slots keep their numbers and keys, the new rows are free).  Room
        is made in the prefix cache first, beside the old cache while both are held."""
        held = self.slots_held()
        old = self.cache
        # Room first: the new cache, beside the old one while requests hold its slots.
        self.make_room(rows * capacity + (self.allocated_positions() if held else 0))
        new = self.new_cache(rows, capacity)
        if held:
            assert old is not None
            new.copy_from(old)
            self.free_slots = sorted(self.free_slots + list(range(len(old.lengths), rows)))
        else:
            self.free_slots = list(range(rows))
        self.cache = new
        self.limit_prefix_cache()

    def admit(self, request: Request) -> None:
        """An admitted request takes the lowest free slot: zeroed past what the prefix cache
        holds of its prompt, which is copied in (it then prefills only the rest)."""
        assert self.cache is not None  # allocated when its group or pool was planned
        request.slot = self.free_slots.pop(0)
        cached = self.cached_tokens(request)
        # Zeroed past the copy, so that nothing of an earlier occupant can leak in.
        self.cache.reset_slot(request.slot, overwritten=cached)
        if self.prefix_cache is not None:
            copied = self.prefix_cache.use(request.prompt_ids, self.cache, request.slot)
            assert copied == cached  # nothing changed the prefix cache in between
            request.prefilled = cached
            request.cached_prompt_tokens = cached

    def insert_prompt(self, request: Request) -> None:
        """A request's whole prompt is in its slot: the prefix cache keeps its full blocks."""
        if self.prefix_cache is None:
            return
        assert self.cache is not None and request.slot is not None
        self.prefix_cache.insert(request.prompt_ids, self.cache, request.slot)

    def free(self, request: Request) -> None:
        """A finished or aborted request gives its slot back (continuous: the next admission
        may take it; a static group admits nobody until it ends)."""
        if request.slot is not None and self.cache is not None:
            self.free_slots = sorted(self.free_slots + [request.slot])

    def release(self) -> None:
        """The static group is over: its cache goes, and the prefix cache may use its share of
        the budget."""
        self.cache = None
        self.free_slots = []
        self.limit_prefix_cache()

    def limit_prefix_cache(self) -> None:
        """The prefix cache may hold what the budget leaves beside the cache allocated now;
        called whenever that allocation changes."""
        self.make_room(self.allocated_positions())

    def make_room(self, kv_positions: int) -> None:
        """The prefix cache shrinks to what the budget leaves beside `kv_positions` of KV cache
        (evicting the least recently used blocks that no longer fit)."""
        if self.prefix_cache is None:
            return
        self.prefix_cache.set_limit(self.budget_positions - kv_positions)
