"""The Python API, shaped like vLLM's: `LLM(model).generate(prompts, SamplingParams(...))`.

Owns: loading a model with its tokenizer and generation defaults (the one place that does), and
the calls that serve prompts (in static groups, or with continuous batching) and return their
outputs in input order.

    from minirt import LLM, SamplingParams

    # The model shipped with minirt.  LLM("gpt2") needs a gpt2 checkpoint in the local Hugging
    # Face cache; LLM(policy="continuous") refills rows every round.
    llm = LLM()
    params = SamplingParams(temperature=0, max_tokens=20)
    for out in llm.generate(["Hello, my name is", "The sky is"], params):
        done = out.outputs[0]
        print(out.prompt, done.text, done.finish_reason, done.first_round, done.finish_round)

    # Streaming: on_token hears of every token as it is produced, with its text once final.
    def show(event):
        print(event.text, end="", flush=True)

    llm.generate(["To be, or not to be"], on_token=show)

`generate(prompts)` with no params uses the model's generation defaults (its folder's
generation_config.json, as the command line does; greedy and 16 tokens without one); an
explicit `SamplingParams()` is vLLM's: temperature 1, 16 tokens.  `generate` is the loop over
`Engine.step()` (minirt/engine/engine.py), one round a step, written out here in `run_steps`
(nano-vllm's `generate`): every request added, then a step while any is unfinished, each
step's new tokens and final records handed out as they come.

Each output is a `RequestOutput` (minirt/engine/output.py), vLLM's shape: `.prompt`,
`.prompt_token_ids`, and `.outputs`, the prompt's n `CompletionOutput`s (`.text`,
`.token_ids`, `.finish_reason`, `.error`, `.first_round`, ...).  Callers that report as they go
(the command line) use `make_request` and `steps`, the same loop, which yields each step's
`StepOutput` with the runtime's own `Request` records.

Must not know: command-line flags or file formats.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .chat_template import ChatTemplate, load_chat_template
from .engine.client import EngineClient
from .engine.engine import DEFAULT_KV_BUDGET_MIB, DEFAULT_ROUND_TOKENS, Engine, StepOutput
from .engine.output import RequestOutput, TokenEvent
from .engine.params import SamplingParams, is_int
from .engine.runner import ModelRunner
from .engine.request import Request
from .engine.stats import RunStats
from .errors import CheckpointError, RequestError
from .loading.checkpoint import Checkpoint, load_checkpoint, shipped_model_folder
from .loading.json_file import broken_link, read_json_file
from .loading.tokenizer import Tokenizer, load_tokenizer
from .model.backend import get_backend, resolve_dtype
from .model.interface import Model, ModelConfig
from .model.registry import build_model
from .request_maker import RequestMaker


def load_model(
    model: str | Path | Checkpoint,
    backend: str = "auto",
    dtype: str = "float32",
    batch_invariant: bool = False,
) -> Model:
    """Load a checkpoint (a folder, a hub id in the local cache, or a loaded Checkpoint) onto a
    backend, as the model class its config.json's model_type names
    (minirt/model/registry.py); `batch_invariant` as `LLM` takes it."""
    chosen, _note = get_backend(backend)
    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    return build_model(checkpoint, chosen, resolve_dtype(dtype), batch_invariant)


# What minirt reads of a generation_config.json, in its own names (max_new_tokens is max_tokens).
GENERATION_CONFIG_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
)


def generation_defaults(folder: Path) -> SamplingParams:
    """Sampling defaults from a folder's generation_config.json, read as Hugging Face does
    (do_sample absent or false: greedy; true: its temperature, top_k, top_p and min_p, the first
    three defaulting to 1.0, 50 and 1.0), its repetition_penalty either way (transformers applies
    it to greedy decoding too), and its max_new_tokens as max_tokens (absent: 16, vLLM's and
    OpenAI's).  A folder without the file is greedy with 16 tokens.  A file that is not JSON,
    or a value minirt cannot use, is refused in one line naming the file."""
    path = Path(folder) / "generation_config.json"
    # A link to nothing (or a loop) is a broken file, not an absent one.
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(f"{link_problem}; fix the link, or remove it")
    try:
        raw = read_json_file(path) if path.exists() else {}
        if not isinstance(raw, dict) or not isinstance(raw.get("do_sample"), (bool, type(None))):
            raise RequestError("expected a JSON object whose do_sample is true or false")
        read = {name: raw[name] for name in GENERATION_CONFIG_FIELDS if raw.get(name) is not None}
        # SamplingParams takes vLLM's -1 for "no top-k"; Hugging Face refuses it.
        if is_int(read.get("top_k")) and read["top_k"] < 0:
            raise RequestError(
                f"top_k must be an integer >= 0 (0 turns it off), got {read['top_k']}"
            )
        # Every value the file gives is checked, even one that greedy decoding ignores.
        SamplingParams(**read)
        if raw.get("do_sample") is True:
            return SamplingParams(**{"temperature": 1.0, "top_k": 50, **read})
        return SamplingParams(**{**read, "temperature": 0.0})
    # RequestError is a ValueError, and so are JSON's.
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: {exc}; fix or remove the file") from None


# vLLM's prompt dicts: {"prompt": text} and {"prompt_token_ids": [ids]}.
PROMPT_KEYS = ("prompt", "prompt_token_ids")


def check_prompts(prompts) -> list:
    """The prompts as a list, each a string or a sequence of integer token ids (vLLM's prompt
    dicts, {"prompt": text} and {"prompt_token_ids": ids}, unwrapped); else a TypeError naming
    the prompt."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(
            f"prompts must be a string or a list of prompts, got {type(prompts).__name__}"
        )
    checked = []
    for i, prompt in enumerate(prompts):
        prompt = unwrapped_prompt(i, prompt)
        is_ids = isinstance(prompt, (list, tuple, np.ndarray)) and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt
        )
        if isinstance(prompt, str) or is_ids:
            checked.append(prompt)
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
    return checked


