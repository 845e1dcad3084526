"""Reading the documents of a corpus in bounded memory: text files in line-aligned pieces, dataset rows in batches.

A text file is read in blocks of ``BLOCK_BYTES`` cut into pieces of about ``PIECE_BYTES`` that are tokenized in one
``encode_batch`` call. Cuts go right after a lone newline (a non-space byte on each side): pre-tokenizers that
split on whitespace (GPT-2's byte-level regex, BERT's, ``Whitespace``) split there anyway, so the ids equal those
of the whole document. (Tokenizers that prepend a marker to every input, like SentencePiece's ``▁``, may differ by a
token at a cut.) A line longer than a block is cut where a run of whitespace starts, else at a UTF-8 character
boundary.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.study.lm.data.corpus.config import CorpusConfig, expand_patterns

BLOCK_BYTES = 1 << 22
PIECE_BYTES = 1 << 16
HELD_OUT_WINDOW = 1 << 16  # bytes searched on each side of a file's held-out target for a line start
ROWS_PER_BATCH = 1024
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_SPACES = tuple(bytes([c]) for c in sorted(_SPACE))  # each whitespace byte, for bytes.find
_RUN_START = re.compile(rb"(?<=[^ \t\n\r\x0b\x0c])[ \t\n\r\x0b\x0c]")  # a whitespace byte after a non-space
_LONE_NEWLINE = re.compile(rb"(?<=[^ \t\n\r\x0b\x0c])\n(?=[^ \t\n\r\x0b\x0c])")  # a newline between non-spaces


def _last_match(pattern: re.Pattern[bytes], needles: tuple[bytes, ...], buf: bytes, lo: int, hi: int) -> int:
    """Start of the last match of ``pattern`` (one byte, one of ``needles``, with look-arounds) in ``buf[lo:hi]``,
    its look-arounds reading only inside ``[lo, hi)``; -1 if none. Scanned backwards in windows that double in
    size, so a match ``d`` bytes before ``hi`` costs about ``2 d`` bytes read, and a window without any of
    ``needles`` is skipped by ``bytes.find`` alone: linear in the distance, where rescanning one growing window from
    ``hi`` was quadratic on text without whitespace."""
    top, width = hi, 4096
    while top > lo:
        start = max(lo, top - width)
        if any(buf.find(n, start, top) != -1 for n in needles):
            # endpos top + 1 lets a look-ahead read byte `top` (inside [lo, hi)); matches at >= top were seen before
            found = [m.start() for m in pattern.finditer(buf, start, min(top + 1, hi)) if m.start() < top]
            if found:
                return found[-1]
        top, width = start, width * 2
    return -1


def cut_before(buf: bytes, hi: int, lo: int = 0) -> int:
    """A cut ``c`` in ``(lo, hi]`` that does not change tokenization of ``buf[lo:]``: after the last newline between
    two non-space bytes (a lone newline: GPT-2's ``\\s+(?!\\S)`` would join ``" \\n"`` or ``"\\n\\n"`` at the end
    of a piece into one pre-token), else at the start of the last whitespace run, else at the last UTF-8 character
    start; ``hi`` if none. Linear in ``hi - c`` (``_last_match``)."""
    hi = min(hi, len(buf))
    lone = _last_match(_LONE_NEWLINE, (b"\n",), buf, lo + 1, hi)  # a newline at p needs a non-space at p - 1 >= lo
    if lone != -1:
        return lone + 1
    run = _last_match(_RUN_START, _SPACES, buf, lo + 1, hi)  # the start of the last whitespace run ("a" | "   b")
    if run != -1:
        return run
    for c in range(hi, max(lo, hi - 4), -1):  # a UTF-8 character is at most 4 bytes
        if c == len(buf) or (buf[c] & 0xC0) != 0x80:
            return c
    return hi


def held_out_offset(path: Path, val_fraction: float) -> int:
    """Byte offset where the held-out tail of a text file starts: the line start (any indentation) nearest to
    ``(1 - val_fraction)`` of its size, else the nearest whitespace, else the nearest UTF-8 character start, searched
    within ``HELD_OUT_WINDOW`` bytes of that target. So the tail is ``val_fraction`` of every file to within one line,
    source code included (the first *unindented* line after the target, the rule before ``CORPUS_FORMAT`` 2, is often
    near a module's end: 4.6% held out of the Python standard library at 0.1). The two parts are separate documents,
    so the cut need not keep the whole file's tokenization."""
    size = path.stat().st_size
    if size < 2:
        return size
    target = min(max(round(size * (1.0 - val_fraction)), 1), size - 1)
    lo = max(0, target - HELD_OUT_WINDOW)
    with open(path, "rb") as f:
        f.seek(lo)
        window = f.read(min(size, target + HELD_OUT_WINDOW) - lo)
    t = target - lo
    line_starts = (window.rfind(b"\n", 0, t) + 1 or None, window.find(b"\n", t) + 1 or None)  # after a newline
    space = (  # before a whitespace byte ("a" | " b")
        max(window.rfind(bytes([c]), 0, t) for c in _SPACE),
        min((i for i in (window.find(bytes([c]), t) for c in _SPACE) if i >= 0), default=-1),
    )
    for found in (line_starts, space):
        cuts = [lo + c for c in found if c is not None and c >= 0 and 0 < lo + c < size]
        if cuts:
            return min(cuts, key=lambda c: (abs(c - target), c))
    while t > 0 and (window[t] & 0xC0) == 0x80:  # a UTF-8 continuation byte: step back to the character's start
        t -= 1
    return lo + t


def undecodable(paths: list[Path], progress: Any = None) -> list[tuple[Path, int, bytes]]:
    """``(file, offset, byte)`` of the first invalid byte of every file in ``paths`` that is not UTF-8 text: one
    streaming pass over all of them, so every bad file is known before a tokenizing pass starts."""
    bad = []
    for path in paths:
        decoder = codecs.getincrementaldecoder("utf-8")()
        pos = 0
        with open(path, "rb") as f:
            try:
                while block := f.read(BLOCK_BYTES):
                    pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
                    decoder.decode(block)
                    pos += len(block)
                    if progress is not None:
                        progress.update(len(block))
                pending = len(decoder.getstate()[0])
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as err:
                bad.append((path, pos - pending + err.start, err.object[err.start : err.start + 1]))
    return bad


def read_pieces(path: Path, start: int, end: int, progress: Any = None, *, cuts: bool = True) -> Iterator[list[bytes]]:
    """Bytes ``[start, end)`` of ``path`` as lists of pieces (one list per block), cut where tokenization allows
    (``cut_before``); ``cuts=False`` (a tokenizer that maps every byte on its own, ``bytes``): at fixed sizes, no
    search. Each piece is a slice of its block (no copy of the rest), so a block costs one pass whatever its text."""
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
            stop = len(buf)
            if pos < end and cuts:
                stop = cut_before(buf, len(buf))
            buf, carry = buf[:stop], buf[stop:]
            pieces = []
            at = 0
            while len(buf) - at > PIECE_BYTES:
                c = cut_before(buf, at + PIECE_BYTES, at) if cuts else at + PIECE_BYTES
                pieces.append(buf[at:c])
                at = c
            if at < len(buf):
                pieces.append(buf[at:])
            if pieces:
                yield pieces


def text_documents(
    train_files: list[Path], val_files: list[Path], val_fraction: float
) -> dict[str, list[tuple[Path, int, int]]]:
    """``{"train": [(file, start, end), ...], "val": [...]}``: the byte ranges of every document of each split
    (without ``val_files``, the tail of every file from ``held_out_offset``)."""
    if val_files:
        return {
            "train": [(f, 0, f.stat().st_size) for f in train_files],
            "val": [(f, 0, f.stat().st_size) for f in val_files],
        }
    cuts = [(f, held_out_offset(f, val_fraction), f.stat().st_size) for f in train_files]
    return {"train": [(f, 0, c) for f, c, _ in cuts], "val": [(f, c, s) for f, c, s in cuts]}


# ---- datasets ---------------------------------------------------------------------------------------------------

_EXPECTED = {
    "json": "JSON lines (one object per line) or a JSON array of objects, with a {col!r} field",
    "csv": "CSV with a header row naming a {col!r} column",
    "text": "text, one row per line",
    "parquet": "Parquet with a {col!r} column",
}


def _root_cause(err: BaseException) -> str:
    """The innermost message of an exception chain, on one line (datasets wraps the reader's error)."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return " ".join(str(err).split()) or type(err).__name__


@contextlib.contextmanager
def _quiet_datasets(datasets: Any) -> Iterator[None]:
    """datasets' own progress bars and logged reader errors off (we report one line ourselves)."""
    was_on, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if was_on:
            datasets.enable_progress_bars()


def _empty_saved_splits(root: Path) -> list[str]:
    """The splits of a ``save_to_disk`` folder that hold no data file (``load_from_disk`` raises IndexError)."""
    import json

    def empty(folder: Path) -> bool:
        try:
            return not json.loads((folder / "state.json").read_text()).get("_data_files")
        except (OSError, ValueError, AttributeError):
            return False

    if (root / "state.json").is_file():
        return ["(the dataset)"] if empty(root) else []
    try:
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in splits if isinstance(s, str) and empty(root / s)]


