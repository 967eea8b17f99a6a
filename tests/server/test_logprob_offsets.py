"""Completions' `text_offset`, through OpenAI's own client, on GPT-2 (the shipped model), Llama 3's
byte-level BPE and Mistral's SentencePiece with byte fallback (both with a BOS the tokenizer adds):
with echo or not, whole or streamed, every offset indexes the choice's text where its token's
string starts, and the offsets never go down.

vLLM's text with echo is the prompt as sent followed by the completion; its offsets are the
running sum of the token strings' lengths, which counts a BOS's string ("<|begin_of_text|>") that
the text does not hold.  minirt keeps vLLM's text and places each token where its string is in it:
a token the tokenizer added sits where the text after it starts (0 for a BOS), and so does the
leading space a SentencePiece decoder strips from a text's first piece.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES
from serving import Server, serve_tests

pytestmark = serve_tests

MODELS = {
    "gpt2": (),
    "llama_chat_byte_level": ("--model", str(FIXTURES / "llama_chat_byte_level")),
    "mistral_chat_byte_fallback": ("--model", str(FIXTURES / "mistral_chat_byte_fallback")),
}
# Text with spaces, with characters spelled in several tokens (byte pieces, GPT-2's bytes) and
# with a leading space.
PROMPTS = ["Hello", "Café 日本語 😀 ok", " the sea, the sea"]


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request):
    with Server(*MODELS[request.param], "--served-model-name", request.param) as running:
        yield running, request.param
        assert running.stop() == 0


def added_in_front(name: str) -> int:
    """How many tokens the model's tokenizer puts in front of a prompt (its BOS)."""
    return 0 if name == "gpt2" else 1


def check_offsets(text: str, tokens: list[str], offsets: list[int], skip: int, prepends: bool):
    """Nondecreasing offsets into `text`, each where its token's string is.  The first `skip`
    tokens (a BOS) are not in the text; nor is the space SentencePiece puts in front of a prompt
    that has none (`prepends`: the next token's first space, or that token if a lone space); nor
    is a piece of a character (U+FFFD)."""
    assert offsets == sorted(offsets)
    assert all(0 <= offset <= len(text) for offset in offsets)
    checked = 0
    for k, (token, offset) in enumerate(zip(tokens, offsets, strict=True)):
        if k < skip:
            assert offset == 0
            continue
        wanted = token
        if prepends and k == skip and not text.startswith(" "):
            assert token.startswith(" ")
            wanted = token[1:]
        if "\ufffd" in wanted:
            continue
        assert text[offset : offset + len(wanted)] == wanted, (k, token, offset, text)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("echo", [True, False], ids=["echo", "no-echo"])
def test_every_offset_indexes_the_text_where_its_token_is(served, echo):
    server, name = served
    client = server.client()
    for prompt in PROMPTS:
        answer = client.completions.create(
            model=name, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, echo=echo
        )
        choice = answer.choices[0]
        logprobs = choice.logprobs
        tokens = logprobs.tokens
        if choice.finish_reason == "stop":
            # The end token's text is not in the choice's.
            tokens = tokens[:-1]
        offsets = logprobs.text_offset[: len(tokens)]
        if echo:
            assert choice.text.startswith(prompt)
            n_prompt = len(tokens) - len(choice.model_extra["minirt"]["token_ids"])
            assert logprobs.text_offset[n_prompt] == len(prompt)
            skip = added_in_front(name)
            prepends = name == "mistral_chat_byte_fallback"
        else:
            skip, prepends = 0, False
        check_offsets(choice.text, tokens, offsets, skip, prepends)


def test_a_streamed_choices_offsets_index_its_streamed_text(served):
    """Streamed (echo with logprobs is not: a 400), each token's chunk gives its offset."""
    server, name = served
    client = server.client()
    for prompt in PROMPTS:
        chunks = client.completions.create(
            model=name, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, stream=True
        )
        choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
        text = "".join(choice.text for choice in choices)
        tokens, offsets = [], []
        for choice in choices:
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
        if choices[-1].finish_reason == "stop":
            tokens, offsets = tokens[:-1], offsets[:-1]
        assert offsets[0] == 0
        check_offsets(text, tokens, offsets, skip=0, prepends=False)
