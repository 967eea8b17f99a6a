"""SentencePiece-style tokenizers with byte fallback (Llama 2's kind), against the tokenizers library.

The tokenizers are built by tools/fixtures/byte_fallback_tokenizer.py in three styles (a legacy
normalizer, a Metaspace pre-tokenizer, a Metaspace decoder); every expected text and id list
here is the library's own `decode(ids, skip_special_tokens=False)` / `encode(text)`.  The stream
(vLLM's incremental detokenization: a window from a prefix offset, emitted past a read offset)
must give exactly `decode(ids)` over any ids (byte pieces that make a character only together,
runs of them that are not UTF-8, special tokens, ids past the tokenizer's), hold a character's
bytes back until it is whole, and decode a short window per token, never all the ids.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
from byte_fallback_tokenizer import BYTE_PIECES, byte_fallback_tokenizer, write_tokenizer_folder
from hypothesis import given, settings
from hypothesis import strategies as st

from minirt.loading.tokenizer import Tokenizer, load_tokenizer

STYLES = ["legacy", "metaspace", "metaspace-decoder"]
# Ids past the tokenizer's, which the model has rows for (a padded vocabulary).
PAST = 3


@lru_cache(maxsize=None)
def library(style: str):
    return byte_fallback_tokenizer(style)


@lru_cache(maxsize=None)
def minirt_tokenizer(style: str) -> Tokenizer:
    hf = library(style)
    return Tokenizer(
        byte_fallback_tokenizer(style),
        source=style,
        eos_token_id=2,
        bos_token_id=1,
        model_vocab_size=hf.get_vocab_size(with_added_tokens=True) + PAST,
    )


def streamed(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    stream = tokenizer.stream()
    return [stream.push(i) for i in ids] + [stream.flush()]


def ids_of(style: str):
    """Any ids: byte pieces weighted up (runs of them, valid UTF-8 or not), special tokens, the
    trained pieces, and ids past the tokenizer's."""
    hf = library(style)
    size = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(piece) for piece in BYTE_PIECES]
    utf8_runs = st.text(min_size=1, max_size=3).map(
        lambda text: [byte_ids[b] for b in text.encode("utf-8")]
    )
    single = st.one_of(
        st.integers(0, size + PAST - 1),
        st.sampled_from(byte_ids),
        st.sampled_from([0, 1, 2, size - 2, size - 1]),
    )
    pieces = st.one_of(single.map(lambda i: [i]), utf8_runs)
    return st.lists(pieces, max_size=30).map(lambda runs: [i for run in runs for i in run])


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_stream_is_the_librarys_decode_of_any_ids(style, data):
    ids = data.draw(ids_of(style))
    tokenizer = minirt_tokenizer(style)
    expected = library(style).decode(ids, skip_special_tokens=False)
    assert tokenizer.decode(ids) == expected
    assert "".join(streamed(tokenizer, ids)) == expected


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_an_encoded_text_streams_whole_characters_only(style, text):
    tokenizer = minirt_tokenizer(style)
    ids = tokenizer.encode(text)
    assert ids == library(style).encode(text).ids
    pieces = streamed(tokenizer, ids)
    assert "".join(pieces) == library(style).decode(ids, skip_special_tokens=False)
    # A text that is valid UTF-8 never shows a half character as U+FFFD.
    assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("style", STYLES)
def test_byte_pieces_are_held_back_until_their_character_is_whole(style):
    tokenizer = minirt_tokenizer(style)
    ids = tokenizer.encode("the sea € ok", add_special_tokens=False)
    tokens = [library(style).id_to_token(i) for i in ids]
    assert "<0xE2>" in tokens and "<0x82>" in tokens, "€ must be spelled in byte pieces"
    pieces = streamed(tokenizer, ids)
    euro_at = tokens.index("<0xAC>")
    # Nothing while the bytes come; the character once a token after them closes the run.
    assert pieces[euro_at - 2 : euro_at + 1] == ["", "", ""]
    assert "€" in pieces[euro_at + 1]
    assert "".join(pieces) == "the sea € ok"


@pytest.mark.parametrize("style", STYLES)
def test_leading_spaces_inside_the_stream_are_kept(style):
    """Decoding each token alone would strip every piece's space (Metaspace, Strip); the stream
    strips only the text's first, as `decode` does."""
    tokenizer = minirt_tokenizer(style)
    ids = tokenizer.encode(" the sea, the sea", add_special_tokens=False)
    pieces = streamed(tokenizer, ids)
    assert "".join(pieces) == library(style).decode(ids)
    assert "".join(pieces).count(" ") >= 3


