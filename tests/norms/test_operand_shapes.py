"""Every tensor a norm reads has the shape its math assumes, checked on every call that can change it.

Before, a replaced parameter of the wrong shape broadcast silently (``RMSNorm(3)`` with a weight of shape ``(1,)``,
where ``torch.nn.RMSNorm`` raises) or, on the fused path, was read past its end (``LayerNorm(8, backend="triton")``
with a weight of 2 elements applied ``[2, 2, 0, 0, 0, 0, 7e-44, -0]``); the functionals normalised over something
else than ``normalized_shape``. Each case here is refused with a ``ValueError`` naming the tensor, on both backends,
whatever replaced the tensor: assignment, ``load_state_dict(assign=True)``, a parametrization, a write into
``_parameters`` (what FSDP2 does), or (fused path) ``weight.data = ...``; and a change that is legal (another dtype)
takes effect instead of being read as the old one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import lnblocks
from lnblocks.norms import functional as LF
from tests.kernels.kernel_helpers import DEVICE

BACKENDS = ["torch", "triton"]
N = 8


def _norm(kind: str, backend: str, n: int = N, **options) -> lnblocks.Norm:
    norm = lnblocks.build_norm(kind, n, backend=backend, device=DEVICE, **options)
    with torch.no_grad():
        for p in norm.parameters():
            p.uniform_(0.5, 1.5)
    return norm


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE)


# ---- replaced parameters of the wrong shape ------------------------------------------------------------------------
CASES = [  # (kind, parameter, wrong shape, backends)
    ("rmsnorm", "weight", (1,), BACKENDS),  # the example: broadcast where torch.nn.RMSNorm raises
    ("llama", "weight", (1,), BACKENDS),
    ("layernorm", "weight", (2,), BACKENDS),  # the out-of-bounds read on the fused path
    ("layernorm", "bias", (1,), BACKENDS),
    ("layernorm", "weight", (N, 1), BACKENDS),
    ("rmsnorm", "weight", (2 * N,), BACKENDS),
    ("dyt", "weight", (1,), ["torch"]),
    ("dyt", "bias", (1,), ["torch"]),
    ("dyt", "alpha", (N,), ["torch"]),
    ("scalenorm", "scale", (N,), ["torch"]),
]
IDS = [f"{k}-{p}-{'x'.join(map(str, s))}" for k, p, s, _ in CASES]


def _cases():
    for (kind, name, shape, backends), case_id in zip(CASES, IDS):
        for backend in backends:
            yield pytest.param(kind, name, shape, backend, id=f"{case_id}-{backend}")


@pytest.mark.parametrize(("kind", "name", "shape", "backend"), list(_cases()))
def test_replaced_parameter_of_the_wrong_shape_is_refused(kind, name, shape, backend) -> None:
    norm = _norm(kind, backend)
    x = _x(4, N)
    norm(x)  # the route is cached: the replacement must still be seen
    setattr(norm, name, nn.Parameter(torch.ones(shape, device=DEVICE)))
    with pytest.raises(ValueError, match=rf"^{name}: expected (shape|a one-element)"):
        norm(x)
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        norm(x, residual=torch.zeros_like(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rmsnorm_raises_where_torch_raises(backend: str) -> None:
    """The issue's example next to the module it imitates."""
    ref = nn.RMSNorm(3)
    ref.weight = nn.Parameter(torch.ones(1))
    with pytest.raises(RuntimeError, match="weight"):
        ref(torch.randn(2, 3))
    ours = lnblocks.RMSNorm(3, backend=backend, device=DEVICE)
    ours.weight = nn.Parameter(torch.ones(1, device=DEVICE))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(3,\) \(normalized_shape\), got \(1,\)"):
        ours(_x(2, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_into_parameters_is_seen(backend: str) -> None:
    """FSDP2 swaps parameters by writing ``module._parameters[name]`` directly (no hook runs)."""
    norm = _norm("layernorm", backend)
    x = _x(3, N)
    norm(x)
    norm._parameters["weight"] = nn.Parameter(torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\)"):
        norm(x)
    norm._parameters["weight"] = nn.Parameter(torch.full((N,), 2.0, device=DEVICE))
    ref = nn.LayerNorm(N, device=DEVICE)
    ref.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), ref(x))


def test_fused_path_checks_the_weight_in_place_on_every_call() -> None:
    """``weight.data = ...`` keeps the Parameter object (no hook, same identity): the fused call checks size, dtype and
    device itself, so the kernel never reads past the weight's end."""
    norm = _norm("layernorm", "triton")
    x = _x(4, N)
    norm(x)
    norm.weight.data = torch.full((2,), 2.0, device=DEVICE)
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\) \(normalized_shape\), got \(2,\)"):
        norm(x)
    norm.bias.data = torch.zeros(3, device=DEVICE)
    norm.weight.data = torch.full((N,), 2.0, device=DEVICE)
    with pytest.raises(ValueError, match=r"^bias: expected shape \(8,\)"):
        norm(x)


# ---- parametrizations ------------------------------------------------------------------------------------------------
class _Slice(nn.Module):
    def forward(self, w):
        return w[:1]


