"""``chunked_loss=True`` (``lnblocks.hf.chunked_loss``) against the same HF model unpatched.

Every model here is patched with ``backend="torch"`` and its tiny logits are cut in chunks of 8 rows
(``SINGLE_CHUNK_ELEMENTS = 0``; 2 x 64 positions). Tolerances (fp32): the loss is bit-identical (each row's
log-softmax is computed alone, and one ``nll_loss`` sums the rows in the order ``F.cross_entropy`` does), with and
without ``num_items_in_batch``; the returned logits are bit-identical to the unpatched model's with
``logits_to_keep=1`` (what generation computes); every gradient within ``GRAD_REL`` of its parameter's largest
entry (the head-weight gradient is summed chunk by chunk, in another order; measured <= 8e-7).
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from hf_state import snapshot
from hf_tiny import VOCAB, build, tiny_model
from torch import nn

import lnblocks.models.lm_head as L
from lnblocks.hf import patch_norms, patched_norms, unpatch_norms
from lnblocks.hf.chunked_loss import HeadForward, LossForward, LossFunction, is_head
from lnblocks.hf.record import loss_record_of

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

GRAD_REL = 2e-6
B, T = 2, 64


@pytest.fixture(autouse=True)
def _chunked(monkeypatch):
    """Chunk even these tiny logits (8 rows a chunk), on one thread (fastest for tiny models, shared machine)."""
    monkeypatch.setattr(L, "SINGLE_CHUNK_ELEMENTS", 0)
    assert L.default_chunk_rows(B * T, VOCAB) == 8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# family -> a tiny model, and what the report says of its head (logit map, tied)
CASES = {
    "llama": (lambda: build("llama"), "none", False),
    "llama_tied": (lambda: build("llama", tie_word_embeddings=True), "none", True),
    "qwen3": (lambda: build("qwen3"), "none", False),
    "gemma2": (lambda: build("gemma2", final_logit_softcapping=2.0), "softcap(config.final_logit_softcapping)", True),
    "cohere": (lambda: tiny_model("CohereConfig", "CohereForCausalLM", logit_scale=0.3), "mul(logit_scale)", True),
    "granite": (
        lambda: tiny_model("GraniteConfig", "GraniteForCausalLM", logits_scaling=3.0),
        "div(config.logits_scaling)",
        False,
    ),
}


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :9] = -100  # ignored positions
    labels[1, -3:] = -100
    return ids, labels


def _grad_err(model: nn.Module, reference: nn.Module) -> float:
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, name
            continue
        worst = max(worst, ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)).item())
    return worst


@pytest.mark.parametrize("family", CASES)
def test_loss_bit_identical_and_gradients_close(family: str):
    build_model, logit_map, tied = CASES[family]
    torch.manual_seed(0)
    plain = build_model()
    model = copy.deepcopy(plain)
    report = patch_norms(model, backend="torch", chunked_loss=True)
    assert (report.loss.status, report.loss.logit_map, report.loss.tied) == ("patched", logit_map, tied)
    ids, labels = _batch()
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(150)}):  # the mean, the Trainer's sum-then-divide
        plain.zero_grad(), model.zero_grad()
        want, got = plain(input_ids=ids, labels=labels, **kwargs), model(input_ids=ids, labels=labels, **kwargs)
        assert torch.equal(got.loss, want.loss), (kwargs, got.loss.item(), want.loss.item())
        want.loss.backward(), got.loss.backward()
        assert _grad_err(model, plain) <= GRAD_REL, kwargs
        with torch.no_grad():  # the logits it returns: the last position's, as generation computes them
            assert torch.equal(got.logits, plain(input_ids=ids, logits_to_keep=1).logits)


def test_without_labels_everything_is_as_before_and_generation_is_unchanged():
    """The full logits, ``generate`` and a direct ``loss_function`` call are the unpatched model's."""
    plain = build("gemma2", final_logit_softcapping=2.0).eval()
    model = copy.deepcopy(plain)
    patch_norms(model, backend="torch", chunked_loss=True)
    ids, labels = _batch()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)  # (B, T, V), the same bits
        assert model(input_ids=ids).logits.shape == (B, T, VOCAB)
        logits = plain(input_ids=ids).logits
        direct = model.loss_function(logits, labels, VOCAB)  # called outside a forward: ForCausalLMLoss itself
        assert torch.equal(direct, plain.loss_function(logits, labels, VOCAB))
        kw = {"max_new_tokens": 4, "do_sample": False}
        assert torch.equal(model.generate(ids[:, :8], **kw), plain.generate(ids[:, :8], **kw))
        # in evaluation (no gradients) the loss is chunked too, also in a pickled copy
        want = plain(input_ids=ids, labels=labels).loss
        assert torch.equal(model(input_ids=ids, labels=labels).loss, want)
        clone = pickle.loads(pickle.dumps(model))
        assert is_head(clone.lm_head) and torch.equal(clone(input_ids=ids, labels=labels).loss, want)


