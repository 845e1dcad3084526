"""One run of the ``lm`` task, the one place such a run trains: build the ``GPT`` its config describes, train it
(learning-rate schedule, optimizer and precision: ``lnblocks.study.lm.run.optim``), log diagnostics, return its
``RunRecord``.

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
import math
import os
import platform
import time
from typing import Any

import torch
from torch import nn

from lnblocks.study.core.checkpoint import Checkpoints
from lnblocks.study.core.preemption import Preempted
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.tasks import DistContext, RunContext
from lnblocks.study.core.tracking import Tracker
from lnblocks.study.lm.config import RunConfig
from lnblocks.study.lm.data.builtin import build_source
from lnblocks.study.lm.result import LMResult
from lnblocks.study.lm.run import diagnostics as diag
from lnblocks.study.lm.run import stability as stab
from lnblocks.study.lm.run.curves import CurveLogger
from lnblocks.study.lm.run.diagnostics import backends_used, evaluate, finite_or_none, layer_ablation
from lnblocks.study.lm.run.loop_state import DivergenceMonitor, LoopState
from lnblocks.study.lm.run.optim import Precision, build_optimizer, deterministic_kernels, forward_backward, lr_at
from lnblocks.study.lm.run.sharding import Sharded, data_parallel_degree

PROBE_SEED_OFFSET = 1_000_003  # probe batch and init-gradient batches: their own stream, not the training one


def resolve_device(name: str, dist: DistContext) -> torch.device:
    """``"auto"``: CUDA (this rank's local GPU) when available, else CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda", dist.local_rank if dist.enabled else torch.cuda.current_device())


def _progress(total: int, desc: str, position: int, show: bool) -> Any:
    if not show:
        return contextlib.nullcontext(None)
    from lnblocks._optional import require

    return require("tqdm").tqdm(total=total, desc=desc, position=position, leave=False, dynamic_ncols=True)


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
        return _train(run, dist, show_progress, position, tracker, checkpoints)


def _train(
    run: RunConfig,
    dist: DistContext | None,
    show_progress: bool,
    position: int,
    tracker: Tracker | None,
    checkpoints: Checkpoints | None,
) -> RunRecord:
    from lnblocks.models import GPT

    dist = dist or DistContext()
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    tc, dc, gc = run.train, run.data, run.diagnostics
    device = resolve_device(tc.device, dist)
    precision = Precision.of(tc.dtype, device)
    autocast = precision.autocast

    dp = data_parallel_degree(run, dist.world_size)
    if dc.batch_size % (dp * tc.grad_accum):
        raise ValueError(
            f"data.batch_size ({dc.batch_size}) must be divisible by the world size ({dist.world_size}) "
            f"times train.grad_accum ({tc.grad_accum})"
        )
    source = build_source(dc)
    corpus = getattr(source, "corpus", None)
    if corpus is not None and dc.corpus is None:  # not bound by a runner: bind to what this process opened
        run = run.bind_corpus(corpus["digest"])
    sharded = tc.parallel is not None and tc.parallel.world_size > 1
    torch.manual_seed(tc.seed)  # the init
    raw = GPT(run.model.gpt_config(source.vocab_size, dc.seq_len)).to(device)
    data_gen = torch.Generator().manual_seed(tc.seed)  # the training data order
    probe_gen = torch.Generator().manual_seed(tc.seed + PROBE_SEED_OFFSET)
    probe_x = source.batch(gc.probe_batch_size, probe_gen)[0].to(device)  # (Bp, T), fixed for the whole run
    eval_set = [(x.to(device), y.to(device)) for x, y in source.eval_set()]
    start = checkpoints.latest() if checkpoints is not None else None

    init_grad = None
    if start is None and gc.init_grad_batches and dist.is_main:  # before DDP wraps the model: local backward passes
        batches = [
            tuple(t.to(device) for t in source.batch(dc.batch_size, probe_gen)) for _ in range(gc.init_grad_batches)
        ]
        with autocast():
            init_grad = diag.expected_grad(raw, batches)
    shard = None
    if sharded:  # FSDP2 / TP over train.parallel's mesh; the diagnostics read rank 0's gathered copy (``view``)
        assert tc.parallel is not None
        needs_full = gc.every > 0 or gc.layer_ablation  # what reads whole weights: the copy only then
        shard = Sharded(raw, tc.parallel, device, dist.is_main and needs_full)
        model: nn.Module = shard.model
    else:
        model = torch.compile(raw) if tc.compile else raw
    if dist.enabled and not sharded:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    view = raw if shard is None else shard.full  # the unsharded model the diagnostics read (rank 0)
    # the chunked LM head reads lm_head.weight itself: under tensor parallelism (a vocabulary-split DTensor) the loss
    # goes through the head's gathered logits instead
    full_logits = shard is not None and shard.parallel.tp > 1
    loss_scope = shard.loss_scope if shard is not None else contextlib.nullcontext  # loss_parallel's context

    def eval_loss() -> float:
        with loss_scope():
            return evaluate(raw, eval_set, autocast, full_logits)

    def gathered() -> None:  # sharded: the full weights into rank 0's copy (every rank takes part)
        if shard is not None:
            shard.gather()

    opt = build_optimizer(raw, tc)
    monitor = DivergenceMonitor(margin=tc.divergence_margin, patience=tc.divergence_patience)
    if start is None:
        loop = LoopState(eval_curve=[(0, eval_loss())], init_grad=init_grad)
    else:  # the model, the optimizer and the process's RNGs from the checkpoint, then the loop's own state
        saved = checkpoints.load(start, raw, opt)  # type: ignore[union-attr]
        loop = LoopState.from_state(saved, monitor, data_gen, precision.scaler, device)
    curves = CurveLogger(tracker, finite_or_none) if tracker is not None and dist.is_main else None
    if curves is not None and start is not None:  # the event files start over: write what was logged before
        curves.update(loop.losses, loop.records, loop.eval_curve, loop.grad_norms)
    per_rank = dc.batch_size // dist.world_size
    lo = dist.rank * per_rank
    every = gc.every > 0
    show = show_progress and dist.is_main
    t_train, c_train = time.perf_counter(), time.process_time()

    def read_losses() -> bool:
        """Move the pending losses and grad norms to the host (one transfer), feed the monitor; True once the run
        has diverged."""
        if loop.pending_loss:
            n = len(loop.pending_loss)
            values = torch.stack([*loop.pending_loss, *loop.pending_gn]).cpu().tolist()
            loop.pending_loss.clear()
            loop.pending_gn.clear()
            for v, g in zip(values[:n], values[n:]):
                loop.losses.append(v)
                loop.grad_norms.append(g)
                if monitor.update(len(loop.losses) - 1, v):
                    return True
            if curves is not None:
                curves.update(loop.losses, loop.records, loop.eval_curve, loop.grad_norms)
        return monitor.step is not None

    def elapsed() -> dict[str, float]:
        now = {"wall_s": time.perf_counter() - t_wall, "cpu_s": time.process_time() - t_cpu,
               "train_s": time.perf_counter() - t_train, "train_cpu_s": time.process_time() - c_train}  # fmt: skip
        return {k: v + loop.elapsed.get(k, 0.0) for k, v in now.items()}

    with _progress(tc.steps, run.run_id[:40], position, show) as bar:
        if bar is not None and loop.step:
            bar.update(loop.step)
        for step in range(loop.step, tc.steps):
            lr = lr_at(step, tc.lr, tc.warmup, tc.steps, tc.schedule, tc.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = source.batch(dc.batch_size, data_gen)  # (B, T) global batch, same on every rank
            if shard is not None:  # this rank's data-parallel rows (the same for every tp rank of its group)
                x, y = (t.to(device) for t in shard.split(x, y))
            else:
                x, y = x[lo : lo + per_rank].to(device), y[lo : lo + per_rank].to(device)
            due = every and (step % gc.every == 0 or step == tc.steps - 1)  # the same on every rank
            logging = due and dist.is_main
            rec: dict[str, Any] = {"step": step, "lr": lr}
            if due:
                gathered()
            if logging:
                with stab.small_variance(view) as below_eps:
                    rec.update(diag.probe(view, probe_x, attention=gc.attention, autocast=autocast))
                rec["var_below_eps"] = below_eps
            opt.zero_grad(set_to_none=True)
            with loss_scope():
                value = forward_backward(model, x, y, tc.grad_accum, precision, tc.z_loss, full_logits)
            precision.unscale_(opt)
            total_norm = stab.grad_norm(raw)  # before clipping; read with the losses
            if due and shard is not None:
                shard.gather_grads()  # the weights are those gathered before the forward
            if logging:
                rec.update(diag.grad_norms(view))
                before = diag.snapshot(view)
            if due and shard is not None:
                shard.drop_grads()  # rank 0's full gradients only live for the diagnostics of this step
            if tc.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(raw.parameters(), tc.grad_clip, total_norm)
            precision.step(opt)
            if due:
                gathered()
            if logging:
                rec["update_ratio"] = diag.update_ratios(view, before)
                rec["update_rms"] = stab.update_rms(before, diag.weight_groups(view), lr)
                loop.records.append(rec)
            if dist.enabled:
                torch.distributed.all_reduce(value)
                value = value / dist.world_size
            loop.pending_loss.append(value)
            loop.pending_gn.append(total_norm)
            if ((step + 1) % tc.log_every == 0 or step == tc.steps - 1) and read_losses():
                break
            if tc.eval_every and (step + 1) % tc.eval_every == 0 and step + 1 < tc.steps:
                loop.eval_curve.append((step + 1, eval_loss()))
            loop.step = step + 1
            stop = checkpoints is not None and loop.step < tc.steps and checkpoints.stop_requested()  # SIGTERM
            if checkpoints is not None and loop.step < tc.steps and (stop or checkpoints.due(loop.step)):
                state = loop.state_dict(monitor, data_gen, precision.scaler, elapsed())
                checkpoints.save(loop.step, raw, opt, state)
            if stop:
                raise Preempted(run.run_id, loop.step)
            if bar is not None:
                bar.update(1)
                if step % 10 == 0 and loop.losses:
                    bar.set_postfix(loss=f"{loop.losses[-1]:.3f}", lr=f"{lr:.2g}")
    times = elapsed()
    final_eval = eval_loss()
    ablation = None
    if gc.layer_ablation and monitor.step is None and math.isfinite(final_eval):  # the same on every rank
        gathered()
        if dist.is_main:
            ablation = {"base": finite_or_none(final_eval), "skip": layer_ablation(view, eval_set, autocast)}
    losses, grad_norms, records, eval_curve = loop.losses, loop.grad_norms, loop.records, loop.eval_curve
    reason = None
    if monitor.step is not None:  # cut what ran after the diverging step (it was only noticed at the next read)
        stop = monitor.step
        del losses[stop + 1 :], grad_norms[stop + 1 :]
        records = [r for r in records if r["step"] <= stop]
        eval_curve = [(s, v) for s, v in eval_curve if s <= stop + 1]
        reason = "non-finite loss" if not math.isfinite(losses[-1]) else "loss above start + margin for patience steps"
    elif not math.isfinite(final_eval) or final_eval > eval_curve[0][1] + tc.divergence_margin:
        # where the final climb began (a run shorter than the patience), else the last step
        monitor.step = len(losses) - monitor.streak if monitor.streak else len(losses) - 1
        reason = "final eval loss non-finite or above its initial value + margin"
    diverged = monitor.step is not None
    eval_curve.append((len(losses), final_eval))
    if curves is not None:
        curves.update(losses, records, eval_curve, grad_norms, final=True)
    window = [v for v in losses[-tc.final_window :] if math.isfinite(v)]
    loss, grad_norm = [finite_or_none(v) for v in losses], [finite_or_none(v) for v in grad_norms]
    result = LMResult(
        reference=source.reference,
        model={"params": (view or raw).num_params(), **backends_used(raw)},  # what the final (eager) eval ran
        steps_done=len(losses),
        diverged_step=monitor.step,
        diverged_reason=reason,
        initial_loss=finite_or_none(losses[0]),
        final_train_loss=finite_or_none(sum(window) / len(window)) if window and not diverged else None,
        eval={
            "init": finite_or_none(eval_curve[0][1]),
            "final": None if diverged else finite_or_none(final_eval),
            "curve": [[s, finite_or_none(v)] for s, v in eval_curve],
        },
        loss=loss,
        diagnostics=records,
        init_grad=loop.init_grad,
        layer_ablation=ablation,
        grad_norm=grad_norm,
        stability=stab.summary(loss, grad_norm, records),
        corpus=corpus,
    )
    env = {"torch": torch.__version__, "device": str(device), "world_size": dist.world_size,
           "threads": torch.get_num_threads(), "host": platform.node(), "pid": os.getpid()}  # fmt: skip
    if tc.parallel is not None:
        env["parallel"] = tc.parallel.to_dict()
    if checkpoints is not None and checkpoints.resumed_from:
        env["resumed_from"] = list(checkpoints.resumed_from)
    steps = max(len(losses), 1)
    return RunRecord(
        id=run.run_id,
        task="lm",
        status="diverged" if diverged else "finished",
        labels=run.label_dict,
        config=run.to_dict(),
        result=result,
        time={
            "wall_s": round(time.perf_counter() - t_wall + loop.elapsed.get("wall_s", 0.0), 3),
            "cpu_s": round(time.process_time() - t_cpu + loop.elapsed.get("cpu_s", 0.0), 3),
            "step_ms": round(1e3 * times["train_s"] / steps, 3),
            "step_cpu_ms": round(1e3 * times["train_cpu_s"] / steps, 3),
        },
        env=env,
    )
