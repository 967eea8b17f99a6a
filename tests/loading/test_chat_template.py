"""Chat templates (minirt/chat_template.py) and `LLM.chat`: a model's template rendered as transformers'
`apply_chat_template` renders it, held to transformers' own strings (tests/fixtures/chat_templates/cases.json
and tests/fixtures/llama_chat_byte_level/chat_expected.json, written by transformers; and live, where torch
and transformers are installed), its refusals one line each, and `LLM.chat` held to `LLM.generate` of the
independently rendered text's ids."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import FIXTURES, requires_reference

from minirt import LLM, SamplingParams
from minirt.errors import CheckpointError, RequestError

jinja2 = pytest.importorskip("jinja2", reason='chat needs jinja2: pip install -e ".[test]"')

from minirt.chat_template import ChatTemplate, check_messages, load_chat_template  # noqa: E402
from chat_models import EOS, chat_model, hf_ids  # noqa: E402

CASES = json.loads((FIXTURES / "chat_templates" / "cases.json").read_text(encoding="utf-8"))
CHAT_FIXTURE = FIXTURES / "llama_chat_byte_level"


def case_id(case) -> str:
    return f"{case['template']}-{case['conversation']}-{int(case['add_generation_prompt'])}"


def non_text_part(messages):
    """(message index, part index) of the first content part that is not text, or None."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    return i, j
    return None


@pytest.mark.parametrize("case", CASES["cases"], ids=case_id)
def test_each_case_renders_as_transformers_rendered_it(case):
    template = ChatTemplate(
        CASES["templates"][case["template"]], "cases.json", case["special_tokens"]
    )
    render = lambda: template.render(case["messages"], case["add_generation_prompt"])  # noqa: E731
    part = non_text_part(case["messages"])
    if part is not None:
        # minirt reads text alone: an image part is refused, naming it, where transformers passes it on.
        at = rf"messages\[{part[0]}\]\.content\[{part[1]}\]\.type"
        with pytest.raises(RequestError, match=at):
            render()
    elif case.get("error") is not None:
        with pytest.raises(RequestError) as caught:
            render()
        assert case["error"]["message"] in str(caught.value) and caught.value.field == "messages"
    else:
        assert render() == case["rendered"]


def test_the_cases_cover_errors_parts_and_both_tokenizers():
    """The table above tests what it should: refusals, lists of parts, tools' JSON."""
    cases = CASES["cases"]
    assert any(case.get("error") for case in cases)
    assert any(non_text_part(case["messages"]) is not None for case in cases)
    assert any("tool_calls" in m for case in cases for m in case["messages"])
    assert {case["tokenizer"] for case in cases} == {"byte_level", "byte_fallback"}


def test_a_list_of_text_parts_reaches_the_template_as_a_list():
    """As transformers passes it: the template iterates the parts (parts_tojson's own loop)."""
    template = ChatTemplate(CASES["templates"]["parts_tojson"], "t", {"bos_token": "<s>"})
    parts = [{"type": "text", "text": "a "}, {"type": "text", "text": "<b> & c"}]
    rendered = template.render([{"role": "user", "content": parts}], False)
    assert rendered == "<s><|start_header_id|>user<|end_header_id|>\n\na <b> & c<|eot_id|>"


def test_the_model_folder_renders_and_encodes_as_transformers_did():
    """chat_expected.json: transformers' apply_chat_template(tokenize=True) ids, from the text the folder's
    template renders, encoded with no special tokens added (the template holds the BOS)."""
    from minirt.loading.tokenizer import load_tokenizer

    expected = json.loads((CHAT_FIXTURE / "chat_expected.json").read_text(encoding="utf-8"))
    template = load_chat_template(CHAT_FIXTURE)
    tokenizer = load_tokenizer(CHAT_FIXTURE)
    assert template is not None and tokenizer is not None
    for prompt in expected["prompts"]:
        rendered = template.render(prompt["messages"], True)
        assert rendered == prompt["rendered"]
        assert tokenizer.encode(rendered, add_special_tokens=False) == prompt["prompt_ids"]
        # One BOS, the template's: the tokenizer's own would add a second.
        assert tokenizer.encode(rendered).count(prompt["prompt_ids"][0]) == 2


