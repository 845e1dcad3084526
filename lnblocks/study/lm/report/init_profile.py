"""Xiong et al. 2020's gradient profile at initialization over many seeds, without training (arXiv 2002.04745,
Fig. 3 and Theorem 1).

The profile of an (arm, depth) is a property of the init, so it needs no run: for ``seeds`` fresh inits it takes the
expected gradient of every weight group (mean gradient over ``batches`` batches, then its Frobenius norm) and the
residual-stream RMS after each block (Lemma 2). A seed draws its init, probe batch and gradient batches exactly as
``train_run`` does with that ``train.seed``, so seed s here equals the ``init_grad`` of a run with seed s (and as
many batches). The report computes the profiles of every (arm, depth) of a study once and caches them in
``OUT/init_profile.json``, keyed by the model/data config and the settings, so a rebuilt report reuses them.

Each (arm, depth, seed) is one job for the study's executor (``lnblocks study run --workers N``, Ray; a
``core.executors.Job`` with ``call=measure_job``), trained like a run (``train_job``: pinned ``train.threads``,
flush-to-zero), so a profile has the same bits on any executor and any number of workers; without an executor
(``lnblocks study report``, torchrun's driver) the jobs run one after another in this process the same way.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
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
    def from_dict(cls, d: Any) -> InitProfile:
        """The profile of ``to_dict``'s form; ``ValueError`` saying what is wrong for anything else (a damaged
        cache): every seed has one finite norm >= 0 per layer in every group, one RMS per stream position."""
        if not isinstance(d, dict):
            raise ValueError(f"an init profile must be a mapping, got {type(d).__name__}")
        try:
            arch, depth, seeds = d["arch"], d["depth"], d["seeds"]
            grad, residual = d["grad"], d.get("residual_rms", [])
        except KeyError as err:
            raise ValueError(f"an init profile needs {err.args[0]!r}") from None
        if not isinstance(arch, str) or not _is_int(depth) or depth < 1:
            raise ValueError(f"arch must be a string and depth an int >= 1, got {arch!r:.40}, {depth!r:.20}")
        if not isinstance(seeds, list) or not seeds or not all(_is_int(x) for x in seeds):
            raise ValueError("seeds must be a non-empty list of ints")
        if not isinstance(grad, dict) or not isinstance(residual, list) or (residual and len(residual) != len(seeds)):
            raise ValueError("grad must map groups to one profile per seed, residual_rms hold one per seed")
        out = cls(
            arch=arch,
            depth=depth,
            seeds=list(seeds),
            grad={str(k): [_profile(p, depth, f"grad.{k}") for p in _per_seed(v, seeds)] for k, v in grad.items()},
            residual_rms=[_profile(p, depth + 1, "residual_rms") for p in residual],
            batches=d.get("batches", 0) if _is_int(d.get("batches", 0)) else 0,
            source=str(d.get("source", "init_profile")),
        )
        return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _per_seed(value: Any, seeds: list[int]) -> list[Any]:
    if not isinstance(value, list) or len(value) != len(seeds):
        raise ValueError(f"a group must hold one profile per seed ({len(seeds)})")
    return value


def _profile(values: Any, length: int, what: str) -> list[float]:
    """``values`` as ``length`` finite floats (norms >= 0); ``ValueError`` naming ``what`` otherwise."""
    ok = isinstance(values, list) and len(values) == length
    ok = ok and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in values
    )
    if not ok:
        raise ValueError(f"{what} must hold {length} finite numbers >= 0 per seed, got {values!r:.60}")
    return [float(v) for v in values]


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def measure_seed(run: RunConfig, seed: int, batches: int) -> tuple[dict[str, list[float]], list[float]]:
    """Seed ``seed``'s expected-gradient norms by group and layer (over ``batches`` batches) and init residual RMS
    of ``run``'s model, drawn as ``train_run`` draws them with ``train.seed = seed``."""
    import torch

    from lnblocks.models import GPT
    from lnblocks.study.lm.data.builtin import build_source
    from lnblocks.study.lm.run import diagnostics as diag
    from lnblocks.study.lm.run.setup import PROBE_SEED_OFFSET

    source = build_source(run.data)
    torch.manual_seed(seed)  # as train_run: the init, then the probe stream
    model = GPT(run.model.gpt_config(source.vocab_size, run.data.seq_len))
    probe_gen = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
    probe_x = source.batch(run.diagnostics.probe_batch_size, probe_gen)[0]
    data = [source.batch(run.data.batch_size, probe_gen) for _ in range(batches)]
    grad = diag.expected_grad(model, data)["expected"]
    return grad, diag.probe(model, probe_x, attention=False)["residual_rms"]


