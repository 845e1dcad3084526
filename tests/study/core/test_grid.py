"""``extra_grids``: points beyond the product grid (depth 24 for a few arms only), with the main grid's labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnblocks.study import load_study
from tests.study.study_helpers import write_study

STUDY = """
data: {source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}
model: {dim: 32, n_heads: 4}
grid:
  variant:
    pre: {model.placement: pre}
    post: {model.placement: post}
    sandwich: {model.placement: sandwich}
  model.depth: [2, 3]
  train.lr: [1.0e-3, 3.0e-3]
"""


def extra_grid_runs(tmp_path: Path, extra: str) -> list:
    return load_study(write_study(tmp_path, "s.yaml", STUDY + extra)).runs()


def test_extra_grid_adds_points_with_the_main_grids_labels(tmp_path: Path) -> None:
    main = extra_grid_runs(tmp_path, "")
    runs = extra_grid_runs(tmp_path, "extra_grids:\n  - {variant: [pre, post], model.depth: [6]}\n")
    assert runs[: len(main)] == main and len(main) == 12
    extra = runs[len(main) :]
    assert [(r.label_dict["variant"], r.model.depth, r.train.lr) for r in extra] == [
        ("pre", 6, 1e-3), ("pre", 6, 3e-3), ("post", 6, 1e-3), ("post", 6, 3e-3)
    ]  # fmt: skip
    assert [list(r.label_dict) for r in extra] == [["variant", "model.depth", "train.lr"]] * 4
    assert extra[0].run_id.startswith("variant=pre_depth=6_lr=0.001-")


def test_extra_grid_points_already_in_the_grid_are_not_repeated(tmp_path: Path) -> None:
    runs = extra_grid_runs(
        tmp_path, "extra_grids:\n  - {variant: {pre: {model.placement: pre}, post5: {model.placement: post}}}\n"
    )
    assert len(runs) == 12  # every point resolves to a run the main grid has (same config; labels are not hashed)
    runs = extra_grid_runs(tmp_path, "extra_grids:\n  - {model.depth: [2, 4]}\n")
    assert len(runs) == 12 + 6


def test_extra_grid_with_new_bundles(tmp_path: Path) -> None:
    runs = extra_grid_runs(tmp_path, "extra_grids:\n  - {variant: {qk: {model.qk_norm: rmsnorm}}, model.depth: [2]}\n")
    new = runs[12:]
    assert len(new) == 2 and all(r.model.qk_norm["kind"] == "rmsnorm" and r.model.depth == 2 for r in new)


def test_override_applies_to_the_extra_grids(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(STUDY + "extra_grids:\n  - {variant: [pre], model.depth: [6]}\n")
    small = load_study(p).override({"model.depth": [1], "train.lr": [1.0e-3]})
    assert sorted((r.label_dict["variant"], r.model.depth) for r in small.runs()) == [
        ("post", 1), ("pre", 1), ("sandwich", 1)
    ]  # fmt: skip
    assert "extra_grids" in load_study(p).to_dict()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("extra_grids: {model.depth: [6]}\n", "extra_grids must be a list"),
        ("extra_grids:\n  - {model.width: [6]}\n", r"extra_grids\[0\]\.model\.width is not an axis of the main grid"),
        ("extra_grids:\n  - {variant: [pre, deepnorm]}\n", r"extra_grids\[0\]\.variant must list labels"),
        ("extra_grids:\n  - {}\n", r"extra_grids\[0\] must be a non-empty mapping"),
        ("extra_grids:\n  - {model.depth: [0]}\n", "depth"),
    ],
)
def test_bad_extra_grids_name_the_key(tmp_path: Path, extra: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        extra_grid_runs(tmp_path, extra)
