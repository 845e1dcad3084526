"""Breadth: every ``*ForCausalLM`` class of the installed transformers, built tiny from its config class.

For each class that builds tiny and runs on token ids: ``patch_norms(backend="torch")`` never raises and the logits
are bit-identical to the unpatched model's; ``fuse_residual=True`` either fuses (logits bit-identical again) or is
refused with a ``ValueError`` naming the layer class, the model left exactly as it was. The counts are the ones
docs/hf-training.md states (so the page cannot drift from the installed transformers).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from hf_breadth import build, causal_lm_names, inputs, logits
from hf_state import snapshot

from lnblocks.hf import patch_norms, unpatch_norms

transformers = pytest.importorskip("transformers")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "hf-training.md"
NOW_PATCHED = [
    f"{name}ForCausalLM"
    for name in ("Dory", "Gemma4Unified", "Helium", "HrmText", "LaraMini", "Llama4", "Moshi", "NanoChat", "Nemotron",
                 "NemotronH", "Qwen4Exp", "xLSTM")
]  # fmt: skip


def _patch(model, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no norm was patched" for the classes whose norms are all unknown
        return patch_norms(model, backend="torch", **options)


def _survey() -> dict[str, tuple[str, str]]:
    """class name -> (outcome, detail); outcomes: patched / left alone / skipped, and fused / refused."""
    results: dict[str, tuple[str, str]] = {}
    for name in causal_lm_names():
        model, why = build(name)
        batch = inputs()
        if model is not None:
            try:
                reference = logits(model, batch)
            except Exception as err:  # the tiny config builds but does not run (multimodal inputs, codebooks)
                model, why = None, f"its tiny model does not run on token ids: {type(err).__name__}"
        if model is None:
            results[name] = ("skipped", why)
            continue
        report = _patch(model)  # must not raise
        assert torch.equal(logits(model, batch), reference), f"{name}: patched logits differ"
        unknown = sorted({e.cls for e in report.unknown})
        norms = "patched" if report.patched else "left alone"
        assert unpatch_norms(model) == len(report.patched)
        before = snapshot(model)
        try:
            fused = _patch(model, fuse_residual=True)
        except ValueError as err:
            assert snapshot(model) == before, f"{name}: a refused fuse_residual changed the model"
            assert re.search(r"fuse_residual=True: ", str(err)), f"{name}: {err}"
            results[name] = (norms, "refused")
        else:
            assert torch.equal(logits(model, batch), reference), f"{name}: fused logits differ"
            results[name] = (norms, f"fused ({len(fused.layers)} layers)")
        if unknown:
            results[name] = (*results[name][:1], f"{results[name][1]}; unknown: {', '.join(unknown)}")
    return results


def summary(results: dict[str, tuple[str, str]]) -> str:
    """The one line docs/hf-training.md states."""
    counts = Counter(outcome for outcome, _ in results.values())
    fused = sum(detail.startswith("fused") for _, detail in results.values())
    return (
        f"{len(results)} classes: {counts['patched']} patched, {counts['left alone']} left alone (every norm of "
        f"unknown math), {counts['skipped']} skipped (not buildable tiny offline); fuse_residual fuses "
        f"{fused}, refuses {counts['patched'] + counts['left alone'] - fused}"
    )


@pytest.mark.slow  # ~145 tiny models, ~40 s on one idle core
def test_every_causal_lm_patches_exactly_and_fuses_or_refuses() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~145 tiny models: one thread each is fastest
    try:
        results = _survey()
    finally:
        torch.set_num_threads(threads)
    line = summary(results)
    print(line)
    for name, (outcome, detail) in sorted(results.items()):
        print(f"  {name}: {outcome}; {detail}")
    for name in ("OlmoForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM"):  # LayerNorm classes known by their code
        assert results[name][0] == "patched", results[name]
    for name in NOW_PATCHED:  # left alone while norms were recognised by their spelling
        assert results[name][0] == "patched", results[name]
    for name in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "OlmoForCausalLM"):
        assert results[name][1].startswith("fused"), results[name]
    assert results["Olmo2ForCausalLM"][1].startswith("fused")  # norm, then add: Norm.norm_then_add
    assert line in DOCS.read_text(), f"docs/hf-training.md must state the breadth counts: {line!r}"
