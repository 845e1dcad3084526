"""Where a study run's curves go: the study-wide ``tracking`` section and the writers, TensorBoard event files
(and optionally Weights & Biases), one folder per run.

``<out_dir>/tensorboard/<run_id>/`` holds a run's event files, so ``tensorboard --logdir <out_dir>/tensorboard``
shows every run of a study side by side. Which scalars a run logs is its task's business (the ``lm`` task's tags:
``lnblocks.study.lm.run.curves``); a ``Tracker`` takes ``log(step, {tag: value})``, skips non-finite values (a diverging
run) and counts them in ``Tracker.skipped``, so a run logged live and one replayed from its record (which stores
non-finite numbers as ``null``) write the same points.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.config import Config, check_bool, check_choice, check_int, check_str

WANDB_MODES = ("offline", "online", "disabled")


@dataclass(frozen=True, kw_only=True)
class TrackingConfig(Config):
    """The ``tracking`` section of a study: ``tensorboard: true`` writes event files per run under
    ``<out>/tensorboard/<run_id>/``; ``wandb: true`` logs the same scalars to Weights & Biases (``wandb_mode``
    ``offline`` by default: files under ``<out>/wandb/``, no network; ``wandb sync`` uploads them later)."""

    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "lnblocks"
    wandb_mode: str = "offline"
    flush_secs: int = 10

    def __post_init__(self) -> None:
        check_bool("tensorboard", self.tensorboard)
        check_bool("wandb", self.wandb)
        check_str("wandb_project", self.wandb_project)
        check_choice("wandb_mode", self.wandb_mode, WANDB_MODES)
        self._set("flush_secs", check_int("flush_secs", self.flush_secs, minimum=1))

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.wandb


# ---- trackers --------------------------------------------------------------------------------------------------


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None (non-finite, not a number, a bool)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or run_id in (".", "..") or any(c in run_id for c in "/\\\0"):
        raise ValueError(f"run_id must be a non-empty name without path separators, got {run_id!r}")
    return run_id


class Tracker:
    """Where a run's scalars go. ``log(step, {tag: value})`` skips non-finite values (counted in ``skipped``);
    ``close()`` flushes. Also a context manager. The base class logs nowhere (tracking off)."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()

    def _finite_items(self, scalars: Mapping[str, Any]) -> list[tuple[str, float]]:
        items = []
        for tag, value in scalars.items():
            v = finite_float(value)
            if v is None:
                self.skipped[tag] += 1
            else:
                items.append((tag, v))
        return items

    def log(self, step: int, scalars: Mapping[str, float | None]) -> None:
        self._finite_items(scalars)

    def close(self) -> None:
        pass

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardTracker(Tracker):
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``<out_dir>/tensorboard/<run_id>/``. Opening removes event
    files of an earlier attempt of the same run (a resumed run starts over, and so do its curves)."""

    def __init__(self, log_dir: Path, writer: Any) -> None:
        super().__init__()
        self.log_dir = log_dir
        self.writer = writer

    @classmethod
    def open(
        cls, out_dir: str | os.PathLike[str], run_id: str, config: Mapping[str, Any] | None = None, flush_secs: int = 10
    ) -> TensorBoardTracker:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(out_dir) / "tensorboard" / _check_run_id(run_id)
        log_dir.mkdir(parents=True, exist_ok=True)
        for old in log_dir.glob("events.out.tfevents.*"):
            old.unlink()
        tracker = cls(log_dir, SummaryWriter(log_dir=str(log_dir), flush_secs=flush_secs))
        if config is not None:  # shown in TensorBoard's text tab; 4-space indent = a markdown code block
            text = json.dumps(config, indent=1, sort_keys=True, default=str)
            tracker.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)
        return tracker

    def log(self, step: int, scalars: Mapping[str, float | None]) -> None:
        for tag, v in self._finite_items(scalars):
            self.writer.add_scalar(tag, v, global_step=int(step))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run named ``run_id`` (``mode="offline"``: files under ``<out_dir>/wandb/``, no network)."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run = run

    @classmethod
    def open(
        cls,
        out_dir: str | os.PathLike[str],
        run_id: str,
        config: Mapping[str, Any] | None = None,
        project: str = "lnblocks",
        mode: str = "offline",
    ) -> WandbTracker:
        wandb = require("wandb")
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=project,
            name=_check_run_id(run_id),
            dir=str(folder),
            config=dict(config or {}),
            mode=mode,
            reinit="create_new",
        )
        return cls(run)

    def log(self, step: int, scalars: Mapping[str, float | None]) -> None:
        items = self._finite_items(scalars)
        if items:
            self.run.log(dict(items), step=int(step))

    def close(self) -> None:
        self.run.finish()


class MultiTracker(Tracker):
    """Several trackers as one (TensorBoard and W&B together)."""

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        super().__init__()
        self.trackers = list(trackers)

    def log(self, step: int, scalars: Mapping[str, float | None]) -> None:
        self._finite_items(scalars)  # counts what every tracker skips
        for t in self.trackers:
            t.log(step, scalars)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def open_tracker(
    cfg: TrackingConfig | Mapping[str, Any] | None,
    out_dir: str | os.PathLike[str],
    run_id: str,
    config: Mapping[str, Any] | None = None,
) -> Tracker:
    """The tracker(s) the ``tracking`` section asks for; a no-op ``Tracker`` when tracking is off."""
    cfg = TrackingConfig.from_dict(cfg, key="tracking")
    trackers: list[Tracker] = []
    if cfg.tensorboard:
        trackers.append(TensorBoardTracker.open(out_dir, run_id, config, flush_secs=cfg.flush_secs))
    if cfg.wandb:
        trackers.append(WandbTracker.open(out_dir, run_id, config, project=cfg.wandb_project, mode=cfg.wandb_mode))
    if not trackers:
        return Tracker()
    return trackers[0] if len(trackers) == 1 else MultiTracker(trackers)
