"""The model runner: a round's plan turned into a forward pass, and each row's token picked.

Owns: `Runner`, what the engine asks of whatever computes its rounds, and `ModelRunner`, the
one that runs a model (nano-vllm's model runner, vLLM's execute_model).  The engine is given a
runner; `minirt rounds` and the Ray path's replay give it a runner without a model
(minirt/engine/model_free_runner.py), so that one scheduler, KV owner and loop serve all three.
What a runner does, in the order a round needs it:

    score_prompt(request)      prompt logprobs: one scoring pass of the request's own prompt,
                               without a KV cache, for a request that asked
    forward(plan, kv_cache)    each active row's new tokens (its prompt, or the chunk of it the
                               plan gives; else its last token), its slot and the keys the slot
                               holds, as one `Batch` (the rows in slot order, so that a full
                               cache is read as one view); then one forward pass: the rows and
                               their logits [B', V] (only rows that give a token have logits)
    pick_tokens(rows, logits, round_number)
                               each row whose prompt is in picks its token from its own logits
                               and its own random stream, appends it and checks its own stop
                               rules; a row whose logits are not finite fails alone

and what it tells the engine before any round: the context (`n_positions`), the memory of one
position's keys and values (`kv_bytes_per_position`, for the KV budget in MiB), the KV buffers
of a group or pool (`new_kv_cache`), and the EOS ids that stop a request.

Must not know: who runs (the scheduler decides), the KV budget, when requests arrive, clocks,
text or files.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..model.batch import Batch
from ..model.config import special_ids
from ..model.interface import Model
from ..model.kv_cache import KVCache
from .kv_manager import SlotStore
from .request import Request, add_token, fail_request, slot_of
from .sampler import choose_tokens, prompt_logprobs
from .scheduler import RoundPlan


class Runner(Protocol):
    """What the engine asks of whatever computes its rounds."""

    # The end-of-text tokens that stop a request, the primary one first (none: nothing does).
    eos_token_ids: tuple[int, ...]
    # The longest prompt + output a request may have.
    n_positions: int
    # One position's keys and values, in every layer: what a KV budget in MiB is divided by.
    kv_bytes_per_position: int

    def new_kv_cache(self, rows: int, capacity: int) -> SlotStore:
        """The KV buffers of `rows` requests of `capacity` positions."""
        ...

    def score_prompt(self, request: Request) -> None:
        """Prompt logprobs, for a request that asked."""
        ...

    def forward(self, plan: RoundPlan, kv_cache: Any) -> tuple[list[Request], Any]:
        """One forward pass of the plan's active rows: (the rows, their logits)."""
        ...

    def pick_tokens(self, active: list[Request], logits: Any, round_number: int) -> list[Request]:
        """Each row whose prompt is in gets its token; returns those that got one."""
        ...


