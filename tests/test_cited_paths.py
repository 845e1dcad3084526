"""Every repository path and every ``lnblocks`` module a docstring, comment or page cites exists.

Docs that point at a file the repository lacks send a reader nowhere (the kernels' docstrings once cited a ``tools/``
folder that never existed). Scanned: every tracked or new ``.py`` and ``.md`` file. Cited are paths that start with a
top-level folder of this repository (``lnblocks/...``, ``benchmarks/x.py``, ``tools/...``), and dotted module names
in backticks (``lnblocks.kernels.launch``: every component up to the first module must exist, and a name after a
package must appear in its ``__init__.py``). Git-ignored paths (caches, wheels) and wildcards are skipped.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the repository's top-level folders, and the ones docs have been seen citing without their existing
FOLDERS = ("lnblocks", "tests", "benchmarks", "configs", "docs", "tools", "scripts", "examples")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(FOLDERS) + r")/(?:[\w./*-]*[\w/*])?)")
MODULE = re.compile(r"`+(lnblocks(?:\.\w+)+)(?![\w/.])")  # not a format name such as ``lnblocks.study.run/2``


def _files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout: {err}")
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its examples are meant to be missing
    return [f for f in out if f.endswith((".py", ".md")) and f != this and (ROOT / f).is_file()]


def _ignored(paths: list[str]) -> set[str]:
    if not paths:
        return set()
    candidates = [*paths, *(p.rstrip("/") + "/" for p in paths)]  # a folder pattern matches only with the slash
    proc = subprocess.run(["git", "check-ignore", "--no-index", *candidates], cwd=ROOT, capture_output=True, text=True)
    return {p.rstrip("/") for p in proc.stdout.split()}


def _missing_module(dotted: str) -> str | None:
    """The first component of ``lnblocks.a.b...`` that names nothing, or None."""
    path = ROOT / "lnblocks"
    for part in dotted.split(".")[1:]:
        if part.startswith("__"):
            return None
        if (path / part / "__init__.py").is_file():
            path = path / part
            continue
        if (path / f"{part}.py").is_file():
            return None  # a module: what follows is an attribute of it
        return None if part in _package_names(path / "__init__.py") else part
    return None


def _package_names(init: Path) -> set[str]:
    """Names a package's ``__init__.py`` defines, imports, lists in ``__all__`` or serves from ``__getattr__``."""
    tree = ast.parse(init.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        lazy = isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        listed = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
        if lazy or listed:
            names.update(c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def test_cited_paths_exist() -> None:
    cited: dict[str, list[str]] = {}
    for f in _files():
        for m in PATH.finditer((ROOT / f).read_text(errors="replace")):
            path = m.group(1)
            if "*" not in path and not (ROOT / path).exists():
                cited.setdefault(path, []).append(f)
    ignored = _ignored(list(cited))
    missing = {p: fs for p, fs in cited.items() if p.rstrip("/") not in ignored}
    assert not missing, "cited paths that do not exist: " + "; ".join(f"{p} (in {', '.join(fs)})" for p, fs in
                                                                        sorted(missing.items()))  # fmt: skip


def test_cited_modules_exist() -> None:
    missing = []
    for f in _files():
        for m in MODULE.finditer((ROOT / f).read_text(errors="replace")):
            part = _missing_module(m.group(1))
            if part is not None:
                missing.append(f"{m.group(1)} ({part!r} not found; in {f})")
    assert not missing, "cited modules that do not exist: " + "; ".join(sorted(set(missing)))


def test_the_scan_finds_a_missing_path(tmp_path: Path) -> None:
    """The patterns catch what they are for (a test that cannot fail proves nothing)."""
    text = "compiled ahead of time in ``tools/`` and benchmarks/nope.py; see ``lnblocks.kernels.forward``"
    assert [m.group(1) for m in PATH.finditer(text)] == ["tools/", "benchmarks/nope.py"]
    assert [_missing_module(m.group(1)) for m in MODULE.finditer(text)] == ["forward"]
    assert _missing_module("lnblocks.kernels.launch.launch_forward") is None
    assert _missing_module("lnblocks.norms.RMSNorm") is None
