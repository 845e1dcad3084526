"""Which lnblocks spec reproduces a given norm module: ``torch.nn`` norms by type, HF norm classes by their math.

HF copies one RMSNorm class into every model file (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen3RMSNorm``, ...), and
the copies differ only in where they round (Llama casts before the weight multiply, OLMo2 after, Gemma adds ``1 + w``
in fp32, T5 casts to a half-precision weight's dtype). A class is therefore recognised by the *code* of its
``forward`` (and the helpers it calls), compared as a normalised syntax tree with the four known variants below: a
class whose math differs in any op is not matched, and is reported instead of being patched with the wrong rounding
(Liger's OLMo2 patch used the Llama cast order; Gemma4's norm looks like Gemma's but has no ``1 + w``).

Two LayerNorm classes are recognised the same way: OLMo's non-parametric ``OlmoLayerNorm`` (``F.layer_norm`` of the
input cast to fp32, eps 1e-5 in the code, arXiv 2402.00838) and Cohere's ``CohereLayerNorm`` (mean, centred variance
and the weight multiply written out in fp32, no bias).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import nn

from lnblocks.norms import MODEL_FAMILIES, NORM_PRESETS, LayerNormSpec, Norm, NormSpec, RMSNormSpec
from lnblocks.norms.spec import CastMode


@dataclass(frozen=True)
class NormMath:
    """The exact math of a recognised norm class, as an lnblocks spec recipe.

    ``eps_attr``: the attribute holding eps on the live module (``variance_epsilon`` or ``eps``), read at every call;
    None when the class writes eps as a constant (``fixed_eps``).
    ``fp32_only``: the class hard-codes ``torch.float32`` as its compute dtype, so fp64 inputs run the original
    forward (lnblocks would compute them in fp64, which is more accurate but not the same numbers).
    ``torch_route``: how the PyTorch backend reproduces the class bit for bit: ``"lnblocks"`` (the lnblocks norm as
    it is), ``"fp32_input"`` (the lnblocks norm on the input cast to fp32, the result cast back: OLMo) or
    ``"class"`` (the class's own ops: Cohere writes LayerNorm out op by op, which no lnblocks reference reproduces
    to the bit). The fused kernels compute every variant in fp32 with one rounding at the end.
    ``params``: the parameters the class must have (each 1-D).
    """

    kind: Literal["layernorm", "rmsnorm"]
    origin: str
    eps_attr: str | None = "eps"
    cast: CastMode = "fp32"
    zero_centered: bool = False
    fp32_only: bool = False
    fixed_eps: float | None = None
    torch_route: Literal["lnblocks", "fp32_input", "class"] = "lnblocks"
    params: tuple[str, ...] = ("weight",)

    def spec(self, module: nn.Module, backend: str) -> NormSpec:
        """The spec of ``module`` (eps, affine and bias read from the instance)."""
        eps = self.fixed_eps if self.eps_attr is None else getattr(module, self.eps_attr)
        weight = module._parameters.get("weight")
        if self.kind == "layernorm":
            return LayerNormSpec(
                eps=float(eps),
                elementwise_affine=weight is not None,
                bias=module._parameters.get("bias") is not None,
                backend=backend,
            )
        return RMSNormSpec(
            eps=None if eps is None else float(eps),
            elementwise_affine=weight is not None,
            cast=self.cast,
            zero_centered=self.zero_centered,
            backend=backend,
        )

    def normalized_shape(self, module: nn.Module) -> tuple[int, ...]:
        if self.origin.startswith("torch.nn.") or not self.params:
            return tuple(module.normalized_shape)
        return (module.weight.shape[-1],)  # HF classes reduce over the last dim: `.mean(-1, keepdim=True)`

    def describe(self, spec: NormSpec) -> str:
        if self.kind == "layernorm":
            bias = "" if spec.bias else ", bias=False"
            affine = "" if spec.elementwise_affine else ", affine=False"
            route = {"lnblocks": "", "fp32_input": ", on fp32 input", "class": ", torch backend: the class's ops"}
            return f"layernorm(eps={spec.eps:g}{bias}{affine}{route[self.torch_route]})"
        eps = "finfo" if spec.eps is None else f"{spec.eps:g}"
        zc = ", 1+w" if spec.zero_centered else ""
        return f"rmsnorm(cast={spec.cast}{zc}, eps={eps})"


@dataclass(frozen=True)
class Recognition:
    """``math`` when lnblocks can reproduce the module; else ``status`` ("skipped"/"unknown") and ``reason``."""

    math: NormMath | None
    status: str = ""
    reason: str = ""


# ---- the four HF RMSNorm variants, as code shapes (variable names and annotations do not matter) ----------------
_LLAMA = """
def forward(self, x):
    dtype = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + self.{eps})
    return self.weight * x.to(dtype)
