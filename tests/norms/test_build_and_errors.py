"""build_norm from every kind of name, and the clear errors bad input gets."""

from __future__ import annotations

import pytest
import torch

import lnblocks
from lnblocks.norms.spec import NORM_PRESETS, SPEC_TYPES


@pytest.mark.parametrize("kind", [*SPEC_TYPES, *NORM_PRESETS])
def test_build_every_kind_and_preset(kind: str) -> None:
    norm = lnblocks.build_norm(kind, 16)
    expected = NORM_PRESETS[kind] if kind in NORM_PRESETS else SPEC_TYPES[kind]()
    assert norm.spec == expected
    y = norm(torch.randn(2, 16))
    assert y.shape == (2, 16)


def test_build_from_spec_dict_and_overrides() -> None:
    spec = lnblocks.RMSNormSpec(eps=1e-6, cast="llama")
    assert lnblocks.build_norm(spec, 8).spec == spec
    assert lnblocks.build_norm({"kind": "rmsnorm", "eps": 1e-6, "cast": "llama"}, 8).spec == spec
    assert lnblocks.build_norm("rmsnorm", 8, eps=1e-6, cast="llama").spec == spec
    assert lnblocks.build_norm("llama", 8, eps=1e-5).spec.eps == 1e-5
    assert lnblocks.norm_spec(spec.to_dict()) == spec
    assert lnblocks.build_norm("layernorm", 8, dtype=torch.bfloat16).weight.dtype == torch.bfloat16


def test_unknown_kind_lists_choices() -> None:
    with pytest.raises(
        ValueError, match=r"^kind must be a norm kind or preset; unknown norm kind 'batchnorm'.*layernorm.*rmsnorm"
    ):
        lnblocks.build_norm("batchnorm", 8)
    with pytest.raises(TypeError, match=r"^kind must be a norm kind or preset name, a NormSpec or a dict"):
        lnblocks.build_norm(3, 8)


def test_unknown_option_names_it_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"^bias is not a config key; valid keys of RMSNormSpec: \['residual_in_fp32'"):
        lnblocks.build_norm("rmsnorm", 8, bias=True)
    with pytest.raises(ValueError, match=r"^casting is not a config key"):
        lnblocks.build_norm("llama", 8, casting="gemma")
    with pytest.raises(
        ValueError, match=r"^kind is required in a norm config \{'eps': 1e-05\}; choices: \['layernorm'"
    ):
        lnblocks.build_norm({"eps": 1e-5}, 8)
    with pytest.raises(ValueError, match=r"^kind must be 'layernorm' for LayerNormSpec, got 'rmsnorm'"):
        lnblocks.LayerNormSpec.from_dict({"kind": "rmsnorm"})


@pytest.mark.parametrize("eps", [-1e-5, float("nan"), float("inf"), float("-inf")])
def test_eps_must_be_finite_and_non_negative(eps: float) -> None:
    with pytest.raises(ValueError, match=r"^eps must be a finite number >= 0, got"):
        lnblocks.LayerNorm(8, eps=eps)
    with pytest.raises(ValueError, match=r"^eps must be a finite number >= 0, got"):
        lnblocks.RMSNorm(8, eps=eps)


def test_option_types_are_checked() -> None:
    with pytest.raises(TypeError, match=r"^eps must be a number, got str '1e-5'"):
        lnblocks.LayerNorm(8, eps="1e-5")
    with pytest.raises(TypeError, match=r"^eps must be a number or None, got str"):
        lnblocks.RMSNorm(8, eps="1e-5")
    with pytest.raises(TypeError, match=r"^elementwise_affine must be a bool"):
        lnblocks.LayerNorm(8, elementwise_affine=1)
    with pytest.raises(ValueError, match=r"^cast must be one of \['fp32', 'llama', 't5'\]"):
        lnblocks.RMSNorm(8, cast="gemma")
    with pytest.raises(ValueError, match=r"^cast must be 'fp32' with zero_centered=True .*got 'llama'"):
        lnblocks.RMSNorm(8, cast="llama", zero_centered=True)
    with pytest.raises(ValueError, match=r"^backend must be one of \['auto', 'torch', 'triton'\]"):
        lnblocks.LayerNorm(8, backend="cuda")


@pytest.mark.parametrize("shape", [0, -3, (4, 0)])
def test_normalized_shape_must_be_positive(shape) -> None:
    with pytest.raises(ValueError, match="normalized_shape must have positive sizes"):
        lnblocks.LayerNorm(shape)


@pytest.mark.parametrize("shape", [2.5, "8", (), True])
def test_normalized_shape_type(shape) -> None:
    with pytest.raises(TypeError, match="normalized_shape must be an int"):
        lnblocks.RMSNorm(shape)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "dyt", "scalenorm"])