@requires_reference
def test_rendered_ids_equal_transformers_apply_chat_template_live():
    from transformers import AutoTokenizer

    from minirt.loading.tokenizer import load_tokenizer

    hf = AutoTokenizer.from_pretrained(str(CHAT_FIXTURE))
    template = load_chat_template(CHAT_FIXTURE)
    tokenizer = load_tokenizer(CHAT_FIXTURE)
    for case in CASES["cases"]:
        if (
            case["tokenizer"] != "byte_level"
            or case.get("error")
            or non_text_part(case["messages"])
        ):
            continue
        source = CASES["templates"][case["template"]]
        ours = template.with_source(source).render(case["messages"], case["add_generation_prompt"])
        theirs = hf.apply_chat_template(
            case["messages"],
            chat_template=source,
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=False,
        )
        assert ours == theirs, case_id(case)
        ids = hf.apply_chat_template(
            case["messages"],
            chat_template=source,
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=True,
        )
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert tokenizer.encode(ours, add_special_tokens=False) == list(ids), case_id(case)


# ---------------------------------------------------------------- content parts: the content format

# Each template's content format, read off its code by hand: only parts_tojson loops over a
# message's content ({% for part in message.content %}); the others add it to strings (`+`,
# `| trim`, `.strip()`), so a list of parts reaches them as its text joined with "\n".
FORMATS = {
    "llama3": "string",
    "qwen2_5_chatml": "string",
    "smollm2_chatml": "string",
    "llama2": "string",
    "mistral_inst": "string",
    "parts_tojson": "openai",
}
TOKENIZER_FORMATS = {"byte_level": "string", "byte_fallback": "string"}
LLAMA3_SPECIALS = {"bos_token": "<|begin_of_text|>"}


