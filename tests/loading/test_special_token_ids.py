"""Every id that ends text, as transformers and vLLM read a model folder's files.

config.json's and generation_config.json's `eos_token_id` may be an id or a list (Llama 3's is
[128001, 128008, 128009]); tokenizer_config.json names its `eos_token` as text or as an
AddedToken dict.  `load_tokenizer` gathers them all, the config's first; a broken file is
refused in one line naming it.
"""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import DATA
from minirt.errors import CheckpointError, TokenizerError
from minirt.loading.special_tokens import (
    end_ids,
    generation_eos_ids,
    read_token_ids,
    read_tokenizer_config,
)
from minirt.loading.tokenizer import load_tokenizer

GPT2_VOCAB = DATA / "gpt2-vocab"


@pytest.mark.parametrize(
    "value, ids",
    [(None, ()), (7, (7,)), ([7], (7,)), ([128001, 128008, 128009], (128001, 128008, 128009))],
)
def test_an_id_or_a_list_of_ids(value, ids):
    assert read_token_ids({"eos_token_id": value}, "eos_token_id", "config.json") == ids


@pytest.mark.parametrize("value", [True, -1, 1.0, "2", [1, None], [1, [2]], {"id": 1}])
def test_anything_else_is_refused_naming_the_file_and_field(value):
    with pytest.raises(CheckpointError) as caught:
        read_token_ids({"eos_token_id": value}, "eos_token_id", "/m/config.json")
    message = str(caught.value)
    assert message.startswith("/m/config.json: eos_token_id must be") and "\n" not in message


def test_end_ids_keep_the_primary_first_each_once_inside_the_vocabulary():
    assert end_ids(5, [9, 5, None, 100, 3, 9], vocab_size=10) == (5, 9, 3)
    assert end_ids(None, [4], vocab_size=10) == (4,)
    assert end_ids(50256, [], vocab_size=100) == ()


def test_generation_config_ids(tmp_path):
    assert generation_eos_ids(tmp_path) == ()
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": [128001, 128009], "do_sample": True}))
    assert generation_eos_ids(tmp_path) == (128001, 128009)
    path.write_text(json.dumps({"bos_token_id": 1}))
    assert generation_eos_ids(tmp_path) == ()


@pytest.mark.parametrize("text", ["{broken", "[1, 2]", '{"eos_token_id": "</s>"}'])
def test_a_bad_generation_config_is_one_line_naming_it(tmp_path, text):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(CheckpointError) as caught:
        generation_eos_ids(tmp_path)
    message = str(caught.value)
    assert "generation_config.json" in message and "\n" not in message


def test_a_dangling_generation_config_is_refused_not_taken_as_absent(tmp_path):
    (tmp_path / "generation_config.json").symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(CheckpointError, match="generation_config.json is a link to"):
        generation_eos_ids(tmp_path)


@pytest.mark.parametrize(
    "eos_token, name",
    [("</s>", "</s>"), ({"content": "<|im_end|>", "special": True}, "<|im_end|>")],
)
def test_tokenizer_config_names_its_eos_as_text_or_an_added_token(tmp_path, eos_token, name):
    config = {"eos_token": eos_token, "bos_token": None, "tokenizer_class": "LlamaTokenizer"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    read = read_tokenizer_config(tmp_path)
    assert read.eos_token == name and read.bos_token is None
    assert read.tokenizer_class == "LlamaTokenizer" and read.legacy is None


@pytest.mark.parametrize(
    "config", [{"eos_token": 5}, {"legacy": "yes"}, {"bos_token": {"content": 1}}]
)
def test_a_bad_tokenizer_config_is_one_line_naming_it(tmp_path, config):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError) as caught:
        read_tokenizer_config(tmp_path)
    assert "tokenizer_config.json" in str(caught.value) and "\n" not in str(caught.value)


# ------------------------------------------------------------------ gathered by load_tokenizer


def gpt2_folder(tmp_path, generation=None, tokenizer_config=None):
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(GPT2_VOCAB / name, tmp_path / name)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    if tokenizer_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tmp_path


def test_gpt2_has_one_eos_as_before(tmp_path):
    tokenizer = load_tokenizer(gpt2_folder(tmp_path), 50256, 50256, 50257)
    assert tokenizer.eos_token_id == 50256 and tokenizer.eos_token_ids == (50256,)
    # GPT-2's tokenizer adds no special token to a text.
    assert tokenizer.encode("Hello world") == [15496, 995] and tokenizer.special_tokens_added() == 0


def test_every_file_adds_its_end_ids_after_the_configs(tmp_path):
    folder = gpt2_folder(
        tmp_path,
        generation={"eos_token_id": [50256, 198, 99999]},
        tokenizer_config={"eos_token": {"content": "!", "special": False}},
    )
    tokenizer = load_tokenizer(folder, 13, 50256, 50257, eos_token_ids=[13, 30])
    # config.json's (13, then the rest of its list), generation_config.json's, the tokenizer's
    # named EOS ("!" is id 0); 99999 lies outside the vocabulary.
    assert tokenizer.eos_token_ids == (13, 30, 50256, 198, 0)
    assert tokenizer.eos_token_id == 13 and tokenizer.bos_token_id == 50256


def test_without_a_config_eos_the_first_found_is_the_primary(tmp_path):
    folder = gpt2_folder(tmp_path, generation={"eos_token_id": 198})
    tokenizer = load_tokenizer(folder, None, None, 50257)
    # <|endoftext|> is GPT-2's fallback; generation_config.json's id comes after it.
    assert tokenizer.eos_token_ids == (50256, 198)


def test_a_bad_generation_config_refuses_the_tokenizer_naming_it(tmp_path):
    folder = gpt2_folder(tmp_path, generation={"eos_token_id": [1.5]})
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id must be"):
        load_tokenizer(folder, None, None, 50257)


def test_a_tokenizer_smaller_than_the_models_vocabulary_loads(tmp_path):
    """Qwen2.5's model has rows past its tokenizer's ids: they load, and have no text."""
    tokenizer = load_tokenizer(gpt2_folder(tmp_path), 50256, 50256, vocab_size=50304)
    assert tokenizer.is_byte_level and tokenizer.model_vocab_size == 50304
    hello = tokenizer.encode("Hello")
    assert tokenizer.decode([*hello, 50300, 50257]) == "Hello"
    stream = tokenizer.stream()
    assert "".join(stream.push(i) for i in [*hello, 50303]) + stream.flush() == "Hello"
