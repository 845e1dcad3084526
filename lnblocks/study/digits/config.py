"""Typed configs of the CNN small-batch study: ``DigitsSettings`` (how every network trains), ``DigitsStudyConfig``
(the settings plus the grid: norms x batch sizes x seeds) and ``DigitsRunConfig`` (the settings plus one grid point).

All are ``lnblocks.config.Config`` dataclasses. The defaults are the study as run for the README (a few CPU minutes);
``DigitsStudyConfig.quick()`` is a seconds-long smoke version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lnblocks.config import Config, ConfigTypeError, ConfigValueError, check_choice, check_float, check_int
from lnblocks.study.core.run_config import MAX_SEED, LabelledRun, check_seed

# The arms: what each block's conv3x3-norm-ReLU becomes is in lnblocks.study.digits.arms (one recipe per kind).
NORM_LABELS = {
    "batch": "BatchNorm",
    "group": "GroupNorm",
    "layer2d": "LayerNorm2d",
    "instance": "InstanceNorm",
    "batchrenorm": "BatchRenorm",
    "switchable": "SwitchableNorm",
    "frn": "FRN + TLU",
    "evonorm_s0": "EvoNorm-S0",
    "evonorm_b0": "EvoNorm-B0",
    "group_ws": "GroupNorm + WS",
    "nf": "NF (scaled WS + AGC)",
    "weightnorm": "WeightNorm",
    "lrn": "LRN",
}
NORM_KINDS = tuple(NORM_LABELS)
GRID_KEYS = ("norms", "batch_sizes", "seeds")


def _int_list(key: str, values: Any, minimum: int, maximum: int | None = None, distinct: bool = True) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ConfigTypeError(key, f"must be a list of ints, got {type(values).__name__} {values!r}")
    out = tuple(check_int(f"{key}[{i}]", v, minimum=minimum, maximum=maximum) for i, v in enumerate(values))
    if not out:
        raise ConfigValueError(key, "must be a non-empty list")
    if distinct and len(set(out)) != len(out):
        raise ConfigValueError(key, f"has duplicates: {list(values)!r}")
    return out


@dataclass(frozen=True, kw_only=True)
class DigitsSettings(Config):
    """How every network of the study trains: a small CNN on sklearn's 8x8 digits for ``epochs`` epochs.

    The learning rate scales linearly with the batch size (``lr = base_lr * batch_size / 32``), as in Wu & He
    (2018, arXiv 1803.08494), and every batch size trains for ``epochs`` epochs, so every batch size gets the same
    lr x steps budget. ``min_steps`` can top up large batches to at least that many SGD steps (the report then flags
    the unequal budget); the default 1 keeps the budgets equal. ``threads``: torch threads of the process that trains
    a run (the nets are tiny: more threads only add overhead).
    """

    epochs: int = 10  # batch 32 needs ~10 epochs (440 steps) to converge; equal epochs = equal lr x steps budget
    min_steps: int = 1  # large batches train for more epochs if needed to reach this many SGD steps
    base_lr: float = 0.1  # at batch size 32
    warmup_frac: float = 0.1  # linear lr warm-up over this fraction of the steps (Goyal et al. 2017), then cosine
    sgd_momentum: float = 0.9
    weight_decay: float = 5e-4
    widths: tuple[int, ...] = (16, 32, 32)  # conv channels; a 2x2 max-pool after the second conv
    gn_groups: int = 4
    bn_momentum: float = 0.1  # of the running statistics (BatchNorm, BatchRenorm, tracked InstanceNorm)
    renorm_r_max: float = 3.0
    renorm_d_max: float = 5.0
    renorm_warmup_frac: float = 0.1  # of all training steps with r_max=1, d_max=0 (Ioffe 2017's warm-up) ...
    renorm_ramp_frac: float = 0.3  # ... then both limits grow linearly over this fraction of the steps
    test_fraction: float = 0.2
    split_seed: int = 0
    agc_clipping: float = 0.01  # NF arm: AGC's lambda (Brock et al. 2021, arXiv 2102.06171), on every conv weight
    wn_init_images: int = 256  # WeightNorm arm: training images of the data-dependent init (Salimans & Kingma 2016)
    max_train: int | None = None  # cap the training set (smoke tests); None = all of it
    threads: int = 1

    def __post_init__(self) -> None:
        self._set("widths", _int_list("widths", self.widths, 1, distinct=False))
        if len(self.widths) < 2:
            raise ConfigValueError(
                "widths", f"needs at least 2 conv layers (pooling follows the second), got {list(self.widths)}"
            )
        for name in ("epochs", "min_steps", "gn_groups", "wn_init_images", "threads"):
            self._set(name, check_int(name, getattr(self, name)))
        if any(w % self.gn_groups for w in self.widths):
            raise ConfigValueError("gn_groups", f"({self.gn_groups}) must divide every width in {list(self.widths)}")
        self._set("base_lr", check_float("base_lr", self.base_lr, lo=0, lo_open=True))
        self._set("agc_clipping", check_float("agc_clipping", self.agc_clipping, lo=0, lo_open=True))
        for name in ("warmup_frac", "sgd_momentum", "weight_decay", "bn_momentum", "renorm_warmup_frac",
                     "renorm_ramp_frac"):  # fmt: skip
            self._set(name, check_float(name, getattr(self, name), lo=0, hi=1))
        self._set("test_fraction", check_float("test_fraction", self.test_fraction, lo=0.05, hi=0.95))
        self._set("renorm_r_max", check_float("renorm_r_max", self.renorm_r_max, lo=1))
        self._set("renorm_d_max", check_float("renorm_d_max", self.renorm_d_max, lo=0))
        self._set("split_seed", check_int("split_seed", self.split_seed, minimum=0, maximum=2**32 - 1))
        self._set("max_train", check_int("max_train", self.max_train, minimum=32, allow_none=True))

    def settings(self) -> dict[str, Any]:
        """The training settings alone (what every run of a study shares)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(DigitsSettings)}


