"""A model's chat template: a conversation rendered into the prompt text its model was trained on.

Owns: `ChatTemplate` (a template compiled once, with the special-token strings it is given, and
`render`), `load_chat_template` (a model folder's template, read once at load), and
`check_messages` (a conversation's shape, refused in one line naming the message and field).
This is the only module of minirt that imports jinja2, and only when a template is compiled, so
that minirt works without it; chat needs it (`pip install jinja2`, or the `chat` extra).

It renders as transformers' `apply_chat_template` does (its `chat_template_utils.py`): an
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols`
extension, a `tojson` filter that is `json.dumps` (no HTML escaping, non-ASCII kept, and its
indent, separators and sort_keys), the globals `raise_exception` and `strftime_now`, and the
variables `messages`, `add_generation_prompt`, `tools` and `documents` (None unless given), and
each special token tokenizer_config.json names (`bos_token`, `eos_token`, `unk_token`,
`pad_token`, ...: a string, or an AddedToken object's "content").  A message's keys whose value
is None are left out, as transformers 5 leaves them (many templates print "None" otherwise); a
content given as a list of text parts reaches the template as that list, as in transformers (a
template that reads a string alone fails on it: that request's error).  minirt reads text alone:
a part of another type (an image) is refused, naming it.

Where the template comes from: a `chat_template.jinja` beside the tokenizer (how transformers
saves it since 4.50; it wins, as it does in transformers), else tokenizer_config.json's
`chat_template`: a string, or a list of {"name", "template"} of which the one named "default"
is taken.  A template that does not compile is refused at load, in one line naming its file.
At request time, whatever goes wrong in the template (its own `raise_exception`, something its
sandbox forbids, an error rendering) is that request's `RequestError`, never the server's.
The rendered text holds the model's special tokens itself: it is encoded without adding any.

Must not know: how requests are made or served, HTTP, or the engine.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from .errors import CheckpointError, RequestError
from .loading.json_file import broken_link, not_a_regular_file, read_json_file

# transformers' named special tokens (SPECIAL_TOKENS_ATTRIBUTES), each a template variable.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# The roles a message may have: OpenAI's.
ROLES = ("system", "developer", "user", "assistant", "tool")

# The variables render sets itself, which chat_template_kwargs may not replace.
RESERVED = ("messages", "add_generation_prompt", "tools", "documents")

# jinja2 before 3.1.6 has known sandbox escapes (transformers refuses it too).
LEAST_JINJA2 = (3, 1, 6)

# A template is kilobytes.
MAX_TEMPLATE_BYTES = 4 * 2**20

NO_JINJA2 = "chat templates need jinja2 >= 3.1.6: pip install jinja2 (or minirt's chat extra)"


class TemplateRaised(Exception):
    """A template's own `raise_exception(message)`: the conversation is not one it takes."""


def jinja2_module():
    """jinja2 itself, or a RequestError saying how to install it (or a newer one)."""
    try:
        import jinja2  # noqa: PLC0415 (optional: only chat needs it)
    except ImportError:
        raise RequestError(NO_JINJA2) from None
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < LEAST_JINJA2:
        raise RequestError(f"{NO_JINJA2}; this is jinja2 {jinja2.__version__}")
    return jinja2


def raise_exception(message) -> None:
    raise TemplateRaised(str(message))


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' `tojson`: json.dumps, with none of jinja2's HTML escaping."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def compile_template(source: str, where: str):
    """The template compiled in transformers' sandbox; a TemplateSyntaxError as one line naming
    `where` (a CheckpointError); no jinja2: a RequestError saying to install it."""
    jinja2 = jinja2_module()
    from jinja2.ext import loopcontrols  # noqa: PLC0415 (jinja2 is optional)
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415 (as above)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise CheckpointError(
            f"{where}: the chat template does not compile (line {exc.lineno}: {exc.message})"
        ) from None


