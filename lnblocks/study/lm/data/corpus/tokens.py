"""nanoGPT-format token files: checks, streaming token counts, reference losses, and ``TokenFileSource``.

A token file is a flat array of token ids (``uint16`` when the vocabulary fits, else ``uint32``) with no header.
Files are read through ``numpy.memmap`` opened anew for every batch (nanoGPT does the same: pages of a long-lived
memmap count against the process), so a corpus far larger than RAM works: a batch reads ``B * (T + 1)`` tokens.
Counts for the unigram reference are made in fixed-size chunks, never holding the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lnblocks.study.core.atomic import write_json_atomic
from lnblocks.study.lm.data.corpus.cache import file_sha256, seal, unseal
from lnblocks.study.lm.data.corpus.verify import reference_problem
from lnblocks.study.lm.data.source import EVAL_SEED_OFFSET, TokenSource

COUNT_CHUNK_TOKENS = 1 << 23  # tokens per bincount chunk: 64 MiB of int64 at most
SAMPLE_BLOCKS = 16  # blocks of the file checked for ids >= vocab_size when a source opens
SAMPLE_BLOCK_TOKENS = 1 << 16
REFERENCE_FORMAT = 3  # in the key of a reference-loss entry: 1 had no sha256 and no max_id, 2 no files' sha256


def token_count(path: Path, dtype: np.dtype, name: str = "path") -> int:
    """Number of tokens in ``path``; ``ValueError`` naming ``name`` if it is missing, empty or not whole tokens."""
    if not path.is_file():
        raise ValueError(f"{name}: no such token file: {str(path)!r}")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ValueError(
            f"{name}: {str(path)!r} has {size} bytes, not a multiple of {dtype.itemsize} "
            f"(token_dtype {dtype.name}): a different dtype, or a truncated file"
        )
    if size == 0:
        raise ValueError(f"{name}: {str(path)!r} is empty")
    return size // dtype.itemsize


def _bad_id_error(name: str, path: Path, ids: np.ndarray, offset: int, vocab_size: int, dtype: np.dtype) -> ValueError:
    where = int(np.argmax(ids >= vocab_size))
    return ValueError(
        f"{name}: {str(path)!r} holds token id {int(ids[where])} at position {offset + where}, "
        f">= vocab_size {vocab_size} (wrong vocab_size, or token_dtype {dtype.name} does not match the file)"
    )


def check_sample(path: Path, dtype: np.dtype, vocab_size: int, name: str = "path") -> str | None:
    """Check ids ``< vocab_size`` in the head, the tail and ``SAMPLE_BLOCKS`` evenly spaced blocks of the file.
    Returns a warning when the layout looks like ``uint32`` ids read as ``uint16`` (every odd ``uint16`` is 0: the
    high halves of little-endian ids below 65,536), else None."""
    n = token_count(path, dtype, name)
    data = np.memmap(path, dtype=dtype, mode="r")
    starts = np.linspace(0, max(n - SAMPLE_BLOCK_TOKENS, 0), SAMPLE_BLOCKS, dtype=np.int64)
    odd_zero = even_nonzero = True
    for start in np.unique(starts):
        block = np.asarray(data[start : start + SAMPLE_BLOCK_TOKENS])
        if block.size and int(block.max()) >= vocab_size:
            raise _bad_id_error(name, path, block, int(start), vocab_size, dtype)
        phase = int(start) % 2  # block[k] is file position start + k: odd positions are block[1 - phase :: 2]
        odd_zero &= not block[1 - phase :: 2].any()
        even_nonzero &= bool(block[phase::2].any())
    if dtype == np.uint16 and n >= 64 and odd_zero and even_nonzero:
        return (
            f"{name}: every odd uint16 of {str(path)!r} is 0 in the blocks checked: uint32 ids read as uint16? "
            "(set token_dtype: uint32 if so)"
        )
    return None


def count_tokens(
    path: Path,
    dtype: np.dtype,
    vocab_size: int,
    *,
    name: str = "path",
    chunk_tokens: int = COUNT_CHUNK_TOKENS,
    progress: Any = None,
    hasher: Any = None,
) -> np.ndarray:
    """``(vocab_size,)`` int64 counts of every id in ``path``, made chunk by chunk (streaming ``bincount``).
    Every id is checked: one ``>= vocab_size`` raises ``ValueError`` with its position. ``progress``: a tqdm bar
    advanced by tokens; ``hasher``: a ``hashlib`` object fed the file's bytes on the way (its sha256 for free)."""
    n = token_count(path, dtype, name)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, n, chunk_tokens):
        chunk = np.memmap(
            path, dtype=dtype, mode="r", offset=start * dtype.itemsize, shape=(min(chunk_tokens, n - start),)
        )
        if int(chunk.max()) >= vocab_size:  # before bincount, which would allocate max id + 1 counters
            raise _bad_id_error(name, path, np.asarray(chunk), start, vocab_size, dtype)
        counts += np.bincount(chunk, minlength=vocab_size)
        if hasher is not None:
            hasher.update(chunk)
        del chunk
        if progress is not None:
            progress.update(min(chunk_tokens, n - start))
    return counts


