"""The kernel benchmark's CPU-side logic, without a GPU: the L2 flush size, the copy of the same bytes each cell is
quoted against, the L2 marks, the report's percentages, and the table of norms and contenders (every ``NormOp``
counts the bytes its operands really have, and lnblocks' kernel computes what torch's ops compute)."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.common.timing import FLUSH_MIN_BYTES, Timer, flush_bytes
from benchmarks.kernels.bandwidth import CopyBaseline, copy_elements, l2_mark, pct_of_copy
from benchmarks.kernels.bench_norm_kernels import Bench, run_config
from benchmarks.kernels.contenders import CONTENDERS, OPS, Context, build_all
from benchmarks.kernels.kernel_report import markdown, summary
from benchmarks.kernels.traffic import STAT_BYTES, min_bytes

H200_L2 = 50 * 2**20
CPU = torch.device("cpu")


def test_flush_writes_more_than_the_l2() -> None:
    assert flush_bytes(None) == FLUSH_MIN_BYTES == 256 * 2**20
    assert flush_bytes(H200_L2) == FLUSH_MIN_BYTES  # 256 MiB > 4 x 50 MiB
    assert flush_bytes(128 * 2**20) == 512 * 2**20  # a larger L2: four times its size
    assert Timer(CPU, reps=1, warmup=0).flushes is False  # no L2 to flush on the CPU clock


def test_copy_moves_the_cells_bytes_half_read_half_written() -> None:
    assert copy_elements(8 * 2**20) == 2 * 2**20  # 8 MiB moved: 4 MiB of bf16 read, 4 MiB written
    assert copy_elements(3) == 1
    calls = []

    def timer(fn) -> float:  # a clock of known reading: what the baseline divides by
        fn()
        calls.append(fn)
        return 1e-3

    copy = CopyBaseline(CPU, timer)
    assert copy.gbps(8 * 2**20) == pytest.approx(8 * 2**20 / 1e-3 / 1e9)
    assert copy.gbps(8 * 2**20) == copy.gbps(8 * 2**20 + 1)  # the same bf16 copy: measured once
    assert len(calls) == 1 and list(copy.measured) == [8 * 2**20]
    assert pct_of_copy(2.0, 4.0) == 50.0
    with pytest.raises(ValueError, match="copy_gbps"):
        pct_of_copy(1.0, 0.0)


@pytest.mark.parametrize(
    ("pass_", "nbytes", "fwd_bytes", "l2", "flushed", "mark"),
    [
        ("fwd", 8 * 2**20, 8 * 2**20, H200_L2, True, ""),  # flushed: a small cell reads HBM too
        ("fwd", 8 * 2**20, 8 * 2**20, H200_L2, False, "L2"),  # warm L2 and it fits
        ("fwd", 512 * 2**20, 512 * 2**20, H200_L2, False, ""),  # warm, but larger than L2
        ("fwd+bwd", 20 * 2**20, 8 * 2**20, H200_L2, True, "L2 reuse"),  # the backward re-reads the forward's output
        ("fwd+bwd", 1200 * 2**20, 500 * 2**20, H200_L2, True, ""),
        ("bwd", 8 * 2**20, 8 * 2**20, None, False, ""),  # CPU: no L2 reported, nothing marked
    ],
)
def test_l2_marks(pass_, nbytes, fwd_bytes, l2, flushed, mark) -> None:
    assert l2_mark(pass_, nbytes, fwd_bytes, l2, flushed) == mark


def _row(impl: str, pass_: str, us: float, gbps: float, pct_copy: float, pct_peak: float, l2: str = "") -> dict:
    cfg = dict(norm="rmsnorm", residual=False, dtype="bfloat16", M=1024, N=4096)
    return dict(cfg, impl=impl, pass_=pass_, bytes=8 * 2**20, status="ok", time_us=us, gbps=gbps, copy_gbps=1.0,
                pct_copy=pct_copy, pct_peak=pct_peak, l2=l2)  # fmt: skip


def test_report_quotes_the_same_size_copy_and_marks_l2_cells() -> None:
    rows = [
        _row("ours", "fwd", 3.0, 2800.0, 95.0, 60.0),  # 95% of a copy of 8 MiB, 60% of the 1 GiB one
        _row("torch", "fwd", 4.0, 2100.0, 71.0, 45.0),
        _row("ours", "bwd", 5.0, 2500.0, 85.0, 52.0),
        _row("ours", "fwd+bwd", 8.0, 4000.0, 120.0, 83.0, "L2 reuse"),
    ]
    lines = summary(rows)
    assert "- fwd >= 90% of the same-size copy (N >= 2048): 1/1 cells" in lines
    assert "- bwd >= 80% of the same-size copy (N >= 2048): 1/1 cells" in lines
    assert "- cells of ours that may read from L2 (marked † / ‡): 1/3" in lines
    payload = dict(device="GPU", copy_gbps=4500.0, copy_peak_bytes=2**31, l2_bytes=H200_L2, flushed=True,
                   command="python benchmarks/kernels/bench_norm_kernels.py", rows=rows,
                   copy_by_bytes={str(8 * 2**20): 2950.0, str(2**31): 4500.0})  # fmt: skip
    text = markdown(payload)
    assert "**3.0 µs · 2.8e+03 GB/s · 95%**" in text and "8.0 µs · 4e+03 GB/s · 120% †" in text
    assert "L2 50 MiB" in text and "Copy of the cells' sizes (1 sizes): 2950 GB/s at 8.0 MiB" in text


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("name", list(OPS))
def test_every_norm_counts_its_operands_and_ours_matches_torch(name: str, residual: bool) -> None:
    op, m, n = OPS[name], 4, 64
    if residual and not op.takes_residual:
        pytest.skip(f"{name} has no fused-residual form")
    inputs = op.inputs(m, n, torch.float32, CPU, residual)
    impls = build_all(op, Context(n, CPU))
    assert set(impls) <= set(CONTENDERS) and {"ours", "torch", "compile"} <= set(impls)
    for rival in ("liger", "flash-attn", "quack", "cudnn (TE)"):
        assert impls[rival] == "needs CUDA"  # named, not timed, and nothing imported on the CPU
    ours, ref = impls["ours"](inputs), impls["torch"](inputs)
    ours, ref = (ours, ref) if residual else ((ours,), (ref,))
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    stats = m * (0 if op.extra and "gate" not in op.extra else STAT_BYTES * (2 if op.layer_norm else 1))
    moved = sum(t.numel() * t.element_size() for t in (*inputs.leaves(), *ref)) + stats
    assert min_bytes("fwd", m, op.operands(n, 4, residual)) == moved


def test_a_configuration_is_quoted_against_the_copy_of_its_bytes() -> None:
    op = OPS["rmsnorm"]
    bench = Bench(CPU, reps=1, warmup=0, flush=True, deadline=time.monotonic() + 60)
    impls = {"torch": build_all(op, Context(32, CPU))["torch"], "liger": "needs CUDA"}
    rows = run_config(dict(norm="rmsnorm", residual=True, dtype="float32", M=8, N=32), impls, bench)
    assert [(r["impl"], r["pass_"]) for r in rows] == [(i, p) for i in impls for p in ("fwd", "bwd", "fwd+bwd")]
    for r in rows[:3]:
        assert r["status"] == "ok" and r["l2"] == ""
        assert r["copy_gbps"] == bench.copy.gbps(r["bytes"])
        assert r["pct_copy"] == pytest.approx(100 * r["gbps"] / r["copy_gbps"])
    assert all(r["status"] == "needs CUDA" and "time_us" not in r for r in rows[3:])
