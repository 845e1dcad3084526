"""The math lnblocks computes, written as templates in the notation of the traced graphs, and the matching of a
class's traced forward against them (``lnblocks.hf.recognition`` turns a match into a ``NormMath``).

Each template is a forward over ``x`` (and a gate), ``self.weight``/``self.bias`` and ``self.eps``, mirroring the
op order of ``lnblocks.norms.functional`` for one spec; it is traced with the parameters the class has (present or
None), and its graph compared with the class's for each call form (``forward(x)``; ``forward(x, gate)`` and, with a
default gate of None, without one). Where none matches, the nearest template names the op where the class departs.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lnblocks.hf.norm_graph import Node, Unsupported, canonical, ordered_args
from lnblocks.hf.norm_names import opaque
from lnblocks.hf.norm_trace import Trace, trace

_RMS = """
def forward(self, x):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).{reduce}(-1, keepdim=True) + self.eps)
    return {out}
"""
_T5 = """
def forward(self, x):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(var + self.eps)
    if self.weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(self.weight.dtype)
    return self.weight * h
"""
_GATED = """
def forward(self, x, gate=None):
    h = x.to(torch.float32)
    if gate is not None and {before}:
        h = h * F.silu(gate.to(torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
    h = {weighted}
    if gate is not None and not {before}:
        h = h * F.silu(gate.to(torch.float32))
    return {out}
"""
_OLMO_LN = """
def forward(self, x):
    return F.layer_norm(x.to(torch.float32), self.normalized_shape, None, None, 1e-5).to(x.dtype)
"""
_COHERE_LN = """
def forward(self, x):
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    var = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(var + self.eps)
    return (self.weight.to(torch.float32) * h).to(x.dtype)
"""
_NEMOTRON_LN = """
def forward(self, x):
    args = _cast_if_autocast_enabled(x.device.type, x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)
    with maybe_autocast(device_type=x.device.type, enabled=False):
        return F.layer_norm(*args)
"""
_NEMOTRON_HELPERS = {  # the transformers helpers NemotronLayerNorm1P calls, by qualified name (not copied)
    "_cast_if_autocast_enabled": opaque("transformers.models.nemotron.modeling_nemotron._cast_if_autocast_enabled"),
    "maybe_autocast": opaque("transformers.utils.generic.maybe_autocast"),
}


@dataclass(frozen=True)
class Template:
    source: str
    preset: str | dict  # a row of the family table, or a spec dict
    origin: str
    extra: tuple[tuple[str, Any], ...] = ()  # further NormMath fields
    globals_: tuple[tuple[str, Any], ...] = ()


def _gated(before: bool, cast: str) -> str:
    weighted = "self.weight * h.to(x.dtype)" if cast == "llama" else "self.weight * h"
    out = "h" if (before and cast == "llama") else "h.to(x.dtype)"
    return _GATED.format(before=before, weighted=weighted, out=out)


TEMPLATES: dict[str, Template] = {
    "llama": Template(_RMS.format(reduce="mean", out="self.weight * h.to(x.dtype)"), "llama", "LlamaRMSNorm math"),
    "olmo2": Template(_RMS.format(reduce="mean", out="(self.weight * h).to(x.dtype)"), "olmo2", "Olmo2RMSNorm math"),
    "gemma": Template(
        _RMS.format(reduce="mean", out="(h * (1.0 + self.weight.to(torch.float32))).to(x.dtype)"),
        "gemma",
        "GemmaRMSNorm math",
    ),
    "t5": Template(_T5, "t5", "T5LayerNorm math"),
    "l2_mean": Template(_RMS.format(reduce="mean", out="h.to(x.dtype)"), "llama4_qk", "Llama4TextL2Norm math"),
    "l2_sum": Template(
        _RMS.format(reduce="sum", out="h.to(x.dtype)"),
        {"kind": "l2norm", "eps": 1e-6, "reduction": "sum"},
        "L2Norm(reduction='sum') math",
    ),
    "gated_before_llama": Template(_gated(True, "llama"), "mamba2_gated", "MambaRMSNormGated math"),
    "gated_before_fp32": Template(
        _gated(True, "fp32"), {"kind": "gated_rmsnorm", "gate": "before", "cast": "fp32"}, "gated RMSNorm math"
    ),
    "gated_after_llama": Template(_gated(False, "llama"), "qwen3_next_gated", "Qwen3NextRMSNormGated math"),
    "gated_after_fp32": Template(_gated(False, "fp32"), "falcon_h1_gated", "FalconH1RMSNormGated math"),
    "olmo_ln": Template(
        _OLMO_LN,
        {"kind": "layernorm", "eps": 1e-5, "elementwise_affine": False, "bias": False},
        "OlmoLayerNorm math",
        (("eps_attr", None), ("fixed_eps", 1e-5), ("torch_route", "fp32_input"), ("shape_from", "normalized_shape")),
    ),
    "cohere_ln": Template(_COHERE_LN, "cohere", "CohereLayerNorm math"),
    "nemotron_ln": Template(
        _NEMOTRON_LN,
        "nemotron",
        "NemotronLayerNorm1P math",
        (("shape_from", "normalized_shape"),),
        tuple(_NEMOTRON_HELPERS.items()),
    ),
}
_TEMPLATE_GLOBALS = {"torch": torch, "F": F, "nn": nn, "True": True, "False": False}


class _TemplateWorld:
    """A template's instance: the parameters the traced class has (present or None), nothing else."""

    def __init__(self, params: frozenset[tuple[str, str]], globals_: dict[str, Any]) -> None:
        self.params, self.globals = dict(params), {**_TEMPLATE_GLOBALS, **globals_}

    def kind(self, name: str) -> str:
        return self.params.get(name, "param" if name in ("weight", "bias") else "value")

    def value(self, name: str) -> Any:
        raise Unsupported(f"a template reads self.{name}")

    def resolve(self, name: str) -> Any:
        return self.globals.get(name, getattr(builtins, name, None))


class ClassWorld:
    """A class's instance (its parameters and attributes) and the module globals of its forward; without an instance,
    the parameters named in ``params`` and no attribute values."""

    def __init__(self, cls: type, module: nn.Module | None, params: tuple[str, ...] = ()) -> None:
        self.module, self.params = module, params
        self.globals = getattr(getattr(cls, "forward", None), "__globals__", {})

    def kind(self, name: str) -> str:
        if self.module is None:
            return "param" if name in self.params else "value"
        kind = probe(self.module, name)
        return kind if kind in ("param", "none") else "value"

    def value(self, name: str) -> Any:
        if self.module is None:
            raise Unsupported(f"its math depends on the instance (self.{name})")
        return probe(self.module, name)

    def resolve(self, name: str) -> Any:
        return self.globals.get(name, getattr(builtins, name, None))


def probe(module: nn.Module, name: str) -> Any:
    """What a trace read of ``module.<name>``: ``"param"`` (a Parameter), ``"none"`` (a None or missing parameter or
    attribute), or the attribute's value; the patched forward compares it with the guards at each call."""
    params = module._parameters
    if name in params:
        return "none" if params[name] is None else "param"
    value = getattr(module, name, None)
    if value is None:
        return "none"
    if isinstance(value, torch.Tensor):
        return "tensor"
    return value


def method_def(cls: type, name: str) -> ast.FunctionDef | None:
    """The syntax tree of method ``name`` of ``cls`` if it is Python code outside torch, else None."""
    fn = getattr(cls, name, None)
    if not inspect.isfunction(fn) or fn.__module__.startswith("torch."):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


def _self_calls(fn: ast.FunctionDef) -> set[str]:
    """Names of ``self.<name>(...)`` calls: the helper methods a forward depends on (Gemma's ``_norm``)."""
    return {
        node.func.attr
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    }


def class_defs(get_def) -> dict[str, ast.FunctionDef] | None:
    """``forward`` and every helper it calls on ``self`` (transitively); None without a readable forward."""
    defs: dict[str, ast.FunctionDef] = {}
    todo = ["forward"]
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        fn = get_def(name)
        if fn is None:
            if name == "forward":
                return None
            continue  # not a method (a parameter or submodule call): the trace says so if it matters
        defs[name] = fn
        todo.extend(_self_calls(fn))
    return defs


def _gate_arity(forward: ast.FunctionDef) -> tuple[bool, bool]:
    """``(takes a gate, the gate has a default)`` from ``forward(self, x[, gate])``."""
    n = len(forward.args.args) - 1
    if n < 2:
        return False, False
    return True, len(forward.args.defaults) >= n - 1


def traces_of(defs: dict[str, ast.FunctionDef], world: Any) -> dict[str, Trace]:
    """The traces of the call forms the class has: ``plain``, or ``gate`` (and ``nogate`` with a default None)."""
    gated, optional = _gate_arity(defs["forward"])
    if not gated:
        return {"plain": trace(defs, world, with_gate=False)}
    out = {"gate": trace(defs, world, with_gate=True)}
    if optional:
        with contextlib.suppress(Unsupported):  # a default gate=None the code uses anyway (LaraMini): gate needed
            out["nogate"] = trace(defs, world, with_gate=False)
    return out


@functools.cache
def _template_traces(name: str, params: frozenset[tuple[str, str]]) -> dict[str, Trace] | None:
    """A template's traces for a class with these parameters (present or None); None if it needs another set."""
    tpl = TEMPLATES[name]
    tree = ast.parse(textwrap.dedent(tpl.source))
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    try:
        return traces_of(defs, _TemplateWorld(params, dict(tpl.globals_)))
    except Unsupported:
        return None


def match(traces: dict[str, Trace]) -> tuple[str, str] | None:
    """``(template name, "")`` when every call form matches one template, else ``(nearest, where it differs)``."""
    params = frozenset((k, v) for t in traces.values() for k, v in t.guards.items() if v in ("param", "none"))
    forms = {form: canonical(t.root) for form, t in traces.items()}
    best: tuple[int, str, str] = (-1, "", "")
    for name in TEMPLATES:
        tpl = _template_traces(name, params)
        if tpl is None or set(tpl) < set(traces) or ("gate" in tpl) != ("gate" in traces):
            continue
        if all(canonical(tpl[form].root) == forms[form] for form in traces):
            return name, ""
        form = next(f for f in traces if canonical(tpl[f].root) != forms[f])
        score, where = _first_difference(traces[form].root, tpl[form].root)
        where = where or _SHARING
        if score > best[0]:
            best = (score, name, where)
    return (best[1], best[2]) if best[1] else None


_SHARING = (
    "the same ops, but a value computed once and used twice in one is computed twice in the other (its gradient "
    "is summed in another dtype)"
)


def _first_difference(a: Any, b: Any, skip: int = 1) -> tuple[int, str]:
    """How many nodes of ``a`` match ``b`` before they part (following the better pairing at each op), and where."""
    if not isinstance(a, Node) or not isinstance(b, Node):
        same = not isinstance(a, Node) and not isinstance(b, Node) and a == b
        return (1, "") if same else (0, _where(a, b))
    if a.op != b.op or len(a.args) != len(b.args):
        # one side has an op more (a cast, a multiply): credit what matches below it, report the place here
        if not skip:
            return 0, _where(a, b)
        below = [_first_difference(a, c, 0)[0] for c in b.args] + [_first_difference(c, b, 0)[0] for c in a.args]
        return max(below, default=0), _where(a, b)
    pairs = list(zip(ordered_args(a), ordered_args(b)))
    if a.op in ("mul", "add") and len(a.args) == 2:
        swapped = list(zip(ordered_args(a), reversed(ordered_args(b))))
        pairs = max((pairs, swapped), key=lambda ps: sum(_first_difference(x, y, skip)[0] for x, y in ps))
    total, where = 1, ""
    for x, y in pairs:
        score, w = _first_difference(x, y, skip)
        total += score
        where = where or w
    return total, where


def _where(a: Any, b: Any) -> str:
    def show(v: Any) -> str:
        src = getattr(v, "src", None)
        return f"`{src}`" if src else repr(v)

    return f"{show(a)} where it has {show(b)}"
