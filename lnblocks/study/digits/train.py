"""Data, model and one training run of the digits study: a small CNN on sklearn's bundled 8x8 digits.

``load_digits`` ships inside scikit-learn (1797 images, 10 classes), so nothing is downloaded. The CNN is
``len(widths)`` blocks (a 3x3 conv and the arm's norm and activation, ``lnblocks.study.digits.arms``) with a 2x2
max-pool after the second, global average pooling and a linear classifier; only the blocks change between runs
(the NF arm clips its blocks' gradients with AGC). Training is SGD with momentum and a cosine schedule over
``epochs`` epochs (lr scaled linearly with the batch size; see ``schedule``). The score is test accuracy in eval
mode, where BatchNorm uses its running statistics -- where small batches hurt (Wu & He 2018; Ioffe 2017).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnblocks._optional import require
from lnblocks.cnn import adaptive_grad_clip_
from lnblocks.study.core.records import RunRecord
from lnblocks.study.digits.arms import DigitsCNN, weight_norm_data_init
from lnblocks.study.digits.config import DigitsRunConfig, DigitsSettings
from lnblocks.study.digits.result import DigitsResult


@dataclass(frozen=True)
class DigitsData:
    """Standardised images ``(N, 1, 8, 8)`` and labels ``(N,)``, split once (stratified, ``split_seed``)."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


def load_digits_data(cfg: DigitsSettings) -> DigitsData:
    """The digits split; pixels scaled by the training set's mean and std (one scalar each)."""
    return _load_digits(cfg.test_fraction, cfg.split_seed, cfg.max_train)


@functools.lru_cache(maxsize=4)
def _load_digits(test_fraction: float, split_seed: int, max_train: int | None) -> DigitsData:
    require("sklearn")
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        digits.images, digits.target, test_size=test_fraction, random_state=split_seed, stratify=digits.target
    )
    if max_train is not None:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    x_train = torch.tensor(x_tr, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
    x_test = torch.tensor(x_te, dtype=torch.float32).unsqueeze(1)
    mean, std = x_train.mean(), x_train.std()
    return DigitsData(
        (x_train - mean) / std, torch.tensor(y_tr, dtype=torch.long), (x_test - mean) / std, torch.tensor(y_te)
    )


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Eval-mode accuracy in percent."""
    model.eval()
    return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def _grad_norm(params: list[nn.Parameter]) -> Tensor:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))


def schedule(cfg: DigitsSettings, n_train: int, batch_size: int) -> tuple[int, int]:
    """``(epochs, SGD steps)`` of a run: ``cfg.epochs``, or more to reach ``cfg.min_steps``. The last partial
    batch of an epoch is dropped (a 1-image batch has no batch statistics)."""
    steps_per_epoch = n_train // batch_size
    epochs = max(cfg.epochs, math.ceil(cfg.min_steps / steps_per_epoch))
    return epochs, epochs * steps_per_epoch


def train_run(
    run: DigitsRunConfig, data: DigitsData | None = None, on_step: Callable[[], None] | None = None
) -> RunRecord:
    """Train one network; returns its ``RunRecord`` (a ``DigitsResult``). Threads are the caller's (the runner
    pins ``run.threads``)."""
    start, cpu = time.perf_counter(), time.process_time()
    data = data if data is not None else load_digits_data(run)
    torch.manual_seed(run.seed)
    n = data.x_train.shape[0]
    b = run.batch_size
    epochs, total_steps = schedule(run, n, b)
    steps_per_epoch = total_steps // epochs
    model = DigitsCNN(run.widths, run.norm, run, total_steps)
    gen = torch.Generator().manual_seed(run.seed)
    if run.norm == "weightnorm":
        init_idx = torch.randperm(n, generator=torch.Generator().manual_seed(run.seed))[: run.wn_init_images]
        weight_norm_data_init(model, data.x_train[init_idx])
    lr = run.base_lr * b / 32
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=run.sgd_momentum, weight_decay=run.weight_decay)
    warmup = max(1, int(run.warmup_frac * total_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total_steps))
    )
    clipped = model.clipped_parameters() if run.norm == "nf" else []
    agc_ratio = torch.zeros(())  # sum over steps of |G after AGC| / |G before| (the blocks' gradients)
    losses: list[float] = []
    for _ in range(epochs):
        model.train()
        order = torch.randperm(n, generator=gen)
        epoch_loss = torch.zeros(())  # summed on the device: one host read per epoch
        for i in range(steps_per_epoch):
            idx = order[i * b : (i + 1) * b]
            loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clipped:
                before = _grad_norm(clipped)
                adaptive_grad_clip_(clipped, clipping=run.agc_clipping)
                agc_ratio += _grad_norm(clipped) / before
            opt.step()
            sched.step()
            epoch_loss += loss.detach()
            if on_step is not None:
                on_step()
        losses.append(float(epoch_loss) / steps_per_epoch)
    result = DigitsResult(
        lr=lr,
        epochs=epochs,
        steps=total_steps,
        final_train_loss=losses[-1] if math.isfinite(losses[-1]) else None,
        train_acc=accuracy(model, data.x_train, data.y_train),
        test_acc=accuracy(model, data.x_test, data.y_test),
        switch_weights=model.switch_weights() if run.norm == "switchable" else None,
        agc_grad_ratio=float(agc_ratio) / total_steps if clipped else None,
    )
    return RunRecord(
        id=run.run_id,
        task="cnn_digits",
        status="finished",
        labels=run.label_dict,
        config=run.to_dict(),
        result=result,
        time={"wall_s": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu, 3)},
        env={"torch": torch.__version__, "threads": torch.get_num_threads(), "host": platform.node(),
             "pid": os.getpid()},
    )  # fmt: skip
