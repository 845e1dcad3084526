"""The package layout: the study in three parts with one-way imports, so a reader can follow a run through it. The
core imports no task and names none; a task imports the core and the library, never another task; the library never
imports the study; the ``lm`` task in three rooms (``data``, ``run``, ``report``) whose imports go one way; no import
circle among study modules (lazy imports inside functions and type-only imports included); every study module imports
on its own; and nothing generates its dataclasses at import time or keeps an old name alive."""

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
LM = "lnblocks.study.lm"
LM_ROOMS = ("data", "run", "report")
# lm's own modules beside the rooms: the task, its run config, what a run records, and the corpus API's public name
LM_TOP = ("__init__.py", "task.py", "config.py", "model_config.py", "result.py", "corpus.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(STUDY.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(STUDY.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(path: Path, type_only: bool = False) -> set[str]:
    """Every lnblocks module ``path`` imports, at module level or inside functions (``if TYPE_CHECKING:`` blocks,
    which never run, only with ``type_only``: they still send a reader to another module); ``from package import
    submodule`` counts as the submodule."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for child in node.body for n in ast.walk(child)} if not type_only else set()  # fmt: skip
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


def room(name: str) -> str | None:
    """``data``, ``run`` or ``report`` for a module in one of the lm task's rooms, else None."""
    parts = name.split(".")
    return parts[3] if name.startswith(LM + ".") and len(parts) > 4 and parts[3] in LM_ROOMS else None


def test_the_lm_task_has_three_rooms() -> None:
    lm = STUDY / "lm"
    assert sorted(p.name for p in lm.iterdir() if p.name != "__pycache__") == sorted([*LM_TOP, *LM_ROOMS])
    for name in LM_ROOMS:
        assert (lm / name / "__init__.py").is_file(), name


@pytest.mark.parametrize("name", [m for m in MODULES if room(m) == "data"])
def test_data_imports_neither_run_nor_report(name: str) -> None:
    bad = sorted(t for t in imports(MODULES[name], type_only=True) if room(t) in ("run", "report"))
    assert not bad, f"{name} imports {bad}: the data a run trains on knows nothing of the run or the report"


@pytest.mark.parametrize("name", [m for m in MODULES if room(m) == "report"])
def test_report_reaches_run_only_through_the_init_profiles(name: str) -> None:
    """The report is built from records alone; only the init gradient profiles build and probe fresh models."""
    bad = sorted(t for t in imports(MODULES[name], type_only=True) if room(t) == "run")
    assert not bad or name == f"{LM}.report.init_profile", f"{name} imports {bad}"


@pytest.mark.parametrize("name", [f"{LM}.config", f"{LM}.model_config", f"{LM}.result"])
def test_the_run_config_and_result_know_no_loop_and_no_report(name: str) -> None:
    bad = sorted(t for t in imports(MODULES[name], type_only=True) if room(t) in ("run", "report"))
    assert not bad, f"{name} imports {bad}"


def test_the_corpus_api_keeps_its_public_name() -> None:
    """``lnblocks.study.lm.corpus`` (README, docs) is the corpus package's API, the same objects."""
    import lnblocks.study.lm.corpus as public
    import lnblocks.study.lm.data.corpus as corpus

    assert public.__all__ == corpus.__all__
    assert all(getattr(public, n) is getattr(corpus, n) for n in corpus.__all__)


def test_no_import_circle_among_study_modules() -> None:
    graph = {m: {t for t in imports(p, type_only=True) if t in MODULES and t != m} for m, p in MODULES.items()}
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
