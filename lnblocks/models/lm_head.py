"""The LM head and its cross-entropy in chunks of rows: the loss of ``logits = hidden @ weight.T`` without ever
holding the ``(N, V)`` logits.

The forward computes one chunk of logits at a time and keeps per-row scalars (the target's log-probability, log Z)
and the running max. The gradients come one of two ways:

- no z-loss (the default), not fp16, and a backward to come: Liger-Kernel's fused linear cross-entropy scheme.
  Each chunk's gradient to the hidden states and its share of the weight's are computed in the forward, for an
  upstream gradient of 1, and the backward scales them by the real one (eagerly in place: no second ``(V, C)``
  buffer, so a second backward through the same graph raises). Three GEMMs per chunk, as for the full logits.
  Not under fp16 autocast: there the logits' gradient for an upstream 1 (``p / N``, ~1e-8 at V = 30k) is
  under fp16's normal range, which is why fp16 trains with a ``GradScaler``; it must see the scaled upstream
  gradient before the cast, so fp16 takes the second route (measured at V = 30,522: 7% error in the hidden-state
  gradient in the forward, 0.03% recomputed, as the full loss).
- with a z-loss, or under fp16: Cut Cross-Entropy's (Wijmans et al. 2024, arXiv 2411.09009). The backward
  recomputes each chunk's logits (a fourth GEMM). The loss and the z-loss are two outputs with their own upstream
  gradients (the study back-propagates ``loss + z_loss`` and logs ``loss``; accumulation and ``GradScaler`` scale
  them), which a gradient-in-forward scheme would have to fold into one output decided before the backward; between
  forward and backward it holds ``N`` floats instead of the gradients.

Either way each chunk runs the very ops autograd runs for ``F.cross_entropy(logits.float())`` and the study's
``z_loss * logsumexp(logits.float()).pow(2).mean()``, so results can be bit-identical. Logits of at most
``SINGLE_CHUNK_ELEMENTS`` (16 MiB in fp32: the demo's byte vocabulary) take the plain autograd path, today's
computation op for op. Otherwise, against ``F.cross_entropy(F.linear(hidden, weight).float())`` (checked in
``tests/models/test_lm_loss.py``): the loss, the z-loss, the max logit and the per-row log Z (so its mean) are
bit-identical whenever the BLAS computes each row of a GEMM independently of how many rows it is given (MKL on x86
does for chunks of a multiple of 4 rows; the default chunks are multiples of 8), and so is the gradient to the hidden
states (without a z-loss: for an upstream gradient that is a power of 2, e.g. the 1 of ``loss.backward()``); the
gradient to the weight sums over rows, so it differs by float summation order (summed in fp32 across chunks: under
autocast it is more accurate than the bf16 GEMM over all rows). No double backward (the backward is opaque):
``create_graph=True`` through a chunked call raises ``RuntimeError`` saying so (the one-chunk path is plain autograd
and has one). A 1-D ``hidden`` is one position; an empty batch gives ``max_logit`` -inf and an empty ``log_z``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from lnblocks.config import check_bool, check_choice, check_float, check_int

SINGLE_CHUNK_ELEMENTS = 1 << 22  # logits up to 16 MiB in fp32 are computed in one chunk (exact, fastest)
LOGITS_FRACTION = 8  # otherwise a chunk's three fp32 (rows, V) buffers take at most 1/8 of the logits
MIN_CHUNK_ELEMENTS = 1 << 18  # but 1 MiB of fp32 logits per chunk at least: fewer, larger GEMMs
MAX_CHUNK_FRACTION = 16  # and at most 1/16 of the rows (with tiny batches at huge vocabularies)
_LOW = (torch.float16, torch.bfloat16)
REDUCTIONS = {"mean": 1, "sum": 2}  # the loss reductions, as nll_loss's reduction codes


class LMHeadStats(NamedTuple):
    """What the chunked head computes besides the loss (``GPT.forward(..., return_logits=False)``'s first item).

    ``z_loss``: ``coefficient * mean(log(Z)^2)`` over every position (ignored targets included, as
    ``lnblocks.study``'s z-loss is), differentiable; None when the coefficient is 0. ``max_logit``: the largest
    output logit (fp32, 0-dim, detached). ``log_z``: ``logsumexp`` of each position's logits in fp32, shape
    ``hidden.shape[:-1]``, detached; ``log_z.mean()`` is the study's ``log_z`` diagnostic. Both None unless stats
    were asked for (``lm_head_loss(stats=True)``, the default without targets).
    """

    z_loss: Tensor | None
    max_logit: Tensor | None
    log_z: Tensor | None


def default_chunk_rows(n_rows: int, vocab: int, buffers: int = 3) -> int:
    """Rows per chunk: all of them while the logits fit in ``SINGLE_CHUNK_ELEMENTS``; otherwise as many as keep the
    chunk's ``buffers`` fp32 ``(rows, V)`` buffers within ``1 / LOGITS_FRACTION`` of the logits (three: ``n_rows /
    24``; the recomputing backward's four, with headroom: five, ``n_rows / 40``), rounded down to a multiple of 8
    (whole SIMD/GEMM tiles, which keeps rows bit-identical), but at least 8 and at least
    ``MIN_CHUNK_ELEMENTS / vocab`` (rounded up to a multiple of 8), and at most ``n_rows / MAX_CHUNK_FRACTION``.
    Few, large chunks: each chunk reads the head weight twice and its gradient once more (measured at V = 50,257:
    40-row chunks took 12% less CPU time than 16-row ones)."""
    if n_rows * vocab <= SINGLE_CHUNK_ELEMENTS:
        return max(n_rows, 1)
    by_memory = n_rows // (buffers * LOGITS_FRACTION) // 8 * 8
    by_size = -(-MIN_CHUNK_ELEMENTS // vocab)  # ceil
    by_size = -(-by_size // 8) * 8
    return max(1, min(max(8, by_memory, by_size), n_rows // MAX_CHUNK_FRACTION))


# ---- the chunked forward and backward (plain torch ops; eager through an autograd.Function, traced as custom ops) --
def _grads_in_forward(targets: Tensor | None, z_coef: float, dtype: torch.dtype) -> bool:
    """Whether the gradients are computed in the forward (for an upstream gradient of 1): with targets, no z-loss,
    and not fp16 (whose scaled upstream gradient must come before the cast to fp16; see the module docstring)."""
    return targets is not None and not z_coef and dtype != torch.float16


def _ce_grad(
    logp: Tensor,
    t: Tensor,
    g_loss: Tensor,
    total: Tensor,
    ignore_index: int,
    reduction: int,
    out: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The gradient of the mean (``reduction`` 1) or summed (2) cross-entropy to a chunk's fp32 logits, by the ops
    autograd runs for it; ``out``: two ``logp``-shaped buffers to write into (the same kernels' out variants: the
    same bits)."""
    if out is None:
        gl = torch.ops.aten.nll_loss_backward(g_loss, logp, t, None, reduction, ignore_index, total)
        return torch._log_softmax_backward_data(gl, logp, 1, torch.float32)
    gl, g = out  # nll_loss_backward zeroes its grad_input before it scatters
    torch.ops.aten.nll_loss_backward.grad_input(g_loss, logp, t, None, reduction, ignore_index, total, grad_input=gl)
    return torch._log_softmax_backward_data(gl, logp, 1, torch.float32, out=g)


class _ChunkBuffers:
    """The fp32 ``(rows, V)`` buffers of one call's chunks, allocated once and reused by every chunk: the logits
    (then the loss's gradient to the log-probabilities), the log-probabilities, the logits' gradient. Per chunk that
    is no allocation, no page faults and no freshly zeroed memory, and the chunk's data stays at the same addresses
    (a fresh allocation per chunk cost about 13% of the head's CPU time at V = 30,522;
    ``benchmarks/study/bench_study_step.py``)."""

    def __init__(self, rows: int, vocab: int, device: torch.device, count: int) -> None:
        self.bufs = [torch.empty(rows, vocab, device=device) for _ in range(count)]

    def get(self, i: int, n: int) -> Tensor:
        return self.bufs[i][:n]


def _to_inputs(g: Tensor, hc: Tensor, wc: Tensor, s: int, grad_h: Tensor, grad_w: Tensor) -> None:
    """A chunk's logits gradient ``g`` (n, V) into ``grad_h[s:s+n]`` and the fp32 sum ``grad_w`` (empty: skipped)."""
    rows = slice(s, s + g.shape[0])
    if grad_h.numel() and grad_h.dtype == g.dtype:
        torch.mm(g, wc, out=grad_h[rows])  # (n, C), in place
    elif grad_h.numel():
        grad_h[rows] = g.mm(wc)  # (n, C)
    if grad_w.numel() and g.dtype == torch.float32:
        grad_w.addmm_(g.t(), hc[rows])  # (V, C)
    elif grad_w.numel():
        grad_w.add_(g.t().mm(hc[rows]))  # low-precision partials summed in fp32


def _grad_buffers(hidden: Tensor, weight: Tensor, need_h: bool, need_w: bool) -> tuple[Tensor, Tensor]:
    grad_h = torch.empty(hidden.shape if need_h else (0,), dtype=hidden.dtype, device=hidden.device)
    grad_w = torch.zeros(weight.shape if need_w else (0,), dtype=torch.float32, device=weight.device)
    return grad_h, grad_w


def _forward_impl(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None,
    ignore_index: int,
    z_coef: float,
    rows: int,
    dtype: torch.dtype,
    reduction: int,
    stats: bool,
    need_h: bool,
    need_w: bool,
) -> tuple[Tensor, ...]:
    """``(loss, z_loss, max_logit, lse, total, grad_h, grad_w)`` of ``hidden (N, C) @ weight (V, C).T`` over chunks
    of ``rows`` rows. ``lse`` is empty unless ``stats`` or a z-loss needs it; ``total`` is nll_loss's count of
    counted rows. Without a z-loss, the gradients of the loss (for an upstream gradient of 1) to the inputs that
    ``need_`` one are computed here, chunk by chunk (Liger's scheme), else they are empty."""
    N, device = hidden.shape[0], hidden.device
    hc, wc = hidden.to(dtype), weight.to(dtype)  # autocast's casts (no-ops outside autocast)
    need_lse = stats or bool(z_coef)
    in_forward = _grads_in_forward(targets, z_coef, dtype) and (need_h or need_w)
    grad_h, grad_w = _grad_buffers(hidden, weight, need_h and in_forward, need_w and in_forward)
    if in_forward:
        one = torch.ones((), dtype=torch.float32, device=device)
        counted = (targets != ignore_index).sum().to(torch.float32)  # nll_loss's total weight, exactly
    lse = torch.empty(N if need_lse else 0, dtype=torch.float32, device=device)  # (N,) log Z per row
    picked = torch.empty(N, dtype=torch.float32, device=device)  # (N,) log p(target) per row
    maxes = []
    # fp32 chunks reuse three buffers (or one/two: what this call needs); low-precision ones allocate (their .float())
    count = (1 + (targets is not None) + in_forward) if dtype == torch.float32 else 0
    buf = _ChunkBuffers(min(rows, N), weight.shape[0], device, count) if count else None
    for s in range(0, N, rows):
        n = min(rows, N - s)
        h_n = hc[s : s + n]
        # (n, V): the chunk's logits, as logits.float()
        lf = h_n.mm(wc.t()).float() if buf is None else torch.mm(h_n, wc.t(), out=buf.get(0, n))
        if stats:
            maxes.append(lf.amax())
        if need_lse:
            lse[s : s + rows] = torch.logsumexp(lf, dim=-1)
        if targets is not None:
            t = targets[s : s + rows]
            # what F.cross_entropy computes, row by row (log_softmax's own kernel, into the buffer)
            logp = torch.log_softmax(lf, dim=1) if buf is None else torch._log_softmax(lf, 1, False, out=buf.get(1, n))
            picked[s : s + rows] = logp.gather(1, t.masked_fill(t == ignore_index, 0).unsqueeze(1)).squeeze(1)
            if in_forward:
                del lf  # its buffer takes the loss's gradient to logp
                outs = None if buf is None else (buf.get(0, n), buf.get(2, n))
                g = _ce_grad(logp, t, one, counted, ignore_index, reduction, outs).to(dtype)
                _to_inputs(g, hc, wc, s, grad_h, grad_w)
    max_logit = torch.stack(maxes).amax() if maxes else torch.full((), float("-inf"), device=device)
    if targets is not None:
        col = 1 if ignore_index == 0 else 0  # the picked values sit in this column of a (N, 2) input
        t2 = torch.where(targets == ignore_index, ignore_index, col)
        # nll_loss over the picked values runs the same cascade sum over rows as over the full logits
        picked2 = picked.unsqueeze(1).expand(N, 2)
        loss, total = torch.ops.aten.nll_loss_forward(picked2, t2, None, reduction, ignore_index)
    else:
        loss, total = torch.zeros((), device=device), torch.zeros((), device=device)  # no targets: unused
    z = z_coef * lse.pow(2).mean() if z_coef else torch.zeros((), device=device)
    return loss, z, max_logit, lse, total, grad_h, grad_w.to(weight.dtype)


def _backward_impl(
    g_loss: Tensor | None,
    g_z: Tensor | None,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None,
    lse: Tensor,
    total: Tensor,
    ignore_index: int,
    z_coef: float,
    rows: int,
    dtype: torch.dtype,
    reduction: int,
    need_h: bool,
    need_w: bool,
) -> tuple[Tensor, Tensor]:
    """``(grad_hidden, grad_weight)`` (empty when not needed), Cut Cross-Entropy's way: each chunk's logits
    recomputed, then the ops autograd runs for the full logits (the loss's and the z-loss's), applied to it."""
    N = hidden.shape[0]
    hc, wc = hidden.to(dtype), weight.to(dtype)
    grad_h, grad_w = _grad_buffers(hidden, weight, need_h, need_w)
    use_loss, use_z = targets is not None and g_loss is not None, bool(z_coef) and g_z is not None
    if not (use_loss or use_z):
        return grad_h.zero_(), grad_w.to(weight.dtype)
    if use_z:  # the study's z-loss backward: x coefficient, mean (/ N), pow(2) (x 2 lse)
        gz_rows = ((g_z * z_coef) / N) * (2 * lse)  # (N,)
    # fp32 chunks reuse four buffers: logits (then the loss's gradient to logp), the z-loss's gradient, logp, the
    # loss's gradient to the logits
    buf = _ChunkBuffers(min(rows, N), weight.shape[0], hidden.device, 4) if dtype == torch.float32 else None
    for s in range(0, N, rows):
        n, h_n = min(rows, N - s), hc[s : s + rows]
        lf = h_n.mm(wc.t()).float() if buf is None else torch.mm(h_n, wc.t(), out=buf.get(0, n))  # (n, V), recomputed
        g = None
        if use_z:  # logsumexp's backward: grad * exp(logits - lse)
            lse_n = lse[s : s + n].unsqueeze(1)
            diff = lf - lse_n if buf is None else torch.sub(lf, lse_n, out=buf.get(1, n))
            g = diff.exp_().mul_(gz_rows[s : s + n].unsqueeze(1)).to(dtype)
        if use_loss:
            logp = torch.log_softmax(lf, dim=1) if buf is None else torch._log_softmax(lf, 1, False, out=buf.get(2, n))
            del lf
            outs = None if buf is None else (buf.get(0, n), buf.get(3, n))
            gc = _ce_grad(logp, targets[s : s + n], g_loss, total, ignore_index, reduction, outs).to(dtype)
            del logp
            g = gc if g is None else g.add_(gc)  # autograd sums the two paths' grads in the logits' dtype
        _to_inputs(g, hc, wc, s, grad_h, grad_w)
    return grad_h, grad_w.to(weight.dtype)


def _forward_fake(hidden, weight, targets, ignore_index, z_coef, rows, dtype, reduction, stats, need_h, need_w):
    scalar = hidden.new_empty((), dtype=torch.float32)
    lse = hidden.new_empty((hidden.shape[0] if stats or z_coef else 0,), dtype=torch.float32)
    in_forward = _grads_in_forward(targets, z_coef, dtype)
    grad_h = hidden.new_empty(hidden.shape if need_h and in_forward else (0,))
    grad_w = weight.new_empty(weight.shape if need_w and in_forward else (0,))
    return scalar, torch.empty_like(scalar), torch.empty_like(scalar), lse, torch.empty_like(scalar), grad_h, grad_w


def _backward_fake(g_loss, g_z, hidden, weight, targets, lse, total, ignore_index, z_coef, rows, dtype, red, nh, nw):
    return hidden.new_empty(hidden.shape if nh else (0,)), weight.new_empty(weight.shape if nw else (0,))


_ARGS = "int ignore_index, float z_coef, int rows, ScalarType dtype, int reduction"
_fwd_op = torch.library.custom_op(
    "lnblocks::lm_head_ce_fwd",
    _forward_impl,
    mutates_args=(),
    schema=(
        f"(Tensor hidden, Tensor weight, Tensor? targets, {_ARGS}, bool stats, bool need_h, bool need_w) -> "
        f"({', '.join(['Tensor'] * 7)})"
    ),
)
_fwd_op.register_fake(_forward_fake)
_bwd_op = torch.library.custom_op(
    "lnblocks::lm_head_ce_bwd",
    _backward_impl,
    mutates_args=(),
    schema=(
        "(Tensor? g_loss, Tensor? g_z, Tensor hidden, Tensor weight, Tensor? targets, Tensor lse, Tensor total, "
        f"{_ARGS}, bool need_h, bool need_w) -> (Tensor, Tensor)"
    ),
)
_bwd_op.register_fake(_backward_fake)


def _setup_context(ctx: Any, inputs: tuple, output: tuple, eager: bool = False) -> None:
    hidden, weight, targets, ignore_index, z_coef, rows, dtype, reduction, _stats, need_h, need_w = inputs
    _loss, _z, max_logit, lse, total, grad_h, grad_w = output
    ctx.mark_non_differentiable(max_logit, lse, total, grad_h, grad_w)
    ctx.set_materialize_grads(False)
    ctx.in_forward = _grads_in_forward(targets, z_coef, dtype) and (need_h or need_w)
    if ctx.in_forward and eager:  # kept on ctx alone: the backward scales them in place and hands them on
        ctx.grads = [grad_h, grad_w]
    elif ctx.in_forward:  # the gradients are there: keep them, not the inputs
        ctx.save_for_backward(grad_h, grad_w)
    else:
        ctx.save_for_backward(hidden, weight, targets, lse, total)
    ctx.args = (ignore_index, z_coef, rows, dtype, reduction)


DOUBLE_BACKWARD = (
    "the chunked LM head (lm_head_loss, GPT.forward(..., return_logits=False)) has no double backward: its backward "
    "is computed chunk by chunk outside autograd, so a graph of it (create_graph=True: gradient penalties, "
    "Hessian-vector products) would silently miss the head's second derivatives; compute the logits instead "
    "(GPT.forward(..., return_logits=True), or F.linear then F.cross_entropy)"
)


def _backward(ctx: Any, g_loss: Tensor | None, g_z: Tensor | None, *_: Any, through_op: bool = True) -> tuple:
    if torch.is_grad_enabled() and not through_op:  # create_graph=True: the backward itself would be differentiated
        raise RuntimeError(DOUBLE_BACKWARD)
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if ctx.in_forward and not through_op:  # eager: scaled in place, no second (V, C) buffer
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError(
                "lm_head_loss: its backward ran twice (retain_graph): the gradients it computes in the forward are "
                "scaled in place by the first; run the forward again for a second backward"
            )
        if g_loss is None:
            return None, None, *([None] * 9)
        grad_h, grad_w = grads[0].mul_(g_loss.to(grads[0].dtype)), grads[1].mul_(g_loss.to(grads[1].dtype))
    elif ctx.in_forward:  # scale the forward's gradients (for an upstream 1) by the upstream gradient
        grad_h, grad_w = ctx.saved_tensors
        if g_loss is None:
            return None, None, *([None] * 9)
        grad_h, grad_w = grad_h * g_loss.to(grad_h.dtype), grad_w * g_loss.to(grad_w.dtype)
    else:
        hidden, weight, targets, lse, total = ctx.saved_tensors
        bwd = _bwd_op if through_op else _backward_impl
        grad_h, grad_w = bwd(g_loss, g_z, hidden, weight, targets, lse, total, *ctx.args, need_h, need_w)
    return (grad_h if need_h else None), (grad_w if need_w else None), *([None] * 9)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The eager route to the same forward, context and backward: no op dispatcher (whose first call imports
    torch._dynamo, seconds) and no per-call dispatch overhead; ``torch.compile`` traces the custom ops instead."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, ...]:  # type: ignore[override]
        output = _forward_impl(*inputs)
        _setup_context(ctx, inputs, output, eager=True)
        return output

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:  # type: ignore[override]
        return _backward(ctx, *grads, through_op=False)


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``F.linear(hidden, weight)`` computes in: autocast's for fp32/low-precision inputs, else theirs."""
    device_type, castable = hidden.device.type, (torch.float32, *_LOW)
    autocast = device_type in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device_type)
    if autocast and hidden.dtype in castable and weight.dtype in castable:
        return torch.get_autocast_dtype(device_type)
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    return hidden.dtype


def _one_chunk(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None,
    ignore_index: int,
    z_coef: float,
    stats: bool,
    reduction: str,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """All rows at once through autograd: ``F.linear`` then the fp32 loss, as ``GPT.forward`` computes it (on
    ``hidden`` in its own shape: under autocast a 2-D and a 3-D ``F.linear`` differ in the last bit)."""
    logits = F.linear(hidden, weight).reshape(-1, weight.shape[0])  # (N, V); a 1-D hidden is one row
    # each use takes its own .float(), as GPT.forward and the study's z-loss do: under autocast their gradients
    # are then rounded to the logits' dtype before they are summed
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction=reduction)
    lse = torch.logsumexp(logits.float(), dim=-1) if stats or z_coef else None  # (N,)
    z = z_coef * lse.pow(2).mean() if z_coef else None
    max_logit = _max_or_minus_inf(logits.detach().float()) if stats else None
    return loss, z, max_logit, None if lse is None else lse.detach()


def _max_or_minus_inf(t: Tensor) -> Tensor:
    """The largest element, or -inf when there is none (an empty batch: the max of no logits, as the chunked path
    gives; ``amax`` of an empty tensor raises)."""
    return t.amax() if t.numel() else torch.full((), float("-inf"), device=t.device)


def _check_plain(weight: Tensor) -> None:
    if torch.compiler.is_compiling():
        return
    if type(weight) not in (Tensor, nn.Parameter) and not is_fake(weight):
        raise TypeError(
            f"the chunked LM head needs a plain tensor weight, got {type(weight).__name__} (a sharded lm_head: "
            "compute the logits instead, GPT.forward(..., return_logits=True))"
        )


def check_targets(targets: Any, shape: tuple[int, ...], vocab: int, ignore_index: int, name: str = "targets") -> Tensor:
    """``targets`` as int64 of ``shape``, each in ``[0, vocab)`` or ``ignore_index``; errors name ``name``.

    The value check is eager (``ValueError``) on CPU, a device-side ``torch._assert_async`` on accelerators and
    inside ``torch.compile`` (no host sync; a ``RuntimeError`` when checked), absent on meta/fake tensors."""
    if not isinstance(targets, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of class ids, got {type(targets).__name__}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer class ids (int64 or int32), got {targets.dtype}")
    if tuple(targets.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(targets.shape)}")
    targets = targets.long()
    compiling = torch.compiler.is_compiling()
    if targets.numel() == 0 or targets.device.type == "meta" or (not compiling and is_fake(targets)):
        return targets
    ok = (targets == ignore_index) | ((targets >= 0) & (targets < vocab))
    if compiling or targets.device.type != "cpu":
        torch._assert_async(ok.all(), f"{name}: class ids must be in [0, {vocab}) or {ignore_index} (ignored)")
        return targets
    if not bool(ok.all()):  # CPU tensor: no device synchronisation
        bad = targets[~ok]
        raise ValueError(
            f"{name}: class ids must be in [0, vocab_size={vocab}) or {ignore_index} (ignored), got "
            f"{bad.numel()} outside (min {int(bad.min())}, max {int(bad.max())})"
        )
    return targets


def lm_head_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor | None = None,
    *,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    stats: bool | None = None,
    chunk_rows: int | None = None,
    reduction: str = "mean",
) -> tuple[Tensor | None, LMHeadStats]:
    """``(loss, stats)`` of the LM head ``logits = hidden @ weight.T`` without materialising the logits.

    ``hidden``: ``(..., C)``; ``weight``: ``(V, C)`` (tied or not: gradients reach whatever tensor is passed);
    ``targets``: ``hidden.shape[:-1]`` class ids, ``ignore_index`` entries skipped, or None (stats only).
    ``loss``: the mean fp32 cross-entropy over the non-ignored positions, what ``F.cross_entropy(logits.float(),
    targets)`` gives (NaN with every target ignored, gradients then zero), None without targets. ``z_loss``: the
    coefficient of ``mean(log(Z)^2)`` (PaLM, Chowdhery et al. 2022, arXiv 2204.02311), returned in ``stats``.
    Under ``torch.autocast`` the head runs in the autocast dtype and the softmax in fp32, as ``F.linear`` then
    ``.float()`` would. ``stats``: also compute ``max_logit`` and ``log_z`` (None: only without targets, where
    they are all there is to compute; they cost a max and a logsumexp per chunk). ``chunk_rows``: rows per chunk
    (default ``default_chunk_rows``). ``reduction``: "mean" (the above) or "sum" (the summed cross-entropy of the
    counted positions, ``F.cross_entropy(..., reduction="sum")``'s bits: what HF's causal-LM loss divides by
    ``num_items_in_batch`` under gradient accumulation).
    """
    if not isinstance(hidden, Tensor):
        raise TypeError(f"hidden must be a torch.Tensor of shape (..., C), got {type(hidden).__name__}")
    if hidden.dim() < 1:
        raise ValueError(f"hidden must have shape (..., C), got {tuple(hidden.shape)}")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must have shape (V, C) with C = hidden.shape[-1] = {hidden.shape[-1]}, got {got}")
    if not torch.compiler.is_compiling():  # traced, a changed float arrives as a symbol: checked on the eager call
        z_loss = check_float("z_loss", z_loss, lo=0)
        ignore_index = check_int("ignore_index", ignore_index, minimum=-(2**63), maximum=2**63 - 1)  # an int64
    lead, (V, C) = tuple(hidden.shape[:-1]), weight.shape
    if targets is not None:
        targets = check_targets(targets, lead, V, ignore_index).reshape(-1)
    h2 = hidden.reshape(-1, C)  # (N, C)
    N = h2.shape[0]
    if chunk_rows is not None:
        chunk_rows = check_int("chunk_rows", chunk_rows)
    stats = targets is None if stats is None else check_bool("stats", stats)
    reduction = check_choice("reduction", reduction, tuple(REDUCTIONS))
    _check_plain(weight)
    dtype = _compute_dtype(hidden, weight)
    grad = torch.is_grad_enabled() and (h2.requires_grad or weight.requires_grad)
    recompute = grad and not _grads_in_forward(targets, z_loss, dtype)  # the backward's four buffers
    rows = default_chunk_rows(N, V, 5 if recompute else 3) if chunk_rows is None else chunk_rows
    if rows >= N:  # small logits: the plain autograd path, which is today's computation itself
        loss, z, max_logit, lse = _one_chunk(hidden, weight, targets, ignore_index, z_loss, stats, reduction)
    else:
        fn = _fwd_op if torch.compiler.is_compiling() else _ChunkedLinearCrossEntropy.apply
        grad = torch.is_grad_enabled()
        need_h, need_w = grad and h2.requires_grad, grad and weight.requires_grad
        args = (ignore_index, z_loss, rows, dtype, REDUCTIONS[reduction], stats, need_h, need_w)
        loss, z, max_logit, lse, *_ = fn(h2, weight, targets, *args)
    out = LMHeadStats(z if z_loss else None, max_logit if stats else None, lse.view(lead) if stats else None)
    return (loss if targets is not None else None), out
