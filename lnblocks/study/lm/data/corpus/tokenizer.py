"""Local tokenizers for the corpus: raw ``bytes`` (V = 256), an HF ``tokenizer.json`` through ``tokenizers``, or a
tokenizer folder without one through ``transformers.AutoTokenizer`` (``local_files_only=True``). Nothing is ever
downloaded. ``identity`` is a hash of the tokenizer's own files, so a changed tokenizer gives a new cache entry.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from lnblocks._optional import require

BYTES = "bytes"
# the files that define a tokenizer in an HF folder (weights are not part of its identity)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


class TextTokenizer:
    """Text -> token ids, without special tokens (no [CLS]/[SEP], BOS/EOS), padding or truncation.

    ``name``: ``"bytes"`` or the path given; ``vocab_size``: number of ids (``max id + 1``); ``identity``: hash of
    the tokenizer's files; ``kind``: ``"bytes"``, ``"tokenizers"`` or ``"transformers"``.
    """

    def __init__(self, spec: str) -> None:
        self.name = spec
        self._fast: Any = None  # tokenizers.Tokenizer
        self._auto: Any = None  # transformers tokenizer
        if spec == BYTES:
            self.kind, self.vocab_size, self.identity = BYTES, 256, BYTES
            return
        path = Path(os.path.expanduser(spec))
        if path.is_file():
            self._load_fast(path)
            self.identity = _digest([path])
        elif path.is_dir():
            files = [path / f for f in _TOKENIZER_FILES if (path / f).is_file()]
            if not files:
                raise ValueError(f"tokenizer: {spec!r} holds none of the tokenizer files {list(_TOKENIZER_FILES)}")
            if (path / "tokenizer.json").is_file():
                self._load_fast(path / "tokenizer.json")
            else:
                self._load_auto(path)
            self.identity = _digest(files)
        else:
            raise ValueError(f"tokenizer: must be 'bytes' or a local tokenizer folder or file, got {spec!r}")

    def _load_fast(self, file: Path) -> None:
        tokenizers = require("tokenizers")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise ValueError(f"tokenizer: {str(file)!r} is not a valid tokenizer.json: {err}") from None
        tok.no_padding()  # a tokenizer.json may carry padding/truncation for its model: never cut or pad a corpus
        tok.no_truncation()
        self._fast, self.kind = tok, "tokenizers"
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def _load_auto(self, folder: Path) -> None:
        transformers = require("transformers")
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"tokenizer: transformers cannot load a tokenizer from {str(folder)!r}: {err}") from None
        tok.model_max_length = 1 << 62  # silence the "longer than the model" warning: we never feed the model these
        self._auto, self.kind = tok, "transformers"
        self.vocab_size = len(tok)

    def token_id(self, token: str) -> int:
        """The id of ``token`` (one token of the vocabulary; for bytes a one-byte string)."""
        if self.kind == BYTES:
            raw = token.encode("utf-8")
            if len(raw) != 1:
                raise ValueError(f"eos_token: with tokenizer 'bytes' it must be one byte, got {token!r}")
            return raw[0]
        tid = self._fast.token_to_id(token) if self._fast is not None else self._auto.convert_tokens_to_ids(token)
        unk = None if self._auto is None else self._auto.unk_token_id
        if tid is None or (unk is not None and tid == unk and token != self._auto.unk_token):
            raise ValueError(f"eos_token: {token!r} is not a token of the tokenizer {self.name!r}")
        return int(tid)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of every text (``encode_batch``: parallel in Rust across texts)."""
        if self.kind == BYTES:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        if self._fast is not None:
            return [np.asarray(e.ids, dtype=np.int64) for e in self._fast.encode_batch(texts, add_special_tokens=False)]
        ids = self._auto(texts, add_special_tokens=False, truncation=False, padding=False)["input_ids"]
        return [np.asarray(i, dtype=np.int64) for i in ids]

    def encode_pieces(self, pieces: list[bytes], where: str) -> np.ndarray:
        """Token ids of consecutive UTF-8 pieces of one document, concatenated (bytes: the bytes themselves);
        ``where`` names the input in a decode error."""
        if self.kind == BYTES:
            return np.frombuffer(b"".join(pieces), dtype=np.uint8)
        texts = []
        for piece in pieces:
            try:
                texts.append(piece.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{where} is not UTF-8 text (invalid byte {piece[err.start : err.start + 1]!r}): "
                    "fix the file or use tokenizer: bytes"
                ) from None
        ids = self.encode(texts)
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
