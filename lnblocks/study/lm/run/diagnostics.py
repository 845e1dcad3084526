"""Stability diagnostics of a ``GPT`` during training, cheap enough to leave on (benchmarks/study/bench_study.py).

Per layer and weight group (W_Q, W_K, W_V: attention in; W_O: attention out; W_1 (and W_3): MLP in; W_2: MLP out;
``norm``: every norm gain/bias of the block): gradient norms and update-to-weight ratios ``||dW|| / ||W||``.
From a probe forward pass on a fixed batch: the residual-stream RMS after the embedding and after each block
(Xiong et al. 2020, Lemma 2: flat for Post-LN, growing with depth for Pre-LN) and its max and median |h| (massive
activations, Sun et al. 2024, arXiv 2402.17762), the max attention logit, mean attention entropy and first-token
attention mass (the attention sink; gated attention, arXiv 2505.06708) per layer through the eager attention backend
(Wortsman et al. 2023; Zhai et al. 2023), the max output logit and mean log Z (z-loss, PaLM), and with
hyper-connections the composite mixing gain (arXiv 2409.19606, 2512.24880).
At init: Xiong et al.'s *expected gradient* (the gradient averaged over a few batches, then its Frobenius norm;
Fig. 3), next to the mean of the per-batch norms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

_MATRIX = re.compile(r"blocks\.(\d+)\.(W_\w+)$")


def _round(values: Tensor) -> list[float]:
    return [float(f"{v:.6g}") for v in values.tolist()]


def _by_layer(named: dict[str, Tensor], n_layers: int) -> dict[str, list[int | Tensor]]:
    """``{"blocks.3.W_Q": t}`` -> ``{"W_Q": [t_0, ..., t_{L-1}]}``."""
    out: dict[str, list[Any]] = {}
    for name, t in named.items():
        m = _MATRIX.match(name)
        if m is None:
            continue
        out.setdefault(m.group(2), [None] * n_layers)[int(m.group(1))] = t
    return out


def norm_params(block: nn.Module) -> list[nn.Parameter]:
    """Every parameter of the norms in ``block`` (gains, biases, DyT's alpha; q/k norms included)."""
    return [p for name, p in block.named_parameters() if "norm" in name.rpartition(".")[0].rpartition(".")[2]]


def _group_norms(groups: dict[str, list[Tensor]]) -> dict[str, list[float]]:
    """Frobenius norms of every tensor, per group and layer, in one device->host transfer."""
    keys = list(groups)
    flat = [t for k in keys for t in groups[k]]
    if not flat:
        return {}
    norms = torch.stack([torch.linalg.vector_norm(t.float()) for t in flat]).cpu()
    out, i = {}, 0
    for k in keys:
        n = len(groups[k])
        out[k] = _round(norms[i : i + n])
        i += n
    return out


def _norm_group(model: nn.Module, grad: bool) -> list[Tensor] | None:
    """Per layer, all norm parameters (or their grads) flattened into one vector; None if the model has none."""
    per_layer = []
    for blk in model.blocks:
        ps = [(p.grad if grad else p.detach()) for p in norm_params(blk)]
        per_layer.append([p.flatten() for p in ps if p is not None])
    if not any(per_layer):
        return None
    zero = torch.zeros(1, device=model.lm_head.weight.device)
    return [torch.cat(ps) if ps else zero for ps in per_layer]


def weight_groups(model: nn.Module, grad: bool = False) -> dict[str, list[Tensor]]:
    """``{"W_Q": [layer 0, ...], ..., "norm": [...]}``: the matrices (or grads) by role and layer."""
    groups = _by_layer(model.matrices(grad=grad), len(model.blocks))
    norms = _norm_group(model, grad)
    if norms is not None:
        groups["norm"] = norms
    return groups


def grad_norms(model: nn.Module) -> dict[str, Any]:
    """Per group and layer ``||grad||_F``, and the global gradient norm over all parameters (before clipping)."""
    out: dict[str, Any] = {"grad_norm": _group_norms(weight_groups(model, grad=True))}
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    out["grad_norm_total"] = float(f"{float(total):.6g}")
    return out


def snapshot(model: nn.Module) -> dict[str, list[Tensor]]:
    """Copies of the weights by group and layer, taken before an optimizer step (for ``update_ratios``)."""
    return {k: [t.detach().clone() for t in ts] for k, ts in weight_groups(model).items()}


def update_ratios(model: nn.Module, before: dict[str, list[Tensor]]) -> dict[str, list[float]]:
    """``||W_after - W_before||_F / ||W_before||_F`` per group and layer (0 where the weight is all zeros)."""
    now = weight_groups(model)
    diffs = {k: [a - b for a, b in zip(now[k], before[k])] for k in before}
    num, den = _group_norms(diffs), _group_norms(before)
    return {k: [float(f"{n / d:.6g}") if d > 0 else 0.0 for n, d in zip(num[k], den[k])] for k in num}


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run every attention layer with the eager backend inside the block (it records per-head max logit and
    entropy in ``attn.last_stats``), then restore each layer's configured backend."""
    saved = [blk.attn.config for blk in model.blocks]
    try:
        for blk in model.blocks:
            blk.attn.config = dataclasses.replace(blk.attn.config, backend="eager")
        yield
    finally:
        for blk, cfg in zip(model.blocks, saved):
            blk.attn.config = cfg


@contextlib.contextmanager
def recording_mixing(model: nn.Module) -> Iterator[list[nn.Module]]:
    """Inside the block every hyper-connection keeps its residual mixing matrix of the latest call (``last_mixing``);
    yields them in sublayer order (empty without hyper-connections), restored afterwards."""
    hcs = [hc for blk in model.blocks for hc in (getattr(blk, "attn_hc", None), getattr(blk, "mlp_hc", None))
           if hc is not None]  # fmt: skip
    try:
        for hc in hcs:
            hc.record = True
        yield hcs
    finally:
        for hc in hcs:
            hc.record, hc.last_mixing = False, None


@torch.no_grad()
def probe(model: nn.Module, x: Tensor, attention: bool = True, autocast: Callable[[], Any] | None = None) -> dict:
    """Forward ``x`` ``(B, T)`` in eval mode and return residual-stream norms (RMS, max and median ``|h|``: massive
    activations), attention stats (max logit, entropy, first-token mass: the attention sink), output-logit stats and,
    with hyper-connections, the composite mixing gain (max over tokens; ``lnblocks.blocks.composite_gain``)."""
    from lnblocks.blocks import composite_gain

    was_training = model.training
    model.eval()
    ctx = eager_attention(model) if attention else contextlib.nullcontext()
    try:
        with ctx, recording_mixing(model) as hcs, autocast() if autocast else contextlib.nullcontext():
            # the LM head in chunks: max logit and per-position log Z, no (B, T, V) logits
            head, _, hidden = model(x, return_hidden=True, return_logits=False)  # LMHeadStats, None, L+1 x (B, T, C)
            stats = model.attention_stats() if attention else None
            mixing = [hc.last_mixing.float() for hc in hcs]
    finally:
        model.train(was_training)
    h = torch.stack([t.float() for t in hidden])  # (L+1, B, T, C)
    a = h.abs().flatten(1)  # (L+1, B*T*C)
    rows = [h.pow(2).mean(dim=(1, 2, 3)).sqrt(), a.amax(dim=1), a.median(dim=1).values]
    scalars = [head.max_logit, head.log_z.mean()]
    if mixing:
        scalars.append(composite_gain(mixing).value.amax())
    out: dict[str, Any] = {}
    if stats is not None:
        rows += [torch.stack([s.max_logit.amax() for s in stats]), torch.stack([s.entropy.mean() for s in stats])]
        rows.append(torch.stack([s.first_token_mass.mean() for s in stats]))
    host = [r.cpu() for r in rows]
    out["residual_rms"] = _round(host[0])
    out["residual_max"] = _round(host[1])
    out["residual_median"] = _round(host[2])
    if stats is not None:
        out["attn_max_logit"] = _round(host[3])
        out["attn_entropy"] = _round(host[4])
        out["attn_sink"] = _round(host[5])
    values = _round(torch.stack(scalars).cpu())
    out["max_output_logit"], out["log_z"] = values[:2]
    if mixing:
        out["mixing_gain"] = values[2]
    return out


def expected_grad(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> dict[str, dict[str, list[float]]]:
    """Xiong et al. 2020 Fig. 3 at the current weights: per group and layer, ``||mean_k grad_k||_F`` ("expected")
    and ``mean_k ||grad_k||_F`` ("per_batch"). Leaves every ``.grad`` at None afterwards."""
    total: dict[str, list[Tensor]] | None = None
    per_batch: dict[str, list[float]] = {}
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        _, loss = model(x, y, return_logits=False)  # the LM head and loss in chunks
        loss.backward()
        groups = weight_groups(model, grad=True)
        norms = _group_norms(groups)
        for k, v in norms.items():
            per_batch[k] = [a + b / len(batches) for a, b in zip(per_batch.get(k, [0.0] * len(v)), v)]
        if total is None:
            total = {k: [t.detach().clone() for t in ts] for k, ts in groups.items()}
        else:
            for k, ts in groups.items():
                for acc, t in zip(total[k], ts):
                    acc += t
    model.zero_grad(set_to_none=True)
    assert total is not None
    expected = _group_norms({k: [t / len(batches) for t in ts] for k, ts in total.items()})
    return {"expected": expected, "per_batch": {k: _round(torch.tensor(v)) for k, v in per_batch.items()}}


# ---- measured on the whole model ---------------------------------------------------------------------------


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN/Inf: a non-finite number is stored as null."""
    return None if x is None or not math.isfinite(x) else float(f"{x:.7g}")


def backends_used(model: nn.Module) -> dict[str, str]:
    """The norm and attention backends the latest eager forward of ``model`` ran (``last_backend`` of every norm
    and attention module; several distinct ones joined with ``+``)."""
    from lnblocks.blocks.attention import Attention
    from lnblocks.norms.modules import Norm

    found: dict[str, set[str]] = {"norm_backend": set(), "attention_backend": set()}
    for m in model.modules():
        key = "norm_backend" if isinstance(m, Norm) else "attention_backend" if isinstance(m, Attention) else None
        if key is not None and m.last_backend is not None:
            found[key].add(m.last_backend)
    return {k: "+".join(sorted(v)) if v else "none" for k, v in found.items()}


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: list[tuple[Tensor, Tensor]], autocast: Callable[[], Any], full_logits: bool = False
) -> float:
    """Mean cross-entropy (nats/token) over the fixed held-out batches (``full_logits``: through the logits, not the
    chunked head: a tensor-parallel model, whose head is split over the vocabulary)."""
    was_training = model.training
    model.eval()
    try:
        with autocast():
            total = sum(float(model(x, y, return_logits=full_logits)[1]) for x, y in batches)  # chunked head
    finally:
        model.train(was_training)
    return total / len(batches)


class _SkipBlock(nn.Module):
    """Stands in for a block during ``layer_ablation``: passes the residual stream on unchanged."""

    def forward(self, s: Any, *args: Any) -> Any:
        return s


def layer_ablation(
    model: nn.Module, batches: list[tuple[Tensor, Tensor]], autocast: Callable[[], Any]
) -> list[float | None]:
    """The eval loss with block ``l`` skipped (its input passed on as its output), for every ``l``: how much each
    layer contributes after training (Sun et al. 2025, arXiv 2502.05795: in Pre-LN the deep layers barely do)."""
    out = []
    for i in range(len(model.blocks)):
        block = model.blocks[i]
        model.blocks[i] = _SkipBlock()
        try:
            out.append(finite_or_none(evaluate(model, batches, autocast)))
        finally:
            model.blocks[i] = block
    return out
