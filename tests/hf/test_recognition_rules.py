"""Recognition by math, not spelling: each rule of ``lnblocks.hf.norm_graph`` on a class written for it.

A spelling the rules reduce is recognised and, patched, gives its own forward's outputs and gradients bit for bit
(the reference: the class itself). A class whose rounding differs (a cast in another place, a value cast twice where
the math casts it once, an op the math does not have) is refused, and the reason names the op.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lnblocks.hf import patch_norms
from lnblocks.hf.recognition import recognise
from lnblocks.hf.record import record_of


class _Weighted(nn.Module):
    def __init__(self, dim: int = 24, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.eps = eps


class HelperTypeAs(_Weighted):
    """Llama's rounding as Llama 4 spells it: a `_norm` helper, `x.float()`, `type_as`, the weight on the right."""

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class KeywordsAndSquare(_Weighted):
    """Llama's rounding with `torch.mean(..., dim=-1)`, `square()`, `.to(dtype=torch.float32)`, an annotated local."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype: torch.dtype = hidden.dtype
        h = hidden.to(dtype=torch.float32)
        ms = torch.mean(h.square(), dim=-1, keepdim=True)
        return self.weight * (h * (ms + self.eps).rsqrt()).to(dtype)


class UpcastWeight(_Weighted):
    """OLMo 2's rounding spelt with the weight cast to fp32 first (NemotronH, Helium)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(torch.float32) * h).to(x.dtype)


class PowRsqrt(_Weighted):
    """`torch.pow(v, -0.5)` for `rsqrt` (Gemma4Unified): the same forward, another backward rounding."""

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (h * self.weight.float()).type_as(x)


class GroupedByCount(_Weighted):
    """A grouped gated norm spelt with explicit dims and a group count (FalconH1's way), gate after the norm."""

    def __init__(self, dim: int = 24, groups: int = 3) -> None:
        super().__init__(dim)
        self.n_groups = groups

    def forward(self, x, gate=None):
        dtype = x.dtype
        b, t, d = x.shape
        h = x.to(torch.float32).view(b, t, self.n_groups, d // self.n_groups)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = (self.weight.view(self.n_groups, d // self.n_groups) * h).view(b, t, d)
        if gate is not None:
            h = h * F.silu(gate.to(torch.float32))
        return h.to(dtype)


class WeightCastTooEarlyNorm(_Weighted):
    """Llama except that the weight multiply is in fp32 on a value already rounded: another rounding."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * h.to(x.dtype)


class CastTwiceNorm(_Weighted):
    """Llama's forward values, but x cast twice: two gradient paths summed in x's dtype (T5 has this; Llama not)."""

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


class InverseOnlyNorm(nn.Module):
    """Returns the inverse RMS itself (``HYV4UnweightedRMSNorm``): no lnblocks norm computes that."""

    eps = 1e-6

    def forward(self, x):
        return torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps).to(x.dtype)


class FlagNorm(_Weighted):
    """A branch on the instance: the weight only when `self.scaled` (Gemma4Unified's `with_scale`)."""

    def __init__(self) -> None:
        super().__init__()
        self.scaled = True

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scaled:
            h = h * self.weight.float()
        return h.type_as(x)


def _run(module: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    y = module(*leaves)
    grads = torch.autograd.grad(y, [*leaves, *module.parameters()], torch.ones_like(y) * 0.7)
    return [y, *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("cls", "math"),
    [
        (HelperTypeAs, "rmsnorm(cast=llama, eps=1e-06)"),
        (KeywordsAndSquare, "rmsnorm(cast=llama, eps=1e-06)"),
        (UpcastWeight, "rmsnorm(cast=fp32, eps=1e-06)"),
        (PowRsqrt, "rmsnorm(cast=fp32, eps=1e-06, torch backend: the class's ops)"),
        (GroupedByCount, "gated_rmsnorm(gate=after, activation=silu, cast=fp32, eps=1e-06, group_size=8)"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_equivalent_spellings_are_recognised_and_exact(cls, math, dtype):
    torch.manual_seed(0)
    original = cls().to(dtype)
    patched = copy.deepcopy(original)
    report = patch_norms(patched, backend="torch")
    assert [e.math for e in report.patched] == [math]
    inputs = [torch.randn(2, 5, 24, dtype=dtype) * 2 + 0.3]
    if cls is GroupedByCount:
        inputs.append(torch.randn(2, 5, 24, dtype=dtype))
    for a, b in zip(_run(original, *inputs), _run(patched, *inputs), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize(
    ("module", "where"),
    [
        (WeightCastTooEarlyNorm(), "`self.weight.float()` where it has `self.weight`"),
        (CastTwiceNorm(), "departs from LlamaRMSNorm math at the same ops, but a value computed once"),
        (InverseOnlyNorm(), "at `torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)` where it has `h *"),
    ],
    ids=["weight-cast", "cast-twice", "inverse"],
)
def test_other_roundings_are_refused_naming_the_op(module, where):
    rec = recognise(module)
    assert rec is not None and rec.math is None and rec.status == "unknown"
    assert where in rec.reason, rec.reason


def test_an_instance_branch_is_guarded():
    """The math is read for the instance's branch; flipping the attribute after patching runs the class's code."""
    torch.manual_seed(0)
    original = FlagNorm().to(torch.bfloat16)
    patched = copy.deepcopy(original)
    patch_norms(patched, backend="torch")
    assert record_of(patched).math.checks == (("scaled", True),)
    x = torch.randn(3, 24, dtype=torch.bfloat16)
    assert torch.equal(patched(x), original(x))
    original.scaled = patched.scaled = False  # now the weight is skipped: the class's own forward runs
    assert torch.equal(patched(x), original(x))
    assert not torch.equal(patched(x), FlagNorm().to(torch.bfloat16).forward(x))


class Doubler(nn.Module):
    def forward(self, x):
        for _ in range(2):
            x = x * 2
        return x


class OddMath(nn.Module):
    def forward(self, x):
        return x @ x.transpose(-1, -2)


def test_modules_that_are_no_norm_are_not_reported():
    assert recognise(Doubler()) is None
    assert recognise(OddMath()) is None
    assert recognise(nn.GELU()) is None
