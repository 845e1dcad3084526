"""Files of the corpus cache, written so that a crash or a second process never leaves a half-written corpus:
token files under temporary names in the same folder renamed into place (``os.replace`` is atomic on POSIX and
Windows; JSON files go through the study's ``core.atomic.write_json_atomic``), and one lock file per corpus
(``filelock``: an OS lock, released when its process dies, so a killed run leaves no stale lock)."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


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
    """Appends token ids to a nanoGPT-format file under a temporary name, counting them per id as it goes;
    ``commit()`` renames it into place, leaving the context without ``commit()`` deletes it."""

    def __init__(self, path: Path, dtype: np.dtype, vocab_size: int) -> None:
        self.path, self.dtype, self.vocab_size = path, dtype, vocab_size
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.tokens = 0
        self._tmp = _tmp_name(path)
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
        self._file.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
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
