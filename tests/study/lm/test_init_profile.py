"""The init gradient profile over fresh seeds: seed s is exactly the ``init_grad`` a run with seed s records, the
cache is reused and invalidated by what it depends on, and ``seeds: 0`` falls back to the runs' own."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnblocks.study import RunConfig, train_run
from lnblocks.study.lm.config import InitProfileConfig
from lnblocks.study.lm.report import init_profile as ip

BASE = {
    "data": {"source": "markov", "vocab_size": 16, "seq_len": 16, "batch_size": 8, "eval_batches": 1},
    "model": {"depth": 3, "dim": 32, "n_heads": 4},
    "train": {"steps": 2},
    "diagnostics": {"every": 1, "init_grad_batches": 3, "probe_batch_size": 4},
}


def run_config(**model: object) -> RunConfig:
    return RunConfig.from_dict({**BASE, "model": {**BASE["model"], **model}})


@pytest.mark.parametrize("placement", ["pre", "post", "mix_ln"])
def test_seed_s_is_the_init_grad_of_a_run_with_seed_s(placement: str) -> None:
    run = run_config(placement=placement)
    got = ip.measure(run, [0, 5], batches=3)
    for i, seed in enumerate((0, 5)):
        rec = train_run(RunConfig.from_dict({**run.to_dict(), "train": {**run.to_dict()["train"], "seed": seed}}),
                        show_progress=False)  # fmt: skip
        expected = rec.result.init_grad["expected"]
        assert {k: v[i] for k, v in got["grad"].items()} == expected
        assert got["residual_rms"][i] == rec.result.diagnostics[0]["residual_rms"]  # step-0 probe, before any update


def _records(tmp_path: Path) -> list:
    return [train_run(run_config(placement=p, depth=d), show_progress=False) for p in ("pre", "post") for d in (1, 2)]


def test_study_profiles_cache_and_invalidation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = _records(tmp_path)
    settings = InitProfileConfig(seeds=3, batches=2, first_seed=10)
    first = ip.study_profiles(tmp_path, records, settings)
    assert sorted((p.arch, p.depth) for p in first) == [("post", 1), ("post", 2), ("pre", 1), ("pre", 2)]
    assert all(p.seeds == [10, 11, 12] and len(p.w2) == 3 and len(p.w2[0]) == p.depth for p in first)
    assert (tmp_path / ip.FILE).is_file()

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(ip, "measure_seed", boom)
    assert ip.study_profiles(tmp_path, records, settings) == first
    with pytest.raises(RuntimeError, match=r"init-profile job.*the cache should have been used"):
        ip.study_profiles(tmp_path, records, InitProfileConfig(seeds=3, batches=2, first_seed=11))  # new seeds
    monkeypatch.undo()
    (tmp_path / ip.FILE).write_text("{trunc")  # a broken cache is recomputed, not an error
    assert ip.study_profiles(tmp_path, records, settings) == first


def test_zero_seeds_uses_the_runs_own_init_grad(tmp_path: Path) -> None:
    records = _records(tmp_path)
    prof = {(p.arch, p.depth): p for p in ip.study_profiles(None, records, InitProfileConfig(seeds=0))}
    rec = next(r for r in records if r.config["model"]["placement"] == "post" and r.config["model"]["depth"] == 2)
    assert prof[("post", 2)].w2 == [rec.result.init_grad["expected"]["W_2"]] and prof[("post", 2)].source == "runs"
    assert prof[("post", 2)].batches == 3


BAD = [
    ({"seeds": -1}, "seeds"),
    ({"batches": 0}, "batches"),
    ({"first_seed": -3}, "first_seed"),
    ({"sedes": 3}, "sedes"),
]


@pytest.mark.parametrize(("options", "match"), BAD)
def test_bad_settings_name_the_key(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        InitProfileConfig.from_dict(options, key="analysis.init_profile")


def test_profiles_are_the_same_bits_on_one_or_two_workers() -> None:
    """Every (arm, depth, seed) is a job for the study's executor; assembled by seed, the profiles and the cache
    entries are the same whichever process measured what, and equal the in-process loop (``measure``)."""
    from lnblocks.study.core.executors import LocalProcessExecutor

    runs = {("pre", 1): run_config(placement="pre", depth=1), ("post", 2): run_config(placement="post", depth=2)}
    settings = InitProfileConfig(seeds=3, batches=2, first_seed=7)
    asked: list[int] = []

    def pool(n: int) -> LocalProcessExecutor:
        asked.append(n)
        return LocalProcessExecutor(2)

    one, cache_one = ip.compute_profiles(runs, settings)
    two, cache_two = ip.compute_profiles(runs, settings, open_executor=pool)
    assert asked == [6]  # 2 (arm, depth) x 3 seeds
    assert two == one and cache_two == cache_one
    assert ip.compute_profiles(runs, settings, cache_two, open_executor=pool)[0] == one and asked == [6]  # cached
    import torch

    torch.set_flush_denormal(True)  # what the executors train with
    try:
        direct = ip.measure(runs[("post", 2)], [7, 8, 9], batches=2)
    finally:
        torch.set_flush_denormal(False)
    post = next(p for p in one if p.arch == "post")
    assert post.grad == direct["grad"] and post.residual_rms == direct["residual_rms"]
