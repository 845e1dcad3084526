"""Package hygiene: a light import, clear errors for missing extras, no import circles, the CLI's parity command."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

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


# ---- import circles -------------------------------------------------------------------------------------------
# A module that imports another which imports it back (even lazily inside a function, or only for type hints under
# ``if TYPE_CHECKING:``) cannot be read on its own: a reader walking either one walks both. Found from the source,
# every import statement counted; ``from pkg import name`` counts as importing the module ``pkg`` takes ``name`` from.
LIBRARY = Path(lnblocks.__file__).resolve().parent
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}  # none: a new circle is broken, not listed


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _modules() -> dict[str, Path]:
    out = {}
    for path in LIBRARY.rglob("*.py"):
        parts = list(path.relative_to(LIBRARY.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _target(modules: dict[str, Path], base: str, name: str | None) -> str | None:
    """The library module ``from base import name`` (or ``import base``) reads: a submodule, the module a package
    re-exports ``name`` from, or the package itself."""
    if name is not None and f"{base}.{name}" in modules:
        return f"{base}.{name}"
    path = modules.get(base)
    if name is not None and path is not None and path.name == "__init__.py":
        for node in _tree(path).body:
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and any((a.asname or a.name) == name for a in node.names)
            ):
                return _target(modules, node.module, name)
    return base if path is not None else None


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(_tree(path)):  # every statement: lazy and TYPE_CHECKING imports too
            if isinstance(node, ast.Import):
                targets = [_target(modules, a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*head, base] if base else head)
                targets = [_target(modules, base, a.name) for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _package_of(circle: list[str]) -> str:
    tops = {".".join(m.split(".")[:2]) for m in circle}
    return tops.pop() if len(tops) == 1 else "across packages"


PACKAGES = sorted(p.parent.name for p in LIBRARY.glob("*/__init__.py"))


@pytest.mark.parametrize("package", [*(f"lnblocks.{p}" for p in PACKAGES), "across packages"])
def test_no_import_circle(package: str) -> None:
    circles = [c for c in _circles(_import_graph()) if _package_of(c) == package]
    assert circles == KNOWN_CIRCLES.get(package, []), f"import circles in {package}: {circles}"


def test_the_circle_finder_finds_lazy_and_type_only_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]
    modules = _import_graph()
    assert "lnblocks.norms.modules" in modules["lnblocks.norms.build"]  # a plain import is an edge
    assert "lnblocks.models.hf_convert" in modules["lnblocks.models.gpt"]  # so is one inside a function
    assert "lnblocks.models.gpt" in modules["lnblocks.models"]  # and `from pkg import name` reaches name's module


def test_the_old_loss_path_is_the_lm_head_module_itself() -> None:
    import lnblocks.models.lm_head as lm_head
    import lnblocks.models.loss as loss

    assert loss is lm_head  # one module: a threshold set through the old path is the one the head reads


# ---- the README's layout table ----------------------------------------------------------------------------------
# Its "imports from lnblocks" column is the import graph above, read per unit: a subpackage of lnblocks (the study's
# core and tasks each one unit) or a top-level module. ``config``, ``_optional`` and ``process_exit`` are the bases
# every unit may use and are left out of the column, as the README says.
BASES = {"config", "_optional", "process_exit"}


def _unit(module: str) -> str:
    parts = module.split(".")[1:]
    if parts[:1] == ["study"] and len(parts) > 1 and parts[1] in ("core", "lm", "digits"):
        return "study." + parts[1]
    return parts[0] if parts else "lnblocks"


def _layout_table() -> dict[str, set[str]]:
    """README row -> the backticked unit names of its "imports from lnblocks" column ("nothing": none)."""
    text = (LIBRARY.parent / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("```", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`lnblocks."):
            names = set(re.findall(r"`([a-z_.]+)`", cells[2])) - BASES
            rows[cells[0].strip("`").removeprefix("lnblocks.")] = names
    return rows


def test_the_readme_layout_table_is_the_import_graph() -> None:
    actual: dict[str, set[str]] = {}
    for module, targets in _import_graph().items():
        actual.setdefault(_unit(module), set()).update(_unit(t) for t in targets if _unit(t) != _unit(module))
    table = _layout_table()
    assert {"norms", "kernels", "models", "hf", "study.core", "study.lm"} <= set(table)
    wrong = {unit: {"README": sorted(names), "code": sorted(actual.get(unit, set()) - BASES)}
             for unit, names in table.items() if names != actual.get(unit, set()) - BASES}  # fmt: skip
    assert not wrong, f"README's layout table disagrees with the imports: {wrong}"


def test_no_module_imports_another_modules_private_names() -> None:
    """A name with a leading underscore is its module's own: another module that needs it gets it under a public
    name (``_optional``, the package of optional-import helpers, is private as a module, not in its names)."""
    found = []
    for module, path in _modules().items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lnblocks"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and node.module != module:
                    found.append(f"{module} imports {private} from {node.module}")
    assert not found, found
