"""minirt's tokenizer against transformers' AutoTokenizer itself, on SentencePiece-style byte-fallback
tokenizers (tools/fixtures/byte_fallback_tokenizer.py) and GPT-2's real vocabulary.

Encoding is `tokenizer(text)["input_ids"]` (special tokens added: Llama's <s>, none for GPT-2),
decoding `tokenizer.decode(ids)` (transformers 5's defaults: special tokens kept, no clean-up for
a BPE vocabulary); and minirt's stream gives that decode exactly.  The folders name the class
transformers loads them as (the generic fast tokenizer, or LlamaTokenizer, which transformers 5
rebuilds from the vocabulary) and add_bos_token / add_eos_token flags.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
from byte_fallback_tokenizer import write_tokenizer_folder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA, FIXTURES, reference_available
from minirt.loading.tokenizer import load_tokenizer

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not reference_available(),
        reason="torch/transformers not installed (CPU torch first, README 'CPU-only PyTorch'; then pip install -e .[reference])",
    ),
]

FOLDERS = [
    ("legacy", "PreTrainedTokenizerFast", {}),
    ("legacy", "LlamaTokenizer", {}),
    ("legacy", "LlamaTokenizer", {"legacy": True}),
    ("metaspace", "LlamaTokenizer", {"add_bos_token": True, "add_eos_token": True}),
    ("metaspace-decoder", "PreTrainedTokenizerFast", {"add_bos_token": False}),
]
# Any characters, with spaces, special tokens' text and byte-fallback characters weighted up.
PIECES = st.one_of(
    st.characters(codec="utf-8"), st.sampled_from([" ", "  ", "<|im_start|>", "</s>", "€"])
)
TEXTS = st.lists(PIECES, max_size=20).map("".join)


@lru_cache(maxsize=None)
def pair(index: int, root: str):
    """(transformers' tokenizer, minirt's) of one folder."""
    from transformers import AutoTokenizer

    style, tokenizer_class, flags = FOLDERS[index]
    folder = write_tokenizer_folder(Path(root) / str(index), style)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config = {**config, "tokenizer_class": tokenizer_class, **flags}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(folder)), load_tokenizer(folder)


def streamed(tokenizer, ids, prompt=()):
    stream = tokenizer.stream(prompt)
    return "".join(stream.push(i) for i in ids) + stream.flush()


def grown_by(reference, prompt, ids) -> str | None:
    """What transformers' text of the prompt grows by with the ids: decode(prompt + ids) past
    decode(prompt), as vLLM's incremental detokenizer gives a completion's text; None when the
    one does not start with the other (the prompt ends in part of a character the ids finish,
    or in byte pieces whose run the ids make invalid, so the prompt's own text changes)."""
    before = reference.decode(prompt)
    after = reference.decode(prompt + ids)
    return after[len(before) :] if after.startswith(before) else None


@pytest.mark.parametrize("index", range(len(FOLDERS)))
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_encode_decode_and_stream_are_transformers(index, text, tmp_path_factory):
    reference, ours = pair(index, str(tmp_path_factory.getbasetemp() / "sentencepiece"))
    ids = reference(text)["input_ids"]
    assert ours.encode(text) == ids
    assert (
        ours.encode(text, add_special_tokens=False)
        == reference(text, add_special_tokens=False)["input_ids"]
    )
    expected = reference.decode(ids)
    assert ours.decode(ids) == expected and streamed(ours, ids) == expected


@pytest.mark.parametrize("index", range(len(FOLDERS)))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_ids_decode_and_stream_as_transformers(index, data, tmp_path_factory):
    reference, ours = pair(index, str(tmp_path_factory.getbasetemp() / "sentencepiece"))
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=25))
    expected = reference.decode(ids)
    assert ours.decode(ids) == expected and streamed(ours, ids) == expected


def test_gpt2_adds_no_special_token_and_decodes_as_transformers(tmp_path):
    from transformers import AutoTokenizer

    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(DATA / "gpt2-vocab" / name, tmp_path / name)
    shutil.copy(tmp_path / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(tmp_path / "vocab.bpe", tmp_path / "merges.txt")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), tokenizer_type="gpt2")
    ours = load_tokenizer(tmp_path)
    for text in ["Hello world", "", " <|endoftext|> café 🤗", "a\n\nb"]:
        ids = reference(text)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == reference.decode(ids) == streamed(ours, ids)


@pytest.mark.parametrize("index", range(len(FOLDERS)))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS, data=st.data())
def test_a_completions_stream_is_what_transformers_text_of_its_prompt_grows_by(
    index, text, data, tmp_path_factory
):
    reference, ours = pair(index, str(tmp_path_factory.getbasetemp() / "sentencepiece"))
    prompt = reference(text)["input_ids"]
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=15))
    expected = grown_by(reference, prompt, ids)
    if expected is not None:
        assert streamed(ours, ids, prompt) == expected


def test_the_mistral_fixtures_completion_keeps_its_first_pieces_space():
    """The reviewer's case, against transformers itself: "▁it", "▁it" after "Hello" is " it it"."""
    from transformers import AutoTokenizer

    folder = FIXTURES / "mistral_chat_byte_fallback"
    reference = AutoTokenizer.from_pretrained(str(folder))
    ours = load_tokenizer(folder)
    prompt = reference("Hello")["input_ids"]
    assert ours.encode("Hello") == prompt
    it = reference.convert_tokens_to_ids("▁it")
    assert grown_by(reference, prompt, [it, it]) == " it it"
    assert streamed(ours, [it, it], prompt) == " it it"
    # Each piece's own string: the vocabulary's, "▁" a space (vLLM's logprobs).
    assert ours.token_string(it) == reference.convert_ids_to_tokens(it).replace("▁", " ")


def test_gpt2s_stream_after_a_prompt_is_transformers_suffix(tmp_path):
    from transformers import AutoTokenizer

    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(DATA / "gpt2-vocab" / name, tmp_path / name)
    shutil.copy(tmp_path / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(tmp_path / "vocab.bpe", tmp_path / "merges.txt")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), tokenizer_type="gpt2")
    ours = load_tokenizer(tmp_path)
    for prompt_text, text in [("Hello", " world"), ("café", " 🤗 ok"), ("", "a\n\nb")]:
        prompt = reference(prompt_text)["input_ids"]
        ids = reference(text)["input_ids"]
        assert streamed(ours, ids, prompt) == grown_by(reference, prompt, ids) == text
