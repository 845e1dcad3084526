"""Package hygiene: a light import, clear errors for missing extras, and the CLI's parity command."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import lnblocks
from lnblocks._optional import require
from lnblocks.cli import main


def test_import_is_light() -> None:
    code = (
        "import sys, lnblocks; heavy = {'transformers', 'triton', 'matplotlib', 'flash_attn', 'yaml'};"
        "loaded = sorted(heavy & set(sys.modules)); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "", "PYTHONWARNINGS": "ignore"})


def test_missing_optional_dependency_names_the_extra() -> None:
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    with pytest.raises(ImportError, match=r"pip install 'lnblocks\[gpu\]'"):
        require("flash_attn")


def test_unknown_public_name() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        lnblocks.Nope  # noqa: B018


def test_cli_parity_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parity"]) == 0
    out = capsys.readouterr().out
    assert "| LayerNorm | torch.nn.LayerNorm | 0 / 0 | 0 / 0 | 0 / 0 |" in out
    assert "| preset gemma | GemmaRMSNorm | 0 / 0 | 0 / 0 | 0 / 0 |" in out