@dataclass(frozen=True, kw_only=True)
class DigitsStudyConfig(DigitsSettings):
    """The settings plus the grid: every (norm, batch size, seed)."""

    norms: tuple[str, ...] = NORM_KINDS
    batch_sizes: tuple[int, ...] = (2, 4, 8, 16, 32)
    seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        norms = (self.norms,) if isinstance(self.norms, str) else self.norms
        if not isinstance(norms, Sequence) or not norms:
            raise ConfigTypeError("norms", f"must be a non-empty list of norm names, got {self.norms!r}")
        for i, n in enumerate(norms):
            check_choice(f"norms[{i}]", n, NORM_KINDS)
        if len(set(norms)) != len(norms):
            raise ConfigValueError("norms", f"has duplicates: {list(norms)!r}")
        self._set("norms", tuple(norms))
        self._set("batch_sizes", _int_list("batch_sizes", self.batch_sizes, 2))
        self._set("seeds", _int_list("seeds", self.seeds, 0, MAX_SEED))

    def quick(self) -> DigitsStudyConfig:
        """A smoke version (about 20 CPU seconds): one seed, batch sizes 4 and 32, 384 training images, 2 epochs
        (at least 60 steps); every arm of ``norms``."""
        return self.replace(seeds=self.seeds[:1], epochs=2, min_steps=60, batch_sizes=(4, 32), max_train=384)


@dataclass(frozen=True, kw_only=True)
class DigitsRunConfig(LabelledRun, DigitsSettings):
    """One grid point: a norm, a batch size and a seed, with the study's settings."""

    norm: str = "batch"
    batch_size: int = 32
    seed: int = 0
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("norm", self.norm, NORM_KINDS)
        self._set("batch_size", check_int("batch_size", self.batch_size, minimum=2))
        self._set("seed", check_seed("seed", self.seed))
        self._set("labels", tuple((str(k), str(v)) for k, v in self.labels))

    @classmethod
    def field_names(cls) -> list[str]:
        return [n for n in super().field_names() if n != "labels"]

    @property
    def cost(self) -> float:
        return 1.0 / self.batch_size  # small batches take the most steps
