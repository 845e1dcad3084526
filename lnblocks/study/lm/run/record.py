"""What a finished ``lm`` run records (``finish``): its final eval and layer ablation, its series cut at the step
where it diverged (what ran after it was only noticed at the next read of the losses), why it diverged, the
``LMResult`` and the ``RunRecord`` around it, with the host, the device and, when sharded, the layout it ran on.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch

from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.result import LMResult
from lnblocks.study.lm.run import stability as stab
from lnblocks.study.lm.run.diagnostics import backends_used, finite_or_none, layer_ablation
from lnblocks.study.lm.run.setup import RunSetup


@dataclass
class Series:
    """A finished run's per-step losses and gradient norms, diagnostics entries and eval points (the final one
    included), cut at the diverging step; ``reason``: why it diverged (None: it did not)."""

    losses: list[float]
    grad_norms: list[float]
    records: list[dict[str, Any]]
    eval_curve: list[tuple[int, float]]
    reason: str | None


def finish(s: RunSetup) -> RunRecord:
    """The record of the run ``s`` has trained (its steps done or stopped at a divergence)."""
    loop_time = s.elapsed()  # before the final eval: what step_ms divides
    final_eval = s.eval_loss()
    train_eval = s.train_eval_loss() if s.monitor.step is None and math.isfinite(final_eval) else None
    ablation = None
    if s.run.diagnostics.layer_ablation and s.monitor.step is None and math.isfinite(final_eval):  # every rank alike
        s.gather()
        if s.dist.is_main:
            ablation = {
                "base": finite_or_none(final_eval),
                "skip": layer_ablation(s.view, s.eval_set, s.precision.autocast),
            }
    series = cut_at_divergence(s, final_eval)
    if s.curves is not None:
        s.curves.update(series.losses, series.records, series.eval_curve, series.grad_norms, final=True)
    result = lm_result(s, series, final_eval, ablation, train_eval)
    steps = max(len(series.losses), 1)
    return RunRecord(
        id=s.run.run_id,
        task="lm",
        status="diverged" if s.monitor.step is not None else "finished",
        labels=s.run.label_dict,
        config=s.run.to_dict(),
        result=result,
        time={
            "wall_s": round(time.perf_counter() - s.clock.wall + s.loop.elapsed.get("wall_s", 0.0), 3),
            "cpu_s": round(time.process_time() - s.clock.cpu + s.loop.elapsed.get("cpu_s", 0.0), 3),
            "step_ms": round(1e3 * loop_time["train_s"] / steps, 3),
            "step_cpu_ms": round(1e3 * loop_time["train_cpu_s"] / steps, 3),
        },
        env=environment(s),
    )


def cut_at_divergence(s: RunSetup, final_eval: float) -> Series:
    """The loop's series, cut after the diverging step, with the final eval point; a run that did not diverge but
    whose final eval is non-finite or above its initial eval + ``train.divergence_margin`` is marked diverged where
    its final climb began (a run shorter than the patience), else at its last step."""
    loop, monitor = s.loop, s.monitor
    losses, grad_norms, records, eval_curve = loop.losses, loop.grad_norms, loop.records, loop.eval_curve
    reason = None
    if monitor.step is not None:
        stop = monitor.step
        del losses[stop + 1 :], grad_norms[stop + 1 :]
        records = [r for r in records if r["step"] <= stop]
        eval_curve = [(step, v) for step, v in eval_curve if step <= stop + 1]
        reason = "non-finite loss" if not math.isfinite(losses[-1]) else "loss above start + margin for patience steps"
    elif not math.isfinite(final_eval) or final_eval > eval_curve[0][1] + s.run.train.divergence_margin:
        monitor.step = len(losses) - monitor.streak if monitor.streak else len(losses) - 1
        reason = "final eval loss non-finite or above its initial value + margin"
    eval_curve.append((len(losses), final_eval))
    return Series(losses, grad_norms, records, eval_curve, reason)


def lm_result(
    s: RunSetup, series: Series, final_eval: float, ablation: dict[str, Any] | None, train_eval: float | None = None
) -> LMResult:
    """The measurements of the run (``LMResult``): non-finite numbers as None (``train_eval`` too when diverged)."""
    diverged = s.monitor.step is not None
    window = [v for v in series.losses[-s.run.train.final_window :] if math.isfinite(v)]
    loss = [finite_or_none(v) for v in series.losses]
    grad_norm = [finite_or_none(v) for v in series.grad_norms]
    return LMResult(
        reference=s.source.reference,
        model={"params": (s.view or s.raw).num_params(), **backends_used(s.raw)},  # what the final (eager) eval ran
        steps_done=len(series.losses),
        diverged_step=s.monitor.step,
        diverged_reason=series.reason,
        initial_loss=finite_or_none(series.losses[0]),
        final_train_loss=finite_or_none(sum(window) / len(window)) if window and not diverged else None,
        eval={
            "init": finite_or_none(series.eval_curve[0][1]),
            "final": None if diverged else finite_or_none(final_eval),
            "curve": [[step, finite_or_none(v)] for step, v in series.eval_curve],
        },
        loss=loss,
        diagnostics=series.records,
        init_grad=s.loop.init_grad,
        layer_ablation=ablation,
        grad_norm=grad_norm,
        stability=stab.summary(loss, grad_norm, series.records),
        corpus=s.corpus,
        train_eval=None if diverged or train_eval is None else finite_or_none(train_eval),
    )


def environment(s: RunSetup) -> dict[str, Any]:
    """Where and how the run ran: torch, the device, the world size and threads, the host and process; the
    ``train.parallel`` layout when sharded, and the checkpoints it resumed from."""
    env = {"torch": torch.__version__, "device": str(s.device), "world_size": s.dist.world_size,
           "threads": torch.get_num_threads(), "host": platform.node(), "pid": os.getpid()}  # fmt: skip
    if s.run.train.parallel is not None:
        env["parallel"] = s.run.train.parallel.to_dict()
    if s.checkpoints is not None and s.checkpoints.resumed_from:
        env["resumed_from"] = list(s.checkpoints.resumed_from)
    return env
