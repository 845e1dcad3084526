"""The ``model`` section (``lnblocks.study.lm.model_config``): it sets the Transformer's optional norms by name,
``emb_norm`` (BERT/BLOOM's embedding LayerNorm) and ``mlp_norm`` (NormFormer's FFN norm, arXiv 2110.09456), as fixed
keys and as grid axes, and the GPT each run builds has exactly those norms; and, a flat view of the library's fields,
it lists every one of them with the library's default."""

from __future__ import annotations

import pytest
import torch

from lnblocks.models import GPT
from lnblocks.norms import LayerNorm, LayerNormSpec, NormSpec, RMSNorm
from lnblocks.study import ModelConfig, StudyConfig

BASE = {"data": {"source": "markov", "vocab_size": 16, "seq_len": 8, "batch_size": 2, "eval_batches": 1},
        "train": {"steps": 2}}  # fmt: skip


def _gpt(run) -> GPT:
    return GPT(run.model.gpt_config(16, 8))


def test_study_config_builds_the_gpt_with_emb_norm_and_mlp_norm() -> None:
    model = {"dim": 32, "depth": 2, "norm": "rmsnorm", "emb_norm": "layernorm",
             "mlp_norm": {"kind": "layernorm", "eps": 1e-6}}  # fmt: skip
    (run,) = StudyConfig.from_dict({**BASE, "model": model}).runs()
    gpt = _gpt(run)
    assert isinstance(gpt.emb_norm, LayerNorm) and gpt.emb_norm.normalized_shape == (32,)
    for block in gpt.blocks:
        assert isinstance(block.mlp_in_norm, RMSNorm)  # the block's own norm is untouched
        assert isinstance(block.mlp.norm, LayerNorm) and block.mlp.norm.eps == 1e-6
        assert block.mlp.norm.normalized_shape == (4 * 32,)
    # the embedding norm acts on the summed embeddings: the first block sees unit-RMS, zero-mean rows
    x = torch.randint(0, 16, (2, 8))
    emb = gpt.emb_norm(gpt.tok_emb(x) + gpt.pos_emb(torch.arange(8)))
    torch.testing.assert_close(emb.mean(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    # "layernorm" and {"kind": "layernorm"} are one config: one run id
    same = {**model, "emb_norm": {"kind": "layernorm"}}
    assert StudyConfig.from_dict({**BASE, "model": same}).runs()[0].run_id == run.run_id
    assert NormSpec.from_dict(run.model.to_dict()["mlp_norm"]) == LayerNormSpec(eps=1e-6)


def test_grid_axes_vary_emb_norm_and_mlp_norm() -> None:
    study = StudyConfig.from_dict({**BASE, "model": {"dim": 32, "depth": 1},
                                   "grid": {"model.mlp_norm": [False, True, "rmsnorm"],
                                            "model.emb_norm": [None, "layernorm"]}})  # fmt: skip
    runs = study.runs()
    assert len(runs) == 6 and len({r.run_id for r in runs}) == 6
    kinds = set()
    for run in runs:
        gpt = _gpt(run)
        mlp_norm = gpt.blocks[0].mlp.norm
        kinds.add((type(mlp_norm).__name__, type(gpt.emb_norm).__name__))
        assert (gpt.emb_norm is None) == (run.label_dict["model.emb_norm"] == "None")
    assert kinds == {(a, b) for a in ("NoneType", "LayerNorm", "RMSNorm") for b in ("NoneType", "LayerNorm")}


def test_bad_optional_norms_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"model\.mlp_norm must be a norm kind or preset"):
        StudyConfig.from_dict({**BASE, "model": {"mlp_norm": "batchnorm"}})
    with pytest.raises(TypeError, match=r"model\.mlp_norm must be a bool or a norm"):
        StudyConfig.from_dict({**BASE, "model": {"mlp_norm": 1}})
    with pytest.raises(ValueError, match=r"model\.emb_norm\.kind must be a norm kind or preset"):
        StudyConfig.from_dict({**BASE, "model": {"emb_norm": {"kind": "batchnorm"}}})


def test_model_section_lists_the_library_fields_with_their_defaults() -> None:
    """``ModelConfig`` is a flat view written out (no generated dataclass), so a test keeps it equal to what it
    mirrors: every ``BlockConfig`` / ``GPTConfig`` field but those the study sets itself, with the library's default
    (``init``: the study's ``xavier``; nested configs: None). (The data section's corpus keys need no such test: they
    are ``CorpusFields``, which ``CorpusConfig`` builds on too.)"""
    import dataclasses

    from lnblocks.blocks import BlockConfig
    from lnblocks.models import GPTConfig
    from lnblocks.study.lm.model_config import BLOCK_KEYS, GPT_KEYS

    model = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    owners = (
        (BlockConfig, BLOCK_KEYS, {"placement"}),
        (GPTConfig, GPT_KEYS, {"vocab_size", "max_seq_len", "n_layers", "block", "memory_efficient"}),  # the block's
    )
    for cls, keys, set_by_study in owners:
        library = {f.name: f.default for f in dataclasses.fields(cls) if f.name not in set_by_study}
        assert list(keys) == list(library), cls.__name__
        for name, default in library.items():
            expected = "xavier" if name == "init" else None if default is dataclasses.MISSING else default
            assert model[name] == expected, f"ModelConfig.{name}"


def test_added_library_fields_leave_the_run_ids_as_they_were() -> None:
    """Fields the library added after run ids were fixed (the block's ``v_norm``, ``mlp_placement``,
    ``hyper_connections``; the model's ``emb_scale``, ``final_softcap``; the norm specs' ``group_size``, ``per_head``,
    ``memory_efficient`` and LayerNorm's ``cast``) are left out of the stored form at the value that computes what
    runs did before, so an existing run keeps its id; any other value is part of the id."""
    model = {"dim": 32, "depth": 1, "qk_norm": "layernorm"}
    (run,) = StudyConfig.from_dict({**BASE, "model": model}).runs()
    stored = run.to_dict()["model"]
    for key in ("v_norm", "mlp_placement", "hyper_connections", "emb_scale", "final_softcap"):
        assert key not in stored
    for spec in (stored["norm"], stored["qk_norm"]):
        assert not {"group_size", "per_head", "memory_efficient", "cast"} & set(spec)
    explicit = {**model, "norm": {"kind": "layernorm", "cast": "fp32", "per_head": False}, "v_norm": None}
    assert StudyConfig.from_dict({**BASE, "model": explicit}).runs()[0].run_id == run.run_id
    changed = [{"v_norm": "rmsnorm"}, {"mlp_placement": "post"}, {"final_softcap": 30.0},
               {"hyper_connections": {"n_streams": 2}}, {"norm": {"kind": "layernorm", "cast": "cohere"}},
               {"norm": {"kind": "rmsnorm", "cast": "fp32"}}]  # fmt: skip
    ids = {StudyConfig.from_dict({**BASE, "model": {**model, **c}}).runs()[0].run_id for c in changed}
    assert len(ids) == len(changed) and run.run_id not in ids
