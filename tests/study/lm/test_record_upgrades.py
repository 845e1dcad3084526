"""Records survive upgrades. The fixture ``records_082d483`` was written by
lnblocks at commit 082d483 (``git worktree add /tmp/old 082d483``, then ``lnblocks study run config.yaml``), before
checkpoints, stability monitoring, corpus digests and the corpus keys ``exclude`` / ``skip_undecodable`` /
``allow_unused_vocab`` existed: today's lnblocks reuses its records (the new keys take the value that does what
runs did before them, so the ids are unchanged) and they are what today's code computes, bit for bit. A key whose
behaviour changed under the same value (``KEY_VERSIONS``) moves the ids of the affected runs only, so their older
records are retrained, not silently reused; so are the schema-1 records, which today's code does not reproduce."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lnblocks.study import load_study, read_record, run_study
from lnblocks.study.core.executors import Job, train_job
from lnblocks.study.core.run_config import drop_added
from lnblocks.study.lm import config as lm_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_records_of_an_older_lnblocks_are_reused_and_equal_todays_runs(
    old: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in (old / "runs").glob("*.json")}
    assert run_study(old / "config.yaml", old, show_progress=False, report=False) == 0
    assert "2 runs, 2 already finished, 0 to run" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (old / "runs").glob("*.json")} == before  # reused as written
    for run in load_study(old / "config.yaml").runs():
        kept = read_record(old / "runs" / f"{run.run_id}.json")
        assert "exclude" not in kept.config["data"] and kept.result.stability is None  # keys it predates
        today = train_job(Job("lm", run)).deterministic_json()  # pinned threads, as every executor trains
        was = kept.deterministic_json()
        assert today["config"] == was["config"] and today["id"] == was["id"] and today["env"] == was["env"]
        new = ("grad_norm", "stability", "corpus", "train_eval")  # fields added since; the rest as it was, bit for bit
        assert {k: v for k, v in today["result"].items() if k not in (*new, "diagnostics")} == {
            k: v for k, v in was["result"].items() if k not in (*new, "diagnostics")
        }
        assert [{k: e[k] for k in w} for e, w in zip(today["result"]["diagnostics"], was["result"]["diagnostics"])] == (
            was["result"]["diagnostics"]
        )


def test_a_key_whose_behaviour_changed_retrains_its_runs_only(
    old: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(lm_config.KEY_VERSIONS, "model.placement", (2, ("post",), "Post-LN changed (a test)"))
    runs = {r.model.placement: r for r in load_study(old / "config.yaml").runs()}
    assert runs["pre"].identity() == runs["pre"].to_dict()
    assert runs["post"].identity()["versions"] == {"model.placement": 2}
    assert (old / "runs" / f"{runs['pre'].run_id}.json").exists()
    assert not (old / "runs" / f"{runs['post'].run_id}.json").exists()  # its id moved: the old record is not it
    assert run_study(old / "config.yaml", old, show_progress=False, report=False) == 0
    out, err = capsys.readouterr()
    assert "2 runs, 1 already finished, 1 to run" in out
    assert "1 record(s) in" in err and "not runs of this study" in err  # said, not silent


def test_schema_1_records_are_not_taken_for_todays_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written before ``train.threads`` and other keys existed, those runs do not match today's (the ids differ),
    and today's code would not reproduce them (unpinned threads): they are retrained, and reported as not runs of
    the study."""
    out = tmp_path / "v1"
    shutil.copytree(FIXTURES / "records_v1", out)
    (out / "study.json").unlink()  # a manifest of that time names no task: today's runner refuses the folder with it
    assert run_study(out / "config.yaml", out, show_progress=False, report=False) == 0
    printed, err = capsys.readouterr()
    assert "4 runs, 0 already finished, 4 to run" in printed and "4 record(s) in" in err


def test_drop_added_leaves_out_new_keys_at_their_earlier_value_only() -> None:
    resolved = {"data": {"exclude": [], "skip_undecodable": True, "corpus": None, "seq_len": 8}, "train": {"lr": 1}}
    added = {"data.exclude": (), "data.skip_undecodable": False, "data.corpus": None, "train.z": 0}
    assert drop_added(resolved, added) == {"data": {"skip_undecodable": True, "seq_len": 8}, "train": {"lr": 1}}
    assert drop_added({"data": {"exclude": ["*.bin"]}}, added) == {"data": {"exclude": ["*.bin"]}}
    assert drop_added({"data": {"skip_undecodable": 0}}, added) == {"data": {"skip_undecodable": 0}}  # not False