def _load_from_disk(datasets: Any, cfg: CorpusConfig, path: str) -> Any:
    try:
        return datasets.load_from_disk(path)
    except FileNotFoundError as err:
        raise ValueError(f"dataset: {cfg.dataset!r} is not a folder written by save_to_disk: {err}") from None
    except Exception as err:  # datasets raises IndexError, KeyError, ArrowInvalid... on empty or damaged folders
        empty = _empty_saved_splits(Path(path))
        if empty:
            raise ValueError(
                f"dataset: {cfg.dataset!r} holds no rows in {', '.join(map(repr, empty))}: expected a save_to_disk "
                f"folder with at least one row of {cfg.text_column!r} text in every split"
            ) from None
        raise ValueError(
            f"dataset: {cfg.dataset!r} cannot be read by datasets.load_from_disk ({_root_cause(err)}): expected a "
            "folder written by Dataset.save_to_disk or DatasetDict.save_to_disk"
        ) from None


def _load_files(datasets: Any, cfg: CorpusConfig, fmt: str, hf_cache: Path) -> Any:
    files = [str(f) for f in expand_patterns("dataset", (cfg.dataset or "",))]
    expected = _EXPECTED[fmt].format(col=cfg.text_column)
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty:
        raise ValueError(f"dataset: {empty[0]!r} is empty ({len(empty)} empty file(s)); expected {expected}")
    try:
        ds = datasets.load_dataset(fmt, data_files=files, split="train", cache_dir=str(hf_cache))
    except Exception as err:  # DatasetGenerationError, ArrowInvalid, StopIteration, ValueError...: name the file
        cause = _root_cause(err)
        named = [f for f in files if f in cause or os.path.basename(f) in cause]
        where = repr(named[0]) if named else repr(files[0]) if len(files) == 1 else f"one of {len(files)} files"
        raise ValueError(f"dataset: {where} cannot be read as {fmt} ({cause}); expected {expected}") from None
    if len(ds) == 0:
        raise ValueError(f"dataset: {cfg.dataset!r} holds no rows; expected {expected}")
    return ds


