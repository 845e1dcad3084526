"""Study tests train tiny models: one torch thread is fastest for them and keeps timings stable on shared cores."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def long_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study of the long-run tests (``tests.study.study_helpers.STUDY``): one run, checkpoints every 5 steps."""
    from tests.study.study_helpers import STUDY

    cfg = tmp_path_factory.mktemp("study") / "long.yaml"
    cfg.write_text(STUDY)
    return cfg


@pytest.fixture(scope="module")
def long_reference(long_study: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The uninterrupted run of ``long_study`` for each placement (checkpoints written as it goes, none used)."""
    from lnblocks.study import run_study

    out = {}
    for placement in ("pre", "post"):
        folder = tmp_path_factory.mktemp(f"ref_{placement}")
        overrides = {"model.placement": placement}
        assert run_study(long_study, folder, show_progress=False, report=False, overrides=overrides) == 0
        assert not (folder / "checkpoints").exists()  # removed once the record is written
        out[placement] = folder
    return out
