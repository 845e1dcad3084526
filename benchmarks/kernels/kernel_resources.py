"""Registers, spills, shared memory and occupancy of every fused-kernel configuration, compiled without a GPU.

    python benchmarks/kernels/kernel_resources.py [--arch 80 90] [--n 64 16384] [--full] [--json PATH] [--jobs 2]

The interpreter runs the kernels as NumPy, so it cannot catch what only the compiler checks (types of loop-carried
values, layouts, register pressure). ``triton.compile`` with an explicit ``GPUTarget`` runs Triton's whole pipeline,
ptxas included, on a machine with no GPU; ``cuobjdump`` (bundled with Triton) reads registers per thread and the
stack frame (spills) from the cubin. The kernel arguments come from the same ``fwd_kernel_args``/``bwd_kernel_args``
the real launches use, fed with ``meta`` tensors, so every configuration dispatch can pick is compiled: LayerNorm and
RMSNorm x fp32/bf16/fp16 x {plain, residual, residual + dropout, dropout, zero-centred, norm-then-add,
memory-efficient}, and the gated RMSNorm (gate before / after), l2norm (mean / sum), DyT and Derf (plain / residual),
x N = 64 ... 65536, forward and backward. Occupancy is resident programs per SM from the register file (65536 per
SM, allocated per warp in units of 256), threads (2048 per SM), blocks (32 per SM) and shared memory (164 KiB on
sm_80, 228 KiB on sm_90, 1 KiB reserved per block).

Exits 1 when any configuration with N <= 32768 spills (stack bytes > 0), 2 when Triton's NVIDIA tools are missing.
Results are cached per compiled specialisation (benchmarks/.cache/, keyed by Triton's version, the kernel sources
and the specialisation), so a rerun compiles only what changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU: must be unset before the kernels are decorated
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what the GPU runs (and silences Triton 3.9's warning)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
import triton

DTYPES = ("float32", "bfloat16", "float16")
# the fused LayerNorm/RMSNorm kernel: variant -> its options (a residual, dropout, a zero-centred weight, the residual
# added after the norm with y not written, the memory-efficient backward)
NORM_VARIANTS: dict[str, dict[str, bool]] = {
    "plain": {},
    "residual": {"residual": True},
    "res+dropout": {"residual": True, "dropout": True},
    "dropout": {"dropout": True},
    "zero-centred": {"residual": True, "zero_centered": True},
    "norm-then-add": {"residual": True, "norm_then_add": True},
    "memory-efficient": {"residual": True, "memory_efficient": True},
}
# the kinds of the 2025-26 families, on the same kernels: variant -> (preset, spec options, residual)
KIND_VARIANTS: dict[str, dict[str, tuple[str, dict, bool]]] = {
    "gated_rmsnorm": {"gate-before": ("mamba2_gated", {}, False), "gate-after": ("qwen3_next_gated", {}, False)},
    "l2norm": {"mean": ("l2norm", {}, False), "sum": ("l2norm", {"reduction": "sum"}, False)},
    "dyt": {"plain": ("dyt", {}, False), "residual": ("dyt", {}, True)},
    "derf": {"plain": ("derf", {}, False), "residual": ("derf", {}, True)},
}
N_VALUES = tuple(2**k for k in range(6, 17))  # 64 ... 65536
SPILL_FREE_UP_TO = 32768
ARCH = {  # per SM: register file, max threads, max resident blocks, max shared memory per SM (bytes)
    80: dict(regs=65536, threads=2048, blocks=32, smem=164 * 1024),
    90: dict(regs=65536, threads=2048, blocks=32, smem=228 * 1024),
}
SMEM_RESERVED_PER_BLOCK = 1024
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "benchmarks" / ".cache" / "kernel_resources.json"
_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64"}


def tools_dir() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def tools_available() -> bool:
    """Triton's bundled ptxas and cuobjdump are present (Linux x86-64 wheels ship them)."""
    return all(os.path.exists(os.path.join(tools_dir(), tool)) for tool in ("ptxas", "cuobjdump"))


@dataclass(frozen=True)
class Config:
    """One launch configuration dispatch can pick."""

    direction: str  # "fwd" or "bwd"
    kind: str
    dtype: str
    variant: str
    n: int
    arch: int


