"""patch_norms / unpatch_norms / patched_norms: reversibility, idempotency, selection, the report, bad input."""

from __future__ import annotations

import copy
import functools
import gc
import pickle
import weakref

import pytest
import torch
from hf_tiny import build, inputs
from torch import nn

from lnblocks.hf import ROLES, is_patched, patch_norms, patched_norms, unpatch_norms
from lnblocks.hf.install import PatchedForward
from lnblocks.hf.record import record_of

pytest.importorskip("transformers")


def _logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _norms(model: nn.Module) -> list[nn.Module]:
    return [m for n, m in model.named_modules() if "norm" in n.lower() or n.endswith(("ln_1", "ln_2", "ln_f"))]


def test_unpatch_restores_the_class_forward_and_patching_twice_does_not_wrap_twice():
    model = build("gemma3").eval()
    first = patch_norms(model)
    forwards = {id(m): m.forward for m in _norms(model)}
    second = patch_norms(model)
    assert second.entries == first.entries  # the same report, nothing new
    for m in _norms(model):
        assert m.forward is forwards[id(m)]  # not re-wrapped
        assert isinstance(m.forward, PatchedForward) and m.forward.module() is m
    assert unpatch_norms(model) == 13
    assert not any("forward" in m.__dict__ or is_patched(m) for m in model.modules())
    assert unpatch_norms(model) == 0


def test_patched_norms_context_restores_only_what_it_patched():
    model = build("qwen3").eval()
    reference = copy.deepcopy(model)
    batch = inputs(model)
    patch_norms(model, include="final")
    with patched_norms(model) as report:
        assert len(report.patched) == 9 and all(is_patched(m) for m in _norms(model))
        assert torch.equal(_logits(model, batch), _logits(reference, batch))
    assert [n for n, m in model.named_modules() if is_patched(m)] == ["model.norm"]


def test_class_parameters_and_other_instances_are_untouched():
    model, other = build("llama"), build("llama")
    params = {n: p for n, p in model.named_parameters()}
    norm_cls = type(model.model.norm)
    class_forward = norm_cls.forward
    patch_norms(model)
    assert type(model.model.norm) is norm_cls and isinstance(model.model.norm, norm_cls)
    assert all(p is params[n] for n, p in model.named_parameters())
    assert {n for n, _ in model.named_modules()} == {n for n, _ in other.named_modules()}  # no new submodule
    assert not any(is_patched(m) for m in other.modules())  # per instance, not per class (Liger #834)
    assert norm_cls.forward is class_forward
    assert "lnblocks(backend='auto')" in repr(model.model.norm)  # extra_repr works (Liger #392)
    assert "lnblocks" not in repr(other.model.norm)


def test_patched_model_survives_dtype_moves_assign_loads_deepcopy_and_pickle():
    model = build("gemma2").eval()
    patch_norms(model)
    batch = inputs(model)
    unpatched = copy.deepcopy(model)
    unpatch_norms(unpatched)
    # .to(dtype) and load_state_dict(assign=True) put new tensors into the Parameter dicts the lnblocks norms share
    model.to(torch.bfloat16)
    unpatched.to(torch.bfloat16)
    assert torch.equal(_logits(model, batch), _logits(unpatched, batch))
    state = {k: v.float() * 1.01 for k, v in unpatched.state_dict().items()}
    model.load_state_dict(state, assign=True)
    unpatched.load_state_dict(state, assign=True)
    assert torch.equal(_logits(model, batch), _logits(unpatched, batch))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        norm = clone.model.layers[0].post_attention_layernorm
        assert is_patched(norm) and norm.forward.module() is norm  # bound to the copy, not the original
        assert torch.equal(_logits(clone, batch), _logits(unpatched, batch))


def test_include_and_exclude_by_role_and_by_name():
    report = patch_norms(build("qwen3"), exclude=["q_norm", "k_norm"])
    assert set(report.by_role()) == {"pre_attn", "pre_mlp", "final"}
    assert {e.reason for e in report.skipped} == {"excluded by 'q_norm'", "excluded by 'k_norm'"}
    model = build("qwen3")
    report = patch_norms(model, include="model.layers.0.*")
    assert len(report.patched) == 4 and all(e.name.startswith("model.layers.0.") for e in report.patched)
    assert {e.reason for e in report.skipped} == {"not selected by include"}
    # selection decides what gets patched now; it never silently unpatches what was patched before
    report = patch_norms(model, exclude="model.layers.0.*")
    assert len(report.patched) == 9 and is_patched(model.model.layers[0].self_attn.q_norm)
    assert [e.reason[:15] for e in report.patched if e.reason] == ["patched earlier"] * 4


