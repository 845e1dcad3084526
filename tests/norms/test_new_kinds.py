"""The kinds the 2025-26 families brought against fp64 formulas written out here (gated RMSNorm, l2norm, per-head
and grouped statistics, Derf), their build options and the errors bad options and operands get, and norm-then-add on
the torch backend: bit-identical with ``residual + norm(x)``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lnblocks
from lnblocks.config import ConfigTypeError, ConfigValueError
from lnblocks.norms import Derf, GatedRMSNorm, L2Norm, build_norm
from lnblocks.norms import functional as LF
from tests.norms.helpers import DTYPES, randomize_

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # relative to the output's scale
N = 48


def _err(y: torch.Tensor, ref64: torch.Tensor) -> float:
    return ((y.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1)).item()


def _rms64(h: torch.Tensor, eps: float, group: int | None = None) -> torch.Tensor:
    g = h.reshape(*h.shape[:-1], -1, group or h.shape[-1])
    return (g / (g.pow(2).mean(-1, keepdim=True) + eps).sqrt()).reshape(h.shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("position", ["before", "after"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("group_size", [None, 12])
def test_gated_rmsnorm_formula(position: str, activation: str, group_size: int | None, dtype: torch.dtype) -> None:
    norm = randomize_(GatedRMSNorm(N, gate=position, activation=activation, group_size=group_size, dtype=dtype))
    x, g = (torch.randn(4, N) * 2).to(dtype), torch.randn(4, N).to(dtype)
    act = {"silu": F.silu, "sigmoid": torch.sigmoid}[activation](g.double())
    x64, w64 = x.double(), norm.weight.double()
    if position == "before":
        ref = _rms64(x64 * act, 1e-6, group_size) * w64
    else:
        ref = _rms64(x64, 1e-6, group_size) * w64 * act
    y = norm(x, g)
    assert y.dtype == norm.output_dtype(dtype) and _err(y, ref) <= TOL[dtype]
    assert not torch.equal(y, norm(x)), "the gate had no effect"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_l2norm_formula(reduction: str, dtype: torch.dtype) -> None:
    norm = L2Norm(N, reduction=reduction)
    assert list(norm.parameters()) == [] and norm.state_dict() == {}
    x = (torch.randn(5, N) * 3).to(dtype)
    x64 = x.double()
    total = x64.pow(2).mean(-1, keepdim=True) if reduction == "mean" else x64.pow(2).sum(-1, keepdim=True)
    y = norm(x)
    assert y.dtype == dtype and _err(y, x64 / (total + 1e-6).sqrt()) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_per_head_and_grouped_statistics(kind: str, dtype: torch.dtype) -> None:
    """Per head: weight (heads, head_dim), statistics over head_dim; grouped: the same over a flat row."""
    per_head = randomize_(build_norm(kind, (4, 12), per_head=True, eps=1e-6, dtype=dtype))
    grouped = build_norm(kind, N, group_size=12, eps=1e-6, dtype=dtype)
    grouped.load_state_dict({k: v.reshape(N) for k, v in per_head.state_dict().items()})
    x = (torch.randn(2, 3, 4, 12) * 2 + 0.5).to(dtype)
    x64 = x.double()
    if kind == "layernorm":
        h = (x64 - x64.mean(-1, keepdim=True)) / (x64.var(-1, unbiased=False, keepdim=True) + 1e-6).sqrt()
        ref = h * per_head.weight.double() + per_head.bias.double()
    else:
        ref = _rms64(x64, 1e-6) * per_head.weight.double()
    assert _err(per_head(x), ref) <= TOL[dtype]
    assert torch.equal(grouped(x.reshape(2, 3, N)), per_head(x).reshape(2, 3, N))
    whole = build_norm(kind, (4, 12), eps=1e-6, dtype=dtype)  # without per_head: statistics over both dims
    whole.load_state_dict(per_head.state_dict())
    assert not torch.equal(whole(x), per_head(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("affine", "bias"), [(True, True), (True, False), (False, False)])
def test_derf_formula(affine: bool, bias: bool, dtype: torch.dtype) -> None:
    norm = randomize_(Derf(N, elementwise_affine=affine, bias=bias, dtype=dtype))
    x = (torch.randn(4, N) * 3).to(dtype)
    ref = torch.erf(norm.alpha.double() * x.double() + norm.shift.double())
    if affine:
        ref = ref * norm.weight.double()
    if bias:
        ref = ref + norm.bias.double()
    y = norm(x)
    assert y.dtype == dtype and _err(y, ref) <= TOL[dtype]


def test_derf_init_and_state_dict() -> None:
    """alpha 0.5 and shift 0 as the paper's released code; weight ones, bias zeros."""
    norm = Derf(16)
    assert norm.alpha.item() == 0.5 and norm.shift.item() == 0.0
    assert torch.equal(norm.weight, torch.ones(16)) and torch.equal(norm.bias, torch.zeros(16))
    assert sorted(norm.state_dict()) == ["alpha", "bias", "shift", "weight"]
    assert build_norm("derf", 16, alpha_init=0.3).alpha.item() == pytest.approx(0.3)
    x = torch.randn(3, 16)
    assert torch.equal(norm(x), torch.erf(0.5 * x))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "olmo2", "gemma", "llama", "dyt", "derf", "l2norm",
                                  "cohere", "nemotron", "scalenorm", "none"])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("in_fp32", [False, True], ids=["promote", "residual_in_fp32"])