def as_parts(messages, split=None):
    """`messages` with each string content a list of text parts: one part, or `split` pieces."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            pieces = [content] if split is None else content.split(split)
            content = [{"type": "text", "text": piece} for piece in pieces]
        out.append({**message, "content": content})
    return out


def test_every_template_in_the_fixtures_is_given_a_format():
    assert set(FORMATS) == set(CASES["templates"])
    folders = {
        path.parent.name for path in (FIXTURES / "tokenizers").glob("*/tokenizer_config.json")
    }
    assert folders == set(TOKENIZER_FORMATS)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_cases_template_is_detected_in_the_format_its_code_reads(name):
    template = ChatTemplate(CASES["templates"][name], "cases.json")
    assert template.detected_format == template.content_format == FORMATS[name]


@pytest.mark.parametrize("name", sorted(TOKENIZER_FORMATS))
def test_each_tokenizer_fixtures_template_is_detected_in_its_format(name):
    template = load_chat_template(FIXTURES / "tokenizers" / name)
    assert template is not None and template.detected_format == TOKENIZER_FORMATS[name]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        ("{% for m in messages %}{{ m['content'][0]['text'] }}{% endfor %}", "openai"),
        ("{{ messages[0]['content'][0].text }}{{ messages[-1].content[-1].text }}", "openai"),
        ("{{ messages[-1].content[-1].text }}", "openai"),
        (
            "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}"
            "{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% set first = messages[0] %}{% for p in first.content %}{{ p.text }}{% endfor %}",
            "openai",
        ),
        ("{% for m in messages %}{{ m['content'] | trim }}{% endfor %}", "string"),
        ("{% for m in messages %}{% set c = m['content'] %}{{ c.strip() }}{% endfor %}", "string"),
        (
            "{% for m in messages %}{% for t in tools %}{{ t }}{% endfor %}{{ m.content }}{% endfor %}",
            "string",
        ),
        (
            "{% for m in messages %}{% for p in other.content %}{% endfor %}{{ m.content[1:] }}{% endfor %}",
            "string",
        ),
        ("{% for m in messages %}{{ m['content'] }}{{ m['tool_calls'][0] }}{% endfor %}", "string"),
    ],
)
def test_the_detection_follows_loops_indexes_aliases_filters_and_slices(source, expected):
    assert ChatTemplate(source, "t").detected_format == expected


def test_a_string_format_template_given_text_parts_renders_as_given_their_joined_text():
    """Llama 3's template (the byte_level fixture's) adds the content to strings: the parts arrive
    joined with "\n" (vLLM's join), and the prompt is the one the joined string gives."""
    template = load_chat_template(FIXTURES / "tokenizers" / "byte_level")
    parts = [{"type": "text", "text": " What is"}, {"type": "text", "text": "2 + 2? "}]
    rendered = template.render([{"role": "user", "content": parts}])
    # By hand: the header, the joined text trimmed (`| trim`), the end of the turn, the opening.
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is\n2 + 2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert rendered == template.render([{"role": "user", "content": " What is\n2 + 2? "}])


@pytest.mark.parametrize(
    "case",
    [
        case
        for case in CASES["cases"]
        if FORMATS[case["template"]] == "string"
        and not case.get("error")
        and non_text_part(case["messages"]) is None
    ],
    ids=case_id,
)
def test_single_text_parts_render_as_transformers_rendered_the_strings(case):
    """Each string-format case with its contents sent as parts: transformers' own render of the
    strings (cases.json), to the character."""
    template = ChatTemplate(
        CASES["templates"][case["template"]], "cases.json", case["special_tokens"]
    )
    messages = as_parts(case["messages"])
    assert template.render(messages, case["add_generation_prompt"]) == case["rendered"]


@requires_reference
def test_text_parts_render_as_transformers_renders_their_joined_text_live():
    """Every string-format template on every conversation, each content cut at its spaces into
    parts: transformers' apply_chat_template of the contents joined with "\n" (vLLM's join)."""
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(CHAT_FIXTURE))
    model_template = load_chat_template(CHAT_FIXTURE)
    conversations = {case["conversation"]: case["messages"] for case in CASES["cases"]}
    checked = 0
    for name in (name for name, kind in FORMATS.items() if kind == "string"):
        template = model_template.with_source(CASES["templates"][name])
        for conversation, messages in conversations.items():
            if non_text_part(messages) is not None:
                continue
            joined = [
                {**m, "content": m["content"].replace(" ", "\n")}
                if isinstance(m["content"], str)
                else m
                for m in messages
            ]
            try:
                theirs = hf.apply_chat_template(
                    joined,
                    chat_template=CASES["templates"][name],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            except TemplateError:
                with pytest.raises(RequestError):
                    template.render(as_parts(messages, split=" "))
                continue
            assert template.render(as_parts(messages, split=" ")) == theirs, (name, conversation)
            checked += 1
    assert checked >= 20


def test_an_openai_format_template_receives_every_content_as_a_list_of_text_parts():
    """A template that loops over the content gets the parts ({"type", "text"} alone: other keys
    are dropped), and a string content as one part."""
    template = ChatTemplate(
        "{% for m in messages %}{% for p in m.content %}{% endfor %}{{ m.content | tojson }}|"
        "{% endfor %}",
        "t",
    )
    assert template.content_format == "openai"
    parts = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]
    rendered = template.render(
        [{"role": "system", "content": "s"}, {"role": "user", "content": parts}], False
    )
    assert rendered == '[{"type": "text", "text": "s"}]|[{"type": "text", "text": "a"}]|'
    # parts_tojson (transformers' render in cases.json): the parts' texts, one after the other.
    parts_tojson = ChatTemplate(CASES["templates"]["parts_tojson"], "t", {"bos_token": "<s>"})
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert parts_tojson.render([{"role": "user", "content": two}], False) == (
        "<s><|start_header_id|>user<|end_header_id|>\n\nab<|eot_id|>"
    )


