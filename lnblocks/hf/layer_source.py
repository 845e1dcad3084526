"""A decoder layer's ``forward`` as verified source, and compiled again with residual adds rewritten.

``read_forward(cls)`` parses the source of ``cls.forward`` and checks it against the code the class runs: compiled
again unchanged it must give the same bytecode, and every wrapper above it must be transformers' gradient-checkpointing
wrapper; a forward that fails (another transformers version, a closure, an unknown decorator) comes back with the
reason. Two kinds of site are matched as syntax trees:

- add, then norm (a pre-norm): ``x = a + b; r = x; x = self.<name>(x)`` becomes ``x, r = add_norm(self.<name>, a,
  b)``;
- norm, then add (a post-norm: OLMo 2's layers, Gemma 2/3's post-feedforward norm): ``x = self.<name>(x); x = r + x``
  (or ``x + r``) becomes ``x = norm_add(self.<name>, x, r, norm_first)``, where the add is no add-then-norm site.

``LayerSource.compile(names, add_norm, norm_add)`` rewrites the sites of the norms ``names`` and changes nothing else
(compiled with the module's globals, line numbers and ``__future__`` flags).
"""

from __future__ import annotations
import __future__

import ast
import copy
import functools
import inspect
import linecache
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass

HELPER = "__lnblocks_add_norm__"  # the name the rewritten forward calls the add + norm helper by
THEN_ADD = "__lnblocks_norm_add__"  # ... and the norm + add helper
_FACTORY = f"def __lnblocks_factory__({HELPER}, {THEN_ADD}):\n    pass\n"


def _target(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _site(a: ast.stmt, b: ast.stmt, c: ast.stmt) -> str | None:
    """``x = A + B; r = x; x = self.<name>(x)`` -> ``name``, else None."""
    x = _target(a)
    if x is None or not (isinstance(a.value, ast.BinOp) and isinstance(a.value.op, ast.Add)):
        return None
    r = _target(b)
    if r is None or r == x or not (isinstance(b.value, ast.Name) and b.value.id == x) or _target(c) != x:
        return None
    return _self_call(c.value, x)


def _self_call(call: ast.expr, x: str) -> str | None:
    """``self.<name>(x)`` (one positional argument, the name ``x``) -> ``name``, else None."""
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == x
        and not call.keywords
    ):
        return call.func.attr
    return None


def _then_add_site(a: ast.stmt, b: ast.stmt) -> tuple[str, ast.expr, bool] | None:
    """``x = self.<name>(x); x = r + x`` (or ``x + r``, ``r`` a name other than ``x``) -> ``(name, r, norm_first)``."""
    x = _target(a)
    if x is None or _target(b) != x:
        return None
    name = _self_call(a.value, x)
    add = b.value
    if name is None or not (isinstance(add, ast.BinOp) and isinstance(add.op, ast.Add)):
        return None
    for normed, other, norm_first in ((add.right, add.left, False), (add.left, add.right, True)):
        if isinstance(normed, ast.Name) and normed.id == x and isinstance(other, ast.Name) and other.id != x:
            return name, other, norm_first
    return None


def _bodies(fn: ast.FunctionDef) -> Iterable[list[ast.stmt]]:
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                yield body


def _sites(fn: ast.FunctionDef) -> list[tuple[list[ast.stmt], int, str, str]]:
    """Every fusable site in ``fn`` (any nesting): ``(statement list, index of its first statement, module name,
    kind)``, kind ``"add_norm"`` (three statements) or ``"norm_add"`` (two); sites may share an add (``chosen``
    picks)."""
    found = []
    for body in _bodies(fn):
        for i in range(len(body) - 1):
            if i < len(body) - 2 and (name := _site(*body[i : i + 3])):
                found.append((body, i, name, "add_norm"))
            if (post := _then_add_site(body[i], body[i + 1])) is not None:
                found.append((body, i, post[0], "norm_add"))
    return found


