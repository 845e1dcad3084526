"""``nn.Module`` wrappers: parameters, and the fused-residual call convention; the math is elsewhere.

The math lives in ``lnblocks.norms.functional``, the fused kernels in ``lnblocks.kernels``, and how a call picks
between them (checks, backend choice, the per-module route cache) in ``lnblocks.norms.routing``. Every module here
accepts ``norm(x)`` -> ``y`` and ``norm(x, residual=r)`` -> ``(y, x + r)``, where ``y = norm(x + r)``: the pre-norm
hot path, which ``backend="triton"`` runs as one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.norms import functional as LF
from lnblocks.norms import post_add, routing
from lnblocks.norms.spec import (
    Backend,
    CastMode,
    DyTSpec,
    LayerNormCast,
    LayerNormSpec,
    NoNormSpec,
    NormSpec,
    RMSNormSpec,
    ScaleNormSpec,
)

# Single-threaded CPU inference of half-precision inputs to norms written as several eager ops (RMSNorm, DyT,
# ScaleNorm) runs over blocks of rows of about this many fp32 bytes, so the fp32 intermediates stay in cache instead of
# being fresh multi-MB allocations. Each row sees the same ops, so outputs are bit-identical. benchmarks/norms/README.md
# has the numbers: 1.1-1.7x faster than torch.nn.RMSNorm in bf16 on one thread, slower in fp32 (no upcast copy to save),
# and with 2+ threads the many small ops stall on OpenMP synchronisation, so it is used only where it wins. Not used
# when grads are recorded either: blocking would reorder the weight-grad sum.
CPU_BLOCK_BYTES = 1 << 20


class Norm(nn.Module):
    """Base class: holds the spec, the tensors the math reads, and the call convention.

    ``last_backend`` is the backend of the latest eager call (``"torch"`` or ``"triton"``); ``backend_for(x)``
    says which one a call with ``x`` would use without running it. Inputs and parameters are checked in full once
    per kind of call, and again whenever a parameter or the spec is replaced (``lnblocks.norms.routing``).
    """

    _vectors: tuple[str, ...] = ()  # tensors of shape normalized_shape the math reads (weight, bias), None if absent
    _scalars: tuple[str, ...] = ()  # one-element tensors the math reads (DyT's alpha, ScaleNorm's scale)
    _fused_kernel: bool = False  # lnblocks.kernels runs this kind
    _row_blocks_on_cpu: bool = False  # multi-op eager math that gains from running over cache-sized row blocks
    _group_size: int | None = None  # statistics over groups of this many elements (None: the whole row)

    def __init__(self, normalized_shape: int | Sequence[int] | None, spec: NormSpec) -> None:
        super().__init__()
        self._routes = routing.RouteCache()
        self.spec = spec
        self.normalized_shape = None if normalized_shape is None else LF.as_normalized_shape(normalized_shape)
        shape = self.normalized_shape or ()
        # A cached route needs the one trailing dim it checks per call; multi-dim or absent shapes are never cached.
        self._last_dim = shape[0] if len(shape) == 1 else None
        self._row_numel = math.prod(shape) if shape else 0

    @classmethod
    def from_spec(cls, spec: NormSpec, normalized_shape: int | Sequence[int] | None, **factory: Any) -> Norm:
        """Build the module for ``spec`` (``factory``: ``device``/``dtype`` of the parameters).

        Every subclass's constructor takes its spec's fields as keyword options, so this serves them all.
        """
        options = {k: v for k, v in spec.to_dict().items() if k != "kind"}
        return cls(normalized_shape, **options, **factory)

    def share_parameters(self, module: nn.Module) -> None:
        """Read ``module``'s Parameters from now on: its own parameter dict, shared, not copied.

        ``lnblocks.hf`` runs a patched HF module's math through this norm; sharing the dict keeps it on the live
        Parameters after ``.to()``, ``.half()``, ``to_empty`` or ``load_state_dict(assign=True)`` replace them. A
        tensor the norm reads and ``module`` lacks reads as None (Cohere's LayerNorm has no ``bias`` at all).
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        object.__setattr__(self, "_parameters", module._parameters)
        self._routes.clear()

    def _register_vector(self, name: str, enabled: bool, factory: dict[str, Any]) -> None:
        # Registered as None when disabled, as torch.nn.LayerNorm does, so state_dict keys match torch's.
        param = nn.Parameter(torch.empty(self.normalized_shape, **factory)) if enabled else None
        self.register_parameter(name, param)

    @property
    def spec(self) -> NormSpec:
        """What the norm computes (a frozen spec); assigning another one (``lnblocks.hf`` does, when a patched
        module's eps changes) clears the cached routes, so the next call is checked and planned for it."""
        return self._spec

    @spec.setter
    def spec(self, spec: NormSpec) -> None:
        self._spec = spec
        self._routes.clear()

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def last_backend(self) -> str | None:
        return self._routes.last_backend

    def backend_for(self, x: Tensor, residual: Tensor | None = None) -> str:
        """The backend a call on ``x`` (and ``residual``) runs: ``"torch"`` or ``"triton"``; raises if ``"triton"``
        was asked for and cannot run."""
        return routing.backend_for(self, x, residual)

    # ``norm(x)`` -> ``y``; ``norm(x, residual=r)`` -> ``(y, x + r)``: the function itself, not a wrapper (one call
    # less per forward; benchmarks/norms/bench_norm_overhead.py)
    forward = routing.dispatch

    def norm_then_add(self, x: Tensor, residual: Tensor, *, return_normed: bool = False) -> Tensor | tuple:
        """``residual + norm(x)``, the new residual (OLMo 2's layers, Gemma 2/3's post-norms); with ``return_normed``
        also ``norm(x)``: ``(y, residual + y)``. One fused kernel on the triton backend; see ``docs/norms.md``."""
        return post_add.norm_then_add(self, x, residual, return_normed=return_normed)

    # ---- the torch backend -------------------------------------------------------------------------------------
    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        """The reference-math function of this norm and its arguments after ``x`` (the tensors and eps the route
        checked and resolved): the torch backend computes ``fn(x, *args)``."""
        raise NotImplementedError

    def _rows(self, x: Tensor, fn: Callable[..., Tensor], args: tuple) -> Tensor:
        """``fn(x, *args)`` over cache-sized row blocks in single-threaded CPU inference (same ops per row)."""
        block_rows = max(1, CPU_BLOCK_BYTES // (4 * self._row_numel))
        if (
            x.numel() <= 2 * block_rows * self._row_numel  # small inputs first: the cheapest test
            or x.device.type != "cpu"
            or x.dtype not in (torch.float16, torch.bfloat16)
            or torch.compiler.is_compiling()
            or torch.get_num_threads() != 1
            or (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())))
        ):
            return fn(x, *args)
        k = len(self.normalized_shape)
        rows = x.reshape(-1, *self.normalized_shape)  # (M, *normalized_shape)
        y = torch.cat([fn(block, *args) for block in rows.split(block_rows)])
        return y.reshape(*x.shape[:-k], *y.shape[1:])

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """The dtype ``norm(x)`` returns for an input of ``input_dtype`` (the input dtype unless a cast order says)."""
        return input_dtype

    def extra_repr(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.spec.to_dict().items() if k != "kind")
        return f"{self.normalized_shape}, {fields}"


