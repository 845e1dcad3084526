"""BlockConfig validation (every bad input is a ValueError/TypeError naming the option) and the MLP variants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lnblocks import Block, BlockConfig
from lnblocks.blocks import MLP, AttentionConfig, MLPConfig
from lnblocks.norms import LayerNorm, LayerNormSpec, RMSNorm, RMSNormSpec
from tests.blocks.block_helpers import randomize_


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"placement": "prenorm"}, ValueError, r"^placement must be one of \['pre', 'post'.*got 'prenorm'"),
        ({"norm": "batchnorm"}, ValueError, r"^norm must be a norm kind or preset; unknown norm kind 'batchnorm'"),
        ({"norm": {"kind": "rmsnorm", "gain": 2}}, ValueError, r"^norm\.gain is not a config key"),
        ({"norm": {"kind": "rmsnorm", "eps": -1.0}}, ValueError, r"^norm\.eps must be a finite number >= 0"),
        ({"norm": {"kind": "batchnorm"}}, ValueError, r"^norm\.kind must be a norm kind or preset"),
        ({"dim": 30, "attention": {"n_heads": 4}}, ValueError, r"dim \(30\) must be divisible by n_heads \(4\)"),
        ({"attention": {"n_heads": 4, "n_kv_heads": 3}}, ValueError, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
        (
            {"attention": {"heads": 4}},
            ValueError,
            r"^attention\.heads is not a config key; valid keys of AttentionConfig",
        ),
        (
            {"attention": {"backend": "xformers"}},
            ValueError,
            r"backend must be one of \['sdpa', 'flash_attn', 'eager'\]",
        ),
        ({"attention": {"causal": False, "sliding_window": 4}}, ValueError, "sliding_window needs causal=True"),
        ({"attention": {"dropout": 1.5}}, ValueError, r"^attention\.dropout must be a finite number >= 0 and < 1"),
        ({"attention": {"n_heads": 0}}, ValueError, r"^attention\.n_heads must be >= 1"),
        ({"attention": {"n_heads": 2.0}}, TypeError, r"^attention\.n_heads must be an int"),
        ({"attention": "sdpa"}, TypeError, "^attention must be an AttentionConfig or a mapping"),
        ({"mlp": {"activation": "tanh"}}, ValueError, r"activation must be one of \['gelu', 'gelu_tanh'"),
        ({"qk_norm": "dyt"}, ValueError, r"qk_norm must be None or one of \['rmsnorm', 'layernorm'\]"),
        ({"shared_norm": True}, ValueError, "^shared_norm needs placement='parallel'"),
        ({"deepnorm_alpha": 2.0}, ValueError, "deepnorm_alpha needs placement='deepnorm'"),
        ({"placement": "post", "depth_scaled_norm": True}, ValueError, "placement='post' has none"),
        (
            {"placement": "reordered", "norm": {"kind": "rmsnorm", "residual_in_fp32": True}},
            ValueError,
            "no input norm to fuse it into",
        ),
        ({"dropout": -0.1}, ValueError, r"^dropout must be a finite number >= 0 and < 1"),
        ({"rezero": 1}, TypeError, "rezero must be a bool"),
        ({"v_norm": "dyt"}, ValueError, r"^v_norm must be None or one of \['rmsnorm', 'layernorm'\]"),
        ({"mlp_placement": "prenorm"}, ValueError, r"^mlp_placement must be one of \['pre'"),
        ({"placement": "parallel", "mlp_placement": "pre"}, ValueError, "^mlp_placement sets a per-sublayer placement"),
        ({"placement": "pre", "mlp_placement": "siamese"}, ValueError, "^mlp_placement sets a per-sublayer placement"),
        ({"attention": {"softcap": 0.0}}, ValueError, r"^attention\.softcap must be a finite number > 0"),
        ({"attention": {"output_gate": "global"}}, ValueError, r"^attention\.output_gate must be one of"),
        ({"hyper_connections": {"n_streams": 0}}, ValueError, r"^hyper_connections\.n_streams must be >= 1"),
        ({"hyper_connections": {"kind": "sparse"}}, ValueError, r"^hyper_connections\.kind must be one of"),
        ({"hyper_connections": {"sinkhorn_iters": 5}}, ValueError, r"^hyper_connections\.sinkhorn_iters .*kind='mhc'"),
        ({"hyper_connections": 4}, TypeError, "^hyper_connections must be a HyperConnectionsConfig or a mapping"),
        ({"placement": "post", "hyper_connections": {}}, ValueError, "^placement with hyper_connections must be one"),
        ({"mlp_placement": "normed_residual", "hyper_connections": {}}, ValueError, "^mlp_placement with hyper_conn"),
        ({"placement": "siamese", "depth_scaled_norm": True}, ValueError, "^depth_scaled_norm is not available"),
        ({"placement": "ngpt"}, ValueError, r"^attention\.qkv_bias does not go with placement 'ngpt'"),
        (
            {"placement": "ngpt", "attention": {"qkv_bias": False, "out_bias": False}, "mlp": {"bias": False}},
            ValueError,
            r"^mlp\.activation does not go with placement 'ngpt'",
        ),
        (
            {"placement": "siamese", "norm": {"kind": "layernorm", "residual_in_fp32": True}},
            ValueError,
            r"^norm\.residual_in_fp32 keeps a pre-norm residual stream in fp32: only",
        ),
    ],
)
def test_bad_block_config(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        BlockConfig(**options)


def test_from_dict_rejects_unknown_keys_and_builds_nested_configs() -> None:
    with pytest.raises(ValueError, match=r"^placment is not a config key; valid keys of BlockConfig"):
        BlockConfig.from_dict({"placment": "post"})
    cfg = BlockConfig.from_dict(
        {"dim": 48, "placement": "sandwich", "norm": {"kind": "rmsnorm", "eps": 1e-6}, "attention": {"n_heads": 6}}
    )
    assert cfg.norm == RMSNormSpec(eps=1e-6)
    assert cfg.attention == AttentionConfig(n_heads=6) and cfg.head_dim == 8 and cfg.mlp_hidden_dim == 192
    assert BlockConfig.from_dict(cfg.to_dict()) == cfg  # round trip through the YAML form
    assert cfg.replace(placement="post").placement == "post"
    with pytest.raises(ValueError, match=r"^nrom is not a config key"):
        cfg.replace(nrom="rmsnorm")
    assert BlockConfig(norm="bert").norm == LayerNormSpec(eps=1e-12)  # presets work as norms


def test_block_rejects_bad_layer_index() -> None:
    with pytest.raises(ValueError, match="0 <= layer_idx < n_layers"):
        Block(BlockConfig(), layer_idx=4, n_layers=4)
    with pytest.raises(TypeError, match="config must be a BlockConfig or a dict"):
        Block("pre")
    assert isinstance(Block({"placement": "post"}).attn_post_norm, torch.nn.Module)


@pytest.mark.parametrize(
    ("activation", "act"),
    [
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        ("gelu_tanh", lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
        ("relu", lambda x: x.clamp_min(0)),
        ("silu", lambda x: x * torch.sigmoid(x)),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_plain(activation: str, act, bias: bool) -> None:
    mlp = randomize_(MLP(16, MLPConfig(activation=activation, hidden_dim=24, bias=bias)))
    x = torch.randn(3, 16, dtype=torch.float64)
    mlp.double()
    expected = F.linear(act(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight, mlp.fc2.bias)
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("activation", "act"), [("swiglu", F.silu), ("geglu", F.gelu)])
def test_mlp_gated(activation: str, act) -> None:
    """SwiGLU/GeGLU (Shazeer 2020): fc2(act(x W_gate) * (x W_up)); fc1 holds [gate; up]."""
    mlp = randomize_(MLP(16, MLPConfig(activation=activation, hidden_dim=24, bias=False))).double()
    assert mlp.fc1.weight.shape == (48, 16)
    gate, up = mlp.split_fc1(mlp.fc1.weight)
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(mlp(x), F.linear(act(x @ gate.T) * (x @ up.T), mlp.fc2.weight))
    with pytest.raises(ValueError, match="split_fc1 needs a gated activation"):
        MLP(16, MLPConfig()).split_fc1(torch.zeros(64, 16))


def test_block_matrices_by_role() -> None:
    blk = Block(BlockConfig(dim=32, attention={"n_heads": 4, "n_kv_heads": 2}, mlp={"activation": "swiglu"}))
    m = blk.matrices()
    assert {k: tuple(v.shape) for k, v in m.items()} == {
        "W_Q": (32, 32),
        "W_K": (16, 32),
        "W_V": (16, 32),
        "W_O": (32, 32),
        "W_1": (128, 32),
        "W_3": (128, 32),
        "W_2": (32, 128),
    }
    with pytest.raises(ValueError, match="no gradients yet"):
        blk.matrices(grad=True)
    blk(torch.randn(1, 3, 32)).sum().backward()
    assert torch.equal(blk.matrices(grad=True)["W_V"], blk.attn.qkv.weight.grad[48:])


@pytest.mark.parametrize(("activation", "act"), [("gelu", F.gelu), ("relu", F.relu), ("swiglu", F.silu)])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_normformer_mlp_norm_after_the_activation(activation: str, act, norm: str) -> None:
    """NormFormer's FFN norm (Shleifer et al. 2021, arXiv 2110.09456): fc2(norm(act(fc1 x))), for a gated MLP
    fc2(norm(act(x W_gate) * (x W_up))), written out in fp64; the block's norm kind over hidden_dim."""
    cfg = BlockConfig(dim=16, norm=norm, attention={"n_heads": 2}, mlp={"activation": activation, "hidden_dim": 24},
                      mlp_norm=True)  # fmt: skip
    blk = randomize_(Block(cfg)).double()
    mlp = blk.mlp
    assert mlp.norm.normalized_shape == (24,) and mlp.norm.spec == cfg.norm
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    h = F.linear(x, mlp.fc1.weight, mlp.fc1.bias)
    if mlp.gated:
        gate, up = h.chunk(2, dim=-1)
        h = act(gate) * up
    else:
        h = act(h)
    w = mlp.norm.weight
    if norm == "layernorm":
        h = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * w
        h = h + mlp.norm.bias
    else:
        h = h / (h.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float64).eps).sqrt() * w
    torch.testing.assert_close(mlp(x), F.linear(h, mlp.fc2.weight, mlp.fc2.bias), rtol=1e-12, atol=1e-12)
    # in the block: x + mlp(norm(x)) after the attention sublayer, and its gain gets a gradient
    blk(x).sum().backward()
    assert mlp.norm.weight.grad is not None and mlp.norm.weight.grad.abs().sum() > 0
    assert Block(cfg.replace(mlp_norm=False)).mlp.norm is None
    assert BlockConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(TypeError, match=r"^mlp_norm must be a bool or a norm"):
        cfg.replace(mlp_norm=None)
    with pytest.raises(ValueError, match=r"^mlp_norm must be a norm kind or preset"):
        cfg.replace(mlp_norm="batchnorm")