def _chosen(sites: list[tuple[list[ast.stmt], int, str, str]], names: Iterable[str]) -> list[tuple]:
    """The sites of ``names`` to rewrite: every add-then-norm one, then each norm-then-add one whose add is not
    taken already (Gemma's post-attention norm: its add is the pre-feedforward norm's add-then-norm)."""
    wanted = set(names)
    out, taken = [], set()
    for kind in ("add_norm", "norm_add"):
        for body, i, name, k in sites:
            span = {(id(body), j) for j in (range(i, i + 3) if k == "add_norm" else (i, i + 1))}
            add = (id(body), i if k == "add_norm" else i + 1)
            if k == kind and name in wanted and add not in taken and not (kind == "norm_add" and span & taken):
                out.append((body, i, name, k))
                taken |= span
    return out


def _fuse_sites(fn: ast.FunctionDef, names: Iterable[str]) -> ast.FunctionDef:
    """A copy of ``fn`` with the sites of ``names`` rewritten to one helper call each."""
    fn = copy.deepcopy(fn)
    sites = sorted(_chosen(_sites(fn), names), key=lambda site: (id(site[0]), site[1]))
    for body, i, name, kind in reversed(sites):  # from the end of each body: earlier indices stay valid
        norm = ast.Attribute(ast.Name("self", ast.Load()), name, ast.Load())
        if kind == "add_norm":
            add, keep = body[i], body[i + 1]
            call = ast.Call(ast.Name(HELPER, ast.Load()), [norm, add.value.left, add.value.right], [])
            pair = ast.Tuple([ast.Name(_target(add), ast.Store()), ast.Name(_target(keep), ast.Store())], ast.Store())
            body[i : i + 3] = [ast.copy_location(ast.Assign(targets=[pair], value=call), add)]
        else:
            x = _target(body[i])
            _, other, norm_first = _then_add_site(body[i], body[i + 1])
            args = [norm, ast.Name(x, ast.Load()), ast.Name(other.id, ast.Load()), ast.Constant(norm_first)]
            call = ast.Call(ast.Name(THEN_ADD, ast.Load()), args, [])
            body[i : i + 2] = [ast.copy_location(ast.Assign([ast.Name(x, ast.Store())], call), body[i])]
    return ast.fix_missing_locations(fn)


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Same bytecode, names and constants (nested code compared the same way); line numbers do not matter."""
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount", "co_kwonlyargcount")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) != isinstance(y, types.CodeType):
            return False
        if isinstance(x, types.CodeType) and not same_code(x, y):
            return False
        if not isinstance(x, types.CodeType) and (type(x) is not type(y) or x != y):
            return False
    return True


def wrapper_chain(fn: Callable) -> list[Callable]:
    """``fn`` and the functions it wraps (``__wrapped__``, at most 16 deep), outermost first."""
    out = [fn]
    while hasattr(out[-1], "__wrapped__") and len(out) < 16:
        out.append(out[-1].__wrapped__)
    return out


@functools.cache
def _checkpoint_wrapper_code() -> types.CodeType | None:
    """The code of the wrapper ``GradientCheckpointingLayer.__init_subclass__`` puts around each layer's forward."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return None
    init = GradientCheckpointingLayer.__dict__.get("__init_subclass__")
    code = getattr(getattr(init, "__func__", None), "__code__", None)
    consts = code.co_consts if code is not None else ()
    name = "forward_with_checkpointing"
    return next((c for c in consts if isinstance(c, types.CodeType) and c.co_name == name), None)


def _is_checkpoint_wrapper(fn: object) -> bool:
    return inspect.isfunction(fn) and fn.__code__ is _checkpoint_wrapper_code()