def test_each_push_decodes_a_short_window_not_every_id():
    """The cost of a push is its window's, not the text's: over 500 tokens of text, no decode
    sees more than a dozen ids, and all the decodes together a few times the ids."""
    tokenizer = minirt_tokenizer("legacy")
    ids = tokenizer.encode("Café, naïve € the sea of troubles 🤗. " * 30, add_special_tokens=False)
    assert len(ids) > 500
    seen: list[int] = []
    real_decode = tokenizer.decode

    def counting(window):
        seen.append(len(window))
        return real_decode(window)

    tokenizer.decode = counting  # type: ignore[method-assign]
    try:
        text = "".join(streamed(tokenizer, ids))
    finally:
        del tokenizer.decode
    assert text == real_decode(ids)
    assert max(seen) <= 12 and sum(seen) <= 6 * len(ids)


@pytest.mark.parametrize("style", STYLES)
def test_ids_past_the_tokenizer_have_no_text(style):
    tokenizer = minirt_tokenizer(style)
    size = library(style).get_vocab_size(with_added_tokens=True)
    euro = tokenizer.encode("€", add_special_tokens=False)
    # An id without a token between two byte pieces: the library drops it, and the run is one.
    ids = [*euro[:-1], size + 1, euro[-1], size]
    assert tokenizer.decode(ids) == library(style).decode(ids) == tokenizer.decode(euro)
    assert "".join(streamed(tokenizer, ids)) == tokenizer.decode(euro)


# ------------------------------------------------------------------ BOS, as transformers adds it


def test_encode_adds_the_post_processors_bos_unless_asked_not_to(tmp_path):
    folder = write_tokenizer_folder(tmp_path, "legacy")
    tokenizer = load_tokenizer(folder, eos_token_id=2, bos_token_id=1)
    hf = library("legacy")
    assert tokenizer.encode("the sea") == hf.encode("the sea").ids
    assert tokenizer.encode("the sea")[0] == 1
    assert (
        tokenizer.encode("the sea", add_special_tokens=False)
        == hf.encode("the sea", add_special_tokens=False).ids
    )
    # An empty text is its BOS alone; without specials, nothing.
    assert tokenizer.encode("") == [1] and tokenizer.encode("", add_special_tokens=False) == []
    assert tokenizer.special_tokens_added() == 1


@pytest.mark.parametrize("flags", [{"add_bos_token": False}, {"add_eos_token": True}])
def test_tokenizer_config_flags_leave_the_post_processor_as_it_is(tmp_path, flags):
    """transformers 5 loads a tokenizer.json's post-processor as it is, whatever
    tokenizer_config.json's add_bos_token / add_eos_token say (tests/reference checks it)."""
    folder = write_tokenizer_folder(tmp_path, "metaspace")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **flags}))
    assert load_tokenizer(folder).encode("the sea") == library("metaspace").encode("the sea").ids


def test_a_llama_class_rebuilds_the_pipeline_as_transformers_5_does(tmp_path):
    """tokenizer_config.json's LlamaTokenizer: the legacy normalizer ("▁" before every piece
    between special tokens) gives way to a Metaspace pre-tokenizer ("▁" before the first only),
    so a text after a special token, or with a leading space, encodes otherwise."""
    folder = write_tokenizer_folder(tmp_path, "legacy")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "LlamaTokenizer"})
    )
    text = "<|im_start|>user the sea"
    rebuilt = load_tokenizer(folder)
    assert rebuilt.encode(text) == library("metaspace").encode(text).ids
    assert rebuilt.encode(text) != library("legacy").encode(text).ids


# ------------------------------------------------------------------ after a prompt (vLLM's)


def streamed_after(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> list[str]:
    stream = tokenizer.stream(prompt)
    return [stream.push(i) for i in ids] + [stream.flush()]


def whole_runs(style: str):
    """Ids whose byte pieces come in whole UTF-8 characters: trained pieces, special tokens,
    ids past the tokenizer's, and characters spelled in byte pieces."""
    hf = library(style)
    size = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(piece) for piece in BYTE_PIECES]
    pieces = set(range(size)) - set(byte_ids)
    single = st.one_of(st.sampled_from(sorted(pieces)), st.integers(size, size + PAST - 1))
    utf8_runs = st.text(min_size=1, max_size=3).map(
        lambda text: [byte_ids[b] for b in text.encode("utf-8")]
    )
    runs = st.one_of(single.map(lambda i: [i]), utf8_runs)
    return st.lists(runs, max_size=12).map(lambda runs: [i for run in runs for i in run])


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_after_a_prompt_the_stream_is_what_the_prompts_text_grows_by(style, data):
    """The stream after a prompt gives decode(prompt + ids) past decode(prompt), whenever the one
    starts with the other: it does not when the prompt ends in part of a character (byte pieces)
    that the ids finish, or continue into bytes that are not UTF-8 (the run then decodes as
    U+FFFD a byte), which changes the prompt's own text.  Over whole characters, each token's
    bytes, joined, are that text's (OpenAI's `bytes`), when the prompt has text for the
    decoder's strip of a text's first space to act on."""
    prompt = data.draw(st.one_of(ids_of(style), whole_runs(style)))
    ids = data.draw(st.one_of(ids_of(style), whole_runs(style)))
    tokenizer = minirt_tokenizer(style)
    hf = library(style)
    before = hf.decode(prompt, skip_special_tokens=False)
    after = hf.decode(prompt + ids, skip_special_tokens=False)
    text = "".join(streamed_after(tokenizer, prompt, ids))
    if after.startswith(before):
        assert text == after[len(before) :]
    joined = b"".join(tokenizer.token_bytes(i) for i in ids)
    if after.startswith(before) and before and "\ufffd" not in after:
        assert joined == text.encode("utf-8")


