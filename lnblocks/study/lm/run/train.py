"""One run of the ``lm`` task, the one place such a run trains: set it up (``lnblocks.study.lm.run.setup``: the
``GPT`` its config describes, its data, what trains it), run its steps (learning-rate schedule, optimizer and
precision: ``lnblocks.study.lm.run.optim``), log diagnostics, and return its ``RunRecord``
(``lnblocks.study.lm.run.record``).

A run that diverges (non-finite loss, or a loss far above its start for several steps, or a final eval loss far above
its initial one) comes back with ``status: "diverged"`` and the step: a result, not an exception. Losses stay on
the device and are read every ``train.log_every`` steps (one host sync per interval); divergence is checked there,
per step, so the record is the same as with a read every step. Under ``torchrun`` the same function trains
with DistributedDataParallel: every rank draws the same global batch from the seeded generator and takes its
slice, so a DDP run follows the single-process run up to float reduction order.

GPU-sized runs (``train.dtype``, ``compile``, ``grad_accum``): ``Precision`` holds the autocast dtype and, for fp16,
the ``GradScaler``; ``forward_backward`` feeds one optimizer step's batch as ``grad_accum`` micro-batches;
``diagnostics.backends_used`` reads which norm and attention backends ran (fused Triton norms and flash-attn on CUDA
when they can run, chosen by the modules themselves) into the record. With ``tracker``, the curves are logged as the
losses are read, in the form the record keeps (``lnblocks.study.lm.run.curves.CurveLogger``).

Long runs (docs/long-runs.md): with ``checkpoints`` the run saves the model, the optimizer, the process's RNGs and
its ``LoopState`` (losses, diagnostics, eval points, the data sampler, the divergence monitor, the GradScaler) at the
end of the steps ``checkpoints.due`` names, and a new attempt continues from the newest valid checkpoint with the
same record as if it had never stopped (timing and host fields aside; ``env.resumed_from`` says from which steps).
Stability monitoring (``lnblocks.study.lm.run.stability``): the global gradient norm of every step is kept on the
device with the loss and read with it; spike scores, update RMS and small-variance shares go into the record.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from lnblocks.study.core.checkpoint import Checkpoints
from lnblocks.study.core.dist import DistContext
from lnblocks.study.core.preemption import Preempted
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.tasks import RunContext
from lnblocks.study.core.tracking import Tracker
from lnblocks.study.lm.config import RunConfig
from lnblocks.study.lm.run import diagnostics as diag
from lnblocks.study.lm.run import stability as stab
from lnblocks.study.lm.run.optim import checkpointed, deterministic_kernels, forward_backward, set_lrs
from lnblocks.study.lm.run.record import finish
from lnblocks.study.lm.run.setup import PROBE_SEED_OFFSET, RunSetup, set_up

__all__ = ["PROBE_SEED_OFFSET", "train", "train_run"]


def train(run: RunConfig, ctx: RunContext) -> RunRecord:
    """The ``lm`` task's ``train``: ``train_run`` as an executor hands a run over (``RunContext``: the rank, the step
    bar, the open curve tracker, the checkpoints)."""
    return train_run(
        run,
        dist=ctx.dist,
        show_progress=ctx.show_progress,
        position=ctx.position,
        tracker=ctx.tracker,
        checkpoints=ctx.checkpoints,
    )


def train_run(
    run: RunConfig,
    *,
    dist: DistContext | None = None,
    show_progress: bool = True,
    position: int = 0,
    tracker: Tracker | None = None,
    checkpoints: Checkpoints | None = None,
) -> RunRecord:
    """Train ``run`` and return its record (``RunRecord`` with an ``LMResult``); ``tracker``: where its curves go
    while it trains (``lnblocks.study.core.tracking.open_tracker``); ``checkpoints``: where it saves its state as it
    goes and resumes from (``lnblocks.study.core.checkpoint.Checkpoints``; docs/long-runs.md)."""
    with deterministic_kernels(run.train.deterministic):
        s = set_up(run, dist or DistContext(), tracker, checkpoints)
        tc = s.run.train
        with _progress(tc.steps, s.run.run_id[:40], position, show_progress and s.dist.is_main) as bar:
            if bar is not None and s.loop.step:
                bar.update(s.loop.step)
            for step in range(s.loop.step, tc.steps):
                lr = train_step(s, step)
                read = (step + 1) % tc.log_every == 0 or step == tc.steps - 1
                if read and read_losses(s):  # diverged: the record ends at the diverging step
                    break
                if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.steps:
                    s.loop.eval_curve.append((step + 1, s.eval_loss()))
                s.loop.step = step + 1
                save_if_due(s)
                if bar is not None:
                    bar.update(1)
                    if step % 10 == 0 and s.loop.losses:
                        bar.set_postfix(loss=f"{s.loop.losses[-1]:.3f}", lr=f"{lr:.2g}")
        return finish(s)


def train_step(s: RunSetup, step: int) -> float:
    """One optimizer step at ``step`` (with the diagnostics of a logging step around it) and its LR; the loss and the
    gradient norm stay on the device (``LoopState.pending_*``) until ``read_losses``."""
    tc, gc = s.run.train, s.run.diagnostics
    lr = set_lrs(s.opt, tc, step)
    x, y = this_ranks_batch(s)
    due = gc.every > 0 and (step % gc.every == 0 or step == tc.steps - 1)  # the same on every rank
    rec = _probe(s, step, lr) if due else None  # rank 0's diagnostics entry (None elsewhere)
    s.opt.zero_grad(set_to_none=True)
    with s.loss_scope():
        value = forward_backward(s.model, x, y, tc.grad_accum, s.precision, tc.z_loss, s.full_logits)
    s.precision.unscale_(s.opt)
    total_norm = stab.grad_norm(s.raw)  # before clipping; read with the losses
    before = _gradients(s, rec) if due else None
    if tc.grad_clip is not None:
        torch.nn.utils.clip_grads_with_norm_(s.raw.parameters(), tc.grad_clip, total_norm)
    s.precision.step(s.opt)
    s.raw.normalize_weights_()  # nGPT's weights back onto the sphere after every step (a no-op for other models)
    if due:
        _updates(s, rec, before, lr)
    if s.dist.enabled:
        torch.distributed.all_reduce(value)
        value = value / s.dist.world_size
    s.loop.pending_loss.append(value)
    s.loop.pending_gn.append(total_norm)
    return lr


def this_ranks_batch(s: RunSetup) -> tuple[Tensor, Tensor]:
    """This rank's rows of the step's global batch ``(B, T)``, drawn the same on every rank from the run's sampler:
    its data-parallel group's rows when sharded (every tp rank of a group gets the same ones), its slice under DDP."""
    x, y = s.source.batch(s.run.data.batch_size, s.data_gen)
    if s.shard is not None:
        return tuple(t.to(s.device) for t in s.shard.split(x, y))  # type: ignore[return-value]
    per_rank = s.run.data.batch_size // s.dist.world_size
    lo = s.dist.rank * per_rank
    return x[lo : lo + per_rank].to(s.device), y[lo : lo + per_rank].to(s.device)


