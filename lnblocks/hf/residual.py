"""``fuse_residual=True``: the residual add in front of a norm inside an HF decoder layer becomes part of the norm call.

A Pre-LN decoder layer (Llama and its copies) reads, between attention and MLP::

    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

lnblocks norms take the add as an argument, ``norm(x, residual=r) -> (norm(x + r), x + r)`` (one kernel on GPU: the
fused add + norm of flash-attn and Liger-Kernel), so the three statements become::

    hidden_states, residual = __lnblocks_add_norm__(self.post_attention_layernorm, residual, hidden_states)

Only an add that the layer's own code follows with a norm can be fused; the add at the end of a layer meets the next
layer's norm outside this code and stays as it is (so Llama fuses one of its two adds per layer, Gemma2/3 the one
between their sandwich norms, and OLMo2, whose norms come *before* each add, none).

Why it is exact, and never a guess:

- the forward is read from its source and checked against the code the class runs: compiled again unchanged it must
  give the same bytecode, and every wrapper above it must be transformers' gradient-checkpointing wrapper; a layer
  that fails (another transformers version, a closure, an unknown decorator) is refused, naming its class;
- the three statements are matched as syntax trees, and the callee must be a norm that lnblocks patches on this
  instance; nothing else in the function changes (it is compiled with its module's globals and line numbers);
- ``__lnblocks_add_norm__(norm, a, b)`` adds ``a + b`` in that operand order, in their dtype as HF does; when the
  norm is not (or no longer) patched, or the operands would broadcast, it runs the original statements;
- the layer's class becomes a subclass with the same name whose forward is the rewritten one; transformers'
  ``GradientCheckpointingLayer`` wraps it at class creation like the original, so gradient checkpointing keeps
  working (FSDP2 swaps classes the same way); unpatching swaps the class back. The norm returns a tuple on the fused
  path, which forward hooks registered on the norm itself would see.
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

from torch import Tensor, nn

from lnblocks.hf.wrappers import hooked_by_accelerate, takes_residual, wrapped_copies

_HELPER = "__lnblocks_add_norm__"
_FACTORY = f"def __lnblocks_factory__({_HELPER}):\n    pass\n"


def add_norm(norm: nn.Module, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``s = a + b; return norm(s), s``, as the one call ``norm(a, residual=b)`` where ``norm`` runs lnblocks."""
    if (
        isinstance(a, Tensor)
        and isinstance(b, Tensor)
        and a.shape == b.shape
        and a.device == b.device
        and takes_residual(norm)
    ):
        return norm(a, residual=b)
    s = a + b
    return norm(s), s


# ---- reading a layer's forward ----------------------------------------------------------------------------------
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
    call = c.value
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == x
        and not call.keywords
    ):
        return None
    return call.func.attr


def _sites(fn: ast.FunctionDef) -> list[tuple[list[ast.stmt], int, str]]:
    """Every add-then-module site in ``fn`` (any nesting): ``(statement list, index of the add, module name)``."""
    found = []
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                found += [(body, i, n) for i in range(len(body) - 2) if (n := _site(*body[i : i + 3]))]
    return found


