"""SyncBatchNorm on two gloo processes (CPU) with unequal shards of different means equals torch.nn.BatchNorm on
the concatenated batch: outputs, running statistics over several steps, input and parameter grads; plus the Chan
merge (and why the average of per-device variances is not enough), convert_sync_batchnorm and the single-process
fallback."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import lnblocks.cnn as C
from lnblocks.cnn.syncbn import merge_moments
from tests.gloo_helpers import run_gloo

WORLD = 2
# (name, per-rank input shapes, dtype, momentum, affine, (atol, rtol)): shards differ in size and mean
CASES = [
    ("4d-fp64", [(3, 4, 5, 2), (7, 4, 5, 2)], torch.float64, 0.1, True, (1e-12, 1e-12)),
    ("4d-fp32-cumulative", [(2, 4, 3, 3), (5, 4, 3, 3)], torch.float32, None, True, (2e-5, 2e-5)),
    ("2d-fp64-no-affine", [(1, 6), (9, 6)], torch.float64, 0.3, False, (1e-12, 1e-12)),  # a 1-sample shard
    ("3d-fp64-empty-shard", [(0, 3, 4), (5, 3, 4)], torch.float64, 0.1, True, (1e-12, 1e-12)),
    ("4d-bf16", [(3, 4, 3, 3), (6, 4, 3, 3)], torch.bfloat16, 0.1, True, (3e-2, 2e-2)),
]
STEPS = 3


def _shard(shape: tuple[int, ...], dtype: torch.dtype, rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    # rank 1's data has another mean and scale than rank 0's, and both drift with the step
    return (torch.randn(shape, generator=g, dtype=torch.float64) * (1 + 2 * rank) + 4 * rank - step).to(dtype)


def _close(ours: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor, tol, scale: float | None = None) -> None:
    """fp32/fp64: ours equals torch.nn's within ``tol``. Half types: ours is no further from the fp64 reference than
    2x torch.nn's own result in that dtype, plus ``atol`` relative to ``scale`` (the brief's low-precision rule)."""
    atol, rtol = tol
    if ref.dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(ours, ref, atol=atol, rtol=rtol)
        return
    err = (ours.double() - ref64).abs().max().item()
    err_torch = (ref.double() - ref64).abs().max().item()
    scale = ref64.abs().max().item() if scale is None else scale
    assert err <= 2 * err_torch + atol * scale, (err, err_torch, scale)


def _check_case(rank: int, shapes, dtype, momentum, affine, tol) -> None:
    c = shapes[0][1]
    bn_cls = nn.BatchNorm1d if len(shapes[0]) < 4 else nn.BatchNorm2d
    ref = bn_cls(c, momentum=momentum, affine=affine, dtype=dtype)
    ours = C.SyncBatchNorm(c, momentum=momentum, affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
            ref.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(4))
    ours.load_state_dict(ref.state_dict())
    ref64 = bn_cls(c, momentum=momentum, affine=affine, dtype=torch.float64)  # the fp64 truth, same start
    ref64.load_state_dict(ref.state_dict())
    lo = sum(s[0] for s in shapes[:rank])  # this rank's rows in the concatenated batch
    hi = lo + shapes[rank][0]
    for step in range(STEPS):
        xs = [_shard(s, dtype, r, step) for r, s in enumerate(shapes)]
        gs = [_shard(s, dtype, r + 7, step) for r, s in enumerate(shapes)]  # upstream grads
        x_all = torch.cat(xs).requires_grad_(True)
        y_all = ref(x_all)
        y_all.backward(torch.cat(gs))
        x64 = torch.cat(xs).double().requires_grad_(True)
        y64 = ref64(x64)
        y64.backward(torch.cat(gs).double())
        x = xs[rank].clone().requires_grad_(True)
        y = ours(x)
        y.backward(gs[rank])
        _close(y, y_all[lo:hi].detach(), y64[lo:hi].detach(), tol)
        _close(x.grad, x_all.grad[lo:hi], x64.grad[lo:hi], tol)
        _close(ours.running_mean, ref.running_mean, ref64.running_mean, tol)
        _close(ours.running_var, ref.running_var, ref64.running_var, tol)
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
        if affine:  # each rank holds its share; the sum over ranks (what DDP reduces) is BatchNorm's
            for p, p_ref, p64 in ((ours.weight, ref.weight, ref64.weight), (ours.bias, ref.bias, ref64.bias)):
                total = p.grad.to(torch.promote_types(p.dtype, torch.float32))
                dist.all_reduce(total)
                scale = p.grad.abs().to(total.dtype)  # shares may cancel: bound rounding by their magnitudes
                dist.all_reduce(scale)
                _close(total, p_ref.grad, p64.grad, tol, scale.max().item())
                p.grad = p_ref.grad = p64.grad = None
    for m in (ours, ref, ref64):
        m.eval()
    x = _shard(shapes[rank], dtype, rank, 99)
    _close(ours(x), ref(x), ref64(x.double()), tol)  # eval: local, running statistics


def _check_converted_model(rank: int) -> None:
    """convert_sync_batchnorm on a Conv-BN-ReLU-Conv-BN model: conv grads summed over ranks equal the full batch's."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), C.BatchNorm2d(2))
    model = C.convert_sync_batchnorm(copy.deepcopy(ref))  # converting shares tensors: convert a copy
    assert isinstance(model[1], C.SyncBatchNorm) and isinstance(model[4], C.SyncBatchNorm)
    sizes = (2, 5)
    xs = [_shard((n, 3, 6, 6), torch.float32, r, 0) for r, n in enumerate(sizes)]
    out_all = ref(torch.cat(xs))
    out_all.square().sum().backward()
    out = model(xs[rank])
    out.square().sum().backward()
    lo = sum(sizes[:rank])
    torch.testing.assert_close(out, out_all[lo : lo + sizes[rank]].detach(), atol=2e-5, rtol=2e-5)
    for (n, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        total = p.grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total, p_ref.grad, atol=1e-4, rtol=1e-4, msg=n)
    for (n, b), (_, b_ref) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(b, b_ref, atol=1e-5, rtol=1e-5, msg=n)


