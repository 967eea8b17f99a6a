"""The model runner: a round's plan turned into a forward pass, and each row's token picked.

Owns: `ModelRunner`, what the engine asks of the model each round, in the order a round needs
it (nano-vllm's model runner, vLLM's execute_model):

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

Must not know: who runs (the scheduler decides), the KV budget, when requests arrive, clocks,
text or files.
"""

from __future__ import annotations

import numpy as np

from ..model.batch import Batch
from .request import Request, add_token, fail_request, slot_of
from .sampler import choose_tokens, prompt_logprobs
from .scheduler import RoundPlan


class ModelRunner:
    """Runs the rounds the scheduler plans on one model."""

    def __init__(self, model, eos_token_id: int | None):
        self.model = model
        self.eos_token_id = eos_token_id

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
        past_lens = kv_cache.lengths[slots]  # [B]
        return Batch(
            new_tokens,
            self.model.backend,
            slots=slots,
            past_lens=past_lens,
            wants_logits=wants_logits,
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
        n_positions = self.model.config.n_positions
        # The logits are those of these rows alone (`Batch`'s wants_logits), in row order.
        producing = [request for request in active if request.prompt_done]
        if not producing:
            return []
        choices = choose_tokens(self.model.backend, logits, producing)
        got_token = []
        for request, (token, logprob, top) in zip(producing, choices, strict=True):
            if token is None:
                number = len(request.token_ids) + 1
                fail_request(
                    request,
                    f"the model's logits for its token {number} are not finite "
                    "(NaN or inf): its weights hold NaN/inf, or float16 overflowed (try float32)",
                    round_number,
                )
                continue
            eos = self.eos_token_id
            add_token(request, token, logprob, round_number, eos, n_positions, top)
            got_token.append(request)
        return got_token