def test_mlp_norm_of_its_own() -> None:
    """``mlp_norm`` given as a norm: that norm in the MLP, whatever the block's ``norm`` is; ``True`` = the block's."""
    cfg = BlockConfig(dim=16, norm="rmsnorm", attention={"n_heads": 2}, mlp={"hidden_dim": 24},
                      mlp_norm={"kind": "layernorm", "eps": 1e-6})  # fmt: skip
    blk = Block(cfg)
    assert isinstance(blk.mlp.norm, LayerNorm) and blk.mlp.norm.eps == 1e-6 and blk.mlp.norm.normalized_shape == (24,)
    assert isinstance(blk.mlp_in_norm, RMSNorm)
    assert cfg.mlp_norm_spec == LayerNormSpec(eps=1e-6) and BlockConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(mlp_norm=True).mlp_norm_spec == cfg.norm and cfg.replace(mlp_norm=False).mlp_norm_spec is None
    x = torch.randn(2, 3, 16)
    h = F.gelu(blk.mlp.fc1(x))
    torch.testing.assert_close(blk.mlp(x), blk.mlp.fc2(F.layer_norm(h, (24,), blk.mlp.norm.weight,
                                                                    blk.mlp.norm.bias, 1e-6)))  # fmt: skip


def test_added_fields_stay_out_of_the_stored_form_at_their_defaults() -> None:
    """Configs stored before the options existed (YAML, run records, the study's run ids) keep their form."""
    cfg = BlockConfig()
    d = cfg.to_dict()
    assert not {"v_norm", "mlp_placement", "hyper_connections"} & set(d)
    assert not {"softcap", "output_gate"} & set(d["attention"])
    full = BlockConfig(v_norm="rmsnorm", hyper_connections={"n_streams": 2}, attention={"softcap": 5.0})
    assert full.to_dict()["hyper_connections"] == {"n_streams": 2, "kind": "dynamic", "sinkhorn_iters": 20, "eps": 1e-6}
    assert BlockConfig.from_dict(full.to_dict()) == full and BlockConfig.from_dict(d) == cfg