def _worker(rank: int) -> None:
    for name, shapes, dtype, momentum, affine, tol in CASES:
        try:
            _check_case(rank, shapes, dtype, momentum, affine, tol)
        except AssertionError as err:
            raise AssertionError(f"case {name}, rank {rank}: {err}") from err
    _check_converted_model(rank)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_two_gloo_processes_equal_batchnorm_on_concatenated_batch() -> None:
    run_gloo(_worker, WORLD)


def test_chan_merge_equals_statistics_of_the_concatenation() -> None:
    shards = [torch.randn(n, 5, dtype=torch.float64) * s + m for n, s, m in ((1, 1.0, 0.0), (0, 1, 0), (40, 3.0, 1e3))]
    rows = []
    for x in shards:
        n = x.shape[0]
        mean = x.mean(0) if n else torch.zeros(5, dtype=torch.float64)
        m2 = ((x - mean) ** 2).sum(0)
        rows.append(torch.stack([torch.full((5,), float(n), dtype=torch.float64), mean, m2]))
    total, mean, var = merge_moments(torch.stack(rows))
    full = torch.cat(shards)
    assert torch.equal(total, torch.full((5,), 41.0, dtype=torch.float64))
    torch.testing.assert_close(mean, full.mean(0), atol=1e-10, rtol=1e-12)
    torch.testing.assert_close(var, full.var(0, correction=0), atol=1e-10, rtol=1e-12)
    # the often-quoted average of per-rank variances is wrong here (and would be whenever the means differ)
    naive = torch.stack([shards[0].var(0, correction=0), shards[2].var(0, correction=0)]).mean(0)
    assert (naive - var).abs().max() > 1.0


