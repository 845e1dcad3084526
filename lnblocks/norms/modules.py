"""``nn.Module`` wrappers: parameters, input checks, backend choice, and the fused-residual call convention.

The math lives in ``lnblocks.norms.functional``; the fused kernels in ``lnblocks.kernels``. Every module here accepts
``norm(x)`` -> ``y`` and ``norm(x, residual=r)`` -> ``(y, x + r)``, where ``y = norm(x + r)``: the pre-norm hot path,
which ``backend="triton"`` runs as one kernel.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.compiler import is_compiling, is_dynamo_compiling

from lnblocks.norms import functional as LF
from lnblocks.norms.spec import (
    Backend,
    CastMode,
    DyTSpec,
    LayerNormSpec,
    NoNormSpec,
    NormSpec,
    RMSNormSpec,
    ScaleNormSpec,
)

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Single-threaded CPU inference of half-precision inputs to norms written as several eager ops (RMSNorm, DyT,
# ScaleNorm) runs over blocks of rows of about this many fp32 bytes, so the fp32 intermediates stay in cache instead of
# being fresh multi-MB allocations. Each row sees the same ops, so outputs are bit-identical. benchmarks/README.md has
# the numbers: 1.1-1.7x faster than torch.nn.RMSNorm in bf16 on one thread, slower in fp32 (no upcast copy to save),
# and with 2+ threads the many small ops stall on OpenMP synchronisation, so it is used only where it wins. Not used
# when grads are recorded either: blocking would reorder the weight-grad sum.
CPU_BLOCK_BYTES = 1 << 20


def _is_int(d: object) -> bool:
    return isinstance(d, numbers.Integral) and not isinstance(d, bool)  # numpy ints too, as torch.nn.LayerNorm


def _as_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if _is_int(normalized_shape):
        shape: tuple = (normalized_shape,)
    elif isinstance(normalized_shape, Sequence) and not isinstance(normalized_shape, str):
        shape = tuple(normalized_shape)
    else:
        shape = ()
    if not shape or not all(_is_int(d) for d in shape):
        raise TypeError(f"normalized_shape must be an int or a non-empty sequence of ints, got {normalized_shape!r}")
    shape = tuple(int(d) for d in shape)
    if any(d <= 0 for d in shape):
        raise ValueError(f"normalized_shape must have positive sizes, got {shape}")
    return shape


def _check_float_tensor(name: str, t: object) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


_TORCH, _TRITON = "torch", "triton"
_MISSING = object()
_kernels_functional = None  # lnblocks.kernels.functional, imported on the first fused call (it imports triton)


def _fused_runner():
    global _kernels_functional
    if _kernels_functional is None:
        from lnblocks.kernels import functional

        _kernels_functional = functional
    return _kernels_functional


class Norm(nn.Module):
    """Base class: holds the spec, checks inputs, picks the backend, applies the fused-residual convention.

    ``last_backend`` is the backend of the latest eager call (``"torch"`` or ``"triton"``); ``backend_for(x)``
    says which one a call with ``x`` would use without running it.

    Per-call cost: the full checks and the backend choice run once per (dtype, device kind) of the operands and the
    decision is cached (``_routes``; cleared when parameters move or are replaced); every call still checks the
    shapes, so a wrong shape is an error, never a broadcast (benchmarks/bench_norm_overhead.py: within 1 µs of
    HF's ``LlamaRMSNorm``).
    """

    spec: NormSpec
    _row_blocks_on_cpu: bool = False  # multi-op eager math that gains from running over cache-sized row blocks
    _has_bias: bool = False  # the module registers a ``bias`` (possibly None) that the fused kernel takes

    def __init__(self, normalized_shape: int | Sequence[int] | None, spec: NormSpec) -> None:
        super().__init__()
        # routes[is_cuda][key]: key = x.dtype, or (x.dtype, residual.dtype) with a residual (nested containers keyed
        # by plain objects: a lookup is ~0.1 µs, where a tuple key built per call costs several times that)
        self._routes: tuple[dict, dict] = ({}, {})
        self.spec = spec
        self.normalized_shape = None if normalized_shape is None else _as_shape(normalized_shape)
        shape = self.normalized_shape or ()
        # The per-call shape check of the cached path is `x.shape[-1] != _last_dim` (~0.2 µs); a multi-dim or absent
        # normalized_shape sets it to None, which never matches, so those calls always take the full checks.
        self._last_dim = shape[0] if len(shape) == 1 else None
        self._row_numel = math.prod(shape) if shape else 0
        self.last_backend: str | None = None

    @classmethod
    def from_spec(cls, spec: NormSpec, normalized_shape: int | Sequence[int] | None, **factory: Any) -> Norm:
        """Build the module for ``spec`` (``factory``: ``device``/``dtype`` of the parameters).

        Every subclass's constructor takes its spec's fields as keyword options, so this serves them all.
        """
        options = {k: v for k, v in spec.to_dict().items() if k != "kind"}
        return cls(normalized_shape, **options, **factory)

    def _register_vector(self, name: str, enabled: bool, factory: dict[str, Any]) -> None:
        # Registered as None when disabled, as torch.nn.LayerNorm does, so state_dict keys match torch's.
        param = nn.Parameter(torch.empty(self.normalized_shape, **factory)) if enabled else None
        self.register_parameter(name, param)

    # ---- cached routing: a new spec, and parameters that move or are replaced, invalidate the decisions -----------
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "spec":  # e.g. lnblocks.hf updating eps or backend on a patched module
            self._clear_routes()
        super().__setattr__(name, value)

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        self._clear_routes()
        super().register_parameter(name, param)

    def _apply(self, fn, recurse: bool = True):  # .to(), .cuda(), .half(), ...
        self._clear_routes()
        return super()._apply(fn, recurse)

    def _clear_routes(self) -> None:
        for routes in self.__dict__.get("_routes", ()):
            routes.clear()

    @property
    def backend(self) -> str:
        return self.spec.backend

    # ---- backend choice -------------------------------------------------------------------------------------
    def backend_for(self, x: Tensor, residual: Tensor | None = None) -> str:
        """The backend a call on ``x`` (and ``residual``) runs: ``"torch"`` or ``"triton"``; raises if ``"triton"``
        was asked for and cannot run."""
        if self.spec.backend == "torch" or (self.spec.backend == "auto" and not x.is_cuda):
            return _TORCH
        from lnblocks.kernels import unavailable_reason  # lazy: keeps triton out of `import lnblocks`

        reason = unavailable_reason(self.spec, x, residual=residual, parameters=self.named_parameters())
        if self.spec.backend == "triton":
            if reason is not None:
                raise ValueError(f"backend='triton' cannot run here: {reason}. Use backend='auto' or 'torch'.")
            return _TRITON
        return _TRITON if reason is None else _TORCH

    def _route(self, x: Tensor, residual: Tensor | None) -> tuple[str, Any, Any]:
        """Check the operands fully and decide how calls like this one run: ``(backend, function, fused plan)``.

        Cached per (dtype, is_cuda) of x and residual unless tracing; ``forward`` repeats only the shape checks.
        """
        self._check_inputs(x, residual)
        backend = self.backend_for(x, residual)
        if backend == _TRITON:
            weight = self.weight
            plan = _fused_runner().plan_for(
                self.spec,
                x.dtype,
                None if residual is None else residual.dtype,
                None if weight is None else weight.dtype,
            )
            route = (_TRITON, _fused_runner().run_fused, plan)
        elif residual is not None:
            route = (_TORCH, self._add_and_normalize, None)
        elif self._row_blocks_on_cpu and not x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            route = (_TORCH, self._normalize_rows, None)
        else:
            route = (_TORCH, self._normalize, None)
        if not is_compiling() and self._last_dim is not None:  # (see __init__: no fast path without one)
            key = x.dtype if residual is None else (x.dtype, residual.dtype)
            self._routes[x.is_cuda][key] = route
        return route

    # ---- forward ---------------------------------------------------------------------------------------------
    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if is_dynamo_compiling():  # (a plain `return False` in eager: the cheapest such test)
            backend, fn, plan = self._route(x, residual)  # traced as written; nothing cached in a graph
        else:
            try:  # the cached decision for this kind of call, and the shape checks every call needs
                if residual is None:
                    backend, fn, plan = self._routes[x.is_cuda][x.dtype]
                else:
                    backend, fn, plan = self._routes[x.is_cuda][x.dtype, residual.dtype]
                    if residual.shape != x.shape:
                        raise LookupError  # no broadcasting: let the full checks name the shapes
                if x.shape[-1] != self._last_dim:
                    raise LookupError
            except (LookupError, AttributeError):  # first call of its kind, a wrong shape, or not a tensor
                backend, fn, plan = self._route(x, residual)  # full checks: raises the error that names the problem
            self.__dict__["last_backend"] = backend  # a plain attribute; skips nn.Module.__setattr__'s checks
        if plan is not None:
            return fn(plan, x, residual, self.weight, self.bias if self._has_bias else None, self._row_numel)
        return fn(x) if residual is None else fn(x, residual)

    def _add_and_normalize(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        new_residual = LF.add_residual(x, residual, self.spec.residual_in_fp32)
        y = self._normalize_rows(new_residual)
        if self.spec.residual_in_fp32:
            y = y.to(self.output_dtype(x.dtype))  # the fp32 stream does not change what the branch sees
        return y, new_residual

    def _normalize(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _normalize_rows(self, x: Tensor) -> Tensor:
        """``_normalize``, over cache-sized row blocks in single-threaded CPU inference (same ops per row)."""
        if not self._row_blocks_on_cpu or self._row_numel == 0:
            return self._normalize(x)
        block_rows = max(1, CPU_BLOCK_BYTES // (4 * self._row_numel))
        if (
            x.numel() <= 2 * block_rows * self._row_numel  # small inputs first: the cheapest test
            or x.device.type != "cpu"
            or x.dtype not in (torch.float16, torch.bfloat16)
            or torch.compiler.is_compiling()
            or torch.get_num_threads() != 1
            or (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())))
        ):
            return self._normalize(x)
        k = len(self.normalized_shape)
        rows = x.reshape(-1, *self.normalized_shape)  # (M, *normalized_shape)
        y = torch.cat([self._normalize(block) for block in rows.split(block_rows)])
        return y.reshape(*x.shape[:-k], *y.shape[1:])

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """The dtype ``norm(x)`` returns for an input of ``input_dtype`` (the input dtype unless a cast order says)."""
        return input_dtype

    def _check_inputs(self, x: Tensor, residual: Tensor | None) -> None:
        _check_float_tensor("x", x)
        if self.normalized_shape is not None:
            k = len(self.normalized_shape)
            if x.dim() < k or tuple(x.shape[-k:]) != self.normalized_shape:
                raise ValueError(
                    f"x: expected trailing dimension(s) {self.normalized_shape} (normalized_shape), "
                    f"got shape {tuple(x.shape)}"
                )
        if residual is not None:
            _check_float_tensor("residual", residual)
            if residual.shape != x.shape:
                raise ValueError(
                    f"residual: expected the same shape as x {tuple(x.shape)}, got {tuple(residual.shape)} "
                    "(no broadcasting)"
                )
            if residual.device != x.device:
                raise ValueError(f"residual: expected device {x.device}, got {residual.device}")

    def extra_repr(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.spec.to_dict().items() if k != "kind")
        return f"{self.normalized_shape}, {fields}"


class LayerNorm(Norm):
    """LayerNorm with ``torch.nn.LayerNorm``'s constructor meaning and ``state_dict`` keys (``weight``, ``bias``).

    Extra keyword options: ``zero_centered`` (store ``w``, apply ``1 + w`` in fp32; TransformerEngine),
    ``residual_in_fp32`` and ``backend`` (see ``NormSpec``).
    """

    spec: LayerNormSpec
    _has_bias = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        zero_centered: bool = False,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = LayerNormSpec(
            eps=eps,
            elementwise_affine=elementwise_affine,
            bias=bias,
            zero_centered=zero_centered,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        factory = {"device": device, "dtype": dtype}
        self._register_vector("weight", elementwise_affine, factory)
        self._register_vector("bias", elementwise_affine and bias, factory)
        self.reset_parameters()

    eps = property(lambda self: self.spec.eps)
    elementwise_affine = property(lambda self: self.spec.elementwise_affine)
    zero_centered = property(lambda self: self.spec.zero_centered)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight) if self.spec.zero_centered else nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _normalize(self, x: Tensor) -> Tensor:
        params = self._parameters  # see RMSNorm._normalize
        w, b = params.get("weight", _MISSING), params.get("bias", _MISSING)
        if w is _MISSING or b is _MISSING:
            w, b = self.weight, self.bias
        s = self.spec
        return LF.layer_norm(x, self.normalized_shape, w, b, s.eps, s.zero_centered)


class RMSNorm(Norm):
    """RMSNorm with ``torch.nn.RMSNorm``'s constructor meaning and ``state_dict`` key (``weight``).

    ``cast`` selects the HF cast order (``"fp32"`` = torch/OLMo2/Gemma, ``"llama"``, ``"t5"``; see ``RMSNormSpec``);
    ``zero_centered`` stores ``w`` and applies ``1 + w`` in fp32 (Gemma, TransformerEngine).
    """

    spec: RMSNormSpec
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        cast: CastMode = "fp32",
        zero_centered: bool = False,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = RMSNormSpec(
            eps=eps,
            elementwise_affine=elementwise_affine,
            cast=cast,
            zero_centered=zero_centered,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        factory = {"device": device, "dtype": dtype}
        self._register_vector("weight", elementwise_affine, factory)
        self.reset_parameters()

    eps = property(lambda self: self.spec.eps)
    elementwise_affine = property(lambda self: self.spec.elementwise_affine)
    zero_centered = property(lambda self: self.spec.zero_centered)
    cast = property(lambda self: self.spec.cast)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight) if self.spec.zero_centered else nn.init.ones_(self.weight)

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        weight = self.weight
        return LF.output_dtype("rmsnorm", self.spec.cast, input_dtype, None if weight is None else weight.dtype)

    def _normalize(self, x: Tensor) -> Tensor:
        # The registered parameter straight from _parameters: `self.weight` goes through nn.Module.__getattr__, about
        # 0.5 µs a call (per-call overhead, benchmarks/bench_norm_overhead.py). A weight that is not a registered
        # parameter (torch.nn.utils.parametrize, FSDP's plain-tensor views) is read the usual way.
        w = self._parameters.get("weight", _MISSING)
        if w is _MISSING:
            w = self.weight
        s = self.spec
        return LF.rms_norm(x, self.normalized_shape, w, s.eps, s.cast, s.zero_centered)


class DyT(Norm):
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``; a norm-free drop-in for LayerNorm.

    Parameters: ``alpha`` (scalar, init ``alpha_init``), ``weight`` (ones) and ``bias`` (zeros) over
    ``normalized_shape``.
    """

    spec: DyTSpec
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        alpha_init: float = 0.5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = DyTSpec(
            alpha_init=alpha_init,
            elementwise_affine=elementwise_affine,
            bias=bias,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        factory = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.empty(1, **factory))
        self._register_vector("weight", elementwise_affine, factory)
        self._register_vector("bias", elementwise_affine and bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.spec.alpha_init)
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _normalize(self, x: Tensor) -> Tensor:
        return LF.dyt(x, self.alpha, self.weight, self.bias)


class ScaleNorm(Norm):
    """ScaleNorm (Nguyen & Salazar 2019): ``scale * x / max(||x||_2, eps)``; ``scale`` starts at ``sqrt(dim)``."""

    spec: ScaleNormSpec
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        *,
        scale_init: float | None = None,
        learnable: bool = True,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = ScaleNormSpec(
            eps=eps, scale_init=scale_init, learnable=learnable, residual_in_fp32=residual_in_fp32, backend=backend
        )
        super().__init__(normalized_shape, spec)
        scale = torch.empty(1, device=device, dtype=dtype)
        if learnable:
            self.scale = nn.Parameter(scale)
        else:
            self.register_buffer("scale", scale)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init = self.spec.scale_init
        if init is None:
            init = math.sqrt(math.prod(self.normalized_shape))
        with torch.no_grad():
            self.scale.fill_(init)

    def _normalize(self, x: Tensor) -> Tensor:
        return LF.scale_norm(x, self.normalized_shape, self.scale, self.spec.eps)


class NoNorm(Norm):
    """Identity in the norm's place (``kind="none"``): for norm-free ablations, ReZero or DyT-style studies."""

    spec: NoNormSpec

    def __init__(
        self,
        normalized_shape: int | Sequence[int] | None = None,
        *,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, NoNormSpec(residual_in_fp32=residual_in_fp32, backend=backend))

    def backend_for(self, x: Tensor, residual: Tensor | None = None) -> str:
        return "torch"  # nothing to fuse: identity has no kernel, whatever the backend option says

    def _normalize(self, x: Tensor) -> Tensor:
        return x


MODULE_TYPES: dict[str, type[Norm]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "dyt": DyT,
    "scalenorm": ScaleNorm,
    "none": NoNorm,
}
