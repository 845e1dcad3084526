"""``memory_efficient`` chosen per model: ``GPTConfig`` / ``BlockConfig(memory_efficient=True)`` and
``patch_norms(model, memory_efficient=True)``. The norms' fused backward then saves their output instead of their
input, so each norm's input is freed: measured exactly with ``torch.autograd.graph.saved_tensors_hooks`` (the bytes
of every distinct storage autograd keeps, Parameters left out), one ``(tokens, width)`` activation per norm. The
forward is unchanged (bit-identical logits) and the gradients are within the kernels' tolerance of the default
backward (Triton's interpreter on CPU: what is saved is decided by the kernels' autograd function, not the device).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.models.bench_memory import saved_bytes
from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.hf import patch_norms

B, T, D = 2, 8, 32
NORM = {"kind": "rmsnorm", "eps": 1e-6, "backend": "triton"}


def _gpt(n_layers: int, memory_efficient: bool | None, norm: dict = NORM) -> GPT:
    torch.manual_seed(0)
    block = {"dim": D, "norm": norm, "attention": {"n_heads": 4}, "mlp": {"activation": "swiglu", "bias": False}}
    shape = {"vocab_size": 64, "max_seq_len": T, "n_layers": n_layers, "positions": "rope"}
    return GPT(GPTConfig(**shape, block=block, memory_efficient=memory_efficient)).train()


def test_the_option_reaches_every_norm_and_leaves_stored_configs_as_they_were() -> None:
    model = _gpt(2, True)
    assert all(b.norm.memory_efficient for b in model.config.layers)
    assert model.final_norm.spec.memory_efficient and model.blocks[1].mlp_in_norm.spec.memory_efficient
    assert "memory_efficient" not in GPTConfig().to_dict()  # unset: the stored form (run ids) does not change
    assert "memory_efficient" not in BlockConfig().to_dict()


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (lambda: BlockConfig(norm="dyt", memory_efficient=True), r"memory_efficient is True, but norm kind 'dyt'"),
        (
            lambda: BlockConfig(norm={"kind": "rmsnorm", "backend": "torch"}, memory_efficient=True),
            r"norm\.memory_efficient needs the fused kernels",
        ),
        (
            lambda: GPTConfig(block={"norm": {"kind": "layernorm", "memory_efficient": True}}, memory_efficient=False),
            r"block\.memory_efficient is False while norm\.memory_efficient is True",
        ),
    ],
    ids=["no-such-backward", "torch-backend", "contradiction"],
)
def test_combinations_it_cannot_honour_are_refused(config, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config()


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_gpt_frees_one_activation_per_norm(norm: str) -> None:
    """bf16 Pre-LN GPT: per layer (2 layers - 1 layer) two norms each free their (B*T, D) input; LayerNorm also its
    fp32 mean per row."""
    idx = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    spec = {**NORM, "kind": norm}
    per_layer = {}
    for me in (None, True):
        counts = []
        for n in (1, 2):
            model = _gpt(n, me, spec).to(torch.bfloat16)
            counts.append(saved_bytes(lambda m=model: m(idx, idx)[1], exclude=model))
        per_layer[me] = counts[1] - counts[0]
    mean = 4 * B * T if norm == "layernorm" else 0
    assert per_layer[None] - per_layer[True] == 2 * (B * T * D * 2 + mean)


def test_gpt_forward_unchanged_and_gradients_within_tolerance() -> None:
    idx = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    results = []
    for me in (None, True):
        model = _gpt(2, me)
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits.detach(), [p.grad for p in model.parameters()]))
    (logits_a, grads_a), (logits_b, grads_b) = results
    assert torch.equal(logits_a, logits_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _llama(dtype: torch.dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, attn_implementation="eager",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).to(dtype).train()  # norm weights at ones: invertible


def test_patch_norms_memory_efficient_frees_each_norms_input() -> None:
    """A bf16 HF Llama of 2 layers: its 5 norms (2 per layer and the final one) each free their input."""
    ids = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    counts = []
    for me in (False, True):
        model = _llama(torch.bfloat16)
        report = patch_norms(model, backend="triton", memory_efficient=me)
        assert len(report.patched) == 5
        counts.append(saved_bytes(lambda m=model: m(input_ids=ids, labels=ids).loss, exclude=model))
    assert counts[0] - counts[1] == 5 * B * T * D * 2


def test_patch_norms_memory_efficient_is_exact_forward_and_close_backward_and_refused_where_it_cannot() -> None:
    ids = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    results = []
    for me in (False, True):
        model = _llama(torch.float32)
        patch_norms(model, backend="triton", memory_efficient=me)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), [p.grad for p in model.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match=r"memory_efficient=True needs the fused kernels"):
        patch_norms(_llama(torch.float32), backend="torch", memory_efficient=True)
    with pytest.raises(ValueError, match=r"already patched with memory_efficient=True .* memory_efficient=False"):
        patch_norms(model, backend="triton")


def test_memory_efficient_reaches_the_norms_through_every_hf_entry_point(tmp_path) -> None:
    """``from_pretrained``, ``patch_transformers`` and ``PatchNormsCallback`` take ``memory_efficient`` as
    ``patch_norms`` does: through each, True frees the 5 norms' inputs that False keeps."""
    from lnblocks.hf import PatchNormsCallback, from_pretrained, patch_transformers

    ids = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    _llama(torch.bfloat16).save_pretrained(tmp_path)

    def loaded(me: bool) -> torch.nn.Module:
        kw = {"dtype": torch.bfloat16, "attn_implementation": "eager"}
        return from_pretrained(tmp_path, backend="triton", memory_efficient=me, **kw)

    def built(me: bool) -> torch.nn.Module:
        with patch_transformers(backend="triton", memory_efficient=me):
            return _llama(torch.bfloat16)

    def trained(me: bool) -> torch.nn.Module:
        model = _llama(torch.bfloat16)
        PatchNormsCallback(backend="triton", memory_efficient=me).on_init_end(None, None, None, model=model)
        return model

    for make in (loaded, built, trained):
        saved = []
        for me in (False, True):
            model = make(me).train()
            saved.append(saved_bytes(lambda m=model: m(input_ids=ids, labels=ids).loss, exclude=model))
        assert saved[0] - saved[1] == 5 * B * T * D * 2, make.__name__
    with pytest.raises(ValueError, match=r"memory_efficient=True needs the fused kernels"):
        PatchNormsCallback(backend="torch", memory_efficient=True)
