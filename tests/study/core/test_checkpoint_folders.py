"""Where a study's checkpoints live (``lnblocks.study.core.checkpoint_folders``): ``train.checkpoint.dir`` is the
user's folder, never removed (finishing the last run used to remove it when empty); each study keeps its runs'
checkpoints in its own subfolder of it, so two studies sharing ``dir`` (with the same run, so the same run id)
never take or remove each other's (they used to share ``<dir>/<run id>/``), while checkpoints written there before
the subfolders resume where they are; and the checkpoints of runs that are no runs of the study any more (a config
changed between a kill and its resume) are named by the runner and ``study report`` and listed and removed by
``lnblocks study clean``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import load_study, read_record, run_study
from lnblocks.study.core.outdir import claim_out_dir
from tests.study.study_helpers import EVERY, STEPS, study_cli


def named(long_study: Path, tmp_path: Path, name: str) -> Path:
    """``long_study`` under another name, Pre-LN only (one run)."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        long_study.read_text().replace("name: long_runs", f"name: {name}") + "grid: {model.placement: [pre]}\n"
    )
    return cfg


def kill_after_first_checkpoint(cfg: Path, out: Path, *args: str) -> None:
    killed = study_cli(cfg, out, *args, fault="kill-after-save@1")
    assert killed.returncode < 0, killed.stderr[-2000:]


def finished(cfg: Path, out: Path) -> list:
    return [read_record(out / "runs" / f"{r.run_id}.json") for r in load_study(cfg).runs()]


def test_studies_sharing_a_checkpoint_dir_keep_to_their_own_subfolders(long_study: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()  # the user's folder, empty
    a, b = named(long_study, tmp_path, "a"), named(long_study, tmp_path, "b")
    sets = ("--set", f"train.checkpoint.dir={mine}")
    kill_after_first_checkpoint(a, tmp_path / "out_a", *sets)
    (sub_a,) = mine.iterdir()
    assert sub_a.name.startswith("a-") and [p.name for p in (sub_a / load_study(a).runs()[0].run_id).iterdir()] == [
        f"step-{EVERY:09d}"
    ]
    # b trains the same run (the same id) to the end and removes its own checkpoints only
    overrides = {"train.checkpoint.dir": str(mine)}
    assert run_study(b, tmp_path / "out_b", show_progress=False, report=False, overrides=overrides) == 0
    (rec_b,) = finished(b, tmp_path / "out_b")
    assert rec_b.env.get("resumed_from") is None  # not from a's checkpoint
    assert list(mine.iterdir()) == [sub_a]  # b's subfolder went with its last run; a's is untouched
    assert run_study(a, tmp_path / "out_a", show_progress=False, report=False, overrides=overrides) == 0
    (rec_a,) = finished(a, tmp_path / "out_a")
    assert rec_a.env["resumed_from"] == [EVERY] and rec_a.result.steps_done == STEPS
    assert mine.is_dir() and not list(mine.iterdir())  # the user's folder stays, empty as it was


def test_checkpoints_written_before_the_subfolders_resume_where_they_are(long_study: Path, tmp_path: Path) -> None:
    mine, cfg, out = tmp_path / "mine", named(long_study, tmp_path, "a"), tmp_path / "out"
    kill_after_first_checkpoint(cfg, out, "--set", f"train.checkpoint.dir={mine}")
    run_id = load_study(cfg).runs()[0].run_id
    (sub,) = mine.iterdir()
    shutil.move(sub / run_id, mine / run_id)  # the layout of an earlier lnblocks: <dir>/<run id>/
    sub.rmdir()
    assert run_study(cfg, out, show_progress=False, report=False, overrides={"train.checkpoint.dir": str(mine)}) == 0
    (rec,) = finished(cfg, out)
    assert rec.env["resumed_from"] == [EVERY]
    assert mine.is_dir() and not list(mine.iterdir())


def test_orphaned_checkpoints_are_named_listed_and_removed(
    long_study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed, then resumed with another learning rate: a new run, and the old one's checkpoints are left."""
    cfg, out = named(long_study, tmp_path, "a"), tmp_path / "out"
    kill_after_first_checkpoint(cfg, out)
    (old,) = (out / "checkpoints").iterdir()
    assert (
        run_study(cfg, out, show_progress=False, overrides={"train.lr": 1e-3, "analysis.init_profile.batches": 1}) == 0
    )
    err = capsys.readouterr().err
    note = f"note: 1 checkpoint folder(s) in {out / 'checkpoints'} ("
    assert note in err and "belong to no run of this study" in err and f"`lnblocks study clean {out}`" in err
    assert cli_main(["study", "report", str(out)]) == 0 and note in capsys.readouterr().err
    assert cli_main(["study", "clean", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"orphan: {old} (") and lines[0].endswith(f"; checkpoints of steps [{EVERY}])")
    assert lines[1].startswith("1 orphaned checkpoint folder(s), ") and old.is_dir()
    with claim_out_dir(load_study(cfg, overrides={"train.lr": 1e-3}), out):  # a runner uses the folder
        assert cli_main(["study", "clean", str(out), "--remove"]) == 2
        assert f"a runner is using {out}" in capsys.readouterr().err and old.is_dir()
    assert cli_main(["study", "clean", str(out), "--remove"]) == 0
    assert capsys.readouterr().out.startswith(f"removed: {old} (") and not (out / "checkpoints").exists()
    assert cli_main(["study", "clean", str(out)]) == 0
    assert "no orphaned checkpoints" in capsys.readouterr().out