def _fuse_sites(fn: ast.FunctionDef, names: Iterable[str]) -> ast.FunctionDef:
    """A copy of ``fn`` with the sites of ``names`` rewritten to one ``__lnblocks_add_norm__`` call each."""
    fn = copy.deepcopy(fn)
    wanted = set(names)
    for body, i, name in reversed(_sites(fn)):  # from the end: earlier indices stay valid
        if name not in wanted:
            continue
        add, keep = body[i], body[i + 1]
        call = ast.Call(
            func=ast.Name(_HELPER, ast.Load()),
            args=[ast.Attribute(ast.Name("self", ast.Load()), name, ast.Load()), add.value.left, add.value.right],
            keywords=[],
        )
        pair = ast.Tuple([ast.Name(_target(add), ast.Store()), ast.Name(_target(keep), ast.Store())], ast.Store())
        body[i : i + 3] = [ast.copy_location(ast.Assign(targets=[pair], value=call), add)]
    return ast.fix_missing_locations(fn)


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Same bytecode, names and constants (nested code compared the same way); line numbers do not matter."""
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount", "co_kwonlyargcount")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) != isinstance(y, types.CodeType):
            return False
        if isinstance(x, types.CodeType) and not _same_code(x, y):
            return False
        if not isinstance(x, types.CodeType) and (type(x) is not type(y) or x != y):
            return False
    return True


def _chain(fn: Callable) -> list[Callable]:
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
class _Source:
    """A layer class's forward as parsed source, verified against the running code."""

    fn: ast.FunctionDef | None
    raw: Callable | None
    sites: tuple[str, ...]
    reason: str = ""

    def compile(self, fused: Iterable[str]) -> Callable:
        """The forward with the sites of ``fused`` rewritten (decorators of the source applied again)."""
        assert self.fn is not None and self.raw is not None
        factory = ast.parse(_FACTORY)
        fn = _fuse_sites(self.fn, fused)
        factory.body[0].body = [fn, ast.Return(ast.Name(fn.name, ast.Load()))]
        ast.fix_missing_locations(factory)
        filename = inspect.getsourcefile(self.raw) or "<lnblocks.hf.residual>"
        flags = self.raw.__code__.co_flags & __future__.annotations.compiler_flag  # as the module was compiled
        code = compile(factory, filename, "exec", flags=flags, dont_inherit=True)
        namespace: dict = {}
        exec(code, self.raw.__globals__, namespace)  # the module's globals; the factory lands in `namespace`
        forward = namespace["__lnblocks_factory__"](add_norm)
        inspect.unwrap(forward).__qualname__ = self.raw.__qualname__
        return forward


def _refused(reason: str) -> _Source:
    return _Source(None, None, (), reason)


@functools.cache
def _module_tree(filename: str) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)), filename)
    except (SyntaxError, ValueError):
        return None


def _definition(raw: Callable) -> ast.FunctionDef | str:
    """The syntax tree of ``raw``'s definition, from its module's source (exact text and line numbers), or why not."""
    filename = inspect.getsourcefile(raw)
    tree = _module_tree(filename) if filename else None
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
def read_forward(cls: type) -> _Source:
    """Parse and verify ``cls.forward``; ``reason`` says why it cannot be rewritten."""
    chain = _chain(cls.forward)
    raw = chain[-1]
    if not inspect.isfunction(raw):
        return _refused("its forward is not Python code")
    if raw.__code__.co_freevars:
        return _refused(f"its forward is a closure (over {', '.join(raw.__code__.co_freevars)})")
    fn = _definition(raw)
    if isinstance(fn, str):
        return _refused(fn)
    source_obj = _Source(fn, raw, tuple(name for _, _, name in _sites(fn)))
    try:
        again = _chain(source_obj.compile(()))  # unchanged: must be the code the class runs
    except Exception as err:  # a decorator that cannot be evaluated again
        return _refused(f"its forward cannot be compiled again ({type(err).__name__}: {err})")
    head, tail = chain[: len(chain) - len(again)], chain[len(chain) - len(again) :]
    if len(tail) != len(again) or not all(
        inspect.isfunction(x) and inspect.isfunction(y) and _same_code(x.__code__, y.__code__)
        for x, y in zip(tail, again)
    ):
        return _refused("its source does not match the code it runs (edited or generated at run time)")
    if not all(_is_checkpoint_wrapper(w) for w in head):
        return _refused("its forward is wrapped by something other than transformers' gradient checkpointing")
    if not source_obj.sites:
        return _refused("its forward has no residual add followed by a module call (x = a + b; r = x; x = self.m(x))")
    return source_obj