class ChatTemplate:
    """A chat template, compiled once: `render(messages)` is the prompt text.  Without jinja2
    the template is kept uncompiled, and rendering says how to install it."""

    def __init__(self, source: str, where: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        # Where it came from, for messages: a file, or "the chat_template argument".
        self.where = where
        self.special_tokens = dict(special_tokens or {})
        try:
            self.compiled = compile_template(source, where)
            self.missing_jinja2: str | None = None
        except RequestError as exc:
            self.compiled = None
            self.missing_jinja2 = str(exc)

    def with_source(self, source: str) -> ChatTemplate:
        """Another template (a caller's own), given the same special tokens."""
        return ChatTemplate(source, "the chat_template argument", self.special_tokens)

    def render(
        self,
        messages,
        add_generation_prompt: bool = True,
        tools: list | None = None,
        documents: list | None = None,
        extra: dict | None = None,
    ) -> str:
        """The conversation as its prompt text.  A bad conversation, or a template that refuses
        it or fails on it, is a RequestError whose field is "messages"."""
        try:
            checked = check_messages(messages)
            variables = {**self.special_tokens, **checked_extra(extra)}
        except RecursionError:
            raise RequestError("the conversation nests too deeply to render", "messages") from None
        if self.compiled is None:
            raise RequestError(self.missing_jinja2 or NO_JINJA2)
        try:
            return self.compiled.render(
                messages=checked,
                tools=plain(tools, "tools"),
                documents=plain(documents, "documents"),
                add_generation_prompt=bool(add_generation_prompt),
                **variables,
            )
        except TemplateRaised as exc:
            message = f"the chat template refused this conversation: {exc}"
            raise RequestError(message, "messages") from None
        # A template is the model's code: whatever fails in it is this request's failure.
        except Exception as exc:  # noqa: BLE001 (see above)
            raise RequestError(self.failure(exc), "messages") from None

    def failure(self, exc: Exception) -> str:
        """One line for a template that failed on a conversation."""
        jinja2 = jinja2_module()
        first = (str(exc).splitlines() or [""])[0][:300]
        if isinstance(exc, jinja2.exceptions.SecurityError):
            return f"the chat template ({self.where}) did what its sandbox forbids: {first}"
        return f"the chat template ({self.where}) failed on this conversation: {first}"


def checked_extra(extra: dict | None) -> dict:
    """chat_template_kwargs: more variables, as plain data; none may replace render's own."""
    if extra is None:
        return {}
    if not isinstance(extra, dict) or not all(isinstance(key, str) for key in extra):
        raise RequestError("chat_template_kwargs must be a dict of names", "chat_template_kwargs")
    taken = sorted(set(extra) & set(RESERVED))
    if taken:
        message = f"chat_template_kwargs may not set {', '.join(taken)}: the call's own"
        raise RequestError(message, "chat_template_kwargs")
    return {key: plain(value, f"chat_template_kwargs.{key}") for key, value in extra.items()}


def plain(value, where: str):
    """`value` rebuilt of JSON's types alone (what a template may see, as transformers rebuilds
    it: no object with methods of its own reaches the sandbox); anything else is a TypeError."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        rebuilt = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has a key {key!r} that is not a string")
            rebuilt[str(key)] = plain(item, f"{where}.{key}")
        return rebuilt
    if isinstance(value, (list, tuple)):
        return [plain(item, f"{where}[{place}]") for place, item in enumerate(value)]
    raise TypeError(f"{where} must hold JSON's types (str, numbers, lists, dicts), got {value!r}")


def check_messages(messages) -> list[dict]:
    """A conversation as a template sees it: a non-empty list of messages, each a dict with a
    role (one of ROLES) and a content that is a string, a list of text parts or None; other
    keys pass through as plain data, None-valued keys are left out.  A RequestError names the
    message and field (`messages[2].role`)."""
    if not isinstance(messages, (list, tuple)):
        shown = type(messages).__name__
        raise RequestError(f"messages must be a list of messages, got {shown}", "messages")
    if not messages:
        raise RequestError(
            "messages is empty: a conversation needs one message at least", "messages"
        )
    return [checked_message(index, message) for index, message in enumerate(messages)]


def checked_message(index: int, message) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        shown = type(message).__name__
        raise RequestError(
            f"{where} must be an object with a role and a content, got {shown}", "messages"
        )
    role = message.get("role")
    if not isinstance(role, str):
        raise RequestError(f"{where}.role must be a string, got {role!r}", "messages")
    if role not in ROLES:
        raise RequestError(
            f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", "messages"
        )
    checked = {}
    for key, value in message.items():
        if value is None:
            continue
        if key == "content":
            value = checked_content(where, value)
        try:
            checked[key] = plain(value, f"{where}.{key}")
        except TypeError as exc:
            raise RequestError(str(exc), "messages") from None
    return checked


def checked_content(where: str, content):
    """A content as the template sees it: a string, or a list of text parts as given (as
    transformers passes it; minirt reads text alone, so any other part is refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        message = f"{where}.content must be a string or a list of text parts, got {content!r}"
        raise RequestError(message, "messages")
    for place, part in enumerate(content):
        at = f"{where}.content[{place}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            shown = part.get("type") if isinstance(part, dict) else type(part).__name__
            message = f'{at} must be a text part {{"type": "text", "text": ...}}, got {shown!r}'
            raise RequestError(message + " (minirt reads text alone)", "messages")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{at}.text must be a string, got {part.get('text')!r}", "messages")
    return content


def load_chat_template(folder: str | Path) -> ChatTemplate | None:
    """A model folder's chat template (None when it has none): chat_template.jinja, else
    tokenizer_config.json's chat_template, given the config's special tokens.  A file that
    cannot be read, or a template that does not compile, is a CheckpointError naming the file."""
    folder = Path(folder)
    config_path = folder / "tokenizer_config.json"
    config = read_tokenizer_config(config_path)
    special = special_tokens(config, config_path)
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.exists() or broken_link(jinja_path):
        return ChatTemplate(read_template_file(jinja_path), str(jinja_path), special)
    source = config_template(config.get("chat_template"), config_path)
    if source is None:
        return None
    return ChatTemplate(source, str(config_path), special)


def read_tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json as a dict ({} when absent), or a one-line CheckpointError."""
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(f"{link_problem}; fix the link, or remove it")
    if not path.exists():
        return {}
    try:
        raw = read_json_file(path)
    except (OSError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CheckpointError(
            f"{path}: cannot read it ({reason}); fix or remove the file"
        ) from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return raw


def special_tokens(config: dict, path: Path) -> dict[str, str]:
    """The special tokens the config names, as strings: each a string or an AddedToken object
    ({"content": ...}); a token of another shape is refused naming it."""
    found = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            message = f'{path}: {name} must be a string or {{"content": a string}}, got {value!r}'
            raise CheckpointError(message)
        found[name] = value
    return found


def config_template(value, path: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or the one named "default" of a list of
    {"name", "template"}; None when it has none."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(entry, dict) and isinstance(entry.get("name"), str) for entry in value
    ):
        named = {entry["name"]: entry.get("template") for entry in value}
        if isinstance(named.get("default"), str):
            return named["default"]
        shown = ", ".join(sorted(named)) or "none"
        message = f'{path}: chat_template names templates ({shown}) but none "default"'
        raise CheckpointError(message + "; minirt takes the default one")
    message = f'{path}: chat_template must be a string or a list of {{"name", "template"}}'
    raise CheckpointError(f"{message}, got {type(value).__name__}")


def read_template_file(path: Path) -> str:
    """chat_template.jinja's text, read as the JSON files are (a regular file, size-capped)."""
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(f"{link_problem}; fix the link, or remove it")
    # Looked at, never opened, before it is known to be a regular file: a FIFO would block.
    kind = not_a_regular_file(path)
    if kind:
        raise CheckpointError(f"{path}: {kind}, not a template file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise CheckpointError(
            f"{path}: over {MAX_TEMPLATE_BYTES // 2**20} MiB, too big for a template"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text") from None
