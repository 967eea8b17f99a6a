"""A model's chat template: a conversation rendered into the prompt text its model was trained on.

Owns: `ChatTemplate` (a template compiled once, with the special-token strings it is given, its
content format, and `render`), `load_chat_template` (a model folder's template, read once at
load), `check_messages` (a conversation's shape, refused in one line naming the message and
field) and `detected_content_format`.
This is the only module of minirt that imports jinja2, and only when a template is compiled, so
that minirt works without it; chat needs it (`pip install jinja2`, or the `chat` extra).

It renders as transformers' `apply_chat_template` does (its `chat_template_utils.py`): an
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols`
extension, a `tojson` filter that is `json.dumps` (no HTML escaping, non-ASCII kept, and its
indent, separators and sort_keys), the globals `raise_exception` and `strftime_now`, and the
variables `messages`, `add_generation_prompt`, `tools` and `documents` (None unless given), and
each special token tokenizer_config.json names (`bos_token`, `eos_token`, `unk_token`,
`pad_token`, ...: a string, or an AddedToken object's "content").  A message's keys whose value
is None are left out, as transformers 5 leaves them (many templates print "None" otherwise).

A message's content reaches the template in the template's own "content format", as vLLM gives it
(`--chat-template-content-format`): read once at load from the template's code (its jinja2 AST,
`detected_content_format`), a template that loops over a message's content (`for part in
message['content']`, through aliases, filters and slices) or indexes it (`content[0]['text']`)
takes "openai": every content a list of {"type": "text", "text"} parts, a string one part; any
other takes "string": a list of text parts joined with "\n" (Llama 3's, ChatML's and most others
would fail on a list, or print it).  A caller may name the format instead ("string", "openai";
"auto" is the template's own).  minirt reads text alone: a part of another type (an image) is
refused in one line naming `messages[i].content[j].type`.

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

import copy
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

# OpenAI's roles.  A template may know others (Llama 3.1's "ipython"), and transformers and
# vLLM pass any role through to it: so does minirt; the template refuses what it cannot render.
ROLES = ("system", "developer", "user", "assistant", "tool")

# The variables render sets itself, which chat_template_kwargs may not replace.
RESERVED = ("messages", "add_generation_prompt", "tools", "documents")

# jinja2 before 3.1.6 has known sandbox escapes (transformers refuses it too).
LEAST_JINJA2 = (3, 1, 6)

# A template is kilobytes.
MAX_TEMPLATE_BYTES = 4 * 2**20

NO_JINJA2 = "chat templates need jinja2 >= 3.1.6: pip install jinja2 (or minirt's chat extra)"

# How a message's content reaches the template (vLLM's --chat-template-content-format): "string",
# its text parts joined with "\n"; "openai", a list of text parts; "auto", as the template reads it.
CONTENT_FORMATS = ("auto", "string", "openai")


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


def detected_content_format(compiled, source: str) -> str:
    """A compiled template's content format, from its code (vLLM's detection, a little wider):
    "openai" where it loops over a message's content or indexes it by a number, else "string"."""
    nodes = jinja2_module().nodes
    tree = compiled.environment.parse(source)
    return "openai" if ContentReading(nodes, tree).reads_parts() else "string"


