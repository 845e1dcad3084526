"""The classes the breadth check used to leave alone (every norm of unknown math), patched now that norms are
recognised by their math: each built tiny as the breadth check builds it (``hf_breadth.build``: its own config
class, random weights, norm weights randomised), patched with ``backend="torch"``, gives the unpatched model's logits
and gradients bit for bit in fp32 and bf16. The one norm class still left alone is named with the op it differs in.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hf_breadth import build

from lnblocks.hf import patch_norms

pytest.importorskip("transformers")

# class -> (number of norms patched, the norm classes left alone with the op they differ in)
CLASSES = {
    "DoryForCausalLM": (17, {}),  # l2norm(sum): nGPT-style unit-norm hidden states
    "Gemma4UnifiedForCausalLM": (15, {}),  # torch.pow(v, -0.5): the class's ops on the torch backend
    "HeliumForCausalLM": (5, {}),  # OLMo 2's rounding, spelt with weight.to(torch.float32)
    "HrmTextForCausalLM": (10, {}),  # parameter-free: l2norm(mean)
    "LaraMiniForCausalLM": (8, {}),  # with the gated norm after the gate-less RMSNorm
    "Llama4ForCausalLM": (7, {}),
    "MoshiForCausalLM": (5, {}),
    "NanoChatForCausalLM": (9, {}),
    "NemotronForCausalLM": (5, {}),
    "NemotronHForCausalLM": (6, {}),
    "Qwen4ExpForCausalLM": (7, {}),
    "xLSTMForCausalLM": (5, {"xLSTMMultiHeadLayerNorm": "`x.reshape(batch_size, sequence_length, -1)`"}),
}


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(CLASSES))
def test_patched_exactly(name: str, dtype: torch.dtype) -> None:
    model, why = build(name)
    assert model is not None, why
    model = model.to(dtype)
    patched = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = patch_norms(patched, backend="torch")
    n_patched, left_alone = CLASSES[name]
    assert len(report.patched) == n_patched
    assert {e.cls for e in report.unknown} == set(left_alone)
    for entry in report.unknown:
        assert left_alone[entry.cls] in entry.reason, entry.reason
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    (a, grads_a), (b, grads_b) = _step(model, ids), _step(patched, ids)
    assert torch.equal(a, b), f"logits differ by {(a.float() - b.float()).abs().max().item()}"
    assert grads_a.keys() == grads_b.keys() and grads_a
    for key in grads_a:
        assert torch.equal(grads_a[key], grads_b[key]), key
