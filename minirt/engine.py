"""The serving loop: many requests, run in rounds that share each forward pass.

Owns: turning prompts into `Request`s (refusing bad ones with an error of
their own), and `Engine.serve`, which runs them under a scheduling policy
(minirt/scheduler.py).  Under the default, static groups, the loop reads:

    while requests wait:
        members = choose members (arrival order, up to batch_size, within the KV budget)
        give each member its own KV slot in a cache allocated for this group
        until every member has finished:
            prepare the batch metadata   (each active member's new tokens, slot, kv_len)
            run the round                (one forward pass of the active members)
            apply the updates            (each member samples, appends, checks its own stops)
            keep each finished member's status (it leaves the compute, its record is final)
        release the group                (only now may the next group start)

Under `continuous`, the scheduler instead frees a finished member's row at
once and admits waiting requests into free rows at every round; the rest
of the loop is the same.

Rounds are numbered across the whole run.  A request's first round is its
prefill and gives it its first token; a request that produces L tokens is
active in L consecutive rounds.  A finished request costs no compute in later
rounds and never stops or alters the others.

Must not know: the layers' arithmetic, files, command-line flags or output formats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .batch import RoundInputs, prepare_round
from .kv_cache import KVCache
from .model import GPT2
from .request import Request
from .sampling import GREEDY_BELOW, RequestError, SamplingParams, derived_seed, request_rng
from .scheduler import POLICIES, GroupRecord, RoundPlan, Scheduler
from .tokenizer import Tokenizer

DEFAULT_KV_BUDGET_MIB = 4096
DEFAULT_ROUND_TOKENS = 2048  # continuous batching: tokens one round may process (a prefill counts its prompt)


@dataclass
class RunStats:
    """Counts for the run summary.  Utilization = active row-rounds / (batch_size x rounds)."""

    batch_size: int
    policy: str = "static"
    requests: int = 0
    failed: int = 0
    rounds: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    wall_seconds: float = 0.0
    groups: list[GroupRecord] = field(default_factory=list)  # static groups (none under continuous)
    active_rows_per_round: list[int] = field(default_factory=list)

    @property
    def utilization(self) -> float:
        return sum(self.active_rows_per_round) / (self.batch_size * self.rounds) if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


class Engine:
    """Serves requests on one model, in static groups or with continuous batching."""

    def __init__(self, model: GPT2, tokenizer: Tokenizer | None, batch_size: int = 8,
                 kv_budget_mib: float = DEFAULT_KV_BUDGET_MIB, policy: str = "static",
                 round_token_budget: int = DEFAULT_ROUND_TOKENS):
        if policy not in POLICIES:
            raise RequestError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if round_token_budget < 1:
            raise RequestError(f"the round token budget must be at least 1, got {round_token_budget}")
        self.policy, self.round_token_budget = policy, round_token_budget
        if batch_size < 1:
            raise RequestError(f"batch size must be at least 1, got {batch_size}")
        if kv_budget_mib <= 0:
            raise RequestError(f"the KV budget must be positive, got {kv_budget_mib} MiB")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = batch_size
        self.kv_budget_bytes = int(kv_budget_mib * 2**20)
        c = model.config
        self.kv_bytes_per_position = KVCache.bytes_needed(c.n_layer, c.n_head, c.head_dim, 1, 1, model.dtype)
        vocab_eos = tokenizer.eos_token_id if tokenizer is not None else c.eos_token_id
        self.eos_token_id = vocab_eos if vocab_eos is not None and vocab_eos < c.vocab_size else None
        vocab_bos = tokenizer.bos_token_id if tokenizer is not None else c.bos_token_id
        self.bos_token_id = vocab_bos if vocab_bos is not None and vocab_bos < c.vocab_size else self.eos_token_id

    # ------------------------------------------------------------------ making requests

    def make_request(self, index: int, prompt: str | Sequence[int], params: SamplingParams, request_id=None,
                     run_seed: int = 0, want_logprobs: bool = False) -> Request:
        """A Request for one prompt (text or token ids).  A bad one comes back already refused."""
        text = prompt if isinstance(prompt, str) else None
        request = Request(index=index, id=str(index if request_id is None else request_id), prompt=text,
                          prompt_ids=[], params=params, want_logprobs=want_logprobs)
        try:
            request.prompt_ids = self._prompt_ids(prompt)
            self._check_params(params)
        except RequestError as exc:
            request.refuse(str(exc))
            return request
        seed = params.seed if params.seed is not None else derived_seed(run_seed, index)
        request.rng = request_rng(seed)
        return request

    def _prompt_ids(self, prompt) -> list[int]:
        c = self.model.config
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer, so prompts must be token-id lists")
            ids = self.tokenizer.encode(prompt)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise RequestError("a prompt must be text or a list of token ids") from None
            bad = [t for t in ids if not 0 <= t < c.vocab_size]
            if bad:
                raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})")
        if not ids:  # an empty prompt starts from the beginning-of-text token
            if self.bos_token_id is None:
                raise RequestError("the prompt is empty and the model has no BOS/EOS token to start from")
            ids = [self.bos_token_id]
        if len(ids) > c.n_positions:
            raise RequestError(
                f"the prompt has {len(ids)} tokens, more than the model's context of {c.n_positions}; shorten it"
            )
        return ids

    def _check_params(self, params: SamplingParams) -> None:
        if params.stop and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer, and this model has none; use stop_token_ids")
        bad = [t for t in params.stop_token_ids if t >= self.model.config.vocab_size]
        if bad:
            raise RequestError(f"stop token id {bad[0]} is outside the vocabulary [0, {self.model.config.vocab_size})")

    # ------------------------------------------------------------------ the loop

    @property
    def kv_budget_positions(self) -> int:
        """The KV budget counted in positions (one position = keys + values of every layer)."""
        return self.kv_budget_bytes // self.kv_bytes_per_position

    def serve(self, requests: list[Request], on_final: Callable[[Request], None] | None = None,
              on_round: Callable[[RunStats], None] | None = None,
              on_group_end: Callable[[GroupRecord, list[Request]], None] | None = None) -> RunStats:
        """Serve every waiting request; call on_final(request) as each record becomes final."""
        n_positions = self.model.config.n_positions
        scheduler = Scheduler(self.policy, self.batch_size, self.kv_budget_positions, n_positions,
                              self.round_token_budget)
        stats = RunStats(batch_size=self.batch_size, policy=self.policy, requests=len(requests))
        start = time.perf_counter()
        refused = [r for r in requests if r.finished] + scheduler.submit(requests)  # never to run
        for request in refused:
            if on_final:
                on_final(request)
        cache = None
        if self.policy == "continuous" and scheduler.waiting:  # one pool of rows for the whole run, within the budget
            cache = self.model.new_kv_cache(n_slots=scheduler.max_rows,
                                            capacity=max(scheduler.need(r) for r in scheduler.waiting))
        round_number = 0
        while scheduler.has_work():
            round_number += 1
            plan = scheduler.plan(round_number)  # static: a new group only when the last one is released
            if plan.new_group is not None:
                cache = self.allocate_group_kv(plan.new_group)
            for request in plan.admitted:
                request.attach(cache, self.tokenizer)
            stats.prompt_tokens += sum(r.prompt_len for r in plan.admitted)

            metadata = self.prepare_batch_metadata(plan.active, cache)  # new tokens, positions, slots, kv lengths
            greedy, outputs = self.execute_round(plan.active, metadata, cache)  # one forward pass
            self.apply_updates(plan.active, greedy, outputs, round_number)  # each samples, appends, checks its stops
            ended_group = scheduler.complete(plan)  # finished rows leave; continuous frees them at once
            self.keep_finished(plan, on_final)

            stats.rounds, stats.generated_tokens = round_number, stats.generated_tokens + len(plan.active)
            stats.wall_seconds = time.perf_counter() - start
            if on_round:
                on_round(stats)
            if ended_group is not None:
                self.release_group(ended_group.members)
                cache = None  # drop the group's KV buffers before the next group allocates its own
                if on_group_end:
                    on_group_end(ended_group, list(scheduler.waiting))
        stats.groups, stats.active_rows_per_round = scheduler.groups, scheduler.active_rows
        stats.failed = sum(1 for r in requests if r.error is not None)
        stats.wall_seconds = time.perf_counter() - start
        return stats

    def allocate_group_kv(self, group: GroupRecord) -> KVCache:
        """A static group's KV cache: one slot per member, each long enough for the longest member."""
        n_positions = self.model.config.n_positions
        capacity = max(r.kv_capacity_needed(n_positions) for r in group.members)
        return self.model.new_kv_cache(n_slots=len(group.members), capacity=capacity)

    @staticmethod
    def prepare_batch_metadata(active: list[Request], cache: KVCache) -> RoundInputs:
        """The padded batch for this round: each active member's new tokens, its slot and what the slot holds."""
        slots = np.array([r.slot for r in active], dtype=np.int64)  # [B]
        return prepare_round([r.next_input() for r in active], slots=slots, past_lens=cache.lengths[slots])

    def execute_round(self, active: list[Request], metadata: RoundInputs, cache: KVCache) -> tuple[bool, np.ndarray]:
        """One forward pass.  Returns (True, token ids [B]) when every row is greedy and wants no
        logprobs (the argmax runs on the backend and only B ids come back), else (False, logits [B, V])."""
        if all(r.params.temperature < GREEDY_BELOW and not r.want_logprobs for r in active):
            return True, self.model.greedy_next_tokens(metadata, cache)  # [B] int64
        return False, self.model.next_token_logits(metadata, cache)  # [B, V] fp32, host

    def apply_updates(self, active: list[Request], greedy: bool, outputs: np.ndarray, round_number: int) -> None:
        """Each active member takes its token (or picks it from its own logits row) and checks its own stops."""
        n_positions = self.model.config.n_positions
        for request, row in zip(active, outputs):
            if greedy:
                request.append_token(int(row), None, round_number, self.eos_token_id, n_positions)
            else:
                request.take_step(row, round_number, self.eos_token_id, n_positions)

    def keep_finished(self, plan: RoundPlan, on_final) -> None:
        """A member that finished this round keeps its status and record; it is not run again."""
        for request in plan.active:
            if request.finished:
                if self.policy == "continuous":
                    request.release()  # its row goes to the next admitted request
                if on_final:
                    on_final(request)

    @staticmethod
    def release_group(members: list[Request]) -> None:
        """The group is over: members let go of its KV cache, and the next group may start."""
        for request in members:
            request.release()