"""
_OLMO2 = """
def forward(self, x):
    dtype = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + self.{eps})
    return (self.weight * x).to(dtype)
"""
_GEMMA = """
def forward(self, x):
    out = self._norm(x.float())
    out = out * (1.0 + self.weight.float())
    return out.type_as(x)

def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.{eps})
"""
_T5 = """
def forward(self, x):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + self.{eps})
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        x = x.to(self.weight.dtype)
    return self.weight * x
"""
# family (a row of lnblocks.norms.MODEL_FAMILIES) -> the code of its RMSNorm class; the row gives the class name,
# the cast order and the 1 + w of the preset (the other families' classes are copies of one of these four)
_VARIANTS: dict[str, str] = {"llama": _LLAMA, "olmo2": _OLMO2, "gemma": _GEMMA, "t5": _T5}

# LayerNorm classes (no family-table row: their models have no role layout or converter)
_OLMO_LN = """
def forward(self, x):
    dtype = x.dtype
    return F.layer_norm(x.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5).to(dtype)
"""
_COHERE_LN = """
def forward(self, x):
    dtype = x.dtype
    x = x.to(torch.float32)
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    x = (x - mean) * torch.rsqrt(var + self.{eps})
    x = self.weight.to(torch.float32) * x
    return x.to(dtype)
"""
_LAYERNORM_VARIANTS: dict[str, tuple[str, NormMath]] = {
    "olmo": (
        _OLMO_LN,
        NormMath(
            kind="layernorm",
            origin="OlmoLayerNorm math",
            eps_attr=None,
            fixed_eps=1e-5,
            fp32_only=True,
            torch_route="fp32_input",
            params=(),
        ),
    ),
    "cohere": (
        _COHERE_LN,
        NormMath(kind="layernorm", origin="CohereLayerNorm math", fp32_only=True, torch_route="class"),
    ),
}
_NORM_LIKE = re.compile(r"norm", re.IGNORECASE)
_TORCH_OTHER_NORMS = (nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)


class _Canonical(ast.NodeTransformer):
    """Renames arguments and locals to ``v0, v1, ...`` in order of appearance and drops annotations."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name == "self":
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return ast.arg(arg=self._rename(node.arg))

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if isinstance(node.ctx, ast.Store) or node.id in self.names:
            return ast.Name(id=self._rename(node.id), ctx=node.ctx)
        return node  # a global: torch, nn, F

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        value = self.visit(node.value) if node.value is not None else ast.Constant(None)
        return ast.Assign(targets=[self.visit(node.target)], value=value)


def _canonical(fn: ast.FunctionDef) -> str:
    fn = copy.deepcopy(fn)
    if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
        fn.body = fn.body[1:] or [ast.Pass()]  # docstring
    fn.decorator_list, fn.returns = [], None
    fn = _Canonical().visit(fn)
    return ast.dump(fn, annotate_fields=False, include_attributes=False)


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