def load_hf_dataset(cfg: CorpusConfig, hf_cache: Path) -> tuple[Any, Any]:
    """``(train, val)`` ``datasets.Dataset``s; ``val`` is None when it is the tail ``val_fraction`` of ``train``.
    Files are read by ``datasets.load_dataset`` with its arrow copy under ``hf_cache`` (a temporary folder the
    caller removes). An empty, malformed or unreadable input raises one ``ValueError`` naming it and what was
    expected."""
    datasets = require("datasets")
    fmt = cfg.resolved_format or ""
    with _quiet_datasets(datasets):
        if fmt != "disk":
            return _load_files(datasets, cfg, fmt, hf_cache), None
        loaded = _load_from_disk(datasets, cfg, os.path.expanduser(cfg.dataset or ""))
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        for key, name in (("split", cfg.split), ("val_split", cfg.val_split)):
            if name is not None and name not in loaded:
                raise ValueError(f"{key}: {name!r} is not a split of {cfg.dataset!r}; splits: {splits}")
        return loaded[cfg.split], (loaded[cfg.val_split] if cfg.val_split else None)
    if cfg.val_split is not None:
        raise ValueError(f"val_split: {cfg.dataset!r} is a single Dataset, not a DatasetDict with splits")
    return loaded, None


def dataset_rows(cfg: CorpusConfig, hf_cache: Path) -> dict[str, tuple[Any, int, int]]:
    """``{"train": (dataset, first row, end row), "val": (...)}``, with the text column checked."""
    train, val = load_hf_dataset(cfg, hf_cache)
    for name, ds in (("train", train), ("val", val)):
        if ds is not None and cfg.text_column not in ds.column_names:
            raise ValueError(
                f"text_column: {cfg.text_column!r} is not a column of the {name} split; columns: {ds.column_names}"
            )
    for key, name, ds in (("split", cfg.split, train), ("val_split", cfg.val_split, val)):
        if ds is not None and len(ds) == 0:
            raise ValueError(f"{key}: the split {name!r} of {cfg.dataset!r} holds no rows")
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