def _merge_shards(shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """SyncBatchNorm's statistics: the Chan merge of per-shard (count, mean, M2) rows."""
    rows = []
    for x in shards:
        n, mean = x.shape[0], x.mean(0)
        rows.append(torch.stack([torch.full_like(mean, n), mean, ((x - mean) ** 2).sum(0)]))
    _, mean, var = merge_moments(torch.stack(rows))
    return mean, var


def test_seed_formula_averaging_device_variances_is_exact_only_for_equal_device_means() -> None:
    """The seed text's SyncBN averages the per-device means and the per-device variances. With equal counts that
    average misses exactly the variance of the device means, so it equals the full-batch variance only when the
    device means are equal (and, with unequal counts, not even then); SyncBatchNorm's merge is exact in every case."""
    g = torch.Generator().manual_seed(0)
    spread = [torch.randn(n, 4, generator=g, dtype=torch.float64) * s for n, s in ((6, 1.0), (6, 2.0), (6, 0.5))]
    equal_means = [x - x.mean(0) + 3.0 for x in spread]  # every device has mean 3
    shifted = [x + offset for x, offset in zip(equal_means, (-2.0, 0.0, 5.0), strict=True)]  # DDP-like: equal counts
    unequal_counts = [equal_means[0][:2], equal_means[1]]  # equal means, 2 vs 6 samples
    for name, shards, seed_exact in (
        ("equal means", equal_means, True),
        ("different means", shifted, False),
        ("unequal counts", unequal_counts, False),
    ):
        full = torch.cat(shards)
        full_var = full.var(0, correction=0)
        seed_var = torch.stack([x.var(0, correction=0) for x in shards]).mean(0)
        gap = full_var - seed_var
        assert bool((gap.abs() < 1e-12).all()) == seed_exact, name
        if name != "unequal counts":  # equal counts: the gap is exactly the (biased) variance of the device means
            device_means = torch.stack([x.mean(0) for x in shards])
            torch.testing.assert_close(gap, device_means.var(0, correction=0), atol=1e-12, rtol=1e-12, msg=name)
        mean, var = _merge_shards(shards)
        torch.testing.assert_close(mean, full.mean(0), atol=1e-12, rtol=1e-12, msg=name)
        torch.testing.assert_close(var, full_var, atol=1e-12, rtol=1e-12, msg=name)
    # With the shifted devices, the seed formula's BatchNorm output differs from full-batch BatchNorm's; ours does not.
    full = torch.cat(shifted)
    mean, var = _merge_shards(shifted)
    seed_var = torch.stack([x.var(0, correction=0) for x in shifted]).mean(0)
    bn = torch.nn.functional.batch_norm(full, None, None, training=True, eps=1e-5)
    torch.testing.assert_close((full - mean) / torch.sqrt(var + 1e-5), bn, atol=1e-10, rtol=1e-10)
    assert ((full - mean) / torch.sqrt(seed_var + 1e-5) - bn).abs().max() > 0.5


def test_convert_sync_batchnorm_shares_tensors_and_keeps_mode() -> None:
    bn = nn.BatchNorm2d(4, momentum=None, bias=False)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Sequential(bn, C.BatchNorm1d(2), C.GroupNorm(1, 4)))
    model.eval()
    out = C.convert_sync_batchnorm(model, process_group=None)
    assert isinstance(out[1][0], C.SyncBatchNorm) and isinstance(out[1][1], C.SyncBatchNorm)
    assert isinstance(out[1][2], C.GroupNorm)
    assert out[1][0].weight is bn.weight and out[1][0].running_var is bn.running_var and out[1][0].bias is None
    assert out[1][0].momentum is None and not out[1][0].training
    root = C.SyncBatchNorm.convert_sync_batchnorm(C.BatchNorm1d(3))
    assert isinstance(root, C.SyncBatchNorm)
