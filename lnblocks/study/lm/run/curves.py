"""The curves an ``lm`` run logs (TensorBoard / W&B through ``lnblocks.study.core.tracking``), live while it trains
or replayed from its record, with the same points either way.

Tags are grouped so TensorBoard's sections read as the diagnostics do:

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
``stability/grad_norm``               global gradient norm every step (before clipping)
``stability/spike_score/<series>``    share of the scored steps so far whose ``loss`` / ``grad_norm`` spiked
                                      (``lnblocks.study.lm.run.stability``), every scored step
``stability/update_rms/<group>/...``  RMS of the optimizer's update / lr, per group and layer (diagnostics steps)
``stability/var_below_eps/layer_<i>``  share of norm input rows with variance under eps (diagnostics steps)
====================================  ==========================================================================

Layers are numbered from 0, two digits (``layer_03``) so TensorBoard sorts them in order. The contract that makes
``replay`` equal to live logging: the trainer logs ``loss/train`` every step, ``loss/eval`` at every evaluation and
``diagnostics_scalars(entry)`` for every diagnostics entry of the record, exactly what the record keeps (values as
the record rounds them), through a ``CurveLogger`` each time it reads the losses from the device (every
``train.log_every`` steps). ``replay`` is how the Ray and torchrun drivers write curves: as each record arrives, no
shared filesystem needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lnblocks.study.core.tracking import Tracker, TrackingConfig, finite_float, open_tracker
from lnblocks.study.lm.run.stability import SpikeMonitor

# ---- the scalars of a record -----------------------------------------------------------------------------------


def _layer(i: int) -> str:
    return f"layer_{i:02d}"


def diagnostics_scalars(entry: Mapping[str, Any]) -> dict[str, float | None]:
    """TensorBoard tags of one diagnostics entry of a run record (``diagnostics[k]``: lr, grad norms, update ratios,
    residual RMS, attention and output-logit stats; see ``lnblocks.study.lm.run.diagnostics``)."""
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
    finite_logits = [v for v in map(finite_float, logits) if v is not None]
    if logits:
        out["attention/max_logit"] = max(finite_logits) if len(finite_logits) == len(logits) else None
    for i, v in enumerate(logits):
        out[f"attention/max_logit/{_layer(i)}"] = v
    for i, v in enumerate(entry.get("attn_entropy") or []):
        out[f"attention/entropy/{_layer(i)}"] = v
    for key, tag in (("max_output_logit", "output/max_logit"), ("log_z", "output/log_z")):
        if key in entry:
            out[tag] = entry[key]
    for group, values in (entry.get("update_rms") or {}).items():
        for i, v in enumerate(values):
            out[f"stability/update_rms/{group}/{_layer(i)}"] = v
    for i, v in enumerate(entry.get("var_below_eps") or []):
        out[f"stability/var_below_eps/{_layer(i)}"] = v
    return out


class StabilityCurves:
    """The per-step stability tags of a run, fed its loss and gradient-norm series in step order (live or from a
    record, so both write the same points)."""

    def __init__(self) -> None:
        self.monitors = {"loss": SpikeMonitor(), "grad_norm": SpikeMonitor()}

    def scalars(self, step: int, loss: float | None, grad_norm: float | None) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        if grad_norm is not None or loss is not None:
            out["stability/grad_norm"] = grad_norm
        for name, value in (("loss", loss), ("grad_norm", grad_norm)):
            mon = self.monitors[name]
            before = mon.scored
            mon.update(step, finite_float(value))
            if mon.scored > before:
                out[f"stability/spike_score/{name}"] = mon.score
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
    grad_norms = body.get("grad_norm")
    stability = StabilityCurves() if grad_norms is not None else None
    for step, v in enumerate(body.get("loss") or []):
        by_step.setdefault(step, {})["loss/train"] = v
        if stability is not None:
            by_step[step].update(stability.scalars(step, v, grad_norms[step]))
    for step, v in (body.get("eval") or {}).get("curve") or []:
        by_step.setdefault(int(step), {})["loss/eval"] = v
    for entry in body.get("diagnostics") or []:
        by_step.setdefault(int(entry["step"]), {}).update(diagnostics_scalars(entry))
    return sorted(by_step.items())


class CurveLogger:
    """Logs a training run's curves to ``tracker`` as the trainer confirms them, in the form its record keeps, so the
    live event files equal ``replay(record)``'s.

    ``update(loss, diagnostics, eval_curve, grad_norms)`` after each read of the losses logs what is new and can no
    longer be cut by a divergence found later: the losses (and gradient norms, with their spike scores) read so far,
    the diagnostics entries and eval points of the steps before them; ``final=True`` (with the record's cut lists)
    logs the rest, the last eval point of a step winning as in ``record_scalars``. ``round_value``: how the record
    stores a number (non-finite -> None).
    """

    def __init__(self, tracker: Tracker, round_value: Callable[[float], float | None]) -> None:
        self.tracker, self.round_value = tracker, round_value
        self.n_loss = self.n_diag = self.n_eval = 0
        self.stability = StabilityCurves()

    def update(
        self,
        loss: Sequence[float],
        diagnostics: Sequence[Mapping[str, Any]],
        eval_curve: Sequence[tuple[int, float]],
        grad_norms: Sequence[float] | None = None,
        final: bool = False,
    ) -> None:
        n = len(loss)
        for step in range(self.n_loss, n):
            value = self.round_value(loss[step])
            scalars = {"loss/train": value}
            if grad_norms is not None:
                scalars.update(self.stability.scalars(step, value, self.round_value(grad_norms[step])))
            self.tracker.log(step, scalars)
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
