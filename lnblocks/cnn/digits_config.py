"""Typed, validated configuration of the small-batch digits study (``lnblocks.cnn.digits_study``).

A frozen dataclass: every field has a default, ``__post_init__`` validates, unknown YAML keys are errors. The
defaults are the study as run for the README (a few CPU minutes); ``quick()`` is a sub-minute smoke version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NORM_KINDS = ("batch", "group", "layer2d", "instance", "batchrenorm")
NORM_LABELS = {
    "batch": "BatchNorm",
    "group": "GroupNorm",
    "layer2d": "LayerNorm2d",
    "instance": "InstanceNorm",
    "batchrenorm": "BatchRenorm",
}


def _ints(name: str, values: Any, minimum: int, distinct: bool = True) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a list of ints, got {values!r}")
    out = tuple(values)
    if not out or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in out):
        raise ValueError(f"{name} must be a non-empty list of ints >= {minimum}, got {values!r}")
    if distinct and len(set(out)) != len(out):
        raise ValueError(f"{name} has duplicates: {values!r}")
    return out


@dataclass(frozen=True)
class DigitsStudyConfig:
    """What to train: norms x batch sizes x seeds, each a small CNN on sklearn's 8x8 digits for ``epochs`` epochs.

    The learning rate scales linearly with the batch size (``lr = base_lr * batch_size / 32``), as in Wu & He
    (2018), and every batch size trains for ``epochs`` epochs, so every batch size gets the same lr x steps budget.
    ``min_steps`` can top up large batches to at least that many SGD steps (the report then flags the unequal
    budget); the default 1 keeps the budgets equal.
    """

    norms: tuple[str, ...] = NORM_KINDS
    batch_sizes: tuple[int, ...] = (2, 4, 8, 16, 32)
    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 5  # batch 32 needs ~5 epochs (225 steps) to converge; equal epochs = equal lr x steps budget
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
    max_train: int | None = None  # cap the training set (smoke tests); None = all of it
    threads: int = 1  # torch threads: the nets are tiny, more threads only add overhead

    def __post_init__(self) -> None:
        norms = tuple(self.norms) if not isinstance(self.norms, str) else (self.norms,)
        unknown = [n for n in norms if n not in NORM_KINDS]
        if not norms or unknown or len(set(norms)) != len(norms):
            raise ValueError(f"norms must be distinct names from {NORM_KINDS}, got {self.norms!r}")
        object.__setattr__(self, "norms", norms)
        object.__setattr__(self, "batch_sizes", _ints("batch_sizes", self.batch_sizes, 2))
        object.__setattr__(self, "seeds", _ints("seeds", self.seeds, 0))
        object.__setattr__(self, "widths", _ints("widths", self.widths, 1, distinct=False))
        if len(self.widths) < 2:
            raise ValueError(f"widths needs at least 2 conv layers (pooling follows the second), got {self.widths}")
        for name in ("epochs", "min_steps", "gn_groups", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if any(w % self.gn_groups for w in self.widths):
            raise ValueError(f"gn_groups ({self.gn_groups}) must divide every width in {self.widths}")
        for name, lo, hi in (
            ("base_lr", 0.0, float("inf")),
            ("warmup_frac", 0.0, 1.0),
            ("sgd_momentum", 0.0, 1.0),
            ("weight_decay", 0.0, 1.0),
            ("bn_momentum", 0.0, 1.0),
            ("renorm_warmup_frac", 0.0, 1.0),
            ("renorm_ramp_frac", 0.0, 1.0),
            ("test_fraction", 0.05, 0.95),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"{name} must be a number in [{lo}, {hi}], got {v!r}")
        if self.renorm_r_max < 1 or self.renorm_d_max < 0:
            raise ValueError("renorm_r_max must be >= 1 and renorm_d_max >= 0")
        if self.max_train is not None and (isinstance(self.max_train, bool) or self.max_train < 32):
            raise ValueError(f"max_train must be None or an int >= 32, got {self.max_train!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DigitsStudyConfig:
        """Build from a mapping (a parsed YAML file); unknown keys are a ``ValueError``."""
        if not isinstance(data, dict):
            raise TypeError(f"config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; known: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> DigitsStudyConfig:
        """Load ``path`` (YAML, needs pyyaml: ``pip install 'lnblocks[study]'``)."""
        try:
            import yaml
        except ImportError as err:
            raise ImportError("YAML configs need pyyaml: pip install 'lnblocks[study]'") from err

        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {})

    def quick(self) -> DigitsStudyConfig:
        """A smoke version (about 10 CPU seconds): one seed, batch sizes 4 and 32, 384 training images, 2 epochs."""
        return dataclasses.replace(
            self, seeds=self.seeds[:1], epochs=2, min_steps=60, batch_sizes=(4, 32), max_train=384
        )

    def run_fingerprint(self) -> str:
        """Hash of every setting a single run depends on (not the grid): names cached run files."""
        d = dataclasses.asdict(self)
        for grid in ("norms", "batch_sizes", "seeds", "threads"):
            d.pop(grid)
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class DigitsRun:
    """One grid point: a norm, a batch size and a seed."""

    norm: str
    batch_size: int
    seed: int
    fingerprint: str = field(default="")

    @property
    def run_id(self) -> str:
        return f"{self.norm}-b{self.batch_size}-s{self.seed}-{self.fingerprint}"
