"""The sampling flags of the commands that serve prompts.

Owns: `add_sampling_flags` (with the real defaults in their help), `flag_overrides` (what the
command line set), `sampling_defaults` (the model's generation_config.json with the flags
applied: built-in defaults < the model's generation_config.json < flags < a JSONL line's own
fields) and `check_flags_for_model` (a flag value the model refuses stops the run before it
starts, instead of failing every request).

Must not know: files, output, or how requests are served.
"""

from __future__ import annotations

import json
from contextlib import suppress

from ..engine.params import SamplingParams, first_refused_field
from ..errors import InputError, MinirtError, RequestError
from ..loading.checkpoint import shipped_model_folder
from ..llm import generation_defaults


def shipped_defaults() -> dict[str, str]:
    """'; the shipped model's: X' per field --help names, from its generation_config.json read once
    ({}: unreadable)."""
    with suppress(MinirtError):
        params = generation_defaults(shipped_model_folder())
        return {
            f: f"; the shipped model's: {getattr(params, f)}"
            for f in ("max_tokens", "temperature", "top_k")
        }
    return {}


def add_sampling_flags(g) -> None:
    """Every sampling flag, on the argument group `g`."""
    add_choice_flags(g)
    add_stop_flags(g)
    add_penalty_flags(g)


def add_choice_flags(g) -> None:
    """How many tokens, and how each is chosen."""
    where = "default: the model's generation_config.json, else"
    shipped = shipped_defaults()
    g.add_argument(
        "--max-tokens",
        "--max-new-tokens",
        dest="max_tokens",
        type=int,
        metavar="N",
        help=f"tokens to generate at most; --max-new-tokens is its other name "
        f"({where} 16{shipped.get('max_tokens', '')})",
    )
    g.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help=f"0 is greedy, higher is more random ({where} 0{shipped.get('temperature', '')})",
    )
    g.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="sample only from the K most likely tokens, 0: off "
        f"({where} 0{shipped.get('top_k', '')})",
    )
    g.add_argument(
        "--top-p",
        type=float,
        metavar="P",
        help=f"sample the smallest set of mass >= P, 1: off ({where} 1)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="the run's seed; a request without a seed gets one derived from S and its line "
        "(default 0)",
    )


def add_stop_flags(g) -> None:
    """When a request stops."""
    g.add_argument(
        "--stop",
        action="append",
        metavar="TEXT",
        help="stop when this text appears (repeatable; \\n for newline)",
    )
    g.add_argument(
        "--stop-token-id",
        action="append",
        type=int,
        metavar="ID",
        help="stop when this token is produced (repeatable)",
    )
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        default=None,
        help="keep generating past the end-of-text token",
    )


def add_penalty_flags(g) -> None:
    """What changes the logits, what the records add, and how many samples."""
    g.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="R",
        help="a token already in the prompt or output: its logit / R if positive, x R if not "
        "(transformers' formula; 0.01 to 100, default 1: off)",
    )
    g.add_argument(
        "--presence-penalty",
        type=float,
        metavar="P",
        help="subtract P from the logit of every token the output holds (-2 to 2, default 0)",
    )
    g.add_argument(
        "--frequency-penalty",
        type=float,
        metavar="F",
        help="subtract F x how often the output holds a token from its logit (-2 to 2, default 0)",
    )
    g.add_argument(
        "--min-p",
        type=float,
        metavar="P",
        help="keep tokens at least P x the top token's probability, "
        "after top-k and top-p (default 0: off)",
    )
    g.add_argument(
        "--logit-bias",
        action="append",
        type=parse_bias,
        metavar="ID=BIAS",
        help="add BIAS (-100 to 100) to token ID's logit, before everything else (repeatable)",
    )
    g.add_argument(
        "--prompt-logprobs",
        action="store_const",
        const=0,
        default=None,
        help="record each prompt token's log-probability given the tokens before it",
    )
    g.add_argument(
        "--n",
        type=int,
        metavar="N",
        help="N independent samples of each prompt, one record each "
        "(with the prompt's index and id, and its `sample` number; default 1)",
    )


def parse_bias(text: str) -> tuple[int, float]:
    """--logit-bias ID=BIAS as (id, bias); else a one-line error."""
    token, equals, bias = text.partition("=")
    try:
        if equals and token.strip().isdigit():
            return int(token), float(bias)
    except ValueError:
        pass
    raise MinirtError(f"--logit-bias takes ID=BIAS, such as 50256=-100, got {text!r}")


def flag_overrides(args) -> dict:
    """Sampling fields given on the command line."""
    # \n and \t in --stop are a newline and a tab.
    if args.stop:
        stop = tuple(s.replace("\\n", "\n").replace("\\t", "\t") for s in args.stop)
    else:
        stop = None
    given = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "ignore_eos": args.ignore_eos,
        "stop": stop,
        "stop_token_ids": tuple(args.stop_token_id) if args.stop_token_id else None,
        "repetition_penalty": args.repetition_penalty,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "min_p": args.min_p,
        "logit_bias": tuple(args.logit_bias) if args.logit_bias else None,
        # --logprobs N (N >= 1) asks for top_logprobs.
        "logprobs": args.logprobs or None,
        "prompt_logprobs": args.prompt_logprobs,
        "n": args.n,
    }
    return {k: v for k, v in given.items() if v is not None}


def sampling_defaults(model_defaults: SamplingParams, overrides: dict) -> SamplingParams:
    """The model's defaults with the flags applied, or a one-line error naming the bad flag."""
    try:
        return model_defaults.updated(**overrides)
    except RequestError as exc:
        raise MinirtError(
            f"bad sampling flag {flag_blamed(model_defaults, overrides, exc)}"
        ) from None


def flag_blamed(model_defaults: SamplingParams, overrides: dict, refusal: RequestError) -> str:
    """'--FLAG VALUE: the rule' for the first flag SamplingParams refuses on its own, its value
    as the command line gave it (`--logit-bias 5=nan`), not as Python writes the field
    (`((5, nan),)`)."""
    refused = first_refused_field(model_defaults, overrides)
    if refused is None:
        # Each flag passes alone: the refusal is of the flags together, in its own words.
        return f": {refusal}"
    field, rule = refused
    return f"{flag_name(field)} {flag_text(field, overrides[field])}: {rule}"


def flag_text(field: str, value) -> str:
    """A sampling field's value as its flag takes it, for a message."""
    if field == "logit_bias":
        return " ".join(f"{token}={bias}" for token, bias in value)
    if isinstance(value, tuple):
        # Repeated flags (--stop, --stop-token-id): each value, strings quoted (one may be "").
        return " ".join(json.dumps(item) if isinstance(item, str) else str(item) for item in value)
    return str(value)


def flag_name(field: str) -> str:
    """The command-line flag that sets a sampling field."""
    if field == "stop_token_ids":
        # Repeatable, one id each time.
        return "--stop-token-id"
    return "--" + field.replace("_", "-")


def check_flags_for_model(check_params, overrides: dict) -> None:
    """Refuse, in one line naming the flag, a flag value that every request would fail on
    because the model cannot take it (a token id outside its vocabulary, stop strings without a
    tokenizer): a bad flag is exit 2 before anything runs, not one error record per prompt.
    Each field the command line set is checked alone, by the model's own request check
    (`check_params`, which is `LLM.check_params`)."""
    for field, value in overrides.items():
        try:
            check_params(SamplingParams().updated(**{field: value}))
        except (RequestError, InputError) as exc:
            raise MinirtError(f"bad sampling flag {flag_name(field)}: {exc}") from None
