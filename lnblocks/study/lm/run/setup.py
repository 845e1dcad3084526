"""What the loop of one ``lm`` run works on, built once before its first step (``set_up``): the device and precision,
the token source and its fixed eval and probe batches, the ``GPT`` (seeded), what trains it (the model itself,
compiled, wrapped in DistributedDataParallel under ``torchrun``, or sharded by ``train.parallel``), the optimizer, the
divergence monitor and the loop state, fresh or from the newest checkpoint.

The order of what draws random numbers is fixed, so a run is the same whoever trains it: the init from
``train.seed``, then the data sampler (its own generator from the same seed), then the probe batch and the
init-gradient batches (a generator of their own, ``PROBE_SEED_OFFSET`` past the seed); the final train-split eval
draws its windows from one more (``TRAIN_EVAL_SEED_OFFSET``), after training.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.study.core.checkpoint import Checkpoints
from lnblocks.study.core.dist import DistContext
from lnblocks.study.core.tracking import Tracker
from lnblocks.study.lm.config import RunConfig
from lnblocks.study.lm.data.builtin import build_source
from lnblocks.study.lm.data.source import TokenSource
from lnblocks.study.lm.run import diagnostics as diag
from lnblocks.study.lm.run.curves import CurveLogger
from lnblocks.study.lm.run.diagnostics import evaluate, finite_or_none
from lnblocks.study.lm.run.loop_state import DivergenceMonitor, LoopState
from lnblocks.study.lm.run.optim import Precision, build_optimizer, checkpointed
from lnblocks.study.lm.run.sharding import Sharded, data_parallel_degree

PROBE_SEED_OFFSET = 1_000_003  # probe batch and init-gradient batches: their own stream, not the training one
TRAIN_EVAL_SEED_OFFSET = 2_000_003  # the fixed training windows of the final train-split eval: a stream of their own


def resolve_device(name: str, dist: DistContext) -> torch.device:
    """``"auto"``: CUDA (this rank's local GPU) when available, else CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda", dist.local_rank if dist.enabled else torch.cuda.current_device())


@dataclass
class Clock:
    """Wall and CPU time since the run started and since its loop started (``start_loop``)."""

    wall: float = field(default_factory=time.perf_counter)
    cpu: float = field(default_factory=time.process_time)
    loop_wall: float = 0.0
    loop_cpu: float = 0.0

    def start_loop(self) -> None:
        self.loop_wall, self.loop_cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> dict[str, float]:
        """``wall_s``, ``cpu_s`` of the run and ``train_s``, ``train_cpu_s`` of its loop, so far."""
        wall, cpu = time.perf_counter(), time.process_time()
        return {"wall_s": wall - self.wall, "cpu_s": cpu - self.cpu, "train_s": wall - self.loop_wall,
                "train_cpu_s": cpu - self.loop_cpu}  # fmt: skip


@dataclass
class RunSetup:
    """One run, ready to train: ``raw`` is its ``GPT`` and ``model`` what trains it (``raw`` compiled, wrapped in DDP
    or sharded: ``shard``); ``view`` the unsharded model the diagnostics read (rank 0's gathered copy when
    sharded); ``loop`` what the steps carry (``LoopState``)."""

    run: RunConfig
    dist: DistContext
    device: torch.device
    precision: Precision
    source: TokenSource
    raw: nn.Module
    model: nn.Module
    shard: Sharded | None
    opt: Any  # a torch optimizer, or Muon's OptimizerPair
    monitor: DivergenceMonitor
    loop: LoopState
    data_gen: torch.Generator
    probe_x: Tensor  # (Bp, T), fixed for the whole run
    eval_set: list[tuple[Tensor, Tensor]]
    curves: CurveLogger | None
    checkpoints: Checkpoints | None
    clock: Clock

    @property
    def view(self) -> nn.Module | None:
        return self.raw if self.shard is None else self.shard.full

    @property
    def full_logits(self) -> bool:
        """The chunked LM head reads ``lm_head.weight`` itself; under tensor parallelism (a vocabulary-split
        DTensor) the loss goes through the head's gathered logits instead."""
        return self.shard is not None and self.shard.parallel.tp > 1

    @property
    def corpus(self) -> dict[str, Any] | None:
        return getattr(self.source, "corpus", None)

    def loss_scope(self) -> contextlib.AbstractContextManager[None]:
        """Where a loss's forward and backward run (PyTorch's ``loss_parallel`` when sharded with it)."""
        return self.shard.loss_scope() if self.shard is not None else contextlib.nullcontext()

    def eval_loss(self) -> float:
        with self.loss_scope():
            return evaluate(self.raw, self.eval_set, self.precision.autocast, self.full_logits)

    def train_eval_loss(self) -> float:
        """The eval-mode loss on ``data.eval_batches`` fixed windows of the *training* split (drawn from a generator
        of their own, ``TRAIN_EVAL_SEED_OFFSET`` past the seed): next to the held-out loss, the train-val gap in
        eval mode (Derf, arXiv 2512.10938, reads a norm's gain as generalization by it). Every rank calls it."""
        gen = torch.Generator().manual_seed(self.run.train.seed + TRAIN_EVAL_SEED_OFFSET)
        n, batch = len(self.eval_set), self.run.data.batch_size
        windows = [tuple(t.to(self.device) for t in self.source.batch(batch, gen)) for _ in range(n)]
        with self.loss_scope():
            return evaluate(self.raw, windows, self.precision.autocast, self.full_logits)

    def gather(self) -> None:
        """Sharded: the full weights into rank 0's copy (a collective: every rank calls it)."""
        if self.shard is not None:
            self.shard.gather()

    def elapsed(self) -> dict[str, float]:
        """This attempt's times plus those of the attempts before it (a resumed run)."""
        return {k: v + self.loop.elapsed.get(k, 0.0) for k, v in self.clock.elapsed().items()}


def set_up(run: RunConfig, dist: DistContext, tracker: Tracker | None, checkpoints: Checkpoints | None) -> RunSetup:
    """Build everything the loop of ``run`` works on (see the module docstring for the order of the random draws)."""
    from lnblocks.models import GPT

    clock = Clock()
    tc, dc, gc = run.train, run.data, run.diagnostics
    device = resolve_device(tc.device, dist)
    precision = Precision.of(tc.dtype, device)
    if dc.batch_size % (data_parallel_degree(run, dist.world_size) * tc.grad_accum):
        raise ValueError(
            f"data.batch_size ({dc.batch_size}) must be divisible by the world size ({dist.world_size}) "
            f"times train.grad_accum ({tc.grad_accum})"
        )
    source = build_source(dc)
    corpus = getattr(source, "corpus", None)
    if corpus is not None and dc.corpus is None:  # not bound by a runner: bind to what this process opened
        run = run.bind_corpus(corpus["digest"])
    torch.manual_seed(tc.seed)  # the init
    raw = GPT(run.model.gpt_config(source.vocab_size, dc.seq_len)).to(device)
    data_gen = torch.Generator().manual_seed(tc.seed)  # the training data order
    probe_gen = torch.Generator().manual_seed(tc.seed + PROBE_SEED_OFFSET)
    probe_x = source.batch(gc.probe_batch_size, probe_gen)[0].to(device)
    eval_set = [(x.to(device), y.to(device)) for x, y in source.eval_set()]
    start = checkpoints.latest() if checkpoints is not None else None
    init_grad = None
    if start is None and gc.init_grad_batches and dist.is_main:  # before DDP wraps the model: local backward passes
        batches = [tuple(t.to(device) for t in source.batch(dc.batch_size, probe_gen))
                   for _ in range(gc.init_grad_batches)]  # fmt: skip
        with precision.autocast():
            init_grad = diag.expected_grad(raw, batches)
    model, shard = _trainable(run, raw, device, dist)
    opt = build_optimizer(raw, tc)
    monitor = DivergenceMonitor(margin=tc.divergence_margin, patience=tc.divergence_patience)
    curves = CurveLogger(tracker, finite_or_none) if tracker is not None and dist.is_main else None
    s = RunSetup(run, dist, device, precision, source, raw, model, shard, opt, monitor, LoopState(), data_gen,
                 probe_x, eval_set, curves, checkpoints, clock)  # fmt: skip
    s.loop = _start_loop(s, start, init_grad)
    clock.start_loop()
    return s


def _trainable(run: RunConfig, raw: nn.Module, device: torch.device, dist: DistContext) -> tuple[nn.Module, Any]:
    """What trains ``raw``: sharded over ``train.parallel``'s mesh (rank 0 keeps an unsharded copy when diagnostics
    read whole weights), else ``raw`` (compiled with ``train.compile``), wrapped in DDP under ``torchrun``."""
    tc, gc = run.train, run.diagnostics
    if tc.parallel is not None and tc.parallel.world_size > 1:
        needs_full = gc.every > 0 or gc.layer_ablation  # what reads whole weights: the copy only then
        shard = Sharded(raw, tc.parallel, device, dist.is_main and needs_full)
        return shard.model, shard
    model = torch.compile(raw) if tc.compile else raw
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model, None


def _start_loop(s: RunSetup, start: int | None, init_grad: dict[str, Any] | None) -> LoopState:
    """A fresh loop (its first eval point at step 0), or, from the checkpoint of step ``start``, the model, the
    optimizer, the process's RNGs and the loop's own state (the sampler, the monitor and the GradScaler in place)."""
    if start is None:
        return LoopState(eval_curve=[(0, s.eval_loss())], init_grad=init_grad)
    assert s.checkpoints is not None
    saved = s.checkpoints.load(start, s.raw, checkpointed(s.opt))
    loop = LoopState.from_state(saved, s.monitor, s.data_gen, s.precision.scaler, s.device)
    if s.curves is not None:  # the event files start over: write what was logged before
        s.curves.update(loop.losses, loop.records, loop.eval_curve, loop.grad_norms)
    return loop
