"""A parity table: every lnblocks norm variant against the implementation it claims to equal.

``lnblocks parity`` prints it. References are PyTorch's modules, the HF classes themselves (when ``transformers`` is
installed) and, for variants no library ships, the formula evaluated in fp64.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lnblocks.norms import build_norm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ParityCase:
    """One row: an lnblocks norm (``build_norm(kind, dim, **options)``) and how to build its reference."""

    name: str
    kind: str
    reference: str
    make_reference: Callable[[int], nn.Module] | None  # None: compare with the fp64 evaluation of the lnblocks module
    options: dict


def _hf(module_path: str, cls_name: str) -> Callable[[int], nn.Module]:
    def make(dim: int) -> nn.Module:
        return getattr(importlib.import_module(module_path), cls_name)(dim, eps=1e-6)

    return make


def parity_cases(with_hf: bool) -> list[ParityCase]:
    cases = [
        ParityCase("LayerNorm", "layernorm", "torch.nn.LayerNorm", lambda d: nn.LayerNorm(d), {}),
        ParityCase(
            "LayerNorm(bias=False)",
            "layernorm",
            "torch.nn.LayerNorm",
            lambda d: nn.LayerNorm(d, bias=False),
            {"bias": False},
        ),
        ParityCase("RMSNorm", "rmsnorm", "torch.nn.RMSNorm", lambda d: nn.RMSNorm(d), {}),
        ParityCase("LayerNorm(zero_centered)", "layernorm", "fp64", None, {"zero_centered": True}),
        ParityCase("DyT", "dyt", "fp64", None, {}),
        ParityCase("ScaleNorm", "scalenorm", "fp64", None, {}),
    ]
    if with_hf:
        hf = "transformers.models"
        cases += [
            ParityCase("preset llama", "llama", "LlamaRMSNorm", _hf(f"{hf}.llama.modeling_llama", "LlamaRMSNorm"), {}),
            ParityCase("preset gemma", "gemma", "GemmaRMSNorm", _hf(f"{hf}.gemma.modeling_gemma", "GemmaRMSNorm"), {}),
            ParityCase("preset olmo2", "olmo2", "Olmo2RMSNorm", _hf(f"{hf}.olmo2.modeling_olmo2", "Olmo2RMSNorm"), {}),
            ParityCase("preset t5", "t5", "T5LayerNorm", _hf(f"{hf}.t5.modeling_t5", "T5LayerNorm"), {}),
        ]
    return cases


def _randomize(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.5)


def measure(case: ParityCase, dtype: torch.dtype, dim: int = 1024, rows: int = 256) -> tuple[float, float]:
    """Max |ours - reference| of the output, and of the grads (w.r.t. x and every parameter)."""
    ours = build_norm(case.kind, dim, **case.options)
    _randomize(ours)
    x = torch.randn(rows, dim) * 2
    g = torch.randn(rows, dim)
    if case.make_reference is None:
        ref, ref_dtype = build_norm(case.kind, dim, **case.options).double(), torch.float64
    else:
        ref, ref_dtype = case.make_reference(dim), dtype
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    ours.to(dtype)
    ref.to(ref_dtype)

    def run(module: nn.Module, dt: torch.dtype) -> list[Tensor]:
        xi = x.to(dtype).to(dt).requires_grad_(True)
        y = module(xi)
        params = [p for _, p in sorted(module.named_parameters())]
        return [y, *torch.autograd.grad(y, [xi, *params], g.to(y.dtype))]

    got, want = run(ours, dtype), run(ref, ref_dtype)
    diffs = [(a.double() - b.double()).abs().max().item() for a, b in zip(got, want, strict=True)]
    return diffs[0], max(diffs[1:])


def print_parity_table() -> int:
    """Print the table (markdown); exit status 1 if a bit-exact claim fails."""
    try:
        importlib.import_module("transformers")
        with_hf = True
    except ImportError:
        with_hf = False
        print("(transformers not installed: HF rows skipped; pip install 'lnblocks[hf]')")
    torch.manual_seed(0)
    header = "| lnblocks norm | reference | " + " | ".join(f"{n} out / grad" for n in DTYPES) + " |"
    print(header)
    print("|" + "---|" * (2 + len(DTYPES)))
    failed = False
    for case in parity_cases(with_hf):
        cells = []
        for dtype in DTYPES.values():
            out_diff, grad_diff = measure(case, dtype)
            if case.make_reference is not None and (out_diff != 0 or grad_diff != 0):
                failed = True  # every library reference is claimed bit-exact, outputs and grads
            cells.append(f"{out_diff:.1e} / {grad_diff:.1e}".replace("0.0e+00", "0"))
        print(f"| {case.name} | {case.reference} | " + " | ".join(cells) + " |")
    print("\nMax abs difference of the output / of the grads (input and parameters), 256 rows x 1024.")
    print("0 is bit-exact. 'fp64' rows compare with the same formula in fp64 and show the dtype's own rounding.")
    return 1 if failed else 0
