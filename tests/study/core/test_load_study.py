"""Study configs: YAML with ``extends``, validation errors that name the key, grid expansion and stable run ids,
and the shipped configs (placements.yaml smoke-tested with 2 steps per run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnblocks.study import RunConfig, StudyConfig, load_study, train_run
from lnblocks.study.lm.config import ModelConfig, TrainConfig
from tests.study.study_helpers import write_study

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_extends_merges_base_and_child(tmp_path: Path) -> None:
    write_study(tmp_path, "base.yaml", "model: {dim: 32, depth: 3}\ntrain: {steps: 7, optimizer: {beta2: 0.99}}\n")
    child = write_study(tmp_path, "child.yaml", "extends: base.yaml\nmodel: {depth: 5}\ntrain: {lr: 3e-3}\n")
    s = load_study(child)
    assert s.name == "child"
    assert (s.base.model.dim, s.base.model.depth) == (32, 5)
    assert s.base.train.steps == 7 and s.base.train.optimizer.beta2 == 0.99
    assert s.base.train.lr == 3e-3  # YAML 1.1 reads "3e-3" as a string; the study loader reads a float (YAML 1.2)


def test_null_in_child_removes_a_base_axis(tmp_path: Path) -> None:
    write_study(tmp_path, "base.yaml", "grid: {train.seed: [0, 1], train.lr: [1.0e-3]}\n")
    s = load_study(write_study(tmp_path, "c.yaml", "extends: base.yaml\ngrid: {train.seed: null}\n"))
    assert [a.name for a in s.axes] == ["train.lr"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("modle: {depth: 3}\n", r"bad\.yaml: modle is not a top-level key of a study file of task 'lm'"),
        ("model: {depht: 3}\n", r"model\.depht is not a config key; valid keys of ModelConfig"),
        ("train: {optimizer: {beta3: 0.9}}\n", r"train\.optimizer\.beta3"),
        ("grid: {model.depht: [3]}\n", r"model\.depht is not a config key \(in grid\)"),
        ("grid: {modle.depth: [3]}\n", r"modle\.depth is not a config key \(in grid\)"),
        ("grid: {variant: {a: {train.lrr: 1}}}\n", r"train\.lrr is not a config key \(in grid\.variant\.a\)"),
        ("grid: {model.depth: 3}\n", r"grid\.model\.depth must be a non-empty list"),
        ("train: {lr: -1.0}\n", r"train\.lr must be a finite number > 0"),
        ("train: {lr: fast}\n", r"train\.lr must be a number"),
        ("train: {steps: 10, warmup: 20}\n", r"train\.warmup \(20\) must be <= train\.steps"),
        ("train: {schedule: step}\n", r"train\.schedule must be one of"),
        ("model: {placement: middle}\n", r"model\.placement must be one of .*'mix_ln'"),
        ("model: {norm: batchnorm}\n", r"unknown norm kind 'batchnorm'"),
        ("model: {dim: 30, n_heads: 4}\n", r"dim \(30\) must be divisible by n_heads"),
        ("model: {placement: deepnorm}\n", r"set init='deepnet'"),
        ("data: {source: shakespeare, vocab_size: 64}\n", r"data\.vocab_size is fixed at 256"),
        ("data: {source: wikipedia}\n", r"data\.source must be one of"),
        ("grid: {model.depth: [0, 3]}\n", r"grid point \(model\.depth=0\): model\.depth must be >= 1"),
        ("grid: {train.lr: [1.0e-3, 0.001]}\n", r"resolve to the same run"),
        ("analysis: {stuck_margni: 0.3}\n", r"analysis\.stuck_margni"),
        ("extends: [nope.yaml]\n", r"nope\.yaml' not found"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises((ValueError, TypeError, FileNotFoundError), match=match):
        load_study(write_study(tmp_path, "bad.yaml", text))


def test_extends_cycle_is_an_error(tmp_path: Path) -> None:
    write_study(tmp_path, "a.yaml", "extends: b.yaml\n")
    write_study(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ValueError, match="extends cycle"):
        load_study(tmp_path / "a.yaml")


def test_grid_is_the_product_in_file_order_with_labels(tmp_path: Path) -> None:
    text = (
        "grid:\n  model.placement: [pre, post]\n  train.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n  variant:\n"
        "    wu0: {train.warmup: 0}\n    wu60: {train.warmup: 60, train.schedule: cosine}\n"
    )
    runs = load_study(write_study(tmp_path, "g.yaml", text)).runs()
    assert len(runs) == 12
    assert runs[0].label_dict == {"model.placement": "pre", "train.lr": "0.001", "variant": "wu0"}
    assert (runs[-1].model.placement, runs[-1].train.lr, runs[-1].train.warmup) == ("post", 1e-2, 60)
    assert runs[-1].train.schedule == "cosine"
    assert len({r.run_id for r in runs}) == 12
    assert runs[1].run_id.startswith("placement=pre_lr=0.001_variant=wu60-")


def test_run_id_is_a_stable_content_hash() -> None:
    a = RunConfig.from_dict({"model": {"depth": 3, "norm": "layernorm"}})
    b = RunConfig.from_dict({"model": {"depth": 3, "norm": {"kind": "layernorm"}}, "train": {"lr": 1e-3}})
    c = RunConfig.from_dict({"model": {"depth": 4}})
    assert a.hash == b.hash != c.hash  # same resolved config, same id; defaults written out or not
    assert a.hash == RunConfig.from_dict(a.to_dict()).hash  # round trip through the record's config
    assert len(a.hash) == 10 and int(a.hash, 16) >= 0


def test_sections_replace_and_reject_unknown() -> None:
    assert TrainConfig().replace(lr=3e-3).lr == 3e-3
    with pytest.raises(ValueError, match=r"model\.widht is not a config key"):
        ModelConfig.from_dict({"widht": 3}, key="model")


def test_override_shrinks_a_grid(tmp_path: Path) -> None:
    s = load_study(write_study(tmp_path, "o.yaml", "grid: {model.depth: [3, 6, 12], train.lr: [1.0e-3, 3.0e-3]}\n"))
    small = s.override({"model.depth": [2], "train.steps": 3})
    assert len(small.runs()) == 2 and all(r.train.steps == 3 and r.model.depth == 2 for r in small.runs())
    with pytest.raises(ValueError, match=r"train\.stpes is not a config key"):
        s.override({"train.stpes": 3})


def test_shipped_quick_config_is_the_documented_grid() -> None:
    s = load_study(CONFIGS / "xiong2020_quick.yaml")
    runs = s.runs()
    assert {r.model.placement for r in runs} == {"pre", "post"}
    assert {r.data.source for r in runs} == {"shakespeare"}
    assert min(r.model.depth for r in runs) <= 3 and max(r.model.depth for r in runs) >= 12
    assert {r.train.warmup for r in runs} >= {0} and max(r.train.warmup for r in runs) > 0
    assert len({r.train.seed for r in runs}) >= 2  # "reproducibly across seeds"


@pytest.mark.slow
def test_placements_config_runs_every_variant_for_two_steps() -> None:
    s = load_study(CONFIGS / "placements.yaml")
    variants = {lab for lab, _ in next(a for a in s.axes if a.name == "variant").values}
    assert variants == {
        "pre", "post", "sandwich", "deepnorm", "reordered", "resi_dual", "mix_ln", "dyt", "none", "rezero", "lns",
    }  # fmt: skip
    assert {(r.label_dict["variant"], r.model.depth) for r in s.runs() if r.model.depth == 24} == {
        ("pre", 24),
        ("post", 24),
        ("deepnorm", 24),
    }
    small = s.override(
        {
            "model.depth": [4],
            "train.lr": [1.0e-3],
            "train.warmup": [0],
            "train.steps": 2,
            "data.seq_len": 16,
            "data.batch_size": 4,
            "data.eval_batches": 1,
            "diagnostics.every": 1,
            "diagnostics.init_grad_batches": 1,
        }
    )
    assert isinstance(small, StudyConfig) and len(small.runs()) == 11  # depth 24 of the extra grid -> 4 as well
    for run in small.runs():
        rec = train_run(run, show_progress=False)
        assert rec.status == "finished" and rec.result.steps_done == 2, run.run_id
        assert len(rec.result.init_grad["expected"]["W_2"]) == 4
        d = rec.result.diagnostics[0]
        assert len(d["residual_rms"]) == 5 and len(d["attn_max_logit"]) == 4
        if run.label_dict["variant"] in ("none", "rezero"):
            assert "norm" not in d["grad_norm"]  # nothing to report for a norm-free stack
        else:
            assert len(d["grad_norm"]["norm"]) == 4
