"""What the names a norm's forward uses stand for, as ``lnblocks.hf.norm_trace`` reads them: the torch functions it
knows (each one op of the graph), activation modules that compute exactly ``silu`` or ``sigmoid`` (transformers'
``ACT2FN`` entries), dtypes, and the kinds of value a name evaluates to while tracing (``self``, a global, a tensor
method, a helper method, an activation, a helper function named by its qualified name)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lnblocks.hf.norm_graph import Node

EPS_ATTRS = ("variance_epsilon", "eps")
DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
CALLABLES: dict[Any, str] = {
    torch.rsqrt: "rsqrt",
    torch.pow: "pow",
    torch.square: "square",
    torch.mean: "mean",
    torch.sum: "sum",
    torch.sigmoid: "act:sigmoid",
    F.silu: "act:silu",
    F.sigmoid: "act:sigmoid",
    F.layer_norm: "layer_norm",
    torch.sqrt: "sqrt",
    torch.var: "var",
}
ACT_MODULES = {nn.SiLU: "silu", nn.Sigmoid: "sigmoid"}
BINOPS = {ast.Mult: "mul", ast.Add: "add", ast.Sub: "sub", ast.Div: "div", ast.Pow: "pow", ast.FloorDiv: "floordiv"}


class SelfRef:
    pass


SELF = SelfRef()


@dataclass
class Global:
    obj: Any
    src: str


@dataclass
class Opaque:
    """A helper function named by its qualified name (the templates name transformers' helpers this way)."""

    name: str


@dataclass
class Method:
    obj: Node
    name: str


@dataclass
class Bound:
    name: str


@dataclass
class Activation:
    name: str


def activation_name(module: Any) -> str | None:
    """``silu``/``sigmoid`` for an activation module computing exactly that: ``nn.SiLU``, ``nn.Sigmoid``, or a class
    whose own forward is ``return F.silu(input)`` (transformers' ``SiLUActivation``); else None."""
    name = ACT_MODULES.get(type(module))
    if name is not None or not isinstance(module, nn.Module) or "forward" in module.__dict__:
        return name
    fn = type(module).forward
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not (isinstance(tree, ast.FunctionDef) and len(body) == 1 and isinstance(body[0], ast.Return)):
        return None
    call, arg = body[0].value, tree.args.args[1].arg if len(tree.args.args) == 2 else None
    if not (isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords):
        return None
    if not (isinstance(call.args[0], ast.Name) and call.args[0].id == arg):
        return None
    if not all(isinstance(n, (ast.Name, ast.Attribute, ast.Load)) for n in ast.walk(call.func)):
        return None
    try:  # a dotted name (``nn.functional.silu``) in the module's globals
        target = eval(compile(ast.Expression(call.func), "<activation>", "eval"), dict(fn.__globals__))
    except Exception:
        return None
    op = CALLABLES.get(target) if hashable(target) else None
    return op[len("act:") :] if op is not None and op.startswith("act:") else None


def hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def opaque(name: str) -> Opaque:
    """A helper function of the traced code, named by its qualified name (a template's stand-in for it)."""
    return Opaque(name)