def test_loss_keywords_and_positional_labels_follow_the_model():
    plain = build("qwen3")
    model = copy.deepcopy(plain)
    patch_norms(model, backend="torch", chunked_loss=True)
    ids, labels = _batch()
    shifted, sevens = torch.roll(labels, -1, dims=1), labels.where(labels != -100, 7)  # 7: the ignored class
    cases = [
        (sevens, {"ignore_index": 7}),
        (labels, {"shift_labels": shifted}),
        (labels, {"shift_labels": shifted, "num_items_in_batch": 99}),
    ]
    for given, kwargs in cases:
        want, got = plain(input_ids=ids, labels=given, **kwargs), model(input_ids=ids, labels=given, **kwargs)
        assert torch.equal(got.loss, want.loss), kwargs
    at = list(inspect.signature(type(model).forward).parameters).index("labels") - 1  # without self
    positional = [ids, *[None] * (at - 1), labels]  # labels passed by position
    assert torch.equal(model(*positional).loss, plain(input_ids=ids, labels=labels).loss)


def test_unpatch_restores_forward_loss_function_and_head_exactly():
    model = CASES["cohere"][0]()
    before = snapshot(model)
    report = patch_norms(model, backend="torch", chunked_loss=True)
    assert isinstance(model.__dict__["forward"], LossForward) and isinstance(model.loss_function, LossFunction)
    assert isinstance(model.lm_head.forward, HeadForward) and loss_record_of(model).head == "lm_head"
    assert "chunked_loss=True): <model>.lm_head  [CohereForCausalLM]  logit map mul(logit_scale), tied" in str(report)
    assert report.to_dict()["loss"]["logit_map"] == "mul(logit_scale)"
    assert unpatch_norms(model) == len(report.patched)
    assert snapshot(model) == before
    assert model.loss_function.__qualname__ == "ForCausalLMLoss"
    with patched_norms(model, backend="torch", chunked_loss=True):
        assert loss_record_of(model) is not None
    assert snapshot(model) == before


def test_copies_and_a_trained_head_copy_in_peft_modules_to_save():
    """A deep copy carries its own chunked loss; a PEFT ``ModulesToSaveWrapper`` around the head (the head trained
    next to LoRA adapters) gets it in both of its copies."""
    plain = peft.get_peft_model(
        build("llama"), peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])
    )
    model = copy.deepcopy(plain)
    report = patch_norms(model, backend="torch", chunked_loss=True)
    wrapper = model.base_model.model.lm_head
    assert report.loss.name == "base_model.model" and is_head(wrapper.original_module)
    assert is_head(wrapper.modules_to_save["default"])
    twin = copy.deepcopy(model)
    ids, labels = _batch()
    for candidate in (model, twin):
        plain.zero_grad(), candidate.zero_grad()
        want, got = plain(input_ids=ids, labels=labels), candidate(input_ids=ids, labels=labels)
        assert torch.equal(got.loss, want.loss)
        want.loss.backward(), got.loss.backward()
        assert _grad_err(candidate, plain) <= GRAD_REL
    assert twin.base_model.model.lm_head.modules_to_save["default"].weight.grad is not None
    unpatch_norms(twin)
    assert not any(is_head(m) for m in twin.modules()) and is_head(wrapper.original_module)


