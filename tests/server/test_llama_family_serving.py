"""`minirt serve --model FOLDER` on Llama-family folders, through OpenAI's own client: a chat
answer is transformers' greedy answer to the same conversation (its own chat template, rendered
and run by transformers: the fixture's chat_expected.json), streamed or whole; a completion's
prompt is encoded as transformers' tokenizer(text) encodes it (BOS added) and its first token is
transformers' pick; a conversation the template refuses is a 400 with the template's words."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer
from serving import Server, serve_tests

from conftest import FIXTURES

pytestmark = serve_tests

# The texts the fixtures' seq_0.. were encoded from (tools/fixtures/llama_fixtures.py).
TEXTS = ["Hello world, how are you today?", "Café 日本語 😀"]


@pytest.fixture(scope="module", params=["llama_chat_byte_level", "mistral_chat_byte_fallback"])
def served(request):
    folder = FIXTURES / request.param
    with Server("--model", str(folder), "--served-model-name", request.param) as running:
        yield folder, running, request.param
        assert running.stop() == 0


def test_a_chat_answer_is_transformers_greedy_answer(served):
    folder, server, name = served
    client = server.client()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    expected = json.loads((folder / "chat_expected.json").read_text(encoding="utf-8"))
    for case in expected["prompts"]:
        n = 12
        answer = client.chat.completions.create(
            model=name, messages=case["messages"], max_tokens=n, temperature=0.0
        )
        want = case["greedy_ids"][:n]
        stop_at = [i for i, token in enumerate(want) if token in ends_of(folder)]
        if stop_at:
            want = want[: stop_at[0]]
        assert answer.usage.prompt_tokens == len(case["prompt_ids"]), name
        assert answer.usage.completion_tokens == len(want) + bool(stop_at), name
        choice = answer.choices[0]
        assert choice.message.content == tokenizer.decode(want, skip_special_tokens=False), name
        assert choice.message.role == "assistant"
        assert choice.finish_reason == ("stop" if stop_at else "length")
        # The same text streamed, piece by piece.
        stream = client.chat.completions.create(
            model=name, messages=case["messages"], max_tokens=n, temperature=0.0, stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert "".join(pieces) == choice.message.content, name


def ends_of(folder) -> set[int]:
    """Every end id the model's generation_config.json and config.json name."""
    ids = set()
    for file in ("generation_config.json", "config.json"):
        value = json.loads((folder / file).read_text())["eos_token_id"]
        ids |= set(value if isinstance(value, list) else [value])
    return ids


def test_a_completion_encodes_as_transformers_and_picks_its_first_token(served):
    folder, server, name = served
    client = server.client()
    expected = np.load(folder / "expected.npz")
    for b, text in enumerate(TEXTS):
        sequence = expected[f"seq_{b}"]
        answer = client.completions.create(
            model=name, prompt=text, max_tokens=1, temperature=0, logprobs=1
        )
        assert answer.usage.prompt_tokens == len(sequence)
        first = int(expected["logits"][b, len(sequence) - 1].argmax())
        # vLLM's /tokenize: the ids transformers' tokenizer(text) gives.
        tokenized = httpx.post(f"{server.url}/tokenize", json={"prompt": text}).json()
        assert tokenized["tokens"] == sequence.tolist()
        top = answer.choices[0].logprobs.top_logprobs[0]
        picked = httpx.post(f"{server.url}/detokenize", json={"tokens": [first]}).json()
        assert list(top) == [picked["prompt"]] or first in ends_of(folder)


def test_a_conversation_the_template_refuses_is_a_400_in_its_words(served):
    folder, server, name = served
    client = server.client()
    if name != "mistral_chat_byte_fallback":
        pytest.skip("the [INST] template is the one that raises")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            max_tokens=2,
        )
    assert refused.value.status_code == 400
    assert "alternate" in str(refused.value)
