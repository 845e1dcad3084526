"""No function in lnblocks is longer than 80 lines (the project's standard: a function a reader holds in mind at once),
Triton kernels (``@triton.jit``) excepted: a kernel is one launch's program and reads best whole.

``ROOTS`` says what is checked: all of lnblocks. A function's length counts from its ``def`` (decorators excluded)
to its last line, docstring and nested functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

LNBLOCKS = Path(__file__).resolve().parents[1] / "lnblocks"
ROOTS = [LNBLOCKS]
MAX_LINES = 80


def _is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with ``triton.jit`` (called or not, under any other decorator such as ``triton.autotune``)."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit" and getattr(target.value, "id", "") == "triton":
            return True
    return False


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` of every function under ``root`` longer than ``limit`` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_triton_kernel(node):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_80_lines() -> None:
    long = [f for root in ROOTS for f in long_functions(root)]
    assert not long, f"functions over {MAX_LINES} lines (split them): " + "; ".join(long)


def test_the_check_finds_a_long_function_and_spares_a_kernel(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))  # def + 80 lines: 81
    (tmp_path / "m.py").write_text(
        f"import triton\n\ndef short():\n    return 1\n\ndef long():\n{body}\n"
        f"@triton.jit\ndef kernel():\n{body}\n"
        f"@triton.autotune(configs=[])\n@triton.jit(debug=False)\ndef tuned():\n{body}"
    )
    found = long_functions(tmp_path)
    assert len(found) == 1 and " long (81 lines)" in found[0], found