class ModelRunner:
    """Runs the rounds the scheduler plans on one model.  A request stops at any of the model
    config's EOS ids (those in its vocabulary); an engine given a tokenizer sets the
    tokenizer's instead (which adds generation_config.json's and tokenizer_config.json's)."""

    def __init__(self, model: Model):
        self.model = model
        c = model.config
        self.eos_token_ids = config_eos_ids(c)
        self.n_positions = c.n_positions
        self.kv_bytes_per_position = KVCache.bytes_needed(
            c.n_layer, c.n_kv_head, c.head_dim, 1, 1, model.dtype
        )

    def new_kv_cache(self, rows: int, capacity: int) -> KVCache:
        """The model's KV buffers for `rows` requests of `capacity` positions (what the KV owner
        allocates a group or pool)."""
        return self.model.new_kv_cache(n_slots=rows, capacity=capacity)

    def score_prompt(self, request: Request) -> None:
        """Prompt logprobs: one scoring pass of the request's own prompt, without a KV cache,
        giving every prompt position's logits [L, V]."""
        prompt_logits = self.model.logits([request.prompt_ids])[0]
        request.prompt_logprobs = prompt_logprobs(prompt_logits, request.prompt_ids)

    def forward(self, plan: RoundPlan, kv_cache) -> tuple[list[Request], object]:
        """One forward pass of the plan's active rows: (the rows in the order of the logits,
        logits [B', V] of those that give a token)."""
        # The rows in slot order: when they hold every slot of the cache (a full pool, a static
        # group), a decode step reads their keys and values as one view instead of gathering a
        # copy in every layer.  A row's numbers do not depend on its place.
        active = sorted(plan.active, key=slot_of)
        batch = self.batch_metadata(active, plan, kv_cache)
        return active, self.model.forward(batch, kv_cache)

    def batch_metadata(self, active: list[Request], plan: RoundPlan, kv_cache) -> Batch:
        """The batch for this round: each active row's new tokens, its slot and what the slot
        holds."""
        assert kv_cache is not None  # a round runs within its group's (or the pool's) cache
        slots = np.array([r.slot for r in active], dtype=np.int64)  # [B]
        new_tokens = [self.new_tokens_of(r, plan) for r in active]
        # A row fed a chunk short of its prompt's end gives no token, so needs no logits.
        wants_logits = [plan.prefill_to.get(r, r.prompt_len) == r.prompt_len for r in active]
        # A row not fed a part of its prompt feeds its last generated token.
        decoding = [r not in plan.prefill_to for r in active]
        past_lens = kv_cache.lengths[slots]  # [B]
        return Batch(
            new_tokens,
            self.model.backend,
            slots=slots,
            past_lens=past_lens,
            wants_logits=wants_logits,
            decoding=decoding,
        )

    def new_tokens_of(self, request: Request, plan: RoundPlan) -> list[int]:
        """What a row feeds this round: the prompt from where its slot's keys end to where the
        plan's chunk ends (the prompt's end, unless chunked), or its last token."""
        if request in plan.prefill_to:
            end = plan.prefill_to[request]
            # The scheduler planned with what the cache holds (room for the round's KV cache
            # was made before it asked), so the slot holds what it counted on.
            assert request.prefilled < end <= request.prompt_len
            return request.prompt_ids[request.prefilled : end]
        return request.token_ids[-1:]

    def pick_tokens(self, active: list[Request], logits, round_number: int) -> list[Request]:
        """Each active row whose prompt is in picks its token from its own logits row, appends
        it, and checks its own stops (a row fed a chunk short of its prompt's end gets none).
        Returns the requests that got a token (a row whose logits are not finite fails alone:
        its peers' rows are untouched and go on)."""
        n_positions = self.n_positions
        # The logits are those of these rows alone (`Batch`'s wants_logits), in row order.
        producing = [request for request in active if request.prompt_done]
        if not producing:
            return []
        choices = choose_tokens(self.model.backend, logits, producing)
        got_token = []
        for request, choice in zip(producing, choices, strict=True):
            if choice is None:
                number = len(request.token_ids) + 1
                fail_request(
                    request,
                    f"the model's logits for its token {number} are not finite "
                    "(NaN or inf): its weights hold NaN/inf, or float16 overflowed (try float32)",
                    round_number,
                )
                continue
            add_token(request, choice, round_number, self.eos_token_ids, n_positions)
            got_token.append(request)
        return got_token


def config_eos_ids(config) -> tuple[int, ...]:
    """The EOS ids of a model's config that lie in its vocabulary: its `eos_token_id` (as
    `special_ids` settles it) first, then the rest of its list (`eos_token_ids`, where the
    config keeps config.json's whole list), each once."""
    eos, _bos = special_ids(config.eos_token_id, config.bos_token_id, config.vocab_size)
    listed = config.eos_token_ids
    ordered = [eos, *listed]
    inside = [i for i in ordered if i is not None and 0 <= i < config.vocab_size]
    return tuple(dict.fromkeys(inside))