@dataclass(frozen=True)
class LayerSource:
    """A layer class's forward as parsed source, verified against the running code."""

    fn: ast.FunctionDef | None
    raw: Callable | None
    sites: tuple[str, ...]
    reason: str = ""

    def fusable(self, names: Iterable[str]) -> tuple[str, ...]:
        """The names among ``names`` whose sites ``compile`` would rewrite (in source order)."""
        assert self.fn is not None
        chosen = {name for _, _, name, _ in _chosen(_sites(self.fn), names)}
        return tuple(n for n in dict.fromkeys(self.sites) if n in chosen)

    def compile(self, fused: Iterable[str], helper: Callable | None, then_add: Callable | None = None) -> Callable:
        """The forward with the sites of ``fused`` rewritten to calls of ``helper`` (add, then norm) and ``then_add``
        (norm, then add), the decorators of the source applied again."""
        assert self.fn is not None and self.raw is not None
        factory = ast.parse(_FACTORY)
        fn = _fuse_sites(self.fn, fused)
        factory.body[0].body = [fn, ast.Return(ast.Name(fn.name, ast.Load()))]
        ast.fix_missing_locations(factory)
        filename = inspect.getsourcefile(self.raw) or "<lnblocks.hf.layer_source>"
        flags = self.raw.__code__.co_flags & __future__.annotations.compiler_flag  # as the module was compiled
        code = compile(factory, filename, "exec", flags=flags, dont_inherit=True)
        namespace: dict = {}
        exec(code, self.raw.__globals__, namespace)  # the module's globals; the factory lands in `namespace`
        forward = namespace["__lnblocks_factory__"](helper, then_add)
        inspect.unwrap(forward).__qualname__ = self.raw.__qualname__
        return forward


def _refused(reason: str) -> LayerSource:
    return LayerSource(None, None, (), reason)


@functools.cache
def module_tree(filename: str) -> ast.Module | None:
    """The syntax tree of a source file as Python loaded it (``linecache``), or None where it does not parse."""
    try:
        return ast.parse("".join(linecache.getlines(filename)), filename)
    except (SyntaxError, ValueError):
        return None


def checked_definition(raw: Callable) -> ast.FunctionDef | str:
    """The syntax tree of ``raw``'s definition, from its module's source (exact text and line numbers), or why not."""
    filename = inspect.getsourcefile(raw)
    tree = module_tree(filename) if filename else None
    if tree is None:
        return "the source of its forward cannot be read"
    first = raw.__code__.co_firstlineno  # the line of the first decorator
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.FunctionDef)
            and node.name == raw.__name__
            and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == first
        ):
            return node
    return "the source of its forward is not where its code says"


@functools.cache
def read_forward(cls: type) -> LayerSource:
    """Parse and verify ``cls.forward``; ``reason`` says why it cannot be rewritten."""
    chain = wrapper_chain(cls.forward)
    raw = chain[-1]
    if not inspect.isfunction(raw):
        return _refused("its forward is not Python code")
    if raw.__code__.co_freevars:
        return _refused(f"its forward is a closure (over {', '.join(raw.__code__.co_freevars)})")
    fn = checked_definition(raw)
    if isinstance(fn, str):
        return _refused(fn)
    source_obj = LayerSource(fn, raw, tuple(name for _, _, name, _ in _sites(fn)))
    try:
        again = wrapper_chain(source_obj.compile((), None))  # unchanged: must be the code the class runs
    except Exception as err:  # a decorator that cannot be evaluated again
        return _refused(f"its forward cannot be compiled again ({type(err).__name__}: {err})")
    head, tail = chain[: len(chain) - len(again)], chain[len(chain) - len(again) :]
    if len(tail) != len(again) or not all(
        inspect.isfunction(x) and inspect.isfunction(y) and same_code(x.__code__, y.__code__)
        for x, y in zip(tail, again)
    ):
        return _refused("its source does not match the code it runs (edited or generated at run time)")
    if not all(_is_checkpoint_wrapper(w) for w in head):
        return _refused("its forward is wrapped by something other than transformers' gradient checkpointing")
    if not source_obj.sites:
        return _refused(
            "its forward has no residual add followed by a module call (x = a + b; r = x; x = self.m(x)) nor a "
            "module call followed by one (x = self.m(x); x = r + x)"
        )
    return source_obj