def measure(run: RunConfig, seeds: list[int], batches: int, progress: Any = None) -> dict[str, Any]:
    """Expected-gradient norms by group and layer and the init residual RMS of ``run``'s model, for each seed, in
    this process (with ``run``'s thread count)."""
    grad: dict[str, list[list[float]]] = {}
    residual = []
    with _threads(run.train.threads):
        for seed in seeds:
            g, r = measure_seed(run, seed, batches)
            for k, v in g.items():
                grad.setdefault(k, []).append(v)
            residual.append(r)
            if progress is not None:
                progress.update(1)
    return {"grad": grad, "residual_rms": residual}


@dataclass(frozen=True)
class ProfileJob:
    """One seed of one (arm, depth)'s profile, as the ``run`` of a ``core.executors.Job`` (picklable)."""

    run: RunConfig
    seed: int
    batches: int

    @property
    def run_id(self) -> str:  # what executors name a job by (Ray's task name)
        return f"init_profile:{self.run.run_id}:seed{self.seed}"

    @property
    def threads(self) -> int:  # pinned by the executor, as a run's
        return self.run.train.threads


def measure_job(job: ProfileJob, ctx: Any = None) -> Any:
    """``Job.call`` of a ``ProfileJob``: ``measure_seed`` in the worker that got it. A profile that cannot be
    measured (its data gone, a config the model refuses) comes back as ``{"error": line}``, which leaves that arm
    out with a warning; any other exception is a bug and fails the report."""
    try:
        return measure_seed(job.run, job.seed, job.batches)
    except (ValueError, TypeError, OSError) as err:
        return {"error": f"{type(err).__name__}: {err}"}