def test_wrong_last_dimension(kind: str) -> None:
    norm = lnblocks.build_norm(kind, 16)
    with pytest.raises(ValueError, match=r"x: expected trailing dimension\(s\) \(16,\).*got shape \(2, 8\)"):
        norm(torch.randn(2, 8))
    with pytest.raises(ValueError, match="x: expected trailing"):
        lnblocks.build_norm(kind, (4, 4))(torch.randn(4, 16))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_integer_and_complex_inputs_are_rejected(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor .* got torch\."):
        lnblocks.LayerNorm(4)(torch.zeros(2, 4, dtype=dtype))


def test_non_tensor_input() -> None:
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        lnblocks.RMSNorm(2)([[1.0, 2.0]])


@pytest.mark.parametrize("bad_shape", [(1, 16), (16,), (2, 3, 16)])
def test_residual_shape_must_match_exactly(bad_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"residual: expected the same shape as x \(2, 16\).*no broadcasting"):
        lnblocks.LayerNorm(16)(torch.randn(2, 16), residual=torch.randn(bad_shape))


def test_residual_dtype_checked() -> None:
    with pytest.raises(TypeError, match="residual must be a floating-point tensor"):
        lnblocks.RMSNorm(4)(torch.randn(2, 4), residual=torch.ones(2, 4, dtype=torch.long))


def test_backend_is_inspectable_and_auto_uses_torch_on_cpu() -> None:
    norm = lnblocks.RMSNorm(8)
    assert norm.last_backend is None
    x = torch.randn(2, 8)
    assert norm.backend_for(x) == "torch"
    norm(x)
    assert norm.last_backend == "torch"
    assert lnblocks.DyT(8, backend="auto").backend_for(x) == "torch"


def test_triton_backend_without_a_runnable_kernel_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: x is on cpu.*Use backend='auto'"):
        lnblocks.LayerNorm(8, backend="triton")(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"^backend must be 'auto' or 'torch' for norm kind 'scalenorm': it has no"):
        lnblocks.ScaleNorm(8, backend="triton")  # refused when built, not at the first call


def test_triton_backend_checks_parameter_and_residual_dtypes() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"cannot run here: weight is torch\.float64"):
        lnblocks.RMSNorm(8, backend="triton", dtype=torch.float64)(x)
    with pytest.raises(ValueError, match=r"cannot run here: residual is torch\.float64"):
        lnblocks.RMSNorm(8, backend="triton")(x, residual=x.double())


# ---- contradictory options: refused when the norm is built, not at the first call --------------------------------
@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: lnblocks.build_norm("llama", 8, kind="layernorm"), r"^kind 'layernorm' contradicts 'llama'"),
        (lambda: lnblocks.build_norm("rmsnorm", 8, kind="dyt"), r"^kind 'dyt' contradicts 'rmsnorm'"),
        (lambda: lnblocks.build_norm({"kind": "t5"}, 8, kind="layernorm"), r"^kind 'layernorm' contradicts 't5'"),
        (lambda: lnblocks.norm_spec("gemma", kind="layernorm"), r"^kind 'layernorm' contradicts 'gemma'"),
        (lambda: lnblocks.build_norm("llama", 8, kind=3), r"^kind 3 contradicts 'llama'"),
        (lambda: lnblocks.RMSNorm(8, zero_centered=True, elementwise_affine=False), r"^zero_centered must be False"),
        (lambda: lnblocks.LayerNorm(8, zero_centered=True, elementwise_affine=False), r"^zero_centered must be False"),
        (lambda: lnblocks.build_norm("gemma", 8, elementwise_affine=False), r"^zero_centered must be False"),
        (lambda: lnblocks.ScaleNorm(8, backend="triton"), r"^backend must be 'auto' or 'torch' for norm kind 'sca"),
        (lambda: lnblocks.norm_spec({"kind": "scalenorm", "backend": "triton"}), r"^backend must be 'auto' or 'torch'"),
    ],
)
def test_contradictory_options_are_refused(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_agreeing_kind_option_is_accepted() -> None:
    """``kind=`` that names the same kind as the preset (or the kind itself) is not a contradiction."""
    assert lnblocks.build_norm("llama", 8, kind="rmsnorm").spec == lnblocks.norm_spec("llama")
    assert lnblocks.build_norm("layernorm", 8, kind="LayerNorm").spec == lnblocks.LayerNormSpec()
    assert lnblocks.build_norm("llama", dim=8).normalized_shape == (8,)  # dim still works by keyword
    assert lnblocks.NoNorm(backend="triton")(torch.ones(2)).equal(torch.ones(2))  # identity: the option is moot
