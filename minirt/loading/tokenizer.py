"""Text <-> token ids, including decoding that never breaks a UTF-8 character.

Owns:
  * loading a tokenizer from a model folder: `tokenizer.json` through the `tokenizers` library, or
    GPT-2's byte-level BPE from `vocab.json` + `merges.txt` (or OpenAI's original names,
    `encoder.json` + `vocab.bpe`).  A folder with none of these has no tokenizer; one of these
    files that is a broken link, a folder, a FIFO, a device or a socket, or one half of a pair
    without the other, is refused naming it, never taken for "no tokenizer";
  * the special ids a runtime needs: EOS (where generation stops) and BOS (what an empty prompt
    starts from);
  * decoding token ids to bytes and then to text, both all at once and as a stream.  GPT-2's tokens
    are byte sequences, and one character (an emoji, a CJK character) is often split across tokens;
    the stream holds back the incomplete bytes until the character is whole.

Must not know: models, weights, backends or batching.
"""

from __future__ import annotations

import codecs
import json
from functools import lru_cache
from pathlib import Path

from ..errors import RequestError, TokenizerError
from ..model.config import special_ids
from .json_file import broken_link, not_a_regular_file

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
        self, hf_tokenizer, source: str, eos_token_id: int | None, bos_token_id: int | None
    ):
        # A tokenizers.Tokenizer, with no truncation or padding: prompts are fed whole.  A
        # tokenizer.json may ask for either; transformers ignores both unless asked.
        self.hf = hf_tokenizer
        hf_tokenizer.no_truncation()
        hf_tokenizer.no_padding()
        # The file(s) it came from, for messages.
        self.source = source
        # Both as settled by `special_ids`.
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        # Each id's bytes (list[bytes] by id), or None if the vocabulary is not byte-level.
        self._token_bytes = self._build_byte_table()
        self.is_byte_level = self._token_bytes is not None
        # The longest token's bytes (byte-level only; None otherwise): a text of more bytes than
        # this times the context is too long for it without being encoded.
        self.most_bytes_per_token: int | None = None
        if self._token_bytes is not None:
            self.most_bytes_per_token = max(1, max(map(len, self._token_bytes), default=1))

    def _build_byte_table(self) -> list[bytes] | None:
        """Each id's exact bytes, when the vocabulary is byte-level (GPT-2's kind)."""
        decoder = json.loads(self.hf.to_str()).get("decoder") or {}
        decoder_types = {decoder.get("type")} | {
            d.get("type") for d in decoder.get("decoders", []) or []
        }
        if "ByteLevel" not in decoder_types:
            # E.g. WordPiece or SentencePiece: decode through the library.
            return None
        char_to_byte = {ch: b for b, ch in byte_to_unicode().items()}
        special = {t.content for t in self.hf.get_added_tokens_decoder().values()}
        table: list[bytes] = [b""] * self.vocab_size
        for token, token_id in self.hf.get_vocab(with_added_tokens=True).items():
            if token_id >= self.vocab_size:
                return None
            if token in special:
                # An added token stands for its own text.
                table[token_id] = token.encode("utf-8")
            elif all(ch in char_to_byte for ch in token):
                table[token_id] = bytes(char_to_byte[ch] for ch in token)
            else:
                # Not byte-level: fall back to the library's decoder.
                return None
        return table

    def encode(self, text: str) -> list[int]:
        """Text -> ids.  No BOS is added: GPT-2 prompts are the raw text.  The library failing on a
        text (a crafted tokenizer.json can even make it panic, which is no Exception) is that
        request's error.  Encoded as a batch of one, which the library encodes with Python's
        lock released, so that a server's other threads (its event loop, its engine) go on while
        a long prompt is encoded: the same ids as `encode`."""
        try:
            [encoding] = self.hf.encode_batch([text], add_special_tokens=False)
            return encoding.ids
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException)
            raise RequestError(f"{self.source} failed on this prompt: {first_line(exc)}") from None

    def token_bytes(self, token_id: int) -> bytes:
        if self._token_bytes is None:
            return self.hf.decode([token_id], skip_special_tokens=False).encode("utf-8")
        return self._token_bytes[token_id]

    def decode(self, token_ids: list[int]) -> str:
        """Ids -> text.  Bytes that are not valid UTF-8 become U+FFFD, as in transformers."""
        if self._token_bytes is None:
            return self.hf.decode(list(token_ids), skip_special_tokens=False)
        return b"".join(self._token_bytes[i] for i in token_ids).decode("utf-8", errors="replace")

    def stream(self) -> StreamDecoder:
        """A decoder for tokens that arrive one at a time (streaming, stop strings)."""
        return StreamDecoder(self)


class StreamDecoder:
    """Turns a growing list of ids into text without ever emitting half a character."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Used only for tokenizers that are not byte-level.
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (possibly "")."""
        if self.tokenizer.is_byte_level:
            return self._utf8.decode(self.tokenizer.token_bytes(token_id))
        # Fallback: re-decode everything and emit the new suffix, held back while it ends in U+FFFD
        # (incomplete bytes).
        self._ids.append(token_id)
        text = self.tokenizer.decode(self._ids)
        if text.endswith("\ufffd") or not text.startswith(self._emitted):
            return ""
        new = text[len(self._emitted) :]
        self._emitted = text
        return new

    def flush(self) -> str:
        """What is left at the end: an incomplete trailing character becomes U+FFFD, as `decode`
        would give."""
        if self.tokenizer.is_byte_level:
            return self._utf8.decode(b"", final=True)
        text = self.tokenizer.decode(self._ids)
        new = text[len(self._emitted) :]
        self._emitted = text
        return new


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
) -> Tokenizer | None:
    """Load the tokenizer beside a model's weights, or None when the folder has none.  The config's
    EOS / BOS ids go through `special_ids`; a tokenizer that cannot be read, or whose size is not
    the model's `vocab_size`, is refused in one line naming the file."""
    found = read_tokenizer_files(Path(folder))
    if found is None:
        return None
    hf, source = found
    n_tokens = hf.get_vocab_size(with_added_tokens=True)
    top_id = max(hf.get_vocab(with_added_tokens=True).values(), default=-1)
    # Ids it could not make or decode.
    if vocab_size is not None and (n_tokens != vocab_size or top_id >= vocab_size):
        raise TokenizerError(
            f"{source}: the tokenizer has {n_tokens} tokens (ids up to {top_id}) but the model's "
            f"vocabulary has {vocab_size}; they do not belong together"
        )
    eos, bos = special_ids(
        eos_token_id,
        bos_token_id,
        vocab_size if vocab_size is not None else n_tokens,
        endoftext=hf.token_to_id(ENDOFTEXT),
    )
    return Tokenizer(hf, source=source, eos_token_id=eos, bos_token_id=bos)
