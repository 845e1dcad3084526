"""``Block``: one residual block (attention sublayer, then MLP sublayer) with its norms where ``placement`` says.

One class, one forward pass, placement as data (``PLACEMENTS``; the MLP sublayer may have its own,
``mlp_placement``). Per sublayer f with input stream x::

    u = norm_in(x) * s       if the placement has an input norm    (s = 1/sqrt(l) with depth_scaled_norm)
    x = u                    if the placement takes its residual after the norm (normed_residual: HybridNorm's FFN)
    b = f(u)                 (u = x without an input norm)
    b = norm_out(b)          if the placement has an output norm
    b = drop(gate * b)       (gate: ReZero scalar, if enabled)
    x = norm_post(alpha*x + b)   if the placement has a post norm (alpha = 1 except DeepNorm)
    x = x + b                    otherwise

Three placements carry other streams, each its own short path in ``forward``: ``siamese`` (SiameseNorm's Post-like
stream x and Pre-like stream y, ``Stream(x, ., y)``), ``ngpt`` (nGPT's unit-norm update) and any single-stream
placement with ``hyper_connections`` (``n`` streams ``(B, T, n, C)``, mixed around each sublayer).

Fused residual path: between blocks the stream travels as ``Stream(hidden, residual)`` whose value is
``hidden + residual``: the last add of a block is left pending, and the next input norm (or post norm, or the
model's final norm) performs it with ``norm(hidden, residual=residual)``, which the norms run as one fused add+norm
kernel on GPU. A sublayer with an output norm (``sandwich``, ``reordered``) does its add at once instead,
``x + norm_out(b)`` as one ``norm_then_add`` call (one kernel reading b and x, writing the sum), where nothing stands
between the norm and the add (a ReZero gate, active dropout) and the add is the plain one the pending path would do.
Because ``a + b == b + a`` exactly in IEEE arithmetic, both paths return the same bits as the plain formulas above.
Calling a block on a plain tensor returns the plain tensor stream.

::

    pre        x ─┬─ norm ─ f ─(+)─>          post      x ─┬─ f ─(+)─ norm ─>
                  └──────────────┘                         └──────┘
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lnblocks.blocks.attention import Attention, KVCache
from lnblocks.blocks.config import BlockConfig
from lnblocks.blocks.hyper import HyperConnection
from lnblocks.blocks.mlp import MLP
from lnblocks.blocks.ngpt import ALPHA_INIT, Scale, l2_normalize
from lnblocks.blocks.placements import PLACEMENTS, Placement, deepnorm_alpha, depth_scale, siamese_divisor
from lnblocks.config import check_int
from lnblocks.norms import Norm, build_norm


class Stream(NamedTuple):
    """The residual stream between blocks, its last add still pending: ``value() = hidden + residual``.

    ``dual``: the un-normalised accumulated stream of ResiDual and of SiameseNorm (its Pre-like stream y; None for
    every other placement). With hyper-connections ``hidden`` holds the ``(B, T, n, C)`` streams.
    """

    hidden: Tensor
    residual: Tensor | None = None
    dual: Tensor | None = None

    def value(self) -> Tensor:
        """The stream itself, with the pending add done (promoted to fp32 if the residual is kept in fp32)."""
        return self.hidden if self.residual is None else self.hidden + self.residual


def check_stream_shape(x: object, dim: int, name: str, streams: int | None = None) -> None:
    """``x`` is a floating-point ``(B, T, dim)`` tensor, or ``(B, T, streams, dim)`` with hyper-connections (shape
    checks are static: free, also under torch.compile)."""
    shape = "(B, T, C)" if streams is None else f"(B, T, n_streams={streams}, C)"
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape} with C = {dim}, got {type(x).__name__}")
    if x.dim() != (3 if streams is None else 4) or x.shape[-1] != dim or (streams and x.shape[-2] != streams):
        raise ValueError(f"{name} must have shape {shape} with C = dim = {dim}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


class Block(nn.Module):
    """A residual block built from a ``BlockConfig``; ``layer_idx`` (0-based) and ``n_layers`` feed the depth-
    dependent constants (LayerNorm Scaling's ``1/sqrt(layer_idx + 1)``, DeepNorm's ``alpha = (2 n_layers)^(1/4)``,
    SiameseNorm's ``sqrt(2 (layer_idx + 1))``, the hyper-connections' initial input stream).

    Submodules (stable names): ``attn`` (``qkv``, ``proj``, ``q_norm``, ``k_norm``, ``v_norm``, ``gate_proj``),
    ``mlp`` (``fc1``, ``norm``, ``fc2``), and the norms the placement has: ``attn_in_norm``, ``attn_out_norm``,
    ``attn_post_norm``, ``mlp_in_norm``, ``mlp_out_norm``, ``mlp_post_norm``, and SiameseNorm's ``attn_dual_norm``,
    ``mlp_dual_norm`` (on y; absent ones are None). ReZero gates: ``attn_gate``, ``mlp_gate``. nGPT's eigen learning
    rates: ``alpha_attn``, ``alpha_mlp`` (``Scale``s of ``dim``). Hyper-connections: ``attn_hc``, ``mlp_hc``.
    """

    def __init__(self, config: BlockConfig | dict, layer_idx: int = 0, n_layers: int = 1) -> None:
        super().__init__()
        if isinstance(config, Mapping):
            config = BlockConfig.from_dict(config)
        if not isinstance(config, BlockConfig):
            raise TypeError(f"config must be a BlockConfig or a dict, got {type(config).__name__}")
        layer_idx = check_int("layer_idx", layer_idx, minimum=0)
        n_layers = check_int("n_layers", n_layers)
        if not layer_idx < n_layers:
            raise ValueError(f"need 0 <= layer_idx < n_layers, got layer_idx={layer_idx}, n_layers={n_layers}")
        self.config = config
        self.layer_idx = layer_idx
        self.placement = p = PLACEMENTS[config.placement]
        self.mlp_placement = pm = PLACEMENTS[config.mlp_placement_name]
        dim = config.dim

        def norm_if(present: bool) -> Norm | None:
            return build_norm(config.norm, dim) if present else None

        self.attn_in_norm = norm_if(p.in_norm)
        self.attn = Attention(dim, config.attention, config.qk_norm, config.v_norm, normalized=p.normalized)
        self.attn_out_norm = norm_if(p.out_norm)
        self.attn_post_norm = norm_if(p.post_norm)
        self.attn_dual_norm = norm_if(p.siamese)
        self.mlp_in_norm = norm_if(pm.in_norm and not config.shared_norm)
        self.mlp = MLP(dim, config.mlp, config.mlp_norm_spec, normalized=p.normalized)
        self.mlp_out_norm = norm_if(pm.out_norm)
        self.mlp_post_norm = norm_if(pm.post_norm)
        self.mlp_dual_norm = norm_if(p.siamese)
        self.alpha = 1.0
        if config.placement == "deepnorm":
            self.alpha = config.deepnorm_alpha if config.deepnorm_alpha is not None else deepnorm_alpha(n_layers)
        self.in_scale = depth_scale(layer_idx) if config.depth_scaled_norm else 1.0
        self.siamese_divisor = siamese_divisor(layer_idx) if p.siamese else 1.0
        self.attn_gate = nn.Parameter(torch.zeros(1)) if config.rezero else None
        self.mlp_gate = nn.Parameter(torch.zeros(1)) if config.rezero else None
        self.drop = nn.Dropout(config.dropout)
        # nGPT (its Sec. 2.5): alpha starts at 0.05 and learns at the rate of 1/sqrt(d_model)
        self.alpha_attn = Scale(dim, ALPHA_INIT, dim**-0.5) if p.normalized else None
        self.alpha_mlp = Scale(dim, ALPHA_INIT, dim**-0.5) if p.normalized else None
        hc = config.hyper_connections
        self.n_streams = hc.n_streams if hc is not None else None
        self.attn_hc = HyperConnection(hc, dim, 2 * layer_idx, config.norm) if hc is not None else None
        self.mlp_hc = HyperConnection(hc, dim, 2 * layer_idx + 1, config.norm) if hc is not None else None

    def extra_repr(self) -> str:
        return f"placement={self.placement.name!r}, layer_idx={self.layer_idx}, formula={self.placement.formula!r}"

    # ---- forward --------------------------------------------------------------------------------------------
    def forward(
        self, x: Tensor | Stream, rope: tuple[Tensor, Tensor] | None = None, cache: KVCache | None = None
    ) -> Tensor | Stream:
        """``x``: the stream ``(B, T, C)`` as a tensor, or as a ``Stream`` (then a ``Stream`` comes back, its last add
        pending). ``rope``: ``(cos, sin)`` from ``rope_cache`` or None (no RoPE). ``cache``: KV cache for decoding.
        A ``"resi_dual"`` block called on a tensor returns its post-norm stream, a ``"siamese"`` one its Post-like
        stream (y starts at the input); pass a ``Stream`` to carry the second stream. With hyper-connections ``x``
        holds the ``(B, T, n_streams, C)`` streams.
        """
        s = x if isinstance(x, Stream) else Stream(x)
        check_stream_shape(s.hidden, self.config.dim, "x", self.n_streams)
        if self.placement.parallel:
            s = self._parallel(s, rope, cache)
        elif self.placement.siamese:
            s = self._siamese(s, rope, cache)
        elif self.placement.normalized:
            s = self._ngpt(s, rope, cache)
        elif self.attn_hc is not None:
            s = self._hyper(s, rope, cache)
        else:
            p, pm = self.placement, self.mlp_placement
            u, res, dual = self._enter(s, self.attn_in_norm, p)
            s = self._leave(
                self.attn(u, rope, cache), res, dual, self.attn_out_norm, self.attn_post_norm, self.attn_gate, p
            )
            u, res, dual = self._enter(s, self.mlp_in_norm, pm)
            s = self._leave(self.mlp(u), res, dual, self.mlp_out_norm, self.mlp_post_norm, self.mlp_gate, pm)
        return s if isinstance(x, Stream) else s.value()

    def _enter(self, s: Stream, in_norm: Norm | None, p: Placement) -> tuple[Tensor, Tensor, Tensor | None]:
        """Branch input u, materialised stream x (maybe fp32), dual stream."""
        h, r, dual = s
        if in_norm is None:
            x = h if r is None else (h + r).to(h.dtype)
            u = x
        else:
            if r is None:
                u, x = in_norm(h), h
            else:
                u, x = in_norm(h, residual=r)  # fused: x = h + r, u = norm(x)
            if p.residual_after_norm:
                x = u  # the stream continues from its normalised value (HybridNorm's FFN(Norm(Y)) + Norm(Y))
            if self.in_scale != 1.0:
                u = u * self.in_scale
        if p.dual and dual is None:
            dual = x  # ResiDual's second stream starts at the block input (the embedding for the first block)
        return u, x, dual

    def _leave(
        self, b: Tensor, x: Tensor, dual: Tensor | None, out_norm: Norm | None, post_norm: Norm | None, gate, p
    ) -> Stream:
        if out_norm is not None and self._adds_after_norm(b, x, out_norm, gate, post_norm, p):
            return Stream(out_norm.norm_then_add(b, x), None, dual)  # x + norm_out(b): one call, one kernel on GPU
        b = self._branch(b, out_norm, gate)
        if p.dual:
            dual = dual + b
        if post_norm is not None:
            y, _ = post_norm(b, residual=x if self.alpha == 1.0 else x * self.alpha)  # norm(alpha * x + b), fused
            return Stream(y, None, dual)
        return Stream(b, x, dual)  # x + b left pending for the next norm

    def _adds_after_norm(self, b: Tensor, x: Tensor, out_norm: Norm, gate, post_norm: Norm | None, p) -> bool:
        """Whether ``x + out_norm(b)`` may be done now by ``norm_then_add`` with the same bits as the pending add it
        replaces: no gate or dropout between the norm and the add, no dual stream or post norm, and a plain add
        (the stream and the branch in one dtype, no fp32 residual stream: every consumer of the pending add, the
        next input norm's fused add, ``(h + r).to(h.dtype)`` or the final norm, then computes the same sum)."""
        return (
            gate is None
            and (self.drop.p == 0.0 or not self.training)
            and post_norm is None
            and not p.dual
            and not out_norm.spec.residual_in_fp32
            and b.dtype == x.dtype
        )

    def _branch(self, b: Tensor, out_norm: Norm | None, gate: Tensor | None) -> Tensor:
        """A sublayer's output as it is added: output norm, ReZero gate, dropout."""
        if out_norm is not None:
            b = out_norm(b)
        if gate is not None:
            b = b * gate
        return self.drop(b)

    def _parallel(self, s: Stream, rope: tuple[Tensor, Tensor] | None, cache: KVCache | None) -> Stream:
        u, x, dual = self._enter(s, self.attn_in_norm, self.placement)
        a = self.attn(u, rope, cache)
        if self.mlp_in_norm is None:
            m = self.mlp(u)  # shared norm
        else:
            u2 = self.mlp_in_norm(x).to(u.dtype)
            m = self.mlp(u2 * self.in_scale if self.in_scale != 1.0 else u2)
        if self.attn_gate is not None:
            a, m = a * self.attn_gate, m * self.mlp_gate
        return Stream(self.drop(a) + self.drop(m), x, dual)  # x + (a + m) left pending

    def _siamese(self, s: Stream, rope: tuple[Tensor, Tensor] | None, cache: KVCache | None) -> Stream:
        """SiameseNorm (Li et al. 2026, arXiv 2602.08064), as its authors' code computes each sublayer:
        ``x^ = norm_post(x)``, ``z = f(norm_in(x^ + norm_dual(y)))``, ``x <- x^ + z / c``, ``y <- y + z``."""
        x, r, y = s
        if y is None:
            y = x if r is None else x + r  # both streams start at the block input (the embedding)
        sublayers = (
            (self.attn_post_norm, self.attn_dual_norm, self.attn_in_norm, lambda u: self.attn(u, rope, cache),
             self.attn_gate),
            (self.mlp_post_norm, self.mlp_dual_norm, self.mlp_in_norm, self.mlp, self.mlp_gate),
        )  # fmt: skip
        for post_norm, dual_norm, in_norm, f, gate in sublayers:
            x_hat = post_norm(x) if r is None else post_norm(x, residual=r)[0]
            u, _ = in_norm(dual_norm(y), residual=x_hat)  # norm_in(x^ + norm_dual(y)), fused
            z = self._branch(f(u), None, gate)
            x, r = z / self.siamese_divisor, x_hat  # x^ + z / c left pending
            y = y + z
        return Stream(x, r, y)

    def _ngpt(self, s: Stream, rope: tuple[Tensor, Tensor] | None, cache: KVCache | None) -> Stream:
        """nGPT (Loshchilov et al. 2024, arXiv 2410.01131, Eq. 10-11): ``h <- Norm(h + alpha (Norm(f(h)) - h))``."""
        h = s.value()
        for f, alpha in ((lambda u: self.attn(u, rope, cache), self.alpha_attn), (self.mlp, self.alpha_mlp)):
            h = l2_normalize(h + alpha().to(h.dtype) * (l2_normalize(f(h)) - h))
        return Stream(h)

    def _hyper(self, s: Stream, rope: tuple[Tensor, Tensor] | None, cache: KVCache | None) -> Stream:
        """Hyper-connections around each sublayer ``f`` (with its placement's norms): ``h0, mix = width(H)``,
        ``H <- depth(f(h0), H, mix)`` (``lnblocks.blocks.hyper``)."""
        streams = s.value()  # (B, T, n, C)
        sublayers = (
            (self.attn_hc, self.attn_in_norm, lambda u: self.attn(u, rope, cache), self.attn_out_norm, self.attn_gate),
            (self.mlp_hc, self.mlp_in_norm, self.mlp, self.mlp_out_norm, self.mlp_gate),
        )
        for hc, in_norm, f, out_norm, gate in sublayers:
            h0, mix = hc.width(streams)  # (B, T, C)
            u = h0 if in_norm is None else in_norm(h0)
            if in_norm is not None and self.in_scale != 1.0:
                u = u * self.in_scale
            streams = hc.depth(self._branch(f(u), out_norm, gate), streams, mix)
        return Stream(streams)

    # ---- weights by role (for diagnostics) ------------------------------------------------------------------
    def matrices(self, grad: bool = False) -> dict[str, Tensor]:
        """Views of the weight matrices by role (or of their ``.grad`` with ``grad=True``): ``W_Q``, ``W_K``, ``W_V``,
        ``W_O``, ``W_G`` (the attention output gate, gated attention only), ``W_1`` (MLP in; the gate when gated),
        ``W_3`` (the up projection, gated only) and ``W_2`` (MLP out).
        """

        def get(p: nn.Parameter) -> Tensor:
            if not grad:
                return p.detach()
            if p.grad is None:
                raise ValueError("matrices(grad=True): no gradients yet; call backward() first")
            return p.grad

        w_q, w_k, w_v = self.attn.split_qkv(get(self.attn.qkv.weight))
        out = {"W_Q": w_q, "W_K": w_k, "W_V": w_v, "W_O": get(self.attn.proj.weight)}
        if self.attn.gate_proj is not None:
            out["W_G"] = get(self.attn.gate_proj.weight)  # the attention output gate's W_theta
        fc1 = get(self.mlp.fc1.weight)
        if self.mlp.gated:
            out["W_1"], out["W_3"] = self.mlp.split_fc1(fc1)
        else:
            out["W_1"] = fc1
        out["W_2"] = get(self.mlp.fc2.weight)
        return out
