"""Model-level GPU checks of the fused norms: a GPT-2-small train step and an HF Llama forward+backward.

    python benchmarks/models/bench_gpu_models.py --out PREFIX [--smoke] [--budget-s 110]

1. GPT train step (forward + backward + AdamW, pure bf16, GPT-2-small shape: 12 layers, d=768, 12 heads, T=1024,
   vocab 50257): lnblocks ``GPT`` with the fused norms (``backend="auto"``), the same model with
   ``backend="torch"``, and transformers' ``GPT2LMHeadModel`` (same weights). Tokens/s (median step) and peak memory.
   Then the fused step under ``torch.cuda.set_sync_debug_mode("error")`` (any host synchronisation raises), and
   captured in a CUDA graph (static inputs, ``capturable`` AdamW) and replayed.
2. HF ``LlamaForCausalLM`` (Llama-shaped, bf16) forward + backward: unpatched, ``lnblocks.hf.patch_norms`` and
   Liger-Kernel's RMSNorm patch (``apply_liger_kernel_to_llama(rms_norm=True)`` only, so only the norms differ).

Every part runs under try/except: a failure is a recorded result (``error: ...``), not a crash. Writes
``PREFIX.json`` and prints a markdown summary. ``--smoke`` (automatic without CUDA) runs tiny shapes on CPU with the
kernels in Triton's interpreter; the sync-debug and CUDA-graph parts then say they need CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.common, this lnblocks

import torch

from benchmarks.common.env import environment
from benchmarks.common.timing import Timer  # CUDA events, or perf_counter on CPU


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench_gpu_models", help="output prefix (.json)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (automatic without CUDA)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    ap.add_argument("--report-only", action="store_true", help="print the markdown of PREFIX.json")
    return ap.parse_args()


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None


def _guard(fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as err:  # a failing part is a result, not a crash
        return {"status": f"error: {type(err).__name__}: {str(err)[:300]}"}


# ---- 1. GPT train step ----------------------------------------------------------------------------------------------
def _set_norm_backend(model: torch.nn.Module, backend: str) -> None:
    from lnblocks.norms import Norm

    for m in model.modules():
        if isinstance(m, Norm):
            m.spec = m.spec.replace(backend=backend)


def _norm_backends(model: torch.nn.Module) -> list[str]:
    from lnblocks.norms import Norm

    return sorted({str(m.last_backend) for m in model.modules() if isinstance(m, Norm)})


def gpt_section(device: torch.device, smoke: bool, clock: Timer) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from lnblocks.models import GPT

    if smoke:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
        batch, seq = 2, 32
    else:
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        batch, seq = 8, 1024
    dtype = torch.bfloat16
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype)
    fused = GPT.from_hf(hf).to(device=device, dtype=dtype)
    eager = GPT.from_hf(hf).to(device=device, dtype=dtype)
    _set_norm_backend(fused, "triton" if smoke else "auto")  # smoke: the kernels in the interpreter
    _set_norm_backend(eager, "torch")
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    out: dict = {"shape": dict(layers=cfg.n_layer, dim=cfg.n_embd, batch=batch, seq=seq, dtype="bfloat16")}

    def lnblocks_step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()

        return step

    def hf_step():
        opt = torch.optim.AdamW(hf.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            hf(input_ids=idx, labels=idx).loss.backward()
            opt.step()

        return step

    for name, make in (
        ("lnblocks fused", lambda: lnblocks_step(fused)),
        ("lnblocks torch", lambda: lnblocks_step(eager)),
        ("HF GPT2LMHeadModel", hf_step),
    ):

        def run(make=make) -> dict:
            _peak_reset(device)
            secs = clock(make())
            return dict(status="ok", step_ms=secs * 1e3, tokens_per_s=batch * seq / secs, peak_mib=_peak_mib(device))

        out[name] = _guard(run)
    out["lnblocks fused"]["norm_backends"] = _norm_backends(fused)
    out["lnblocks torch"]["norm_backends"] = _norm_backends(eager)
    out["sync_debug"] = _guard(lambda: _sync_debug(device, lnblocks_step(fused)))
    out["cuda_graph"] = _guard(lambda: _cuda_graph(device, fused, idx, clock, batch * seq))
    return out


def _sync_debug(device: torch.device, step: Callable[[], None]) -> dict:
    if device.type != "cuda":
        return {"status": "skipped: needs CUDA"}
    step()  # first call (allocations, routing) outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {"status": "ok: no host synchronisation in a train step"}


def _cuda_graph(device: torch.device, model, idx, clock: Timer, tokens: int) -> dict:
    if device.type != "cuda":
        return {"status": "skipped: needs CUDA"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    static_idx = idx.clone()

    def step():
        opt.zero_grad(set_to_none=False)
        _, loss = model(static_idx, static_idx)
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    secs = clock(graph.replay)
    return dict(status="ok: captured and replayed", step_ms=secs * 1e3, tokens_per_s=tokens / secs)


# ---- 2. HF Llama forward + backward ---------------------------------------------------------------------------------
def llama_section(device: torch.device, smoke: bool, clock: Timer) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    import lnblocks.hf

    if smoke:
        cfg = LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        batch, seq = 2, 32
    else:
        cfg = LlamaConfig(
            vocab_size=32000,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=2048,
        )
        batch, seq = 4, 1024
    dtype = torch.bfloat16
    torch.manual_seed(0)
    models = {}
    for name in ("unpatched", "lnblocks patch_norms", "Liger RMSNorm patch"):
        torch.manual_seed(0)
        models[name] = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    out: dict = {"shape": dict(layers=cfg.num_hidden_layers, dim=cfg.hidden_size, batch=batch, seq=seq)}
    report = lnblocks.hf.patch_norms(models["lnblocks patch_norms"], backend="triton" if smoke else "auto")
    out["lnblocks patch_norms"] = {"patched_modules": len(report.patched)}
    out["Liger RMSNorm patch"] = _guard(lambda: _liger_patch(models["Liger RMSNorm patch"]))
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    with torch.no_grad():
        ref = models["unpatched"](input_ids=idx).logits.float()
    for name, model in models.items():
        if out.get(name, {}).get("status", "ok").startswith("error"):
            continue

        def run(model=model) -> dict:
            with torch.no_grad():
                diff = (model(input_ids=idx).logits.float() - ref).abs().max().item()

            def step():
                model.zero_grad(set_to_none=True)
                model(input_ids=idx, labels=idx).loss.backward()

            _peak_reset(device)
            secs = clock(step)
            return dict(
                status="ok",
                fwd_bwd_ms=secs * 1e3,
                tokens_per_s=batch * seq / secs,
                peak_mib=_peak_mib(device),
                max_logit_diff_vs_unpatched=diff,
            )

        out[name] = out.get(name, {}) | _guard(run)
    return out


def _liger_patch(model) -> dict:
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRMSNorm
    try:
        apply_liger_kernel_to_llama(
            rope=False, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=True, swiglu=False, model=model
        )
    finally:
        modeling_llama.LlamaRMSNorm = original  # the patch also replaces the class for models built later
    return {"status": "ok"}


# ---- report ---------------------------------------------------------------------------------------------------------
def markdown(result: dict) -> str:
    lines = [f"Device: {result['device']}; torch {result['torch']}", ""]
    gpt = result.get("gpt", {})
    lines += [
        "### GPT train step (bf16)",
        "",
        f"shape: {gpt.get('shape')}",
        "",
        "| contender | status | step ms | tokens/s | peak MiB | norm backends |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name in ("lnblocks fused", "lnblocks torch", "HF GPT2LMHeadModel", "cuda_graph"):
        r = gpt.get(name, {})
        lines.append(
            f"| {name} | {r.get('status', '-')} | {_f(r.get('step_ms'))} | {_f(r.get('tokens_per_s'), 0)} | "
            f"{_f(r.get('peak_mib'), 0)} | {', '.join(r.get('norm_backends', []))} |"
        )
    lines += ["", f"sync debug mode 'error': {gpt.get('sync_debug', {}).get('status')}", ""]
    llama = result.get("llama", {})
    lines += [
        "### HF Llama forward + backward (bf16)",
        "",
        f"shape: {llama.get('shape')}",
        "",
        "| model | status | fwd+bwd ms | tokens/s | peak MiB | max logit diff |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in ("unpatched", "lnblocks patch_norms", "Liger RMSNorm patch"):
        r = llama.get(name, {})
        lines.append(
            f"| {name} | {r.get('status', '-')} | {_f(r.get('fwd_bwd_ms'))} | {_f(r.get('tokens_per_s'), 0)} | "
            f"{_f(r.get('peak_mib'), 0)} | {_f(r.get('max_logit_diff_vs_unpatched'), 4)} |"
        )
    return "\n".join(lines) + "\n"


def _f(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def main() -> None:
    args = _parse()
    out = Path(args.out)
    if args.report_only:
        print(markdown(json.loads(out.with_suffix(".json").read_text())))
        return
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before lnblocks.kernels decorates its kernels
    device = torch.device("cpu" if smoke else "cuda")
    clock = Timer(device, args.steps or (1 if smoke else 10), 1 if smoke else 3, flush_l2=False)
    result: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke run, interpreter)",
        "torch": torch.__version__,
        "env": environment(device),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    for key, section in (("gpt", gpt_section), ("llama", llama_section)):
        t0 = time.monotonic()
        result[key] = _guard(lambda section=section: section(device, smoke, clock))
        result[key]["seconds"] = round(time.monotonic() - t0, 1)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))  # partial results survive
        print(f"{key}: done in {result[key]['seconds']} s", flush=True)
    print(markdown(result))


if __name__ == "__main__":
    main()
