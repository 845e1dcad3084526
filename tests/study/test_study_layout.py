"""The package layout (issue 19): the study in three parts with one-way imports. The core imports no task and names
none; a task imports the core and the library, never another task; the library never imports the study; no import
circle among study modules (lazy imports inside functions included); every study module imports on its own; and
nothing generates its dataclasses at import time or keeps an old name alive."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[2] / "lnblocks" / "study"
LIBRARY = ["lnblocks.norms", "lnblocks.kernels", "lnblocks.blocks", "lnblocks.models", "lnblocks.hf", "lnblocks.cnn",
           "lnblocks.config", "lnblocks.parity", "lnblocks._optional"]  # fmt: skip
TASKS = ("lm", "digits")  # the task packages under lnblocks/study/
TASK_NAMES = ("lm", "cnn_digits")  # their registered names


def module_name(path: Path) -> str:
    parts = path.relative_to(STUDY.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(STUDY.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(path: Path) -> set[str]:
    """Every lnblocks module ``path`` imports, at module level or inside functions (``if TYPE_CHECKING:`` blocks,
    which never run, excepted); ``from package import submodule`` counts as the submodule."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for child in node.body for n in ast.walk(child)}  # fmt: skip
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("lnblocks")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lnblocks"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            out |= subs or {node.module}
    return out


def part(name: str) -> str:
    """``core``, a task package's name, or ``top`` (``lnblocks.study`` itself)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 else "top"


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_study_has_three_parts() -> None:
    assert sorted(p.name for p in STUDY.iterdir() if p.name != "__pycache__") == sorted(["__init__.py", "core", *TASKS])
    assert {part(m) for m in MODULES} == {"top", "core", *TASKS}


@pytest.mark.parametrize("name", [m for m in MODULES if part(m) == "core"])
def test_the_core_imports_and_names_no_task(name: str) -> None:
    path = MODULES[name]
    bad = sorted(m for m in imports(path) if m.startswith("lnblocks.study.") and part(m) in TASKS)
    assert not bad, f"{name} imports the task modules {bad}"
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}  # fmt: skip
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docstrings
             and isinstance(n.value, str) and n.value in TASK_NAMES]  # fmt: skip
    assert not names, f"{name} hard-codes the task names {names}: a task declares what it supports"


@pytest.mark.parametrize("name", [m for m in MODULES if part(m) in TASKS])
def test_a_task_imports_the_core_and_the_library_never_another_task(name: str) -> None:
    own = part(name)
    for target in imports(MODULES[name]):
        if target.startswith("lnblocks.study"):
            assert part(target) in ("core", own), f"{name} imports {target}"
            assert target != "lnblocks.study", f"{name} imports the lnblocks.study package (its public names)"
        else:
            assert target.split(".")[1] in [lib.split(".")[1] for lib in LIBRARY], f"{name} imports {target}"


def test_no_import_circle_among_study_modules() -> None:
    graph = {m: {t for t in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            assert state.get(t) != 1, "import circle: " + " -> ".join([*path[path.index(t) :], t])
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_module_imports_another_modules_private_names() -> None:
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lnblocks"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{name} imports {private} from {node.module}"


def test_configs_are_written_out_and_old_names_are_gone() -> None:
    """Plain ``@dataclass`` definitions a reader and an IDE can see, and no alias kept for an older name (older
    records are upgraded where they are read: ``lnblocks.study.lm.result.upgrade_record``)."""
    sources = {p: p.read_text() for p in sorted((STUDY.parent).rglob("*.py"))}
    for path, text in sources.items():
        assert "make_dataclass" not in text, path
        assert "_KeyedError" not in text and "legacy_main" not in text and "ALIASES" not in text, path
        if path.name != "result.py":
            assert "qkv_init_gain" not in text and "amp_dtype" not in text, path
    assert not (STUDY.parent / "cnn" / "digits_study.py").exists()


def test_library_never_imports_the_study() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import lnblocks\n"
        f"for name in {LIBRARY}:\n"
        "    mod = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(getattr(mod, '__path__', []), name + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('lnblocks.study')))\n"
    )
    assert run(code).strip() == "[]"


def test_the_core_loads_no_task() -> None:
    """Importing every core module loads neither task: a task loads when a study of it is read or run."""
    core = sorted(m for m in MODULES if part(m) == "core")
    code = (
        "import importlib, sys\n"
        f"for name in {core}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('lnblocks.study.lm', 'lnblocks.study.digits'))))\n"
    )
    assert run(code).strip() == "[]"


def test_every_study_module_imports_alone() -> None:
    """Each module is imported into a fresh set of lnblocks modules, so an import cycle fails whatever the order."""
    code = (
        "import importlib, sys\n"
        f"names = {sorted(MODULES)} + ['lnblocks.cli', 'lnblocks.demo']\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m.startswith('lnblocks')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    assert int(run(code)) == len(MODULES) + 2


def test_readme_layout_lists_every_study_module() -> None:
    readme = (STUDY.parents[1] / "README.md").read_text()
    layout = readme.split("## Layout")[1].split("\n## ")[0]
    for path in MODULES.values():
        rel = path.relative_to(STUDY).as_posix()
        if path.name == "__init__.py" and rel != "__init__.py" and len(ast.parse(path.read_text()).body) == 1:
            continue  # a package docstring and nothing else
        assert f"`{rel}`" in layout, f"README's Layout section does not list lnblocks/study/{rel}"