# ---- the fused layer classes --------------------------------------------------------------------------------------
def _new_fused(base: type, names: tuple[str, ...]) -> nn.Module:
    """Unpickling / deepcopy: a fused layer of ``base`` (or a plain one where this transformers cannot be fused)."""
    try:
        cls = fused_class(base, names)
    except ValueError:
        cls = base
    return object.__new__(cls)


def _reduce_ex(self: nn.Module, protocol: int) -> tuple:
    rv = object.__reduce_ex__(self, max(protocol, 2))  # (copyreg.__newobj__, (cls,), state, ...)
    return (_new_fused, (type(self).lnblocks_base, type(self).lnblocks_fused), *rv[2:])


@functools.cache
def fused_class(base: type, names: tuple[str, ...]) -> type:
    """The subclass of ``base`` whose forward fuses the adds in front of the norms ``names``."""
    source = read_forward(base)
    if source.fn is None:
        raise ValueError(f"{base.__name__}: {source.reason}")
    namespace = {
        "forward": source.compile(names),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "__reduce_ex__": _reduce_ex,
        "lnblocks_base": base,
        "lnblocks_fused": names,
    }
    return type(base.__name__, (base,), namespace)


def is_fused(layer: nn.Module) -> bool:
    return "lnblocks_base" in type(layer).__dict__


def _rebind(layer: nn.Module, old: type, new: type) -> None:
    """Point forwards that accelerate's hooks saved as bound methods of ``old.forward`` at ``new.forward``."""
    for key in ("forward", "_old_forward"):
        bound = layer.__dict__.get(key)
        if isinstance(bound, types.MethodType) and bound.__self__ is layer and bound.__func__ is old.forward:
            layer.__dict__[key] = types.MethodType(new.forward, layer)


def fuse(layer: nn.Module, names: tuple[str, ...]) -> None:
    base = type(layer)
    cls = fused_class(base, names)
    layer.__class__ = cls
    _rebind(layer, base, cls)


def unfuse(layer: nn.Module) -> None:
    cls = type(layer)
    base = cls.lnblocks_base
    layer.__class__ = base
    _rebind(layer, cls, base)


# ---- which layers of a model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerPlan:
    """A decoder layer and the norms whose preceding add is fused (empty with ``reason``: refused)."""

    name: str
    layer: nn.Module
    norms: tuple[str, ...]
    reason: str = ""


def plan_layers(model: nn.Module, norms: set[int], patched: set[int]) -> list[LayerPlan]:
    """Every decoder layer of ``model``: an item of an ``nn.ModuleList`` with a direct child that is one of the
    recognised ``norms`` (ids; a PEFT wrapper of one counts). ``patched``: ids of the norms patched after this call."""
    prefix = {id(m): n for n, m in model.named_modules()}
    plans = []
    for container in model.modules():
        if not isinstance(container, nn.ModuleList):
            continue
        for layer in container:
            children = dict(layer.named_children())
            if not any(id(m) in norms for c in children.values() for m in wrapped_copies(c)):
                continue
            plans.append(_plan(prefix[id(layer)], layer, children, patched))
    return plans


def _plan(name: str, layer: nn.Module, children: dict[str, nn.Module], patched: set[int]) -> LayerPlan:
    if is_fused(layer):
        return LayerPlan(name, layer, type(layer).lnblocks_fused)
    if "forward" in layer.__dict__ and not hooked_by_accelerate(layer):
        return LayerPlan(name, layer, (), "its forward is replaced on the instance (another patcher or hook)")
    source = read_forward(type(layer))
    if source.fn is None:
        return LayerPlan(name, layer, (), source.reason)
    fused = tuple(
        n
        for n in dict.fromkeys(source.sites)
        if n in children and all(id(m) in patched for m in wrapped_copies(children[n]))
    )
    if fused:
        return LayerPlan(name, layer, fused)
    called = ", ".join(f"self.{n}" for n in dict.fromkeys(source.sites))
    return LayerPlan(name, layer, (), f"the module after each residual add ({called}) is no norm patched by this call")
