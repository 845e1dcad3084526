"""``fuse_residual=True``: the add before a norm inside HF decoder layers runs as ``norm(x, residual=r)``.

Reference: the unpatched HF model. With backend "torch" the fused layers are bit-identical in fp32 and bf16 (logits,
every parameter's grad), the fused call really runs (the lnblocks norm's residual route), and unpatching restores
the original classes. Layers whose code is not the verified pattern are refused, naming their class.
"""

from __future__ import annotations

import copy
import functools
import pickle
import types
from pathlib import Path

import pytest
import torch
from hf_state import snapshot
from hf_tiny import FAMILIES, build, inputs, tiny_model
from torch import nn

from lnblocks.hf import is_patched, patch_norms, patched_norms, unpatch_norms
from lnblocks.hf.record import is_fused, record_of

transformers = pytest.importorskip("transformers")

# family -> the norms whose adds each layer fuses: the add before a pre-norm (the other add meets the next layer's
# norm outside), and the add after a post-norm (norm, then add: OLMo 2, Gemma 2/3's post-feedforward norm)
FUSED = {
    **{f: ("post_attention_layernorm",) for f in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma")},
    **{f: ("post_attention_layernorm",) for f in ("llama4", "nemotron", "qwen3_next", "granitemoehybrid")},
    **{f: ("pre_ff_layernorm",) for f in ("bamba", "jamba", "falcon_h1")},
    "gemma2": ("pre_feedforward_layernorm", "post_feedforward_layernorm"),  # sandwich: the post-attention add is
    "gemma3": ("pre_feedforward_layernorm", "post_feedforward_layernorm"),  # the pre-feedforward norm's already
    "olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"),  # x + norm(f(x)): norm, then add
}
THEN_ADD = {"post_feedforward_layernorm"} | {"olmo2:post_attention_layernorm"}


def _spy_norm_then_add(norm) -> list[int]:
    """Count the calls of an lnblocks norm's ``norm_then_add`` (the fused post-norm path)."""
    calls: list[int] = []
    method = norm.norm_then_add
    norm.norm_then_add = lambda *args, **kwargs: (calls.append(1), method(*args, **kwargs))[1]
    return calls


def _run(model: nn.Module, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", list(FUSED))
def test_fused_layers_are_bit_identical_logits_and_grads(family: str, dtype: torch.dtype) -> None:
    reference = build(family, dtype).train()
    model = copy.deepcopy(reference)
    report = patch_norms(model, backend="torch", fuse_residual=True)
    assert [(e.name, e.norms) for e in report.layers] == [(f"model.layers.{i}", FUSED[family]) for i in (0, 1)]
    spies = {}
    for name in FUSED[family]:
        if name in THEN_ADD or f"{family}:{name}" in THEN_ADD:
            spies[name] = _spy_norm_then_add(record_of(getattr(model.model.layers[0], name)).norm)
    batch = inputs(model)
    logits, grads = _run(model, batch)
    ref_logits, ref_grads = _run(reference, batch)
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))
    for name in FUSED[family]:
        norm = record_of(getattr(model.model.layers[0], name)).norm
        if name in spies:
            assert spies[name] == [1]  # norm, then add: the one norm_then_add call ran
        else:
            assert (dtype, dtype) in norm._routes.cpu  # the norm was called with residual=: the fused path ran
    layer_cls = type(reference.model.layers[0])
    assert type(model.model.layers[0]).__name__ == layer_cls.__name__ and isinstance(model.model.layers[0], layer_cls)

    assert unpatch_norms(model) == len(report.patched)
    assert type(model.model.layers[0]) is layer_cls and not any(is_patched(m) for m in model.modules())
    assert torch.equal(_run(model, batch)[0], ref_logits)


def test_a_hook_on_a_post_norm_runs_the_original_statements() -> None:
    """OLMo 2's ``residual + norm(x)``: with a forward hook on the norm it sees the norm's plain output, unfused."""
    reference = build("olmo2").eval()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="torch", fuse_residual=True)
    norm = model.model.layers[0].post_attention_layernorm
    calls = _spy_norm_then_add(record_of(norm).norm)
    handles = [
        m.model.layers[0].post_attention_layernorm.register_forward_hook(_halve_output) for m in (model, reference)
    ]
    batch = {"input_ids": inputs(model)["input_ids"]}
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference(**batch).logits)
    assert calls == []
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference(**batch).logits)
    assert calls == [1]


