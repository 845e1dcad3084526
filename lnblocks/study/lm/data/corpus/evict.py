"""A bounded corpus cache: which prepared corpora are in use, which are stale, and removing the rest.

Every prepared corpus ``<cache_dir>/<source>-<key>/`` has a ``used`` file touched whenever it is prepared or opened
(its mtime orders the entries, most recently used first) and an ``in-use`` file on which every process that reads
the corpus holds a shared lock (``fcntl.flock``, released when the process ends, even when it is killed). After a new
entry is made, the entries of the same *lineage* (the same corpus config over older versions of its input files:
their key holds the old sizes and mtimes, so they can never be hit again) are removed, then the least recently used
beyond ``LNBLOCKS_CORPUS_KEEP`` (default 8; 0 turns this off). An entry another process is preparing (its lock is
held) or reading (its ``in-use`` lock is held) is never removed: removal takes both locks without waiting, and a
reader takes its shared lock while it holds the entry's lock, so the two never interleave. ``lnblocks data clean``
(``clean``) does the same on request, with ``--keep N`` or ``--all``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from lnblocks.study.lm.data.corpus.cache import unseal

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: readers cannot be seen, so no automatic removal
    fcntl = None  # type: ignore[assignment]

KEEP_ENV = "LNBLOCKS_CORPUS_KEEP"
DEFAULT_KEEP = 8
ENTRY = re.compile(r"^(text|hf_dataset)-[0-9a-f]{20}$")
REFERENCE = re.compile(r"^[0-9a-f]{32}\.json$")
LEGACY_DATASETS = "hf_datasets"  # datasets' arrow copies, kept here before CORPUS_FORMAT 2 (now a temp folder)


def _count(text: str, what: str) -> int:
    """``text`` as an int >= 0, else ``ValueError`` saying ``what`` must be one."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {text!r}")
    return value


def keep_limit() -> int:
    """How many entries the cache keeps: ``$LNBLOCKS_CORPUS_KEEP`` (an int >= 0; 0: no automatic removal)."""
    text = os.environ.get(KEEP_ENV, "").strip()
    return _count(text, f"{KEEP_ENV} (0: never remove corpora automatically)") if text else DEFAULT_KEEP


def touch(folder: Path) -> None:
    """Mark ``folder`` as used now (the eviction order)."""
    (folder / "used").touch()


class Lease:
    """A shared lock on ``<entry>/in-use``, held while this process reads the entry: ``remove`` leaves it alone.
    Take it while holding the entry's lock; it ends with ``close()``, the object, or the process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = os.open(folder / "in-use", os.O_RDONLY | os.O_CREAT, 0o644)
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def __del__(self) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class Entry:
    """A folder of the cache: when it was last used, its size, and the lineage its manifest names (None when the
    manifest is missing, damaged or of another format)."""

    folder: Path
    used: float
    size: int
    lineage: str | None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def entries(cache_dir: Path) -> list[Entry]:
    """The corpus entries under ``cache_dir``, most recently used first (only folders named like ours)."""
    out = []
    for folder in cache_dir.iterdir() if cache_dir.is_dir() else ():
        if not (folder.is_dir() and ENTRY.match(folder.name)):
            continue
        stamp = folder / "used"
        try:
            used = (stamp if stamp.exists() else folder).stat().st_mtime
            size = _size(folder)
        except OSError:  # removed meanwhile
            continue
        meta, _ = unseal(folder / "meta.json")
        lineage = meta.get("lineage") if meta is not None else None
        out.append(Entry(folder, used, size, lineage if isinstance(lineage, str) else None))
    return sorted(out, key=lambda e: e.used, reverse=True)


def remove(folder: Path) -> bool:
    """Remove the entry ``folder`` unless a process prepares or reads it (then False: left alone)."""
    from filelock import FileLock, Timeout

    if fcntl is None:
        return False
    lock = FileLock(str(folder) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    fd = None
    try:
        if not folder.is_dir():
            return False
        fd = os.open(folder / "in-use", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        (folder / "meta.json").unlink(missing_ok=True)  # incomplete from here on: never read as a corpus
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        if fd is not None:
            os.close(fd)
        lock.release()


def evict(cache_dir: Path, keep: int, protect: Path, lineage: str | None) -> list[Entry]:
    """After ``protect`` was made: remove the older entries of its ``lineage``, then the least recently used beyond
    ``keep`` (``protect`` is never removed; ``keep`` 0: nothing is). The removed entries."""
    if keep <= 0:
        return []
    removed = []
    kept = 0
    for e in entries(cache_dir):
        if e.folder == protect:
            kept += 1
            continue
        stale = lineage is not None and e.lineage == lineage
        if (stale or kept >= keep) and remove(e.folder):
            removed.append(e)
        else:
            kept += 1
    return removed


def _stale_reference(path: Path) -> bool:
    """A reference-loss cache file whose token files changed (or are gone) can never be hit again."""
    body, _ = unseal(path)
    if body is None:
        return True
    try:
        for side in ("train", "val"):
            f = body["key"][side]
            st = os.stat(f["path"])
            if (st.st_size, st.st_mtime_ns) != (f["size"], f["mtime_ns"]):
                return True
    except (OSError, KeyError, TypeError):
        return True
    return False


def clean(cache_dir: Path, keep: int | None) -> dict[str, Any]:
    """Remove the corpus entries of ``cache_dir`` beyond the ``keep`` most recently used (``None``: all of them),
    older entries of a lineage, stale reference-loss files and the old datasets copy; never an entry in use.
    Returns what was removed and kept: counts and bytes."""
    removed, kept, busy = [], [], []
    lineages: set[str] = set()
    for e in entries(cache_dir):
        superseded = e.lineage is not None and e.lineage in lineages
        if keep is not None and not superseded and len(kept) + len(busy) < keep:
            kept.append(e)
        elif remove(e.folder):
            removed.append(e)
        else:
            busy.append(e)
        if e.lineage is not None:
            lineages.add(e.lineage)
    freed = sum(e.size for e in removed)
    refs = cache_dir / "reference"
    n_refs = 0
    for path in sorted(refs.iterdir()) if refs.is_dir() else ():
        if REFERENCE.match(path.name) and (keep is None or _stale_reference(path)):
            freed += path.stat().st_size
            path.unlink(missing_ok=True)
            n_refs += 1
    legacy = cache_dir / LEGACY_DATASETS
    if legacy.is_dir():
        freed += _size(legacy)
        shutil.rmtree(legacy, ignore_errors=True)
    return {
        "removed": len(removed),
        "kept": len(kept),
        "in_use": len(busy),
        "references": n_refs,
        "freed_bytes": freed,
        "kept_bytes": sum(e.size for e in kept + busy),
    }


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return ""


def _holds_cache(folder: Path) -> bool:
    """Whether ``folder`` is a corpus cache: an entry (or its lock file), reference losses or the old datasets copy."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(ENTRY.match(n.removesuffix(".lock")) or n in ("reference", LEGACY_DATASETS) for n in names)


