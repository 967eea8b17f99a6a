"""A model folder's special tokens as transformers and vLLM read them: every id that ends text,
and the tokenizer_config.json settings that change how transformers 5 encodes.

Owns:
  * `read_token_ids`, one JSON field that holds a token id or a list of them (config.json's and
    generation_config.json's `eos_token_id`: Llama 3's is [128001, 128008, 128009]), checked;
  * `generation_eos_ids`, generation_config.json's end ids (vLLM stops at them beside the
    tokenizer's own EOS);
  * `TokenizerConfig`, what minirt reads of tokenizer_config.json: the names of its EOS and BOS
    tokens (a string, or an AddedToken dict {"content": ...}), and its `tokenizer_class`,
    `add_prefix_space` and `legacy`, from which transformers 5 rebuilds a Llama tokenizer's
    pipeline (its `add_bos_token` / `add_eos_token` transformers 5 leaves aside when a
    tokenizer.json is there: the tokenizer.json's post-processor says what encoding adds);
  * `end_ids`, the ids that end a request, in order (the primary one first), each once, each
    inside the vocabulary.

A file that is there but unreadable is refused in one line naming it.

Must not know: models' layers, weights, the engine, requests or which library runs a tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import CheckpointError, TokenizerError
from .json_file import broken_link, read_json_file


def read_token_ids(raw: dict[str, Any], name: str, source: str) -> tuple[int, ...]:
    """`raw[name]` as token ids: () when absent or null, (id,) for an integer, the list's ids in
    order for a list of integers.  Anything else (a bool, a negative number, a float, a list
    holding one) is a CheckpointError naming `source` and the field."""
    value = raw.get(name)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise CheckpointError(
                f"{source}: {name} must be a token id (an integer >= 0) or a list of them, "
                f"found {value!r}"
            )
    return tuple(values)


def read_optional_json(path: Path, error: type[Exception]) -> dict[str, Any]:
    """A model folder's optional JSON object: {} when the file is absent; a broken link, a file
    that is not a JSON object or cannot be read is `error`, in one line naming it."""
    link_problem = broken_link(path)
    if link_problem:
        raise error(f"{link_problem}; fix the link, or remove it")
    if not path.exists():
        return {}
    try:
        raw = read_json_file(path)
    # JSON's errors are ValueErrors.
    except (OSError, ValueError, RecursionError) as exc:
        raise error(f"{path}: {exc}; fix or remove the file") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object; fix or remove the file")
    return raw


def generation_eos_ids(folder: str | Path) -> tuple[int, ...]:
    """generation_config.json's `eos_token_id` (an id or a list of them) as ids; () without the
    file or the field."""
    path = Path(folder) / "generation_config.json"
    raw = read_optional_json(path, CheckpointError)
    return read_token_ids(raw, "eos_token_id", str(path))


@dataclass(frozen=True)
class TokenizerConfig:
    """What minirt reads of tokenizer_config.json (each None when the file does not say)."""

    eos_token: str | None = None
    bos_token: str | None = None
    # transformers 5's LlamaTokenizer rebuilds a tokenizer.json's pipeline from these.
    tokenizer_class: str | None = None
    add_prefix_space: bool | None = None
    legacy: bool | None = None


def token_name(raw: dict[str, Any], name: str, source: str) -> str | None:
    """A special token's text: a string, or an AddedToken dict's "content"; None when absent."""
    value = raw.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise TokenizerError(
        f'{source}: {name} must be a token\'s text or an object with its "content", found {value!r}'
    )


def flag(raw: dict[str, Any], name: str, source: str) -> bool | None:
    value = raw.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise TokenizerError(f"{source}: {name} must be true or false, found {value!r}")


def read_tokenizer_config(folder: str | Path) -> TokenizerConfig:
    """tokenizer_config.json's special tokens and flags; all None without the file."""
    path = Path(folder) / "tokenizer_config.json"
    raw = read_optional_json(path, TokenizerError)
    source = str(path)
    return TokenizerConfig(
        eos_token=token_name(raw, "eos_token", source),
        bos_token=token_name(raw, "bos_token", source),
        tokenizer_class=token_name(raw, "tokenizer_class", source),
        add_prefix_space=flag(raw, "add_prefix_space", source),
        legacy=flag(raw, "legacy", source),
    )


def end_ids(primary: int | None, others: Iterable[int | None], vocab_size: int) -> tuple[int, ...]:
    """The ids that end a request: `primary` first, then `others` in order, each once, leaving
    out None and any id outside the vocabulary (a tiny model that kept GPT-2's 50256)."""
    ordered = [primary, *others]
    inside = [i for i in ordered if i is not None and 0 <= i < vocab_size]
    return tuple(dict.fromkeys(inside))
