"""The docs cannot drift from the code: every python block of README.md and of every docs/*.md page runs (each page
on its own, its blocks in file order in one namespace), every relative link resolves, the README stays short and
leads to every page, and the option tables list every spec and config field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lnblocks.blocks import AttentionConfig, BlockConfig, MLPConfig
from lnblocks.models import GPTConfig
from lnblocks.norms.spec import NORM_PRESETS, SPEC_TYPES, NormSpec

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NORMS = ROOT / "docs" / "norms.md"
MODELS = ROOT / "docs" / "models.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_blocks_run_in_order(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page.read_text())
    if not blocks:
        pytest.skip(f"{_name(page)} has no python blocks")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": f"__docs_{page.stem}__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{_name(page)} python block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            raise AssertionError(f"{_name(page)} python block {i} failed: {err!r}\n{block}") from err


def test_python_blocks_are_found() -> None:
    text = "a\n```python\nx = 1\n```\n\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]
    assert python_blocks(README.read_text()), "README has no python blocks"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{_name(page)} links to {target}, which does not exist"


def test_readme_is_short_and_leads_to_every_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md must stay at most 300 lines: move the detail into docs/"
    linked = {(ROOT / t.split("#")[0]).resolve() for t in LINK.findall(text)}
    missing = [_name(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_norm_table_documents_every_option() -> None:
    text = NORMS.read_text()
    shared = {f.name for f in dataclasses.fields(NormSpec)}
    for kind, cls in SPEC_TYPES.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{kind}` |")), None)
        assert row is not None, f"docs/norms.md norm table has no row for kind {kind!r}"
        for field in dataclasses.fields(cls):
            if field.name not in shared:
                assert f"`{field.name}=" in row, f"docs/norms.md row for {kind!r} does not document {field.name!r}"
    for name in shared:
        assert f"`{name}=" in text, f"docs/norms.md does not document the shared option {name!r}"


def test_every_preset_is_documented() -> None:
    presets_paragraph = NORMS.read_text().split("Presets (")[1].split("\n\n")[0]
    for name in NORM_PRESETS:
        assert f"`{name}`" in presets_paragraph, f"preset {name!r} missing from docs/norms.md"


@pytest.mark.parametrize("cls", [BlockConfig, AttentionConfig, MLPConfig, GPTConfig], ids=lambda c: c.__name__)
def test_config_tables_document_every_option_with_its_default(cls: type) -> None:
    text = MODELS.read_text()
    header = f"| `{cls.__name__}` option | meaning |"
    assert header in text, f"docs/models.md has no option table for {cls.__name__}"
    rows = text.split(header)[1].split("\n\n")[0]
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            shown = repr(field.default).replace("'", '"')
        else:  # a nested config built by its default_factory
            shown = f"{type(field.default_factory()).__name__}()"
        assert f"| `{field.name}={shown}` |" in rows, (
            f"docs/models.md {cls.__name__} table: no row `{field.name}={shown}`"
        )