def test_a_content_format_given_overrides_the_detected_one():
    llama3 = ChatTemplate(CASES["templates"]["llama3"], "t", LLAMA3_SPECIALS)
    parts_tojson = ChatTemplate(CASES["templates"]["parts_tojson"], "t", LLAMA3_SPECIALS)
    two = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    head = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    # "string" on a template that takes lists: it gets the joined text, and prints it.
    assert parts_tojson.with_content_format("string").render(two, False) == head + "a\nb<|eot_id|>"
    # "openai" on Llama 3's: the list reaches `| trim`, which prints it (what transformers does).
    forced = llama3.with_content_format("openai")
    listed = "[{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}]"
    assert forced.render(two, False) == head + listed + "<|eot_id|>"
    # "auto" is the template's own again; the original is untouched.
    assert forced.with_content_format("auto").render(two, False) == head + "a\nb<|eot_id|>"
    assert llama3.content_format == "string" and forced.detected_format == "string"
    with pytest.raises(
        RequestError, match="must be one of auto, string, openai; got 'json'"
    ) as caught:
        llama3.with_content_format("json")
    assert caught.value.field == "chat_template_content_format" and "\n" not in str(caught.value)


# ---------------------------------------------------------------- where the template comes from


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "config", "bos_token": "<s>"})
    )
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}file")
    template = load_chat_template(tmp_path)
    assert template.render([{"role": "user", "content": "x"}]) == "<s>file"
    assert template.where == str(tmp_path / "chat_template.jinja")


def test_a_list_of_named_templates_gives_its_default(tmp_path):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "x"}]) == "plain"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named[:1]}))
    with pytest.raises(CheckpointError, match='none "default"'):
        load_chat_template(tmp_path)


def test_a_folder_without_a_template_has_none(tmp_path):
    assert load_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert load_chat_template(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"tokenizer_config\.json: cannot read it"),
        ("[1, 2]", "expected a JSON object"),
        (
            json.dumps({"chat_template": "{% for %}"}),
            r"tokenizer_config\.json: the chat template does not compile",
        ),
        (json.dumps({"chat_template": 5}), "must be a string or a list"),
        (json.dumps({"chat_template": "x", "bos_token": 3}), "bos_token must be a string"),
    ],
)
def test_a_bad_file_or_template_is_refused_at_load_in_one_line(tmp_path, text, match):
    (tmp_path / "tokenizer_config.json").write_text(text)
    with pytest.raises(CheckpointError, match=match) as caught:
        load_chat_template(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_fifo_for_a_template_file_is_refused_unopened(tmp_path):
    import os

    os.mkfifo(tmp_path / "chat_template.jinja")
    with pytest.raises(CheckpointError, match="a FIFO"):
        load_chat_template(tmp_path)


def test_without_jinja2_a_model_loads_and_chat_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)
    folder = chat_model(tmp_path / "model")
    llm = LLM(folder)
    assert llm.generate(["ROMEO:"], SamplingParams(max_tokens=2))[0].ok
    with pytest.raises(RequestError, match=r"pip install jinja2"):
        llm.chat([{"role": "user", "content": "x"}])


# ---------------------------------------------------------------- rendering


def test_special_tokens_come_as_strings_and_added_token_objects(tmp_path):
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False},
        "chat_template": "{{ bos_token }}{{ eos_token }}{{ unk_token }}|",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    # An unset token is undefined, which renders as nothing (as in transformers).
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "x"}]) == "<s></s>|"


def test_tojson_keeps_non_ascii_and_escapes_no_html_as_transformers():
    template = ChatTemplate(
        "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=True) }}", "t"
    )
    message = {"role": "user", "content": "<é & 日本>"}
    assert template.render([message]) == json.dumps(message, ensure_ascii=False) + "|" + json.dumps(
        message, ensure_ascii=False, indent=2, sort_keys=True
    )


def test_strftime_now_and_loop_controls_and_none_unset():
    from datetime import datetime

    template = ChatTemplate(
        "{{ strftime_now('%Y') }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.role }}{{ m.content is defined }}{% endfor %}{{ tools }}{{ documents }}",
        "t",
    )
    rendered = template.render(
        [{"role": "assistant", "content": None}, {"role": "user", "content": "x"}], False
    )
    # content None is left out (transformers 5); tools and documents are None unless given.
    assert rendered == f"{datetime.now().year}assistantFalseNoneNone"


