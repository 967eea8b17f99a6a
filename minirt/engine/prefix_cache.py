"""The prefix cache: the keys and values that earlier requests computed for the start of their
prompts, kept so that a later request starting with the same tokens copies them instead of
computing them again.

Owns: `PrefixCache` and `CachedBlock`.  A prompt is cut into blocks of `block_tokens` tokens
(BLOCK_TOKENS, 16).  A block is found by a key, the hash of its own tokens and of its parent's
key, so that the key of block i stands for every token up to the end of block i.  A key is only
a way to find a block, never a proof: a block found is used only if its tokens are the prompt's
tokens and its parent is the block matched just before it (so, by induction, its whole prefix is
the prompt's).  Two prefixes whose keys collide therefore cost a miss, never wrong keys and
values; a collision when inserting leaves the block that is there.

    match(prompt_ids)             the longest run of cached blocks at the start of a prompt (no
                                  change to the cache: what the scheduler asks when it plans)
    use(prompt_ids, kv, slot)     copy that run into a request's slot and count the hit: the
                                  request prefills only the rest
    insert(prompt_ids, kv, slot)  once a request's prompt is in its slot, keep its full blocks
    set_limit(positions)          the positions the cache may hold: the KV budget less what the
                                  KV owner's cache has allocated (minirt/engine/kv_manager.py);
                                  least recently used first out

At least the prompt's last token is always prefilled, since its logits give the first token: a
prompt of P tokens uses at most (P - 1) // block_tokens blocks.  Only prompt blocks are cached,
never generated tokens.

Why 16 tokens a block: a request loses at most 15 tokens of a shared prefix to the cut, and a
block of the 124M model is 1.2 MB (keys and values, 12 layers), so that copying one is a few
microseconds of memory traffic and finding one a hash of 16 ints; vLLM's default is the same.

The least recently used blocks go first.  A hit touches its blocks from the last to the first,
so that a prefix's first blocks are the most recent and its tail goes before its head: evicting
a block that others hang from would leave those unreachable (they are then evicted in turn as
the least used).  A block of the prefix being inserted is never evicted to make room for it.

Must not know: the layers' arithmetic, scheduling, sampling, text, or how requests arrive.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

BLOCK_TOKENS = 16


class PositionStore(Protocol):
    """Where a prefix's keys and values are read from and copied to: a `KVCache`
    (minirt/model/kv_cache.py), or, in `python -m minirt.rounds`, a stand-in with no numbers."""

    def read_positions(self, slot: int, start: int, end: int) -> tuple[Any, Any]: ...

    def write_positions(self, slot: int, start: int, keys: Any, values: Any) -> None: ...


def block_key(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    """A block's key: its tokens and, through its parent's key, every token before them."""
    return hash((parent_key, tokens))


def prompt_block_keys(
    prompt_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS
) -> tuple[int, ...]:
    """The keys of the blocks a prompt could find in a prefix cache, first to last: at most
    (P - 1) // block_tokens of them, as `PrefixCache.match` looks up.  Key i stands for every
    token up to the end of block i, so two prompts share key i exactly when (barring a collision)
    they share their first i + 1 blocks: what a router matches prompts by
    (minirt/distributed/prefix_router.py)."""
    keys = []
    parent = None
    for index in range((len(prompt_ids) - 1) // block_tokens):
        start = index * block_tokens
        tokens = tuple(int(t) for t in prompt_ids[start : start + block_tokens])
        parent = block_key(parent, tokens)
        keys.append(parent)
    return tuple(keys)


@dataclass(eq=False)
class CachedBlock:
    """The keys and values of `tokens` at one place in a prompt, every layer."""

    key: int
    parent: CachedBlock | None  # the block before it (None: the prompt's first)
    tokens: tuple[int, ...]
    keys: Any  # [n_layer, H, block_tokens, D]
    values: Any  # [n_layer, H, block_tokens, D]


class PrefixCache:
    """Blocks of prompt keys and values, found by their prefix, within a budget of positions."""

    def __init__(
        self,
        block_tokens: int = BLOCK_TOKENS,
        key_function: Callable[[int | None, tuple[int, ...]], int] = block_key,
    ):
        self.block_tokens = block_tokens
        self.key_function = key_function
        # Least recently used first.
        self.blocks: OrderedDict[int, CachedBlock] = OrderedDict()
        self.limit_positions = 0
        # Prompt tokens looked up, and found, over the cache's life (the server's counters).
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0

    @property
    def positions(self) -> int:
        """KV positions the cache holds now."""
        return len(self.blocks) * self.block_tokens

    def match(self, prompt_ids: Sequence[int]) -> list[CachedBlock]:
        """The longest run of cached blocks at the start of the prompt, each checked against the
        prompt's own tokens; at most (P - 1) // block_tokens of them, so that at least the last
        token is left to prefill.  Changes nothing."""
        usable = (len(prompt_ids) - 1) // self.block_tokens
        run: list[CachedBlock] = []
        parent: CachedBlock | None = None
        for tokens in self.cut(prompt_ids, usable):
            parent_key = None if parent is None else parent.key
            block = self.blocks.get(self.key_function(parent_key, tokens))
            if block is None or block.tokens != tokens or block.parent is not parent:
                break
            run.append(block)
            parent = block
        return run

    def shared_with(self, prompt_ids: Sequence[int], others: Sequence[Sequence[int]]) -> int:
        """The most tokens, in whole blocks, that the prompt's start shares with one of `others`
        (prompts still being fed, whose blocks the cache will hold once they are in), at most
        what a match may use: (P - 1) // block_tokens blocks."""
        usable = (len(prompt_ids) - 1) // self.block_tokens * self.block_tokens
        best = 0
        for other in others:
            common = 0
            limit = min(usable, len(other))
            while common < limit and prompt_ids[common] == other[common]:
                common += 1
            best = max(best, common // self.block_tokens * self.block_tokens)
        return best

    def cached_tokens(self, prompt_ids: Sequence[int]) -> int:
        """How many of the prompt's first tokens a request admitted now would take from here."""
        return len(self.match(prompt_ids)) * self.block_tokens

    def use(self, prompt_ids: Sequence[int], kv_cache: PositionStore, slot: int) -> int:
        """Copy the prompt's longest cached prefix into `slot` (zeroed, empty) and count the
        lookup.  Returns the tokens copied: the slot holds their keys, and the request prefills
        from there."""
        run = self.match(prompt_ids)
        for index, block in enumerate(run):
            kv_cache.write_positions(slot, index * self.block_tokens, block.keys, block.values)
        self.touch(run)
        cached = len(run) * self.block_tokens
        self.queried_tokens += len(prompt_ids)
        self.hit_tokens += cached
        return cached

    def insert(self, prompt_ids: Sequence[int], kv_cache: PositionStore, slot: int) -> int:
        """Keep the full blocks of a prompt whose keys and values `slot` now holds (the blocks
        already cached are only touched).  Returns how many blocks were added; it stops at the
        limit, and at a key taken by other tokens."""
        full = len(prompt_ids) // self.block_tokens
        chain: list[CachedBlock] = []
        added = 0
        for index, tokens in enumerate(self.cut(prompt_ids, full)):
            parent = chain[-1] if chain else None
            parent_key = None if parent is None else parent.key
            key = self.key_function(parent_key, tokens)
            found = self.blocks.get(key)
            if found is not None and found.tokens == tokens and found.parent is parent:
                chain.append(found)
                continue
            if found is not None or not self.make_room(pinned=chain):
                # A collision (the block there stays), or no room beside this prefix.
                break
            start = index * self.block_tokens
            keys, values = kv_cache.read_positions(slot, start, start + self.block_tokens)
            block = CachedBlock(key, parent, tokens, keys, values)
            self.blocks[key] = block
            chain.append(block)
            added += 1
        self.touch(chain)
        return added

    def set_limit(self, positions: int) -> None:
        """The positions the cache may hold from now on; the least recently used blocks beyond
        them are dropped."""
        self.limit_positions = max(0, positions)
        while self.positions > self.limit_positions:
            self.evict_least_recent(pinned=[])

    def clear(self) -> None:
        """Drop every block (the counters stay)."""
        self.evicted_blocks += len(self.blocks)
        self.blocks.clear()

    # ------------------------------------------------------------------ inside

    def cut(self, prompt_ids: Sequence[int], n_blocks: int) -> list[tuple[int, ...]]:
        """The prompt's first n_blocks blocks, each a tuple of plain ints."""
        size = self.block_tokens
        blocks = []
        for index in range(n_blocks):
            tokens = prompt_ids[index * size : (index + 1) * size]
            blocks.append(tuple(int(t) for t in tokens))
        return blocks

    def touch(self, run: list[CachedBlock]) -> None:
        """Mark a prefix's blocks used now, its first block the most recent of all."""
        for block in reversed(run):
            self.blocks.move_to_end(block.key)

    def make_room(self, pinned: list[CachedBlock]) -> bool:
        """Evict until one more block fits the limit, sparing `pinned`; False if it cannot."""
        while self.positions + self.block_tokens > self.limit_positions:
            if not self.evict_least_recent(pinned):
                return False
        return True

    def evict_least_recent(self, pinned: list[CachedBlock]) -> bool:
        """Drop the least recently used block not in `pinned`; False if there is none."""
        spared = set(map(id, pinned))
        for key, block in self.blocks.items():
            if id(block) not in spared:
                del self.blocks[key]
                self.evicted_blocks += 1
                return True
        return False