def test_gradient_checkpointing_recomputes_the_fused_layers() -> None:
    reference = build("llama").train()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="torch", fuse_residual=True)
    for m in (model, reference):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls: list[int] = []
    model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    batch = inputs(model)
    logits, grads = _run(model, batch)
    ref_logits, ref_grads = _run(reference, batch)
    assert len(calls) == 2  # forward, and again in the backward: the checkpoint wrapper wraps the fused forward
    assert torch.equal(logits, ref_logits) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_deepcopy_pickle_and_compile_keep_the_fusion() -> None:
    reference = build("qwen3").eval()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="torch", fuse_residual=True)
    batch = {"input_ids": inputs(model)["input_ids"]}
    with torch.no_grad():
        expected = reference(**batch).logits
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert is_fused(clone.model.layers[1]) and torch.equal(clone(**batch).logits, expected)
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        assert torch.equal(compiled(**batch).logits, expected)


def test_patched_norms_context_unfuses_on_exit() -> None:
    model = build("gemma2").eval()
    layer_cls = type(model.model.layers[0])
    with patched_norms(model, backend="torch", fuse_residual=True) as report:
        assert len(report.layers) == 2 and is_fused(model.model.layers[0])
        assert "before pre_feedforward_layernorm" in str(report)
    assert type(model.model.layers[0]) is layer_cls and not any(is_patched(m) for m in model.modules())


def test_accelerate_offloaded_model_fuses_and_unfuses(tmp_path) -> None:
    """A model dispatched by accelerate (device_map with disk offload): hooks on layers and norms, weights on meta
    until each forward. Fused and unfused it gives the reference numbers, and the hooks stay."""
    pytest.importorskip("accelerate")
    source = build("llama").eval()
    source.save_pretrained(tmp_path / "model")
    batch = {"input_ids": inputs(source)["input_ids"]}
    with torch.no_grad():
        expected = source(**batch).logits
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map |= {"model.layers.1": "disk", "model.norm": "disk", "lm_head": "cpu"}
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "model", device_map=device_map, offload_folder=tmp_path / "offload", attn_implementation="eager"
    ).eval()
    layer = model.model.layers[1]
    assert hasattr(layer, "_hf_hook") and layer.post_attention_layernorm.weight.device.type == "meta"
    base = type(layer)
    patch_norms(model, backend="torch", fuse_residual=True)
    assert layer._old_forward.__func__ is type(layer).forward  # the hook calls the fused forward
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)
    assert (torch.float32, torch.float32) in record_of(layer.post_attention_layernorm).norm._routes.cpu
    unpatch_norms(model)
    assert type(layer) is base and layer._old_forward.__func__ is base.forward and hasattr(layer, "_hf_hook")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)


class _EditedLayer(nn.Module):
    """A Llama-shaped layer whose forward is built at run time: its source does not match the code it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)


_namespace: dict = {}
exec(  # the same statements as the verified pattern, but no source file backs them
    "def forward(self, x):\n    r = x\n    x = r + self.proj(x)\n    r = x\n    x = self.norm(x)\n    return x + r\n",
    _namespace,
)
_EditedLayer.forward = _namespace["forward"]


class _Good(nn.Module):
    """The verified pattern in a layer of no known family: it fuses too (the rewrite needs no family)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x
        x = r + self.proj(x)
        r = x
        x = self.norm(x)
        return x + r


class _Mismatch(_Good):
    """Its forward points at _Good's source but runs other code (as when a file is edited after the import)."""


class _Wrapped(_Good):
    """A verified forward under a wrapper that is not transformers' gradient checkpointing."""


def _other_code(self, x):
    return self.norm(x)


_Mismatch.forward = types.FunctionType(
    _other_code.__code__.replace(co_name="forward", co_firstlineno=_Good.forward.__code__.co_firstlineno), globals()
)
_Wrapped.forward = functools.wraps(_Good.forward)(lambda self, x: _Good.forward(self, x))


