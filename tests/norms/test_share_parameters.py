"""``Norm.share_parameters(module)``: an lnblocks norm computing on another module's live Parameters.

Reference: ``torch.nn.LayerNorm`` / ``RMSNorm`` themselves, after their Parameters are replaced (``.to()``,
``load_state_dict(assign=True)``), which a copied Parameter would not follow.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lnblocks.norms import build_norm


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_a_norm_sharing_a_modules_parameters_follows_their_replacement(kind: str) -> None:
    torch.manual_seed(0)
    reference = nn.LayerNorm(16) if kind == "layernorm" else nn.RMSNorm(16, eps=1e-6)
    norm = build_norm(kind, 16, device="meta", **({"eps": 1e-6} if kind == "rmsnorm" else {}))
    norm.share_parameters(reference)
    assert norm._parameters is reference._parameters  # the dict itself: nothing copied, no new Parameter
    x = torch.randn(3, 16)
    assert torch.equal(norm(x), reference(x))
    state = {k: torch.randn_like(v) for k, v in reference.state_dict().items()}
    reference.load_state_dict(state, assign=True)  # new Parameter objects in the shared dict
    assert torch.equal(norm(x), reference(x))
    reference.to(torch.float64)
    assert torch.equal(norm(x.double()), reference(x.double()))


def test_a_tensor_the_shared_dict_lacks_reads_as_none() -> None:
    """A module with a weight and no ``bias`` attribute at all (Cohere's LayerNorm): the norm runs without a bias."""
    module = nn.Module()
    module.weight = nn.Parameter(torch.randn(16))
    norm = build_norm("layernorm", 16, bias=False)
    norm.share_parameters(module)
    x = torch.randn(3, 16)
    assert torch.equal(norm(x), nn.functional.layer_norm(x, (16,), module.weight, None, 1e-5))


def test_share_parameters_needs_a_module() -> None:
    with pytest.raises(TypeError, match=r"module must be a torch\.nn\.Module, got dict"):
        build_norm("rmsnorm", 16).share_parameters({"weight": torch.ones(16)})
