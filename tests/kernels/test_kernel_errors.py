"""Bad inputs to the fused kernels raise ValueError/TypeError naming the argument; CPU without the interpreter is
refused by backend="triton" and avoided by backend="auto"."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lnblocks.kernels import unavailable_reason
from lnblocks.kernels.functional import fused_add_norm
from lnblocks.norms import build_norm
from lnblocks.norms.spec import DyTSpec, LayerNormSpec, RMSNormSpec, ScaleNormSpec
from tests.kernels.kernel_helpers import DEVICE

X = torch.randn(3, 16, device=DEVICE)
W = torch.ones(16, device=DEVICE)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(x=[1.0]), TypeError, "x must be a torch.Tensor"),
        (dict(x=X.double()), TypeError, "x must be float16, bfloat16 or float32"),
        (dict(x=X.long()), TypeError, "x must be float16"),
        (dict(residual=torch.randn(3, 8, device=DEVICE)), ValueError, "residual: expected the same shape"),
        (dict(residual=X.double()), TypeError, "residual must be float16"),
        (dict(weight=torch.ones(8, device=DEVICE)), ValueError, r"weight: expected the shape of x's normalised"),
        (dict(weight=W, normalized_shape=8), ValueError, r"x: expected trailing dimension\(s\) \(8,\)"),
        (dict(weight=W, normalized_shape=16, bias=torch.ones(4, device=DEVICE)), ValueError, "bias: expected shape"),
        (dict(weight=W, bias=W, spec=RMSNormSpec()), ValueError, "bias: not allowed"),
        (dict(weight=W, spec=LayerNormSpec(elementwise_affine=False)), ValueError, "elementwise_affine=False"),
        (dict(spec=ScaleNormSpec()), ValueError, "spec: this entry point runs 'layernorm', 'rmsnorm', 'l2norm'"),
        (dict(spec="mamba2_gated"), ValueError, "got kind 'gated_rmsnorm' \\(the gated norm: fused_gated_rms_norm"),
        (dict(spec=DyTSpec()), ValueError, "alpha: required by norm kind 'dyt'"),
        (dict(alpha=torch.ones(1, device=DEVICE)), ValueError, "alpha: norm kind 'layernorm' has no alpha"),
        (dict(spec=DyTSpec(), alpha=torch.ones(2, device=DEVICE)), ValueError, "alpha: expected a one-element"),
        (dict(spec=RMSNormSpec(group_size=8), dropout_p=0.1), ValueError, "dropout_p: not with grouped statistics"),
        (dict(spec=RMSNormSpec(group_size=5)), ValueError, "group_size 5 must divide the 16 normalised elements"),
        (dict(spec="nonsense"), ValueError, "unknown norm kind"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be a float in \[0, 1\)"),
        (dict(dropout_p=-0.1), ValueError, "dropout_p"),
        (dict(dropout_p=0.1, seed=1.5), TypeError, "seed must be an int"),
        (dict(dropout_p=0.1, seed=torch.tensor([1.0], device=DEVICE)), TypeError, "seed must be an int or a one-elem"),
        (dict(out_dtype=torch.int64), TypeError, "out_dtype must be"),
        (dict(max_block_n=100), ValueError, "max_block_n must be a power of two"),
        (dict(max_block_n=-4), ValueError, "max_block_n must be a power of two"),
        (dict(max_block_n=2.5), TypeError, "max_block_n must be an int"),
        (dict(max_block_n=True), TypeError, "max_block_n must be an int"),
        (dict(inplace_backward=1), TypeError, "inplace_backward must be a bool"),
    ],
)
def test_bad_inputs_raise(kwargs: dict, error: type[Exception], match: str) -> None:
    args = dict(x=X, residual=None, weight=None, bias=None, spec=None) | kwargs
    with pytest.raises(error, match=match):
        fused_add_norm(
            args.pop("x"), args.pop("residual"), args.pop("weight"), args.pop("bias"), args.pop("spec"), **args
        )


def test_wrong_weight_shape_names_the_weight() -> None:
    """``fused_add_norm(x, r, torch.ones(7))`` used to blame x for the weight's shape: the error names the weight."""
    x = torch.randn(3, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^weight: .*got \(7,\)"):
        fused_add_norm(x, torch.randn_like(x), torch.ones(7, device=DEVICE))


def test_cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = X.cpu()
    with pytest.raises(ValueError, match="x is on cpu: the Triton kernels run on CUDA tensors"):
        fused_add_norm(x)
    assert "TRITON_INTERPRET=1" in unavailable_reason(LayerNormSpec(), x)
    with pytest.raises(ValueError, match="backend='triton' cannot run here"):
        build_norm("layernorm", 16, backend="triton")(x)
    auto = build_norm("layernorm", 16, backend="auto")
    auto(x)
    assert auto.last_backend == "torch"


def test_unavailable_reasons() -> None:
    assert unavailable_reason(LayerNormSpec(), X) is None  # CUDA, or CPU with the interpreter on
    assert "no fused kernel" in unavailable_reason(ScaleNormSpec(), X)
    assert "float64" in unavailable_reason(RMSNormSpec(), X.double())
    with pytest.raises(ValueError, match="backend='triton' cannot run here"):
        build_norm("rmsnorm", 16, backend="triton", device=DEVICE)(X.double())


def test_import_touches_neither_cuda_nor_triton() -> None:
    """``import lnblocks.kernels`` loads no triton; importing the kernels themselves queries no CUDA device."""
    script = (
        "import sys, torch\n"
        "def boom(*a, **k): raise AssertionError('CUDA queried at import')\n"
        "torch.cuda.get_device_properties = torch.cuda.current_device = torch.cuda.device_count = boom\n"
        "torch.cuda.is_available = boom\n"
        "import lnblocks.kernels\n"
        "assert 'triton' not in sys.modules, 'lnblocks.kernels imported triton'\n"
        "import lnblocks.kernels.functional, lnblocks.kernels.launch, lnblocks.kernels.ops\n"
        "assert 'triton' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