def test_the_template_is_sandboxed_and_its_failures_are_the_requests():
    for source, match in [
        ("{{ ''.__class__.__mro__ }}", "sandbox forbids"),
        ("{{ messages.append(1) }}", "sandbox forbids"),
        ("{{ 1 / 0 }}", "failed on this conversation: division by zero"),
        ("{{ raise_exception('no tools here') }}", "refused this conversation: no tools here"),
    ]:
        with pytest.raises(RequestError, match=match) as caught:
            ChatTemplate(source, "t").render([{"role": "user", "content": "x"}])
        assert caught.value.field == "messages"


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "messages is empty"),
        ("hi", "messages must be a list"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be an object"),
        ([{"content": "a"}], r"messages\[0\]\.role must be a string"),
        (
            [{"role": "user", "content": "a"}, {"role": "", "content": "b"}],
            r"messages\[1\]\.role is empty",
        ),
        ([{"role": "user", "content": 5}], r"messages\[0\]\.content must be a string or a list"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            r"messages\[0\]\.content\[0\]\.type is 'image_url': minirt reads text alone",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": ["b"]}],
            r"messages\[1\]\.content\[0\] must be a part",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            r"messages\[0\]\.content\[0\]\.text must be",
        ),
        (
            [{"role": "user", "content": "a", "name": object()}],
            r"messages\[0\]\.name must hold JSON",
        ),
    ],
)
def test_a_bad_conversation_is_refused_naming_the_message_and_field(messages, match):
    with pytest.raises(RequestError, match=match) as caught:
        check_messages(messages)
    assert caught.value.field == "messages" and "\n" not in str(caught.value)


def test_chat_template_kwargs_add_variables_but_replace_none_of_renders_own():
    template = ChatTemplate("{{ greeting }}{{ bos_token }}", "t", {"bos_token": "<s>"})
    assert template.render([{"role": "user", "content": "x"}], extra={"greeting": "hi"}) == "hi<s>"
    with pytest.raises(RequestError, match="may not set messages") as caught:
        template.render([{"role": "user", "content": "x"}], extra={"messages": []})
    assert caught.value.field == "chat_template_kwargs"


# ---------------------------------------------------------------- LLM.chat


@pytest.fixture(scope="module")
def chat_llm(tmp_path_factory):
    return LLM(chat_model(tmp_path_factory.mktemp("chat") / "model"))


def test_chat_equals_generate_of_the_rendered_texts_ids(chat_llm):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ROMEO, speak."},
    ]
    # The template, rendered by hand.
    rendered = f"SYSTEM:\nBe brief.{EOS}\nUSER:\nROMEO, speak.{EOS}\nASSISTANT:\n"
    params = SamplingParams(temperature=0, max_tokens=12)
    (out,) = chat_llm.chat(conversation, params)
    assert out.prompt == rendered
    assert out.prompt_token_ids == hf_ids(rendered) and 0 in out.prompt_token_ids
    (expected,) = chat_llm.generate([{"prompt_token_ids": hf_ids(rendered)}], params)
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert out.outputs[0].text == expected.outputs[0].text


def test_chat_takes_a_list_of_conversations_in_order_and_n_samples(chat_llm):
    conversations = [
        [{"role": "user", "content": "ROMEO:"}],
        [{"role": "user", "content": "JULIET:"}],
    ]
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=7, n=2)
    outs = chat_llm.chat(conversations, params)
    assert [out.prompt for out in outs] == [
        f"USER:\nROMEO:{EOS}\nASSISTANT:\n",
        f"USER:\nJULIET:{EOS}\nASSISTANT:\n",
    ]
    assert [len(out.outputs) for out in outs] == [2, 2]
    alone = chat_llm.chat(conversations[1], params)[0]
    assert [c.token_ids for c in outs[1].outputs] == [c.token_ids for c in alone.outputs]


