"""Curves of a study run while it trains: TensorBoard event files (and optionally Weights & Biases).

One TensorBoard folder per run, ``<out_dir>/tensorboard/<run_id>/``, so ``tensorboard --logdir <out_dir>/tensorboard``
shows every run of a study side by side. Tags are grouped so TensorBoard's sections read as the diagnostics do:

====================================  ==========================================================================
``loss/train``, ``loss/eval``         training loss every step; held-out loss at each evaluation
``lr``                                learning rate (at diagnostic steps)
``grad_norm/global``                  gradient norm over all parameters, before clipping
``grad_norm/<group>/layer_<i>``       per weight group (``W_Q``, ``W_K``, ``W_V``, ``W_O``, ``W_1``, ``W_2``, ``norm``)
``update_ratio/<group>/layer_<i>``    ``||dW|| / ||W||`` of the optimizer step
``residual_rms/embedding``,           RMS of the residual stream after the embedding and after block ``i``
``residual_rms/layer_<i>``            (Xiong et al. 2020, arXiv:2002.04745, Lemma 2); ``residual_max/...`` likewise
``attention/max_logit``               max attention logit over layers (Dehghani et al. 2023, arXiv:2302.05442);
                                      per layer ``attention/max_logit/layer_<i>``, ``attention/entropy/layer_<i>``
``output/max_logit``, ``output/log_z``  output logits (z-loss, PaLM arXiv:2204.02311)
====================================  ==========================================================================

Layers are numbered from 0, two digits (``layer_03``) so TensorBoard sorts them in order. Non-finite values (a
diverging run) are skipped and counted in ``Tracker.skipped``: a record stores them as ``null``, so a live run and
``replay`` of its record write the same points. The contract that makes ``replay`` equal to live logging: the
trainer logs ``loss/train`` every step, ``loss/eval`` at every evaluation and ``diagnostics_scalars(entry)`` for
every diagnostics entry of the record, exactly what the record keeps (values as the record rounds them), through a
``CurveLogger`` each time it reads the losses from the device (every ``train.log_every`` steps).
``replay`` is how the Ray driver writes curves: as each record arrives, no shared filesystem needed.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
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


# ---- the scalars of a record -----------------------------------------------------------------------------------


def _layer(i: int) -> str:
    return f"layer_{i:02d}"


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def diagnostics_scalars(entry: Mapping[str, Any]) -> dict[str, float | None]:
    """TensorBoard tags of one diagnostics entry of a run record (``diagnostics[k]``: lr, grad norms, update ratios,
    residual RMS, attention and output-logit stats; see ``lnblocks.study.diagnostics``)."""
    out: dict[str, float | None] = {}
    if "lr" in entry:
        out["lr"] = entry["lr"]
    if "grad_norm_total" in entry:
        out["grad_norm/global"] = entry["grad_norm_total"]
    for key in ("grad_norm", "update_ratio"):
        for group, values in (entry.get(key) or {}).items():
            for i, v in enumerate(values):
                out[f"{key}/{group}/{_layer(i)}"] = v
    for key in ("residual_rms", "residual_max"):
        values = entry.get(key) or []
        for i, v in enumerate(values):  # entry 0: after the embedding; entry i: after block i - 1
            out[f"{key}/{'embedding' if i == 0 else _layer(i - 1)}"] = v
    logits = entry.get("attn_max_logit") or []
    finite_logits = [v for v in map(_finite, logits) if v is not None]
    if logits:
        out["attention/max_logit"] = max(finite_logits) if len(finite_logits) == len(logits) else None
    for i, v in enumerate(logits):
        out[f"attention/max_logit/{_layer(i)}"] = v
    for i, v in enumerate(entry.get("attn_entropy") or []):
        out[f"attention/entropy/{_layer(i)}"] = v
    for key, tag in (("max_output_logit", "output/max_logit"), ("log_z", "output/log_z")):
        if key in entry:
            out[tag] = entry[key]
    return out


def record_body(record: Any) -> tuple[str, Mapping[str, Any]]:
    """``(run id, measurements)`` of a run record: a dict of schema ``lnblocks.study.run/1`` (measurements at the
    top level) or ``/2`` (under ``result``), or a ``RunRecord`` (``to_json()``)."""
    if hasattr(record, "to_json"):
        record = record.to_json()
    if not isinstance(record, Mapping) or not isinstance(record.get("id"), str):
        raise ValueError("record must be a run record (a mapping with an 'id'), got " + type(record).__name__)
    body = record.get("result")
    return record["id"], body if isinstance(body, Mapping) else record


def record_scalars(record: Any) -> list[tuple[int, dict[str, float | None]]]:
    """Every ``(step, {tag: value})`` a live run logs, rebuilt from its record, in step order."""
    _, body = record_body(record)
    by_step: dict[int, dict[str, float | None]] = {}
    for step, v in enumerate(body.get("loss") or []):
        by_step.setdefault(step, {})["loss/train"] = v
    for step, v in (body.get("eval") or {}).get("curve") or []:
        by_step.setdefault(int(step), {})["loss/eval"] = v
    for entry in body.get("diagnostics") or []:
        by_step.setdefault(int(entry["step"]), {}).update(diagnostics_scalars(entry))
    return sorted(by_step.items())


# ---- trackers --------------------------------------------------------------------------------------------------


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
            v = _finite(value)
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


class CurveLogger:
    """Logs a training run's curves to ``tracker`` as the trainer confirms them, in the form its record keeps, so the
    live event files equal ``replay(record)``'s.

    ``update(loss, diagnostics, eval_curve)`` after each read of the losses logs what is new and can no longer be cut
    by a divergence found later: the losses read so far, the diagnostics entries and eval points of the steps before
    them; ``final=True`` (with the record's cut lists) logs the rest, the last eval point of a step winning as in
    ``record_scalars``. ``round_value``: how the record stores a number (non-finite -> None).
    """

    def __init__(self, tracker: Tracker, round_value: Callable[[float], float | None]) -> None:
        self.tracker, self.round_value = tracker, round_value
        self.n_loss = self.n_diag = self.n_eval = 0

    def update(
        self,
        loss: Sequence[float],
        diagnostics: Sequence[Mapping[str, Any]],
        eval_curve: Sequence[tuple[int, float]],
        final: bool = False,
    ) -> None:
        n = len(loss)
        for step in range(self.n_loss, n):
            self.tracker.log(step, {"loss/train": self.round_value(loss[step])})
        self.n_loss = n
        while self.n_diag < len(diagnostics) and (final or diagnostics[self.n_diag]["step"] < n):
            entry = diagnostics[self.n_diag]
            self.tracker.log(int(entry["step"]), diagnostics_scalars(entry))
            self.n_diag += 1
        new = list(eval_curve[self.n_eval :])
        if not final:
            new = new[: next((i for i, (s, _) in enumerate(new) if s >= n), len(new))]
        last = {s: i for i, (s, _) in enumerate(new)}  # a step evaluated twice: the later value, as the record reads
        for i, (step, value) in enumerate(new):
            if last[step] == i:
                self.tracker.log(int(step), {"loss/eval": self.round_value(value)})
        self.n_eval += len(new)


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


def replay(
    record: Any, out_dir: str | os.PathLike[str], tracking: TrackingConfig | Mapping[str, Any] | None = None
) -> Tracker:
    """Write a finished run's curves from its record (what live logging writes; by default TensorBoard only).
    Returns the closed tracker (``log_dir``, ``skipped``)."""
    tracking = TrackingConfig.from_dict(tracking if tracking is not None else {"tensorboard": True}, key="tracking")
    run_id, _ = record_body(record)
    config = (record.to_json() if hasattr(record, "to_json") else record).get("config")
    with open_tracker(tracking, out_dir, run_id, config) as tracker:
        for step, scalars in record_scalars(record):
            tracker.log(step, scalars)
    return tracker
