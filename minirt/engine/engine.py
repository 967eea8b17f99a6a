"""The serving loop: many requests, run in rounds that share each forward pass.

Owns: a request's way through the runtime, in one place.  `make_request` turns a prompt into a `Request` (a
bad one is refused with an error of its own); `serve` refuses what no round could ever take, runs the rest
under a scheduling policy (minirt/scheduler.py), and holds the KV cache, giving each admitted request a slot
of its own.  Under static groups, the default:

    while requests wait:
        choose members                 (the scheduler: arrival order, up to batch_size, within the KV budget)
        each member takes its own KV slot in a cache allocated for this group
        until every member has finished:
            prepare the batch metadata   (each active member's new tokens, its slot, the keys it holds)
            run the round                (one forward pass of the active members)
            apply the updates            (each member picks its token, appends it, checks its own stops)
            keep each finished member's status (it frees its slot, leaves the compute; its record is final)
        release the group                (only now may the next group start)

Under `continuous`, finished rows are refilled from the queue every round, within one KV pool; the loop is
the same.  Rounds are numbered across the whole run; a request that produces L tokens is active in L
consecutive rounds, the first being its prefill.  A finished request costs no compute later and never stops
or alters the others.

Must not know: the layers' arithmetic, files, command-line flags or output formats.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence
import numpy as np

from .params import SamplingParams
from .request import Request, Status, add_token, fail_request
from .sampler import choose_tokens, derived_seed, prompt_logprobs, request_rng, sample_seed
from .scheduler import GroupRecord, POLICIES, RoundPlan, SCHEDULERS, Scheduler
from .stats import RunStats
from ..errors import InputError, RequestError, require_at_least_one
from ..loading.tokenizer import Tokenizer, special_ids
from ..model.batch import Batch, check_token_ids
from ..model.gpt2 import GPT2
from ..model.kv_cache import KVCache


DEFAULT_KV_BUDGET_MIB = 4096


DEFAULT_ROUND_TOKENS = (
    2048  # continuous batching: tokens one round may process (a prefill counts its prompt)
)


class Engine:
    """Serves requests on one model, in static groups or with continuous batching."""

    def __init__(
        self,
        model: GPT2,
        tokenizer: Tokenizer | None,
        batch_size: int = 8,
        kv_budget_mib: float = DEFAULT_KV_BUDGET_MIB,
        policy: str = "static",
        round_token_budget: int = DEFAULT_ROUND_TOKENS,
        kv_budget_tokens: int | None = None,
    ):
        """The KV budget is `kv_budget_mib` of memory, or `kv_budget_tokens` positions (one token's keys and
        values in every layer) when that is given."""
        if policy not in POLICIES:
            raise RequestError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if (
            not isinstance(kv_budget_mib, (int, float, np.number)) or not 0 < kv_budget_mib < 2**40
        ):  # inf refused
            raise RequestError(
                f"the KV budget must be a positive number of MiB below 2**40, got {kv_budget_mib!r}"
            )
        self.batch_size = require_at_least_one(batch_size, "batch size")
        self.round_token_budget = require_at_least_one(round_token_budget, "the round token budget")
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        c = model.config
        self.kv_bytes_per_position = KVCache.bytes_needed(
            c.n_layer, c.n_head, c.head_dim, 1, 1, model.dtype
        )
        self.kv_budget_positions = (
            int(kv_budget_mib * 2**20) // self.kv_bytes_per_position
            if kv_budget_tokens is None
            else require_at_least_one(kv_budget_tokens, "the KV budget in tokens")
        )
        self.eos_token_id, self.bos_token_id = (
            (tokenizer.eos_token_id, tokenizer.bos_token_id)
            if tokenizer
            else special_ids(c.eos_token_id, c.bos_token_id, c.vocab_size)
        )
        self.kv_cache: KVCache | None = (
            None  # the running group's (or the continuous pool's) KV buffers
        )
        self.run_start = 0.0  # when the running serve() started: requests' times count from it
        self.free_slots: list[int] = []  # slots of that cache no running request holds

    # ------------------------------------------------------------------ making requests

    def make_request(
        self,
        index: int,
        prompt: str | Sequence[int] | None,
        params: SamplingParams,
        request_id=None,
        run_seed: int = 0,
        want_logprobs: bool = False,
        error: str | None = None,
        sample: int = 0,
        output_index: int = -1,
    ) -> Request:
        """A Request for one prompt (text or token ids).  A bad one, or one given an `error`, comes back refused."""
        request = Request(
            index=index,
            id=str(index if request_id is None else request_id),
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_ids=[],
            params=params,
            want_logprobs=want_logprobs or params.logprobs is not None,
            sample=sample,
            output_index=output_index,
        )
        try:
            if error is not None:  # already known to be bad (a bad line of a prompts file)
                raise RequestError(error)
            request.prompt_ids = self.prompt_ids(prompt)
            if params.stop and self.tokenizer is None:
                raise RequestError(
                    "stop strings need a tokenizer, and this model has none; use stop_token_ids"
                )
            check_token_ids(params.stop_token_ids, self.model.config.vocab_size, "stop")
            check_token_ids(
                [token for token, _ in params.logit_bias],
                self.model.config.vocab_size,
                "logit_bias",
            )
        except (RequestError, InputError) as exc:
            fail_request(request, str(exc))
            return request
        seed = params.seed if params.seed is not None else derived_seed(run_seed, index)
        request.rng = request_rng(sample_seed(seed, sample))
        return request

    def prompt_ids(self, prompt) -> list[int]:
        """What the model is fed first: the encoded text or the checked ids; BOS alone for an empty prompt."""
        c = self.model.config
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer, so prompts must be token-id lists")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = check_token_ids(prompt, c.vocab_size, "prompt")
        if not ids:  # an empty prompt starts from the beginning-of-text token
            if self.bos_token_id is None:
                raise RequestError(
                    "the prompt is empty and the model has no BOS/EOS token to start from"
                )
            ids = [self.bos_token_id]
        if len(ids) > c.n_positions:
            raise RequestError(
                f"the prompt has {len(ids)} tokens, more than the model's context of "
                f"{c.n_positions}; shorten it"
            )
        return ids

    # ------------------------------------------------------------------ the loop

    def serve(
        self,
        requests: list[Request],
        on_final: Callable[[Request], None] | None = None,
        on_round: Callable[[RunStats], None] | None = None,
        on_group_end: Callable[[GroupRecord, list[Request]], None] | None = None,
        on_token: Callable[[Request], None] | None = None,
    ) -> RunStats:
        """Serve every waiting request.  on_token(request) runs as each token is appended, on_final(request) as
        each record becomes final, on_round(stats) after every round, on_group_end(group, waiting) after each
        static group."""

        def ignore(*args) -> None:  # the callback for events nobody asked to hear about
            pass

        on_final, on_round, on_group_end = (
            on_final or ignore,
            on_round or ignore,
            on_group_end or ignore,
        )
        on_token = on_token or ignore
        scheduler = SCHEDULERS[self.policy](
            self.batch_size,
            self.kv_budget_positions,
            self.model.config.n_positions,
            self.round_token_budget,
        )
        stats = RunStats(
            batch_size=self.batch_size,
            policy=self.policy,
            requests=len(requests),
            groups=scheduler.groups,
            active_rows_per_round=scheduler.active_rows,
            held_rows_per_round=scheduler.held_rows,
        )  # these grow as it runs
        start = self.run_start = time.perf_counter()
        for request in requests:
            request.arrival_s = 0.0  # an offline run: every request is there when it starts
        for request in self.submit_or_refuse(
            requests, scheduler
        ):  # these never run: their records are final now
            request.finish_s = time.perf_counter() - start
            on_final(request)
        try:
            round_number = 0
            while scheduler.has_work():
                round_number += 1
                plan = scheduler.plan(
                    round_number
                )  # choose members (static: once the last group is released)
                self.admit(plan, stats)  # each admitted member takes its own KV slot
                batch = self.prepare_batch_metadata(
                    plan.active
                )  # new tokens, positions, slots, keys held
                logits = self.model.forward(
                    batch, self.kv_cache
                )  # run the round: one forward pass, [B, V]
                new_tokens = self.apply_updates(
                    plan.active, logits, round_number, on_token
                )  # pick, append, stop
                ended_group = scheduler.complete(plan)  # finished rows leave the compute
                self.release_finished(
                    plan.active, on_final
                )  # ... free their slots, and their records are final
                stats.rounds, stats.generated_tokens = (
                    round_number,
                    stats.generated_tokens + new_tokens,
                )
                stats.first_token_seconds += [
                    r.first_token_s for r in plan.admitted if r.first_token_s is not None
                ]
                stats.wall_seconds = time.perf_counter() - start
                on_round(stats)
                if ended_group is not None:
                    self.release_group()  # only now may the next group start
                    on_group_end(ended_group, list(scheduler.waiting))
        finally:
            self.release_group()  # after an interrupt too: no KV cache outlives its run
        stats.failed = sum(1 for r in requests if r.error is not None)
        stats.wall_seconds = time.perf_counter() - start
        return stats

    @staticmethod
    def submit_or_refuse(requests: list[Request], scheduler: Scheduler) -> list[Request]:
        """Queue every runnable request; return those that will never run (already refused, or too big)."""
        refused = [r for r in requests if r.finished]
        for request in [r for r in requests if not r.finished]:
            if (
                request.status is not Status.WAITING
            ):  # half-served by an interrupted run: its slot is gone
                raise RequestError(
                    f"request {request.index} has already started running; make it anew to rerun it"
                )
            reason = scheduler.refusal(request)
            if reason is None:
                scheduler.submit(request)
            else:
                fail_request(request, reason)
                refused.append(request)
        return refused

    def admit(self, plan: RoundPlan, stats: RunStats) -> None:
        """A new group (or the continuous pool) gets its KV cache; each admitted request takes a slot of it."""
        if plan.new_kv is not None:
            rows, capacity = (
                plan.new_kv
            )  # one slot per row, each as long as the longest request needs
            self.kv_cache = self.model.new_kv_cache(n_slots=rows, capacity=capacity)
            self.free_slots = list(range(rows))
            if plan.kv_limited:
                stats.kv_limited_rows.append(rows)
        for request in plan.admitted:
            if (
                request.params.prompt_logprobs
            ):  # every prompt position's logits: one scoring pass of its own
                request.prompt_logprobs = prompt_logprobs(
                    self.model.logits([request.prompt_ids])[0], request.prompt_ids
                )
            request.slot = self.free_slots.pop(0)
            assert (
                self.kv_cache is not None
            )  # made with its group (or the pool), before any member is admitted
            self.kv_cache.reset_slot(
                request.slot
            )  # zeroed, so nothing of an earlier occupant can leak in
            request.decoder = self.tokenizer.stream() if self.tokenizer is not None else None
            request.text = "" if self.tokenizer is not None else None
        stats.prompt_tokens += sum(r.prompt_len for r in plan.admitted)

    def prepare_batch_metadata(self, active: list[Request]) -> Batch:
        """The batch for this round: each active member's new tokens, its slot and what the slot holds."""
        assert self.kv_cache is not None  # a round runs within its group's (or the pool's) cache
        slots = np.array([r.slot for r in active], dtype=np.int64)  # [B]
        new_tokens = [
            r.token_ids[-1:] or r.prompt_ids for r in active
        ]  # the whole prompt at prefill, then one
        return Batch(
            new_tokens, self.model.backend, slots=slots, past_lens=self.kv_cache.lengths[slots]
        )

    def apply_updates(
        self, active: list[Request], logits, round_number: int, on_token: Callable[[Request], None]
    ) -> int:
        """Each active member picks its token from its own logits row, appends it, and checks its own stops;
        on_token hears of it.  Returns how many tokens were added (a member whose logits are not finite fails)."""
        n_positions, added = self.model.config.n_positions, 0
        for request, (token, logprob, top) in zip(
            active, choose_tokens(self.model.backend, logits, active), strict=True
        ):
            if token is None:  # its own failure: the peers' rows are untouched and go on
                fail_request(
                    request,
                    f"the model's logits for its token {len(request.token_ids) + 1} are not finite "
                    "(NaN or inf): its weights hold NaN/inf, or float16 overflowed (try float32)",
                    round_number,
                )
            else:
                add_token(
                    request, token, logprob, round_number, self.eos_token_id, n_positions, top
                )
                if len(request.token_ids) == 1:
                    request.first_token_s = time.perf_counter() - self.run_start
                on_token(request)
                added += 1
        return added

    def release_finished(self, active: list[Request], on_final: Callable[[Request], None]) -> None:
        """A member that finished this round keeps its status and record, and frees its slot; on_final gets it."""
        for request in (r for r in active if r.finished):
            assert request.slot is not None  # it ran, so it held a slot
            request.finish_s = time.perf_counter() - self.run_start
            self.free_slots = sorted(
                self.free_slots + [request.slot]
            )  # continuous: the next admission takes it
            on_final(request)

    def release_group(self) -> None:
        """The group is over: drop its KV cache before the next group allocates its own."""
        self.kv_cache, self.free_slots = None, []
