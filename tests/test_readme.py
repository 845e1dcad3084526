"""The README cannot drift from the code: its python blocks run, and its option tables list every spec field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lnblocks.blocks import AttentionConfig, BlockConfig, MLPConfig
from lnblocks.models import GPTConfig
from lnblocks.norms.spec import NORM_PRESETS, SPEC_TYPES, NormSpec

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_blocks_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _python_blocks()
    assert blocks, "README has no python blocks"
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            raise AssertionError(f"README python block {i} failed: {err!r}\n{block}") from err


def test_norm_table_documents_every_option() -> None:
    text = README.read_text()
    shared = {f.name for f in dataclasses.fields(NormSpec)}
    for kind, cls in SPEC_TYPES.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{kind}` |")), None)
        assert row is not None, f"README norm table has no row for kind {kind!r}"
        for field in dataclasses.fields(cls):
            if field.name not in shared:
                assert f"`{field.name}=" in row, f"README row for {kind!r} does not document option {field.name!r}"
    for name in shared:
        assert f"`{name}=" in text, f"README does not document the shared option {name!r}"


def test_every_preset_is_documented() -> None:
    presets_paragraph = README.read_text().split("Presets (")[1].split("\n\n")[0]
    for name in NORM_PRESETS:
        assert f"`{name}`" in presets_paragraph, f"preset {name!r} missing from the README"


@pytest.mark.parametrize("cls", [BlockConfig, AttentionConfig, MLPConfig, GPTConfig], ids=lambda c: c.__name__)
def test_config_tables_document_every_option_with_its_default(cls: type) -> None:
    text = README.read_text()
    header = f"| `{cls.__name__}` option | meaning |"
    assert header in text, f"README has no option table for {cls.__name__}"
    rows = text.split(header)[1].split("\n\n")[0]
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            shown = repr(field.default).replace("'", '"')
        else:  # a nested config built by its default_factory
            shown = f"{type(field.default_factory()).__name__}()"
        assert f"| `{field.name}={shown}` |" in rows, f"README {cls.__name__} table: no row `{field.name}={shown}`"
