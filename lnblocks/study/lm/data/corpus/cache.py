"""Files of the corpus cache, written so that a crash or a second process never leaves a half-written corpus:
temporary names in the same folder renamed into place (``os.replace`` is atomic on POSIX and Windows; JSON files go
through the study's ``core.atomic.write_json_atomic``), and one lock file per corpus (``filelock``: an OS lock,
released when its process dies, so a killed run leaves no stale lock). A cache file is trusted only after a check:
JSON files carry the sha256 of their own content (``seal`` / ``unseal``), token files the sha256 of theirs (counted
by ``TokenWriter`` as it writes, checked by ``file_sha256``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lnblocks.study.core.atomic import tmp_path


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, allow_nan=False).encode()).hexdigest()


def seal(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` plus ``"sha256"``: the digest of its canonical JSON, so an edited or damaged file is told apart."""
    return {**obj, "sha256": _digest(obj)}


def unseal(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(content without its digest, None)`` for a sound sealed JSON file, ``(None, why)`` for a damaged one,
    ``(None, None)`` when there is no file."""
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        return None, f"{path.name} is not readable JSON ({' '.join(str(err).split())})"
    if not isinstance(obj, dict) or not isinstance(obj.get("sha256"), str):
        return None, f"{path.name} carries no sha256 of its content"
    body = {k: v for k, v in obj.items() if k != "sha256"}
    if _digest(body) != obj["sha256"]:
        return None, f"{path.name} does not match its sha256 (edited or damaged)"
    return body, None


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 of a file, read in ``chunk``-byte pieces (bounded memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def corpus_lock(folder: Path) -> Iterator[None]:
    """Hold ``<folder>.lock`` (one preparer per corpus; others wait, then find it done). Says so when it waits."""
    from filelock import FileLock, Timeout

    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process preparing {folder} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class TokenWriter:
    """Appends token ids to a nanoGPT-format file under a temporary name, counting them per id and hashing the bytes
    as it goes; ``commit()`` renames it into place, leaving the context without ``commit()`` deletes it."""

    def __init__(self, path: Path, dtype: np.dtype, vocab_size: int) -> None:
        self.path, self.dtype, self.vocab_size = path, dtype, vocab_size
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.tokens = 0
        self.sha256 = hashlib.sha256()
        self._tmp = tmp_path(path)
        self._file: Any = None

    def __enter__(self) -> TokenWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._tmp, "wb")
        return self

    def write(self, ids: np.ndarray) -> None:
        """Append ``ids`` (any integer array); an id outside ``[0, vocab_size)`` raises ``ValueError``."""
        if ids.size == 0:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            bad = int(ids.max()) if int(ids.max()) >= self.vocab_size else int(ids.min())
            raise ValueError(f"the tokenizer produced id {bad}, outside [0, vocab_size={self.vocab_size})")
        raw = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        self._file.write(raw)
        self.sha256.update(raw)
        self.counts += np.bincount(ids, minlength=self.vocab_size)
        self.tokens += int(ids.size)

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def __exit__(self, *exc: object) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
