"""Mid-run checkpoints of a study run: the core owns the files, their atomic writing, their validation, retention
and the resume decision; what a checkpoint holds besides the model, the optimizer and the process's RNGs is the
task's (``Checkpoints.save(step, model, optimizer, state)`` / ``Checkpoints.load``).

A run with ``train.checkpoint`` (``CheckpointConfig``) keeps its checkpoints in ``<dir>/<run id>/`` (``dir``
defaults to ``OUT/checkpoints``), one folder per step::

    step-000000120/  manifest.json   format, lnblocks and torch versions, the run's config digest, step, world size
                                     and sharding layout, the steps it was resumed from, and every file's size and
                                     sha256
                     model.pt        one process: {"model", "optim"} as torch.distributed.checkpoint.state_dict's
                                     get_state_dict gives them (fully qualified names), in one torch.save file
                     model/          under torchrun: the same state through torch.distributed.checkpoint (DCP),
                                     each rank writing its part (DDP replicas, or FSDP2/TP shards)
                     state-<rank>.pt the task's state and the process's RNGs (torch CPU and CUDA, numpy, Python)

Either form resumes under any world size and layout (resharding): DCP reads its shards into whatever
sharded or plain state dict the new run's model and optimizer give, and a ``model.pt`` is loaded as a full state dict
and sharded by ``set_state_dict``. A run resumed under another world size reads rank 0's ``state-0.pt`` on every rank
(the task's state is the same on every rank; the RNG streams are rank 0's), and continues the uninterrupted run up to
float reduction order rather than bit for bit (one line on stderr says so); so does one resumed under another layout
at the same world size (``train.parallel``: fsdp over 2 ranks, then tp over 2).

A checkpoint is written into ``.step-<n>.tmp-<pid>/``, every file fsynced, the manifest written last, the folder
fsynced and renamed into place, then the run's folder fsynced: a reader sees a complete checkpoint or none. A
checkpoint whose manifest is unreadable, whose files do not match it (truncated, corrupted) or which leaves out a
file loading reads is named on stderr and the previous one is used (``core.checkpoint_manifest``); one written for
another config or by an incompatible lnblocks is refused (``CheckpointError``, before any run trains:
``check_folder``). Retention keeps the newest ``keep`` sound checkpoints: those found damaged go first, so a damaged
newer one never costs the run the one it resumed from. A write that fails part-way (a full disk) removes its
temporary folder and leaves the previous checkpoints as they were. Where the folders live: ``core.checkpoint_folders``.

``LNBLOCKS_CHECKPOINT_FAULT=<fault>@<n>`` makes this process fail on purpose, for the tests of the resume
guarantee: ``kill-at-step@k`` (SIGKILL once k steps are done), ``kill-mid-write@n`` (SIGKILL after the model file of
the n-th checkpoint is written), ``kill-before-rename@n``, ``kill-after-save@n`` (just after it is in place),
``enospc-mid-write@n`` (the n-th write fails part-way as on a full disk), ``term-at-step@k`` and
``term-parent-at-step@k`` (SIGTERM to this process, or to its parent, the runner of a pool: ``core.preemption``). A
fault fires on rank 0 only, and only in an attempt that did not resume (so a retried run does not fail again).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnblocks.config import Config, ConfigValueError, check_bool, check_float, check_int, check_str
from lnblocks.study.core.checkpoint_folders import check_folder
from lnblocks.study.core.checkpoint_manifest import (
    FORMAT,
    CheckpointError,
    file_sha256,
    problem,
    read_manifest,
    resume_note,
    step_dirs,
)
from lnblocks.study.core.dist import DistContext

__all__ = ["FORMAT", "CheckpointConfig", "CheckpointError", "Checkpoints", "check_folder", "file_sha256"]

FAULT_ENV = "LNBLOCKS_CHECKPOINT_FAULT"
FAULTS = (
    "kill-at-step", "kill-mid-write", "kill-before-rename", "kill-after-save", "enospc-mid-write",
    "term-at-step", "term-parent-at-step",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Config):
    """``train.checkpoint``: a checkpoint every ``every`` steps and/or every ``every_s`` seconds (at the end of the
    step where the time is up), the newest ``keep`` kept, in ``dir/<study>-<out id>/<run id>/`` (default
    ``OUT/checkpoints/<run id>/``: set ``dir`` to storage every worker reaches when Ray workers do not share the
    driver's disk; ``core.checkpoint_folders``). A finished run's checkpoints are removed once its record is
    written, unless ``keep_finished``. How a run is checkpointed never changes its record, so this section is not
    part of the run's id."""

    every: int | None = None
    every_s: float | None = None
    keep: int = 2
    dir: str | None = None
    keep_finished: bool = False

    def __post_init__(self) -> None:
        self._set("every", check_int("every", self.every, minimum=1, allow_none=True))
        self._set("every_s", check_float("every_s", self.every_s, lo=0, lo_open=True, allow_none=True))
        self._set("keep", check_int("keep", self.keep, minimum=1))
        check_str("dir", self.dir, allow_none=True)
        check_bool("keep_finished", self.keep_finished)
        if self.every is None and self.every_s is None:
            raise ConfigValueError(
                "every", "or every_s must be set (a checkpoint every N steps and/or S seconds); null: no checkpoints"
            )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the process's RNGs ------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every RNG a run may draw from that is not its own generator: torch CPU (and CUDA: dropout on the GPU), numpy
    and Python ``random``, in a form ``torch.load(weights_only=True)`` reads back."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- one run's checkpoints ---------------------------------------------------------------------------------------


def _parse_fault(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    kind, _, n = text.partition("@")
    if kind not in FAULTS or not n.isdigit():
        raise ValueError(f"{FAULT_ENV} must be <fault>@<n> with a fault in {list(FAULTS)}, got {text!r}")
    return kind, int(n)


class Checkpoints:
    """The checkpoints of one run as its task's ``train`` uses them (``RunContext.checkpoints``): ``latest()``
    picks the newest valid one (or None), ``load(step, model, optimizer)`` restores the model, the optimizer and the
    process's RNGs and returns the task's state, ``due(steps_done)`` says whether to save now, and ``save(...)``
    writes one. ``resumed_from``: the steps this run has been resumed from, oldest first. Under torchrun every rank
    makes the same calls (the writes and the decisions are collective; rank 0 validates and decides). ``layout``:
    how the run is sharded (its ``train.parallel`` as a dict; None for DDP or one process), recorded in each
    manifest so a resume under another layout says it is not bit for bit."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        cfg: CheckpointConfig,
        identity: str,
        dist: DistContext,
        layout: dict[str, Any] | None = None,
    ) -> None:
        self.folder, self.cfg, self.identity, self.dist, self.layout = Path(folder), cfg, identity, dist, layout
        self.resumed_from: list[int] = []
        self._damaged: set[str] = set()  # the step folders latest() found damaged: retention removes them first
        self._saves = 0
        self._last_save = time.monotonic()
        self._fault = _parse_fault(os.environ.get(FAULT_ENV))
        self._owner = self._broadcast(os.getpid())  # rank 0's pid names the temporary folder of every rank

    # -- collectives (no-ops in one process)
    def _broadcast(self, value: Any) -> Any:
        if not self.dist.enabled:
            return value
        import torch.distributed as td

        box = [value]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def _barrier(self) -> None:
        if self.dist.enabled:
            import torch.distributed as td

            td.barrier()

    def _inject(self, kind: str, n: int) -> None:
        if self._fault != (kind, n) or self.resumed_from or not self.dist.is_main:
            return
        if kind.startswith("kill"):
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if kind.startswith("term"):  # what Slurm sends a preempted job: to this process, or to the runner
            os.kill(os.getppid() if kind == "term-parent-at-step" else os.getpid(), signal.SIGTERM)
            return
        raise OSError(28, "No space left on device (injected by LNBLOCKS_CHECKPOINT_FAULT)")

    # -- the resume decision
    def latest(self) -> int | None:
        """The step of the newest valid checkpoint (None: start from step 0). Leftover temporary folders of a
        killed writer are removed; a damaged checkpoint is named on stderr and the previous one tried."""
        step = None
        if self.dist.is_main:
            for tmp in self.folder.glob(".step-*.tmp-*") if self.folder.is_dir() else ():
                shutil.rmtree(tmp, ignore_errors=True)  # the run's lock is held: no writer is alive
            for n, path in step_dirs(self.folder):
                why = problem(path, n, self.identity)
                if why is None:
                    step = n
                    break
                self._damaged.add(path.name)
                print(f"warning: checkpoint {path} is damaged ({why}); trying the one before it", file=sys.stderr)
        return self._broadcast(step)

    def load(self, step: int, model: Any, optimizer: Any) -> dict[str, Any]:
        """Restore ``model`` and ``optimizer`` (in place) and the process's RNGs from the checkpoint of ``step``;
        return the task's state. A load that fails anyway (a file that changed since it was checked) is a
        ``CheckpointError`` naming the checkpoint, not a traceback."""
        path = self.folder / f"step-{step:09d}"
        manifest, _ = read_manifest(path)
        assert manifest is not None
        try:
            return self._load(path, manifest, model, optimizer)
        except (OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(
                f"train.checkpoint: loading {path} failed ({type(err).__name__}: {' '.join(str(err).split())[:300]}); "
                f"remove it to resume from the checkpoint before it"
            ) from None

    def _load(self, path: Path, manifest: dict[str, Any], model: Any, optimizer: Any) -> dict[str, Any]:
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        options = None
        if manifest.get("writer") == "dcp":  # into this run's (sharded or plain) state dict: DCP reshards
            import torch.distributed.checkpoint as dcp

            msd, osd = get_state_dict(model, optimizer)  # fresh: names, shapes and shards to load into
            payload = {"model": msd, "optim": osd}
            with warnings.catch_warnings():  # one process without a process group: what DCP assumes, and so do we
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                dcp.load(payload, checkpoint_id=str(path / "model"))
        else:  # one process's full state dict, sharded by set_state_dict when this run is
            payload = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
            options = StateDictOptions(full_state_dict=True) if self.dist.enabled else None
        set_state_dict(model, optimizer, model_state_dict=payload["model"], optim_state_dict=payload["optim"],
                       options=options)  # fmt: skip
        note = resume_note(path, manifest, self.dist.world_size, self.layout)
        if note is not None and self.dist.is_main:
            print(note, file=sys.stderr)
        rank = self.dist.rank if note is None else 0  # resharded: every rank continues rank 0's streams
        saved = torch.load(path / f"state-{rank}.pt", map_location="cpu", weights_only=True)
        set_rng_state(saved["rng"])
        self.resumed_from = [*manifest.get("resumed_from", []), manifest["step"]]
        if manifest.get("torch") != torch.__version__ and self.dist.is_main:
            print(
                f"warning: checkpoint {path} was written with torch {manifest.get('torch')}, this is "
                f"{torch.__version__}: the resumed run may not be bit-identical to an uninterrupted one",
                file=sys.stderr,
            )
        self._last_save = time.monotonic()
        return saved["task"]

    # -- saving
    def stop_requested(self) -> bool:
        """Whether a SIGTERM asked this run to checkpoint now and stop (``core.preemption``; one process only)."""
        from lnblocks.study.core import preemption

        return not self.dist.enabled and preemption.requested()

    def due(self, steps_done: int) -> bool:
        """Whether to checkpoint now that ``steps_done`` steps are done (the same answer on every rank)."""
        self._inject("kill-at-step", steps_done)
        self._inject("term-at-step", steps_done)
        self._inject("term-parent-at-step", steps_done)
        if self.cfg.every is not None and steps_done % self.cfg.every == 0:
            return True
        if self.cfg.every_s is None:
            return False
        return bool(self._broadcast(time.monotonic() - self._last_save >= self.cfg.every_s))

    def save(self, step: int, model: Any, optimizer: Any, state: dict[str, Any]) -> None:
        """Write the checkpoint of ``step`` (``steps_done``): model and optimizer, ``state`` (the task's: anything
        ``torch.load(weights_only=True)`` reads) and the RNGs; then drop all but the newest ``keep``."""
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self._saves += 1
        name = f"step-{step:09d}"
        final, tmp = self.folder / name, self.folder / f".{name}.tmp-{self._owner}"
        try:
            if self.dist.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            self._barrier()
            msd, osd = get_state_dict(model, optimizer)
            if self.dist.enabled:
                import torch.distributed.checkpoint as dcp

                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "model"))  # each rank its part
            else:
                _save_synced({"model": msd, "optim": osd}, tmp / "model.pt")
            self._inject("kill-mid-write", self._saves)
            self._inject("enospc-mid-write", self._saves)
            _save_synced({"task": state, "rng": rng_state()}, tmp / f"state-{self.dist.rank}.pt")
            self._barrier()
            if self.dist.is_main:
                self._seal(tmp, step, torch.__version__)
                self._inject("kill-before-rename", self._saves)
                if final.exists():  # a damaged checkpoint of the same step from an earlier attempt
                    shutil.rmtree(final)
                os.rename(tmp, final)
                self._damaged.discard(final.name)
                _fsync_dir(self.folder)
                self._prune()
                self._inject("kill-after-save", self._saves)
            self._barrier()
        except OSError as err:
            if self.dist.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            previous = [n for n, path in step_dirs(self.folder) if path.name not in self._damaged]
            kept = f"its checkpoint of step {previous[0]} is intact" if previous else "it has no earlier checkpoint"
            raise CheckpointError(
                f"train.checkpoint: writing {final} failed ({err.strerror or err}); the run stops here and {kept}: "
                "free space (or fix the folder) and rerun the same command to resume"
            ) from None
        self._last_save = time.monotonic()

    def _prune(self) -> None:
        """Keep the newest ``keep`` checkpoints that are not known to be damaged; the damaged ones go first. Every
        other one is this attempt's own (sound when sealed), the one it resumed from (checked), or older than
        that (unchecked, kept only while fewer than ``keep`` newer ones exist)."""
        kept = 0
        for _, path in step_dirs(self.folder):  # newest first
            if path.name in self._damaged or kept >= self.cfg.keep:
                shutil.rmtree(path, ignore_errors=True)
                self._damaged.discard(path.name)
            else:
                kept += 1

    def _seal(self, tmp: Path, step: int, torch_version: str) -> None:
        """Write the manifest (every file's size and sha256) last, and fsync the folders."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            lnblocks_version = version("lnblocks")
        except PackageNotFoundError:  # a source checkout that is not installed
            lnblocks_version = "unknown"

        files = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            files[str(f.relative_to(tmp))] = {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
        manifest = {
            "format": FORMAT,
            "lnblocks": lnblocks_version,
            "torch": torch_version,
            "identity": self.identity,
            "step": step,
            "world_size": self.dist.world_size,
            "layout": self.layout,
            "writer": "dcp" if self.dist.enabled else "torch.save",
            "resumed_from": self.resumed_from,
            "files": files,
        }
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        for sub in {p.parent for p in tmp.rglob("*")} | {tmp}:
            _fsync_dir(sub)


def _save_synced(obj: Any, path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
