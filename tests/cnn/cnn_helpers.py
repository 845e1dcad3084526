"""Shared helpers for the CNN norm tests: forward+backward runs, state copies, fp64-referenced error bounds."""

from __future__ import annotations

import torch
from torch import Tensor, nn

# Per-dtype tolerances for "same math, different op order" (ours composite vs a native kernel).
TOL = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
}


def randomize_(module: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial parameters and running statistics, so a swapped weight/bias or mean/var cannot pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if not t.is_floating_point():
                continue
            r = torch.rand(t.shape, generator=g, dtype=torch.float64)
            if name.endswith(("weight", "running_var")):
                t.copy_(0.5 + r)  # positive
            else:
                t.copy_(r * 2 - 1)
    return module


def run_fwd_bwd(module: nn.Module, x: Tensor, grad_out: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Output and grads w.r.t. ``x`` and every parameter (sorted by name)."""
    x = x.detach().requires_grad_(True)
    y = module(x)
    params = [p for _, p in sorted(module.named_parameters())]
    grads = torch.autograd.grad(y, [x, *params], grad_out)
    return y.detach(), [g.detach() for g in grads]


def assert_state_equal(a: nn.Module, b: nn.Module, exact: bool = True, **tol: float) -> None:
    """Identical state_dict keys (in order) and values."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        if exact:
            assert torch.equal(sa[k], sb[k]), (k, sa[k], sb[k])
        else:
            torch.testing.assert_close(sa[k], sb[k], **tol, msg=k)


def shifted_input(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> Tensor:
    """Random input whose channels have different means and scales (dim 1), as real activations do."""
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    view = (1, c) + (1,) * (len(shape) - 2)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    scale = torch.linspace(0.5, 3.0, c, dtype=torch.float64).view(view)
    shift = torch.linspace(-2.0, 4.0, c, dtype=torch.float64).view(view)
    x = x * scale + shift
    return x.to(dtype)


def gradcheck_module(module: nn.Module, *inputs: Tensor) -> None:
    """fp64 ``torch.autograd.gradcheck`` of ``module(*inputs)`` w.r.t. the inputs and every parameter."""
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().double().requires_grad_(True) for _, p in module.named_parameters()]
    xs = [x.detach().double().requires_grad_(True) for x in inputs]
    module = module.double()

    def call(*args: Tensor) -> Tensor:
        state = dict(zip(names, args[len(xs) :], strict=True))
        return torch.func.functional_call(module, state, tuple(args[: len(xs)]))

    assert torch.autograd.gradcheck(call, (*xs, *params), eps=1e-6, atol=1e-6, rtol=1e-5)


def state_dict_round_trip(make, x: Tensor) -> None:
    """A fresh module loading another's (trained, randomised) state_dict computes the same outputs in train and
    eval mode, and its state_dict has the same keys and values."""
    a = randomize_(make())
    a(x)  # one training step moves any running statistics
    b = make()
    b.load_state_dict(a.state_dict())
    assert_state_equal(a, b)
    for mode in (True, False):
        a.train(mode)
        b.train(mode)
        assert torch.equal(a(x), b(x)), f"training={mode}"