def _measure_all(
    todo: dict[str, RunConfig], seeds: list[int], batches: int, executor: Any, progress: Any
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``measure`` of every run in ``todo`` (by cache key) over ``seeds``, one job per (run, seed) on ``executor``
    (None: a ``SerialExecutor``); results assembled by key and seed, so the order jobs finish in does not matter.
    Returns the measurements and, for a key whose profile cannot be measured (its data gone ...), why; a job that
    failed otherwise (a bug) raises ``RuntimeError``."""
    from lnblocks.study.core.executors import Job, Outcome, SerialExecutor

    jobs = [Job("lm", ProfileJob(run, seed, batches), call=measure_job) for run in todo.values() for seed in seeds]
    got: dict[tuple[str, int], Any] = {}
    errors: dict[str, str] = {}
    bugs: list[str] = []

    def done(job: Job, outcome: Outcome) -> None:
        if outcome.error is not None:
            bugs.append(f"{job.run_id}: {(outcome.error.strip().splitlines() or ['failed'])[-1]}")
        elif isinstance(outcome.value, dict):
            errors.setdefault(job.run.run.run_id, outcome.value["error"])
        else:
            got[(job.run.run.run_id, job.run.seed)] = outcome.value
        if progress is not None:
            progress.update(1)

    (executor or SerialExecutor()).map(iter(jobs), done)
    if bugs:
        raise RuntimeError(f"{len(bugs)} init-profile job(s) failed; first: {bugs[0]}")
    out, failed = {}, {}
    for key, run in todo.items():
        if run.run_id in errors:
            failed[key] = errors[run.run_id]
            continue
        grad: dict[str, list[list[float]]] = {}
        for seed in seeds:
            for k, v in got[(run.run_id, seed)][0].items():
                grad.setdefault(k, []).append(v)
        out[key] = {"grad": grad, "residual_rms": [got[(run.run_id, seed)][1] for seed in seeds]}
    return out, failed


def _key(run: RunConfig, settings: InitProfileConfig) -> str:
    """What a cached profile depends on: the model, data and diagnostics sections, the threads, the settings."""
    d = run.to_dict()
    return config_hash(
        {"model": d["model"], "data": d["data"], "probe": d["diagnostics"]["probe_batch_size"],
         "threads": d["train"]["threads"], "settings": settings.to_dict()}
    )  # fmt: skip


def targets(records: list[RunRecord], warn: Any = None) -> dict[tuple[str, int], RunConfig]:
    """One run config per (arm, depth) of the records (the first by id whose config still validates: a corpus may
    be gone; LR, warmup and seed do not change the init). An arm none of whose configs validates is left out,
    said through ``warn(line)``."""
    from lnblocks.study.lm.report.analysis import arch_of

    out: dict[tuple[str, int], RunConfig] = {}
    why: dict[tuple[str, int], str] = {}
    for rec in sorted(records, key=lambda r: r.id):
        key = (arch_of(rec), rec.config["model"]["depth"])
        if key not in out:
            try:
                out[key] = RunConfig.from_dict(_readable_config(rec))
            except (TypeError, ValueError, OSError) as err:
                why.setdefault(key, f"{rec.id}: {' '.join(str(err).split())[:200]}")
    for (arch, depth), line in sorted(why.items()):
        if (arch, depth) not in out and warn is not None:
            warn(f"no init profile of {arch} at depth {depth}: its run config does not build ({line})")
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
    from lnblocks.study.lm.report.analysis import arch_of

    acc: dict[tuple[str, int], dict[int, RunRecord]] = {}
    for rec in sorted(records, key=lambda r: r.id):
        expected = (rec.result.init_grad or {}).get("expected") or {}
        finite = all(v is not None for values in expected.values() for v in values)  # a NaN init has no profile
        if expected and finite and len(expected.get("W_2", [])) == rec.config["model"]["depth"]:
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
            if by_seed[s].result.diagnostics
            and by_seed[s].result.diagnostics[0].get("step") == 0
            and None not in by_seed[s].result.diagnostics[0]["residual_rms"]
        ]
        batches = by_seed[seeds[0]].config.get("diagnostics", {}).get("init_grad_batches", 0)
        out.append(
            InitProfile(arch, depth, seeds, grad, residual if len(residual) == len(seeds) else [], batches, "runs")
        )
    return out


def cached_entries(cache: Any, source: str = FILE) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The usable entries of a cache file's content by key, and one line per damaged part (the caller names the
    file; those entries are measured again)."""
    if cache is None:
        return {}, []
    if not isinstance(cache, dict) or cache.get("format") != FORMAT or not isinstance(cache.get("entries"), list):
        return {}, [f"{source}: not an init profile cache of format {FORMAT!r}; every profile is measured again"]
    good, bad = {}, []
    for i, entry in enumerate(cache["entries"]):
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                raise ValueError("an entry must be a mapping with a string 'key'")
            InitProfile.from_dict(entry)
        except ValueError as err:
            bad.append(f"{source}: entries[{i}] is damaged ({err}); it is measured again")
            continue
        good[entry["key"]] = entry
    return good, bad


def compute_profiles(
    runs: dict[tuple[str, int], RunConfig],
    settings: InitProfileConfig,
    cache: dict[str, Any] | None = None,
    show_progress: bool = False,
    warn: Any = None,
    source: str = FILE,
    open_executor: Callable[[int], Any] | None = None,
) -> tuple[list[InitProfile], dict[str, Any]]:
    """The profile of every (arm, depth) in ``runs`` over ``settings.seeds`` seeds; entries of ``cache`` (a
    previous ``init_profile.json``) with the same key are reused, damaged ones measured again. An arm whose profile
    cannot be measured (its data gone, a non-finite gradient at init) is left out, said through ``warn(line)``.
    ``open_executor(n)``: the executor for ``n`` jobs (the study's; None: one after another here). Returns the
    profiles and the new cache."""
    warn = warn or _warn
    seeds = list(range(settings.first_seed, settings.first_seed + settings.seeds))
    old, damaged = cached_entries(cache, source)
    for line in damaged:
        warn(line)
    todo = {_key(r, settings): r for r in runs.values() if _key(r, settings) not in old}
    measured: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    if todo:
        bar: Any = contextlib.nullcontext(None)
        if show_progress:
            from lnblocks._optional import require

            total = len(seeds) * len(todo)
            bar = require("tqdm").tqdm(total=total, desc="init gradient profiles", leave=False, dynamic_ncols=True)
        executor = open_executor(len(seeds) * len(todo)) if open_executor is not None else None
        with bar as progress:
            measured, failed = _measure_all(todo, seeds, settings.batches, executor, progress)
    entries, profiles = [], []
    for (arch, depth), run in sorted(runs.items()):
        key = _key(run, settings)
        if key in old:
            entry = {**old[key], "arch": arch, "depth": depth}
        else:
            try:
                if key in failed:
                    raise ValueError(failed[key])
                m = measured[key]
                entry = {
                    "key": key,
                    **InitProfile(arch, depth, seeds, m["grad"], m["residual_rms"], settings.batches).to_dict(),
                }
                InitProfile.from_dict(entry)  # finite, and of the shape the claims read
            except (ValueError, TypeError) as err:
                warn(f"no init profile of {arch} at depth {depth}: {' '.join(str(err).split())[:200]}")
                continue
        entries.append(entry)
        profiles.append(InitProfile.from_dict(entry))
    return profiles, {"format": FORMAT, "entries": entries}


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def study_profiles(
    out: Path | None,
    records: list[RunRecord],
    settings: InitProfileConfig,
    show_progress: bool = False,
    open_executor: Callable[[int], Any] | None = None,
) -> list[InitProfile]:
    """The init profiles the findings use: measured over ``settings.seeds`` fresh inits (cached in
    ``out/init_profile.json`` when ``out`` is given; a damaged cache is named on stderr and measured again; on
    ``open_executor(n)``'s executor), or the runs' own when ``settings.seeds`` is 0."""
    if settings.seeds == 0:
        return profiles_from_runs(records)
    cache = None
    path = out / FILE if out is not None else None
    if path is not None and path.is_file():
        try:
            cache = read_json(path, "init profile cache")
        except RecordError as err:
            print(f"warning: {err}; every profile is measured again", file=sys.stderr)
    runs = targets(records, _warn)
    profiles, new = compute_profiles(runs, settings, cache, show_progress, _warn, str(path or FILE), open_executor)
    if path is not None and new != cache:
        write_json_atomic(path, new)
    return profiles