class ContentReading:
    """How a template's AST reads message content.  Names are followed as vLLM follows them, by
    what is assigned to them anywhere (`{% set loop_messages = messages[1:] %}`), not by scope:
    the lists of messages (`messages`, and names set to it), the messages (the targets of loops
    over those lists, `messages[0]`, and names set to one), and the contents (`message['content']`
    or `message.content` of a message, and names set to one)."""

    def __init__(self, nodes, tree):
        self.nodes = nodes
        self.tree = tree
        self.lists = self.names_set_to({"messages"}, self.is_list)
        self.messages = self.names_set_to(self.loop_targets(), self.is_message)
        self.contents = self.names_set_to(set(), self.is_content)

    def reads_parts(self) -> bool:
        """Whether the template loops over a content, or indexes one by a number."""
        for node in self.tree.find_all((self.nodes.For, self.nodes.Getitem)):
            if isinstance(node, self.nodes.For) and self.is_content(node.iter):
                return True
            if isinstance(node, self.nodes.Getitem) and self.is_number(node.arg):
                if self.is_content(node.node):
                    return True
        return False

    def names_set_to(self, names: set[str], matches) -> set[str]:
        """`names`, and every name assigned something `matches` says is one of them (to a fixed
        point: `a = messages`, `b = a[1:]`)."""
        found = set(names)
        grown = True
        while grown:
            grown = False
            for assign in self.tree.find_all(self.nodes.Assign):
                target = assign.target
                if isinstance(target, self.nodes.Name) and target.name not in found:
                    if matches(assign.node, found):
                        found.add(target.name)
                        grown = True
        return found

    def loop_targets(self) -> set[str]:
        """The names loops over a list of messages bind: `{% for message in messages %}`."""
        targets = set()
        for loop in self.tree.find_all(self.nodes.For):
            if isinstance(loop.target, self.nodes.Name) and self.is_list(loop.iter):
                targets.add(loop.target.name)
        return targets

    def bare(self, node):
        """`node` without the filters, tests and slices around it (`x | trim`, `x[1:]`)."""
        nodes = self.nodes
        while True:
            if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
                node = node.node
            elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
                node = node.node
            else:
                return node

    def is_name(self, node, names: set[str]) -> bool:
        node = self.bare(node)
        return isinstance(node, self.nodes.Name) and node.ctx == "load" and node.name in names

    def is_number(self, node) -> bool:
        """An index written as a whole number: `[0]`, `[-1]`."""
        if isinstance(node, self.nodes.Neg):
            node = node.node
        return isinstance(node, self.nodes.Const) and type(node.value) is int

    def is_list(self, node, names: set[str] | None = None) -> bool:
        return self.is_name(node, self.lists if names is None else names)

    def is_message(self, node, names: set[str] | None = None) -> bool:
        node = self.bare(node)
        if isinstance(node, self.nodes.Getitem) and self.is_number(node.arg):
            return self.is_list(node.node)
        return self.is_name(node, self.messages if names is None else names)

    def is_content(self, node, names: set[str] | None = None) -> bool:
        node = self.bare(node)
        nodes = self.nodes
        if isinstance(node, nodes.Getattr) and node.attr == "content":
            return self.is_message(node.node)
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            return node.arg.value == "content" and self.is_message(node.node)
        return self.is_name(node, self.contents if names is None else names)


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
            # How its code reads a message's content, read once; `content_format` is the one used.
            self.detected_format = detected_content_format(self.compiled, source)
        except RequestError as exc:
            self.compiled = None
            self.missing_jinja2 = str(exc)
            self.detected_format = "string"
        self.content_format = self.detected_format

    def with_source(self, source: str) -> ChatTemplate:
        """Another template (a caller's own), given the same special tokens."""
        return ChatTemplate(source, "the chat_template argument", self.special_tokens)

    def with_content_format(self, content_format: str) -> ChatTemplate:
        """This template, rendering every content in `content_format` ("string", "openai"; "auto":
        the detected one).  Another value is a RequestError naming the field."""
        if content_format not in CONTENT_FORMATS:
            message = (
                f"chat_template_content_format must be one of {', '.join(CONTENT_FORMATS)}; "
                f"got {content_format!r}"
            )
            raise RequestError(message, "chat_template_content_format")
        chosen = copy.copy(self)
        if content_format != "auto":
            chosen.content_format = content_format
        else:
            chosen.content_format = self.detected_format
        return chosen

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
            checked = check_messages(messages, self.content_format)
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


def check_messages(messages, content_format: str = "string") -> list[dict]:
    """A conversation as a template sees it: a non-empty list of messages, each a dict with a
    role (a non-empty string: OpenAI's ROLES, or another the template knows) and a content
    that is a string, a list of text parts or None, given in `content_format` ("string" or
    "openai": `checked_content`); other keys pass through as plain data, None-valued keys are
    left out.  A RequestError names the message and field
    (`messages[2].role`)."""
    if not isinstance(messages, (list, tuple)):
        shown = type(messages).__name__
        raise RequestError(f"messages must be a list of messages, got {shown}", "messages")
    if not messages:
        raise RequestError(
            "messages is empty: a conversation needs one message at least", "messages"
        )
    return [
        checked_message(index, message, content_format) for index, message in enumerate(messages)
    ]


def checked_message(index: int, message, content_format: str) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        shown = type(message).__name__
        raise RequestError(
            f"{where} must be an object with a role and a content, got {shown}", "messages"
        )
    role = message.get("role")
    if not isinstance(role, str):
        raise RequestError(f"{where}.role must be a string, got {role!r}", "messages")
    if not role:
        raise RequestError(
            f"{where}.role is empty; OpenAI's roles are {', '.join(ROLES)}", "messages"
        )
    checked = {}
    for key, value in message.items():
        if value is None:
            continue
        if key == "content":
            value = checked_content(where, value, content_format)
        try:
            checked[key] = plain(value, f"{where}.{key}")
        except TypeError as exc:
            raise RequestError(str(exc), "messages") from None
    return checked


def checked_content(where: str, content, content_format: str):
    """A content in the template's format: "string", a string (a list of text parts joined with
    "\n", as vLLM joins them); "openai", a list of {"type": "text", "text"} parts (a string is one
    part).  minirt reads text alone, so a part of another type is refused, naming it."""
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, (list, tuple)):
        texts = [part_text(f"{where}.content[{place}]", part) for place, part in enumerate(content)]
    else:
        message = f"{where}.content must be a string or a list of text parts, got {content!r}"
        raise RequestError(message, "messages")
    if content_format == "openai":
        return [{"type": "text", "text": text} for text in texts]
    return "\n".join(texts)


def part_text(at: str, part) -> str:
    """A content part's text; a part that is not {"type": "text", "text": a string} is refused
    in one line naming it (`messages[1].content[0].type`)."""
    if not isinstance(part, dict):
        shown = type(part).__name__
        message = f'{at} must be a part {{"type": "text", "text": ...}}, got {shown}'
        raise RequestError(message, "messages")
    kind = part.get("type")
    if kind != "text":
        message = (
            f"{at}.type is {kind!r}: minirt reads text alone, so a part must be "
            '{"type": "text", "text": ...}'
        )
        raise RequestError(message, "messages")
    text = part.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{at}.text must be a string, got {text!r}", "messages")
    return text


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
