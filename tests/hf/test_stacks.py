"""The training stacks: ``transformers.Trainer`` (with ``PatchNormsCallback``), PEFT LoRA, the one-line loader.

Reference: the same training run unpatched. With backend "torch", 10 Trainer steps give identical losses and
identical weights, with and without LoRA, with the residual add fused and gradient checkpointing on; unpatching
after training restores the original classes' behaviour. Bad input leaves the model exactly as it was.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_state import snapshot
from hf_tiny import VOCAB, build, tiny_config
from test_patch_api import Other
from torch import nn

import lnblocks.hf as H
from lnblocks.hf import is_patched, patch_norms, unpatch_norms
from lnblocks.hf.record import is_fused

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is fastest, and avoids oversubscription on a shared machine (10x slower there)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(n: int = 40, seq: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, VOCAB, (seq,), generator=g) for _ in range(n)]
    return [{"input_ids": ids, "labels": ids} for ids in rows]


def _train(model: nn.Module, tmp_path, callbacks=(), checkpointing: bool = False) -> list[float]:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=10,
        per_device_train_batch_size=4,
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
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["norm"])
    return peft.get_peft_model(model, config)


@pytest.mark.parametrize(
    ("lora", "fuse", "checkpointing"),
    [(False, False, False), (True, False, False), (True, True, True)],
    ids=["full", "lora", "lora-fused-checkpointed"],
)
def test_trainer_patched_gives_the_same_losses_and_weights(tmp_path, lora: bool, fuse: bool, checkpointing: bool):
    base = build("llama")
    plain, patched = copy.deepcopy(base), copy.deepcopy(base)
    if lora:
        plain, patched = _lora(plain), _lora(patched)
    callback = H.PatchNormsCallback(backend="torch", fuse_residual=fuse)
    expected = _train(plain, tmp_path / "plain", checkpointing=checkpointing)
    losses = _train(patched, tmp_path / "patched", [callback], checkpointing=checkpointing)
    assert len(losses) == 10 and losses == expected
    assert losses[-1] < losses[0]  # it trained
    for (name, p), q in zip(patched.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q), name
    report = callback.report
    assert len(report.patched) == (10 if lora else 5) and len(report.layers) == (2 if fuse else 0)
    if lora:  # the norms inside ModulesToSaveWrapper: the frozen original and the adapter's trained copy
        wrapper = patched.base_model.model.model.layers[0].input_layernorm
        assert is_patched(wrapper.original_module) and is_patched(wrapper.modules_to_save["default"])
        assert report.by_role()["pre_mlp"][0].endswith("layers.0.post_attention_layernorm.original_module")
        assert not any(is_patched(m) for n, m in patched.named_modules() if "lora_" in n)

    # unpatching after training restores the original classes' behaviour: the same numbers as the plain model
    assert unpatch_norms(patched) == len(report.patched)
    assert not any(is_patched(m) or is_fused(m) for m in patched.modules())
    ids = _data(2)[0]["input_ids"][None]
    with torch.no_grad():
        assert torch.equal(patched.eval()(input_ids=ids).logits, plain.eval()(input_ids=ids).logits)


def test_callback_unpatch_at_end_and_options_checked_when_built(tmp_path):
    model = build("llama")
    callback = H.PatchNormsCallback(backend="torch", unpatch_at_end=True)
    assert isinstance(callback, transformers.TrainerCallback)
    _train(model, tmp_path, [callback])
    assert len(callback.report.patched) == 5 and not any(is_patched(m) for m in model.modules())
    with pytest.raises(ValueError, match="backend must be one of"):
        H.PatchNormsCallback(backend="cuda")
    with pytest.raises(TypeError, match="fuse_residual"):
        H.PatchNormsCallback(fuse_residual="yes")


def test_from_pretrained_loads_and_patches_in_one_call(tmp_path):
    source = build("gemma2").eval()
    source.save_pretrained(tmp_path)
    ids = torch.randint(3, VOCAB, (2, 12))
    with torch.no_grad():
        expected = source(input_ids=ids).logits
    model = H.from_pretrained(tmp_path, backend="torch", fuse_residual=True, attn_implementation="eager")
    assert type(model).__name__ == "Gemma2ForCausalLM" and is_fused(model.model.layers[0])
    assert all(is_patched(m) for n, m in model.named_modules() if n.endswith("norm"))
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, expected)
    report = patch_norms(model, backend="torch", fuse_residual=True)  # same options: the report again
    assert len(report.patched) == 9 and len(report.layers) == 2
    model = H.from_pretrained(tmp_path, model_class=transformers.Gemma2Model, exclude="final")
    assert not is_patched(model.norm) and is_patched(model.layers[0].input_layernorm)
    with pytest.raises(TypeError, match="model_class must be a transformers model class"):
        H.from_pretrained(tmp_path, model_class=nn.Linear)


class _NoNorm(transformers.PreTrainedModel):
    """A transformers model whose only norm-like module has a math lnblocks does not know."""

    config_class = transformers.LlamaConfig

    def __init__(self, config) -> None:
        super().__init__(config)
        self.q_proj = nn.Linear(8, 8)
        self.norm = Other.ScaleOnlyNorm()
        self.post_init()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.q_proj(x))


def test_a_peft_model_whose_base_has_no_recognised_norm_is_refused_unchanged(tmp_path):
    torch.manual_seed(0)
    model = peft.get_peft_model(_NoNorm(tiny_config("LlamaConfig")), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"PeftModel\(_NoNorm\) has no norm lnblocks can patch \(norm-like classes"):
        patch_norms(model)
    assert snapshot(model) == before
    with pytest.raises(ValueError, match=r"has no norm lnblocks can patch"):  # the Trainer integration too
        transformers.Trainer(
            model=model,
            args=transformers.TrainingArguments(str(tmp_path), report_to="none", use_cpu=True),
            callbacks=[H.PatchNormsCallback()],
        )
    assert snapshot(model) == before


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        (
            {"backend": "torch"},
            {"backend": "auto"},
            r"already patched with backend='torch' .*backend='auto' is refused",
        ),
        ({}, {"fuse_residual": True}, r"already patched with fuse_residual=False .*fuse_residual=True is refused"),
        ({"fuse_residual": True}, {}, r"already patched with fuse_residual=True .*fuse_residual=False is refused"),
    ],
    ids=["backend", "fuse-after-plain", "plain-after-fuse"],
)
def test_patching_twice_with_other_options_is_refused_unchanged(first: dict, second: dict, message: str):
    model = _lora(build("qwen3"))
    patch_norms(model, **first)
    before = snapshot(model)
    with pytest.raises(ValueError, match=message + r": unpatch_norms\(model\) first"):
        patch_norms(model, **second)
    assert snapshot(model) == before
    assert patch_norms(model, **first).patched  # the same options: fine
    assert snapshot(model) == before


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ("gpt2", r"GPT2Block \(2 layers, e\.g\. transformer\.h\.0\): its forward has no residual add followed by"),
        ("bert", r"BertForMaskedLM has no decoder layer lnblocks can fuse"),
        ("t5", r"T5LayerSelfAttention .*no residual add followed by a module call"),
    ],
)
def test_fuse_residual_on_a_family_without_support_is_refused_unchanged(family: str, message: str):
    model = build(family)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"fuse_residual=True: .*" + message):
        patch_norms(model, fuse_residual=True)
    assert snapshot(model) == before
    with pytest.raises(TypeError, match="fuse_residual"):
        patch_norms(model, fuse_residual=1)
    assert snapshot(model) == before