def _probe(s: RunSetup, step: int, lr: float) -> dict[str, Any] | None:
    """Before a logging step's forward: the probe batch's activations and the share of norm inputs under eps (rank 0,
    on the gathered weights when sharded)."""
    s.gather()
    if not s.dist.is_main:
        return None
    rec: dict[str, Any] = {"step": step, "lr": lr}
    with stab.small_variance(s.view) as below_eps:
        rec.update(diag.probe(s.view, s.probe_x, attention=s.run.diagnostics.attention, autocast=s.precision.autocast))
    rec["var_below_eps"] = below_eps
    return rec


def _gradients(s: RunSetup, rec: dict[str, Any] | None) -> dict[str, list[Tensor]] | None:
    """After a logging step's backward: per-layer gradient norms into ``rec`` and the weights before the update
    (rank 0 holds the full gradients only for this, when sharded)."""
    if s.shard is not None:
        s.shard.gather_grads()  # the weights are those gathered before the forward
    before = None
    if rec is not None:
        rec.update(diag.grad_norms(s.view))
        before = diag.snapshot(s.view)
    if s.shard is not None:
        s.shard.drop_grads()
    return before


def _updates(s: RunSetup, rec: dict[str, Any] | None, before: Any, lr: float) -> None:
    """After a logging step's update: update/weight ratios and the update RMS, then the entry is kept."""
    s.gather()
    if rec is not None:
        rec["update_ratio"] = diag.update_ratios(s.view, before)
        rec["update_rms"] = stab.update_rms(before, diag.weight_groups(s.view), lr)
        s.loop.records.append(rec)


def read_losses(s: RunSetup) -> bool:
    """Move the pending losses and gradient norms to the host (one transfer) and feed the divergence monitor; True
    once the run has diverged."""
    loop = s.loop
    if loop.pending_loss:
        n = len(loop.pending_loss)
        values = torch.stack([*loop.pending_loss, *loop.pending_gn]).cpu().tolist()
        loop.pending_loss.clear()
        loop.pending_gn.clear()
        for v, g in zip(values[:n], values[n:]):
            loop.losses.append(v)
            loop.grad_norms.append(g)
            if s.monitor.update(len(loop.losses) - 1, v):
                return True
        if s.curves is not None:
            s.curves.update(loop.losses, loop.records, loop.eval_curve, loop.grad_norms)
    return s.monitor.step is not None


def save_if_due(s: RunSetup) -> None:
    """Checkpoint when ``train.checkpoint`` says so, or when a SIGTERM asked the run to stop (then ``Preempted``)."""
    ck = s.checkpoints
    if ck is None or s.loop.step >= s.run.train.steps:
        return
    stop = ck.stop_requested()
    if stop or ck.due(s.loop.step):
        state = s.loop.state_dict(s.monitor, s.data_gen, s.precision.scaler, s.elapsed())
        ck.save(s.loop.step, s.raw, checkpointed(s.opt), state)
    if stop:
        raise Preempted(s.run.run_id, s.loop.step)


def _progress(total: int, desc: str, position: int, show: bool) -> Any:
    if not show:
        return contextlib.nullcontext(None)
    from lnblocks._optional import require

    return require("tqdm").tqdm(total=total, desc=desc, position=position, leave=False, dynamic_ncols=True)
