"""``chunked_loss=True`` under ``transformers.Trainer`` (``PatchNormsCallback``): 10 steps patched and unpatched.

Labels end in runs of ignored positions of different lengths, so the token counts differ between micro-batches and
gradient accumulation's ``num_items_in_batch`` (the Trainer's sum-then-divide) changes the loss: a model that
averaged per micro-batch instead would log other losses. Tolerances (fp32, chunks of 8 rows): the first step's loss is
bit-identical; the weights then drift apart by the gradients' rounding (the head-weight gradient summed chunk by
chunk; AdamW turns a near-zero gradient's rounding into a full step), so every later loss is within ``LOSS_REL``
(measured <= 1.1e-7).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import VOCAB, build
from torch import nn

import lnblocks.hf as H
import lnblocks.models.lm_head as L
from lnblocks.hf.chunked_loss import is_head

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LOSS_REL = 1e-6
SEQ, BATCH = 32, 4


@pytest.fixture(autouse=True)
def _chunked(monkeypatch):
    monkeypatch.setattr(L, "SINGLE_CHUNK_ELEMENTS", 0)  # chunk these tiny logits: 8 rows of a micro-batch's 128
    assert L.default_chunk_rows(BATCH * SEQ, VOCAB) == 8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(n: int = 80) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        ids = torch.randint(3, VOCAB, (SEQ,), generator=g)
        labels = ids.clone()
        labels[SEQ - (i * 7) % 23 :] = -100  # 0 to 22 ignored positions at the end
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _train(model: nn.Module, tmp_path, callbacks=(), accumulate: int = 1, checkpointing: bool = False) -> list[float]:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=10,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        learning_rate=3e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_data(), callbacks=list(callbacks))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _lora(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)  # the LoRA A matrices are drawn at random: the same draw for both runs
    return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize(
    ("family", "lora", "accumulate", "checkpointing"),
    [
        ("llama", False, 1, False),
        ("gemma2", False, 2, False),
        ("qwen3", True, 2, False),
        ("llama", True, 1, True),
    ],
    ids=["full", "softcap-accumulated", "lora-accumulated", "lora-checkpointed"],
)
def test_trainer_steps_give_the_same_losses(tmp_path, family: str, lora: bool, accumulate: int, checkpointing: bool):
    base = build(family, **({"final_logit_softcapping": 2.0} if family == "gemma2" else {}))
    plain, patched = copy.deepcopy(base), copy.deepcopy(base)
    if lora:
        plain, patched = _lora(plain), _lora(patched)
    callback = H.PatchNormsCallback(backend="torch", chunked_loss=True)
    options = {"accumulate": accumulate, "checkpointing": checkpointing}
    start = {n: p.detach().clone() for n, p in patched.named_parameters()}
    expected = _train(plain, tmp_path / "plain", **options)
    losses = _train(patched, tmp_path / "patched", [callback], **options)
    assert len(losses) == 10 and losses[0] == expected[0]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, expected, strict=True))
    assert worst <= LOSS_REL, (losses, expected)
    moved = max((p - start[n]).abs().max().item() for n, p in patched.named_parameters())
    assert moved > 1e-3  # it trained
    report = callback.report
    assert report.loss.status == "patched" and report.loss.name == ("base_model.model" if lora else "")
    head = patched.get_output_embeddings()
    assert is_head(head) and head.weight.requires_grad is not lora  # LoRA: the head frozen
