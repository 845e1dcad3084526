"""Where a study's checkpoints live, who may remove what, and the folders of runs that are no longer the study's.

- ``train.checkpoint.dir`` unset: ``OUT/checkpoints/<run id>/``. ``OUT/checkpoints`` is the study's own folder:
  removed once the last run's checkpoints are.
- ``train.checkpoint.dir`` set: ``<dir>/<study name>-<out id>/<run id>/``, the out id being the output folder's own
  (``study.json``'s ``out_id``, made once per folder): two studies, or two output folders of one study, that share
  ``dir`` never write, prune or remove each other's checkpoints. ``<dir>`` itself is the user's and never removed;
  the subfolder is removed once empty. A run whose checkpoints are at ``<dir>/<run id>/`` (written before the
  subfolders existed) resumes from there.
- Orphans: a run's checkpoints stay behind when its config changes between a kill and the resume (the new config
  is a new run, with a new id). The runner and ``lnblocks study report`` name them in one line, and
  ``lnblocks study clean OUT`` lists them (``--remove`` deletes them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lnblocks.study.core.checkpoint_manifest import CheckpointError, incompatible, read_manifest, step_dirs

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def user_dir(dir: str | None) -> Path | None:
    """``train.checkpoint.dir`` as an absolute path (``~`` expanded), None when unset."""
    return Path(os.path.expanduser(dir)).absolute() if dir else None


def study_subfolder(manifest: Mapping[str, Any]) -> str | None:
    """``<study name>-<out id>``: the study's own folder inside a ``train.checkpoint.dir`` (None when the manifest
    has no out id: written by an lnblocks before subfolders)."""
    out_id = manifest.get("out_id")
    if not isinstance(out_id, str) or not out_id:
        return None
    name = _UNSAFE.sub("_", str(manifest.get("name") or "study")).strip("._")[:60] or "study"
    return f"{name}-{out_id}"


def checkpoint_base(dir: str | None, out: Path, subfolder: str | None) -> Path:
    """The folder holding one folder per run of the study: ``OUT/checkpoints``, or ``<dir>/<subfolder>``."""
    base = user_dir(dir)
    if base is None:
        return (Path(out) / "checkpoints").absolute()
    return base / subfolder if subfolder else base


def checkpoint_folder(dir: str | None, out: Path, run_id: str, subfolder: str | None) -> Path:
    """The absolute folder of one run's checkpoints (see the module docstring); checkpoints already at
    ``<dir>/<run id>/`` are resumed where they are."""
    base = user_dir(dir)
    if base is not None and step_dirs(base / run_id):
        return base / run_id
    return checkpoint_base(dir, out, subfolder) / run_id


def check_folder(folder: Path, identity: str) -> None:
    """Before any run trains (the driver): create ``folder`` and check it is writable and that no checkpoint in it
    belongs to another run config or lnblocks format; ``CheckpointError`` otherwise (a checkpoint of any world size
    or layout resumes, resharded)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(
            f"train.checkpoint: the checkpoint folder {folder} is not writable ({err.strerror or err}); "
            "set train.checkpoint.dir to a writable folder"
        ) from None
    for _, path in step_dirs(folder):
        manifest, _ = read_manifest(path)
        why = None if manifest is None else incompatible(path, manifest, identity)
        if why is not None:
            raise CheckpointError(f"train.checkpoint: {why}")


def remove_folder(folder: Path, dir: str | None) -> None:
    """Remove a finished run's checkpoints, and the study's folder of them once it is empty: ``OUT/checkpoints`` or
    the study's subfolder of ``dir``, never ``dir`` itself (``dir``: the run's ``train.checkpoint.dir``)."""
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent == user_dir(dir):  # the user's own folder (checkpoints written before subfolders)
        return
    with contextlib.suppress(OSError):  # not empty: other runs' checkpoints
        folder.parent.rmdir()


def study_bases(out: Path, manifest: Mapping[str, Any]) -> list[Path]:
    """Every folder the study in ``out`` keeps its runs' checkpoints in: ``OUT/checkpoints`` and its subfolder of
    each ``train.checkpoint.dir`` its runs name (``study.json``'s ``checkpoint_dirs``)."""
    sub = study_subfolder(manifest)
    dirs = manifest.get("checkpoint_dirs") or []
    extra = [checkpoint_base(d, out, sub) for d in dirs if isinstance(d, str) and sub]
    return [checkpoint_base(None, out, None), *extra]


def orphans(bases: list[Path], run_ids: set[str]) -> list[Path]:
    """The run folders under ``bases`` whose run is not one of ``run_ids`` (the study's runs now), sorted."""
    found = []
    for base in bases:
        if base.is_dir():
            found += [p for p in base.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in run_ids]
    return sorted(found)


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def orphans_note(out: Path, found: list[Path]) -> str | None:
    """One line naming the orphaned checkpoint folders of the study in ``out`` (None when there are none)."""
    if not found:
        return None
    where = ", ".join(sorted({str(p.parent) for p in found}))
    return (
        f"note: {len(found)} checkpoint folder(s) in {where} ({gib(sum(map(folder_bytes, found)))}) belong to no run "
        "of this study: runs of an earlier version of it (a config changed between a kill and its resume makes new "
        f"runs); `lnblocks study clean {out}` lists them and `--remove` deletes them"
    )