def cache_folder(cache_dir: str | None) -> Path | None:
    """The corpus cache ``data clean`` cleans: ``cache_dir`` (a ``data.cache_dir``), or its ``corpus/`` when it
    names the cache root (the folder ``$LNBLOCKS_CACHE`` names: corpora go in its ``corpus/``); without it, the
    default cache. None for a folder that is neither; ``ValueError`` for one that does not exist."""
    from lnblocks.study.lm.data.corpus.config import default_cache_dir

    if not cache_dir:
        return default_cache_dir()
    folder = Path(os.path.expanduser(cache_dir))
    if not folder.is_dir():
        raise ValueError(f"--cache-dir: no such folder: {cache_dir!r}")
    return next((c for c in (folder, folder / "corpus") if _holds_cache(c)), None)


def clean_command(cache_dir: str | None, keep: str | None, everything: bool) -> int:
    """``lnblocks data clean [--keep N | --all] [--cache-dir DIR]``: clean the corpus cache and say what went.
    Without ``--keep``/``--all`` it keeps ``$LNBLOCKS_CORPUS_KEEP`` (default 8) entries; with that at 0 (no bound)
    it keeps every entry and removes only what can never be hit again (older versions of a corpus config, stale
    reference losses). ``--keep 0`` removes every entry. Bad input: ``ValueError``."""
    if everything and keep is not None:
        raise ValueError("data clean takes --keep N or --all, not both")
    limit: int | None = None
    unbounded = False
    if not everything:
        limit = keep_limit() if keep is None else _count(keep, "--keep (entries to keep)")
        unbounded = keep is None and limit == 0  # $LNBLOCKS_CORPUS_KEEP=0: never remove by count
        limit = sys.maxsize if unbounded else limit
    folder = cache_folder(cache_dir)
    if folder is None:  # touch nothing of a folder that is not a cache, and say what was expected
        print(
            f"corpus cache {cache_dir}: nothing removed, it holds no corpus cache (no text-<key> or hf_dataset-<key> "
            "entry, no reference/ folder) and neither does its corpus/ folder; --cache-dir takes a data.cache_dir "
            "or the folder $LNBLOCKS_CACHE names"
        )
        return 0
    done = clean(folder, limit)
    busy = f", {done['in_use']} in use left alone" if done["in_use"] else ""
    note = f" (${KEEP_ENV}=0: no bound, only entries that can never be used again go)" if unbounded else ""
    print(
        f"corpus cache {folder}: removed {done['removed']} corpus entr{'y' if done['removed'] == 1 else 'ies'} and "
        f"{done['references']} reference-loss file(s), {_human(done['freed_bytes'])} freed; kept {done['kept']} "
        f"({_human(done['kept_bytes'])}){busy}{note}"
    )
    return 0
