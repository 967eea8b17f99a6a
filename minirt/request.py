"""One request's own state, from arrival to its finished record.

Owns: `Request`: its identity (input index, id), its prompt ids and sampling
parameters, its own random stream, its output ids and text, its KV slot and
length, its status and finish reason, and its round bookkeeping (group,
rounds waited, first round, finish round).  Also the per-request stop checks
that run after every token: EOS, stop token ids, stop strings (found in the
decoded text even when they span tokens), max_new_tokens and a full context.

Nothing here is shared between requests: a batch shares a forward pass, never
a request's progress or its reason to stop.

Must not know: the layers, the batch layout, or how requests are grouped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .kv_cache import KVCache
from .sampling import SamplingParams, choose_token
from .tokenizer import StreamDecoder, Tokenizer


class Status(enum.Enum):
    WAITING = "waiting"  # in the queue, no KV slot yet
    RUNNING = "running"  # a member of the current group, producing tokens
    FINISHED = "finished"  # done (or refused with an error); its record is final


@dataclass
class Request:
    """A request and everything that is its own."""

    index: int  # position in the input, 0-based; output order follows it
    id: str  # the user's id, or the index as a string
    prompt: str | None  # the prompt text (None when given as token ids)
    prompt_ids: list[int]  # what the model is fed first (BOS alone for an empty prompt)
    params: SamplingParams
    rng: np.random.Generator | None = None  # the request's own random stream
    want_logprobs: bool = False

    token_ids: list[int] = field(default_factory=list)  # every token produced, in order
    logprobs: list[float] = field(default_factory=list)  # log p(token) under the raw model, if wanted
    text: str | None = None  # the completion text (cut before a stop string); None without a tokenizer
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop", "length", or "error"
    error: str | None = None  # why the request was refused, in one line

    group: int | None = None  # which static group served it (1-based)
    slot: int | None = None  # its KV slot in that group's cache
    kv_cache: KVCache | None = field(default=None, repr=False)
    first_round: int | None = None  # the round that produced its first token (its prefill)
    finish_round: int | None = None  # the round that produced its last token
    rounds_waited: int | None = None  # rounds that ran before its first round

    _decoder: StreamDecoder | None = field(default=None, repr=False)
    _decoded: str = field(default="", repr=False)  # all text so far, before stop-string cutting

    # ------------------------------------------------------------------ state

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def kv_len(self) -> int:
        """Keys and values this request holds in its slot (0 before it runs and after it is released)."""
        return 0 if self.kv_cache is None else int(self.kv_cache.lengths[self.slot])

    def kv_capacity_needed(self, n_positions: int) -> int:
        """Positions its KV slot must hold: the prompt plus every output token but the last."""
        return min(max(self.prompt_len + self.params.max_new_tokens - 1, self.prompt_len), n_positions)

    def refuse(self, message: str) -> None:
        """Finish without running: the request gets an error of its own."""
        self.status, self.finish_reason, self.error = Status.FINISHED, "error", message

    def admit(self, group: int | None, slot: int, first_round: int) -> None:
        """The scheduler lets it in: it owns a row (slot) from this round on.  `group` is None under continuous batching."""
        self.status, self.group, self.slot = Status.RUNNING, group, slot
        self.first_round, self.rounds_waited = first_round, first_round - 1

    def attach(self, cache: KVCache | None, tokenizer: Tokenizer | None) -> None:
        """The engine gives it its KV slot's storage and a text decoder (a simulation attaches none)."""
        self.kv_cache = cache
        if cache is not None:
            cache.reset_slot(self.slot)
        self._decoder = tokenizer.stream() if tokenizer is not None else None
        self.text = "" if tokenizer is not None else None

    def next_input(self) -> list[int]:
        """What this request feeds the next round: the whole prompt at prefill, then its last token."""
        return list(self.prompt_ids) if not self.token_ids else [self.token_ids[-1]]

    def release(self) -> None:
        """Let go of the group's KV cache (the record keeps everything else)."""
        self.kv_cache = None

    # ------------------------------------------------------------------ one step

    def take_step(self, logits: np.ndarray, round_number: int, eos_token_id: int | None, n_positions: int) -> None:
        """Choose this round's token from its logits [V], append it, and check every stop condition."""
        token, logprob = choose_token(logits, self.params, self.rng, want_logprob=self.want_logprobs)
        self.append_token(token, logprob, round_number, eos_token_id, n_positions)

    def append_token(self, token: int, logprob: float | None, round_number: int, eos_token_id: int | None,
                     n_positions: int) -> None:
        """Append a chosen token and check every stop condition (the engine's greedy fast path enters here)."""
        self.token_ids.append(token)
        if self.want_logprobs and logprob is not None:
            self.logprobs.append(logprob)

        is_eos = token == eos_token_id and not self.params.ignore_eos
        is_stop_token = token in self.params.stop_token_ids
        if is_eos or is_stop_token:
            self.finish("stop", round_number)  # the token is kept in token_ids, its text is not added
            return
        if self._decoder is not None:
            new_text = self._decoder.push(token)
            if self._found_stop_string(new_text):
                self.finish("stop", round_number, text_was_cut=True)
                return
        if len(self.token_ids) >= self.params.max_new_tokens:
            self.finish("length", round_number)
        elif self.prompt_len + len(self.token_ids) >= n_positions:
            self.finish("length", round_number)  # prompt + output fill the context (Hugging Face's max_length)

    def _found_stop_string(self, new_text: str) -> bool:
        """Add new text; if a stop string now appears, cut the text just before it."""
        before = len(self._decoded)
        self._decoded += new_text
        if not self.params.stop or not new_text:
            self.text = self._decoded
            return False
        longest = max(len(s) for s in self.params.stop)
        search_from = max(0, before - longest + 1)  # a stop string may straddle old and new text
        hits = [pos for s in self.params.stop if (pos := self._decoded.find(s, search_from)) != -1]
        if hits:
            self.text = self._decoded[: min(hits)]
            return True
        self.text = self._decoded
        return False

    def finish(self, reason: str, round_number: int, text_was_cut: bool = False) -> None:
        self.status, self.finish_reason, self.finish_round = Status.FINISHED, reason, round_number
        if self._decoder is not None and not text_was_cut:
            self._decoded += self._decoder.flush()  # an unfinished character becomes U+FFFD
            self.text = self._decoded
        self._decoder = None

    # ------------------------------------------------------------------ the record

    def record(self) -> dict:
        """The JSON-ready record of a finished request."""
        out = {
            "index": self.index, "id": self.id, "prompt": self.prompt, "text": self.text,
            "token_ids": list(self.token_ids), "finish_reason": self.finish_reason,
            "group": self.group, "rounds_waited": self.rounds_waited,
            "first_round": self.first_round, "finish_round": self.finish_round,
            "prompt_tokens": self.prompt_len if self.error is None else None,
            "error": self.error,
        }
        if self.want_logprobs:
            out["logprobs"] = [round(lp, 6) for lp in self.logprobs]
        return out
