"""The CNN layer table of docs/cnn.md cannot drift from ``lnblocks.cnn``: every layer has a row, every row names a layer
that exists (ours or torch's)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from torch import nn

import lnblocks.cnn as C

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cnn.md"
FUNCTIONAL_LAYERS = {"adaptive_instance_norm", "adaptive_grad_clip_"}  # layer-like functions that need a row


def _table_names() -> list[str]:
    table = PAGE.read_text().split("| layer | what it normalizes |")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows, "no rows in the CNN table of docs/cnn.md"
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_every_cnn_layer_has_a_row_and_every_row_exists() -> None:
    names = _table_names()
    layers = {n for n in C.__all__ if isinstance(getattr(C, n), type) and issubclass(getattr(C, n), nn.Module)}
    missing = (layers | FUNCTIONAL_LAYERS) - set(names)
    assert not missing, f"docs/cnn.md CNN table has no row for {sorted(missing)}"
    for name in names:
        obj = _resolve(name) if "." in name else getattr(C, name, None)
        assert obj is not None, f"docs/cnn.md CNN table names {name!r}, which lnblocks.cnn does not have"
    assert "torch.nn.LocalResponseNorm" in names and "torch.nn.utils.parametrizations.weight_norm" in names
