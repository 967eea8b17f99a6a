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

from conftest import DATA, reference_available
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


def streamed(tokenizer, ids):
    stream = tokenizer.stream()
    return "".join(stream.push(i) for i in ids) + stream.flush()


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