class _Stack(nn.Module):
    def __init__(self, layer_cls: type) -> None:
        super().__init__()
        self.layers = nn.ModuleList([layer_cls(), layer_cls()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize(
    ("layer_cls", "reason"),
    [
        (_EditedLayer, r"_EditedLayer \(2 layers, e\.g\. layers\.0\): the source of its forward cannot be read"),
        (_Mismatch, r"_Mismatch \(2 layers.*its source does not match the code it runs"),
        (_Wrapped, r"_Wrapped \(2 layers.*wrapped by something other than transformers' gradient checkpointing"),
    ],
    ids=["no-source", "edited-source", "unknown-wrapper"],
)
def test_layers_that_are_not_the_verified_code_are_refused(layer_cls: type, reason: str) -> None:
    model = _Stack(layer_cls)
    before = snapshot(model)
    with pytest.raises(ValueError, match=reason):
        patch_norms(model, fuse_residual=True)
    assert snapshot(model) == before


def test_any_layer_with_the_pattern_fuses_exactly_and_an_excluded_norm_is_named() -> None:
    reference = _Stack(_Good)
    model = copy.deepcopy(reference)
    x = torch.randn(2, 5, 8)
    report = patch_norms(model, backend="torch", fuse_residual=True)
    assert [e.norms for e in report.layers] == [("norm",), ("norm",)]
    assert torch.equal(model(x), reference(x))
    model = copy.deepcopy(reference)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"_Good .*\(self\.norm\) is no norm patched by this call"):
        patch_norms(model, exclude="layers.*.norm", fuse_residual=True)
    assert snapshot(model) == before


def test_unpatched_norm_inside_a_fused_layer_falls_back_to_the_original_statements() -> None:
    reference = build("llama").eval()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="torch", fuse_residual=True)
    unpatch_norms(model.model.layers[0].post_attention_layernorm)  # one norm restored by hand, its layer still fused
    assert is_fused(model.model.layers[0])
    batch = {"input_ids": inputs(model)["input_ids"]}
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference(**batch).logits)


def test_traffic_table_counts_one_activation_read_forward_and_two_backward_per_fused_add() -> None:
    from benchmarks.kernels.traffic import Operands, min_bytes, unfused_residual_bytes

    n, m = 4096, 1000
    op = Operands(n, 2, 2, 2, 0, 2, False, False)  # bf16 RMSNorm with a residual
    assert unfused_residual_bytes("fwd", m, op) - min_bytes("fwd", m, op) == m * n * 2  # the norm re-reads x + r
    assert unfused_residual_bytes("bwd", m, op) - min_bytes("bwd", m, op) == 2 * m * n * 2  # the grads' sum


def _scale_input(module: nn.Module, args: tuple) -> tuple:
    return (args[0] * 2.0,)


def _halve_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output * 0.5  # a tuple here would raise: the hook must see the norm's plain output


@pytest.mark.parametrize("where", ["pre-hook", "forward-hook", "global-pre-hook"])
def test_hooks_on_a_fused_norm_see_its_true_input_and_output(where: str) -> None:
    """A hook on a norm whose add is fused (or a global hook) sees what it sees unpatched: the norm's input ``a + b``
    and its plain output, and what it returns is used; that call runs the layer's original statements."""
    reference = build("llama").eval()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="torch", fuse_residual=True)
    seen: dict[int, list[torch.Tensor]] = {id(reference): [], id(model): []}
    handles = []
    for m in (reference, model):
        norm = m.model.layers[0].post_attention_layernorm
        record = functools.partial(lambda store, mod, args: store.append(args[0].clone()), seen[id(m)])
        if where == "pre-hook":
            handles += [norm.register_forward_pre_hook(record), norm.register_forward_pre_hook(_scale_input)]
        elif where == "forward-hook":
            handles += [norm.register_forward_pre_hook(record), norm.register_forward_hook(_halve_output)]
    if where == "global-pre-hook":
        targets = {id(m.model.layers[0].post_attention_layernorm): seen[id(m)] for m in (reference, model)}

        def record_global(mod: nn.Module, args: tuple) -> None:
            if id(mod) in targets:
                targets[id(mod)].append(args[0].clone())

        handles.append(torch.nn.modules.module.register_module_forward_pre_hook(record_global))
    batch = {"input_ids": inputs(model)["input_ids"]}
    try:
        with torch.no_grad():
            expected, logits = reference(**batch).logits, model(**batch).logits
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(logits, expected)
    assert len(seen[id(model)]) == 1 and torch.equal(seen[id(model)][0], seen[id(reference)][0])
    with torch.no_grad():  # without hooks the add is fused again
        assert torch.equal(model(**batch).logits, reference(**batch).logits)
    norm = record_of(model.model.layers[0].post_attention_layernorm).norm
    assert (torch.float32, torch.float32) in norm._routes.cpu


