"""The Python API, shaped like vLLM's: `LLM(model).generate(prompts, SamplingParams(...))`.

Owns: loading a model with its tokenizer and generation defaults (the one place that does), and
the calls that serve prompts (in static groups, or with continuous batching) and return their
outputs in input order.

    from minirt import LLM, SamplingParams

    # The model shipped with minirt.  LLM("gpt2") needs a gpt2 checkpoint in the local Hugging
    # Face cache; LLM(policy="continuous") refills rows every round.
    llm = LLM()
    params = SamplingParams(max_new_tokens=20)
    for out in llm.generate(["Hello, my name is", "The sky is"], params):
        print(out.text, out.finish_reason, out.first_round, out.finish_round)

    # Streaming: on_token hears of every token as it is produced, with its text once final.
    def show(event):
        print(event.text, end="", flush=True)

    llm.generate(["To be, or not to be"], on_token=show)

`generate(prompts)` with no params uses the model's generation defaults (its folder's
generation_config.json, as the command line does); an explicit `SamplingParams()` is greedy with
64 new tokens.  `generate` is the loop over `Engine.step()` (minirt/engine/engine.py), one round
a step, written out here in `run_steps` (nano-vllm's `generate`): every request added, then a
step while any is unfinished, each step's new tokens and final records handed out as they come.

Each output is a `RequestOutput` (minirt/engine/output.py: `.text`, `.token_ids`,
`.finish_reason`, `.error`, `.first_round`, ...).  Callers that report as they go (the command
line) use `make_request` and `steps`, the same loop, which yields each step's `StepOutput` with
the runtime's own `Request` records.

Must not know: command-line flags or file formats.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .engine.client import EngineClient
from .engine.engine import DEFAULT_KV_BUDGET_MIB, DEFAULT_ROUND_TOKENS, Engine, StepOutput
from .engine.output import RequestOutput, TokenEvent
from .engine.params import SamplingParams
from .engine.runner import ModelRunner
from .engine.request import Request
from .engine.stats import RunStats
from .errors import CheckpointError, RequestError
from .loading.checkpoint import Checkpoint, load_checkpoint, shipped_model_folder
from .loading.json_file import broken_link, read_json_file
from .loading.tokenizer import load_tokenizer
from .model.backend import get_backend, resolve_dtype
from .model.interface import Model
from .model.registry import build_model
from .request_maker import RequestMaker


def load_model(
    model: str | Path | Checkpoint, backend: str = "auto", dtype: str = "float32"
) -> Model:
    """Load a checkpoint (a folder, a hub id in the local cache, or a loaded Checkpoint) onto a
    backend, as the model class its config.json's model_type names
    (minirt/model/registry.py)."""
    chosen, _note = get_backend(backend)
    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    return build_model(checkpoint, chosen, resolve_dtype(dtype))


def generation_defaults(folder: Path) -> SamplingParams:
    """Sampling defaults from a folder's generation_config.json, read as Hugging Face does
    (do_sample absent or false: greedy; true: its temperature, top_k and top_p, each defaulting
    to 1.0, 50 and 1.0).  A file that is not JSON, or a value minirt cannot use, is refused in
    one line naming the file."""
    path = Path(folder) / "generation_config.json"
    # A link to nothing (or a loop) is a broken file, not an absent one.
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(f"{link_problem}; fix the link, or remove it")
    try:
        raw = read_json_file(path) if path.exists() else {}
        if not isinstance(raw, dict) or not isinstance(raw.get("do_sample"), (bool, type(None))):
            raise RequestError("expected a JSON object whose do_sample is true or false")
        read = {
            name: raw[name]
            for name in ("temperature", "top_k", "top_p", "max_new_tokens")
            if raw.get(name) is not None
        }
        # Every value the file gives is checked, even one that greedy decoding ignores.
        SamplingParams(**read)
        if raw.get("do_sample") is True:
            return SamplingParams(**{"temperature": 1.0, "top_k": 50, **read})
        return SamplingParams(**{**read, "temperature": 0.0})
    # RequestError is a ValueError, and so are JSON's.
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: {exc}; fix or remove the file") from None


def check_prompts(prompts) -> list:
    """The prompts as a list, each a string or a sequence of integer token ids; else a TypeError
    naming it."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(
            f"prompts must be a string or a list of prompts, got {type(prompts).__name__}"
        )
    for i, prompt in enumerate(prompts):
        is_ids = isinstance(prompt, (list, tuple, np.ndarray)) and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt
        )
        if isinstance(prompt, str) or is_ids:
            continue
        if isinstance(prompt, (list, tuple)):
            shown = "a list holding non-integers"
        else:
            shown = type(prompt).__name__
        if isinstance(prompt, int):
            hint = "; wrap one token-id prompt in a list: [[1, 2, 3]]"
        else:
            hint = ""
        raise TypeError(
            f"prompts[{i}] must be a string or a list of integer token ids, got {shown}" + hint
        )
    return list(prompts)


