"""The one table of model families: which norm each family uses, and what the rest of lnblocks needs to know of it.

Each row is plain data (this module imports nothing), read by every package that knows about families:

- ``lnblocks.norms.spec`` builds ``NORM_PRESETS[name]`` from ``norm`` (a spec in its dict form);
- ``lnblocks.hf`` maps ``model_types`` (HF ``config.model_type``) to a role layout (``roles``, the per-family
  module-name rules of ``lnblocks.hf.families``) and takes the cast order of the HF RMSNorm class it recognises by
  code (``hf_norm_class``) from ``norm``;
- ``lnblocks.models`` converts weights of the families whose ``converter`` is set (``"gpt2"``, or ``"llama"`` for the
  Llama-shaped ones) to and from their ``transformers`` LM class ``hf_lm_class``, with ``norm`` as the block norm
  and the eps read from the HF config.

Rows without ``model_types`` are norm presets only: the norms of a family's other roles (``llama4_qk``, the gated
norms of the hybrid SSM families, ``cohere_qk``) and norms of no HF family (``derf``, TransformerEngine's);
``hf_norm_class`` still names the HF class a preset reproduces. A model type is in one row at most.

``norm`` holds the norm class's default eps (``LlamaRMSNorm(..., eps=1e-6)``), or the config's default
(``layer_norm_eps``) where the model builds a ``torch.nn.LayerNorm``. A model config may override it (``Olmo2Config``
and ``Phi3Config`` default to ``rms_norm_eps=1e-5``); the patcher and the converter always read the live value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

TORCH_LAYERNORM = "torch.nn.LayerNorm"


@dataclass(frozen=True, eq=False)
class ModelFamily:
    """One row of ``MODEL_FAMILIES``: a norm preset and, for HF model families, how lnblocks meets them."""

    name: str
    norm: Mapping[str, Any]
    source: str
    model_types: tuple[str, ...] = ()
    hf_norm_class: str | None = None
    roles: str | None = None
    converter: Literal["gpt2", "llama"] | None = None
    hf_lm_class: str | None = None


_LN = "layernorm"
_LLAMA_NORM = {"kind": "rmsnorm", "eps": 1e-6, "cast": "llama"}
_GEMMA_NORM = {"kind": "rmsnorm", "eps": 1e-6, "cast": "fp32", "zero_centered": True}
_MAMBA_GATED = {"kind": "gated_rmsnorm", "eps": 1e-6, "gate": "before", "activation": "silu", "cast": "llama"}
_COHERE_LN = {"kind": _LN, "eps": 1e-5, "bias": False, "cast": "cohere"}
_F = ModelFamily

MODEL_FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        # name       norm (spec dict)                                      paper / model
        _F("gpt2",   {"kind": _LN, "eps": 1e-5},                           "GPT-2 (Radford et al. 2019)",
           model_types=("gpt2",), hf_norm_class=TORCH_LAYERNORM, roles="gpt2",
           converter="gpt2", hf_lm_class="GPT2LMHeadModel"),
        _F("llama",  _LLAMA_NORM,                                          "Llama (arXiv 2302.13971)",
           model_types=("llama",), hf_norm_class="LlamaRMSNorm", roles="llama",
           converter="llama", hf_lm_class="LlamaForCausalLM"),
        _F("mistral", _LLAMA_NORM,                                         "Mistral 7B (arXiv 2310.06825)",
           model_types=("mistral",), hf_norm_class="MistralRMSNorm", roles="llama",
           converter="llama", hf_lm_class="MistralForCausalLM"),
        _F("qwen2",  _LLAMA_NORM,                                          "Qwen2 (arXiv 2407.10671)",
           model_types=("qwen2",), hf_norm_class="Qwen2RMSNorm", roles="llama",
           converter="llama", hf_lm_class="Qwen2ForCausalLM"),
        _F("qwen3",  _LLAMA_NORM,                                          "Qwen3 (arXiv 2505.09388)",
           model_types=("qwen3",), hf_norm_class="Qwen3RMSNorm", roles="llama",
           converter="llama", hf_lm_class="Qwen3ForCausalLM"),
        _F("phi3",   _LLAMA_NORM,                                          "Phi-3 (arXiv 2404.14219)",
           model_types=("phi3",), hf_norm_class="Phi3RMSNorm", roles="llama"),
        _F("gemma",  _GEMMA_NORM,                                          "Gemma (arXiv 2403.08295)",
           model_types=("gemma",), hf_norm_class="GemmaRMSNorm", roles="llama"),
        _F("gemma2", _GEMMA_NORM,                                          "Gemma 2 (arXiv 2408.00118)",
           model_types=("gemma2",), hf_norm_class="Gemma2RMSNorm", roles="sandwich"),
        _F("gemma3", _GEMMA_NORM,                                          "Gemma 3 (arXiv 2503.19786)",
           model_types=("gemma3", "gemma3_text"), hf_norm_class="Gemma3RMSNorm", roles="sandwich"),
        _F("olmo2",  {"kind": "rmsnorm", "eps": 1e-6, "cast": "fp32"},     "OLMo 2 (arXiv 2501.00656)",
           model_types=("olmo2",), hf_norm_class="Olmo2RMSNorm", roles="olmo2"),
        _F("t5",     {"kind": "rmsnorm", "eps": 1e-6, "cast": "t5"},       "T5 (arXiv 1910.10683)",
           model_types=("t5", "mt5"), hf_norm_class="T5LayerNorm", roles="t5"),
        _F("bert",   {"kind": _LN, "eps": 1e-12},                          "BERT (arXiv 1810.04805)",
           model_types=("bert",), hf_norm_class=TORCH_LAYERNORM, roles="bert"),
        _F("roberta", {"kind": _LN, "eps": 1e-12},                         "RoBERTa (arXiv 1907.11692)",
           model_types=("roberta",), hf_norm_class=TORCH_LAYERNORM, roles="bert"),
        _F("gpt_neox", {"kind": _LN, "eps": 1e-5},                         "GPT-NeoX-20B (arXiv 2204.06745)",
           model_types=("gpt_neox",), hf_norm_class=TORCH_LAYERNORM, roles="gpt_neox"),
        _F("opt",    {"kind": _LN, "eps": 1e-5},                           "OPT (arXiv 2205.01068)",
           model_types=("opt",), hf_norm_class=TORCH_LAYERNORM, roles="opt"),
        _F("falcon", {"kind": _LN, "eps": 1e-5},                           "Falcon (arXiv 2311.16867)",
           model_types=("falcon",), hf_norm_class=TORCH_LAYERNORM, roles="falcon"),
        # the 2025-26 families: the norm of the residual stream (model_types: patched with a role layout) and the
        # norms of their other roles (the qk-norm, the gated mixer norm: presets, patched where a class computes them)
        _F("llama4", {**_LLAMA_NORM, "eps": 1e-5},                        "Llama 4 (Meta 2025)",
           model_types=("llama4", "llama4_text"), hf_norm_class="Llama4TextRMSNorm", roles="llama"),
        _F("llama4_qk", {"kind": "l2norm", "eps": 1e-6},                  "Llama 4 qk-norm (Meta 2025)",
           hf_norm_class="Llama4TextL2Norm"),
        _F("nemotron", {"kind": _LN, "eps": 1e-5, "zero_centered": True, "cast": "nemotron"},
           "Nemotron-4 (arXiv 2402.16819)", model_types=("nemotron",), hf_norm_class="NemotronLayerNorm1P",
           roles="llama"),
        _F("nemotron_h", {"kind": "rmsnorm", "eps": 1e-6, "cast": "fp32"}, "Nemotron-H (arXiv 2504.03624)",
           model_types=("nemotron_h",), hf_norm_class="NemotronHRMSNorm", roles="hybrid"),
        _F("mamba2", _LLAMA_NORM,                                         "Mamba-2 (arXiv 2405.21060)",
           model_types=("mamba2",), hf_norm_class="Mamba2RMSNorm", roles="hybrid"),
        _F("bamba", _LLAMA_NORM,                                          "Bamba (IBM 2024)",
           model_types=("bamba",), hf_norm_class="BambaRMSNorm", roles="hybrid"),
        _F("jamba", _LLAMA_NORM,                                          "Jamba (arXiv 2403.19887)",
           model_types=("jamba",), hf_norm_class="JambaRMSNorm", roles="hybrid"),
        _F("falcon_h1", _LLAMA_NORM,                                      "Falcon-H1 (arXiv 2507.22448)",
           model_types=("falcon_h1",), hf_norm_class="FalconH1RMSNorm", roles="hybrid"),
        _F("zamba2", _LLAMA_NORM,                                         "Zamba2 (Zyphra 2024)",
           model_types=("zamba2",), hf_norm_class="Zamba2RMSNorm", roles="hybrid"),
        _F("granitemoehybrid", _LLAMA_NORM,                               "Granite 4.0 hybrid (IBM 2025)",
           model_types=("granitemoehybrid",), hf_norm_class="GraniteMoeHybridRMSNorm", roles="hybrid"),
        _F("qwen3_next", _GEMMA_NORM,                                     "Qwen3-Next (Qwen 2025)",
           model_types=("qwen3_next",), hf_norm_class="Qwen3NextRMSNorm", roles="hybrid"),
        _F("nemotron_h_gated", _MAMBA_GATED,                              "Nemotron-H mixer norm (arXiv 2504.03624)",
           hf_norm_class="NemotronHRMSNormGated"),
        _F("mamba2_gated", _MAMBA_GATED,                                  "Mamba-2 (arXiv 2405.21060)",
           hf_norm_class="MambaRMSNormGated"),
        _F("qwen3_next_gated", {**_MAMBA_GATED, "gate": "after"},         "Qwen3-Next gated DeltaNet norm (Qwen 2025)",
           hf_norm_class="Qwen3NextRMSNormGated"),
        _F("falcon_h1_gated", {**_MAMBA_GATED, "gate": "after", "cast": "fp32"}, "Falcon-H1 (arXiv 2507.22448)",
           hf_norm_class="FalconH1RMSNormGated"),
        _F("cohere", _COHERE_LN,                                          "Command R (Cohere 2024)",
           model_types=("cohere", "cohere2"), hf_norm_class="CohereLayerNorm", roles="parallel"),
        _F("cohere_qk", {**_COHERE_LN, "per_head": True},                 "Command R qk-norm (Cohere 2024)",
           hf_norm_class="CohereLayerNorm"),
        _F("derf", {"kind": "derf"},                                      "Derf (arXiv 2512.10938)"),
        _F("te_layernorm", {"kind": _LN, "eps": 1e-5, "zero_centered": True},
           "TransformerEngine LayerNorm(zero_centered_gamma=True)"),
        _F("te_rmsnorm", {"kind": "rmsnorm", "eps": 1e-5, "zero_centered": True},
           "TransformerEngine RMSNorm(zero_centered_gamma=True)"),
    )
}  # fmt: skip


def family_of_model_type(model_type: object) -> ModelFamily | None:
    """The row whose ``model_types`` include ``model_type`` (HF ``config.model_type``), or None."""
    return next((f for f in MODEL_FAMILIES.values() if model_type in f.model_types), None)
