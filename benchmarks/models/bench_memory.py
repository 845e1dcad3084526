"""Activation memory: bytes saved for backward, per token per layer, lnblocks against HF at the same shape.

Counted exactly (no timing, no allocator noise) with ``torch.autograd.graph.saved_tensors_hooks``: every tensor
autograd saves for the backward is looked at once, and the bytes of each *distinct storage* it lives in are summed
(views of one storage count once; Parameters are not activations and are left out). Per layer = the difference
between an ``L``- and a ``2L``-layer model divided by ``L``, so embeddings, head and loss cancel; per token = divided
by batch x sequence.

1. Models: lnblocks ``GPT`` built with ``GPT.from_hf`` from HF ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` (so the
   same shape and math; dropout 0, sdpa attention on both sides), then the same lnblocks shape in every placement.
2. Norm modules: ``norm(x + r)`` against ``norm(x, residual=r)`` (the fused-residual call), for torch.nn.LayerNorm /
   HF LlamaRMSNorm and lnblocks' torch and Triton backends (the Triton kernels run in Triton's interpreter on CPU:
   what a kernel saves is decided by its autograd function, not by the device).
3. ``memory_efficient`` (``GPTConfig(memory_efficient=True)``: the norms' backward saves their output, not their
   input): the Pre-LN model of each family on the Triton backend with and without it, and the bytes per token per
   layer it saves, against the rule (``N x itemsize`` per norm, plus LayerNorm's fp32 mean per row).

    python benchmarks/models/bench_memory.py            # GPT-2-small width (768, 12 heads), T=128, batch 2
    python benchmarks/models/bench_memory.py --quick    # width 128 (CI-sized)
    python benchmarks/models/bench_memory.py --only memory_efficient
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU: run the fused kernels in Triton's interpreter
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch
from torch import Tensor, nn
from tqdm import tqdm

import lnblocks
from lnblocks import GPT
from lnblocks.blocks import PLACEMENTS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def saved_bytes(run: Callable[[], Tensor], exclude: nn.Module | None = None) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` builds its graph (Parameters of ``exclude``
    not counted). The graph is freed afterwards without running backward."""
    params = {p.untyped_storage().data_ptr() for p in exclude.parameters()} if exclude is not None else set()
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    return sum(storages.values())


# ---- models -------------------------------------------------------------------------------------------------------
def hf_model(family: str, n_layers: int, args: argparse.Namespace, dtype: torch.dtype) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    no_ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=args.vocab, n_positions=args.seq, n_embd=args.dim, n_layer=n_layers, n_head=args.heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **no_ids,
        )  # fmt: skip
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.dim * 8 // 3,
            num_hidden_layers=n_layers, num_attention_heads=args.heads, num_key_value_heads=args.heads // 3,
            max_position_embeddings=args.seq, **no_ids,
        )  # fmt: skip
        cls = transformers.LlamaForCausalLM
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cls(config).to(dtype).train()


def per_token_per_layer(build: Callable[[int], nn.Module], hf: bool, args: argparse.Namespace) -> float:
    """Saved bytes per token per layer: (bytes at 2L layers - bytes at L layers) / (L * B * T)."""
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    counts = []
    for n_layers in (args.layers, 2 * args.layers):
        model = build(n_layers)
        if hf:  # the same forward on both sides: T tokens, loss over T - 1 next-token targets
            run = lambda m=model: m(idx, labels=idx).loss  # noqa: E731
        else:
            targets = torch.cat([idx[:, 1:], torch.full_like(idx[:, :1], -100)], dim=1)
            run = lambda m=model, t=targets: m(idx, t)[1]  # noqa: E731
        counts.append(saved_bytes(run, exclude=model))
    return (counts[1] - counts[0]) / (args.layers * args.batch * args.seq)


def lnblocks_build(
    family: str, placement: str, args: argparse.Namespace, dtype: torch.dtype, backend: str, memory_efficient=None
):
    base = GPT.from_hf(hf_model(family, 1, args, dtype)).config

    def build(n_layers: int) -> nn.Module:
        block = base.layers[0]
        block = block.replace(placement=placement, norm=block.norm.replace(backend=backend))
        cfg = base.replace(n_layers=n_layers, block=block, init="deepnet" if placement == "deepnorm" else "gpt2")
        cfg = cfg.replace(memory_efficient=memory_efficient)
        torch.manual_seed(0)
        return GPT(cfg).to(dtype).train()

    return build