# tiny model -> the name docs/hf-training.md's fusion table gives its family
_DOCS_NAMES = {
    **{name: name.capitalize() for name in ("llama", "mistral", "gemma", "gemma2", "gemma3")},
    **{"qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3", "olmo2": "OLMo2", "gpt2": "GPT-2", "gpt_neox": "GPT-NeoX"},
    **{"bert": "BERT", "roberta": "RoBERTa", "opt_pre": "OPT", "opt_post": "OPT", "t5": "T5"},
    **{"falcon": "Falcon", "falcon_sequential": "Falcon", "falcon_new_arch": "Falcon"},
    **{"llama4": "Llama4", "nemotron": "Nemotron", "qwen3_next": "Qwen3-Next", "granitemoehybrid": "GraniteMoeHybrid"},
    **{"bamba": "Bamba", "jamba": "Jamba", "falcon_h1": "FalconH1", "cohere_qk": "Cohere"},
    **{"mamba2": "Mamba2", "nemotron_h": "NemotronH", "zamba2": "Zamba2"},
}
_MORE = {"olmo": ("OlmoConfig", "OlmoForCausalLM"), "cohere": ("CohereConfig", "CohereForCausalLM")}
_MORE["cohere2"] = ("Cohere2Config", "Cohere2ForCausalLM")


def _docs_fusion_rows() -> dict[str, str]:
    """family name -> "fused" or "refused", from the table in docs/hf-training.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "hf-training.md").read_text()
    table = text[text.index("| family (decoder layer) |") :].split("\n\n")[0].splitlines()[2:]
    rows = {}
    for line in table:
        families, fused = line.split("|")[1:3]
        for name in families.split(","):
            rows[name.split("(")[0].strip()] = "refused" if "refused" in fused else "fused"
    return rows


def test_the_docs_fusion_table_puts_every_tiny_family_in_its_row() -> None:
    rows = _docs_fusion_rows()
    models = {name: functools.partial(build, name) for name in FAMILIES}
    models |= {name: functools.partial(tiny_model, *classes) for name, classes in _MORE.items()}
    for name, make in models.items():
        try:
            patch_norms(make(), backend="torch", fuse_residual=True)
            outcome = "fused"
        except ValueError:
            outcome = "refused"
        docs_name = _DOCS_NAMES.get(name) or {"olmo": "OLMo", "cohere": "Cohere", "cohere2": "Cohere2"}[name]
        assert rows.get(docs_name) == outcome, f"docs/hf-training.md: {docs_name} is {outcome}, the table says {rows}"


def test_post_norms_fused_on_the_triton_backend_match_the_model() -> None:
    """The kernel route of norm-then-add (Triton's interpreter here): OLMo 2 fused with backend="triton" gives the
    unpatched model's logits and grads within fp32 rounding, and the post-norms ran the fused kernel."""
    reference = build("olmo2").train()
    model = copy.deepcopy(reference)
    patch_norms(model, backend="triton", fuse_residual=True)
    calls = _spy_norm_then_add(record_of(model.model.layers[0].post_feedforward_layernorm).norm)
    batch = inputs(model, seq=6)
    logits, grads = _run(model, batch)
    ref_logits, ref_grads = _run(reference, batch)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert calls == [1]
    assert record_of(model.model.layers[0].post_feedforward_layernorm).norm.last_backend == "triton"
