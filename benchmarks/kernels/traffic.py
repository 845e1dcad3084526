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
seed (flash-attn's scheme). ``tests/kernels/test_kernel_traffic.py`` checks these counts against the tensors the
launchers really allocate and pass.
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
    """Element sizes (bytes) of one call; ``residual``/``weight``/``bias`` 0 when absent."""

    n: int
    x: int = 2
    residual: int = 0
    weight: int = 2
    bias: int = 0
    out: int = 2
    dropout: bool = False
    layer_norm: bool = True
    residual_in_fp32: bool = False

    @property
    def stream(self) -> int:
        """Element size of the new residual (the norm's input when there is a residual)."""
        if not self.residual:
            return self.x
        return 4 if self.residual_in_fp32 else max(self.x, self.residual)

    @property
    def separate_dresidual(self) -> bool:
        return bool(self.residual) and (self.dropout or self.residual != self.x)

    @property
    def stats(self) -> int:
        return STAT_BYTES * (2 if self.layer_norm else 1)


def min_bytes(direction: str, m: int, op: Operands) -> int:
    """Bytes the math needs for ``m`` rows (``direction``: fwd, bwd or fwd+bwd), the same for every contender."""
    n = op.n
    params = n * (op.weight + op.bias)
    if direction == "fwd+bwd":
        return min_bytes("fwd", m, op) + min_bytes("bwd", m, op)
    if direction == "fwd":
        per_row = n * (op.x + op.residual + op.out) + (n * op.stream if op.residual else 0) + op.stats
        return m * per_row + params
    if direction == "bwd":
        z = op.stream
        per_row = n * (z + op.out + op.x) + op.stats
        if op.residual:
            per_row += n * z  # the new residual's gradient
        if op.separate_dresidual:
            per_row += n * op.residual
        grads = n * 4 * ((1 if op.weight else 0) + (1 if op.bias else 0))  # dW, dB written once (fp32 sums)
        return m * per_row + n * op.weight + grads  # the backward reads the weight, not the bias
    raise ValueError(f"direction must be 'fwd', 'bwd' or 'fwd+bwd', got {direction!r}")


def kernel_bytes(direction: str, m: int, op: Operands, *, looped: bool = False, programs: int = 0) -> int:
    """Bytes lnblocks' kernels move for ``m`` rows: ``min_bytes`` plus the partial dW/dB rows of ``programs``
    backward programs and, when ``looped``, the re-reads and per-row partial-row updates of the chunked path."""
    if direction == "fwd+bwd":
        return kernel_bytes("fwd", m, op, looped=looped) + kernel_bytes("bwd", m, op, looped=looped, programs=programs)
    total = min_bytes(direction, m, op)
    n = op.n
    if direction == "fwd":
        return total + (m * n * (op.x + op.residual) if looped else 0)  # pass 2 re-reads x (and r)
    accumulators = (1 if op.weight else 0) + (1 if op.bias else 0)
    total += 2 * programs * n * 4 * accumulators  # partial rows: written by the kernel, read by the final sum
    if looped:
        total += m * n * (op.stream + op.out)  # pass B re-reads z and dy
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


# Every kernel of the table, in its order. A new kernel is one more entry: its variants' Operands (and, if it moves
# other tensors than these, a field of Operands and its term in min_bytes / kernel_bytes).
KERNEL_ROWS: tuple[KernelRow, ...] = (
    *_norm_rows("LayerNorm", True, (True, False)),
    *_norm_rows("RMSNorm", False, (False,)),
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
