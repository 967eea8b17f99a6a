"""`minirt serve` through OpenAI's own Python client: completions whole and streamed, n samples, logprobs,
stop strings, usage, and the errors the client raises, each held to the offline `LLM.generate` of the same
request (for the numbers) or to OpenAI's documented shapes (for the errors)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import FIXTURES
from serving import Server, offline_alone, serve_tests
from tokenizers import Tokenizer as HFTokenizer

from minirt import LLM, SamplingParams
from minirt.loading.checkpoint import shipped_model_folder

pytestmark = serve_tests

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "To be, or not to be"]


@pytest.fixture(scope="module")
def server():
    with Server() as running:
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def llm():
    return LLM()


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The model folder's tokenizer through the `tokenizers` library alone, not minirt's."""
    return HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))


def test_greedy_completions_of_several_prompts_equal_offline_ones(client, llm):
    response = client.completions.create(
        model="shakespeare-gpt2-tiny", prompt=PROMPTS, max_tokens=20, temperature=0
    )
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    assert [c.index for c in response.choices] == [0, 1, 2]
    prompt_tokens = 0
    completion_tokens = 0
    for choice, prompt in zip(response.choices, PROMPTS, strict=True):
        (expected,) = offline_alone(llm, prompt, SamplingParams(max_tokens=20, temperature=0.0))
        assert choice.text == expected.text
        assert choice.finish_reason == expected.finish_reason
        assert choice.model_extra["minirt"]["token_ids"] == expected.token_ids
        prompt_tokens += len(expected.prompt_token_ids)
        completion_tokens += len(expected.token_ids)
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.completion_tokens == completion_tokens
    assert response.usage.total_tokens == prompt_tokens + completion_tokens


def test_max_tokens_defaults_to_16_as_openai(client):
    response = client.completions.create(
        model="shakespeare-gpt2-tiny",
        prompt="ROMEO:",
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert response.usage.completion_tokens == 16 and response.choices[0].finish_reason == "length"


def test_n_seeded_samples_equal_offline_ones_and_differ_from_each_other(client, llm):
    response = client.completions.create(
        model="shakespeare-gpt2-tiny",
        prompt="ROMEO:",
        max_tokens=24,
        temperature=0.9,
        top_p=0.95,
        seed=7,
        n=2,
    )
    expected = offline_alone(
        llm, "ROMEO:", SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=7, n=2)
    )
    got = [c.model_extra["minirt"]["token_ids"] for c in response.choices]
    assert got == [e.token_ids for e in expected]
    assert [c.text for c in response.choices] == [e.text for e in expected]
    assert got[0] != got[1]


def test_logprobs_match_offline_within_1e5_in_openai_shape(client, llm, hf_tokenizer):
    response = client.completions.create(
        model="shakespeare-gpt2-tiny", prompt="ROMEO:", max_tokens=12, temperature=0, logprobs=3
    )
    (expected,) = offline_alone(
        llm, "ROMEO:", SamplingParams(max_tokens=12, logprobs=3, temperature=0.0)
    )
    logprobs = response.choices[0].logprobs
    ids = expected.token_ids
    # Each token decoded alone; its offset is where its text starts (decoded by `tokenizers` itself).
    assert logprobs.tokens == [hf_tokenizer.decode([t]) for t in ids]
    assert logprobs.text_offset == [len(hf_tokenizer.decode(ids[:k])) for k in range(len(ids))]
    assert logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    for step, top in zip(logprobs.top_logprobs, expected.top_logprobs, strict=True):
        wanted = {hf_tokenizer.decode([t]): lp for t, lp in top}
        # OpenAI: the N most likely, and the chosen token (here the argmax, so one of them).
        assert step.keys() == wanted.keys()
        assert list(step.values()) == pytest.approx(list(wanted.values()), abs=1e-5)


