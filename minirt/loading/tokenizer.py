"""Text <-> token ids, including decoding that never breaks a UTF-8 character.

Owns:
  * loading a tokenizer from a model folder: `tokenizer.json` through the `tokenizers` library, or
    GPT-2's byte-level BPE from `vocab.json` + `merges.txt` (or OpenAI's original names,
    `encoder.json` + `vocab.bpe`).  A folder with none of these has no tokenizer; one of these
    files that is a broken link, a folder, a FIFO, a device or a socket, or one half of a pair
    without the other, is refused naming it, never taken for "no tokenizer";
  * the special ids a runtime needs: every EOS (where generation stops; the first is the one
    reports name) and BOS (what an empty prompt starts from), gathered from the model's files
    by minirt/loading/special_tokens.py;
  * encoding as transformers' `tokenizer(text)` does (its post-processor's BOS included), or
    without special tokens;
  * decoding token ids to text as transformers does, both all at once and as a stream.  GPT-2's
    tokens are byte sequences, and one character (an emoji, a CJK character) is often split
    across tokens; a SentencePiece vocabulary spells such a character in byte pieces
    (<0xE2><0x82><0xAC>).  The stream holds the text back until the character is whole, and
    decodes a short window of ids per token, never all of them.  A request's stream starts from
    its prompt's last ids (vLLM's), so that its text is what the prompt's text grows by: a
    SentencePiece decoder strips the leading space of a text's first piece only;
  * each token's own string and bytes, as logprobs show them: GPT-2's bytes, or a SentencePiece
    vocabulary's piece ("▁" a space, <0xE2> the byte 0xE2, a special token its text), so that
    the tokens' bytes, joined, are the text's.

Must not know: models, weights, backends or batching.
"""

from __future__ import annotations

import codecs
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import RequestError, TokenizerError
from ..model.config import special_ids
from .json_file import broken_link, not_a_regular_file
from .special_tokens import (
    TokenizerConfig,
    end_ids,
    generation_eos_ids,
    read_tokenizer_config,
)

ENDOFTEXT = "<|endoftext|>"


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters, so every token is
    visible."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    # Printable Latin-1 bytes map to themselves.
    mapping = {b: chr(b) for b in printable}
    # Controls, space, ...: shifted to 256 and above.
    others = [b for b in range(256) if b not in mapping]
    mapping.update({b: chr(256 + n) for n, b in enumerate(others)})
    return mapping