def unigram_from_counts(train_counts: np.ndarray, val_counts: np.ndarray) -> float:
    """Cross-entropy (nats/token) on the val split of add-one-smoothed train frequencies: the loss of a model that
    knows the token frequencies and nothing else (same definition as ``lnblocks.study.lm.data.source.unigram_loss``)."""
    p = (train_counts.astype(np.float64) + 1.0) / (train_counts.sum() + len(train_counts))
    return float(-(val_counts.astype(np.float64) * np.log(p)).sum() / val_counts.sum())


def reference_from_counts(train_counts: np.ndarray, val_counts: np.ndarray) -> dict[str, float]:
    """``{"uniform": ln V, "unigram": ...}``: the losses a run is compared with ("stuck" = at the unigram plateau)."""
    return {"uniform": math.log(len(train_counts)), "unigram": unigram_from_counts(train_counts, val_counts)}


def _file_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


_HASHED: dict[tuple[Any, ...], str] = {}  # this process's sha256 of token files, by _content_stat


def _content_stat(path: Path) -> tuple[Any, ...]:
    """A ``stat`` that changes whenever the bytes may have: inode, size, mtime and ctime (which every write sets
    and no copy tool can set back, unlike the mtime ``cp -p`` and ``rsync -a`` keep)."""
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def token_file_sha256(path: Path) -> str:
    """sha256 of a token file, read at most once per process while its ``_content_stat`` stays the same (a study's
    driver asks for it twice: for the runs' ids and for the check before the runs)."""
    key = _content_stat(path)
    if key not in _HASHED:
        _HASHED[key] = file_sha256(path)
    return _HASHED[key]


def same_content(a: Path, b: Path, chunk: int = 1 << 24) -> bool:
    """Whether two files hold the same bytes (sizes first: a full read only for files of equal size)."""
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                return False
            if not x:
                return True


def _cached_reference(path: Path, key: dict[str, Any], vocab_size: int, train_tokens: int) -> dict[str, Any] | None:
    """The reference-loss entry at ``path`` if it is sound and for ``key``; a damaged one is named on stderr."""
    body, why = unseal(path)
    if body is None and why is None:
        return None
    if body is not None:
        if body.get("key") != key:
            return None  # a digest collision of the name, or another key: recompute quietly
        why = reference_problem(body.get("reference"), vocab_size, train_tokens)
        max_id = body.get("max_id")
        if why is None and not (isinstance(max_id, int) and 0 <= max_id < vocab_size):
            why = f"max_id {max_id!r} is not an id below vocab_size {vocab_size}"
        sha = body.get("bin_sha256")
        if why is None and not (isinstance(sha, dict) and all(isinstance(sha.get(k), str) for k in ("train", "val"))):
            why = "it carries no sha256 of the token files"
        if why is None:
            return body
    print(f"warning: reference-loss cache {str(path)!r}: {why}; recomputing it", file=sys.stderr, flush=True)
    return None


