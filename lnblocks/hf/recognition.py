"""Which lnblocks spec reproduces a given norm module: ``torch.nn`` norms by type, every other norm class by its math.

HF copies one norm class into every model file, and the copies differ in spelling (``_norm`` helpers, ``type_as``,
``x.float()``, the weight on either side of the multiply, ``eps`` or ``variance_epsilon``) and, where it matters, in
where they round (Llama casts before the weight multiply, OLMo2 after, Gemma adds ``1 + w`` in fp32, T5 casts to a
half-precision weight's dtype). A class is recognised by the *math* of its ``forward`` (and the helpers it calls):
``lnblocks.hf.norm_trace`` reads it into a dataflow graph and ``lnblocks.hf.norm_graph``'s rules reduce every
equivalent spelling to one (each rule keeps every rounding where it was), and the graph is compared with the graph
of each math lnblocks computes (``lnblocks.hf.norm_match``, in the same notation). A class whose graph differs in any op
is not matched, and the report names the op where it departs from the nearest one (Liger's OLMo2 patch used the
Llama cast order; ``HYV4UnweightedRMSNorm`` returns the inverse RMS itself).

Each template's spec is a preset of the one family table (``lnblocks.norms.MODEL_FAMILIES``) where the family has a
row; the instance gives eps (read live from its attribute), which parameters exist, the group size of a grouped norm
and the gate's activation.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from torch import nn

from lnblocks.hf.norm_graph import Unsupported
from lnblocks.hf.norm_match import TEMPLATES, ClassWorld, class_defs, match, method_def, probe, traces_of
from lnblocks.hf.norm_trace import Trace
from lnblocks.norms import NORM_PRESETS, LayerNormSpec, Norm, NormSpec, RMSNormSpec, norm_spec

TorchRoute = Literal["lnblocks", "fp32_input", "class"]
_MEMORY_EFFICIENT_KINDS = ("layernorm", "rmsnorm", "l2norm")
_NORM_LIKE = re.compile(r"norm", re.IGNORECASE)
_TORCH_OTHER_NORMS = (nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)
__all__ = ["NormMath", "Recognition", "analyse", "math_of_class", "probe", "recognise"]


@dataclass(frozen=True)
class NormMath:
    """The exact math of a recognised norm class, as an lnblocks spec recipe.

    ``preset``: the spec of the math (its eps, parameters, groups and activation are the instance's, see ``spec``).
    ``eps_attr``: the attribute holding eps on the live module (``variance_epsilon`` or ``eps``), read at every call;
    None when the class writes eps as a constant (``fixed_eps``). ``fp32_only``: the class hard-codes fp32 as its
    compute dtype, so fp64 inputs run the original forward. ``torch_route``: how the PyTorch backend reproduces the
    class bit for bit: ``"lnblocks"`` (the lnblocks norm as it is), ``"fp32_input"`` (the lnblocks norm on the input
    cast to fp32, the result cast back: OLMo) or ``"class"`` (the class's own ops: its backward rounds differently
    from every lnblocks reference, e.g. ``torch.pow(v, -0.5)`` for ``rsqrt``). ``params``: the parameters the class
    reads. ``group``: ``(attribute, "size" | "count")`` of a grouped norm. ``guards``: what the math was read with of
    the instance (its parameters, the attributes a branch or an activation name read); ``checks``: those the patched
    forward compares at each call (all but the parameters, which the lnblocks norm checks itself): an instance that
    no longer has them runs the class.
    ``weight_upcast``: the class casts its parameters to fp32, so fp64 parameters run the class. ``input_ndim``: the
    class branches on the input's rank and the math holds for this rank only. ``gate_optional``: a gated class that
    also runs without a gate. ``shape_from``: where the normalised shape comes from (``"input"``: the last dim of
    each call, for parameter-free classes that store no shape).
    """

    preset: NormSpec
    origin: str
    eps_attr: str | None = "eps"
    fixed_eps: float | None = None
    fp32_only: bool = False
    torch_route: TorchRoute = "lnblocks"
    params: tuple[str, ...] = ("weight",)
    group: tuple[str, str] | None = None
    activation: str | None = None
    guards: tuple[tuple[str, Any], ...] = ()
    checks: tuple[tuple[str, Any], ...] = ()
    weight_upcast: bool = False
    input_ndim: int | None = None
    gate_optional: bool = False
    shape_from: Literal["weight", "normalized_shape", "input"] = "weight"

    kind = property(lambda self: self.preset.kind)
    cast = property(lambda self: getattr(self.preset, "cast", "fp32"))
    zero_centered = property(lambda self: getattr(self.preset, "zero_centered", False))

    def spec(self, module: nn.Module, backend: str, memory_efficient: bool = False) -> NormSpec:
        """The spec of ``module`` (eps, parameters, groups, activation read from the instance)."""
        fields: dict[str, Any] = {"backend": backend}
        names = self.preset.field_names()
        if "eps" in names:
            eps = self.fixed_eps if self.eps_attr is None else getattr(module, self.eps_attr)
            fields["eps"] = None if eps is None else float(eps)
        weight = module._parameters.get("weight")
        if "elementwise_affine" in names:
            fields["elementwise_affine"] = weight is not None
        if "bias" in names and self.kind == "layernorm":
            fields["bias"] = module._parameters.get("bias") is not None
        if "per_head" in names and weight is not None and weight.dim() > 1:
            fields["per_head"] = True  # a (heads, head_dim) weight over (..., heads, head_dim): Cohere's qk-norm
        if self.group is not None:
            fields["group_size"] = self.group_size(module)
        if self.activation is not None:
            fields["activation"] = self.activation
        if memory_efficient and self.kind in _MEMORY_EFFICIENT_KINDS and backend != "torch":
            fields["memory_efficient"] = True
        return self.preset.replace(**fields)

    def group_size(self, module: nn.Module) -> int:
        attr, mode = self.group
        value = getattr(module, attr)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(module).__name__}.{attr} = {value!r}: expected a positive int")
        if mode == "size":
            return value
        n = module._parameters["weight"].shape[-1]
        if n % value:
            raise ValueError(f"{type(module).__name__}.{attr} = {value} does not divide the width {n}")
        return n // value

    def normalized_shape(self, module: nn.Module) -> tuple[int, ...] | None:
        if self.shape_from == "normalized_shape":
            return tuple(module.normalized_shape)
        if self.shape_from == "input":
            return None
        return tuple(module.weight.shape)

    def describe(self, spec: NormSpec) -> str:
        """The report's one-line form of ``spec``, e.g. ``rmsnorm(cast=llama, eps=1e-06)``."""
        groups = ", per_head" if getattr(spec, "per_head", False) else ""
        if getattr(spec, "group_size", None) is not None:
            groups = f", group_size={spec.group_size}"
        route = {"lnblocks": "", "fp32_input": ", on fp32 input", "class": ", torch backend: the class's ops"}
        route_note = route[self.torch_route]
        if spec.kind == "layernorm":
            bias = "" if spec.bias else ", bias=False"
            affine = "" if spec.elementwise_affine else ", affine=False"
            cast = "" if spec.cast == "fp32" else f", cast={spec.cast}"
            zc = ", 1+w" if spec.zero_centered else ""
            return f"layernorm(eps={spec.eps:g}{bias}{affine}{cast}{zc}{groups}{route_note})"
        if spec.kind == "l2norm":
            return f"l2norm(reduction={spec.reduction}, eps={spec.eps:g}{route_note})"
        if spec.kind == "gated_rmsnorm":
            return (
                f"gated_rmsnorm(gate={spec.gate}, activation={spec.activation}, cast={spec.cast}, "
                f"eps={spec.eps:g}{groups}{route_note})"
            )
        eps = "finfo" if spec.eps is None else f"{spec.eps:g}"
        zc = ", 1+w" if spec.zero_centered else ""
        return f"rmsnorm(cast={spec.cast}{zc}, eps={eps}{groups}{route_note})"


@dataclass(frozen=True)
class Recognition:
    """``math`` when lnblocks can reproduce the module; else ``status`` ("skipped"/"unknown") and ``reason``."""

    math: NormMath | None
    status: str = ""
    reason: str = ""


def _math_from(name: str, traces: dict[str, Trace]) -> NormMath:
    tpl = TEMPLATES[name]
    preset = NORM_PRESETS[tpl.preset] if isinstance(tpl.preset, str) else norm_spec(dict(tpl.preset))
    t = next(iter(traces.values()))
    eps_attrs = set().union(*(tr.eps_attrs for tr in traces.values()))
    if len(eps_attrs) > 1:
        raise Unsupported(f"it reads eps from two attributes ({', '.join(sorted(eps_attrs))})")
    activations = set().union(*(tr.activations for tr in traces.values()))
    if len(activations) > 1:
        raise Unsupported(f"it applies two activations ({', '.join(sorted(activations))})")
    guards = {k: v for tr in traces.values() for k, v in tr.guards.items()}
    notes = set().union(*(tr.notes for tr in traces.values()))
    params = sorted(k for k, v in guards.items() if v == "param")
    fields: dict[str, Any] = {
        "preset": preset,
        "origin": tpl.origin,
        "eps_attr": next(iter(eps_attrs), None),
        "fp32_only": True,  # every template hard-codes fp32
        "params": tuple(params),
        "group": t.group,
        "activation": next(iter(activations), None),
        "guards": tuple(sorted(guards.items(), key=lambda kv: kv[0])),
        "checks": tuple(sorted(((k, v) for k, v in guards.items() if v != "param"), key=lambda kv: kv[0])),
        "weight_upcast": "weight_upcast" in notes,
        "input_ndim": t.rank,
        "gate_optional": "nogate" in traces,
        "shape_from": "weight" if "weight" in params else "input",
        "torch_route": "class" if "pow_rsqrt" in notes else "lnblocks",
    }
    fields.update(dict(tpl.extra))
    if fields["torch_route"] == "lnblocks" and "pow_rsqrt" in notes:
        fields["torch_route"] = "class"
    return NormMath(**fields)


def analyse(cls: type, module: nn.Module | None = None, params: tuple[str, ...] = ("weight",)) -> NormMath | str:
    """The math of ``cls`` for the instance ``module`` (its parameters and attributes decide branches), or why not;
    without an instance, for one with the parameters ``params`` (and no branch on an attribute)."""
    cache = _ANALYSES.setdefault(cls, [])
    for guards, result in cache:
        if module is not None and all(probe(module, k) == v for k, v in guards):
            return result
    defs = class_defs(functools.partial(method_def, cls))
    if defs is None:
        return "its forward is not readable Python code"
    world = ClassWorld(cls, module, params)
    try:
        traces = traces_of(defs, world)
        found = match(traces)
        if found is None:
            result: NormMath | str = "its forward computes no norm math lnblocks knows"
        elif found[1]:
            result = f"departs from {TEMPLATES[found[0]].origin} at {found[1]}"
        else:
            result = _math_from(found[0], traces)
            if result.group is not None and module is not None:  # the group size read now: a new one runs the class
                attr = result.group[0]
                guard = (attr, probe(module, attr))
                result = replace(result, guards=(*result.guards, guard), checks=(*result.checks, guard))
    except Unsupported as err:
        result = f"its forward cannot be read as norm math: {err}"
        traces = {}
    except (RecursionError, TypeError, ValueError, AttributeError, KeyError, IndexError) as err:  # code it misreads
        result = f"its forward cannot be read as norm math ({type(err).__name__}: {err})"
        traces = {}
    if module is not None:
        guards = {k: v for tr in traces.values() for k, v in tr.guards.items()}
        cache.append((tuple(guards.items()), result))
    return result


_ANALYSES: dict[type, list[tuple[tuple[tuple[str, Any], ...], NormMath | str]]] = {}


def math_of_class(cls: type, params: tuple[str, ...] = ("weight",)) -> NormMath | None:
    """The math of a norm class with the parameters ``params`` whose forward branches on no other instance attribute
    (``LlamaRMSNorm``, ``MambaRMSNormGated``), else None."""
    result = analyse(cls, None, params)
    return result if isinstance(result, NormMath) else None


def recognise(module: nn.Module) -> Recognition | None:
    """What lnblocks can do with ``module``: a ``NormMath``, a reason to leave it, or None if it is no norm."""
    cls = type(module)
    if isinstance(module, Norm):
        return Recognition(None, "skipped", "already an lnblocks norm")
    if isinstance(module, nn.LayerNorm) and cls.forward is nn.LayerNorm.forward:
        return Recognition(_torch_math(LayerNormSpec(), "torch.nn.LayerNorm"))
    if isinstance(module, nn.RMSNorm) and cls.forward is nn.RMSNorm.forward:
        return Recognition(_torch_math(RMSNormSpec(), "torch.nn.RMSNorm"))
    if isinstance(module, _TORCH_OTHER_NORMS):
        return Recognition(None, "skipped", f"torch.nn.{cls.__name__}: lnblocks.hf replaces LayerNorm/RMSNorm only")
    if next(iter(module.children()), None) is not None:
        return None  # norms are leaves; a block that merely has "Norm" in its name is not one
    norm_like = _NORM_LIKE.search(cls.__name__) is not None or isinstance(module, (nn.LayerNorm, nn.RMSNorm))
    if not norm_like and "forward" not in cls.__dict__:
        return None
    result = analyse(cls, module)
    if isinstance(result, str):
        if not norm_like:
            return None
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            base = "LayerNorm" if isinstance(module, nn.LayerNorm) else "RMSNorm"
            result = f"subclass of torch.nn.{base} with its own forward: {result}"
        return Recognition(None, "unknown", result)
    return _check_instance(module, result)


def _torch_math(preset: NormSpec, origin: str) -> NormMath:
    return NormMath(preset, origin, params=("weight", "bias"), shape_from="normalized_shape")


def _check_instance(module: nn.Module, math: NormMath) -> Recognition:
    """The instance has what the math reads: exactly its parameters, of one shape, and its eps attribute."""
    present = {k for k, p in module._parameters.items() if p is not None}
    if present != set(math.params):
        return Recognition(
            None, "unknown", f"{math.origin}, but its parameters {sorted(present)} are not {list(math.params)}"
        )
    shapes = {tuple(module._parameters[p].shape) for p in math.params}
    if len(shapes) > 1 or any(not s for s in shapes):
        return Recognition(None, "unknown", f"{math.origin}, but its parameters have shapes {sorted(shapes)}")
    if math.eps_attr is not None and not hasattr(module, math.eps_attr):
        return Recognition(None, "unknown", f"{math.origin} but the instance has no {math.eps_attr!r} attribute")
    if math.shape_from == "normalized_shape":
        shape = getattr(module, "normalized_shape", None)
        if not (isinstance(shape, tuple) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
            return Recognition(None, "unknown", f"{math.origin}, but normalized_shape {shape!r} is no shape")
    return Recognition(math)
