"""configs/gpt2_small_prepost.yaml: the documented GPT-2 small study, and the same file shrunk on
the CPU through ``--set`` (tiny model, 2 steps, a token file made here), end to end with its TensorBoard curves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from lnblocks.study import load_study, read_record

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "gpt2_small_prepost.yaml"


def test_the_config_is_the_documented_study(gpt2_token_files: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"data\.train_path is not an existing file: '/path/to/openwebtext"):
        load_study(CONFIG)  # the shipped paths are placeholders the user points at their corpus
    study = load_study(CONFIG, overrides=gpt2_token_files)
    runs = study.runs()
    assert len(runs) == 12
    assert {r.label_dict["variant"] for r in runs} == {"pre", "post", "post_warmup"}
    assert sorted({r.train.lr for r in runs}) == [1.5e-4, 3.0e-4, 6.0e-4, 1.2e-3]
    for r in runs:
        m, d, t = r.model, r.data, r.train
        assert (m.depth, m.dim, m.n_heads, d.seq_len, d.source, d.vocab_size) == (12, 768, 12, 1024, "tokens", 50257)
        assert (t.dtype, t.compile, t.grad_accum, d.batch_size) == ("bf16", True, 4, 64)
        assert m.placement == ("pre" if r.label_dict["variant"] == "pre" else "post")
        assert t.warmup == (1000 if r.label_dict["variant"] == "post_warmup" else 0)
        assert t.grad_clip is None and m.attention["backend"] == "flash_attn" and m.norm["backend"] == "auto"
    assert study.resources.gpus_per_run == 1 and study.tracking.tensorboard
    # the header's count: N = 12 L d^2 + V d matmul parameters, 6 N + 12 L d T training FLOPs per token
    n = 12 * 12 * 768**2 + 50257 * 768
    assert round(n / 1e6, 1) == 123.5 and round((6 * n + 12 * 12 * 768 * 1024) / 1e6) == 854
    assert "854 MFLOP/token" in CONFIG.read_text() and "4.7 GPU-hours" in CONFIG.read_text()


SHRINK = [  # what a user types to smoke-test the study on a laptop
    "model.depth=2", "model.dim=32", "model.n_heads=2", "data.seq_len=32", "data.batch_size=8",
    "data.vocab_size=512", "data.eval_batches=1", "train.steps=2", "train.log_every=1", "train.lr=[6.0e-4]",
    "train.compile=false", "train.device=cpu", "diagnostics.every=1", "diagnostics.init_grad_batches=1",
    "diagnostics.probe_batch_size=2",
    # the warmup arm's 1000 steps do not fit in 2: the named axis is given again, shortened
    "variant={pre: {model.placement: pre}, post_warmup: {model.placement: post, train.warmup: 1}}",
]  # fmt: skip


def test_the_config_runs_shrunk_on_the_cpu(tmp_path: Path, gpt2_token_files: dict[str, str]) -> None:
    out = tmp_path / "out"
    sets = [f"{k}={v}" for k, v in gpt2_token_files.items()] + SHRINK
    assert cli_main(["study", "run", str(CONFIG), "--out", str(out), *[x for a in sets for x in ("--set", a)]]) == 0
    records = [read_record(p) for p in sorted((out / "runs").glob("*.json"))]
    assert sorted(r.labels["variant"] for r in records) == ["post_warmup", "pre"]
    for rec in records:
        assert rec.status == "finished" and rec.result.steps_done == 2
        assert rec.config["train"]["dtype"] == "bf16" and rec.config["train"]["grad_accum"] == 4
        assert rec.result.model["attention_backend"] == "sdpa" and rec.result.model["norm_backend"] == "torch"
        assert rec.result.reference["uniform"] == pytest.approx(math.log(512))
        assert list((out / "tensorboard" / rec.id).glob("events.out.tfevents.*"))  # tracking: on in the file
    assert (out / "report.md").is_file()
    with pytest.raises(ValueError, match=r"train\.warmup is set by the grid axis 'variant' in every run"):
        load_study(CONFIG, overrides={**gpt2_token_files, "train.warmup": 1})