class Tokenizer:
    """A loaded tokenizer plus the facts a runtime needs about it."""

    def __init__(
        self,
        hf_tokenizer,
        source: str,
        eos_token_id: int | None,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int] = (),
        model_vocab_size: int | None = None,
    ):
        # A tokenizers.Tokenizer, with no truncation or padding: prompts are fed whole.  A
        # tokenizer.json may ask for either; transformers ignores both unless asked.
        self.hf = hf_tokenizer
        hf_tokenizer.no_truncation()
        hf_tokenizer.no_padding()
        # The file(s) it came from, for messages.
        self.source = source
        # Both as settled by `special_ids`: the primary EOS (the one reports name) and BOS.
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        # Every id that ends a request, the primary first (generation_config.json's and
        # tokenizer_config.json's beside config.json's: `load_tokenizer` gathers them).
        candidates = (eos_token_id, *eos_token_ids)
        self.eos_token_ids = tuple(dict.fromkeys(i for i in candidates if i is not None))
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        # The ids a model may produce: past the tokenizer's own (Qwen2.5 pads its vocabulary)
        # they have no token, and no text.
        self.model_vocab_size = max(self.vocab_size, model_vocab_size or 0)
        decoders_used = decoder_types(hf_tokenizer)
        # Each id's bytes (list[bytes] by id), or None if the vocabulary is not byte-level.
        self._token_bytes = self._build_byte_table(decoders_used)
        self.is_byte_level = self._token_bytes is not None
        # The ids whose text may still change with the tokens after them (not byte-level only).
        self._byte_pieces = byte_pieces(hf_tokenizer) if "ByteFallback" in decoders_used else None
        # Each id's bytes as its vocabulary piece spells them (SentencePiece only; else None).
        self._piece_bytes = None
        if self._token_bytes is None:
            self._piece_bytes = self._build_piece_table(sentencepiece_marker(hf_tokenizer))
        # The longest token's bytes (byte-level only; None otherwise): a text of more bytes than
        # this times the context is too long for it without being encoded.
        self.most_bytes_per_token: int | None = None
        if self._token_bytes is not None:
            self.most_bytes_per_token = max(1, max(map(len, self._token_bytes), default=1))

    def _build_byte_table(self, decoders_used: list[str]) -> list[bytes] | None:
        """Each id's exact bytes, when the decoder is GPT-2's ByteLevel alone and every id below
        the tokenizer's size has a token: a token whose characters all stand for bytes is those
        bytes, any other (an added token with a space, say) its own UTF-8, as the library's
        ByteLevel decoder takes them.  Ids past the tokenizer's, up to the model's, are b""."""
        if not decoders_used or set(decoders_used) != {"ByteLevel"}:
            # E.g. WordPiece or SentencePiece: decode through the library.
            return None
        char_to_byte = {ch: b for b, ch in byte_to_unicode().items()}
        table: list[bytes] = [b""] * self.model_vocab_size
        for token, token_id in self.hf.get_vocab(with_added_tokens=True).items():
            if token_id >= self.vocab_size:
                # A hole below it: decode through the library.
                return None
            if all(ch in char_to_byte for ch in token):
                table[token_id] = bytes(char_to_byte[ch] for ch in token)
            else:
                table[token_id] = token.encode("utf-8")
        return table

    def _build_piece_table(self, marker: str | None) -> list[bytes] | None:
        """Each id's bytes as its piece spells them, for a SentencePiece vocabulary (a decoder
        that turns `marker`, "▁", into a space; None without one): the marker a space (in an
        added token too, as the decoder reads it), a byte piece <0xNN> that byte (with byte
        fallback), ids past the tokenizer's b"".  Decoding a piece alone would strip its leading
        space."""
        if marker is None:
            return None
        vocab = self.hf.get_vocab(with_added_tokens=True)
        table: list[bytes] = [b""] * max(self.model_vocab_size, max(vocab.values(), default=0) + 1)
        for token, token_id in vocab.items():
            if self._byte_pieces is not None and token_id in self._byte_pieces:
                table[token_id] = bytes([int(token[3:5], 16)])
            else:
                table[token_id] = token.replace(marker, " ").encode("utf-8")
        return table

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text -> ids, as transformers' `tokenizer(text)` gives them: with the special tokens
        the tokenizer's post-processor adds (Llama's <s> or <|begin_of_text|> in front; none for
        GPT-2), unless `add_special_tokens` is False (a chat template's text, which holds its
        own).  The library failing on a text (a crafted tokenizer.json can even make it panic,
        which is no Exception) is that request's error.  Encoded as a batch of one, which the
        library encodes with Python's lock released, so that a server's other threads (its event
        loop, its engine) go on while a long prompt is encoded: the same ids as `encode`."""
        try:
            [encoding] = self.hf.encode_batch([text], add_special_tokens=add_special_tokens)
            return encoding.ids
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException)
            raise RequestError(f"{self.source} failed on this prompt: {first_line(exc)}") from None

    def special_tokens_added(self) -> int:
        """How many ids `encode` adds to every text (its BOS, say)."""
        return self.hf.num_special_tokens_to_add(is_pair=False)

    def text_bytes(self, text: str) -> int | None:
        """The UTF-8 length of the text the model's tokens are cut from: after the tokenizer's
        normalizer (Qwen2's NFC can make a text shorter), a lower bound on its tokens' bytes.
        None when the normalizer fails on it (`encode` then says so)."""
        normalizer = self.hf.normalizer
        if normalizer is not None:
            try:
                text = normalizer.normalize_str(text)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # noqa: BLE001 (a library error, or pyo3's PanicException)
                return None
        return len(text.encode("utf-8", errors="surrogatepass"))

    def token_bytes(self, token_id: int) -> bytes:
        """A token's own bytes, as OpenAI's logprobs give them: GPT-2's, a SentencePiece piece's
        (its leading space kept, a byte piece's one byte), else the token decoded alone."""
        table = self._token_bytes if self._token_bytes is not None else self._piece_bytes
        if table is None:
            return self.hf.decode([token_id], skip_special_tokens=False).encode("utf-8")
        return table[token_id]

    def token_string(self, token_id: int) -> str:
        """A token's own string, as logprobs show it: its bytes as text (a piece of a character
        is U+FFFD), so that a SentencePiece piece keeps its leading space (vLLM's), which
        decoding it alone would strip; else the token decoded alone."""
        if self._token_bytes is None and self._piece_bytes is None:
            return self.hf.decode([token_id], skip_special_tokens=False)
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text, as transformers' `decode` gives it (special tokens kept; no clean-up of
        spaces, which transformers 5 never does for a BPE vocabulary).  Bytes that are not valid
        UTF-8 become U+FFFD; ids without a token have no text."""
        if self._token_bytes is None:
            return self.hf.decode(list(token_ids), skip_special_tokens=False)
        return b"".join(self._token_bytes[i] for i in token_ids).decode("utf-8", errors="replace")

    def text_may_change(self, token_id: int) -> bool:
        """Whether the text of the ids so far may still change with the tokens after this one,
        before any text is decoded: a SentencePiece byte piece (<0xE2>), whose run of byte pieces
        is one character or U+FFFD for each byte only once the run ends, and an id without a
        token (the library drops it, so the runs on either side are one)."""
        if self._byte_pieces is None:
            return False
        return token_id in self._byte_pieces or self.hf.id_to_token(token_id) is None

    def stream(self, prompt_ids: Sequence[int] = ()) -> StreamDecoder:
        """A decoder for tokens that arrive one at a time (streaming, stop strings), after
        `prompt_ids` (a request's prompt, whose text it does not give)."""
        return StreamDecoder(self, prompt_ids)


def decoder_types(hf) -> list[str]:
    """The types of a tokenizer's decoder, in order ([] without one): a Sequence's parts."""
    decoder = json.loads(hf.to_str()).get("decoder") or {}
    parts = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
    return [str(part.get("type")) for part in parts or [] if part]


def sentencepiece_marker(hf) -> str | None:
    """The character a SentencePiece decoder turns into a space ("▁"): a Metaspace decoder's
    replacement, or a Replace decoder's pattern whose content is a space; None for any other
    decoder (GPT-2's ByteLevel, WordPiece, ...)."""
    decoder = json.loads(hf.to_str()).get("decoder") or {}
    parts = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
    for part in parts or []:
        if not part:
            continue
        if part.get("type") == "Metaspace":
            return str(part.get("replacement", "▁"))
        pattern = part.get("pattern") or {}
        if part.get("type") == "Replace" and part.get("content") == " " and "String" in pattern:
            return str(pattern["String"])
    return None


def byte_pieces(hf) -> frozenset[int]:
    """The ids whose token the ByteFallback decoder reads as one byte: `<0xNN>`."""
    pieces = set()
    for token, token_id in hf.get_vocab(with_added_tokens=True).items():
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                int(token[3:5], 16)
            except ValueError:
                continue
            pieces.add(token_id)
    return frozenset(pieces)


class StreamDecoder:
    """Turns a growing list of ids into text without ever emitting half a character: the text of
    all the pushes and the flush is `decode(ids)`, exactly; after a prompt, what `decode` of the
    prompt and the ids gives past the prompt's own text.

    A byte-level vocabulary (GPT-2's) decodes each token's bytes through an incremental UTF-8
    decoder (a prompt changes nothing there).  Any other decodes a short window, as vLLM's
    incremental detokenizer does: the ids from `prefix` (where the text before the last emission
    began) to the end, of which the text up to `read` (the ids already emitted) is known, so that
    the new text is the window's text past that.  The window starts a token early because a
    decoder reads a token differently at the start of a text (SentencePiece's leading space is
    stripped there); a request's first window starts with its prompt's last ids (`prompt_tail`),
    so its first token is read as the prompt's continuation, not as a text's start.  New text
    waits while it ends in U+FFFD (bytes of a character still to come) or while its last token is
    a byte piece (the run of byte pieces decides how its bytes read), so each push decodes the ids
    since the emission before the last, never all of them."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Used only for tokenizers that are not byte-level: the prompt's tail is known text.
        self._ids: list[int] = []
        if not tokenizer.is_byte_level:
            self._ids = prompt_tail(tokenizer, prompt_ids)
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (possibly "")."""
        if self.tokenizer.is_byte_level:
            return self._utf8.decode(self.tokenizer.token_bytes(token_id))
        self._ids.append(token_id)
        if self.tokenizer.text_may_change(token_id):
            return ""
        return self._advance(final=False)

    def flush(self) -> str:
        """What is left at the end: an incomplete trailing character becomes U+FFFD, as `decode`
        would give."""
        if self.tokenizer.is_byte_level:
            return self._utf8.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        """The window's new text, once it is final; the window then moves up."""
        if self._read == len(self._ids):
            return ""
        decode = self.tokenizer.decode
        known = decode(self._ids[self._prefix : self._read])
        text = decode(self._ids[self._prefix :])
        if not final and text.endswith("\ufffd"):
            return ""
        self._prefix = self._read
        self._read = len(self._ids)
        return text[len(known) :]


# How many of a prompt's last ids a request's stream starts from (vLLM's 5, and 2 more for
# special tokens).
PROMPT_TAIL = 7


def prompt_tail(tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's last ids a stream's first window starts with: PROMPT_TAIL of them, or more.
    Never from inside a run of byte pieces: the ByteFallback decoder reads a run whole, and one
    cut (its first bytes gone) is U+FFFD a byte, and so would be the completion's bytes that
    continue it.  The whole prompt when the tail has no text (ids past the tokenizer's, say),
    since a decoder that strips a text's first space would then strip the completion's."""
    start = max(0, len(prompt_ids) - PROMPT_TAIL)
    while start > 0 and tokenizer.text_may_change(prompt_ids[start - 1]):
        start -= 1
    tail = list(prompt_ids[start:])
    if start > 0 and not tokenizer.decode(tail):
        return list(prompt_ids)
    return tail


def first_line(exc: BaseException) -> str:
    """An exception's message cut to one line of at most 200 characters (library messages can be
    long)."""
    return ((str(exc).splitlines() or [type(exc).__name__])[0])[:200]


def _byte_level_bpe(vocab_path: Path, merges_path: Path):
    """GPT-2's tokenizer rebuilt from its vocabulary and merge list."""
    from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415
    from tokenizers import decoders, models, pre_tokenizers  # noqa: PLC0415

    try:
        vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        bpe = models.BPE.from_file(str(vocab_path), str(merges_path))
    except Exception as exc:  # noqa: BLE001 (the library raises plain Exceptions with a message)
        raise TokenizerError(
            f"{vocab_path} + {merges_path}: cannot build a BPE tokenizer ({exc})"
        ) from None
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    if ENDOFTEXT in vocab:
        hf.add_special_tokens([ENDOFTEXT])
    return hf


def refuse_unreadable_tokenizer_files(paths: list[Path]) -> None:
    """A tokenizer file that is a link to nothing (or a loop), a folder, a FIFO, a device or a
    socket is broken, not absent: refused naming it, never taken for a folder without a tokenizer.
    Each is only looked at, never opened (a FIFO would block)."""
    for path in paths:
        link_problem = broken_link(path)
        if link_problem:
            raise TokenizerError(f"{link_problem}; fix the link, or remove it")
        kind = not_a_regular_file(path)
        if kind:
            raise TokenizerError(
                f"{path} is {kind}, not a tokenizer file; remove it, or put the model's "
                f"{path.name} there"
            )


def refuse_half_pairs(folder: Path, pairs: list[tuple[Path, Path]]) -> None:
    """With no tokenizer.json and no whole pair, one file of a pair alone (vocab.json without
    merges.txt, vocab.bpe without encoder.json, ...) is a tokenizer cut in half, not no tokenizer:
    refused naming the file that is there and the one that is not."""
    for first, second in pairs:
        for present, absent in ((first, second), (second, first)):
            if present.is_file() and not absent.is_file():
                raise TokenizerError(
                    f"{folder} has {present.name} but no {absent.name} beside it; a GPT-2 "
                    "byte-level BPE needs both (or a tokenizer.json)"
                )


def read_tokenizer_files(folder: Path):
    """(the library's tokenizer, the file(s) it came from), or None when tokenizer.json,
    vocab.json + merges.txt and encoder.json + vocab.bpe are all absent.  A file of these that is
    there but cannot be read, or one half of a pair, is a TokenizerError."""
    tokenizer_json = folder / "tokenizer.json"
    pairs = [
        (folder / "vocab.json", folder / "merges.txt"),
        (folder / "encoder.json", folder / "vocab.bpe"),
    ]
    refuse_unreadable_tokenizer_files([tokenizer_json, *(name for pair in pairs for name in pair)])
    # From here on, each of these paths is a regular file or absent.
    if tokenizer_json.is_file():
        from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

        try:
            hf = HFTokenizer.from_file(str(tokenizer_json))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 (a library error, or pyo3's PanicException)
            raise TokenizerError(
                f"{tokenizer_json}: not a valid tokenizer file ({first_line(exc)})"
            ) from None
        return hf, str(tokenizer_json)
    for vocab_path, merges_path in pairs:
        if vocab_path.is_file() and merges_path.is_file():
            hf = _byte_level_bpe(vocab_path, merges_path)
            return hf, f"{vocab_path} + {merges_path.name}"
    refuse_half_pairs(folder, pairs)
    return None


def load_tokenizer(
    folder: str | Path,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    vocab_size: int | None = None,
    eos_token_ids: Iterable[int] = (),
) -> Tokenizer | None:
    """Load the tokenizer beside a model's weights, or None when the folder has none.  The config's
    EOS / BOS ids go through `special_ids`; every other id that ends text joins the primary EOS
    (`eos_token_ids`: config.json's list; then generation_config.json's, and tokenizer_config.json's
    `eos_token`, read here).  What `encode` adds is the tokenizer.json's post-processor's, as in
    transformers 5 (which leaves tokenizer_config.json's add_bos_token and add_eos_token aside
    when it loads a tokenizer.json); a Llama tokenizer_config.json's class rebuilds the rest of
    its pipeline, as transformers 5 does.  A tokenizer that cannot be read,
    or with more tokens (or higher ids) than the model's `vocab_size`, is refused in one line
    naming the file; one with fewer loads (Qwen2.5 pads its model's vocabulary)."""
    found = read_tokenizer_files(Path(folder))
    if found is None:
        return None
    hf, source = found
    n_tokens = hf.get_vocab_size(with_added_tokens=True)
    top_id = max(hf.get_vocab(with_added_tokens=True).values(), default=-1)
    # Ids it could make that the model has no row for.
    if vocab_size is not None and (n_tokens > vocab_size or top_id >= vocab_size):
        raise TokenizerError(
            f"{source}: the tokenizer has {n_tokens} tokens (ids up to {top_id}) but the model's "
            f"vocabulary has {vocab_size}; they do not belong together"
        )
    settings = read_tokenizer_config(folder)
    if settings.tokenizer_class in LLAMA_CLASSES:
        rebuild_as_llama(hf, settings)
    n_ids = vocab_size if vocab_size is not None else n_tokens
    eos, bos = special_ids(eos_token_id, bos_token_id, n_ids, endoftext=hf.token_to_id(ENDOFTEXT))
    named_eos = None if settings.eos_token is None else hf.token_to_id(settings.eos_token)
    others = [*eos_token_ids, *generation_eos_ids(folder), named_eos]
    ends = end_ids(eos, others, n_ids)
    return Tokenizer(
        hf,
        source=source,
        eos_token_id=ends[0] if ends else None,
        # BOS falls back to the EOS, as `special_ids` has it.
        bos_token_id=bos if bos is not None else (ends[0] if ends else None),
        eos_token_ids=ends,
        model_vocab_size=vocab_size,
    )


# The tokenizer classes whose pipeline transformers 5 rebuilds from a tokenizer.json's vocabulary.
LLAMA_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast")


def rebuild_as_llama(hf, settings: TokenizerConfig) -> None:
    """transformers 5's LlamaTokenizer (TinyLlama's and Mistral's tokenizer_config.json name it)
    keeps a tokenizer.json's vocabulary, merges, added tokens and post-processor, and replaces
    the rest: no normalizer, a Metaspace pre-tokenizer ("▁" in front of the first piece only,
    unless `legacy`; none without `add_prefix_space`), and SentencePiece's decoder.  An older
    file's normalizer (a "▁" in front of every piece between special tokens) encodes some texts
    otherwise, so minirt encodes as transformers does."""
    from tokenizers import decoders, pre_tokenizers  # noqa: PLC0415

    if json.loads(hf.to_str()).get("model", {}).get("type") != "BPE":
        return
    add_prefix_space = settings.add_prefix_space is not False
    if not add_prefix_space:
        scheme = "never"
    else:
        # transformers' LlamaTokenizer takes `legacy` as False unless told.
        scheme = "always" if settings.legacy else "first"
    hf.normalizer = None
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    sequence = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        sequence.append(decoders.Strip(content=" ", left=1, right=0))
    hf.decoder = decoders.Sequence(sequence)