def reference_entry(
    train_path: Path,
    val_path: Path,
    dtype: np.dtype,
    vocab_size: int,
    *,
    cache_dir: Path | None = None,
    show_progress: bool = False,
    chunk_tokens: int = COUNT_CHUNK_TOKENS,
    verify: bool = False,
) -> dict[str, Any]:
    """``{"reference": {...}, "max_id": ..., "bin_sha256": {"train", "val"}}`` of a pair of token files
    (``reference_losses``, plus the largest id in either file: what ``vocab_size`` is checked against, and each
    file's sha256: what the corpus digest of a run is made of). The cache entry is found by both files' path, size
    and mtime; ``verify`` also hashes the files (``token_file_sha256``) and recounts when their sha256 is not the
    entry's: new bytes behind the same size and mtime (``cp -p``, ``rsync -a``, a re-extracted archive) then give
    new sha256s, so a new corpus digest and new run ids."""
    key = {
        "format": REFERENCE_FORMAT,
        "train": _file_key(train_path),
        "val": _file_key(val_path),
        "dtype": dtype.name,
        "vocab_size": vocab_size,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    cached = None if cache_dir is None else cache_dir / "reference" / f"{digest}.json"
    n_train = token_count(train_path, dtype, "train_path")
    if cached is not None:
        hit = _cached_reference(cached, key, vocab_size, n_train)
        if hit is not None and verify and _changed_since(hit["bin_sha256"], train_path, val_path, cached):
            hit = None
        if hit is not None:
            return {"reference": hit["reference"], "max_id": hit["max_id"], "bin_sha256": hit["bin_sha256"]}
    n = n_train + token_count(val_path, dtype, "val_path")
    bar = None
    if show_progress:
        from lnblocks._optional import require

        bar = require("tqdm").tqdm(total=n, desc="counting tokens", unit="tok", unit_scale=True, leave=False)
    sha = {"train": hashlib.sha256(), "val": hashlib.sha256()}
    options = {"chunk_tokens": chunk_tokens, "progress": bar}
    try:
        train = count_tokens(train_path, dtype, vocab_size, name="train_path", hasher=sha["train"], **options)
        val = count_tokens(val_path, dtype, vocab_size, name="val_path", hasher=sha["val"], **options)
    finally:
        if bar is not None:
            bar.close()
    entry = {
        "reference": reference_from_counts(train, val),
        "max_id": int(np.flatnonzero(train + val).max()),
        "bin_sha256": {k: h.hexdigest() for k, h in sha.items()},
    }
    if cached is not None:
        write_json_atomic(cached, seal({"key": key, **entry}))
    for p, side in ((train_path, "train"), (val_path, "val")):
        _HASHED[_content_stat(p)] = entry["bin_sha256"][side]
    return entry


def _changed_since(sha: dict[str, str], train_path: Path, val_path: Path, cached: Path) -> bool:
    """Whether the token files hold other bytes than the reference-loss entry ``cached`` was counted over (said
    on stderr: it is recounted)."""
    now = {"train": token_file_sha256(train_path), "val": token_file_sha256(val_path)}
    changed = [side for side in ("train", "val") if now[side] != sha[side]]
    if changed:
        print(
            f"note: the {' and '.join(changed)} token file(s) changed since {str(cached)!r} was counted (same size "
            "and mtime, other bytes); recounting them: the corpus digest, and so the run ids, change with them",
            file=sys.stderr,
            flush=True,
        )
    return bool(changed)


def reference_losses(
    train_path: Path, val_path: Path, dtype: np.dtype, vocab_size: int, **options: Any
) -> dict[str, float]:
    """Reference losses of a pair of token files, by one streaming pass over both (which also checks every id).
    Cached in ``cache_dir/reference/`` under a key of both files' path, size and mtime, the dtype and vocab_size; a
    cached entry is checked (its sha256, ``uniform`` = ln V, ``unigram`` in range) and recomputed if it fails.
    ``options``: ``reference_entry``'s (``cache_dir``, ``show_progress``, ``chunk_tokens``)."""
    return reference_entry(train_path, val_path, dtype, vocab_size, **options)["reference"]


class TokenFileSource(TokenSource):
    """Random ``seq_len + 1`` windows ``data[i : i + T + 1]`` of the train file at offsets drawn from the run's
    generator (``batch``), and ``eval_batches`` fixed windows of the val file from their own generator seeded with
    ``data_seed + EVAL_SEED_OFFSET`` (``eval_set``): the same contract as the built-in sources.

    ``reference``: given (e.g. counted while tokenizing), else computed by a streaming pass and cached (see
    ``reference_losses``). Opening checks sizes, lengths and a sample of ids; the reference pass checks every id.
    ``lease``: what holds a cache entry in use while the source lives; ``corpus``: the summary a run record keeps
    (both set by ``open_corpus``).
    """

    lease: Any = None
    corpus: dict[str, Any] | None = None

    def __init__(
        self,
        train_path: str | os.PathLike[str],
        val_path: str | os.PathLike[str],
        *,
        vocab_size: int,
        token_dtype: str = "uint16",
        seq_len: int,
        batch_size: int,
        eval_batches: int = 8,
        data_seed: int = 0,
        reference: dict[str, float] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        show_progress: bool = False,
    ) -> None:
        if token_dtype not in ("uint16", "uint32"):
            raise ValueError(f"token_dtype must be 'uint16' or 'uint32', got {token_dtype!r}")
        for name, v, lo in (("vocab_size", vocab_size, 2), ("seq_len", seq_len, 1), ("batch_size", batch_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if not isinstance(eval_batches, int) or eval_batches < 1:
            raise ValueError(f"eval_batches must be an int >= 1, got {eval_batches!r}")
        self.dtype = np.dtype(token_dtype)
        if vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"token_dtype {token_dtype} cannot hold the ids of vocab_size {vocab_size}; use uint32")
        self.train_path = Path(os.path.expanduser(train_path))
        self.val_path = Path(os.path.expanduser(val_path))
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.eval_batches, self.data_seed = eval_batches, data_seed
        self.train_tokens = token_count(self.train_path, self.dtype, "train_path")
        self.val_tokens = token_count(self.val_path, self.dtype, "val_path")
        for name, n in (("train_path", self.train_tokens), ("val_path", self.val_tokens)):
            if n < seq_len + 1:
                raise ValueError(f"{name}: {n} tokens, fewer than seq_len + 1 = {seq_len + 1} (one window)")
        check_sample(self.train_path, self.dtype, vocab_size, "train_path")
        check_sample(self.val_path, self.dtype, vocab_size, "val_path")
        if reference is None:
            reference = reference_losses(
                self.train_path,
                self.val_path,
                self.dtype,
                vocab_size,
                cache_dir=Path(cache_dir) if cache_dir is not None else None,
                show_progress=show_progress,
            )
        self.reference = dict(reference)

    def _windows(self, path: Path, n: int, count: int, generator: torch.Generator) -> Tensor:
        T = self.seq_len
        starts = torch.randint(0, n - T, (count,), generator=generator).numpy()
        data = np.memmap(path, dtype=self.dtype, mode="r")  # re-opened per batch; only the windows are read
        w = data[starts[:, None] + np.arange(T + 1)].astype(np.int64)  # (count, T + 1): one gather of the pages
        del data
        return torch.from_numpy(w)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:  # (B, T), (B, T)
        w = self._windows(self.train_path, self.train_tokens, batch_size, generator)
        return w[:, :-1], w[:, 1:]

    def eval_set(self) -> list[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(self.data_seed + EVAL_SEED_OFFSET)
        out = []
        for _ in range(self.eval_batches):
            w = self._windows(self.val_path, self.val_tokens, self.batch_size, g)
            out.append((w[:, :-1], w[:, 1:]))
        return out
