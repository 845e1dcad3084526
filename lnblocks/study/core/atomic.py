"""Atomic file writes of the study (run records, manifests, reports, the corpus cache), and the clean-up of the
temp files a killed writer leaves.

``write_text_atomic`` writes to ``.<name>.tmp-<pid>`` in the same folder, fsyncs it and renames it into place
(``os.replace`` is atomic on POSIX and Windows): a reader sees the old file or the complete new one, never half of
one. ``write_json_atomic``, the one JSON writer, writes strict JSON that way (``NaN`` refused: callers store
non-finite numbers as ``null`` with ``finite_or_null``). ``remove_stale_tmp`` deletes the temp files of processes
that no longer run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"


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


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (as given: no newline translation), creating its folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(folder: str | Path) -> list[Path]:
    """Delete temp files left by processes that no longer run (a killed run); return what was removed."""
    removed = []
    for p in Path(folder).glob(f".*{TMP_MARK}*"):
        pid = p.name.rpartition(TMP_MARK)[2]
        if not pid.isdigit() or not _pid_alive(int(pid)) or int(pid) == os.getpid():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
