"""A check the loader's size check always pre-empts, pinned on its own: a tokenizer whose ids are not 0..n-1.

`load_tokenizer(..., vocab_size=V)` refuses a tokenizer with an id at or past V before a `Tokenizer` is built,
so through the loader the byte table's own guard (an id at or past the tokenizer's size means the table cannot
hold it: decode through the library instead) is never reached.  Built directly, and through `load_tokenizer`
without a model's size (as `minirt.inspect` can), it is: the boundary is pinned here, on each side.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as LibraryTokenizer
from tokenizers import decoders, models, pre_tokenizers

from minirt.errors import TokenizerError
from minirt.loading.tokenizer import Tokenizer, load_tokenizer


def byte_level(vocab: dict[str, int]) -> LibraryTokenizer:
    """A byte-level BPE of these tokens (no merges), as GPT-2's is built."""
    hf = LibraryTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


@pytest.mark.parametrize(
    "vocab, table_holds_it",
    [
        ({"a": 0, "b": 1}, True),  # the last id is size - 1
        ({"a": 0, "b": 2}, False),  # one id is the size itself: no room in a table of 2
        ({"a": 1, "b": 7}, False),
    ],
)
def test_ids_past_the_tokenizer_size_fall_back_to_the_library_decoder(vocab, table_holds_it):
    hf = byte_level(vocab)
    assert hf.get_vocab_size(with_added_tokens=True) == 2  # the library counts tokens, not ids
    tokenizer = Tokenizer(hf, source="test", eos_token_id=None, bos_token_id=None)
    assert tokenizer.is_byte_level is table_holds_it
    # Either way the text is the tokens' own: "a" then "b" (no IndexError past the table's end).
    assert tokenizer.decode([vocab["a"], vocab["b"]]) == "ab"


def test_through_the_loader_the_size_check_refuses_first(tmp_path):
    byte_level({"a": 0, "b": 2}).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(
        TokenizerError, match=r"has 2 tokens \(ids up to 2\) but the model's vocabulary has 2"
    ):
        load_tokenizer(tmp_path, vocab_size=2)
    assert not load_tokenizer(
        tmp_path
    ).is_byte_level  # without a model's size, the inner guard decides