class LayerNorm(Norm):
    """LayerNorm with ``torch.nn.LayerNorm``'s constructor meaning and ``state_dict`` keys (``weight``, ``bias``).

    Extra keyword options: ``zero_centered`` (store ``w``, apply ``1 + w`` in fp32; TransformerEngine), ``cast``
    (the HF class whose rounding to reproduce: ``"cohere"``, ``"nemotron"``), ``group_size``/``per_head`` (statistics
    per group / per head), ``memory_efficient``, ``residual_in_fp32`` and ``backend`` (see ``LayerNormSpec``).
    """

    spec: LayerNormSpec
    _vectors = ("weight", "bias")
    _fused_kernel = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        zero_centered: bool = False,
        cast: LayerNormCast = "fp32",
        group_size: int | None = None,
        per_head: bool = False,
        memory_efficient: bool = False,
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
            cast=cast,
            group_size=group_size,
            per_head=per_head,
            memory_efficient=memory_efficient,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        self._group_size = LF.resolve_group_size(group_size, per_head, self.normalized_shape)
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

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        s = self.spec
        args = (self.normalized_shape, route.weight, route.bias, route.eps, s.zero_centered, s.cast, self._group_size)
        return LF._layer_norm, args


class RMSNorm(Norm):
    """RMSNorm with ``torch.nn.RMSNorm``'s constructor meaning and ``state_dict`` key (``weight``).

    ``cast`` selects the HF cast order (``"fp32"`` = torch/OLMo2/Gemma, ``"llama"``, ``"t5"``; see ``RMSNormSpec``);
    ``zero_centered`` stores ``w`` and applies ``1 + w`` in fp32 (Gemma, TransformerEngine); ``group_size``/
    ``per_head``, ``memory_efficient``: as for ``LayerNorm``.
    """

    spec: RMSNormSpec
    _vectors = ("weight",)
    _fused_kernel = True
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        cast: CastMode = "fp32",
        zero_centered: bool = False,
        group_size: int | None = None,
        per_head: bool = False,
        memory_efficient: bool = False,
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
            group_size=group_size,
            per_head=per_head,
            memory_efficient=memory_efficient,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        self._group_size = LF.resolve_group_size(group_size, per_head, self.normalized_shape)
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

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        s = self.spec
        return LF._rms_norm, (self.normalized_shape, route.weight, route.eps, s.cast, s.zero_centered, self._group_size)


class DyT(Norm):
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``; a norm-free drop-in for LayerNorm.

    Parameters: ``alpha`` (scalar, init ``alpha_init``), ``weight`` (ones) and ``bias`` (zeros) over
    ``normalized_shape``.
    """

    spec: DyTSpec
    _vectors = ("weight", "bias")
    _scalars = ("alpha",)
    _fused_kernel = True
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

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        return LF._dyt, (route.others[0][1], route.weight, route.bias)


class ScaleNorm(Norm):
    """ScaleNorm (Nguyen & Salazar 2019): ``scale * x / max(||x||_2, eps)``; ``scale`` starts at ``sqrt(dim)``."""

    spec: ScaleNormSpec
    _scalars = ("scale",)
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

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        return LF._scale_norm, (self.normalized_shape, route.others[0][1], route.eps)


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

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        return _identity, ()  # nothing to fuse: identity has no kernel, whatever the backend option says


def _identity(x: Tensor) -> Tensor:
    return x


MODULE_TYPES: dict[str, type[Norm]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "dyt": DyT,
    "scalenorm": ScaleNorm,
    "none": NoNorm,
}