def test_norm_then_add_is_residual_plus_norm(kind: str, dtype: torch.dtype, in_fp32: bool) -> None:
    """The torch backend is bit for bit ``residual + norm(x)`` (OLMo 2's ``residual + post_attention_layernorm(h)``),
    values and gradients, for every kind, with the fp32 stream too."""
    norm = randomize_(build_norm(kind, N, dtype=dtype, residual_in_fp32=in_fp32))
    x, r = (torch.randn(2, 5, N) * 2).to(dtype), torch.randn(2, 5, N).to(dtype)
    leaves = [x.clone().requires_grad_(), r.clone().requires_grad_()]
    refs = [x.clone().requires_grad_(), r.clone().requires_grad_()]
    y, new = norm.norm_then_add(*leaves, return_normed=True)
    y_ref = norm(refs[0])
    new_ref = LF.add_residual(refs[1], y_ref, in_fp32) if in_fp32 else refs[1] + y_ref
    assert new.dtype == new_ref.dtype and torch.equal(new, new_ref) and torch.equal(y, y_ref)
    assert torch.equal(norm.norm_then_add(*leaves), new)
    g = torch.randn(new.shape).to(new.dtype)
    params = list(norm.parameters())
    a = torch.autograd.grad(new, leaves + params, g, allow_unused=True)
    b = torch.autograd.grad(new_ref, refs + params, g, allow_unused=True)
    for u, v in zip(a, b, strict=True):
        assert (u is None and v is None) or torch.equal(u, v)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: build_norm("rmsnorm", 12, group_size=5), ValueError, r"group_size 5 must divide the 12 normalised"),
        (lambda: build_norm("rmsnorm", 12, group_size=0), ConfigValueError, r"^group_size must be >= 1, got 0"),
        (lambda: build_norm("layernorm", 12, group_size=2.5), ConfigTypeError, r"^group_size must be an int"),
        (lambda: build_norm("cohere_qk", (2, 6), group_size=3), ConfigValueError, r"^group_size must be None with "
                                                                                  r"per_head=True"),
        (lambda: build_norm("layernorm", 12, cast="llama"), ConfigValueError, r"^cast must be one of \['fp32', "
                                                                              r"'cohere', 'nemotron'\]"),
        (lambda: build_norm("mamba2_gated", 12, gate="middle"), ConfigValueError, r"^gate must be one of"),
        (lambda: build_norm("mamba2_gated", 12, activation="relu"), ConfigValueError, r"^activation must be one of"),
        (lambda: build_norm("mamba2_gated", 12, cast="t5"), ConfigValueError, r"^cast must be one of \['llama', "),
        (lambda: build_norm("mamba2_gated", 12, residual_in_fp32=True), ConfigValueError, r"^residual_in_fp32 must "
                                                                                          r"be False for gated"),
        (lambda: build_norm("l2norm", 12, reduction="max"), ConfigValueError, r"^reduction must be one of"),
        (lambda: build_norm("l2norm", 12, elementwise_affine=True), ConfigValueError, r"^elementwise_affine is not"),
        (lambda: build_norm("derf", 12, alpha_init=0), ConfigValueError, r"^alpha_init must be a finite number > 0"),
        (lambda: build_norm("rmsnorm", 12, memory_efficient=True, backend="torch"), ConfigValueError,
         r"^memory_efficient needs the fused kernels"),
    ],
)  # fmt: skip
def test_bad_options_are_refused(build, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        build()


def test_bad_gates_and_functional_arguments() -> None:
    norm = build_norm("mamba2_gated", N)
    x = torch.randn(3, N)
    with pytest.raises(ValueError, match=r"^gate: expected the shape of x \(3, 48\), got \(1, 48\)"):
        norm(x, torch.randn(1, N))
    with pytest.raises(TypeError, match=r"^gate must be a floating-point tensor"):
        norm(x, torch.ones(3, N, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^position must be one of \['before', 'after'\]"):
        LF.gated_rms_norm(x, x, N, None, 1e-6, "during")
    with pytest.raises(ValueError, match=r"^reduction must be 'mean' or 'sum'"):
        LF.l2_norm(x, N, 1e-6, "max")
    with pytest.raises(ValueError, match=r"^shift: expected a one-element tensor"):
        LF.derf(x, torch.ones(1), torch.ones(2))
    with pytest.raises(ValueError, match=r"^cast must be one of \['fp32', 'cohere', 'nemotron'\]"):
        LF.layer_norm(x, N, cast="llama")
    with pytest.raises(ValueError, match=r"^group_size 5 must divide"):
        LF.rms_norm(x, N, group_size=5)


def test_presets_are_rows_of_the_family_table() -> None:
    from lnblocks.norms import MODEL_FAMILIES, NORM_PRESETS

    for name in ("llama4", "llama4_qk", "nemotron", "nemotron_h", "nemotron_h_gated", "mamba2_gated",
                 "qwen3_next_gated", "falcon_h1_gated", "cohere", "cohere_qk", "derf"):  # fmt: skip
        assert name in MODEL_FAMILIES and NORM_PRESETS[name] == lnblocks.norm_spec(dict(MODEL_FAMILIES[name].norm))
    assert NORM_PRESETS["qwen3_next_gated"].gate == "after" and NORM_PRESETS["falcon_h1_gated"].cast == "fp32"
    assert math.isclose(NORM_PRESETS["llama4"].eps, 1e-5) and NORM_PRESETS["cohere_qk"].per_head
