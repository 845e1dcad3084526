"""torch.compile: the patch adds no graph break.

The unpatched tiny models below compile with ``fullgraph=True`` (no break at all), so compiling the patched model
with ``fullgraph=True`` proves the patch adds none (dynamo raises on the first break). ``aot_eager`` traces forward
and backward without inductor codegen, which keeps the test to seconds on CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import build, inputs

from lnblocks.hf import patch_norms

pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["llama", "gemma3", "bert"])
def test_patched_model_compiles_fullgraph_forward_and_backward(family):
    torch._dynamo.reset()
    original = build(family).eval()
    patched = copy.deepcopy(original)
    patch_norms(patched)
    batch = inputs(original)
    kwargs = {} if family == "bert" else {"use_cache": False}

    ref = original(**batch, **kwargs)
    ref.loss.backward()
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)
    out = compiled(**batch, **kwargs)
    out.loss.backward()

    assert torch.equal(out.logits, ref.logits)
    for (name, p), q in zip(original.named_parameters(), patched.parameters()):
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name
    torch._dynamo.reset()


def test_graph_break_count_is_unchanged():
    torch._dynamo.reset()
    model = build("olmo2").eval()
    batch = {"input_ids": inputs(model)["input_ids"], "use_cache": False}
    before = torch._dynamo.explain(model)(**batch)
    patch_norms(model)
    torch._dynamo.reset()
    after = torch._dynamo.explain(model)(**batch)
    assert after.graph_break_count == before.graph_break_count
    assert after.graph_count == before.graph_count

    def traced_files(explained) -> str:
        return " ".join(str(n.meta.get("stack_trace", "")) for g in explained.graphs for n in g.graph.nodes)

    # dynamo traced the instance-level forward (lnblocks' math), not the class forward
    assert "lnblocks/norms/functional.py" in traced_files(after)
    assert "lnblocks/norms/functional.py" not in traced_files(before)
    torch._dynamo.reset()