@pytest.mark.parametrize("style", STYLES)
def test_a_completions_first_piece_keeps_its_space(style):
    tokenizer = minirt_tokenizer(style)
    hf = library(style)
    prompt = tokenizer.encode("the sea")
    sea = hf.token_to_id("▁sea")
    assert sea is not None
    assert "".join(streamed(tokenizer, [sea, sea])) == "sea sea"
    before = hf.decode(prompt, skip_special_tokens=False)
    expected = hf.decode(prompt + [sea, sea], skip_special_tokens=False)[len(before) :]
    assert "".join(streamed_after(tokenizer, prompt, [sea, sea])) == expected == " sea sea"


@pytest.mark.parametrize("style", STYLES)
def test_each_tokens_string_and_bytes_are_its_vocabulary_piece(style):
    """▁ a space, <0xNN> the byte NN (its string U+FFFD unless the byte is ASCII), a special
    token its content, an id past the tokenizer's nothing: from the library's vocabulary."""
    tokenizer = minirt_tokenizer(style)
    hf = library(style)
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    for piece, token_id in hf.get_vocab(with_added_tokens=True).items():
        if token_id in added:
            expected = added[token_id].encode("utf-8")
        elif piece in BYTE_PIECES:
            expected = bytes([BYTE_PIECES.index(piece)])
        else:
            expected = piece.replace("▁", " ").encode("utf-8")
        assert tokenizer.token_bytes(token_id) == expected, piece
        assert tokenizer.token_string(token_id) == expected.decode("utf-8", errors="replace")
    size = hf.get_vocab_size(with_added_tokens=True)
    assert tokenizer.token_bytes(size) == b"" and tokenizer.token_string(size) == ""
    assert tokenizer.token_string(hf.token_to_id("<0xE2>")) == "\ufffd"
    assert tokenizer.token_string(hf.token_to_id("▁sea")) == " sea"


def test_the_mistral_fixtures_completion_keeps_its_first_space():
    """The reviewer's case: "▁it", "▁it" after a prompt is " it it" (vLLM's, and transformers'
    decode(prompt + generated) past decode(prompt)), not "it it"; and the pieces' strings and
    bytes are " it", and <0xE2>'s the byte 0xE2."""
    from conftest import FIXTURES
    from tokenizers import Tokenizer as HFTokenizer

    folder = FIXTURES / "mistral_chat_byte_fallback"
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer = load_tokenizer(folder)
    prompt = tokenizer.encode("Hello")
    it = hf.token_to_id("▁it")
    before = hf.decode(prompt, skip_special_tokens=False)
    expected = hf.decode(prompt + [it, it], skip_special_tokens=False)[len(before) :]
    assert "".join(streamed_after(tokenizer, prompt, [it, it])) == expected == " it it"
    assert tokenizer.token_string(it) == " it" and tokenizer.token_bytes(it) == b" it"
    assert list(tokenizer.token_bytes(hf.token_to_id("<0xE2>"))) == [226]


@pytest.mark.parametrize("style", STYLES)
def test_a_prompts_tail_is_read_whole(style):
    """A prompt that ends in a long run of byte pieces (three €, nine pieces) is not cut inside
    the run, whose bytes would all read as U+FFFD, the completion's too; a prompt that ends in
    ids without text is read back to its text, whose end keeps the completion's first space."""
    tokenizer = minirt_tokenizer(style)
    hf = library(style)
    byte_ids = [hf.token_to_id(piece) for piece in BYTE_PIECES]
    sea = hf.token_to_id("▁sea")
    size = hf.get_vocab_size(with_added_tokens=True)
    start = tokenizer.encode("the sea")
    for prompt, ids, grown in [
        (start + [byte_ids[b] for b in "€€€".encode()], [byte_ids[b] for b in "é".encode()], "é"),
        (start + [size] * 8, [sea], " sea"),
    ]:
        before = hf.decode(prompt, skip_special_tokens=False)
        after = hf.decode(prompt + ids, skip_special_tokens=False)
        assert after[len(before) :] == grown
        assert "".join(streamed_after(tokenizer, prompt, ids)) == grown