def model_table(args: argparse.Namespace) -> list[str]:
    families = ("gpt2", "llama")
    cols = [(f, d) for f in families for d in DTYPES]
    header = "| model | " + " | ".join(f"{'GPT-2' if f == 'gpt2' else 'Llama'} {d}" for f, d in cols) + " |"
    lines = [header, "|" + "---|" * (1 + len(cols))]
    rows: list[tuple[str, Callable]] = [
        ("HF (Pre-LN)", lambda f, dt: per_token_per_layer(lambda n: hf_model(f, n, args, dt), True, args)),
    ]
    for backend in args.backends:
        for placement in PLACEMENTS:
            name = f"lnblocks {placement}" + ("" if backend == "torch" else f" ({backend})")
            rows.append(
                (name, lambda f, dt, p=placement, b=backend: per_token_per_layer(
                    lnblocks_build(f, p, args, dt, b), False, args))
            )  # fmt: skip
    hf_values: dict[tuple[str, str], float] = {}
    for name, measure in tqdm(rows, desc="models", leave=False):
        cells = []
        for f, d in cols:
            value = measure(f, DTYPES[d])
            if name.startswith("HF"):
                hf_values[(f, d)] = value
                cells.append(f"{value:,.0f}")
            else:
                cells.append(f"{value:,.0f} ({value / hf_values[(f, d)]:.2f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def memory_efficient_table(args: argparse.Namespace) -> list[str]:
    """Pre-LN, Triton backend: saved bytes per token per layer without and with ``memory_efficient``, and the rule:
    two norms a layer, each saving its output (kept by the next Linear anyway) instead of its input, so each frees
    its input (``N x itemsize`` per token) and LayerNorm also its fp32 mean (4 bytes per token)."""
    lines = [
        "| model | dtype | default | memory_efficient | saved per token per layer | rule | MiB a layer, 4096 tokens |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for family in ("gpt2", "llama"):
        for name, dtype in DTYPES.items():
            default, lean = (
                per_token_per_layer(lnblocks_build(family, "pre", args, dtype, "triton", me), False, args)
                for me in (None, True)
            )
            item = torch.finfo(dtype).bits // 8
            rule = 2 * (args.dim * item + (4 if family == "gpt2" else 0))
            mib = (default - lean) * 4096 / 2**20
            label = "GPT-2 (LayerNorm)" if family == "gpt2" else "Llama (RMSNorm)"
            lines.append(
                f"| {label} | {name} | {default:,.0f} | {lean:,.0f} | {default - lean:,.0f} | {rule:,} | {mib:.2f} |"
            )
    return lines


# ---- norm modules -------------------------------------------------------------------------------------------------
def norm_table(args: argparse.Namespace) -> list[str]:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    n, rows = args.dim, args.norm_rows
    cases: list[tuple[str, Callable[[], nn.Module], bool]] = [
        ("torch.nn.LayerNorm: norm(x + r)", lambda: nn.LayerNorm(n), False),
        ("HF LlamaRMSNorm: norm(x + r)", lambda: LlamaRMSNorm(n, eps=1e-6), False),
    ]
    for kind in ("layernorm", "llama"):
        for backend in ("torch", "triton"):
            make = lambda k=kind, b=backend: lnblocks.build_norm(k, n, backend=b)  # noqa: E731
            cases += [(f"lnblocks {kind} {backend}: norm(x + r)", make, False)]
            cases += [(f"lnblocks {kind} {backend}: norm(x, residual=r)", make, True)]
    lines = ["| norm call | " + " | ".join(DTYPES) + " |", "|" + "---|" * (1 + len(DTYPES))]
    for name, make, fused in tqdm(cases, desc="norms", leave=False):
        cells = []
        for dtype in DTYPES.values():
            norm = make().to(dtype)
            x = torch.randn(rows, n, dtype=dtype, requires_grad=True)  # the branch output
            r = torch.randn(rows, n, dtype=dtype, requires_grad=True)  # the residual stream

            def run(norm=norm, x=x, r=r, fused=fused) -> Tensor:
                if fused:
                    y, new_r = norm(x, residual=r)
                    return y.sum() + new_r.sum()
                new_r = x + r
                return norm(new_r).sum() + new_r.sum()

            cells.append(f"{saved_bytes(run, exclude=norm) / rows:,.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1, help="L: the per-layer cost is the 2L - L difference")
    parser.add_argument("--vocab", type=int, default=1024, help="cancels out of the per-layer numbers")
    parser.add_argument("--norm-rows", type=int, default=1024)
    parser.add_argument("--backends", nargs="+", default=["torch"], choices=["torch", "triton"])
    parser.add_argument("--quick", action="store_true", help="width 96, 6 heads, T=32 (a smoke run)")
    parser.add_argument("--only", nargs="+", default=["models", "norms", "memory_efficient"],
                        choices=["models", "norms", "memory_efficient"], help="which tables to print")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.dim, args.heads, args.seq, args.norm_rows = 96, 6, 32, 64
    torch.set_num_threads(min(2, torch.get_num_threads()))
    if "models" in args.only:
        print(f"Saved for backward, bytes per token per layer (width {args.dim}, {args.heads} heads, T={args.seq}, "
              f"batch {args.batch}; in brackets: / HF of the same shape and dtype)\n")  # fmt: skip
        print("\n".join(model_table(args)))
    if "norms" in args.only:
        print(f"\nNorm call alone, bytes per row of width {args.dim} ({args.norm_rows} rows; y and the new residual "
              "both used downstream)\n")  # fmt: skip
        print("\n".join(norm_table(args)))
    if "memory_efficient" in args.only:
        print(f"\nmemory_efficient=True, Pre-LN, Triton backend: saved bytes per token per layer (width {args.dim}, "
              f"T={args.seq}, batch {args.batch})\n")  # fmt: skip
        print("\n".join(memory_efficient_table(args)))


if __name__ == "__main__":
    main()
