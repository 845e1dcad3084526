"""Atomic file writes of the study (run records, manifests, reports, the corpus cache), and the clean-up of the
temp files a killed writer leaves.

``write_text_atomic`` writes to ``tmp_path(path)``, ``.<name>.lnblocks-tmp-<pid>-<8 hex>`` in the same folder (unique
to the process and the call), fsyncs it and renames it into place (``os.replace`` is atomic on POSIX and Windows): a
reader sees the old file or the complete new one, never half of one. ``write_json_atomic``, the one JSON writer,
writes strict JSON that way (``NaN`` refused: callers store non-finite numbers as ``null`` with ``finite_or_null``).
Every other temporary file of lnblocks (the corpus cache's token files) takes its name from ``tmp_path`` too, so
``remove_stale_tmp`` can delete exactly the temp files of lnblocks processes that no longer run: any other file, a
user's ``.notes.tmp-old`` included, is never touched. A write that fails (a full disk, a folder that went away)
raises ``OSError`` naming the file it was writing (``naming``): ``write()`` alone says ``[Errno 28]`` and no path.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TMP_MARK = ".lnblocks-tmp-"
_TMP_TAIL = re.compile(r"^([0-9]+)-[0-9a-f]{8}$")


def tmp_path(path: str | Path) -> Path:
    """The temporary name to write ``path`` under before renaming it into place: ``.<name>.lnblocks-tmp-<pid>-<8
    random hex>`` in the same folder (two writers, or two calls of one process, never share it)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def tmp_owner(name: str) -> int | None:
    """The pid of the process that made the temporary name ``name`` (``tmp_path``'s form), None for any other."""
    if not name.startswith(".") or TMP_MARK not in name:
        return None
    m = _TMP_TAIL.match(name.rpartition(TMP_MARK)[2])
    return int(m.group(1)) if m else None


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (recursively through dicts, lists and tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON (indent 1) to ``path`` atomically, creating its folder if needed."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=False))  # dumps fails before anything is written


def naming(err: OSError, path: str | Path) -> OSError:
    """``err`` as an ``OSError`` of the same errno (and subclass) naming ``path``, the file being written: what
    ``write()`` and ``fsync()`` raise on a full disk names no file."""
    if err.filename == str(path):
        return err
    return OSError(err.errno, err.strerror or str(err), str(path))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (as given: no newline translation), creating its folder if needed; an
    ``OSError`` names ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_path(path)
        try:
            with open(tmp, "w", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as err:
        raise naming(err, path) from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(folder: str | Path, every: bool = False) -> list[Path]:
    """Delete the temporary files (and folders) lnblocks wrote in ``folder`` (``tmp_path``'s names) whose process no
    longer runs, or all of them with ``every`` (the caller holds the folder's lock); return what was removed. Other
    files are never touched."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in sorted(folder.iterdir()):
        pid = tmp_owner(p.name)
        if pid is None or not (every or pid == os.getpid() or not _pid_alive(pid)):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
