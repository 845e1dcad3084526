"""The package layout: the library never imports the experiments, and every study module imports on its own (no
import cycle between lnblocks modules)."""

from __future__ import annotations

import subprocess
import sys

LIBRARY = ["lnblocks.norms", "lnblocks.kernels", "lnblocks.blocks", "lnblocks.models", "lnblocks.hf", "lnblocks.cnn",
           "lnblocks.config", "lnblocks.parity", "lnblocks._optional"]  # fmt: skip


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_library_never_imports_the_study() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import lnblocks\n"
        f"for name in {LIBRARY}:\n"
        "    mod = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(getattr(mod, '__path__', []), name + '.'):\n"
        "        if info.name != 'lnblocks.cnn.digits_study':  # the command alias of the digits study\n"
        "            importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('lnblocks.study')))\n"
    )
    assert run(code).strip() == "[]"


def test_every_study_module_imports_alone() -> None:
    """Each module is imported into a fresh set of lnblocks modules, so an import cycle fails whatever the order."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import lnblocks.study\n"
        "names = [i.name for i in pkgutil.walk_packages(lnblocks.study.__path__, 'lnblocks.study.')]\n"
        "names += ['lnblocks.cli', 'lnblocks.demo', 'lnblocks.cnn.digits_study']\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m.startswith('lnblocks')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    assert int(run(code)) >= 15