def unwrapped_prompt(i: int, prompt):
    """A vLLM prompt dict's text or ids (any other prompt as it is); a dict with another key,
    or with both, or whose "prompt" is not text or whose "prompt_token_ids" is text, is a
    TypeError naming it (the ids themselves are checked with every token-id prompt's)."""
    if not isinstance(prompt, dict):
        return prompt
    keys = set(prompt)
    if len(keys) != 1 or not keys <= set(PROMPT_KEYS):
        shown = ", ".join(sorted(map(repr, keys))) or "no keys"
        raise TypeError(
            f"prompts[{i}] is a dict with {shown}; minirt takes vLLM's "
            '{"prompt": text} or {"prompt_token_ids": [ids]}'
        )
    (key,) = keys
    value = prompt[key]
    if key == "prompt" and not isinstance(value, str):
        raise TypeError(
            f'prompts[{i}]["prompt"] must be a string, got {type(value).__name__}; '
            'give token ids as {"prompt_token_ids": [ids]}'
        )
    if key == "prompt_token_ids" and isinstance(value, str):
        raise TypeError(
            f'prompts[{i}]["prompt_token_ids"] must be a list of token ids, got a string; '
            'give text as {"prompt": text}'
        )
    return value


# vLLM's LLM(...) options that minirt names otherwise: vLLM's name -> minirt's.
VLLM_OPTION_NAMES = {
    "max_num_seqs": "batch_size (with policy='continuous')",
    "enable_prefix_caching": "prefix_cache",
    "enable_chunked_prefill": "chunked_prefill",
    "max_num_batched_tokens": "round_token_budget",
}

# vLLM's LLM(...) options minirt has nothing for, and why.
VLLM_OPTIONS_WITHOUT_EQUIVALENT = {
    "tensor_parallel_size": "minirt runs a model on one device",
    "pipeline_parallel_size": "minirt runs a model on one device",
    "gpu_memory_utilization": "minirt sizes its KV cache by kv_budget_mib instead",
    "quantization": "minirt runs float32 or float16 weights only",
    "trust_remote_code": "minirt runs its own model code, never a checkpoint's",
    "tokenizer": "minirt reads the tokenizer in the model's folder",
    "max_model_len": "minirt uses the model's whole context (config.json)",
    "enforce_eager": "minirt has no graphs to capture",
}


