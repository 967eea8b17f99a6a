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
        with pytest.raises(RequestError, match=rf"messages\[{part[0]}\]\.content\[{part[1]}\]"):
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
            [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
            r"messages\[1\]\.role must be one of",
        ),
        ([{"role": "user", "content": 5}], r"messages\[0\]\.content must be a string or a list"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            r"messages\[0\]\.content\[0\] must be a text part",
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
        chat_llm.chat([good, [{"role": "robot", "content": "b"}]])
    with pytest.raises(TypeError, match="messages must be a conversation"):
        chat_llm.chat("hello")


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
