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
        assert choice.message.content == grown_by(tokenizer, case["prompt_ids"], want), name
        assert choice.message.role == "assistant"
        assert choice.finish_reason == ("stop" if stop_at else "length")
        # The same text streamed, piece by piece.
        stream = client.chat.completions.create(
            model=name, messages=case["messages"], max_tokens=n, temperature=0.0, stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert "".join(pieces) == choice.message.content, name


def grown_by(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> str:
    """What the text of the prompt's ids grows by with `ids`: a completion's text, as vLLM and
    transformers' decode(prompt + ids) past decode(prompt) give it (a SentencePiece completion's
    first piece keeps its space, which decoding it alone would strip)."""
    before = tokenizer.decode(prompt, skip_special_tokens=False)
    after = tokenizer.decode(prompt + ids, skip_special_tokens=False)
    assert after.startswith(before)
    return after[len(before) :]


def token_string(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's string in logprobs: its vocabulary piece, "▁" as a space and a byte piece as
    its byte (vLLM's); a byte-level token decoded alone."""
    piece = tokenizer.id_to_token(token_id)
    if json.loads(tokenizer.to_str())["decoder"]["type"] == "ByteLevel":
        return tokenizer.decode([token_id], skip_special_tokens=False)
    if len(piece) == 6 and piece.startswith("<0x"):
        return bytes([int(piece[3:5], 16)]).decode("utf-8", errors="replace")
    return piece.replace("▁", " ")


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
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        assert list(top) == [token_string(tokenizer, first)] or first in ends_of(folder)


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


def test_a_completion_starting_with_a_spaced_piece_keeps_its_space():
    """The reviewer's case on Mistral's SentencePiece: "▁it" forced twice after "Hello" is the text
    " it it" (transformers' decode(prompt + generated) past decode(prompt); vLLM's), not "it it";
    its logprobs' strings are " it" and their offsets index that text; chat's bytes, joined, are
    the content's."""
    folder = FIXTURES / "mistral_chat_byte_fallback"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    it = tokenizer.token_to_id("▁it")
    with Server("--model", str(folder), "--served-model-name", "mistral") as server:
        client = server.client()
        answer = client.completions.create(
            model="mistral",
            prompt="Hello",
            max_tokens=2,
            temperature=0,
            logprobs=1,
            logit_bias={str(it): 100},
        )
        choice = answer.choices[0]
        prompt = tokenizer.encode("Hello").ids
        assert choice.model_extra["minirt"]["token_ids"] == [it, it]
        assert choice.text == grown_by(tokenizer, prompt, [it, it]) == " it it"
        assert choice.logprobs.tokens == [" it", " it"]
        assert choice.logprobs.text_offset == [0, 3]
        streamed = client.completions.create(
            model="mistral",
            prompt="Hello",
            max_tokens=2,
            temperature=0,
            logprobs=1,
            logit_bias={str(it): 100},
            stream=True,
        )
        chunks = [chunk.choices[0] for chunk in streamed if chunk.choices]
        assert "".join(c.text for c in chunks) == " it it"
        offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
        assert offsets == [0, 3]
        echoed = client.completions.create(
            model="mistral",
            prompt="Hello",
            max_tokens=2,
            temperature=0,
            logprobs=1,
            logit_bias={str(it): 100},
            echo=True,
        ).choices[0]
        assert echoed.text == "Hello it it"
        assert echoed.logprobs.tokens == ["<s>", " ", "Hel", "lo", " it", " it"]
        assert echoed.logprobs.text_offset == [0, 0, 0, 3, 5, 8]
        # A stop string cuts the text: the tokens past the cut start where it ends.
        cut = client.completions.create(
            model="mistral",
            prompt="Hello",
            max_tokens=2,
            temperature=0,
            logprobs=1,
            logit_bias={str(it): 100},
            stop=[" it it"],
        ).choices[0]
        assert cut.text == "" and cut.logprobs.text_offset == [0, 0]
        chat = client.chat.completions.create(
            model="mistral",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=2,
            temperature=0,
            logprobs=True,
            logit_bias={str(it): 100},
        )
        content = chat.choices[0].logprobs.content
        assert chat.choices[0].message.content == " it it"
        assert [entry.token for entry in content] == [" it", " it"]
        assert b"".join(bytes(entry.bytes) for entry in content) == b" it it"
        assert server.stop() == 0
