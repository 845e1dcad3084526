"""Bytes moved by the fused norm kernels, on paper: what each kernel reads and writes per row, and the minimum.

    python benchmarks/kernels/traffic.py [--n 4096] [--dtype bfloat16] [--m 16384]

The second table is ``lnblocks.hf``'s ``fuse_residual=True``: what fusing the residual add in front of a norm saves
in an HF decoder layer, per token and per layer, for the widths of well-known checkpoints.

``min_bytes`` is what the math needs: the forward reads x (and the residual), writes y (and the new residual) and
the fp32 statistics the backward uses (rstd, and mean for LayerNorm); the backward reads the norm's input, dy (and
the new residual's gradient) and the statistics, writes dx (and dresidual when it differs from dx: dropout, or
another dtype), and writes dW (dB) once. Weights and bias are read once per call. The GPU benchmark
(``bench_norm_kernels.py``) divides these bytes by each contender's time, so every contender's GB/s is on the same
count. ``kernel_bytes`` is what lnblocks' kernels move instead: the same, plus the dW/dB partial rows of the
persistent backward (each written once and read once by the final sum), and, on the looped path for rows wider than
one register block, the second read of the row (forward pass 2; backward pass B) and the per-row read-modify-write
of the program's partial dW/dB row (which stays in L2). The dropout mask costs nothing: it is recomputed from the
seed (flash-attn's scheme). The gated norm reads its gate and writes its gradient; DyT/Derf write no statistics and
one partial per program and scalar; norm-then-add writes y only when asked and its backward reads the new residual's
gradient (y's, if y was used); the memory-efficient backward reads y and the bias instead of the input and the mean.
``tests/kernels/test_kernel_traffic.py`` checks these counts against the tensors the launchers really allocate and
pass.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

STAT_BYTES = 4  # fp32 mean / rstd per row


@dataclass(frozen=True)
class Operands:
    """Element sizes (bytes) of one call; ``residual``/``weight``/``bias``/``gate`` 0 when absent.

    ``scalars``: learnable one-element parameters (DyT's alpha; Derf's alpha and shift), which also mean no
    statistics. ``groups``: statistics per group (a row holds ``groups`` of them). ``norm_then_add``: the residual is
    added after the norm, ``residual + y`` (y written only with ``write_y``; the residual's gradient is the new
    residual's, no kernel work). ``memory_efficient``: the backward reads y (and the bias) instead of the input and
    no mean.
    """

    n: int
    x: int = 2
    residual: int = 0
    weight: int = 2
    bias: int = 0
    out: int = 2
    dropout: bool = False
    layer_norm: bool = True
    residual_in_fp32: bool = False
    gate: int = 0
    scalars: int = 0
    groups: int = 1
    norm_then_add: bool = False
    write_y: bool = True
    memory_efficient: bool = False

    @property
    def stream(self) -> int:
        """Element size of the new residual (the norm's input when there is a residual)."""
        if not self.residual:
            return self.x
        return 4 if self.residual_in_fp32 else max(self.out if self.norm_then_add else self.x, self.residual)

    @property
    def saved(self) -> int:
        """Element size of what the backward rebuilds x_hat from: y, x, or the new residual."""
        if self.memory_efficient:
            return self.out
        return self.x if self.norm_then_add else self.stream

    @property
    def separate_dresidual(self) -> bool:
        return bool(self.residual) and not self.norm_then_add and (self.dropout or self.residual != self.x)

    @property
    def stats(self) -> int:
        """fp32 statistics per row the forward writes (rstd, and mean for LayerNorm; per group); none point-wise."""
        return 0 if self.scalars else STAT_BYTES * (2 if self.layer_norm else 1) * self.groups

    @property
    def stats_read(self) -> int:
        """Statistics the backward reads: the memory-efficient one needs no mean."""
        return STAT_BYTES * self.groups if self.memory_efficient else self.stats


def min_bytes(direction: str, m: int, op: Operands) -> int:
    """Bytes the math needs for ``m`` rows (``direction``: fwd, bwd or fwd+bwd), the same for every contender."""
    n = op.n
    params = n * (op.weight + op.bias) + op.scalars * op.weight
    if direction == "fwd+bwd":
        return min_bytes("fwd", m, op) + min_bytes("bwd", m, op)
    if direction == "fwd":
        per_row = n * (op.x + op.residual + op.gate) + (n * op.out if op.write_y else 0) + op.stats
        per_row += n * op.stream if op.residual else 0  # the new residual
        return m * per_row + params
    if direction == "bwd":
        dy = n * op.out if op.write_y else 0  # norm-then-add without y: only the new residual's gradient
        per_row = n * (op.saved + op.x + 2 * op.gate) + dy + op.stats_read  # (+ the gate, read, and its gradient)
        if op.residual:
            per_row += n * op.stream  # the new residual's gradient
        if op.separate_dresidual:
            per_row += n * op.residual
        grads = n * 4 * ((1 if op.weight else 0) + (1 if op.bias else 0)) + 4 * op.scalars  # fp32 sums, once
        read = n * op.weight + op.scalars * op.weight + (n * op.bias if op.memory_efficient else 0)
        return m * per_row + read + grads  # the default backward reads the weight, not the bias
    raise ValueError(f"direction must be 'fwd', 'bwd' or 'fwd+bwd', got {direction!r}")


def kernel_bytes(direction: str, m: int, op: Operands, *, looped: bool = False, programs: int = 0) -> int:
    """Bytes lnblocks' kernels move for ``m`` rows: ``min_bytes`` plus the partial dW/dB (and d_alpha/d_shift) rows
    of ``programs`` backward programs and, when ``looped``, the re-reads and per-row partial-row updates of the
    chunked path (the point-wise kinds have no statistics: their loop is one pass)."""
    if direction == "fwd+bwd":
        return kernel_bytes("fwd", m, op, looped=looped) + kernel_bytes("bwd", m, op, looped=looped, programs=programs)
    total = min_bytes(direction, m, op)
    n = op.n
    two_pass = looped and not op.scalars
    if direction == "fwd":
        return total + (m * n * (op.x + op.residual + op.gate) if two_pass else 0)  # pass 2 re-reads x (r, gate)
    accumulators = (1 if op.weight else 0) + (1 if op.bias else 0)
    total += 2 * programs * n * 4 * accumulators  # partial rows: written by the kernel, read by the final sum
    total += 2 * programs * 4 * op.scalars  # one partial per program and scalar
    if two_pass:
        total += m * n * (op.saved + (op.out if op.write_y else 0) + op.gate)  # pass B re-reads z, dy (and the gate)
        total += m * n * op.stream if op.norm_then_add else 0  # and the new residual's gradient, y's source there
    if looped:
        total += m * 2 * n * 4 * accumulators  # per-row read-modify-write of the program's partial row
    return total


def unfused_residual_bytes(direction: str, m: int, op: Operands) -> int:
    """Bytes of ``s = a + b; y = norm(s)`` as separate ops (HF's decoder-layer code), for ``m`` rows.

    Forward: the add reads ``a``, ``b`` and writes ``s``; the norm reads ``s`` again. Backward: ``s`` feeds the norm
    and the rest of the layer (the residual stream), so autograd adds the norm's input gradient to the stream's
    gradient (read two, write one) before the add passes it to ``a`` and ``b``; the fused kernel takes the stream's
    gradient as an input instead (``min_bytes`` with a residual)."""
    if direction == "fwd+bwd":
        return unfused_residual_bytes("fwd", m, op) + unfused_residual_bytes("bwd", m, op)
    plain = Operands(op.n, op.stream, 0, op.weight, op.bias, op.out, False, op.layer_norm)
    if direction == "fwd":
        return m * op.n * (op.x + op.residual + op.stream) + min_bytes("fwd", m, plain)
    if direction == "bwd":
        return min_bytes("bwd", m, plain) + m * 3 * op.n * op.stream
    raise ValueError(f"direction must be 'fwd', 'bwd' or 'fwd+bwd', got {direction!r}")


# (checkpoint, hidden size, residual adds fused per decoder layer by lnblocks.hf fuse_residual=True)
HF_LAYERS = (
    ("Llama-3-8B / Qwen3-8B / Mistral-7B", 4096, 1),
    ("Llama-3-70B", 8192, 1),
    ("Phi-3-mini", 3072, 1),
    ("Gemma-2-9B (sandwich)", 3584, 1),
    ("Gemma-3-27B (sandwich)", 5376, 1),
    ("OLMo-2-7B (norms before the adds)", 4096, 0),
)


def residual_fusion_table(elem: int, dtype_name: str) -> list[str]:
    """Markdown: bytes ``fuse_residual=True`` saves per token and decoder layer (RMSNorm, weights in the same dtype)."""
    lines = [
        f"HF decoder layers with fuse_residual=True, {dtype_name} activations and weights, RMSNorm: bytes saved per "
        "token and layer (the fused add + norm against HF's add, then norm)",
        "",
        "| checkpoint | hidden | adds fused / layer | fwd B/token | bwd B/token | fwd+bwd B/token | saved / unfused |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    m = 1 << 20  # large-M limit: weights read once per call vanish per token
    for name, n, adds in HF_LAYERS:
        op = Operands(n, elem, elem, elem, 0, elem, False, False)
        saved = {d: adds * (unfused_residual_bytes(d, m, op) - min_bytes(d, m, op)) / m for d in ("fwd", "bwd")}
        total = saved["fwd"] + saved["bwd"]
        share = total / (unfused_residual_bytes("fwd+bwd", m, op) / m) if adds else 0.0
        lines.append(
            f"| {name} | {n} | {adds} | {saved['fwd']:,.0f} | {saved['bwd']:,.0f} | {total:,.0f} | {share:.0%} |"
        )
    return lines


@dataclass(frozen=True)
class KernelRow:
    """One kernel of the per-row table: its name, its variant and its operands at width ``n``, element size ``elem``."""

    kind: str
    variant: str
    operands: Callable[[int, int], Operands]


def _norm_rows(kind: str, layer_norm: bool, biases: tuple[bool, ...]) -> tuple[KernelRow, ...]:
    """The fused LayerNorm/RMSNorm kernel's variants: with and without a bias, a residual and dropout."""
    rows = []
    for bias in biases:
        for residual, dropout in ((False, False), (True, False), (True, True), (False, True)):
            on = [s for s, flag in (("bias", bias), ("residual", residual), ("dropout", dropout)) if flag]

            def operands(n, e, residual=residual, dropout=dropout, bias=bias):
                return Operands(n, e, e if residual else 0, e, e if bias else 0, e, dropout, layer_norm)

            rows.append(KernelRow(kind, ", ".join(on or ["plain"]), operands))
    return tuple(rows)


def _kind_rows() -> tuple[KernelRow, ...]:
    """The 2025-26 kinds and call forms: one row per variant, bf16 or fp32 alike (``e`` is the element size)."""
    variants = {
        ("Gated RMSNorm", "gate"): lambda n, e: Operands(n, e, 0, e, 0, e, layer_norm=False, gate=e),
        ("Gated RMSNorm", "gate, 32 groups"): lambda n, e: Operands(n, e, 0, e, 0, e, layer_norm=False, gate=e,
                                                                     groups=32),
        ("L2Norm", "plain"): lambda n, e: Operands(n, e, 0, 0, 0, e, layer_norm=False),
        ("DyT", "bias"): lambda n, e: Operands(n, e, 0, e, e, e, scalars=1),
        ("DyT", "bias, residual"): lambda n, e: Operands(n, e, e, e, e, e, scalars=1),
        ("Derf", "bias"): lambda n, e: Operands(n, e, 0, e, e, e, scalars=2),
        ("Derf", "bias, residual"): lambda n, e: Operands(n, e, e, e, e, e, scalars=2),
        ("LayerNorm", "bias, norm then add"): lambda n, e: Operands(n, e, e, e, e, e, norm_then_add=True,
                                                                     write_y=False),
        ("RMSNorm", "norm then add, y written"): lambda n, e: Operands(n, e, e, e, 0, e, layer_norm=False,
                                                                        norm_then_add=True),
        ("LayerNorm", "bias, residual, memory-efficient"): lambda n, e: Operands(n, e, e, e, e, e,
                                                                                  memory_efficient=True),
        ("RMSNorm", "residual, memory-efficient"): lambda n, e: Operands(n, e, e, e, 0, e, layer_norm=False,
                                                                          memory_efficient=True),
        ("RMSNorm", "per head, 32 heads"): lambda n, e: Operands(n, e, 0, e, 0, e, layer_norm=False, groups=32),
    }  # fmt: skip
    return tuple(KernelRow(kind, variant, operands) for (kind, variant), operands in variants.items())


# Every kernel of the table, in its order. A new kernel is one more entry: its variants' Operands (and, if it moves
# other tensors than these, a field of Operands and its term in min_bytes / kernel_bytes).
KERNEL_ROWS: tuple[KernelRow, ...] = (
    *_norm_rows("LayerNorm", True, (True, False)),
    *_norm_rows("RMSNorm", False, (False,)),
    *_kind_rows(),
)


def table(n: int, m: int, elem: int, dtype_name: str, programs: int) -> list[str]:
    """Markdown: per-row bytes (large-M limit) of each kernel against the minimum, and the backward's partial rows."""
    lines = [
        f"N = {n}, {dtype_name} operands (weights in the same dtype), M = {m} rows, {programs} backward programs; "
        "bytes per row (weights, bias, dW/dB counted once per call, divided by M)",
        "",
        "| kernel | variant | minimum B/row | B/element | ours, single block | ours, looped | single / min |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in KERNEL_ROWS:
        op = row.operands(n, elem)
        for direction in ("fwd", "bwd"):
            lo = min_bytes(direction, m, op) / m
            single = kernel_bytes(direction, m, op, programs=programs) / m
            loop = kernel_bytes(direction, m, op, looped=True, programs=programs) / m
            lines.append(
                f"| {row.kind} {direction} | {row.variant} | {lo:,.0f} | {lo / n:.2f} | {single:,.0f} | {loop:,.0f} | "
                f"{single / lo:.3f} |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--programs", type=int, default=132, help="backward programs (H100/H200: 1 per SM at N=4096)")
    args = ap.parse_args()
    elem = 4 if args.dtype == "float32" else 2
    print("\n".join(table(args.n, args.m, elem, args.dtype, args.programs)))
    print()
    print("\n".join(residual_fusion_table(elem, args.dtype)))


if __name__ == "__main__":
    main()