def test_echo_with_logprobs_gives_the_prompt_first(client, llm, hf_tokenizer):
    response = client.completions.create(
        model="shakespeare-gpt2-tiny",
        prompt="ROMEO:",
        max_tokens=4,
        temperature=0,
        logprobs=0,
        echo=True,
    )
    (expected,) = offline_alone(
        llm, "ROMEO:", SamplingParams(max_tokens=4, logprobs=0, prompt_logprobs=0, temperature=0.0)
    )
    choice = response.choices[0]
    assert choice.text == "ROMEO:" + expected.text
    prompt_ids = expected.prompt_token_ids
    assert choice.logprobs.tokens == [
        hf_tokenizer.decode([t]) for t in prompt_ids + expected.token_ids
    ]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        expected.prompt_logprobs[1:] + expected.logprobs, abs=1e-5
    )
    assert choice.logprobs.text_offset[len(prompt_ids)] == len("ROMEO:")
    # logprobs 0: no alternatives, but OpenAI always gives the chosen token's own (the prompt's first: null).
    tops = choice.logprobs.top_logprobs
    assert tops[0] is None
    every_id = prompt_ids + expected.token_ids
    every_logprob = [None] + expected.prompt_logprobs[1:] + expected.logprobs
    for top, token, logprob in zip(tops[1:], every_id[1:], every_logprob[1:], strict=True):
        assert top == {hf_tokenizer.decode([token]): pytest.approx(logprob, abs=1e-5)}


def streamed(client, **kwargs) -> tuple[list, list]:
    chunks = list(client.completions.create(model="shakespeare-gpt2-tiny", stream=True, **kwargs))
    texts = [c.choices[0].text for c in chunks if c.choices]
    return chunks, texts


@pytest.mark.parametrize(
    "stop", [["\n"], [" the", "."], ["e"]], ids=["newline", "two", "one-letter"]
)
def test_a_stream_is_the_offline_text_cut_at_its_stop_string_never_half_sent(client, llm, stop):
    for prompt in PROMPTS:
        params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, stop=tuple(stop))
        (expected,) = offline_alone(llm, prompt, params)
        chunks, texts = streamed(
            client, prompt=prompt, max_tokens=40, temperature=0.8, seed=3, stop=stop
        )
        assert "".join(texts) == expected.text
        # Sent text is never taken back: no piece holds the stop string, nor does the whole.
        assert not any(s in "".join(texts) for s in stop)
        assert chunks[-1].choices[0].finish_reason == expected.finish_reason
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_include_usage_ends_the_stream_with_a_usage_chunk(client, llm):
    chunks, _ = streamed(
        client,
        prompt=["ROMEO:", "JULIET:"],
        max_tokens=6,
        temperature=0,
        n=2,
        stream_options={"include_usage": True},
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    expected = [
        offline_alone(llm, p, SamplingParams(max_tokens=6, temperature=0.0))[0]
        for p in ["ROMEO:", "JULIET:"]
    ]
    # Each prompt counted once, each of the four choices' tokens.
    assert last.usage.prompt_tokens == sum(len(e.prompt_token_ids) for e in expected)
    assert last.usage.completion_tokens == 2 * sum(len(e.token_ids) for e in expected)
    assert all(c.usage is None for c in chunks[:-1])
    finals = {c.choices[0].index: c.choices[0] for c in chunks[:-1] if c.choices[0].finish_reason}
    assert sorted(finals) == [0, 1, 2, 3]


def test_a_streamed_choice_with_logprobs_sends_each_tokens_own(client, llm):
    chunks, _ = streamed(client, prompt="ROMEO:", max_tokens=8, temperature=0, logprobs=2)
    (expected,) = offline_alone(
        llm, "ROMEO:", SamplingParams(max_tokens=8, logprobs=2, temperature=0.0)
    )
    token_logprobs = [
        lp
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert token_logprobs == pytest.approx(expected.logprobs, abs=1e-5)


BAD_REQUESTS = [
    ({"n": 0}, "n"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt": [4096]}, "prompt"),  # the shipped model's vocabulary is 4096 tokens
    ({"prompt": [1] * 300}, "prompt"),  # its context is 256
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"best_of": 2}, "best_of"),
    ({"suffix": "x"}, "suffix"),
    ({"extra_body": {"temperature": "hot"}}, "temperature"),
    ({"extra_body": {"not_a_field": 1}}, "not_a_field"),
    ({"extra_body": {"min_tokens": 3}}, "min_tokens"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"extra_body": {"stop_token_ids": [5000]}}, "stop_token_ids"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"seed": -1}, "seed"),
    ({"prompt": []}, "prompt"),
]


