"""The arms of the digits study: every arm builds the blocks its paper prescribes and trains a few steps, and the
arm-specific parts are checked against their formulas (weight norm's data-dependent init, AlexNet's LRN constants,
AGC left off the head, SwitchableNorm's recorded mix)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import lnblocks.cnn as C
from lnblocks.study import study_from_dict
from lnblocks.study.core.tasks import record_from_json
from lnblocks.study.digits.arms import LRN_ALPHA, LRN_BETA, LRN_K, LRN_SIZE, DigitsCNN, weight_norm_data_init
from lnblocks.study.digits.config import NORM_KINDS, NORM_LABELS, DigitsRunConfig, DigitsStudyConfig
from lnblocks.study.digits.train import load_digits_data, train_run

SMALL = {"epochs": 1, "min_steps": 1, "max_train": 64, "widths": (8, 8)}
ACTIVATION_NORMS = (nn.BatchNorm2d, nn.GroupNorm, nn.InstanceNorm2d, C.BatchNorm2d, C.GroupNorm, C.InstanceNorm2d,
                    C.LayerNorm2d, C.BatchRenorm2d, C.SwitchableNorm2d, C.FRN2d, C.EvoNormB0, C.EvoNormS0)  # fmt: skip


def _types(model: DigitsCNN) -> list[type]:
    return [type(m) for m in model.features]


def test_the_study_has_every_arm_with_a_label() -> None:
    assert set(NORM_KINDS) == {"batch", "group", "layer2d", "instance", "batchrenorm", "switchable", "frn",
                               "evonorm_s0", "evonorm_b0", "group_ws", "nf", "weightnorm", "lrn"}  # fmt: skip
    assert DigitsStudyConfig().norms == NORM_KINDS and set(NORM_LABELS) == set(NORM_KINDS)
    quick = study_from_dict({"task": "cnn_digits", **DigitsStudyConfig().quick().to_dict()})
    assert {r.norm for r in quick.runs()} == set(NORM_KINDS)  # the quick config runs every arm too


@pytest.mark.parametrize("norm", NORM_KINDS)
def test_every_arm_builds_and_trains(norm: str) -> None:
    run = DigitsRunConfig(norm=norm, batch_size=8, seed=0, **SMALL)
    rec = train_run(run)
    r = rec.result
    assert rec.status == "finished" and r.steps == 8 and math.isfinite(r.final_train_loss)
    assert 0.0 <= r.test_acc <= 100.0
    assert (r.switch_weights is not None) == (norm == "switchable")
    assert (r.agc_grad_ratio is not None) == (norm == "nf")
    model = DigitsCNN(run.widths, norm, run, total_steps=8)
    norms = [m for m in model.features if isinstance(m, ACTIVATION_NORMS)]
    assert len(norms) == (0 if norm in ("nf", "weightnorm", "lrn") else 2)
    assert sum(isinstance(m, nn.Conv2d) for m in model.features) == 2 and isinstance(model.head, nn.Linear)
    convs = model.convs()
    assert all((c.bias is not None) == (norm in ("nf", "weightnorm", "lrn")) for c in convs)


def test_recipes_replace_norm_and_activation_where_the_papers_do() -> None:
    cfg = DigitsRunConfig(**SMALL)
    relu, pool = nn.ReLU, nn.MaxPool2d
    assert _types(DigitsCNN((8, 8), "frn", cfg, 8)) == [nn.Conv2d, C.FRN2d, C.TLU] * 2 + [pool]
    s0 = DigitsCNN((8, 8), "evonorm_s0", cfg, 8)
    assert _types(s0) == [nn.Conv2d, C.EvoNormS0] * 2 + [pool]
    assert all(m.num_groups == cfg.gn_groups for m in s0.features if isinstance(m, C.EvoNormS0))  # GN's groups
    assert _types(DigitsCNN((8, 8), "evonorm_b0", cfg, 8)) == [nn.Conv2d, C.EvoNormB0] * 2 + [pool]
    assert _types(DigitsCNN((8, 8), "group_ws", cfg, 8)) == [C.WSConv2d, C.GroupNorm, relu] * 2 + [pool]
    nf = DigitsCNN((8, 8), "nf", cfg, 8)
    assert _types(nf) == [C.ScaledWSConv2d, relu] * 2 + [pool]
    assert all(m.gamma == C.RELU_GAMMA for m in nf.convs())
    assert _types(DigitsCNN((8, 8), "lrn", cfg, 8)) == [nn.Conv2d, relu, nn.LocalResponseNorm] * 2 + [pool]
    wn = DigitsCNN((8, 8), "weightnorm", cfg, 8)
    assert all(parametrize.is_parametrized(c, "weight") for c in wn.convs())
    assert not parametrize.is_parametrized(wn.head, "weight")
    with pytest.raises(ValueError, match=r"norm must be one of \['batch'"):
        DigitsCNN((8, 8), "spectral", cfg, 8)


def test_nf_clips_the_blocks_not_the_head() -> None:
    """NFNets (arXiv 2102.06171, Sec. 4.1) leave the final linear layer unclipped."""
    model = DigitsCNN((8, 8), "nf", DigitsRunConfig(**SMALL), 8)
    clipped = {id(p) for p in model.clipped_parameters()}
    assert clipped == {id(p) for p in model.features.parameters()}
    assert not clipped & {id(p) for p in model.head.parameters()}
    r = train_run(DigitsRunConfig(norm="nf", batch_size=8, seed=0, agc_clipping=1e-4, **SMALL)).result
    loose = train_run(DigitsRunConfig(norm="nf", batch_size=8, seed=0, agc_clipping=1e3, **SMALL)).result
    assert 0 < r.agc_grad_ratio < 0.1 and loose.agc_grad_ratio == 1.0  # a tight lambda clips, a loose one never


def test_weight_norm_data_dependent_init_standardizes_each_conv() -> None:
    """Salimans & Kingma (arXiv 1602.07868, Sec. 3): after the init every conv's output has mean 0 and std 1 per
    channel on the init images (computed here in fp64 from the conv's weight and bias)."""
    cfg = DigitsRunConfig(widths=(8, 16, 8))
    model = DigitsCNN(cfg.widths, "weightnorm", cfg, 8).double()
    x = load_digits_data(cfg).x_train[:200].double()
    weight_norm_data_init(model, x)
    h = x
    for layer in model.features:
        if isinstance(layer, nn.Conv2d):
            w = layer.weight  # g * v / ||v||, through torch's parametrization
            v = layer.parametrizations.weight.original1
            torch.testing.assert_close(
                w, layer.parametrizations.weight.original0 * v / v.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
            )
            t = torch.nn.functional.conv2d(h, w, layer.bias, padding=1)
            torch.testing.assert_close(
                t.mean((0, 2, 3)), torch.zeros(t.shape[1], dtype=torch.float64), atol=1e-12, rtol=0
            )
            torch.testing.assert_close(t.std((0, 2, 3), unbiased=False), torch.ones(t.shape[1], dtype=torch.float64))
        h = layer(h)


def test_lrn_is_alexnets_formula() -> None:
    """Krizhevsky et al. 2012, Sec. 3.3: b_i = a_i / (k + alpha * sum_{j=i-n/2}^{i+n/2} a_j^2)^beta, with k = 2, n = 5,
    alpha = 1e-4, beta = 0.75 (alpha not divided by n), written out in fp64."""
    a = torch.randn(3, 12, 4, 4, dtype=torch.float64) * 20
    lrn = nn.LocalResponseNorm(LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA, k=LRN_K)
    sq = a.square()
    c = a.shape[1]
    window = torch.stack([sq[:, max(0, i - 2) : min(c, i + 3)].sum(1) for i in range(c)], 1)
    torch.testing.assert_close(lrn(a), a / (2.0 + 1e-4 * window) ** 0.75, rtol=1e-12, atol=1e-12)


def test_switchable_run_records_its_learned_mix() -> None:
    rec = train_run(DigitsRunConfig(norm="switchable", batch_size=8, seed=0, **SMALL))
    weights = rec.result.switch_weights
    assert len(weights) == 2  # one per SwitchableNorm2d layer
    for layer in weights:
        for kind in ("mean", "var"):
            assert set(layer[kind]) == {"in", "ln", "bn"}
            assert math.isclose(sum(layer[kind].values()), 1.0, rel_tol=1e-9)
    assert any(abs(w - 1 / 3) > 1e-4 for layer in weights for w in layer["mean"].values())  # it learned
    again = record_from_json(rec.to_json())  # the record round-trips through JSON with its weights
    assert again.result.switch_weights == weights