def test_chat_without_the_generation_prompt_and_with_a_template_of_the_callers(chat_llm):
    (out,) = chat_llm.chat(
        [{"role": "user", "content": "x"}],
        SamplingParams(max_tokens=1),
        add_generation_prompt=False,
    )
    assert out.prompt == f"USER:\nx{EOS}\n"
    (out,) = chat_llm.chat(
        [{"role": "user", "content": "x"}],
        SamplingParams(max_tokens=1),
        chat_template="{{ eos_token }}[{{ messages[0].content }}]",
    )
    assert out.prompt == f"{EOS}[x]"


def test_chat_refusals_name_the_conversation(chat_llm):
    good = [{"role": "user", "content": "a"}]
    with pytest.raises(
        RequestError, match="refused this conversation: the system message must come first"
    ):
        chat_llm.chat(good + [{"role": "system", "content": "late"}])
    with pytest.raises(RequestError, match=r"conversation 1: messages\[0\]\.role"):
        chat_llm.chat([good, [{"role": "", "content": "b"}]])
    with pytest.raises(TypeError, match="messages must be a conversation"):
        chat_llm.chat("hello")


def test_chat_with_text_parts_equals_chat_with_their_joined_text(chat_llm):
    params = SamplingParams(temperature=0, max_tokens=8)
    parts = [{"type": "text", "text": "ROMEO,"}, {"type": "text", "text": "speak."}]
    (listed,) = chat_llm.chat([{"role": "user", "content": parts}], params)
    (joined,) = chat_llm.chat([{"role": "user", "content": "ROMEO,\nspeak."}], params)
    assert listed.prompt == f"USER:\nROMEO,\nspeak.{EOS}\nASSISTANT:\n" == joined.prompt
    assert listed.prompt_token_ids == hf_ids(joined.prompt)
    assert listed.outputs[0].token_ids == joined.outputs[0].token_ids


def test_chat_takes_the_content_format_and_refuses_a_bad_one(chat_llm):
    parts = [{"type": "text", "text": "x"}]
    (out,) = chat_llm.chat(
        [{"role": "user", "content": parts}],
        SamplingParams(max_tokens=1),
        chat_template_content_format="openai",
    )
    # The test template prints the content as it gets it: the list.
    assert out.prompt == f"USER:\n[{{'type': 'text', 'text': 'x'}}]{EOS}\nASSISTANT:\n"
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    (out,) = chat_llm.chat(
        [{"role": "user", "content": two}],
        SamplingParams(max_tokens=1),
        chat_template="{% for m in messages %}{% for p in m.content %}<{{ p }}>{% endfor %}{% endfor %}",
        chat_template_content_format="string",
    )
    # "string" on a template that loops: it loops over the joined text's characters.
    assert out.prompt == "<a><\n><b>"
    with pytest.raises(RequestError, match="chat_template_content_format must be one of"):
        chat_llm.chat([{"role": "user", "content": "x"}], chat_template_content_format="list")


def test_a_model_without_a_template_refuses_chat_saying_so():
    with pytest.raises(RequestError, match="no chat template"):
        LLM().chat([{"role": "user", "content": "x"}])


def test_chat_on_a_llama_folder_equals_transformers_ids_and_greedy_tokens():
    """chat_expected.json, by transformers: apply_chat_template(tokenize=True) ids (the template's BOS once,
    none added by encoding) and the greedy tokens generate() gave from them."""
    expected = json.loads((CHAT_FIXTURE / "chat_expected.json").read_text(encoding="utf-8"))
    llm = LLM(CHAT_FIXTURE)
    for prompt in expected["prompts"]:
        params = SamplingParams(temperature=0, max_tokens=len(prompt["greedy_ids"]))
        (out,) = llm.chat(prompt["messages"], params)
        assert out.prompt_token_ids == prompt["prompt_ids"]
        assert out.outputs[0].token_ids == prompt["greedy_ids"]
        assert out.outputs[0].text == prompt["greedy_text"]


def test_a_role_the_template_knows_passes_through_as_in_transformers():
    """Llama 3.1's template renders an "ipython" message (a tool's output); transformers and vLLM
    pass any role to the template, and so does minirt."""
    from minirt.chat_template import check_messages

    checked = check_messages([{"role": "ipython", "content": "42"}])
    assert checked == [{"role": "ipython", "content": "42"}]
