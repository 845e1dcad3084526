"""Modules of the norm kinds with no ``torch.nn`` counterpart that the 2025-26 families brought: ``GatedRMSNorm`` (the
gated norm of every hybrid SSM / linear-attention family), ``L2Norm`` (Llama 4's qk-norm, no parameters) and ``Derf``
(the point-wise replacement of arXiv 2512.10938). Their math is in ``lnblocks.norms.functional``, written op for op
like the HF classes (the torch backend is bit-identical with them, tested against transformers); calls run through
``lnblocks.norms.routing`` like every norm (fused kernel or torch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from lnblocks.norms import functional as LF
from lnblocks.norms import routing
from lnblocks.norms.modules import Norm
from lnblocks.norms.spec import (
    Backend,
    DerfSpec,
    GateActivation,
    GatedCast,
    GatedRMSNormSpec,
    GatePosition,
    L2NormSpec,
    L2Reduction,
)


class L2Norm(Norm):
    """``x * rsqrt(mean(x^2) + eps)`` over the last dims, no parameters (``Llama4TextL2Norm``: Llama 4's qk-norm);
    ``reduction="sum"`` divides by the L2 norm itself. ``memory_efficient``: the fused backward saves the output."""

    spec: L2NormSpec
    _fused_kernel = True
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-6,
        *,
        reduction: L2Reduction = "mean",
        memory_efficient: bool = False,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = L2NormSpec(
            eps=eps,
            reduction=reduction,
            memory_efficient=memory_efficient,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)

    eps = property(lambda self: self.spec.eps)

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        return LF._l2_norm, (self.normalized_shape, route.eps, self.spec.reduction)


class Derf(Norm):
    """Dynamic erf (Chen et al. 2025, arXiv 2512.10938): ``weight * erf(alpha * x + shift) + bias``.

    Parameters: the scalars ``alpha`` (init ``alpha_init``, 0.5) and ``shift`` (init ``shift_init``, 0), ``weight``
    (ones) and ``bias`` (zeros) over ``normalized_shape``: the initialisation of the paper's released code.
    """

    spec: DerfSpec
    _vectors = ("weight", "bias")
    _scalars = ("alpha", "shift")
    _fused_kernel = True
    _row_blocks_on_cpu = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        alpha_init: float = 0.5,
        shift_init: float = 0.0,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = DerfSpec(
            alpha_init=alpha_init,
            shift_init=shift_init,
            elementwise_affine=elementwise_affine,
            bias=bias,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        factory = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.empty(1, **factory))
        self.shift = nn.Parameter(torch.empty(1, **factory))
        self._register_vector("weight", elementwise_affine, factory)
        self._register_vector("bias", elementwise_affine and bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.spec.alpha_init)
        nn.init.constant_(self.shift, self.spec.shift_init)
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _math(self, route: routing.Route) -> tuple[Callable[..., Tensor], tuple]:
        (_, alpha), (_, shift) = route.others
        return LF._derf, (alpha, shift, route.weight, route.bias)


class GatedRMSNorm(Norm):
    """Gated RMSNorm, ``norm(x, gate)``, with ``MambaRMSNormGated``'s ``state_dict`` key (``weight``).

    ``gate``: ``"before"`` or ``"after"`` the norm; ``activation``: ``"silu"`` or ``"sigmoid"``; ``group_size``: RMS
    over groups of that many elements (None: the whole row; ``per_head``: groups = the last dim); ``cast``: ``"llama"``
    (round to the input dtype before the weight) or ``"fp32"``. ``norm(x)`` without a gate is the grouped RMSNorm.
    """

    spec: GatedRMSNormSpec
    _vectors = ("weight",)
    _fused_kernel = True

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        *,
        gate: GatePosition = "before",
        activation: GateActivation = "silu",
        cast: GatedCast = "llama",
        group_size: int | None = None,
        per_head: bool = False,
        residual_in_fp32: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = GatedRMSNormSpec(
            eps=eps,
            elementwise_affine=elementwise_affine,
            gate=gate,
            activation=activation,
            cast=cast,
            group_size=group_size,
            per_head=per_head,
            residual_in_fp32=residual_in_fp32,
            backend=backend,
        )
        super().__init__(normalized_shape, spec)
        self._group_size = LF.resolve_group_size(group_size, per_head, self.normalized_shape)
        self._register_vector("weight", elementwise_affine, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: Tensor, gate: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """``rms(x * act(gate)) * w`` or ``rms(x) * w * act(gate)``; ``gate`` has x's shape (None: no gate)."""
        route = routing.route_for(self, x)
        if gate is not None:
            LF.check_gate(gate, x)
        if route.plan is not None:
            kernels = routing._kernels()
            reason = kernels.gate_unavailable_reason(gate, x)
            if reason is None:
                try:
                    return kernels.run_fused(route.plan, x, None, route.weight, None, route.n, gate=gate)
                except kernels.StaleOperandError:  # the weight changed in place since the route was planned
                    route = routing.plan_route(self, x, None)
                if route.plan is not None:
                    return kernels.run_fused(route.plan, x, None, route.weight, None, route.n, gate=gate)
            elif self.spec.backend == routing.TRITON:
                raise ValueError(f"backend='triton' cannot run here: {reason}. Use backend='auto' or 'torch'.")
            self._routes.last_backend = routing.TORCH
        s = self.spec
        return LF._gated_rms_norm(
            x, gate, self.normalized_shape, route.weight, s.eps, s.gate, s.activation, s.cast, self._group_size
        )

    def norm_then_add(self, x: Tensor, residual: Tensor, *, return_normed: bool = False) -> Tensor:
        raise ValueError("gated_rmsnorm has no norm-then-add form: it sits inside the mixer, before no residual add")

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        weight = self.weight
        s = self.spec
        w_dtype = None if weight is None else weight.dtype
        return LF.output_dtype(s.kind, s.cast, input_dtype, w_dtype, gate_after=s.gate == "after")

    def _math(self, route: routing.Route):
        s = self.spec  # the gate-less call, norm(x)
        args = (None, self.normalized_shape, route.weight, s.eps, s.gate, s.activation, s.cast, self._group_size)
        return LF._gated_rms_norm, args
