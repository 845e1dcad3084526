"""The one family table (``lnblocks.norms.MODEL_FAMILIES``) against transformers itself: every row's norm preset is
the math and default eps HF uses, every HF class it names exists, and each derived view (presets, role layouts,
recognised RMSNorm classes, convertible families) agrees with it."""

from __future__ import annotations

import importlib
import inspect

import pytest
from hf_tiny import FAMILIES as TINY
from hf_tiny import build

from lnblocks.hf.families import FAMILIES as ROLE_FAMILIES
from lnblocks.hf.families import LAYOUTS, role_map_for
from lnblocks.hf.recognition import math_of_class, recognise
from lnblocks.models.hf_configs import FAMILIES as CONVERTIBLE
from lnblocks.models.hf_configs import family_of
from lnblocks.norms import MODEL_FAMILIES, NORM_PRESETS, norm_spec
from lnblocks.norms.families import TORCH_LAYERNORM, family_of_model_type

transformers = pytest.importorskip("transformers")
HF_ROWS = [f for f in MODEL_FAMILIES.values() if f.model_types]
# rows of a family's other roles (no model_types): the transformers module of the class they name, and the
# constructor arguments of an instance (a gated class reads its group size or gate order from the instance)
ROLE_ROWS = {
    "llama4_qk": ("llama4", ()),
    "nemotron_h_gated": ("nemotron_h", (48, 12)),
    "mamba2_gated": ("mamba2", (48, 12)),
    "qwen3_next_gated": ("qwen3_next", (48,)),
    "falcon_h1_gated": ("falcon_h1", (48,)),
    "cohere_qk": ("cohere", ((4, 12),)),
}


def _hf_class(model_type: str, name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}"), name)


def _config_eps(model_type: str) -> float:
    config = transformers.AutoConfig.for_model(model_type)
    for attr in ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps"):
        if hasattr(config, attr):
            return getattr(config, attr)
    return 1e-5  # OPT builds nn.LayerNorm without eps: torch's default


def test_presets_are_the_table() -> None:
    assert list(NORM_PRESETS) == list(MODEL_FAMILIES)
    for name, family in MODEL_FAMILIES.items():
        assert NORM_PRESETS[name] == norm_spec(dict(family.norm)) == norm_spec(name)


@pytest.mark.parametrize("family", HF_ROWS, ids=lambda f: f.name)
def test_row_matches_transformers(family) -> None:
    preset = NORM_PRESETS[family.name]
    for model_type in family.model_types:
        assert family_of_model_type(model_type) is family
        assert transformers.AutoConfig.for_model(model_type).model_type == model_type
    if family.hf_norm_class == TORCH_LAYERNORM:
        assert preset.kind == "layernorm"
        assert preset.eps == _config_eps(family.model_types[0])  # the config's default layer_norm_eps
    else:
        cls = _hf_class(family.model_types[0], family.hf_norm_class)
        assert inspect.signature(cls.__init__).parameters["eps"].default == preset.eps  # the class default
        params = ("weight", "bias") if getattr(preset, "bias", False) else ("weight",)
        math = math_of_class(cls, params)  # recognised by its code, with the math the table states
        assert math is not None and math.preset.replace(eps=preset.eps) == preset


@pytest.mark.parametrize("name", list(ROLE_ROWS))
def test_role_rows_are_the_math_of_their_classes(name: str) -> None:
    """A row without model_types names the HF class its preset reproduces: an instance is recognised as it."""
    module_name, args = ROLE_ROWS[name]
    preset = NORM_PRESETS[name]
    instance = _hf_class(module_name, MODEL_FAMILIES[name].hf_norm_class)(*args)
    rec = recognise(instance)
    assert rec is not None and rec.math is not None, rec
    spec = rec.math.spec(instance, preset.backend)
    expected = preset.replace(**{k: getattr(spec, k) for k in ("eps", "group_size", "per_head") if hasattr(spec, k)})
    assert spec == expected


@pytest.mark.parametrize("name", list(TINY))
def test_every_norm_of_a_tiny_model_is_its_family_preset(name: str) -> None:
    """The patcher reads each norm's spec from the module; it equals the preset of the model's row (or, for the
    norms of a family's other roles, of the row naming their class's math) up to the instance's live values."""
    model = build(name)
    family = family_of_model_type(model.config.model_type)
    assert family is not None
    by_class = {f.hf_norm_class: f.name for f in MODEL_FAMILIES.values() if f.hf_norm_class}
    specs = [
        (rec.math, rec.math.spec(module, "auto"))
        for module in model.modules()
        if (rec := recognise(module)) is not None and rec.math is not None
    ]
    assert specs
    for math, spec in specs:
        row = by_class.get(math.origin.removesuffix(" math"), family.name)
        if NORM_PRESETS[row].kind != spec.kind:
            row = family.name
        instance = ("eps", "elementwise_affine", "bias", "group_size", "per_head")
        expected = NORM_PRESETS[row].replace(**{k: getattr(spec, k) for k in instance if hasattr(spec, k)})
        assert spec == expected, (math.origin, row)


def test_derived_views() -> None:
    assert {f.roles for f in HF_ROWS} <= set(LAYOUTS)
    assert {t for fam in ROLE_FAMILIES for t in fam.model_types} == {t for f in HF_ROWS for t in f.model_types}
    model = build("gemma2")
    assert role_map_for(model)[1].role("model.layers.0.post_attention_layernorm") == "post_attn"
    assert CONVERTIBLE == ("gpt2", "llama", "mistral", "qwen2", "qwen3")
    for name in CONVERTIBLE:
        lm_class = getattr(transformers, MODEL_FAMILIES[name].hf_lm_class)
        config = lm_class.config_class()
        assert config.model_type == name and family_of(config) == name
    with pytest.raises(ValueError, match=r"unsupported model_type 'gemma2'"):
        family_of(transformers.Gemma2Config())
