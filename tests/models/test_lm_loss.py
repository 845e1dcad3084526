"""The chunked LM head + cross-entropy (``lnblocks.models.lm_head``) against today's full-logits loss: ``F.linear``,
then ``F.cross_entropy(logits.float())``, the study's z-loss ``c * logsumexp(logits.float()).pow(2).mean()`` and the
probe's ``logits.float().amax()`` / ``logsumexp(...).mean()``.

Tolerances (fp32): the loss, the z-loss and the stats are bit-identical, and so is the gradient to the hidden states,
where the BLAS computes GEMM rows independently of the chunk (probed by ``_rows_independent``; MKL: chunks of a
multiple of 4 rows); otherwise, and always for the weight gradient (a sum over rows), ``max|diff| <= 1e-6 *
max|reference|`` (measured: <= 6e-7). bf16 autocast: the error against fp64 at most twice the full loss's, + 1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

import lnblocks.models.lm_head as L
from lnblocks import GPT, BlockConfig, GPTConfig
from lnblocks.models.lm_head import lm_head_loss

B, T, C, V = 4, 32, 16, 300
REL = 1e-6


def _rows_independent(rows: int, n: int = B * T) -> bool:
    """Whether this BLAS and these kernels give ``n`` rows cut in chunks of ``rows`` (the last one shorter) the bits
    of one call over all rows: the logits GEMM ``h @ w.T``, the hidden-state gradient GEMM ``g @ w``, and ``exp``
    (the z-loss gradient's; a chunk that is no multiple of the SIMD loop has a scalar-path tail)."""
    gen = torch.Generator().manual_seed(1)
    h, w, d = torch.randn(n, C, generator=gen), torch.randn(V, C, generator=gen), torch.randn(n, V, generator=gen)

    def same(fn) -> bool:
        return torch.equal(torch.cat([fn(i) for i in range(0, n, rows)]), fn(None))

    def part(x: torch.Tensor, i: int | None) -> torch.Tensor:
        return x if i is None else x[i : i + rows]

    return same(lambda i: part(h, i) @ w.t()) and same(lambda i: part(d, i) @ w) and same(lambda i: part(d, i).exp())


def _data(ignore: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(B, T, C, generator=g), torch.randn(V, C, generator=g) * 0.5
    t = torch.randint(0, V, (B, T), generator=g)
    if ignore == "some":
        t[1, 3:9] = -100
        t[3, -1] = -100
    elif ignore == "all":
        t[:] = -100
    return h, w, t


def reference(h, w, t, coef: float, scale: float = 0.5, dtype: torch.dtype | None = None):
    """Today's loss (GPT.forward + lnblocks.study's z_loss_term + the probe's stats), backward of ``scale * obj``."""
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = F.linear(h, w)  # (B, T, V)
    loss = F.cross_entropy(logits.float().flatten(0, 1), t.flatten(), ignore_index=-100)
    z = coef * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
    ((loss + z) * scale).backward()
    lf = logits.detach().float()
    return loss.detach(), z.detach(), lf.amax(), torch.logsumexp(lf, dim=-1).mean(), h.grad, w.grad


def chunked(h, w, t, coef: float, rows: int | None, scale: float = 0.5, dtype: torch.dtype | None = None):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss, st = lm_head_loss(h, w, t, z_loss=coef, stats=True, chunk_rows=rows)
    z = st.z_loss if coef else torch.zeros(())
    ((loss + z) * scale).backward()
    return loss.detach(), z.detach(), st.max_logit, st.log_z.mean(), h.grad, w.grad


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, rel: float = REL, what: str = "") -> None:
    err = (actual.double() - expected.double()).abs().max().item()
    bound = rel * expected.double().abs().max().item()
    assert err <= bound, f"{what}: max|diff| {err:.3g} > {bound:.3g}"


NAMES = ("loss", "z_loss", "max_logit", "log_z", "grad_hidden", "grad_weight")


@pytest.mark.parametrize("scale", [0.5, 1 / 3])
@pytest.mark.parametrize("ignore", ["none", "some"])
@pytest.mark.parametrize("coef", [0.0, 1e-2])
@pytest.mark.parametrize("rows", [8, 24, 7])
def test_chunked_equals_the_full_logits_loss_fp32(rows: int, coef: float, ignore: str, scale: float) -> None:
    """Without a z-loss the gradients are computed in the forward for an upstream 1 and scaled: bit-identical
    for a power-of-2 upstream gradient (1: ``loss.backward()``); with one, recomputed, for any upstream gradient."""
    h, w, t = _data(ignore)
    exact = _rows_independent(rows)
    got, want = chunked(h, w, t, coef, rows, scale), reference(h, w, t, coef, scale)
    for name, a, b in zip(NAMES, got, want):
        scaled_after = coef == 0 and scale != 0.5  # in-forward gradients times 1/3: rounded once more
        if exact and name != "grad_weight" and not (name == "grad_hidden" and scaled_after):
            assert torch.equal(a, b), name
        else:
            assert_rel(a, b, what=name)


@pytest.mark.parametrize("coef", [0.0, 1e-2])
def test_one_chunk_is_the_full_computation_itself(coef: float) -> None:
    h, w, t = _data("some")
    for name, a, b in zip(NAMES, chunked(h, w, t, coef, None), reference(h, w, t, coef)):
        assert torch.equal(a, b), name  # default rows: these logits are small, one chunk


@pytest.mark.parametrize("rows", [8, None])
def test_every_target_ignored_gives_nan_and_zero_gradients_like_torch(rows: int | None) -> None:
    h, w, t = _data("all")
    got, want = chunked(h, w, t, 0.0, rows), reference(h, w, t, 0.0)
    assert got[0].isnan() and want[0].isnan()
    assert torch.equal(got[4], torch.zeros_like(h)) and torch.equal(want[4], got[4])
    assert torch.equal(got[5], want[5])
    # with a z-loss the gradient is the z-loss's alone
    for name, a, b in zip(NAMES[1:], chunked(h, w, t, 1e-2, rows)[1:], reference(h, w, t, 1e-2)[1:]):
        assert_rel(a, b, what=name)


@pytest.mark.parametrize("coef", [0.0, 1e-2])
@pytest.mark.parametrize("rows", [8, None])
def test_bf16_autocast_error_against_fp64_at_most_twice_the_full_loss(rows: int | None, coef: float) -> None:
    h, w, t = _data("some")
    exact = reference(h.double(), w.double(), t, coef)
    full = reference(h, w, t, coef, dtype=torch.bfloat16)
    got = chunked(h, w, t, coef, rows, dtype=torch.bfloat16)
    for name, g, f, e in zip(NAMES, got, full, exact):
        err_got = (g.double() - e).abs().max().item()
        err_full = (f.double() - e).abs().max().item()
        assert err_got <= 2 * err_full + 1e-6, f"{name}: {err_got:.3g} vs full {err_full:.3g}"
    assert got[4].dtype == torch.float32 and got[5].dtype == torch.float32


@pytest.mark.parametrize("coef", [0.0, 1e-2])
def test_fp16_takes_the_grad_scalers_scale_before_the_cast_like_autograd(coef: float) -> None:
    """fp16 trains with a GradScaler (here the loss x 2**16): the logits' gradient must be scaled before its cast to
    fp16, as autograd does for the full logits; scaled after (the in-forward route), ``p / N`` is an fp16 subnormal
    at real vocabularies (measured at V = 30,522, B x T = 1,024: 7% error in the hidden-state gradient, 0.03%
    scaled first). So the hidden-state gradient is the full fp16 loss's bit for bit (rows independent), and the
    weight's (fp16 partials summed in fp32 over chunks) errs against fp64 at most as much as the full loss's."""
    h, w, t = _data("some")
    scale = 2.0**16
    exact = reference(h.double(), w.double(), t, coef, scale=scale)
    full = reference(h, w, t, coef, scale=scale, dtype=torch.float16)
    got = chunked(h, w, t, coef, 8, scale=scale, dtype=torch.float16)
    for name, a, b in zip(NAMES[:4], got, full):
        assert torch.equal(a, b), name
    if _rows_independent(8):
        assert torch.equal(got[4], full[4])
    err_got, err_full = ((x.double() - exact[5]).abs().max().item() for x in (got[5], full[5]))
    assert err_got <= 2 * err_full + 1e-6 * exact[5].abs().max().item()


def _gpt(tie: bool, vocab: int = V) -> GPT:
    block = BlockConfig(dim=C, attention={"n_heads": 2})
    return GPT(GPTConfig(vocab_size=vocab, max_seq_len=T, n_layers=2, block=block, tie_weights=tie))


@pytest.fixture
def many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk even the small logits of these tests (8 rows per chunk: 1/16 of B * T)."""
    monkeypatch.setattr(L, "SINGLE_CHUNK_ELEMENTS", 0)
    monkeypatch.setattr(L, "MIN_CHUNK_ELEMENTS", 0)


@pytest.mark.parametrize("tie", [False, True])
def test_gpt_chunked_loss_and_every_gradient_equal_the_logits_path(tie: bool, many_chunks: None) -> None:
    model = _gpt(tie)
    idx, t = torch.randint(0, V, (B, T)), _data("some")[2]
    _, loss = model(idx, t)
    loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    stats, got = model(idx, t, return_logits=False)
    got.backward()
    assert isinstance(stats, L.LMHeadStats) and stats.z_loss is None and stats.max_logit is None
    assert torch.equal(got, loss) if _rows_independent(8) else abs(got.item() - loss.item()) <= REL * loss.item()
    assert L.default_chunk_rows(B * T, V) == 8
    for n, p in model.named_parameters():
        assert_rel(p.grad, want[n], what=n)  # tied: tok_emb.weight sums the embedding's and the head's gradient


def test_gpt_head_stats_are_the_probes_numbers(many_chunks: None) -> None:
    model = _gpt(False).eval()
    idx = torch.randint(0, V, (B, T))
    with torch.no_grad():
        logits, _, hidden = model(idx, return_hidden=True)
        stats, loss, hidden2 = model(idx, return_logits=False, return_hidden=True)  # no targets: stats by default
    lf = logits.float()
    assert loss is None and stats.log_z.shape == (B, T)
    assert torch.equal(stats.max_logit, lf.amax())
    assert torch.equal(stats.log_z.mean(), torch.logsumexp(lf, dim=-1).mean()) or _rows_independent(8) is False
    assert all(torch.equal(a, b) for a, b in zip(hidden, hidden2))


def test_gpt_z_loss_needs_the_chunked_head() -> None:
    model, idx = _gpt(False), torch.randint(0, V, (1, 4))
    with pytest.raises(ValueError, match="z_loss and head_stats come from the chunked head: pass return_logits=False"):
        model(idx, idx, z_loss=1e-4)
    with pytest.raises(TypeError, match="return_logits must be a bool"):
        model(idx, idx, return_logits="no")


@pytest.mark.parametrize("coef", [1e-2, 0.0], ids=["recompute", "in-forward"])
def test_compiled_fullgraph_equals_eager_and_checks_targets_on_device(coef: float, many_chunks: None) -> None:
    torch._dynamo.reset()
    model = _gpt(True)
    idx, t = torch.randint(0, V, (B, T)), _data("some")[2]

    def step(m) -> tuple:
        stats, loss = m(idx, t, return_logits=False, z_loss=coef)
        (loss + stats.z_loss if coef else loss).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        return loss, stats.z_loss, grads

    loss, z, want = step(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss2, z2, got = step(compiled)
    assert torch.equal(loss2, loss) and (z is None or torch.equal(z2, z))
    for n, g in got.items():
        assert torch.equal(g, want[n]), n
    with pytest.raises(RuntimeError, match=r"targets: class ids must be in \[0, 300\) or -100"):
        compiled(idx, torch.full((B, T), V), return_logits=False)


def test_custom_ops_pass_opcheck() -> None:
    """Schema, fake (meta) implementation and autograd registration of both ops, as torch.compile relies on them."""
    h, w, t = _data("some")
    h2, w2 = h.reshape(-1, C).requires_grad_(), w.clone().requires_grad_()
    cases = ((t.flatten(), 1e-2, 1), (t.flatten(), 0.0, 1), (t.flatten(), 0.0, 2), (None, 0.0, 1))
    for targets, coef, reduction in cases:  # recompute, in-forward (mean, sum), stats
        args = (h2, w2, targets, -100, coef, 8, torch.float32, reduction, True, True, True)
        torch.library.opcheck(L._fwd_op, args)


@pytest.mark.parametrize("rows", [8, None])
def test_meta_and_fake_tensors_shapes_without_values(rows: int | None) -> None:
    with torch.device("meta"):
        h, w = torch.randn(B, T, C, requires_grad=True), torch.randn(V, C, requires_grad=True)
        t = torch.randint(0, V, (B, T))
    loss, st = lm_head_loss(h, w, t, z_loss=1e-2, stats=True, chunk_rows=rows)
    (loss + st.z_loss).backward()
    assert st.log_z.shape == (B, T) and h.grad.shape == h.shape and w.grad.shape == w.shape
    with FakeTensorMode():
        model = _gpt(False)
        idx = torch.randint(0, V, (B, T))
        _, loss = model(idx, idx, return_logits=False)
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())


def _peak_bytes(fn) -> int:
    """Peak of the bytes torch's CPU allocator holds during ``fn``, above what it held before (profiler events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("coef", [1e-4, 0.0], ids=["recompute", "in-forward"])
def test_extra_memory_under_an_eighth_of_the_logits(coef: float) -> None:
    """At the default chunks (the buffers, reused by every chunk, sized to 1/8 of the logits: 40 rows here, 24 for
    the recomputing backward's four buffers)."""
    n, vocab, dim = 1024, 16384, 32
    assert L.default_chunk_rows(n, vocab) == 40 and L.default_chunk_rows(n, vocab, buffers=5) == 24
    h = torch.randn(n, dim, requires_grad=True)
    w = torch.randn(vocab, dim, requires_grad=True)
    t = torch.randint(0, vocab, (n,))
    grads = (n + vocab) * dim * 4  # the two gradients both versions return
    logits = n * vocab * 4

    def full() -> None:
        F.cross_entropy(F.linear(h, w).float(), t).backward()

    def chunks() -> None:
        loss, st = lm_head_loss(h, w, t, z_loss=coef)
        (loss + st.z_loss if coef else loss).backward()

    assert _peak_bytes(full) - grads >= 2 * logits  # the reference holds the logits and their gradient
    h.grad = w.grad = None
    assert _peak_bytes(chunks) - grads <= logits / 8


@pytest.mark.parametrize(
    ("n", "vocab", "rows"),
    [(1024, 256, 1024), (1024, 30522, 40), (1024, 50257, 40), (256, 30522, 16), (512, 8200, 32), (64, 256000, 4),
     (8192, 50257, 336)],
)  # fmt: skip
def test_default_chunks(n: int, vocab: int, rows: int) -> None:
    """One chunk up to 16 MiB of logits; else n/24 rows (three buffers within 1/8 of the logits) rounded down to a
    multiple of 8, but at least 8 and 1 MiB of logits, and at most n/16 rows."""
    assert L.default_chunk_rows(n, vocab) == rows


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda h, w, t: lm_head_loss(h, w[:, :3], t), ValueError, r"weight must have shape \(V, C\) with C = .* 16"),
        (lambda h, w, t: lm_head_loss(h, w.double(), t), TypeError, "must have the same dtype"),
        (lambda h, w, t: lm_head_loss(h, w, t.float()), TypeError, "targets must hold integer class ids"),
        (lambda h, w, t: lm_head_loss(h, w, t[:, :3]), ValueError, r"targets must have shape \(4, 32\)"),
        (lambda h, w, t: lm_head_loss(h, w, t + V), ValueError, r"class ids must be in \[0, vocab_size=300\)"),
        (lambda h, w, t: lm_head_loss(h, w, t, z_loss=-1.0), ValueError, "z_loss must be"),
        (lambda h, w, t: lm_head_loss(h, w, t, chunk_rows=0), ValueError, "chunk_rows must be"),
        (lambda h, w, t: lm_head_loss(h.sum(), w, t), ValueError, r"hidden must have shape \(\.\.\., C\)"),
    ],
)
def test_bad_loss_inputs(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(*_data("none"))