def vllm_option_refusal(options: dict) -> str:
    """Why LLM(...) does not take these keyword arguments: for each, minirt's name for it, or
    why it has none (docs/api.md, "Coming from vLLM")."""
    reasons = []
    for name in options:
        if name in VLLM_OPTION_NAMES:
            reasons.append(f"{name}: minirt calls it {VLLM_OPTION_NAMES[name]}")
        elif name in VLLM_OPTIONS_WITHOUT_EQUIVALENT:
            reasons.append(f"{name}: {VLLM_OPTIONS_WITHOUT_EQUIVALENT[name]}")
        else:
            reasons.append(f"{name}: no such option")
    return "LLM() got options it does not take: " + "; ".join(reasons)


def checked_arguments(model, seed, vllm_options: dict) -> str | Path | Checkpoint:
    """The model LLM(...) loads (None: the one shipped with minirt), once its arguments pass: no
    option of vLLM's that minirt lacks, a seed >= 0, a model of a type it can load."""
    if vllm_options:
        raise TypeError(vllm_option_refusal(vllm_options))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise RequestError(f"seed must be an integer >= 0, got {seed!r}")
    if model is None:
        return shipped_model_folder()
    if not isinstance(model, (str, Path, Checkpoint)):
        raise TypeError(
            f"model must be a folder, a hub id or a Checkpoint, got {type(model).__name__}"
        )
    return model


