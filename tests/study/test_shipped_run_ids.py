"""Every run id of every shipped study file stays what it was: a finished run's record is found by its id, so a
changed id silently retrains a whole study (and orphans the committed results). The ids are committed in
``tests/study/fixtures/shipped_run_ids.json``; a new shipped config is added there on purpose (a config missing from
it fails), an id that changes fails naming the config and how many of its ids moved."""

from __future__ import annotations

import json
from pathlib import Path

from lnblocks.study import load_study

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = Path(__file__).parent / "fixtures" / "shipped_run_ids.json"
# Runs on the user's own token files: their ids hold the files' absolute paths (and, once bound, their digest), so
# no committed list can hold them; a change to how such a config is hashed shows in every other config's ids too.
USER_FILES = {"gpt2_small_prepost.yaml", "frontier_gpu.yaml"}


def shipped_run_ids() -> dict[str, list[str]]:
    """Config file name -> its sorted run ids (every shipped config but those on the user's own files)."""
    return {
        path.name: sorted(r.run_id for r in load_study(path).runs())
        for path in sorted((ROOT / "configs").glob("*.yaml"))
        if path.name not in USER_FILES
    }


def test_every_shipped_run_id_is_unchanged() -> None:
    committed = json.loads(COMMITTED.read_text())
    now = shipped_run_ids()
    assert sorted(now) == sorted(committed), "a shipped config is new or gone: add its ids to " + COMMITTED.name
    moved = {name: len(set(committed[name]) - set(ids)) for name, ids in now.items() if ids != committed[name]}
    assert not moved, f"run ids changed (config: ids no longer produced): {moved}"
