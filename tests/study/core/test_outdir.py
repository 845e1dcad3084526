"""One study per output folder: a second study (or another version of a running one) is refused with one line,
a damaged manifest is named and rewritten, the report reads only the runs its manifest lists (and only inside
``runs/``), and the clean-up of temp files never removes a file lnblocks did not write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import build_report, load_study, run_study
from lnblocks.study.core.outdir import claim_out_dir
from lnblocks.study.core.records import RecordError
from tests.study.study_helpers import write_study

STUDY = """
name: {name}
data: {{source: markov, vocab_size: 16, seq_len: 16, batch_size: 8, eval_batches: 1}}
model: {{dim: 16, n_heads: 2, depth: 1}}
train: {{steps: 2}}
diagnostics: {{every: 0, init_grad_batches: 0, attention: false}}
analysis: {{init_profile: {{seeds: 0}}}}
grid: {{model.placement: [pre, post]}}
"""


def outdir_study(tmp_path: Path, name: str) -> Path:
    return write_study(tmp_path, f"{name}.yaml", STUDY.format(name=name))


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lnblocks: error: "), err
    return err


def test_a_second_study_on_one_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, out = outdir_study(tmp_path, "a"), outdir_study(tmp_path, "b"), tmp_path / "out"
    assert cli_main(["study", "run", str(a), "--out", str(out)]) == 0
    manifest, report = (out / "study.json").read_bytes(), (out / "report.md").read_bytes()
    capsys.readouterr()
    assert cli_main(["study", "run", str(b), "--out", str(out)]) == 2
    assert f"{out} holds the study 'a' ({a}), not 'b' ({b}): give another --out" in one_error_line(capsys)
    assert (out / "study.json").read_bytes() == manifest and (out / "report.md").read_bytes() == report
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(
        f"{r.run_id}.json" for r in load_study(a).runs()
    )  # nothing of b was trained
    # a new version of the same study, once no runner uses the folder, replaces the manifest
    assert run_study(a, out, show_progress=False, report=False, overrides={"train.steps": 3}) == 0
    assert json.loads((out / "study.json").read_text())["options"]["train"]["steps"] == 3


def test_another_version_of_a_running_study_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, out = outdir_study(tmp_path, "a"), tmp_path / "out"
    study = load_study(a)
    with claim_out_dir(study, out):  # a runner of `a` is using the folder (its lease is held until it ends)
        with pytest.raises(ValueError, match="another runner is training a different version of the study 'a'"):
            run_study(a, out, show_progress=False, overrides={"train.steps": 3})
        with pytest.raises(ValueError, match="holds the study 'a'"):
            run_study(outdir_study(tmp_path, "b"), out, show_progress=False)
        assert run_study(a, out, show_progress=False, report=False) == 0  # the same study joins the running one
    assert json.loads((out / "study.json").read_text())["options"]["train"]["steps"] == 2
    assert run_study(a, out, show_progress=False, report=False, overrides={"train.steps": 3}) == 0  # it has ended


@pytest.mark.parametrize("damage", ["{", "", "[1, 2]", '"x"'])
def test_a_damaged_manifest_is_named_and_rewritten(tmp_path: Path, damage: str, capsys) -> None:
    a, out = outdir_study(tmp_path, "a"), tmp_path / "out"
    out.mkdir()
    (out / "study.json").write_text(damage)
    assert run_study(a, out, show_progress=False, report=False) == 0
    assert f"warning: {out / 'study.json'}:" in capsys.readouterr().err
    assert json.loads((out / "study.json").read_text())["name"] == "a"


def test_the_report_reads_what_the_manifest_lists_inside_runs(tmp_path: Path, capsys) -> None:
    a, b, out = outdir_study(tmp_path, "a"), outdir_study(tmp_path, "b"), tmp_path / "out"
    assert run_study(a, out, show_progress=False, report=False) == 0
    assert run_study(b, tmp_path / "other", show_progress=False, report=False) == 0
    for p in (tmp_path / "other" / "runs").glob("*.json"):  # records of another study in the same runs/
        p.rename(out / "runs" / p.name)
    manifest = json.loads((out / "study.json").read_text())
    (out / "study.json").unlink()
    capsys.readouterr()
    assert cli_main(["study", "report", str(out)]) == 2
    assert "has no study.json, so which of runs/*.json belong to one study is unknown" in one_error_line(capsys)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    for ids, match in (
        ([f"../../{secret.stem}"], "run_ids must be file names inside runs/"),
        ([str(secret.with_suffix(""))], "run_ids must be file names inside runs/"),
        ([".hidden"], "run_ids must be file names inside runs/"),
        (["a\nb"], "run_ids must be file names inside runs/"),
        ([1], "run_ids must be a list of run ids"),
        ("x", "run_ids must be a list of run ids"),
    ):
        (out / "study.json").write_text(json.dumps({**manifest, "run_ids": ids}))
        with pytest.raises(RecordError, match=match):
            build_report(out, plots=False, echo=False)
    (out / "study.json").write_text(json.dumps(manifest))
    assert build_report(out, plots=False, echo=False) == 0
    assert len((out / "summary.csv").read_text().splitlines()) == 3  # a's two runs, not b's


def test_temp_files_lnblocks_did_not_write_survive_a_run(tmp_path: Path) -> None:
    a, out = outdir_study(tmp_path, "a"), tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    keep = [out / ".notes.tmp-old", out / ".notes.tmp-1", out / "runs" / ".draft.json.tmp-12", out / "x.tmp-2"]
    for p in keep:
        p.write_text("keep")
    assert run_study(a, out, show_progress=False) == 0
    assert all(p.read_text() == "keep" for p in keep)
    hidden = sorted(p.name for p in (*out.iterdir(), *(out / "runs").iterdir()) if p.name.startswith("."))
    assert hidden == sorted([".notes.tmp-old", ".notes.tmp-1", ".draft.json.tmp-12", ".runners.lock", ".study.lock"])
