"""What a generate run shows of each request: its completion and its JSONL record, in input order.

Owns:
  * `record`: a finished request as the JSON object --output writes;
  * `completion_block`: a finished request as standard output shows it;
  * `OrderedOutput`: records leave in input order, each as soon as it and every earlier one are
    final, to standard output and to the JSONL file, flushed at once so an interrupted run keeps
    what is done; a closed or failing standard output (`| head`, a full disk) stops the run unless
    --output still wants records; with `stream`, the request whose turn it is shows its text as its
    tokens come.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import IO, Callable, ContextManager

from .output_file import OutputFile
from .plural import plural
from .stdout import mute_stdout, stdout_error
from ..engine.output import json_logprob, prompt_text
from ..engine.request import Request, unshown_text
from ..errors import OutputError
from ..loading.tokenizer import Tokenizer


def request_label(request: Request) -> str:
    """'[3]' for a request without an id of its own, '[3] my-id' otherwise."""
    if request.id == str(request.index):
        label = f"[{request.index}]"
    else:
        label = f"[{request.index}] {request.id}"
    if request.params.n == 1:
        return label
    return f"{label} sample {request.sample}"


def record(request: Request, tokenizer: Tokenizer | None = None) -> dict:
    """The JSON-ready record of a finished request (one line of --output): its prompt's index and
    id, its completion's fields (`CompletionOutput`'s, and `prompt_tokens`: None for a refused
    request), `sample` only when the prompt asked for n > 1, `prompt_token_ids` only for a prompt
    given as token ids; logprobs only when asked for, rounded to 6 places, a -inf (a token the
    raw model gave probability 0) as null, as strict JSON needs."""
    assert request.finish_reason is not None, "only a finished request has a record"
    if request.error is None:
        prompt_tokens = len(request.prompt_ids)
    else:
        prompt_tokens = None
    timing_fields = (
        ("arrival_s", request.arrival_s),
        ("first_token_s", request.first_token_s),
        ("finish_s", request.finish_s),
    )
    timing = {name: None if value is None else round(value, 6) for name, value in timing_fields}
    out: dict = {
        "index": request.index,
        "id": request.id,
        "prompt": prompt_text(request, tokenizer),
        "text": request.text,
        "token_ids": list(request.token_ids),
        "finish_reason": request.finish_reason,
        "group": request.group,
        "rounds_waited": request.rounds_waited,
        "first_round": request.first_round,
        "finish_round": request.finish_round,
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": request.cached_prompt_tokens,
        "error": request.error,
        **timing,
    }
    # One record per sample, each with the prompt's index and id.
    if request.params.n > 1:
        out["sample"] = request.sample
    if request.prompt is None:
        out["prompt_token_ids"] = list(request.prompt_ids)
    if request.want_logprobs:
        out["logprobs"] = [json_logprob(lp) for lp in request.logprobs]
    if request.params.logprobs:
        out["top_logprobs"] = [
            [[token, json_logprob(lp)] for token, lp in step] for step in request.top_logprobs
        ]
    if request.prompt_logprobs is not None:
        out["prompt_logprobs"] = [
            None if lp is None else json_logprob(lp) for lp in request.prompt_logprobs
        ]
    return out


def block_header(request: Request) -> str:
    """'### [3]: length, 12 new tokens, group 1, rounds 1-12', or '### [3]: error: why'."""
    if request.error is not None:
        return f"### {request_label(request)}: error: {request.error}"
    # No groups under continuous batching.
    if request.group is None:
        group = ""
    else:
        group = f"group {request.group}, "
    new_tokens = plural(len(request.token_ids), "new token")
    return (
        f"### {request_label(request)}: {request.finish_reason}, {new_tokens}, "
        f"{group}rounds {request.first_round}-{request.finish_round}"
    )


def shown_prompt(request: Request, tokenizer: Tokenizer | None) -> str:
    """The prompt as a completion follows it: its text, or its ids and an arrow when it has no
    text."""
    prompt = prompt_text(request, tokenizer)
    # A token-id prompt, and no tokenizer given.
    if prompt is None:
        return f"{request.prompt_ids} -> "
    return prompt


def completion_block(
    request: Request, color: bool = False, tokenizer: Tokenizer | None = None
) -> str:
    """One request, readably: a header line, then the prompt and its completion (bold on a
    terminal)."""
    if request.error is not None:
        return block_header(request) + "\n"
    # No tokenizer: show ids.
    if request.text is None:
        return f"{block_header(request)}\n{request.prompt_ids} -> {request.token_ids}\n"
    prompt = shown_prompt(request, tokenizer)
    return f"{block_header(request)}\n{prompt}{bold(request.text, color)}\n"


def bold(text: str, color: bool) -> str:
    if color and text:
        return f"\033[1m{text}\033[0m"
    return text


class OrderedOutput:
    """Emits finished requests in input order, the moment the order allows: each completion to
    standard output, then its record to --output.  Only the record is written within `hold` (a
    signal waits until it is whole); standard output never is, so that Ctrl-C and SIGTERM are not
    held off by a reader that does not read.

    With `stream`, the request whose turn it is shows its text as its tokens come (`token`), between
    a '### [i]: streaming' line and its usual header line; the others wait for their turn, as
    without it.  `before_write` is called before each write to standard output (a progress bar on
    the same screen clears its line)."""

    def __init__(
        self,
        total: int,
        stdout: IO | None,
        jsonl: OutputFile | None,
        color: bool = False,
        hold: Callable[[], ContextManager] = nullcontext,
        tokenizer: Tokenizer | None = None,
        stream: bool = False,
        before_write: Callable[[], None] | None = None,
    ):
        self.total = total
        self.color = color
        self.hold = hold
        # For prompts given as token ids.
        self.tokenizer = tokenizer
        self.stdout = stdout
        self.jsonl = jsonl
        self.before_write = before_write
        # Final, and not yet written to --output.
        self.ready: dict[int, Request] = {}
        self.next_index = 0
        self.done = 0
        # Completions that reached standard output, and the index of the last of them.
        self.shown = 0
        self.last_shown = -1
        # Still True after a signal cut a completion short.
        self.showing = False
        # Why standard output was given up, the run going on.
        self.stdout_failure: OutputError | None = None
        self.stream = stream
        # The index of the request whose text is being streamed.
        self.streaming = -1

    def token(self, request: Request) -> None:
        """A token was added: if the request's turn has come, its new final text goes to standard
        output now."""
        if (
            not self.stream
            or self.stdout is None
            or request.output_index != self.next_index
            or request.text is None
        ):
            return
        if self.streaming == request.output_index:
            start = ""
        else:
            prompt = shown_prompt(request, self.tokenizer)
            start = f"### {request_label(request)}: streaming\n{prompt}"
        self.streaming = request.output_index
        self._write(start + bold(unshown_text(request), self.color))

    def final(self, request: Request) -> None:
        self.ready[request.output_index] = request
        self.done += 1
        while self.next_index in self.ready:
            request = self.ready[self.next_index]
            if self.stdout is not None:
                self._show(request)
            # The record, and then the note that it is written.
            with self.hold():
                self._write_record(request)
                del self.ready[self.next_index]
                self.next_index += 1

    def flush_out_of_order(self, finished: list[Request]) -> None:
        """After an interruption: write every finished request not written yet (those it kept from
        `final` too), even if an earlier one never finished: the records, then the completions not
        shown yet, unless the interruption cut one short (its reader may not be reading) or a second
        one comes meanwhile."""
        for request in finished:
            if request.output_index >= self.next_index and request.output_index not in self.ready:
                self.ready[request.output_index] = request
                self.done += 1
        pending = [self.ready.pop(index) for index in sorted(self.ready)]
        if self.showing:
            self._drop_stdout()
        try:
            with self.hold():
                for request in pending:
                    self._write_record(request)
            # A stream was cut short: end its line.
            if self.streaming == self.next_index and self.stdout is not None:
                self._write("\n")
            for request in pending:
                if self.stdout is not None and request.output_index > self.last_shown:
                    self._show(request)
        except KeyboardInterrupt:
            # Every record is written: stop waiting for standard output's reader.
            self._drop_stdout()

    def _write_record(self, request: Request) -> None:
        if self.jsonl is not None:
            line = json.dumps(record(request, self.tokenizer), ensure_ascii=False, allow_nan=False)
            self.jsonl.write(line + "\n")

    def _show(self, request: Request) -> None:
        """A completion on standard output (the rest of it, if it was streamed)."""
        if self.streaming == request.output_index:
            # Its text so far is out: the rest, then its header line.
            rest = bold(unshown_text(request), self.color)
            text = rest + "\n" + block_header(request) + "\n\n"
        else:
            text = completion_block(request, self.color, self.tokenizer) + "\n"
        if self._write(text):
            self.shown += 1
            self.last_shown = request.output_index

    def _write(self, text: str) -> bool:
        """Write to standard output; False if that failed (its reader has gone, a full disk):
        standard output is then given up, and the run stops unless --output still wants records."""
        self.showing = True
        # Only called while standard output is still wanted.
        assert self.stdout is not None
        if self.before_write is not None:
            self.before_write()
        try:
            self.stdout.write(text)
            self.stdout.flush()
        except OSError as exc:
            self._drop_stdout()
            told = f"after {self.shown} of {self.total} completions reached it"
            if self.jsonl is None:
                raise stdout_error(
                    exc,
                    f"{told}; stopped (with --output FILE the run goes on and keeps every record)",
                ) from None
            self.stdout_failure = stdout_error(
                exc, f"{told}; the run went on and --output {self.jsonl.path} holds every record"
            )
        self.showing = False
        return self.stdout is not None

    def _drop_stdout(self) -> None:
        """Write nothing more to standard output, and send what is still buffered for it nowhere."""
        if self.stdout is not None:
            self.stdout = None
            mute_stdout()
