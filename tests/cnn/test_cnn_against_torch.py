"""lnblocks.cnn norms against their torch.nn equivalents: outputs, grads, running statistics over several training
steps, eval mode, num_batches_tracked, and state_dict round trips in both directions with identical keys."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lnblocks.cnn as C
from tests.cnn.cnn_helpers import assert_state_equal, randomize_, run_fwd_bwd, shifted_input

STEPS = 4

# (ours, torch's, input shape)
BN_CASES = [
    (C.BatchNorm1d, nn.BatchNorm1d, (6, 5)),
    (C.BatchNorm1d, nn.BatchNorm1d, (4, 5, 7)),
    (C.BatchNorm2d, nn.BatchNorm2d, (3, 5, 4, 6)),
    (C.BatchNorm3d, nn.BatchNorm3d, (2, 5, 3, 4, 2)),
    (C.SyncBatchNorm, nn.BatchNorm2d, (3, 5, 4, 6)),  # no process group: the BatchNorm path
]
AFFINE = [(True, True), (True, False), (False, False)]  # (affine, bias)


def _train_and_compare(ours: nn.Module, ref: nn.Module, shape: tuple[int, ...], dtype: torch.dtype) -> list:
    """STEPS training steps on inputs whose means drift; outputs, grads and every buffer must be bit-identical."""
    batch_means = []
    for step in range(STEPS):
        x = shifted_input(shape, dtype, seed=step) + step  # the batch mean moves each step
        g = torch.randn(shape, generator=torch.Generator().manual_seed(100 + step)).to(dtype)
        y_ref, grads_ref = run_fwd_bwd(ref, x, g)
        y, grads = run_fwd_bwd(ours, x, g)
        assert y.dtype == y_ref.dtype
        assert torch.equal(y, y_ref), f"step {step}: max diff {(y - y_ref).abs().max()}"
        for a, b in zip(grads, grads_ref, strict=True):
            assert torch.equal(a, b)
        assert_state_equal(ours, ref)
        batch_means.append(x.double().transpose(0, 1).reshape(shape[1], -1).mean(1))
    return batch_means


@pytest.mark.parametrize(("ours_cls", "ref_cls", "shape"), BN_CASES)
@pytest.mark.parametrize("momentum", [0.1, None, 1.0])
@pytest.mark.parametrize(("affine", "bias"), AFFINE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batchnorm_matches_torch(ours_cls, ref_cls, shape, momentum, affine, bias, dtype) -> None:
    kw = {"eps": 1e-3, "momentum": momentum, "affine": affine, "bias": bias, "dtype": dtype}
    ref = randomize_(ref_cls(shape[1], **kw))
    ours = ours_cls(shape[1], **kw)
    ours.load_state_dict(ref.state_dict())  # torch -> ours
    batch_means = _train_and_compare(ours, ref, shape, dtype)
    assert int(ours.num_batches_tracked) == STEPS
    if momentum is None and dtype == torch.float32:  # cumulative average of the batch means (the start is forgotten)
        torch.testing.assert_close(ours.running_mean.double(), torch.stack(batch_means).mean(0), atol=1e-5, rtol=0)
    ours.eval()
    ref.eval()
    x = shifted_input(shape, dtype, seed=99)
    assert torch.equal(ours(x), ref(x))  # eval: running statistics
    # ours -> torch: a fresh torch module loads our state and computes the same eval output
    ref2 = ref_cls(shape[1], **kw).eval()
    ref2.load_state_dict(ours.state_dict())
    assert torch.equal(ref2(x), ours(x))


@pytest.mark.parametrize(("ours_cls", "ref_cls", "shape"), BN_CASES[1:3])
def test_batchnorm_without_running_stats_matches_torch(ours_cls, ref_cls, shape) -> None:
    ref = randomize_(ref_cls(shape[1], track_running_stats=False))
    ours = ours_cls(shape[1], track_running_stats=False)
    ours.load_state_dict(ref.state_dict())
    assert ours.running_mean is None and ours.num_batches_tracked is None
    _train_and_compare(ours, ref, shape, torch.float32)
    ours.eval()
    ref.eval()
    x = shifted_input(shape, seed=7)
    y = ours(x)
    assert torch.equal(y, ref(x))
    torch.testing.assert_close(y.transpose(0, 1).reshape(shape[1], -1).mean(1), ours.bias, atol=1e-5, rtol=0)


def test_batchnorm_eval_uses_running_stats_and_does_not_update() -> None:
    ours = randomize_(C.BatchNorm2d(3)).eval()
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    x = shifted_input((2, 3, 4, 4))
    expected = (x - ours.running_mean.view(1, 3, 1, 1)) / torch.sqrt(ours.running_var.view(1, 3, 1, 1) + ours.eps)
    expected = expected * ours.weight.view(1, 3, 1, 1) + ours.bias.view(1, 3, 1, 1)
    torch.testing.assert_close(ours(x), expected)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, before[k])


def test_batchnorm_running_var_is_unbiased() -> None:
    ours = C.BatchNorm1d(2, momentum=1.0)  # running stats = the last batch's
    x = shifted_input((5, 2, 3))
    ours(x)
    flat = x.transpose(0, 1).reshape(2, -1)
    torch.testing.assert_close(ours.running_var, flat.var(1, correction=1))
    torch.testing.assert_close(ours.running_mean, flat.mean(1))


def test_batchnorm_old_checkpoint_without_num_batches_tracked_loads() -> None:
    src = randomize_(nn.BatchNorm2d(4))
    state = src.state_dict()
    del state["num_batches_tracked"]
    state._metadata[""]["version"] = 1  # a pre-0.4.1 checkpoint
    ours = C.BatchNorm2d(4)
    ours.load_state_dict(state)
    assert int(ours.num_batches_tracked) == 0
    assert torch.equal(ours.running_var, src.running_var)


IN_CASES = [
    (C.InstanceNorm1d, nn.InstanceNorm1d, (3, 4, 9)),
    (C.InstanceNorm1d, nn.InstanceNorm1d, (4, 9)),  # unbatched
    (C.InstanceNorm2d, nn.InstanceNorm2d, (3, 4, 5, 6)),
    (C.InstanceNorm2d, nn.InstanceNorm2d, (4, 5, 6)),  # unbatched
    (C.InstanceNorm3d, nn.InstanceNorm3d, (2, 4, 3, 4, 5)),
]


@pytest.mark.parametrize(("ours_cls", "ref_cls", "shape"), IN_CASES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("track_running_stats", [False, True])
def test_instancenorm_matches_torch(ours_cls, ref_cls, shape, affine, track_running_stats) -> None:
    kw = {"eps": 1e-4, "momentum": 0.3, "affine": affine, "track_running_stats": track_running_stats}
    ref = randomize_(ref_cls(4, **kw))
    ours = ours_cls(4, **kw)
    ours.load_state_dict(ref.state_dict())
    _train_and_compare(ours, ref, shape, torch.float32)
    ours.eval()
    ref.eval()
    x = shifted_input(shape, seed=5)
    assert torch.equal(ours(x), ref(x))
    ref2 = ref_cls(4, **kw)
    ref2.load_state_dict(ours.state_dict())
    assert_state_equal(ref2, ours)


GN_CASES = [(1, 6, (3, 6)), (2, 6, (3, 6, 5)), (3, 6, (2, 6, 4, 5)), (6, 6, (2, 6, 4, 5)), (2, 4, (2, 4, 3, 2, 3))]


@pytest.mark.parametrize(("groups", "channels", "shape"), GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_groupnorm_matches_torch(groups, channels, shape, affine, dtype) -> None:
    ref = randomize_(nn.GroupNorm(groups, channels, eps=1e-4, affine=affine, dtype=dtype))
    ours = C.GroupNorm(groups, channels, eps=1e-4, affine=affine, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    _train_and_compare(ours, ref, shape, dtype)
    ref2 = nn.GroupNorm(groups, channels, affine=affine, dtype=dtype)
    ref2.load_state_dict(ours.state_dict())
    assert_state_equal(ref2, ours)


class _ChannelsLastLN(nn.Module):
    """The trusted reference: torch.nn.LayerNorm(C) on the (N, H, W, C) view."""

    def __init__(self, c: int, **kw) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("shape", [(2, 8, 5, 3), (1, 3, 1, 1), (4, 16, 7, 7)])
@pytest.mark.parametrize(("affine", "bias"), AFFINE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_layernorm2d_matches_torch_layernorm(shape, affine, bias, dtype, channels_last) -> None:
    c = shape[1]
    ref = randomize_(_ChannelsLastLN(c, eps=1e-6, elementwise_affine=affine, bias=bias, dtype=dtype))
    ours = C.LayerNorm2d(c, eps=1e-6, elementwise_affine=affine, bias=bias, dtype=dtype)
    ours.load_state_dict(ref.ln.state_dict())  # same keys as nn.LayerNorm(C), both ways
    ref.ln.load_state_dict(ours.state_dict())
    x = shifted_input(shape, dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    g = torch.randn(shape).to(dtype)
    y_ref, grads_ref = run_fwd_bwd(ref, x, g)
    y, grads = run_fwd_bwd(ours, x, g)
    assert torch.equal(y, y_ref)
    for a, b in zip(grads, grads_ref, strict=True):
        assert torch.equal(a, b)
    # and it is what it claims: zero mean, unit variance over C at every pixel (before the affine)
    plain = C.LayerNorm2d(c, eps=1e-6, elementwise_affine=False)(shifted_input(shape, torch.float64))
    torch.testing.assert_close(plain.mean(1), torch.zeros_like(plain.mean(1)), atol=1e-9, rtol=0)


@pytest.mark.parametrize(
    ("ours", "ref"),
    [
        (C.BatchNorm2d(3, momentum=None, bias=False), nn.BatchNorm2d(3, momentum=None, bias=False)),
        (C.InstanceNorm2d(3, affine=True), nn.InstanceNorm2d(3, affine=True)),
        (C.GroupNorm(3, 6, bias=False), nn.GroupNorm(3, 6, bias=False)),
        (C.SyncBatchNorm(3, track_running_stats=False), nn.SyncBatchNorm(3, track_running_stats=False)),
    ],
    ids=["bn", "in", "gn", "syncbn"],
)
def test_same_parameters_buffers_and_repr_as_torch(ours: nn.Module, ref: nn.Module) -> None:
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.extra_repr() == ref.extra_repr()