def tokenizer_beside(folder: Path, config: ModelConfig) -> Tokenizer | None:
    """The tokenizer in a model's folder, told the config's special ids (every end id it names:
    Llama 3's several), or None when the folder has none."""
    return load_tokenizer(
        folder,
        config.eos_token_id,
        config.bos_token_id,
        config.vocab_size,
        eos_token_ids=config.eos_token_ids,
    )


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
        batch_invariant: bool = False,
        **vllm_options,
    ):
        model = checked_arguments(model, seed, vllm_options)
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant must be True or False, got {batch_invariant!r}")
        # The note says what "auto" chose, for the user.
        chosen, backend_note = get_backend(backend)
        self.backend_note = backend_note
        checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
        # Exact batch invariance probes the BLAS here, and refuses in one line if it cannot hold.
        self.model = build_model(checkpoint, chosen, resolve_dtype(dtype), batch_invariant)
        config = self.model.config
        # None when the folder has no tokenizer (token-id prompts still work); a broken or
        # mismatched one is refused.
        self.tokenizer = tokenizer_beside(checkpoint.folder, config)
        self.defaults = generation_defaults(checkpoint.folder)
        # The model's chat template (None without one), compiled once: `chat` renders with it.
        self.chat_template = load_chat_template(checkpoint.folder)
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
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        ids: Sequence | None = None,
    ) -> list[Request]:
        """The requests of `generate`'s arguments, checked: a prompt's n samples one after
        another, each with its `sample` number and its own place among the outputs."""
        prompts = check_prompts(prompts)
        params = sampling_params
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.defaults] * len(prompts)
        elif not isinstance(params, (list, tuple)) or not all(
            isinstance(p, SamplingParams) for p in params
        ):
            raise TypeError(
                "sampling_params must be a SamplingParams or a list of them, one per prompt"
            )
        if ids is None:
            ids = [None] * len(prompts)
        if not isinstance(ids, (list, tuple)):
            raise TypeError("ids must be a list, one per prompt")
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
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        ids: Sequence | None = None,
        on_final: Callable[[RequestOutput], None] | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> list[RequestOutput]:
        """Serve the prompts and return one `RequestOutput` per prompt, in input order, each
        holding its n completions (vLLM's `LLM.generate`).  This is the loop over
        `Engine.step()` (one round a step): `steps`, below.

        `prompts`: a prompt or a list; each a string, a list of token ids, or vLLM's
        {"prompt": text} or {"prompt_token_ids": ids}.
        `sampling_params`: one SamplingParams for all, or one per prompt.  Without it, the
        model's generation defaults (its folder's generation_config.json, as the command line
        does; greedy and 16 tokens without one).  An explicit `SamplingParams()` is vLLM's:
        temperature 1, 16 tokens.
        `ids`: one id per prompt (default: the index), its output's `request_id`.
        `on_token(event)` runs as each token is produced; `on_final(output)` once a prompt's
        completions are all final (in the order prompts finish), with its `RequestOutput`; a
        prompt refused at once gets on_final only."""
        # Called from one of this run's own callbacks: refused, and the run goes on.
        self.engine.refuse_reentry("LLM.generate")
        requests = self.make_requests(prompts, sampling_params, ids)
        # A prompt's samples, by the prompt's index: each prompt's output is made from them.
        samples: dict[int, list[Request]] = {}
        for request in requests:
            samples.setdefault(request.index, []).append(request)
        reported: set[int] = set()
        with self.steps(requests) as steps:
            # One round a step: its new tokens, then the records it made final.
            for step in steps:
                for request in step.new_tokens:
                    if on_token is not None:
                        on_token(TokenEvent.from_request(request))
                for request in step.finished:
                    prompt_samples = samples[request.index]
                    if on_final is None or request.index in reported:
                        continue
                    if all(r.finished for r in prompt_samples):
                        reported.add(request.index)
                        on_final(RequestOutput.from_requests(prompt_samples, self.tokenizer))
        return [RequestOutput.from_requests(samples[i], self.tokenizer) for i in sorted(samples)]

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
        chat_template_content_format: str = "auto",
        tools: list | None = None,
        on_final: Callable[[RequestOutput], None] | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> list[RequestOutput]:
        """Answer conversations (vLLM's `LLM.chat`): each rendered with the model's chat template
        (or `chat_template`, a template of the caller's), encoded with no special tokens added
        (the template writes them), and served as `generate` serves prompts: one
        `RequestOutput` per conversation, in input order, its `prompt` the rendered text.

        `messages`: one conversation (a list of {"role", "content"} dicts) or a list of them.
        `add_generation_prompt`: end with the template's opening of the assistant's turn.
        `chat_template_kwargs`: more variables for the template; `tools`: its `tools`.
        `chat_template_content_format` (vLLM's): how a message's content reaches the template:
        "string" (a list of text parts joined with "\n"), "openai" (a list of text parts, a string
        one part), or "auto": as the template's code reads it (minirt/chat_template.py).
        `sampling_params`, `on_final`, `on_token`: as `generate` takes them.  A conversation the
        template refuses (or a model with no template) is a RequestError, before anything
        runs."""
        self.engine.refuse_reentry("LLM.chat")
        conversations = conversations_of(messages)
        template = self.template_for(chat_template)
        template = template.with_content_format(chat_template_content_format)
        prompts = []
        for number, conversation in enumerate(conversations):
            where = f"conversation {number}: " if len(conversations) > 1 else ""
            try:
                text = template.render(
                    conversation, add_generation_prompt, tools, extra=chat_template_kwargs
                )
                prompts.append({"prompt_token_ids": self.chat_prompt_ids(text)})
            except RequestError as exc:
                raise RequestError(f"{where}{exc}", exc.field) from None
        return self.generate(prompts, sampling_params, on_final=on_final, on_token=on_token)

    def template_for(self, chat_template: str | None = None) -> ChatTemplate:
        """The template a chat renders with: the caller's own, else the model's; a model with
        none (and no template given) is a RequestError saying so."""
        if chat_template is not None:
            if not isinstance(chat_template, str):
                shown = type(chat_template).__name__
                raise TypeError(f"chat_template must be a template's text, got {shown}")
            if self.chat_template is None:
                return ChatTemplate(chat_template, "the chat_template argument")
            return self.chat_template.with_source(chat_template)
        if self.chat_template is None:
            raise RequestError(
                "this model has no chat template (its folder has no chat_template.jinja and no "
                "chat_template in tokenizer_config.json), so there is no chat; give the text to "
                "generate, or pass chat_template="
            )
        return self.chat_template

    def chat_prompt_ids(self, text: str) -> list[int]:
        """A rendered conversation's token ids: encoded with no special tokens added (the
        template wrote them); refused by its length first when no encoding could fit it."""
        if self.tokenizer is None:
            raise RequestError("chat needs a tokenizer, and this model has none")
        self.request_maker.refuse_too_long_to_encode(text)
        return self.tokenizer.encode(text, add_special_tokens=False)


def conversations_of(messages) -> list:
    """One conversation (a list of message dicts) as a list of one; a list of conversations as
    it is; anything else a TypeError (each conversation's messages are checked as rendered)."""
    if (
        isinstance(messages, (list, tuple))
        and messages
        and all(isinstance(item, (list, tuple)) for item in messages)
    ):
        return list(messages)
    if isinstance(messages, (list, tuple)):
        return [messages]
    raise TypeError(
        f"messages must be a conversation (a list of messages) or a list of them, got "
        f"{type(messages).__name__}"
    )


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