class LLM:
    """A loaded model, its tokenizer, and an engine to serve prompts with (static groups by
    default)."""

    def __init__(
        self,
        model: str | Path | Checkpoint | None = None,
        backend: str = "auto",
        dtype: str = "float32",
        batch_size: int = 8,
        kv_budget_mib: float = DEFAULT_KV_BUDGET_MIB,
        seed: int = 0,
        policy: str = "static",
        round_token_budget: int = DEFAULT_ROUND_TOKENS,
        kv_budget_tokens: int | None = None,
        prefix_cache: bool = False,
        chunked_prefill: bool = True,
    ):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise RequestError(f"seed must be an integer >= 0, got {seed!r}")
        if model is None:
            # No model: the one shipped with minirt.
            model = shipped_model_folder()
        if not isinstance(model, (str, Path, Checkpoint)):
            raise TypeError(
                f"model must be a folder, a hub id or a Checkpoint, got {type(model).__name__}"
            )
        # The note says what "auto" chose, for the user.
        chosen, backend_note = get_backend(backend)
        self.backend_note = backend_note
        checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
        self.model = build_model(checkpoint, chosen, resolve_dtype(dtype))
        config = self.model.config
        # None when the folder has no tokenizer (token-id prompts still work); a broken or
        # mismatched one is refused.
        self.tokenizer = load_tokenizer(
            checkpoint.folder, config.eos_token_id, config.bos_token_id, config.vocab_size
        )
        self.defaults = generation_defaults(checkpoint.folder)
        # Text and parameters into requests of token ids (the engine never sees text going in).
        self.request_maker = RequestMaker.for_model(config, self.tokenizer, run_seed=seed)
        self.engine = Engine(
            ModelRunner(self.model),
            self.tokenizer,
            batch_size=batch_size,
            kv_budget_mib=kv_budget_mib,
            policy=policy,
            round_token_budget=round_token_budget,
            kv_budget_tokens=kv_budget_tokens,
            prefix_cache=prefix_cache,
            chunked_prefill=chunked_prefill,
        )
        self.last_stats: RunStats | None = None

    def make_request(
        self,
        index: int,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id=None,
        logprobs: bool = False,
        sample: int = 0,
        output_index: int = -1,
    ) -> Request:
        """One request (`RequestMaker.make`): refused at once, with its own error, when it is
        bad.  Without params, it takes the model's generation defaults."""
        return self.request_maker.make(
            index,
            prompt,
            params or self.defaults,
            request_id=request_id,
            want_logprobs=logprobs,
            sample=sample,
            output_index=output_index,
        )

    def make_requests(
        self,
        prompts,
        params: SamplingParams | Sequence[SamplingParams] | None,
        ids: Sequence | None,
        logprobs: bool,
    ) -> list[Request]:
        """The requests of `generate`'s arguments, checked: a prompt's n samples one after
        another, each with its `sample` number and its own place among the outputs."""
        prompts = check_prompts(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.defaults] * len(prompts)
        elif not isinstance(params, (list, tuple)) or not all(
            isinstance(p, SamplingParams) for p in params
        ):
            raise TypeError("params must be a SamplingParams or a list of them, one per prompt")
        if ids is None:
            ids = [None] * len(prompts)
        if not isinstance(ids, (list, tuple)) or not isinstance(logprobs, bool):
            raise TypeError("ids must be a list (one per prompt) and logprobs true or false")
        # zip would silently drop the extra prompts.
        if not len(params) == len(ids) == len(prompts):
            raise RequestError(
                f"got {len(prompts)} prompts, {len(params)} SamplingParams and {len(ids)} ids"
            )
        requests: list[Request] = []
        for i, (prompt, sp, rid) in enumerate(zip(prompts, params, ids, strict=True)):
            # n samples: n requests.
            first = len(requests)
            for k in range(sp.n):
                request = self.make_request(
                    i,
                    prompt,
                    sp,
                    request_id=rid,
                    logprobs=logprobs,
                    sample=k,
                    output_index=first + k,
                )
                requests.append(request)
        return requests

    def check_params(self, params: SamplingParams) -> None:
        """Refuse (a RequestError or InputError) what this model cannot take of `params`: token
        ids outside its vocabulary, stop strings when it has no tokenizer."""
        self.request_maker.check_params(params)

    def refusal(self, request: Request) -> str | None:
        """Why no round could ever take this request under this LLM's budgets (its KV budget,
        and under continuous batching its round token budget), or None when one could."""
        refusal = self.engine.scheduler.refusal(request)
        return None if refusal is None else refusal.message

    def engine_client(self, max_queue: int, **options) -> EngineClient:
        """The engine's serving thread (minirt/engine/client.py), not started: the one way a
        server reaches this LLM's engine.  `options`: EngineClient's (observer, on_round,
        on_shutdown, round_delay_s, batch_window_s)."""
        return EngineClient(self.engine, max_queue, **options)

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """What the model is fed first for a prompt: its ids, BOS alone when empty; a
        RequestError if bad."""
        return self.request_maker.prompt_ids(prompt)

    @contextmanager
    def steps(self, requests: list[Request]) -> Iterator[Iterator[StepOutput]]:
        """An offline run of requests made by `make_request`, as `with llm.steps(requests) as
        steps: for step in steps: ...`: `run_steps`, the loop over `Engine.step()`, each step's
        output in turn.  The engine is held until the `with` block ends, however it ends (a
        `break` too).  `last_stats` is the run's counts, live while it runs."""
        with run_steps(self.engine, requests, "LLM.steps") as steps:
            self.last_stats = self.engine.stats
            yield steps

    def run(self, requests: list[Request]) -> RunStats:
        """Serve requests made by `make_request` to the end (`steps`, with nothing reported on
        the way) and return the run's counts; each request's record is final in it."""
        with self.steps(requests) as steps:
            for _step in steps:
                pass
        assert self.last_stats is not None  # set when the run started
        return self.last_stats

    def generate(
        self,
        prompts,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        ids: Sequence | None = None,
        logprobs: bool = False,
        on_final: Callable[[RequestOutput], None] | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> list[RequestOutput]:
        """Serve the prompts (text, or token-id lists) and return their outputs in input order
        (a prompt's n samples one after another, each with its `sample` number).  This is the
        loop over `Engine.step()` (one round a step): `steps`, below.

        `params`: one SamplingParams for all, or one per prompt.  Without it, the model's
        generation defaults (its folder's generation_config.json, as the command line does); an
        explicit `SamplingParams()` is greedy with 64 new tokens.
        `ids`: one id per prompt (default: the index).  `logprobs`: record each token's
        log-probability.  `on_token(event)` runs as each token is produced, `on_final(output)`
        as each request finishes (in the order they finish); a request refused at once gets
        on_final only."""
        # Called from one of this run's own callbacks: refused, and the run goes on.
        self.engine.refuse_reentry("LLM.generate")
        requests = self.make_requests(prompts, params, ids, logprobs)
        with self.steps(requests) as steps:
            # One round a step: its new tokens, then the records it made final.
            for step in steps:
                for request in step.new_tokens:
                    if on_token is not None:
                        on_token(TokenEvent.from_request(request))
                for request in step.finished:
                    if on_final is not None:
                        on_final(RequestOutput.from_request(request, self.tokenizer))
        return [RequestOutput.from_request(r, self.tokenizer) for r in requests]


@contextmanager
def run_steps(engine: Engine, requests: list[Request], call: str) -> Iterator[Iterator[StepOutput]]:
    """One offline run of `requests` on `engine`, the loop over `step()`: every request added
    (all there at the start), then the steps, one round each, while any is unfinished (the
    caller iterates them).  The engine is held until the `with` block ends, however it ends
    (`Engine.offline_run`): a callback that starts another run or steps this one is refused
    (`call` names it), and the engine is ready for another run afterwards.  The run's counts
    are `engine.stats` while the block runs."""
    with engine.offline_run(requests, call) as final_at_once:
        yield each_step(engine, final_at_once)


def each_step(engine: Engine, final_at_once: list[Request]) -> Iterator[StepOutput]:
    """The steps of a run the caller holds: first a step of no round, listing the requests that
    became final on adding (perhaps none), then one `take_step()` a round while any request is
    unfinished; the run's wall time is set when the last is done."""
    yield StepOutput(round_number=None, finished=final_at_once)
    while engine.has_unfinished():
        yield engine.take_step()
    engine.stats.wall_seconds = engine.seconds()