class _Doubled(nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_parametrized_weight_is_checked_on_every_call(kind: str, backend: str) -> None:
    norm = _norm(kind, backend)
    ref = _norm(kind, "torch")
    ref.load_state_dict(norm.state_dict())
    x = _x(3, N)
    norm(x)
    parametrize.register_parametrization(norm, "weight", _Doubled())
    with torch.no_grad():
        ref.weight.mul_(2)
    torch.testing.assert_close(norm(x), ref(x), rtol=1e-5, atol=1e-5)  # the parametrized weight is the one used
    parametrize.register_parametrization(norm, "weight", _Slice(), unsafe=True)  # now a (1,) weight every call
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\) \(normalized_shape\), got \(1,\)"):
        norm(x)


# ---- legal changes take effect -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "layernorm"])
def test_load_state_dict_assign_with_another_dtype_takes_effect(kind: str) -> None:
    """``load_state_dict(assign=True)`` swaps in new Parameter objects (torch checks their shape); the fused route
    must be planned again for their dtype, not read bf16 memory as fp32."""
    norm = _norm(kind, "triton")
    x = _x(3, N)
    norm(x)
    state = {k: (v * 1.5).to(torch.bfloat16) for k, v in norm.state_dict().items()}
    norm.load_state_dict(state, assign=True)
    assert norm.weight.dtype == torch.bfloat16
    ref = _norm(kind, "torch", dtype=torch.bfloat16)
    ref.load_state_dict(state)
    y, y_ref = norm(x), ref(x)
    assert y.dtype == y_ref.dtype
    torch.testing.assert_close(y, y_ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="size mismatch"):  # shapes: torch's own check, before any assignment
        norm.load_state_dict({k: torch.ones(2) for k in state}, assign=True)


# ---- the functionals -------------------------------------------------------------------------------------------------
BAD_SHAPES = [  # (normalized_shape, x shape): torch's F.layer_norm / F.rms_norm raise for each
    ((), (4, 3)),
    ((2, 2), (4, 2, 3)),
    ((7,), (4, 3)),
    ((3, 4), (4, 3)),
]


@pytest.mark.parametrize(("shape", "x_shape"), BAD_SHAPES, ids=str)
@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm", "scale_norm"])
def test_functionals_refuse_what_torch_refuses(fn: str, shape, x_shape) -> None:
    x = torch.randn(x_shape)
    with pytest.raises(RuntimeError):  # the reference behaviour
        (F.rms_norm if fn == "rms_norm" else F.layer_norm)(x, shape)
    call = {
        "layer_norm": lambda: LF.layer_norm(x, shape, None, None, 1e-5),
        "rms_norm": lambda: LF.rms_norm(x, shape, None, 1e-6),
        "scale_norm": lambda: LF.scale_norm(x, shape, torch.ones(1), 1e-5),
    }[fn]
    error = TypeError if shape == () else ValueError
    with pytest.raises(error, match="normalized_shape" if shape == () else r"^x: expected trailing dimension"):
        call()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: LF.rms_norm(x, (3,), torch.ones(1), 1e-6), ValueError, r"^weight: expected shape \(3,\)"),
        (lambda x: LF.rms_norm(x, (3,), torch.ones(3, 1), 1e-6), ValueError, r"^weight: expected shape \(3,\)"),
        (lambda x: LF.layer_norm(x, (3,), torch.ones(3), torch.ones(1), 1e-5), ValueError, r"^bias: expected shape"),
        (lambda x: LF.dyt(x, torch.ones(1), torch.ones(1), None), ValueError, r"^weight: expected the shape of x's"),
        (lambda x: LF.dyt(x, torch.ones(3), None, None), ValueError, r"^alpha: expected a one-element tensor"),
        (lambda x: LF.scale_norm(x, (3,), torch.ones(2), 1e-5), ValueError, r"^scale: expected a one-element"),
        (lambda x: LF.add_residual(x, torch.ones(3)), ValueError, r"^residual: expected the same shape as x"),
        (lambda x: LF.rms_norm(x.long(), (3,), None, 1e-6), TypeError, r"^x must be a floating-point tensor"),
        (lambda x: LF.layer_norm(x, (3,), torch.ones(3, dtype=torch.long), None), TypeError, r"^weight must be a flo"),
        (lambda x: LF.rms_norm(x, (3,), None, -1.0), ValueError, r"^eps must be a finite number >= 0"),
        (lambda x: LF.layer_norm(x, (3,), None, None, float("nan")), ValueError, r"^eps must be a finite number"),
        (lambda x: LF.rms_norm(x, (3,), None, None, cast="gemma"), ValueError, r"^cast must be one of"),
        (lambda x: LF.rms_norm(x, 3.0, None, None), TypeError, r"^normalized_shape must be an int"),
    ],
    ids=lambda v: v.strip("^").split(":")[0].split(" ")[0] if isinstance(v, str) else "",
)
def test_functionals_name_the_bad_argument(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(torch.randn(2, 3))


def test_functionals_accept_what_torch_accepts() -> None:
    """The checks refuse nothing torch's functionals take: bit-identical results on good inputs."""
    x = torch.randn(4, 2, 3)
    w, b = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(LF.layer_norm(x, (2, 3), w, b, 1e-5), F.layer_norm(x, (2, 3), w, b, 1e-5))
    assert torch.equal(LF.rms_norm(x, [3], w[0], 1e-6), F.rms_norm(x, [3], w[0], 1e-6))
    assert torch.equal(LF.rms_norm(x, 3, None, None), F.rms_norm(x, [3]))  # an int and eps=None work too
    assert LF.layer_norm(torch.randn(0, 3), (3,)).shape == (0, 3)
