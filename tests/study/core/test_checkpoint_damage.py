"""Damaged checkpoints and what resuming needs: retention keeps the newest ``keep`` sound checkpoints (a damaged
newer one used to count, so the next save deleted the fresh checkpoint and the one resumed from); a manifest that
leaves out a file the loader reads is damaged (it used to pass, and every rerun failed in ``load``), for both
writers; and a resume under another layout at the same world size says it is not bit for bit (the manifest
records the layout). Checked on the ``Checkpoints`` API with a small model, against the files left on disk and a
resume that restores the saved weights exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lnblocks.study.core.checkpoint import CheckpointConfig, Checkpoints, file_sha256
from lnblocks.study.core.checkpoint_manifest import resume_note
from lnblocks.study.core.dist import DistContext

IDENTITY = "d" * 64


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and AdamW after one step (so the optimizer has state), different per ``seed``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).square().sum().backward()
    opt.step()
    return model, opt


def checkpoints(folder: Path, keep: int, layout: dict | None = None) -> Checkpoints:
    return Checkpoints(folder, CheckpointConfig(every=1, keep=keep), IDENTITY, DistContext(), layout)


def steps_on_disk(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.iterdir() if p.name.startswith("step-"))


def restores(folder: Path, step: int, seed: int) -> bool:
    """Whether the checkpoint of ``step`` loads into a fresh model the weights of ``trained(seed)``."""
    model, opt = trained(99)
    checkpoints(folder, 1).load(step, model, opt)
    want, _ = trained(seed)
    return all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values()))


@pytest.mark.parametrize(("keep", "left"), [(1, [6]), (2, [3, 6])])
def test_retention_keeps_the_newest_sound_checkpoints(tmp_path: Path, keep: int, left: list[int], capsys) -> None:
    """Steps 3 and 9 written (9 by an attempt with another ``every``), then 9 truncated; the resume from 3 saves 6:
    with ``keep: 1`` the damaged 9 and the old 3 go and 6 stays, with ``keep: 2`` 3 and 6 stay."""
    folder = tmp_path / "run"
    first = checkpoints(folder, keep=2)
    for step in (3, 9):
        first.save(step, *trained(step), {"step": step})
    model_file = folder / "step-000000009" / "model.pt"
    model_file.write_bytes(model_file.read_bytes()[:100])
    again = checkpoints(folder, keep)
    assert again.latest() == 3 and "step-000000009 is damaged" in capsys.readouterr().err
    model, opt = trained(0)
    assert again.load(3, model, opt) == {"step": 3}
    again.save(6, *trained(6), {"step": 6})
    assert steps_on_disk(folder) == left
    assert checkpoints(folder, keep).latest() == 6 and restores(folder, 6, seed=6)


def _reseal(path: Path, leave_out: str, writer: str | None = None) -> None:
    """Rewrite the manifest of the checkpoint at ``path`` from the files there, leaving ``leave_out`` unlisted."""
    manifest = json.loads((path / "manifest.json").read_text())
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest["files"] = {
        str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
        for f in files
        if str(f.relative_to(path)) != leave_out
    }
    manifest["writer"] = writer or manifest["writer"]
    (path / "manifest.json").write_text(json.dumps(manifest))


def _as_dcp(path: Path, seed: int) -> None:
    """Turn a one-process checkpoint into one written through torch.distributed.checkpoint (as under torchrun)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = trained(seed)
    msd, osd = get_state_dict(model, opt)
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path / "model"))
    (path / "model.pt").unlink()
    _reseal(path, leave_out="", writer="dcp")


@pytest.mark.parametrize(
    ("writer", "leave_out", "delete"),
    [
        ("torch.save", "model.pt", False),
        ("torch.save", "state-0.pt", True),
        ("dcp", "model/.metadata", False),
        ("dcp", "model/__0_0.distcp", True),
    ],
)
def test_a_manifest_that_leaves_out_a_file_loading_reads_is_damaged(
    tmp_path: Path, writer: str, leave_out: str, delete: bool, capsys
) -> None:
    folder = tmp_path / "run"
    ck = checkpoints(folder, keep=2)
    for step in (3, 6):
        ck.save(step, *trained(step), {"step": step})
    newest = folder / "step-000000006"
    if writer == "dcp":
        _as_dcp(newest, seed=6)
        assert checkpoints(folder, 2).latest() == 6 and restores(folder, 6, seed=6)  # sound as a whole
    _reseal(newest, leave_out)
    if delete:
        (newest / leave_out).unlink()
    again = checkpoints(folder, 2)
    assert again.latest() == 3, capsys.readouterr().err
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest} is damaged (its manifest does not list {leave_out}, which loading it " in err
    assert restores(folder, 3, seed=3)


def test_a_resume_under_another_layout_at_the_same_world_size_is_said(tmp_path: Path) -> None:
    fsdp, tp = {"dp_shard": 2, "tp": 1}, {"dp_shard": 1, "tp": 2}
    folder = tmp_path / "run"
    checkpoints(folder, 1, layout=fsdp).save(2, *trained(2), {})
    manifest = json.loads((folder / "step-000000002" / "manifest.json").read_text())
    assert manifest["layout"] == fsdp and manifest["world_size"] == 1
    path = Path("ck")
    note = resume_note(path, {**manifest, "world_size": 2}, 2, tp)
    assert note == (
        "note: checkpoint ck was written by 2 process(es) ({dp_shard: 2, tp: 1}), this run has 2 process(es) "
        "({dp_shard: 1, tp: 2}): resharded; it continues up to float reduction order, not bit for bit"
    )
    assert resume_note(path, {**manifest, "world_size": 2}, 2, fsdp) is None  # the same layout: bit for bit
    assert "written by 1 process(es) (unsharded)" in resume_note(path, {**manifest, "layout": None}, 2, tp)
    legacy = {k: v for k, v in manifest.items() if k != "layout"}  # written before layouts were recorded
    assert resume_note(path, legacy, 1, tp) is None and "written by 1 process(es), this run has 2" in resume_note(
        path, legacy, 2, tp
    )
