"""Hyper-connections: ``n`` residual streams mixed by learned matrices around each sublayer.

Hyper-connections (Zhu et al. 2024, arXiv 2409.19606, "HC") widen the residual stream into ``n`` copies
``H = [h_1; ...; h_n]`` (``(B, T, n, C)``, all equal to the embedding at the start; the model sums them before its
final norm). Around a sublayer ``f`` (attention or MLP with its own norms, e.g. Pre-LN's ``f(h) = attn(norm(h))``)::

    h_0 = A_m^T H                    width connection: the sublayer's input, a weighted sum of the streams
    H' = A_r^T H + B^T f(h_0)        depth connection: streams mixed, plus the output weighted into each

with ``A_m`` ``(n,)``, ``A_r`` ``(n, n)``, ``B`` ``(n,)`` (the ``(n+1) x (n+1)`` matrix ``HC = [[0, B], [A_m, A_r]]``).
``kind="static"``: learned constants, initialised as Pre-LN (``A_m = e_{k mod n}`` for sublayer ``k``,
``A_r = I``, ``B = 1``). ``kind="dynamic"``: plus input-dependent terms, ``A(H) = s_a tanh(norm(H) W_a) + A`` and
``B(H) = s_b tanh(norm(H) W_b)^T + B`` per stream, ``W`` from zeros and ``s_a = s_b = 0.01`` (the paper's dynamic
hyper-connections, its Appendix J Algorithm 2).

``kind="mhc"``: manifold-constrained hyper-connections (Xie et al. 2025, arXiv 2512.24880), ``x' = H_res x +
H_post^T f(H_pre x)`` with, from the RMS-normalised flattened streams ``x~`` (``(B, T, nC)``), ``H_pre =
sigmoid(a_pre x~ phi_pre + b_pre)``, ``H_post = 2 sigmoid(a_post x~ phi_post + b_post)`` and ``H_res =
SinkhornKnopp(a_res mat(x~ phi_res) + b_res)``, a doubly stochastic matrix (``sinkhorn_knopp``). Computed in fp32
as DeepSeek-V4's ``DeepseekV4HyperConnection`` in ``transformers`` does (its eps guards included; the tests check
the two agree), initialised as it is there (``phi ~ N(0, std)``, ``b = 0``, ``a = 1``). The papers' full texts were
not reachable here: the formulas follow their abstracts' and HC's Algorithm 2 (as public implementations cite it) and
DeepSeek-V4's module, so no equation numbers are cited.

``composite_gain`` multiplies the layers' residual mixing matrices (``A_r^T`` or ``H_res``, in the orientation
``x' = M x``) and returns the largest absolute row and column sums of the product (mHC's "Amax gain magnitude").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch
from torch import Tensor, nn

from lnblocks.config import Config, ConfigValueError, check_choice, check_float, check_int
from lnblocks.norms import NormSpec, build_norm

HyperKind = Literal["static", "dynamic", "mhc"]
HYPER_KINDS: tuple[str, ...] = get_args(HyperKind)
HC_SCALE_INIT = 0.01  # s_a, s_b of dynamic hyper-connections


@dataclass(frozen=True, kw_only=True)
class HyperConnectionsConfig(Config):
    """``n_streams`` residual streams (the paper's expansion rate ``n``) and how they are mixed (``kind``:
    ``"static"``, ``"dynamic"`` or ``"mhc"``). ``sinkhorn_iters`` and ``eps`` are mHC's: Sinkhorn-Knopp iterations
    (20 in the paper) and the guard added in the sigmoid, the normalisations and the RMS norm."""

    n_streams: int = 4
    kind: HyperKind = "dynamic"
    sinkhorn_iters: int = 20
    eps: float = 1e-6

    def __post_init__(self) -> None:
        self._set("n_streams", check_int("n_streams", self.n_streams))
        check_choice("kind", self.kind, HYPER_KINDS)
        self._set("sinkhorn_iters", check_int("sinkhorn_iters", self.sinkhorn_iters))
        self._set("eps", check_float("eps", self.eps, lo=0, lo_open=True))
        if self.kind != "mhc" and (self.sinkhorn_iters != 20 or self.eps != 1e-6):
            raise ConfigValueError(
                "sinkhorn_iters", f"and eps are mHC's options: they need kind='mhc', got kind={self.kind!r}"
            )


def sinkhorn_knopp(logits: Tensor, iters: int = 20, eps: float = 1e-6) -> Tensor:
    """The doubly stochastic matrix of ``logits`` ``(..., n, n)`` (mHC's projection onto the Birkhoff polytope):
    ``exp`` normalised over rows (a softmax), then columns, then ``iters - 1`` more row/column passes; ``eps`` is
    added after the softmax and to every divisor (DeepSeek-V4's guards). Columns sum to 1 exactly up to rounding,
    rows to within the convergence of ``iters`` passes."""
    m = torch.softmax(logits, dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


class MixingGain(NamedTuple):
    """The composite residual mixing ``P = M_L ... M_1`` of a stack: ``forward``, the largest absolute row sum of
    ``P`` (how much a stream's signal can grow going up), ``backward``, the largest absolute column sum (the same
    for gradients going down); both of the leading shape of the matrices (e.g. per token)."""

    forward: Tensor
    backward: Tensor

    @property
    def value(self) -> Tensor:
        """The larger of the two: mHC's "Amax gain magnitude"."""
        return torch.maximum(self.forward, self.backward)


def composite_gain(mixing: Sequence[Tensor]) -> MixingGain:
    """The gain of the product of the layers' residual mixing matrices ``mixing`` (first layer first), each
    ``(..., n, n)`` in the orientation ``x_{l+1} = M_l x_l`` (leading dims broadcast, e.g. one matrix per token)."""
    mats = list(mixing)
    if not mats:
        raise ValueError("mixing must hold at least one (..., n, n) matrix")
    for i, m in enumerate(mats):
        if not isinstance(m, Tensor) or m.dim() < 2 or m.shape[-1] != m.shape[-2]:
            got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(f"mixing[{i}] must be a square (..., n, n) tensor, got {got}")
        if m.shape[-1] != mats[0].shape[-1]:
            raise ValueError(f"mixing[{i}] is {m.shape[-1]}x{m.shape[-1]}, mixing[0] {mats[0].shape[-1]} streams")
    product = mats[0]
    for m in mats[1:]:
        product = m @ product  # (..., n, n)
    absolute = product.abs()
    return MixingGain(absolute.sum(-1).amax(-1), absolute.sum(-2).amax(-1))


class Mix(NamedTuple):
    """One sublayer's weights: ``post`` ``(..., n)`` (``B`` / ``H_post``) and ``residual`` ``(..., n, n)``
    (``A_r^T`` / ``H_res``, so that the mixed streams are ``residual @ H``)."""

    post: Tensor
    residual: Tensor


class HyperConnection(nn.Module):
    """The connections of one sublayer (``sublayer_index`` ``k``: ``2 * layer_idx`` for attention, ``+ 1`` for the
    MLP), over ``dim`` channels per stream. ``width(H)`` gives the sublayer's input and the ``Mix``; ``depth(b, H,
    mix)`` the new streams. Parameters: ``static_alpha`` ``(n, 1 + n)`` (``[A_m | A_r]``) and ``static_beta``
    ``(n,)``; dynamic adds ``norm``, ``dynamic_alpha`` ``(C, 1 + n)``, ``dynamic_beta`` ``(C,)``, ``alpha_scale``,
    ``beta_scale``; mHC has ``phi`` ``((2 + n) n, n C)``, ``bias`` ``((2 + n) n,)`` and ``scale`` ``(3,)``
    (pre, post, res). With ``record = True`` each call keeps its residual matrix in ``last_mixing`` (detached)."""

    def __init__(self, config: HyperConnectionsConfig, dim: int, sublayer_index: int, norm: NormSpec) -> None:
        super().__init__()
        self.config = config
        self.n = n = config.n_streams
        self.dim = dim
        self.sublayer_index = sublayer_index
        self.record = False
        self.last_mixing: Tensor | None = None
        if config.kind == "mhc":
            self.phi = nn.Parameter(torch.empty((2 + n) * n, n * dim))
            self.bias = nn.Parameter(torch.empty((2 + n) * n))
            self.scale = nn.Parameter(torch.empty(3))
        else:
            self.static_alpha = nn.Parameter(torch.empty(n, 1 + n))
            self.static_beta = nn.Parameter(torch.empty(n))
            if config.kind == "dynamic":
                self.norm = build_norm(norm, dim)
                self.dynamic_alpha = nn.Parameter(torch.empty(dim, 1 + n))
                self.dynamic_beta = nn.Parameter(torch.empty(dim))
                self.alpha_scale = nn.Parameter(torch.empty(1))
                self.beta_scale = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"n_streams={self.n}, kind={self.config.kind!r}, sublayer_index={self.sublayer_index}"

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """HC: Pre-LN at init (``A_m = e_{k mod n}``, ``A_r = I``, ``B = 1``, dynamic ``W = 0``, scales 0.01).
        mHC: ``phi ~ N(0, std)``, ``bias = 0``, ``scale = 1``."""
        n = self.n
        if self.config.kind == "mhc":
            nn.init.normal_(self.phi, 0.0, std)
            nn.init.zeros_(self.bias)
            nn.init.ones_(self.scale)
            return
        self.static_alpha.zero_()
        self.static_alpha[self.sublayer_index % n, 0] = 1.0
        self.static_alpha[:, 1:] = torch.eye(n)
        nn.init.ones_(self.static_beta)
        if self.config.kind == "dynamic":
            nn.init.zeros_(self.dynamic_alpha)
            nn.init.zeros_(self.dynamic_beta)
            self.alpha_scale.fill_(HC_SCALE_INIT)
            self.beta_scale.fill_(HC_SCALE_INIT)

    def _weights(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(pre (..., n), post (..., n), residual (..., n, n))`` for ``streams`` ``(B, T, n, C)``."""
        kind, n = self.config.kind, self.n
        if kind == "mhc":
            eps, dtype = self.config.eps, torch.promote_types(streams.dtype, torch.float32)
            flat = streams.flatten(-2).to(dtype)  # (B, T, nC), at least fp32
            flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
            mixes = flat @ self.phi.to(dtype).t()  # (B, T, (2 + n) n)
            pre, post, res = mixes.split([n, n, n * n], dim=-1)
            b_pre, b_post, b_res = self.bias.to(dtype).split([n, n, n * n])
            s_pre, s_post, s_res = self.scale.to(dtype).unbind(0)
            pre = torch.sigmoid(pre * s_pre + b_pre) + eps
            post = 2 * torch.sigmoid(post * s_post + b_post)
            comb = sinkhorn_knopp((res * s_res + b_res).unflatten(-1, (n, n)), self.config.sinkhorn_iters, eps)
            return pre, post, comb.transpose(-1, -2)  # H_res = comb^T: mixed streams = comb^T @ H
        alpha, beta = self.static_alpha, self.static_beta  # (n, 1 + n), (n,)
        if kind == "dynamic":
            normed = self.norm(streams)  # (B, T, n, C)
            alpha = self.alpha_scale * torch.tanh(normed @ self.dynamic_alpha) + alpha  # (B, T, n, 1 + n)
            beta = self.beta_scale * torch.tanh(normed @ self.dynamic_beta) + beta  # (B, T, n)
        return alpha[..., 0], beta, alpha[..., 1:].transpose(-1, -2)  # residual = A_r^T

    def width(self, streams: Tensor) -> tuple[Tensor, Mix]:
        """The sublayer's input ``(B, T, C)`` from ``streams`` ``(B, T, n, C)``, and the weights ``depth`` uses."""
        if streams.dim() != 4 or streams.shape[-2:] != (self.n, self.dim):
            raise ValueError(
                f"hyper-connection streams must have shape (B, T, n_streams={self.n}, C={self.dim}), got "
                f"{tuple(streams.shape)}"
            )
        pre, post, residual = self._weights(streams)
        if self.record and not torch.compiler.is_compiling():
            self.last_mixing = residual.detach()
        h0 = (pre.unsqueeze(-1) * streams).sum(dim=-2).to(streams.dtype)  # (B, T, C); mHC's weights are fp32
        return h0, Mix(post.to(streams.dtype), residual.to(streams.dtype))

    def depth(self, branch: Tensor, streams: Tensor, mix: Mix) -> Tensor:
        """``residual @ H + post^T branch``: the new streams ``(B, T, n, C)``."""
        return mix.post.unsqueeze(-1) * branch.unsqueeze(-2) + mix.residual @ streams