def test_report_lists_roles_and_folds_layers():
    report = patch_norms(build("t5"))
    text = str(report)
    assert "12 patched" in text and "pre_cross_attn" in text and "rmsnorm(cast=t5, eps=1e-06)" in text
    assert "decoder.block.*.layer.*.layer_norm x2" in text
    assert report.to_dict()["model_type"] == "t5"
    assert set(report.by_role()) <= set(ROLES)


class Other(nn.Module):
    """A model of no known family: an nn.LayerNorm (generic), a norm-like class of unknown math, a GroupNorm."""

    class ScaleOnlyNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / x.abs().amax(-1, keepdim=True) * self.weight

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.odd = self.ScaleOnlyNorm()
        self.gn = nn.GroupNorm(2, 8)


def test_generic_models_and_unknown_norms_are_reported():
    report = patch_norms(Other())
    assert [(e.name, e.role, e.status) for e in report.entries] == [
        ("ln", "other", "patched"),
        ("odd", "other", "unknown"),
        ("gn", "other", "skipped"),
    ]
    assert report.model_type is None
    hooked = Other()
    hooked.ln.forward = lambda x: x  # someone else's instance-level forward: not overridden by us
    with pytest.warns(UserWarning, match="no norm of Other was patched"):
        (entry,) = [e for e in patch_norms(hooked).entries if e.name == "ln"]
    assert entry.status == "skipped" and "already replaced on the instance" in entry.reason
    assert not is_patched(hooked.ln)