def _fingerprint(get_def: Callable[[str], ast.FunctionDef | None]) -> tuple[tuple[str, str], ...] | None:
    """Canonical code of ``forward`` and of every helper it calls on ``self`` (transitively); None if one is missing."""
    seen: dict[str, str] = {}
    todo = ["forward"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        fn = get_def(name)
        if fn is None:
            return None
        seen[name] = _canonical(fn)
        todo.extend(_self_calls(fn))
    return tuple(sorted(seen.items()))


@functools.cache
def _templates() -> dict[tuple[tuple[str, str], ...], NormMath]:
    table = {}
    for family, source in _VARIANTS.items():
        preset = NORM_PRESETS[family]
        if not isinstance(preset, RMSNormSpec):
            raise RuntimeError(f"MODEL_FAMILIES[{family!r}].norm must be an rmsnorm, got {preset.kind!r}")
        for eps_attr in ("variance_epsilon", "eps"):
            tree = ast.parse(textwrap.dedent(source.format(eps=eps_attr)))
            defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
            math = NormMath(
                kind="rmsnorm",
                origin=f"{MODEL_FAMILIES[family].hf_norm_class} math",
                eps_attr=eps_attr,
                cast=preset.cast,
                zero_centered=preset.zero_centered,
                fp32_only=True,
            )
            table[_fingerprint(defs.get)] = math
    for source, base in _LAYERNORM_VARIANTS.values():
        for eps_attr in ("variance_epsilon", "eps") if base.eps_attr else (None,):
            tree = ast.parse(textwrap.dedent(source.format(eps=eps_attr)))
            defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
            table[_fingerprint(defs.get)] = dataclasses.replace(base, eps_attr=eps_attr)
    return table


def _method_def(cls: type, name: str) -> ast.FunctionDef | None:
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


@functools.cache
def math_of_class(cls: type) -> NormMath | None:
    """The math of an HF-style RMSNorm class whose forward is code-identical to a known variant, else None."""
    fingerprint = _fingerprint(functools.partial(_method_def, cls))
    return None if fingerprint is None else _templates().get(fingerprint)


def recognise(module: nn.Module) -> Recognition | None:
    """What lnblocks can do with ``module``: a ``NormMath``, a reason to leave it, or None if it is no norm."""
    cls = type(module)
    if isinstance(module, Norm):
        return Recognition(None, "skipped", "already an lnblocks norm")
    if isinstance(module, nn.LayerNorm) and cls.forward is nn.LayerNorm.forward:
        return Recognition(NormMath(kind="layernorm", origin="torch.nn.LayerNorm"))
    if isinstance(module, nn.RMSNorm) and cls.forward is nn.RMSNorm.forward:
        return Recognition(NormMath(kind="rmsnorm", origin="torch.nn.RMSNorm"))
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        base = "LayerNorm" if isinstance(module, nn.LayerNorm) else "RMSNorm"
        return Recognition(None, "unknown", f"subclass of torch.nn.{base} with its own forward: math not verified")
    if isinstance(module, _TORCH_OTHER_NORMS):
        return Recognition(None, "skipped", f"torch.nn.{cls.__name__}: lnblocks.hf replaces LayerNorm/RMSNorm only")
    if next(iter(module.children()), None) is not None:
        return None  # norms are leaves; a block that merely has "Norm" in its name is not one
    math = math_of_class(cls)
    if math is None:
        if _NORM_LIKE.search(cls.__name__):
            return Recognition(None, "unknown", "norm-like class whose forward matches no known norm math")
        return None
    params = module._parameters
    if set(params) != set(math.params) or any(params[p] is None or params[p].dim() != 1 for p in math.params):
        want = f"one 1-D {' and '.join(math.params)}" if math.params else "none"
        return Recognition(None, "unknown", f"{math.origin}, but its parameters {sorted(params)} are not {want}")
    if math.eps_attr is not None and not hasattr(module, math.eps_attr):
        return Recognition(None, "unknown", f"{math.origin} but the instance has no {math.eps_attr!r} attribute")
    if not math.params:
        shape = getattr(module, "normalized_shape", None)
        if not (isinstance(shape, tuple) and len(shape) == 1 and isinstance(shape[0], int) and shape[0] > 0):
            return Recognition(None, "unknown", f"{math.origin}, but normalized_shape {shape!r} is not (dim,)")
    return Recognition(math)
