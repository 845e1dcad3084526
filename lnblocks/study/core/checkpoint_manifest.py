"""What one checkpoint folder (``step-<n>/``) holds and whether it can be resumed from: its manifest, read and
checked against the files on disk and against what loading it reads, and what a resume under another world size or
layout says. ``core.checkpoint`` writes the folders and loads them; this module only reads.

A checkpoint is sound when its manifest is this lnblocks format's, describes its step, lists every file with its
size and sha256, every listed file matches, and every file the loader reads is listed (so verified): ``model.pt``
or DCP's ``model/.metadata`` and the storage files that metadata names, and one ``state-<rank>.pt`` per process
that wrote it. A manifest that leaves out a file the loader needs is damaged, not sound: the previous checkpoint is
used instead of one whose load fails on every rerun.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

FORMAT = "lnblocks.checkpoint/1"
WRITERS = ("torch.save", "dcp")  # one process: one torch.save file; under torchrun: torch.distributed.checkpoint
STEP_NAME = re.compile(r"^step-(\d{9})$")
_CHUNK = 1 << 24


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used or written; the message is one line naming the folder."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def step_dirs(folder: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint folder in ``folder``, newest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_NAME.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def read_manifest(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(manifest, None)`` for the checkpoint at ``path``, or ``(None, why it cannot be read)``."""
    try:
        obj = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        return None, "no manifest.json"
    except (OSError, ValueError) as err:
        return None, f"manifest.json unreadable ({err})"
    if not isinstance(obj, dict) or not isinstance(obj.get("format"), str):
        return None, "manifest.json is not a checkpoint manifest"
    return obj, None


def incompatible(path: Path, manifest: dict[str, Any], identity: str) -> str | None:
    """Why the checkpoint at ``path`` belongs to another run or another lnblocks (None if it is this run's)."""
    if manifest["format"] != FORMAT:
        return (
            f"checkpoint {path} has format {manifest['format']!r} (lnblocks {manifest.get('lnblocks', '?')}); this "
            f"lnblocks reads {FORMAT!r}: resume with that lnblocks, or remove {path.parent} to start the run over"
        )
    if manifest.get("identity") != identity:
        return (
            f"checkpoint {path} was written for another run config (digest {str(manifest.get('identity'))[:12]}, "
            f"this run's is {identity[:12]}): remove {path.parent} or point train.checkpoint.dir elsewhere"
        )
    return None


def problem(path: Path, step: int, identity: str) -> str | None:
    """Why the checkpoint of ``step`` at ``path`` cannot be resumed from (None: it can); ``CheckpointError`` when it
    is another run's or another format's (refused, not skipped)."""
    manifest, why = read_manifest(path)
    if manifest is None:
        return why
    bad = incompatible(path, manifest, identity)
    if bad is not None:
        raise CheckpointError(f"train.checkpoint: {bad}")
    files = manifest.get("files")
    if manifest.get("step") != step or not isinstance(files, dict) or not files:
        return "its manifest does not describe this step"
    for rel, want in files.items():
        f = path / rel
        if not isinstance(want, dict) or ".." in Path(rel).parts:
            return f"its manifest's entry for {rel!r} is malformed"
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != want.get("bytes"):
            return f"{rel} has {f.stat().st_size:,} bytes, the manifest says {want.get('bytes')}"
        if file_sha256(f) != want.get("sha256"):
            return f"{rel} does not match its sha256"
    needed = needed_files(path, manifest)
    if isinstance(needed, str):
        return needed
    unlisted = [rel for rel in needed if rel not in files]
    if unlisted:
        return f"its manifest does not list {unlisted[0]}, which loading it reads"
    return None


def needed_files(path: Path, manifest: dict[str, Any]) -> list[str] | str:
    """Every file (relative to ``path``) that loading the checkpoint reads, by its writer, or why that cannot be
    told. DCP's storage files are the ones its ``.metadata`` names (read once the manifest has verified it)."""
    world, writer = manifest.get("world_size"), manifest.get("writer")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        return f"its manifest's world_size is {world!r}, not a number of processes"
    states = [f"state-{rank}.pt" for rank in range(world)]
    if writer == "torch.save":
        return ["model.pt", *states]
    if writer != "dcp":
        return f"its manifest's writer is {writer!r}, not one of {list(WRITERS)}"
    if "model/.metadata" not in manifest["files"]:
        return "its manifest does not list model/.metadata, which loading it reads"
    try:
        import torch.distributed.checkpoint as dcp

        storage = dcp.FileSystemReader(str(path / "model")).read_metadata().storage_data
        names = sorted({f"model/{info.relative_path}" for info in storage.values()})
    except Exception as err:  # a metadata file that matches its sha256 but DCP cannot read
        return f"model/.metadata cannot be read by torch.distributed.checkpoint ({type(err).__name__}: {err})"
    return ["model/.metadata", *names, *states]


def resume_note(path: Path, manifest: dict[str, Any], world_size: int, layout: dict[str, Any] | None) -> str | None:
    """The line a resume prints when the checkpoint at ``path`` was written by another number of processes or
    another sharding layout than this run's (``layout``: the run's ``train.parallel`` as a dict, None for DDP or one
    process): it continues up to float reduction order, not bit for bit. None when both match; a manifest written
    before layouts were recorded is compared by world size only."""
    was_world = manifest.get("world_size")
    known = "layout" in manifest
    if was_world == world_size and (not known or manifest["layout"] == layout):
        return None

    def how(world: Any, lay: Any) -> str:
        return f"{world} process(es)" + (f" ({describe_layout(lay)})" if known else "")

    return (
        f"note: checkpoint {path} was written by {how(was_world, manifest.get('layout'))}, this run has "
        f"{how(world_size, layout)}: resharded; it continues up to float reduction order, not bit for bit"
    )


def describe_layout(layout: dict[str, Any] | None) -> str:
    """A layout as ``{dp_shard: 2, tp: 1, ...}``, or ``unsharded`` (DDP or one process)."""
    if not layout:
        return "unsharded"
    return "{" + ", ".join(f"{k}: {v}" for k, v in layout.items()) + "}"