@pytest.mark.parametrize("change, param", BAD_REQUESTS, ids=[p for _, p in BAD_REQUESTS])
def test_a_bad_field_is_a_bad_request_error_naming_it(client, change, param):
    import openai

    kwargs = {"model": "shakespeare-gpt2-tiny", "prompt": "ROMEO:", "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**kwargs)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "Traceback" not in error["message"] and "\n" not in error["message"]


def test_an_unknown_model_is_not_found(client):
    import openai

    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="ROMEO:", max_tokens=2)
    assert caught.value.body["param"] == "model" and "gpt-4" in caught.value.body["message"]


def test_chat_completions_are_refused_saying_why(client):
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="shakespeare-gpt2-tiny", messages=[{"role": "user", "content": "hi"}]
        )
    assert "chat template" in caught.value.body["message"]


def test_with_an_api_key_every_v1_path_needs_it_and_health_stays_open():
    import openai

    with Server("--api-key", "sk-test") as server:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").completions.create(
                model="shakespeare-gpt2-tiny", prompt="x", max_tokens=1
            )
        for path in ("/v1/models", "/v1/completions", "/v1/no-such-path"):
            answer = httpx.post(f"{server.url}{path}", json={"prompt": "x"})
            assert (
                answer.status_code == 401
                and answer.json()["error"]["type"] == "authentication_error"
            )
        assert httpx.get(f"{server.url}/health").status_code == 200
        ok = server.client(api_key="sk-test").completions.create(
            model="shakespeare-gpt2-tiny", prompt="x", max_tokens=1
        )
        assert len(ok.choices) == 1
        assert server.stop() == 0


def test_logprobs_on_a_model_without_a_tokenizer_name_tokens_as_vllm_does():
    body = {
        "prompt": [1, 2, 3],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
    }
    with Server("--model", str(FIXTURES / "untied_head")) as server:
        whole = httpx.post(f"{server.url}/v1/completions", json=body).json()
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**body, "stream": True}
        ) as answer:
            events = [
                json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")
            ]
        assert server.stop() == 0
    (expected,) = offline_alone(
        LLM(FIXTURES / "untied_head"),
        [1, 2, 3],
        SamplingParams(max_tokens=5, logprobs=1, ignore_eos=True, temperature=0.0),
    )
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    assert logprobs["token_logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
    assert logprobs["text_offset"] == [0] * 5
    streamed = [
        lp
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for lp in e["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert streamed == pytest.approx(expected.logprobs, abs=1e-5)


def test_vllms_top_k_of_minus_1_is_no_top_k_as_0_and_leaving_it_out_are(client, llm):
    """vLLM documents top_k -1 as "consider all tokens"; minirt's server takes it as minirt's 0
    (docs/serving.md, the completions table: "-1 or 0 is off").  Seeded and sampled at temperature 1, a
    completion with top_k -1, 0 or no top_k is the offline request with top_k 0, token for token;
    top_k 1 is greedy, which these draws are not."""
    asked = {"model": "shakespeare-gpt2-tiny", "prompt": "ROMEO:", "max_tokens": 20}
    sampled = {"temperature": 1.0, "seed": 11}
    (expected,) = offline_alone(
        llm, "ROMEO:", SamplingParams(max_tokens=20, temperature=1.0, seed=11, top_k=0)
    )
    (greedy,) = offline_alone(llm, "ROMEO:", SamplingParams(max_tokens=20, temperature=0.0))
    assert expected.token_ids != greedy.token_ids
    for top_k in ({"top_k": -1}, {"top_k": 0}, {}):
        response = client.completions.create(**asked, **sampled, extra_body=top_k)
        choice = response.choices[0]
        assert choice.model_extra["minirt"]["token_ids"] == expected.token_ids, top_k
        assert choice.text == expected.text
    response = client.completions.create(**asked, **sampled, extra_body={"top_k": 1})
    assert response.choices[0].model_extra["minirt"]["token_ids"] == greedy.token_ids
