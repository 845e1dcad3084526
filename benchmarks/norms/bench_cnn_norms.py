"""lnblocks.cnn norms against torch.nn on CPU: time ratios measured in one run (ratio < 1: ours is faster).

    python benchmarks/norms/bench_cnn_norms.py [--threads 1] [--rounds 3] [--shapes 8x32x16x16 32x64x32x32]

Each row times the same work for both sides with ``torch.utils.benchmark``, alternating baseline and ours for
``--rounds`` rounds and keeping each side's best median (robust to other load on a shared machine): a training
step's forward + backward (``fwd+bwd``) or an eval forward (``eval``). Extra rows show the alternatives behind the
design: the composed ``normalize`` (the unified view) against the native kernels the modules call, LayerNorm2d's
permute path against reducing over dim 1, BatchRenorm's cost over BatchNorm, and folding BatchNorm into the conv.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import benchmark

import lnblocks.cnn as C


def _fwd_bwd(module: Callable[[Tensor], Tensor], x: Tensor, g: Tensor) -> Callable[[], None]:
    def run() -> None:
        x.grad = None
        module(x).backward(g)

    return run


def _eval(module: Callable[[Tensor], Tensor], x: Tensor) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            module(x)

    return run


class _ChannelsLastLN(nn.Module):
    """The usual torch way to a channels-first LayerNorm (ConvNeXt / timm): nn.LayerNorm on the permuted view."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def cases(shape: tuple[int, ...]) -> list[tuple[str, str, Callable[[], None], str, Callable[[], None]]]:
    """(name, baseline label, baseline fn, ours label, ours fn) for an input of ``shape``."""
    c = shape[1]
    x = torch.randn(shape).requires_grad_(True)
    g = torch.randn(shape)
    wt, bs = torch.ones(c, requires_grad=True), torch.zeros(c, requires_grad=True)
    bn_t, bn_o = nn.BatchNorm2d(c), C.BatchNorm2d(c)
    bn_te, bn_oe = nn.BatchNorm2d(c).eval(), C.BatchNorm2d(c).eval()
    conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
    conv_bn = nn.Sequential(conv, nn.BatchNorm2d(c)).eval()
    folded = C.fold_batchnorm(conv_bn)
    xe = x.detach()
    return [
        ("BatchNorm2d fwd+bwd", "torch", _fwd_bwd(bn_t, x, g), "lnblocks", _fwd_bwd(bn_o, x, g)),
        ("BatchNorm2d eval", "torch", _eval(bn_te, xe), "lnblocks", _eval(bn_oe, xe)),
        ("GroupNorm(8) fwd+bwd", "torch", _fwd_bwd(nn.GroupNorm(8, c), x, g), "lnblocks",
         _fwd_bwd(C.GroupNorm(8, c), x, g)),
        ("InstanceNorm2d fwd+bwd", "torch", _fwd_bwd(nn.InstanceNorm2d(c, affine=True), x, g), "lnblocks",
         _fwd_bwd(C.InstanceNorm2d(c, affine=True), x, g)),
        ("LayerNorm2d fwd+bwd", "torch LN permuted", _fwd_bwd(_ChannelsLastLN(c), x, g), "lnblocks",
         _fwd_bwd(C.LayerNorm2d(c), x, g)),
        ("SyncBatchNorm fwd+bwd (1 process)", "torch BN", _fwd_bwd(nn.BatchNorm2d(c), x, g), "lnblocks",
         _fwd_bwd(C.SyncBatchNorm(c), x, g)),
        ("BatchRenorm2d fwd+bwd", "torch BN", _fwd_bwd(nn.BatchNorm2d(c), x, g), "lnblocks BRN",
         _fwd_bwd(C.BatchRenorm2d(c), x, g)),
        ("normalize BN dims fwd+bwd", "F.batch_norm", _fwd_bwd(lambda t: F.batch_norm(t, None, None, wt, bs, True),
         x, g), "normalize", _fwd_bwd(lambda t: C.normalize(t, (0, 2, 3), wt, bs), x, g)),
        ("normalize GN dims fwd+bwd", "F.group_norm", _fwd_bwd(lambda t: F.group_norm(t, 8, wt, bs), x, g),
         "normalize", _fwd_bwd(lambda t: C.normalize(t, (1, 2, 3), wt, bs, groups=8), x, g)),
        ("normalize LN2d dims fwd+bwd", "LayerNorm2d", _fwd_bwd(C.LayerNorm2d(c), x, g), "normalize",
         _fwd_bwd(lambda t: C.normalize(t, (1,), wt, bs), x, g)),
        ("Conv3x3+BN eval vs folded", "conv+BN", _eval(conv_bn, xe), "folded conv", _eval(folded, xe)),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-run-time", type=float, default=0.1, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements per side; best is kept")
    parser.add_argument("--shapes", nargs="+", default=["8x32x16x16", "32x64x32x32"], help="NxCxHxW")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, CPU, {args.threads} thread(s), best of {args.rounds} alternating medians; "
        "ratio = ours / baseline\n"
    )
    print("| case | shape | baseline | baseline ms | ours | ours ms | ratio |")
    print("|---|---|---|---:|---|---:|---:|")
    for spec in args.shapes:
        shape = tuple(int(v) for v in spec.split("x"))
        for name, base_label, base_fn, ours_label, ours_fn in cases(shape):
            times = [float("inf"), float("inf")]
            for fn in (base_fn, ours_fn):
                fn()  # warm-up (allocations, first-call dispatch)
            for _ in range(args.rounds):
                for i, fn in enumerate((base_fn, ours_fn)):
                    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=args.threads)
                    times[i] = min(times[i], m.blocked_autorange(min_run_time=args.min_run_time).median * 1e3)
            print(
                f"| {name} | {spec} | {base_label} | {times[0]:.3f} | {ours_label} | {times[1]:.3f} | "
                f"{times[1] / times[0]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
