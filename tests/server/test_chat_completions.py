"""`POST /v1/chat/completions` of a real `minirt serve`, through OpenAI's own client and raw HTTP: whole and
streamed answers, n samples, logprobs and usage, each held to the offline `LLM.chat` of the same conversation
(which tests/loading/test_chat_template.py holds to `LLM.generate` of the independently rendered text), and
its refusals in OpenAI's error shape."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serving import Server, serve_tests
from chat_models import EOS, chat_model, hf_ids
from conftest import FIXTURES, completions

from minirt import LLM, SamplingParams

pytestmark = serve_tests

NAME = "chat-tiny"
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "ROMEO, speak."},
]
RENDERED = f"SYSTEM:\nBe brief.{EOS}\nUSER:\nROMEO, speak.{EOS}\nASSISTANT:\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("chat_server") / "model")


@pytest.fixture(scope="module")
def server(folder):
    with Server("--model", str(folder), "--served-model-name", NAME) as running:
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(folder)


def offline(llm, params, conversation=CONVERSATION):
    return completions(llm.chat(conversation, params), top_n=params.logprobs)


def test_a_whole_answer_equals_the_offline_chat(client, llm):
    response = client.chat.completions.create(
        model=NAME, messages=CONVERSATION, max_tokens=12, temperature=0
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    (choice,) = response.choices
    (expected,) = offline(llm, SamplingParams(temperature=0, max_tokens=12))
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert choice.model_extra["minirt"]["token_ids"] == expected.token_ids
    # The prompt's tokens: the rendered text's, by the tokenizers library alone.
    assert response.usage.prompt_tokens == len(hf_ids(RENDERED))
    assert response.usage.completion_tokens == len(expected.token_ids)
    assert response.usage.total_tokens == len(hf_ids(RENDERED)) + len(expected.token_ids)


def test_a_streamed_answer_opens_with_the_role_and_adds_up_to_the_whole(client, llm):
    stream = client.chat.completions.create(
        model=NAME,
        messages=CONVERSATION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    first = chunks[0].choices[0]
    assert (
        first.delta.role == "assistant"
        and first.delta.content == ""
        and first.finish_reason is None
    )
    (expected,) = offline(llm, SamplingParams(temperature=0, max_tokens=12))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected.text
    finishes = [
        chunk.choices[0].finish_reason
        for chunk in chunks
        if chunk.choices and chunk.choices[0].finish_reason
    ]
    assert finishes == [expected.finish_reason]
    # Every chunk has a usage, null until the last, which has no choices.
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        expected.token_ids
    )
    assert chunks[-1].usage.prompt_tokens == len(hf_ids(RENDERED))


def test_n_seeded_samples_equal_offline_ones(client, llm):
    response = client.chat.completions.create(
        model=NAME, messages=CONVERSATION, max_tokens=10, temperature=1.0, seed=11, n=2
    )
    expected = offline(llm, SamplingParams(temperature=1.0, max_tokens=10, seed=11, n=2))
    assert [c.index for c in response.choices] == [0, 1]
    assert [c.message.content for c in response.choices] == [e.text for e in expected]
    assert expected[0].token_ids != expected[1].token_ids
    # The prompt once, whatever n is.
    assert response.usage.prompt_tokens == len(hf_ids(RENDERED))
    assert response.usage.completion_tokens == sum(len(e.token_ids) for e in expected)


def test_a_streamed_n_gives_each_choice_its_role_first(server):
    body = {
        "model": NAME,
        "messages": CONVERSATION,
        "max_tokens": 4,
        "n": 2,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    for index in (0, 1):
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"][0]["index"] == index]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert all("role" not in delta for delta in deltas[1:])
        # Each choice ends once, with its reason: a stream does not stop at the first choice's end.
        reasons = [
            e["choices"][0]["finish_reason"] for e in events if e["choices"][0]["index"] == index
        ]
        assert [r for r in reasons if r is not None] == ["length"]


def test_logprobs_and_top_logprobs_equal_offline_ones(client, llm):
    response = client.chat.completions.create(
        model=NAME,
        messages=CONVERSATION,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    (expected,) = offline(llm, SamplingParams(temperature=0, max_tokens=8, logprobs=3))
    content = response.choices[0].logprobs.content
    assert len(content) == len(expected.token_ids)
    for entry, token, logprob, top in zip(
        content, expected.token_ids, expected.logprobs, expected.top_logprobs, strict=True
    ):
        assert entry.logprob == pytest.approx(logprob, abs=1e-6)
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == llm.tokenizer.decode([token])
        # Exactly top_logprobs alternatives (OpenAI's chat: N, not N + 1), most likely first.
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            [lp for _, lp in top], abs=1e-6
        )
        assert [t.token for t in entry.top_logprobs] == [llm.tokenizer.decode([t]) for t, _ in top]


def test_streamed_logprobs_equal_the_whole_answers(client):
    whole = client.chat.completions.create(
        model=NAME, messages=CONVERSATION, max_tokens=6, temperature=0, logprobs=True
    )
    stream = client.chat.completions.create(
        model=NAME, messages=CONVERSATION, max_tokens=6, temperature=0, logprobs=True, stream=True
    )
    streamed = [
        e
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob, e.top_logprobs) for e in streamed] == [
        (e.token, e.logprob, e.top_logprobs) for e in whole.choices[0].logprobs.content
    ]
    assert all(e.top_logprobs == [] for e in streamed)


def test_max_completion_tokens_and_stop_as_the_completions_route_takes_them(client, llm):
    response = client.chat.completions.create(
        model=NAME,
        messages=CONVERSATION,
        max_completion_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert response.usage.completion_tokens == 5 and response.choices[0].finish_reason == "length"
    (expected,) = offline(llm, SamplingParams(temperature=0, max_tokens=30))
    stop = expected.text[3:5]
    response = client.chat.completions.create(
        model=NAME, messages=CONVERSATION, max_tokens=30, temperature=0, stop=[stop]
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == expected.text[: expected.text.index(stop)]


@pytest.mark.parametrize(
    ("changes", "param", "words"),
    [
        ({"messages": []}, "messages", "messages is empty"),
        (
            {"messages": [{"role": "", "content": "x"}]},
            "messages",
            "messages[0].role is empty",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]},
            "messages",
            "the system message must come first",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages",
            "messages[0].content[0].type is 'image_url': minirt reads text alone",
        ),
        ({"messages": "hi"}, "messages", "messages"),
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ({"max_completion_tokens": 1000}, "max_completion_tokens", "lower max_completion_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens"),
        ({"tools": []}, "tools", "unknown field 'tools'"),
        ({"n": 0}, "n", "n must be from 1"),
        ({"temperature": "hot"}, "temperature", "temperature"),
        ({"chat_template_kwargs": {"messages": 1}}, "chat_template_kwargs", "may not set messages"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages", "context"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(server, changes, param, words):
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        **changes,
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"] and "\n" not in error["message"]


def test_the_openai_client_raises_a_bad_request_with_the_templates_words(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "x"}, {"role": "system", "content": "late"}],
            max_tokens=2,
        )
    assert caught.value.status_code == 400
    assert (
        "refused this conversation: the system message must come first"
        in caught.value.body["message"]
    )


def test_a_model_with_no_template_keeps_its_400(tmp_path):
    with Server("--model", str(chat_model(tmp_path / "plain", template=None))) as running:
        with pytest.raises(openai.BadRequestError) as caught:
            running.client().chat.completions.create(model="plain", messages=CONVERSATION)
        assert "no chat template" in caught.value.body["message"]
        assert running.stop() == 0


# ---------------------------------------------------------------- content as a list of text parts


def text_parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": text} for text in texts]


@pytest.fixture(scope="module")
def llama_server():
    folder = FIXTURES / "llama_chat_byte_level"
    with Server("--model", str(folder), "--served-model-name", "llama") as running:
        yield running
        assert running.stop() == 0


def test_text_parts_from_the_openai_client_get_the_answer_of_their_joined_text(llama_server):
    """Llama 3's template reads a string: the parts reach it joined with "\n" (vLLM's join), so
    the answer is the one the joined string gets, token for token."""
    client = llama_server.client()
    listed = [
        {"role": "system", "content": text_parts("You are terse.", "Answer briefly.")},
        {"role": "user", "content": text_parts("What is", "2 + 2?")},
    ]
    joined = [
        {"role": "system", "content": "You are terse.\nAnswer briefly."},
        {"role": "user", "content": "What is\n2 + 2?"},
    ]
    answers = [
        client.chat.completions.create(
            model="llama", messages=messages, max_tokens=8, temperature=0
        )
        for messages in (listed, joined)
    ]
    assert answers[0].usage.prompt_tokens == answers[1].usage.prompt_tokens
    ids = [answer.choices[0].model_extra["minirt"]["token_ids"] for answer in answers]
    assert ids[0] == ids[1] and len(ids[0]) > 0
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content


def test_an_image_part_from_the_openai_client_is_a_400_naming_it(llama_server):
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        llama_server.client().chat.completions.create(
            model="llama", messages=[{"role": "user", "content": content}], max_tokens=2
        )
    assert caught.value.status_code == 400 and caught.value.body["param"] == "messages"
    message = caught.value.body["message"]
    assert "messages[0].content[1].type is 'image_url'" in message and "\n" not in message


def test_the_content_format_flag_overrides_the_templates_own(client, folder):
    """The test template prints the content as it gets it: by default the joined text; with
    --chat-template-content-format openai, the list of parts."""
    messages = [{"role": "user", "content": text_parts("x")}]
    answer = client.chat.completions.create(model=NAME, messages=messages, max_tokens=1)
    assert answer.usage.prompt_tokens == len(hf_ids(f"USER:\nx{EOS}\nASSISTANT:\n"))
    listed = f"USER:\n[{{'type': 'text', 'text': 'x'}}]{EOS}\nASSISTANT:\n"
    flag = ("--chat-template-content-format", "openai")
    with Server("--model", str(folder), "--served-model-name", NAME, *flag) as running:
        answer = running.client().chat.completions.create(
            model=NAME, messages=messages, max_tokens=1
        )
        assert answer.usage.prompt_tokens == len(hf_ids(listed))
        assert running.stop() == 0


def test_a_bad_content_format_flag_is_one_line(capsys):
    from minirt.serve import main

    with pytest.raises(SystemExit) as caught:
        main(["--chat-template-content-format", "json"], prog="minirt serve")
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--chat-template-content-format" in error
    assert "invalid choice: 'json'" in error
