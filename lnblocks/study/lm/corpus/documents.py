"""Reading the documents of a corpus in bounded memory: text files in line-aligned pieces, dataset rows in batches.

A text file is read in blocks of ``BLOCK_BYTES`` cut into pieces of about ``PIECE_BYTES`` that are tokenized in one
``encode_batch`` call. Cuts go right after a newline that is followed by a non-space byte: pre-tokenizers that
split on whitespace (GPT-2's byte-level regex, BERT's, ``Whitespace``) split there anyway, so the ids equal those
of the whole document. (Tokenizers that prepend a marker to every input, like SentencePiece's ``▁``, may differ by a
token at a cut.) A line longer than a block is cut after a space, else at a UTF-8 character boundary.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.study.lm.corpus.config import CorpusConfig, expand_patterns

BLOCK_BYTES = 1 << 22
PIECE_BYTES = 1 << 16
ROWS_PER_BATCH = 1024
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_LINE_START = re.compile(rb"(?<=\n)[^ \t\n\r\x0b\x0c]")


def cut_before(buf: bytes, hi: int) -> int:
    """A cut ``c`` in ``(0, hi]`` that does not change tokenization: after the last newline followed by a
    non-space byte, else after the last whitespace, else at the last UTF-8 character start; ``hi`` if none."""
    hi = min(hi, len(buf))
    pos = buf.rfind(b"\n", 0, hi - 1) if hi >= 2 else -1
    while pos != -1:
        if buf[pos + 1] not in _SPACE:
            return pos + 1
        pos = buf.rfind(b"\n", 0, pos)
    c = max(buf.rfind(bytes([s]), 1, hi) for s in _SPACE)  # before the last whitespace ("a" | " b", as GPT-2)
    if c > 0:
        return c
    for c in range(hi, 0, -1):
        if c == len(buf) or (buf[c] & 0xC0) != 0x80:
            return c
    return hi


def held_out_offset(path: Path, val_fraction: float) -> int:
    """Byte offset where the held-out tail of a text file starts: the first clean cut at or after
    ``(1 - val_fraction)`` of its size (the last ``val_fraction`` of every file is held out, as for Shakespeare)."""
    size = path.stat().st_size
    target = int(size * (1.0 - val_fraction))
    with open(path, "rb") as f:
        f.seek(target)
        window = f.read(min(BLOCK_BYTES, size - target))
    if not window:
        return size
    m = _LINE_START.search(window)  # the first clean cut at or after the target
    if m is not None:
        return target + m.start()
    c = cut_before(window, len(window))
    return target + c if c < len(window) else size


def read_pieces(path: Path, start: int, end: int, progress: Any = None) -> Iterator[list[bytes]]:
    """Bytes ``[start, end)`` of ``path`` as lists of pieces (one list per block), cut where tokenization allows."""
    carry = b""
    pos = start
    with open(path, "rb") as f:
        f.seek(start)
        while pos < end or carry:
            data = f.read(min(BLOCK_BYTES, end - pos)) if pos < end else b""
            if pos < end and not data:
                raise ValueError(f"files: {str(path)!r} shrank while it was being read")
            pos += len(data)
            if progress is not None:
                progress.update(len(data))
            buf = carry + data
            if pos < end:
                c = cut_before(buf, len(buf))
                buf, carry = buf[:c], buf[c:]
            else:
                carry = b""
            pieces = []
            while len(buf) > PIECE_BYTES:
                c = cut_before(buf, PIECE_BYTES)
                pieces.append(buf[:c])
                buf = buf[c:]
            if buf:
                pieces.append(buf)
            if pieces:
                yield pieces


def text_documents(cfg: CorpusConfig) -> dict[str, list[tuple[Path, int, int]]]:
    """``{"train": [(file, start, end), ...], "val": [...]}``: the byte ranges of every document of each split."""
    train_files = expand_patterns("files", cfg.files)
    if cfg.val_files:
        val_files = expand_patterns("val_files", cfg.val_files)
        both = {f.resolve() for f in train_files} & {f.resolve() for f in val_files}
        if both:
            raise ValueError(f"val_files: {sorted(map(str, both))[0]!r} is also in files (train and val overlap)")
        return {
            "train": [(f, 0, f.stat().st_size) for f in train_files],
            "val": [(f, 0, f.stat().st_size) for f in val_files],
        }
    cuts = [(f, held_out_offset(f, cfg.val_fraction), f.stat().st_size) for f in train_files]
    return {"train": [(f, 0, c) for f, c, _ in cuts], "val": [(f, c, s) for f, c, s in cuts]}


# ---- datasets ---------------------------------------------------------------------------------------------------


def load_hf_dataset(cfg: CorpusConfig) -> tuple[Any, Any]:
    """``(train, val)`` ``datasets.Dataset``s; ``val`` is None when it is the tail ``val_fraction`` of ``train``."""
    datasets = require("datasets")
    fmt = cfg.resolved_format
    path = os.path.expanduser(cfg.dataset or "")
    if fmt == "disk":
        try:
            loaded = datasets.load_from_disk(path)
        except FileNotFoundError as err:
            raise ValueError(f"dataset: {cfg.dataset!r} is not a folder written by save_to_disk: {err}") from None
        if isinstance(loaded, datasets.DatasetDict):
            splits = list(loaded)
            for key, name in (("split", cfg.split), ("val_split", cfg.val_split)):
                if name is not None and name not in loaded:
                    raise ValueError(f"{key}: {name!r} is not a split of {cfg.dataset!r}; splits: {splits}")
            return loaded[cfg.split], (loaded[cfg.val_split] if cfg.val_split else None)
        if cfg.val_split is not None:
            raise ValueError(f"val_split: {cfg.dataset!r} is a single Dataset, not a DatasetDict with splits")
        return loaded, None
    files = [str(f) for f in expand_patterns("dataset", (cfg.dataset or "",))]
    hf_cache = str(cfg.resolved_cache_dir / "hf_datasets")  # datasets' arrow copy lives with our cache, not in ~
    return datasets.load_dataset(fmt, data_files=files, split="train", cache_dir=hf_cache), None


def dataset_rows(cfg: CorpusConfig) -> dict[str, tuple[Any, int, int]]:
    """``{"train": (dataset, first row, end row), "val": (...)}``, with the text column checked."""
    train, val = load_hf_dataset(cfg)
    for name, ds in (("train", train), ("val", val)):
        if ds is not None and cfg.text_column not in ds.column_names:
            raise ValueError(
                f"text_column: {cfg.text_column!r} is not a column of the {name} split; columns: {ds.column_names}"
            )
    if val is not None:
        return {"train": (train, 0, len(train)), "val": (val, 0, len(val))}
    n = len(train)
    n_val = max(1, round(n * cfg.val_fraction))
    if n - n_val < 1:
        raise ValueError(f"dataset: {n} row(s) cannot be split into train and val by val_fraction {cfg.val_fraction}")
    return {"train": (train, 0, n - n_val), "val": (train, n - n_val, n)}


def row_batches(ds: Any, start: int, end: int, column: str, progress: Any = None) -> Iterator[list[str]]:
    """The ``column`` texts of rows ``[start, end)`` in lists of ``ROWS_PER_BATCH``; a non-string row is an error."""
    for lo in range(start, end, ROWS_PER_BATCH):
        hi = min(lo + ROWS_PER_BATCH, end)
        texts = ds[lo:hi][column]
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text_column: row {lo + i} of {column!r} is {type(t).__name__}, not a string")
        if progress is not None:
            progress.update(hi - lo)
        yield texts
