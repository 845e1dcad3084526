"""Xiong et al. 2020's gradient profile at initialization over many seeds, without training (arXiv 2002.04745,
Fig. 3 and Theorem 1).

The profile of an (arm, depth) is a property of the init, so it needs no run: for ``seeds`` fresh inits it takes the
expected gradient of every weight group (mean gradient over ``batches`` batches, then its Frobenius norm) and the
residual-stream RMS after each block (Lemma 2). A seed draws its init, probe batch and gradient batches exactly as
``train_run`` does with that ``train.seed``, so seed s here equals the ``init_grad`` of a run with seed s (and as
many batches). The report computes the profiles of every (arm, depth) of a study once and caches them in
``OUT/init_profile.json``, keyed by the model/data config and the settings, so a rebuilt report reuses them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnblocks.study.core.atomic import write_json_atomic
from lnblocks.study.core.records import RecordError, RunRecord, read_json
from lnblocks.study.core.run_config import config_hash
from lnblocks.study.lm.config import InitProfileConfig, RunConfig

FORMAT = "lnblocks.study.lm.init_profile/1"
FILE = "init_profile.json"


@dataclass(frozen=True)
class InitProfile:
    """Per-seed profiles of one (arm, depth): ``grad[group][i]`` the expected-gradient norm by layer of seed
    ``seeds[i]`` (groups W_Q ... W_2, norm), ``residual_rms[i]`` the RMS of the stream after the embedding and
    after each block. ``source``: ``"init_profile"`` (fresh inits) or ``"runs"`` (the runs' own ``init_grad``)."""

    arch: str
    depth: int
    seeds: list[int]
    grad: dict[str, list[list[float]]]
    residual_rms: list[list[float]] = field(default_factory=list)
    batches: int = 0
    source: str = "init_profile"

    @property
    def w2(self) -> list[list[float]]:
        return self.grad.get("W_2", [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "arch": self.arch, "depth": self.depth, "seeds": self.seeds, "grad": self.grad,
            "residual_rms": self.residual_rms, "batches": self.batches, "source": self.source,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InitProfile:
        return cls(
            arch=str(d["arch"]),
            depth=int(d["depth"]),
            seeds=[int(s) for s in d["seeds"]],
            grad={k: [list(map(float, p)) for p in v] for k, v in d["grad"].items()},
            residual_rms=[list(map(float, p)) for p in d.get("residual_rms", [])],
            batches=int(d.get("batches", 0)),
            source=str(d.get("source", "init_profile")),
        )


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def measure(run: RunConfig, seeds: list[int], batches: int, progress: Any = None) -> dict[str, Any]:
    """Expected-gradient norms by group and layer and the init residual RMS of ``run``'s model, for each seed."""
    import torch

    from lnblocks.models import GPT
    from lnblocks.study.lm import diagnostics as diag
    from lnblocks.study.lm.data import build_source
    from lnblocks.study.lm.train import PROBE_SEED_OFFSET

    source = build_source(run.data)
    grad: dict[str, list[list[float]]] = {}
    residual = []
    with _threads(run.train.threads):
        for seed in seeds:
            torch.manual_seed(seed)  # as train_run: the init, then the probe stream
            model = GPT(run.model.gpt_config(source.vocab_size, run.data.seq_len))
            probe_gen = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
            probe_x = source.batch(run.diagnostics.probe_batch_size, probe_gen)[0]
            data = [source.batch(run.data.batch_size, probe_gen) for _ in range(batches)]
            for k, v in diag.expected_grad(model, data)["expected"].items():
                grad.setdefault(k, []).append(v)
            residual.append(diag.probe(model, probe_x, attention=False)["residual_rms"])
            if progress is not None:
                progress.update(1)
    return {"grad": grad, "residual_rms": residual}


def _key(run: RunConfig, settings: InitProfileConfig) -> str:
    """What a cached profile depends on: the model, data and diagnostics sections, the threads, the settings."""
    d = run.to_dict()
    return config_hash(
        {"model": d["model"], "data": d["data"], "probe": d["diagnostics"]["probe_batch_size"],
         "threads": d["train"]["threads"], "settings": settings.to_dict()}
    )  # fmt: skip


def targets(records: list[RunRecord]) -> dict[tuple[str, int], RunConfig]:
    """One run config per (arm, depth) of the records (the first by id; LR, warmup and seed do not change the
    init)."""
    from lnblocks.study.lm.analysis import arch_of

    out: dict[tuple[str, int], RunConfig] = {}
    for rec in sorted(records, key=lambda r: r.id):
        key = (arch_of(rec), rec.config["model"]["depth"])
        if key not in out:
            out[key] = RunConfig.from_dict(_readable_config(rec))
    return out


def _readable_config(rec: RunRecord) -> dict[str, Any]:
    """The record's config as a run config can be built from it: a corpus run's record names its corpus by digest
    (the files that made it are not kept), so its data are read from the prepared token files it names."""
    corpus = rec.result.corpus
    if rec.config["data"]["source"] in ("shakespeare", "markov") or not corpus:
        return rec.config
    data = {
        **rec.config["data"],
        "source": "tokens",
        "train_path": corpus["train_path"],
        "val_path": corpus["val_path"],
        "token_dtype": corpus["token_dtype"],
        "vocab_size": corpus["vocab_size"],
    }
    return {**rec.config, "data": data}  # fmt: skip


def profiles_from_runs(records: list[RunRecord]) -> list[InitProfile]:
    """The profiles the runs measured themselves (``init_grad``, one per training seed; ``init_profile.seeds: 0``)."""
    from lnblocks.study.lm.analysis import arch_of

    acc: dict[tuple[str, int], dict[int, RunRecord]] = {}
    for rec in sorted(records, key=lambda r: r.id):
        if (rec.result.init_grad or {}).get("expected"):
            acc.setdefault((arch_of(rec), rec.config["model"]["depth"]), {}).setdefault(
                rec.config["train"]["seed"], rec
            )
    out = []
    for (arch, depth), by_seed in sorted(acc.items()):
        seeds = sorted(by_seed)
        grad: dict[str, list[list[float]]] = {}
        for s in seeds:
            for k, v in by_seed[s].result.init_grad["expected"].items():
                grad.setdefault(k, []).append(v)
        residual = [
            by_seed[s].result.diagnostics[0]["residual_rms"]
            for s in seeds
            if by_seed[s].result.diagnostics and by_seed[s].result.diagnostics[0].get("step") == 0
        ]
        batches = by_seed[seeds[0]].config.get("diagnostics", {}).get("init_grad_batches", 0)
        out.append(
            InitProfile(arch, depth, seeds, grad, residual if len(residual) == len(seeds) else [], batches, "runs")
        )
    return out


def compute_profiles(
    runs: dict[tuple[str, int], RunConfig],
    settings: InitProfileConfig,
    cache: dict[str, Any] | None = None,
    show_progress: bool = False,
) -> tuple[list[InitProfile], dict[str, Any]]:
    """The profile of every (arm, depth) in ``runs`` over ``settings.seeds`` seeds; entries of ``cache`` (a
    previous ``init_profile.json``) with the same key are reused. Returns the profiles and the new cache."""
    seeds = list(range(settings.first_seed, settings.first_seed + settings.seeds))
    old = {e["key"]: e for e in (cache or {}).get("entries", []) if isinstance(e, dict) and "key" in e}
    todo = {k: r for k, r in runs.items() if _key(r, settings) not in old}
    bar: Any = contextlib.nullcontext(None)
    if show_progress and todo:
        from lnblocks._optional import require

        total = len(seeds) * len(todo)
        bar = require("tqdm").tqdm(total=total, desc="init gradient profiles", leave=False, dynamic_ncols=True)
    entries = []
    with bar as progress:
        for (arch, depth), run in sorted(runs.items()):
            key = _key(run, settings)
            if key in old:
                entry = {**old[key], "arch": arch, "depth": depth}
            else:
                m = measure(run, seeds, settings.batches, progress)
                entry = {
                    "key": key,
                    **InitProfile(arch, depth, seeds, m["grad"], m["residual_rms"], settings.batches).to_dict(),
                }
            entries.append(entry)
    profiles = [InitProfile.from_dict(e) for e in entries]
    return profiles, {"format": FORMAT, "entries": entries}


def study_profiles(
    out: Path | None, records: list[RunRecord], settings: InitProfileConfig, show_progress: bool = False
) -> list[InitProfile]:
    """The init profiles the findings use: measured over ``settings.seeds`` fresh inits (cached in
    ``out/init_profile.json`` when ``out`` is given), or the runs' own when ``settings.seeds`` is 0."""
    if settings.seeds == 0:
        return profiles_from_runs(records)
    cache = None
    path = out / FILE if out is not None else None
    if path is not None and path.is_file():
        try:
            cache = read_json(path, "init profile cache")
        except RecordError:
            cache = None  # a broken cache is recomputed
    profiles, new = compute_profiles(targets(records), settings, cache, show_progress)
    if path is not None and new != cache:
        write_json_atomic(path, new)
    return profiles
