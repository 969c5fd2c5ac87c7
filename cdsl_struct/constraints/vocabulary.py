"""Token vocabulary: the bytes each token id stands for, and which ids are special.

Both engines work on bytes, so every tokenizer is reduced to one ``TokenVocabulary``:

- byte-level BPE (GPT-2 ``Ġ``, Llama-3, Qwen, GPT-4o): each character of a token string stands
  for one byte through GPT-2's printable byte alphabet;
- SentencePiece (Llama-2, Gemma): ``▁`` is a space and ``<0xNN>`` is the raw byte ``NN``;
- added tokens carry their literal content. Special tokens, and added markers such as
  ``<unused0>`` or ``[multimodal]``, are never allowed inside constrained output; EOS is allowed
  only where the constraint is complete. Added tokens made of plain text (Gemma-3's ``"\\n"``
  and runs of spaces are added tokens) stay ordinary tokens.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import UnsupportedTokenizer

_SENTENCEPIECE_SPACE = "\u2581"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_MARKER = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]")
#: texts this long or shorter (a word's spellings) are encoded once per vocabulary, the last this many kept
_SHORT_TEXT, _ENCODED_KEPT = 32, 4096


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map from printable stand-in characters back to the bytes they encode."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@dataclass(eq=False)
class TokenVocabulary:
    """Bytes of every token id of one tokenizer, plus its special and EOS ids.

    ``token_bytes[i]`` is what token ``i`` contributes to the output; ``special_ids`` are never
    allowed inside constrained output; ``eos_token_ids[0]`` is the primary EOS.
    ``fingerprint`` identifies the mapping (two tokenizers with equal fingerprints are
    interchangeable for constraints). ``encode`` tokenizes text without special tokens.
    """

    token_bytes: list[bytes]
    special_ids: frozenset[int]
    eos_token_ids: tuple[int, ...]
    scheme: str
    encode: Callable[[str], list[int]] = field(repr=False)
    build_seconds: float = 0.0
    engine_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha256()
        for token in self.token_bytes:
            digest.update(len(token).to_bytes(2, "little"))
            digest.update(token)
        digest.update(json.dumps([sorted(self.special_ids), list(self.eos_token_ids)]).encode())
        self.fingerprint = digest.hexdigest()

    def __repr__(self) -> str:
        return (
            f"TokenVocabulary(size={self.size}, scheme={self.scheme!r}, special={len(self.special_ids)}, "
            f"eos={list(self.eos_token_ids)}, fingerprint={self.fingerprint[:12]})"
        )

    @property
    def size(self) -> int:
        """Number of token ids (the length of a mask)."""
        return len(self.token_bytes)

    @property
    def eos_token_id(self) -> int:
        return self.eos_token_ids[0]

    def decode(self, token_ids: Sequence[int]) -> bytes:
        """Concatenate the bytes of ``token_ids`` (special tokens contribute their text)."""
        return b"".join(self.token_bytes[t] for t in token_ids)

    def engine_object(self, name: str, build: Callable[[TokenVocabulary], Any]) -> Any:
        """Build once and cache an engine's own view of this vocabulary."""
        with self.lock:
            if name not in self.engine_cache:
                self.engine_cache[name] = build(self)
            return self.engine_cache[name]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, eos_token_ids: Sequence[int] | None = None) -> TokenVocabulary:
        """The vocabulary of a tokenizer: a name, path, HF tokenizer or ``tokenizers.Tokenizer``.

        Results are cached per tokenizer object, so calling this again is free.
        """
        from ..models.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
        cache_key = (id(tokenizer), tuple(eos_token_ids or ()))
        cached = _VOCAB_CACHE.get(cache_key)
        if cached is not None and cached[0]() is tokenizer:
            return cached[1]
        vocab = _build_vocabulary(tokenizer, eos_token_ids)
        try:
            ref = weakref.ref(tokenizer)
        except TypeError:
            ref = (lambda t: (lambda: t))(tokenizer)
        _VOCAB_CACHE[cache_key] = (ref, vocab)
        return vocab


_VOCAB_CACHE: dict[tuple[int, tuple[int, ...]], tuple[Callable[[], Any], TokenVocabulary]] = {}


def _decoder_types(node: Any) -> set[str]:
    if not isinstance(node, dict):
        return set()
    found = {node.get("type", "")}
    for child in node.get("decoders", []) or []:
        found |= _decoder_types(child)
    return found


def _build_vocabulary(tokenizer: Any, eos_token_ids: Sequence[int] | None) -> TokenVocabulary:
    start = time.perf_counter()
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "get_added_tokens_decoder"):
        raise UnsupportedTokenizer(f"need a fast (Rust) tokenizer, got {type(tokenizer)!r}")
    # the decoder alone: serialising the whole tokenizer (merges included) costs seconds
    decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else None
    decoders = _decoder_types(decoder)
    if "ByteLevel" in decoders:
        scheme = "byte-level"
    elif decoders & {"ByteFallback", "Metaspace", "Replace"}:
        scheme = "sentencepiece"
    else:
        raise UnsupportedTokenizer(f"unknown token byte scheme; tokenizer decoders: {sorted(decoders)}")

    pieces = backend.get_vocab(with_added_tokens=True)
    added = backend.get_added_tokens_decoder()
    size = max(max(pieces.values()) + 1, len(tokenizer) if hasattr(tokenizer, "__len__") else 0)
    token_bytes = [b""] * size
    alphabet = _byte_level_alphabet()
    for piece, token_id in pieces.items():
        if token_id in added:
            continue
        if scheme == "byte-level":
            try:
                token_bytes[token_id] = bytes(alphabet[ch] for ch in piece)
            except KeyError:
                token_bytes[token_id] = piece.encode("utf-8")
        else:
            byte = _BYTE_FALLBACK.fullmatch(piece)
            token_bytes[token_id] = (
                bytes([int(byte.group(1), 16)]) if byte else piece.replace(_SENTENCEPIECE_SPACE, " ").encode()
            )

    special: set[int] = set()
    for token_id, token in added.items():
        text = token.content.replace(_SENTENCEPIECE_SPACE, " ") if scheme == "sentencepiece" else token.content
        token_bytes[token_id] = text.encode("utf-8")
        if token.special or _MARKER.fullmatch(token.content):
            special.add(token_id)
    special.update(i for i, b in enumerate(token_bytes) if not b)  # holes in the id range

    eos = list(eos_token_ids or [])
    primary = getattr(tokenizer, "eos_token_id", None)
    if primary is not None and primary not in eos:
        eos.insert(0, primary)
    if not eos:
        raise UnsupportedTokenizer("the tokenizer has no EOS token; pass eos_token_ids")
    special.update(eos)

    def encode_new(text: str) -> tuple[int, ...]:
        if hasattr(tokenizer, "backend_tokenizer"):
            return tuple(tokenizer.encode(text, add_special_tokens=False))
        return tuple(tokenizer.encode(text, add_special_tokens=False).ids)

    # a word's spellings are encoded again by every keyword request's draft and guard (~0.1 ms each)
    encode_short = lru_cache(maxsize=_ENCODED_KEPT)(encode_new)

    def encode(text: str) -> list[int]:
        return list(encode_short(text) if len(text) <= _SHORT_TEXT else encode_new(text))

    return TokenVocabulary(
        token_bytes=token_bytes,
        special_ids=frozenset(special),
        eos_token_ids=tuple(eos),
        scheme=scheme,
        encode=encode,
        build_seconds=time.perf_counter() - start,
    )