def configs(archs, ns, directions=("fwd", "bwd"), kinds=None, dtypes=DTYPES, variants=None) -> list[Config]:
    """Every (arch, pass, kind, dtype, variant, N) asked for; each kind in the variants it has (``KERNELS``)."""
    return [
        Config(d, k, dt, v, n, a)
        for a in archs
        for d in directions
        for k in kinds or KERNELS
        for dt in dtypes
        for v in KERNELS[k].variants
        if variants is None or v in variants
        for n in ns
    ]


def kernel_call(cfg: Config) -> tuple[Any, dict[str, Any]]:
    """The kernel and the keyword arguments its launcher would pass, built from ``meta`` tensors."""
    return KERNELS[cfg.kind].call(cfg)


def _norm_call(cfg: Config) -> tuple[Any, dict[str, Any]]:
    """One launch of the fused LayerNorm/RMSNorm kernels (``lnblocks.kernels.jit``)."""
    from lnblocks.norms.spec import LayerNormSpec, RMSNormSpec

    options = NORM_VARIANTS[cfg.variant]
    spec_options = {"zero_centered": options.get("zero_centered", False)}
    spec_options["memory_efficient"] = options.get("memory_efficient", False)
    spec = (RMSNormSpec if cfg.kind == "rmsnorm" else LayerNormSpec)(eps=1e-5, **spec_options)
    return _launch(cfg, spec, options.get("residual", False), options.get("dropout", False),
                   options.get("norm_then_add", False))  # fmt: skip


def _kind_call(cfg: Config) -> tuple[Any, dict[str, Any]]:
    """One launch of a 2025-26 kind (gated RMSNorm, l2norm, DyT, Derf) on the same kernels."""
    from lnblocks.norms import norm_spec

    preset, options, residual = KIND_VARIANTS[cfg.kind][cfg.variant]
    return _launch(cfg, norm_spec(preset, **options), residual, False, False)


def _launch(cfg: Config, spec: Any, residual: bool, dropout: bool, norm_then_add: bool) -> tuple[Any, dict[str, Any]]:
    """The kernel and its launcher's keyword arguments for ``spec``, fed with ``meta`` tensors (M = 4096)."""
    from lnblocks.kernels.jit import norm_bwd_kernel, norm_fwd_kernel
    from lnblocks.kernels.launch import bwd_config, bwd_kernel_args, fwd_kernel_args, heavy_backward
    from lnblocks.kernels.plan import make_plan

    dtype = getattr(torch, cfg.dtype)
    m, n = 4096, cfg.n

    def meta(shape, dt=dtype):
        return torch.empty(shape, dtype=dt, device="meta")

    affine = getattr(spec, "elementwise_affine", False)
    x, stats, w = meta((m, n)), meta((m,), torch.float32), meta((n,)) if affine else None
    b = meta((n,)) if affine and getattr(spec, "bias", False) else None
    gate = meta((m, n)) if spec.kind == "gated_rmsnorm" else None
    alpha = meta((1,)) if spec.kind in ("dyt", "derf") else None
    shift = meta((1,)) if spec.kind == "derf" else None
    plan = make_plan(spec, dtype, dtype if residual else None, None if w is None else dtype, None,
                     0.1 if dropout else 0.0, norm_then_add=norm_then_add, write_y=not norm_then_add)  # fmt: skip
    seed = meta((1,), torch.int64) if dropout else None
    mean = None if plan.is_rms else stats  # (the memory-efficient backward reads none)
    rstd = None if plan.pointwise else stats
    if cfg.direction == "fwd":
        _, kwargs = fwd_kernel_args(plan, x, x if residual else None, w, b, seed, x, x if residual else None, mean,
                                    rstd, gate=gate, alpha=alpha, shift=shift)  # fmt: skip
        return norm_fwd_kernel, kwargs
    launch = bwd_config(n, 0, dropout, heavy_backward(plan))
    part = meta((132, n), torch.float32)
    scalar_part = meta((132,), torch.float32) if alpha is not None else None
    kwargs = bwd_kernel_args(
        plan, x, x if residual else None, x, w, seed, None if plan.memory_efficient else mean, rstd, x,
        x if plan.separate_dresidual else None,
        part if w is not None else None, part if b is not None else None, rows_per_program=32, cfg=launch, bias=b,
        gate=gate, dgate=gate, alpha=alpha, shift=shift, dalpha_part=scalar_part,
        dshift_part=scalar_part if shift is not None else None, from_output=plan.memory_efficient,
    )  # fmt: skip
    return norm_bwd_kernel, kwargs


