"""The kernel package reads top to bottom: reference math -> plan -> kernels -> launchers -> one autograd /
custom-op layer -> entry points, in at most six files, every import pointing one way.

Imports are read from the source (module level and inside functions alike), so a lazy import that closes a circle
fails too. The kernels may use the norms' spec and reference math, never the modules or their routing (which call
the kernels).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lnblocks" / "kernels"
# each file, and the lnblocks.kernels modules it may import
LAYERS = {
    "plan": set(),
    "jit": set(),
    "launch": {"jit", "plan"},
    "ops": {"launch", "plan"},
    "functional": {"launch", "ops", "plan"},
    "__init__": {"plan", "functional"},  # the package's names: the support rule, and the entry points lazily
}
NORMS_ALLOWED = {"lnblocks.norms.spec", "lnblocks.norms.functional", "lnblocks.norms"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lnblocks"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "lnblocks.kernels")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lnblocks"))
    return found


def test_at_most_six_files_with_known_jobs() -> None:
    files = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(files) <= 6, files
    assert set(files) == set(LAYERS), f"files {files}: update LAYERS with the job of a new one"


def test_imports_point_one_way() -> None:
    for name, allowed in LAYERS.items():
        imports = _imports(PACKAGE / f"{name}.py")
        kernel_modules = {i.removeprefix("lnblocks.kernels.") for i in imports if i.startswith("lnblocks.kernels.")}
        kernel_modules = {m for m in kernel_modules if (PACKAGE / f"{m}.py").exists()}
        if "lnblocks.kernels" in imports and name != "__init__":
            kernel_modules.add("__init__")
        assert kernel_modules <= allowed, f"{name}.py imports {sorted(kernel_modules - allowed)}"
        others = {i for i in imports if not i.startswith("lnblocks.kernels")}
        assert others <= NORMS_ALLOWED, f"{name}.py imports {sorted(others - NORMS_ALLOWED)}"


def test_layers_form_no_circle() -> None:
    """The allowed-import table itself is acyclic (so the files can be read in one order)."""
    order: list[str] = []
    pending = dict(LAYERS)
    while pending:
        ready = [n for n, deps in pending.items() if deps <= set(order)]
        assert ready, f"import circle among {sorted(pending)}"
        order += sorted(ready)
        for n in ready:
            del pending[n]
    assert order[-2:] == ["functional", "__init__"]