def test_no_recognised_norm_gives_an_empty_report_and_a_warning():
    with pytest.warns(UserWarning, match="no norm of Sequential was patched"):
        report = patch_norms(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    assert report.entries == () and report.patched == []
    model = Other()
    del model.ln
    with pytest.warns(UserWarning, match="1 unknown norm-like"):
        assert patch_norms(model).patched == []


def test_triton_where_no_kernel_can_run_raises_and_suggests_auto(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors and no interpreter: no Triton kernel can run
    model = build("llama")
    with pytest.raises(ValueError, match=r"backend='triton' cannot run .*Use backend='auto'"):
        patch_norms(model, backend="triton")
    assert not any(is_patched(m) for m in model.modules())  # all or nothing
    with pytest.raises(ValueError, match=r"backend='triton' cannot run .*float64"):
        patch_norms(build("gpt2", torch.float64), backend="triton")


def test_bad_arguments():
    model = build("llama")
    with pytest.raises(ValueError, match="backend must be one of"):
        patch_norms(model, backend="cuda")
    with pytest.raises(ValueError, match="'attn_norm' is neither a role"):
        patch_norms(model, exclude=["attn_norm"])
    with pytest.raises(TypeError, match="include must be None, a role/pattern string or a list"):
        patch_norms(model, include=[3])
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        patch_norms("llama")
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        unpatch_norms(None)
    assert not any(is_patched(m) for m in model.modules())


def test_backend_change_needs_unpatch_and_triton_runs_when_a_kernel_can():
    from lnblocks.kernels import unavailable_reason

    model = build("llama").eval()
    reference = copy.deepcopy(model)
    patch_norms(model, backend="torch")
    norm = model.model.norm
    assert record_of(norm).norm.spec.backend == "torch"
    spec = record_of(norm).norm.spec
    if unavailable_reason(spec, torch.empty(1, 32)) is not None:
        pytest.skip("no Triton kernel can run here")
    with pytest.raises(ValueError, match=r"already patched with backend='torch' .* backend='triton' is refused"):
        patch_norms(model, backend="triton")
    assert record_of(norm).norm.spec.backend == "torch"  # unchanged
    unpatch_norms(model)
    patch_norms(model, backend="triton")
    assert record_of(norm).norm.spec.backend == "triton"
    batch = inputs(model)
    out, ref = _logits(model, batch), _logits(reference, batch)
    assert record_of(norm).norm.last_backend == "triton"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)  # fused kernel: fp32 rounding, not bit-identical


def _add_device_hook(module: nn.Module) -> list[int]:
    """accelerate's ``add_hook_to_module`` convention (accelerate is not installed here): ``_hf_hook`` set,
    ``_old_forward`` = the current forward, ``forward`` = a wrapper calling it. Returns the wrapper's call log."""
    calls: list[int] = []

    def new_forward(mod: nn.Module, *args, **kwargs):
        calls.append(1)
        return mod._old_forward(*args, **kwargs)

    module._hf_hook = object()
    module._old_forward = module.forward
    module.forward = functools.partial(new_forward, module)
    return calls


@pytest.mark.parametrize("hook_first", [True, False], ids=["hook-then-patch", "patch-then-hook"])
def test_device_hooks_are_kept_in_both_orders(hook_first):
    model = build("llama").eval()
    reference = copy.deepcopy(model)
    batch = inputs(model)
    norm = model.model.norm
    calls = _add_device_hook(norm) if hook_first else None
    report = patch_norms(model)
    calls = calls if hook_first else _add_device_hook(norm)
    assert len(report.patched) == 5 and is_patched(norm)
    assert torch.equal(_logits(model, batch), _logits(reference, batch))
    assert calls and record_of(norm).norm.last_backend == "torch"  # the hook ran, and it ran lnblocks
    assert unpatch_norms(model) == 5
    assert not is_patched(norm) and not isinstance(norm._old_forward, PatchedForward)
    calls.clear()
    assert torch.equal(_logits(model, batch), _logits(reference, batch))
    assert calls  # the hook is still in place after unpatching


@pytest.mark.parametrize(
    ("family", "eps_key", "n_norms"), [("bert", "layer_norm_eps", 6), ("llama", "rms_norm_eps", 5)]
)
def test_eps_zero_models_patch_and_give_hf_numbers(family: str, eps_key: str, n_norms: int) -> None:
    """torch and HF accept eps=0 (BERT layer_norm_eps=0, Llama rms_norm_eps=0.0); so does the patcher, exactly."""
    model = build(family, **{eps_key: 0.0}).eval()
    batch = {"input_ids": torch.randint(3, 96, (2, 12))}
    expected = _logits(model, batch)
    report = patch_norms(model, backend="torch")
    assert len(report.patched) == n_norms and "eps=0" in str(report)
    assert torch.equal(_logits(model, batch), expected)


def test_eps_set_to_zero_after_patching_follows_hf():
    """``variance_epsilon = 0`` (an int) set after patching: the patched forward follows it, as HF's does."""
    model = build("llama").eval()
    reference = copy.deepcopy(model)
    patch_norms(model, backend="torch")
    for m in (*_norms(model), *_norms(reference)):
        m.variance_epsilon = 0
    batch = inputs(model)
    assert torch.equal(_logits(model, batch), _logits(reference, batch))
    assert record_of(model.model.norm).norm.spec.eps == 0.0


def test_a_norm_that_cannot_be_patched_is_named():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.LayerNorm(8), nn.LayerNorm(8, eps=-1.0)))
    with pytest.raises(
        ValueError, match=r"^cannot patch the norm 1\.1 \(LayerNorm\): eps must be a finite number >= 0"
    ):
        patch_norms(model)
    assert not any(is_patched(m) for m in model.modules())  # all or nothing
    report = patch_norms(model, exclude="1.1")  # left out, the rest patches; the report says why it could not
    assert [e.name for e in report.patched] == ["1.0"] and "not supported: eps must be" in str(report)
    llama = build("llama")
    patch_norms(llama)
    llama.model.norm.variance_epsilon = float("nan")
    with pytest.raises(ValueError, match=r"^LlamaRMSNorm\.variance_epsilon = nan, set after patching, is no eps"):
        llama(**{k: v for k, v in inputs(llama).items() if k != "labels"})


def test_a_deleted_patched_model_is_freed_at_once_without_the_garbage_collector():
    """A patched module's forward holds it by weak reference: no cycle keeps its modules and Parameters alive."""
    model = build("llama")
    patch_norms(model, backend="torch", fuse_residual=True)
    model(**inputs(model)).loss.backward()
    clone = copy.deepcopy(model)
    assert torch.equal(_logits(clone, inputs(clone)), _logits(model, inputs(model)))
    refs = [weakref.ref(x) for m in (model, clone) for x in (*m.modules(), *m.parameters())]
    gc.collect()
    gc.disable()
    try:
        del model, clone
        alive = sorted({type(r()).__name__ for r in refs if r() is not None})
    finally:
        gc.enable()
    assert not alive, f"kept alive by a reference cycle: {alive}"