def specialisation(fn: Any, kwargs: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], int, int | None]:
    """Triton signature, constexprs, num_warps and maxnreg of a launch (what a compiled kernel is keyed by)."""
    kwargs = dict(kwargs)
    num_warps = kwargs.pop("num_warps")
    maxnreg = kwargs.pop("maxnreg", None)
    kwargs["RNE"] = False  # the GPU rounds to nearest even natively
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for param in fn.params:
        name, value = param.name, kwargs[param.name]
        if param.is_constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _PTR[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
    return signature, constexprs, num_warps, maxnreg


@dataclass(frozen=True)
class Kernel:
    """One kernel family of the table: the variants it is compiled in, and how one launch is built (the kernel and
    the keyword arguments its launcher passes, fed with ``meta`` tensors)."""

    variants: tuple[str, ...]
    call: Callable[[Config], tuple[Any, dict[str, Any]]]


# Every kernel the table compiles. A new kernel is one entry: its variants and a ``call`` like ``_norm_call`` that
# builds its launch from the same ``*_kernel_args`` helpers its launcher uses.
KERNELS: dict[str, Kernel] = {
    "layernorm": Kernel(tuple(NORM_VARIANTS), _norm_call),
    "rmsnorm": Kernel(tuple(NORM_VARIANTS), _norm_call),
    **{kind: Kernel(tuple(variants), _kind_call) for kind, variants in KIND_VARIANTS.items()},
}
VARIANTS = tuple(dict.fromkeys(v for k in KERNELS.values() for v in k.variants))


def _source_hash() -> str:
    kernels = ROOT / "lnblocks" / "kernels"
    h = hashlib.sha256(triton.__version__.encode())
    for path in sorted(kernels.glob("*.py")):  # every kernel source: a new kernel's file invalidates the cache too
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def compile_resources(fn: Any, kwargs: dict[str, Any], arch: int) -> dict[str, int]:
    """Compile one launch for ``sm_<arch>``: registers/thread, stack (spill) bytes, shared memory, warps."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not hasattr(fn, "params"):
        raise RuntimeError("kernels were decorated under TRITON_INTERPRET=1; compile them in a process without it")
    signature, constexprs, num_warps, maxnreg = specialisation(fn, kwargs)
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        out = subprocess.run(
            [os.path.join(tools_dir(), "cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    return dict(
        registers=int(re.search(r"REG:(\d+)", out).group(1)),
        spill_bytes=int(re.search(r"STACK:(\d+)", out).group(1)),
        smem_bytes=int(compiled.metadata.shared),
        num_warps=num_warps,
    )


def occupancy(registers: int, num_warps: int, smem_bytes: int, arch: int) -> tuple[int, str]:
    """Resident programs per SM and the resource that limits them."""
    lim = ARCH[arch]
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    limits = {
        "registers": (lim["regs"] // regs_per_warp) // num_warps,
        "threads": lim["threads"] // (32 * num_warps),
        "blocks": lim["blocks"],
        "smem": lim["smem"] // (smem_bytes + SMEM_RESERVED_PER_BLOCK),
    }
    which = min(limits, key=limits.get)
    return limits[which], which


def _key(cfg: Config, spec: tuple) -> str:
    signature, constexprs, num_warps, maxnreg = spec
    blob = json.dumps([cfg.arch, signature, sorted(constexprs.items()), num_warps, maxnreg], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _compile_job(cfg: Config) -> dict[str, int]:
    fn, kwargs = kernel_call(cfg)
    return compile_resources(fn, kwargs, cfg.arch)


def measure(cfgs: list[Config], jobs: int = 1, use_cache: bool = True, progress: bool = True) -> list[dict]:
    """One row per configuration; each distinct specialisation is compiled once (and cached across runs)."""
    source = _source_hash()
    stored: dict[str, dict] = {}  # source hash (Triton version + kernel sources) -> specialisation -> resources
    if use_cache and CACHE.exists():
        try:
            stored = json.loads(CACHE.read_text())
        except (json.JSONDecodeError, OSError):
            stored = {}
    cache = stored.setdefault(source, {})
    keys = {}
    todo: dict[str, Config] = {}
    for cfg in cfgs:
        fn, kwargs = kernel_call(cfg)
        key = keys[cfg] = _key(cfg, specialisation(fn, kwargs))
        if key not in cache:
            todo.setdefault(key, cfg)
    if todo:
        items = list(todo.items())
        bar = _progress(len(items), progress)
        if jobs > 1:
            with ProcessPoolExecutor(jobs) as pool:
                for (key, _), res in zip(items, pool.map(_compile_job, [c for _, c in items])):
                    cache[key] = res
                    bar.update(1)
        else:
            for key, cfg in items:
                cache[key] = _compile_job(cfg)
                bar.update(1)
        bar.close()
        if use_cache:
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            tmp = CACHE.with_suffix(".tmp")
            tmp.write_text(json.dumps(stored, indent=0))
            tmp.replace(CACHE)
    rows = []
    for cfg in cfgs:
        res = cache[keys[cfg]]
        programs, limit = occupancy(res["registers"], res["num_warps"], res["smem_bytes"], cfg.arch)
        rows.append(asdict(cfg) | res | dict(programs_per_sm=programs, limited_by=limit))
    return rows


class _NoBar:
    def update(self, _n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, show: bool):
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="compiling", unit="kernel", file=sys.stderr)


def spilling(rows: list[dict], up_to: int = SPILL_FREE_UP_TO) -> list[dict]:
    return [r for r in rows if r["n"] <= up_to and r["spill_bytes"] > 0]


def summary_table(rows: list[dict]) -> Iterator[str]:
    """Per (arch, direction, kind, N): max registers, max spill, warps and the lowest occupancy over dtypes/variants."""
    yield "| arch | pass | kind | N | warps | max regs | max spill B | smem B | programs/SM (min) | limited by |"
    yield "|---|---|---|---|---|---|---|---|---|---|"
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["arch"], r["direction"], r["kind"], r["n"]), []).append(r)
    for (arch, direction, kind, n), rs in groups.items():
        worst = min(rs, key=lambda r: r["programs_per_sm"])
        warps = "/".join(str(w) for w in sorted({r["num_warps"] for r in rs}))
        yield (
            f"| sm_{arch} | {direction} | {kind} | {n} | {warps} | {max(r['registers'] for r in rs)} | "
            f"{max(r['spill_bytes'] for r in rs)} | {max(r['smem_bytes'] for r in rs)} | "
            f"{worst['programs_per_sm']} | {worst['limited_by']} |"
        )


def full_table(rows: list[dict]) -> Iterator[str]:
    cols = ("arch", "direction", "kind", "dtype", "variant", "n", "num_warps", "registers", "spill_bytes",
            "smem_bytes", "programs_per_sm", "limited_by")  # fmt: skip
    yield "| " + " | ".join(cols) + " |"
    yield "|---" * len(cols) + "|"
    for r in rows:
        yield "| " + " | ".join(str(r[c]) for c in cols) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90], choices=sorted(ARCH))
    ap.add_argument("--n", type=int, nargs="+", default=list(N_VALUES), help="hidden sizes (default 64 ... 65536)")
    ap.add_argument("--direction", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--kind", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--full", action="store_true", help="one row per configuration instead of the summary")
    ap.add_argument("--json", help="write every row to this file")
    ap.add_argument("--jobs", type=int, default=1, help="parallel compiler processes")
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args(argv)
    if not tools_available():
        print(f"kernel_resources: Triton's NVIDIA tools (ptxas, cuobjdump) are missing: {tools_dir()}", file=sys.stderr)
        return 2
    cfgs = configs(args.arch, args.n, args.direction, args.kind, args.dtype, args.variant)
    rows = measure(cfgs, jobs=args.jobs, use_cache=not args.no_cache)
    print(f"Triton {triton.__version__}, {len(rows)} configurations\n")
    print("\n".join(full_table(rows) if args.full else summary_table(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(triton=triton.__version__, rows=rows), indent=1))
    bad = spilling(rows)
    worst = max(rows, key=lambda r: r["registers"])
    print(f"\nmax registers/thread: {worst['registers']} ({worst['kind']} {worst['direction']} N={worst['n']}); "
          f"spilling with N <= {SPILL_FREE_UP_TO}: {len(bad)}")  # fmt: skip
    for r in bad[:20]:
        print(f"  SPILL {r['spill_bytes']} B: sm_{r['arch']} {r['direction']} {r['kind']} {r['dtype']} {r['variant']} "
              f"N={r['n']} ({r['num_warps']} warps, {r['registers']} regs)")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
