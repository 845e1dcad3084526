"""Data, model and one training run of the digits study: a small CNN on sklearn's bundled 8x8 digits.

``load_digits`` ships inside scikit-learn (1797 images, 10 classes), so nothing is downloaded. The CNN is
``conv-norm-relu`` x len(widths) with a 2x2 max-pool after the second block, global average pooling and a linear
classifier; only the norm changes between runs. Training is SGD with momentum and a cosine schedule over
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
from lnblocks.cnn import BatchNorm2d, BatchRenorm2d, GroupNorm, InstanceNorm2d, LayerNorm2d
from lnblocks.study.digits.config import DigitsRunConfig, DigitsSettings
from lnblocks.study.records import DigitsResult, RunRecord


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


def norm_factory(kind: str, cfg: DigitsSettings, total_steps: int) -> Callable[[int], nn.Module]:
    """``channels -> norm module`` for ``kind`` (affine everywhere, so only the statistics differ)."""
    m = cfg.bn_momentum
    if kind == "batch":
        return lambda c: BatchNorm2d(c, momentum=m)
    if kind == "group":
        return lambda c: GroupNorm(cfg.gn_groups, c)
    if kind == "layer2d":
        return lambda c: LayerNorm2d(c)
    if kind == "instance":
        return lambda c: InstanceNorm2d(c, affine=True)
    if kind == "batchrenorm":
        warmup = int(cfg.renorm_warmup_frac * total_steps)
        ramp = int(cfg.renorm_ramp_frac * total_steps)
        return lambda c: BatchRenorm2d(
            c, momentum=m, r_max=cfg.renorm_r_max, d_max=cfg.renorm_d_max, warmup_steps=warmup,
            r_ramp_steps=ramp, d_ramp_steps=ramp,
        )  # fmt: skip
    raise ValueError(f"norm must be one of 'batch', 'group', 'layer2d', 'instance', 'batchrenorm', got {kind!r}")


class DigitsCNN(nn.Module):
    """conv3x3-norm-relu blocks (max-pool after the 2nd), global average pool, linear head: (N, 1, 8, 8) -> (N, 10)."""

    def __init__(self, widths: tuple[int, ...], make_norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 1
        for i, c in enumerate(widths):
            layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), make_norm(c), nn.ReLU()]
            if i == 1:
                layers.append(nn.MaxPool2d(2))  # 8x8 -> 4x4
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x)  # (N, C, 4, 4)
        return self.head(h.mean((2, 3)))  # (N, 10)


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Eval-mode accuracy in percent."""
    model.eval()
    return 100.0 * (model(x).argmax(1) == y).float().mean().item()


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
    model = DigitsCNN(run.widths, norm_factory(run.norm, run, total_steps))
    lr = run.base_lr * b / 32
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=run.sgd_momentum, weight_decay=run.weight_decay)
    warmup = max(1, int(run.warmup_frac * total_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total_steps))
    )
    gen = torch.Generator().manual_seed(run.seed)
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