class _MappedLlama(transformers.LlamaForCausalLM):
    """A causal LM whose forward adds a bias to the logits: a logit map lnblocks does not know."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        hidden_states = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        logits = self.lm_head(hidden_states)
        logits = logits + 1.0
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
        return transformers.modeling_outputs.CausalLMOutputWithPast(loss=loss, logits=logits)


def _custom_loss(model: nn.Module) -> nn.Module:
    model.loss_function = lambda logits, labels, vocab_size, **kwargs: logits.float().logsumexp(-1).mean()
    return model


REFUSED = {
    "bias": (lambda: tiny_model("PhiConfig", "PhiForCausalLM"), r"PhiForCausalLM: its lm_head has a bias"),
    "two_layer_head": (
        lambda: tiny_model("BertConfig", "BertLMHeadModel", is_decoder=True),
        r"BertLMHeadModel: its output embedding cls\.predictions\.decoder \(Linear\) is not a direct submodule",
    ),
    "own_cross_entropy": (
        lambda: tiny_model("BartConfig", "BartForCausalLM"),
        r"BartForCausalLM: its loss is not computed by self\.loss_function \(it runs `labels = labels\.to",
    ),
    "other_loss_function": (
        lambda: _custom_loss(build("llama")),
        r"LlamaForCausalLM: its loss_function is _custom_loss\.<locals>\.<lambda>, not",
    ),
    "unknown_logit_map": (
        lambda: _MappedLlama(build("llama").config),
        r"_MappedLlama: its logits go through `logits = logits \+ 1\.0` before the loss, which the chunked loss",
    ),
    "lora_on_the_head": (
        lambda: peft.get_peft_model(build("llama"), peft.LoraConfig(r=2, target_modules=["q_proj", "lm_head"])),
        r"PeftModel\(LlamaForCausalLM\): its lm_head is a peft\.tuners\.lora\.layer\.Linear, not a torch\.nn\.Linear",
    ),
    "no_head": (lambda: build("llama").model, r"LlamaModel: no transformers model with an LM head"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_model_whose_head_or_loss_it_does_not_reproduce_is_refused_unchanged(case: str):
    build_model, message = REFUSED[case]
    torch.manual_seed(0)
    model = build_model()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"chunked_loss=True: " + message):
        patch_norms(model, backend="torch", chunked_loss=True)
    assert snapshot(model) == before


def test_patching_again_with_chunked_loss_changed_is_refused_and_bad_labels_raise():
    model = build("llama")
    patch_norms(model, backend="torch")
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"already patched with chunked_loss=False .*chunked_loss=True is refused"):
        patch_norms(model, backend="torch", chunked_loss=True)
    assert snapshot(model) == before
    unpatch_norms(model)
    patch_norms(model, backend="torch", chunked_loss=True)
    assert patch_norms(model, backend="torch", chunked_loss=True).loss.status == "patched"  # the same: fine
    with pytest.raises(ValueError, match=r"already patched with chunked_loss=True .*chunked_loss=False is refused"):
        patch_norms(model, backend="torch")
    with pytest.raises(TypeError, match="chunked_loss"):
        patch_norms(model, chunked_loss="yes")
    ids, labels = _batch()
    with pytest.raises(ValueError, match=r"labels of shape \(2, 63\) do not match the \(2, 64\) positions"):
        model(input_ids=ids, labels=labels[:, 1:])
    with pytest.raises(ValueError, match=r"labels: class ids must be in \[0, vocab_size=96\) or -100"):
        model(input_ids=ids, labels=labels + VOCAB)


def test_loader_and_the_global_hook_with_an_accelerate_offloaded_model(tmp_path):
    """``from_pretrained(chunked_loss=True)`` on a model dispatched by accelerate (device hooks on the model and its
    head, a layer offloaded to disk), and ``patch_transformers(chunked_loss=True)``, which meets sub-models too."""
    pytest.importorskip("accelerate")
    import lnblocks.hf as H

    source = build("llama")
    source.save_pretrained(tmp_path / "model")
    ids, labels = _batch()
    want = source(input_ids=ids, labels=labels).loss
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map |= {"model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    options = {"device_map": device_map, "offload_folder": tmp_path / "offload", "attn_implementation": "eager"}
    model = H.from_pretrained(tmp_path / "model", backend="torch", chunked_loss=True, **options)
    assert hasattr(model, "_hf_hook") and hasattr(model.lm_head, "_hf_hook") and is_head(model.lm_head)
    assert torch.equal(model(input_ids=ids, labels=labels).loss, want)
    unpatch_norms(model)
    assert not is_head(model.lm_head) and hasattr(model.lm_head, "_hf_hook")
    with H.patch_transformers(backend="torch", chunked_loss=True):
        built = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "model", attn_implementation="eager")
        decoder = transformers.LlamaModel(source.config)  # no head: its norms patched, nothing else
    assert loss_record_of(built) is not None and loss_record_of(decoder) is None
    assert torch.equal(built(input_ids=ids, labels=labels).loss, want)
