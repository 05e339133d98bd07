"""kernels.norms: the mixed-precision RMSNorm and LayerNorm, forward and backward, against fp32 and
fp64 references, their modules and their argument errors."""

import pytest
import torch

from kernels import norms
from kernels.device import default_device
from kernels.testing import compare, tolerance

DEVICE = default_device()


# -- RMSNorm ------------------------------------------------------------------------------------------


def _rms_cases(dtype):
    g = torch.Generator().manual_seed(0)
    for m, n in ((1, 1), (3, 7), (5, 127), (4, 1000 + 3), (2, 4096)):
        x = torch.randn(m, n, generator=g)
        yield f"random {m}x{n}", x.to(dtype)
    yield "zero row", torch.zeros(2, 64).to(dtype)  # rstd = 1/sqrt(eps): finite, output 0
    yield "large (1e4)", (torch.randn(3, 256, generator=g) * 1e4).to(dtype)  # x^2 sums past fp16's range
    outlier = torch.randn(3, 256, generator=g)
    outlier[1, 7] = 300.0
    yield "one outlier", outlier.to(dtype)
    yield "3-D input", torch.randn(2, 3, 96, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rmsnorm_forward_and_backward_against_fp32_reference(dtype):
    # The output is an fp32 value rounded once to ``dtype``: half an ulp, the "elementwise" tolerance
    # of the table.  dx and dW add fp32 sums over a row (N terms) or a column (M rows); where they
    # cancel to near zero, the absolute error of those sums, ~N * 2^-24 of the largest term, dominates,
    # hence the small atol relative to the largest gradient.
    tol = tolerance("elementwise", dtype)
    # Our fp32 value and the reference's differ by a few fp32 ulps (summation order, the GPU's
    # approximate division), which can tip a rounding at a bf16 midpoint: allow that sliver.
    rtol = tol.rtol * (1 + 2.0**-12)
    # Outputs that land among the subnormals are rounded to an absolute grid: half its spacing.
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2
    g = torch.Generator().manual_seed(1)
    for name, x in _rms_cases(dtype):
        n = x.shape[-1]
        w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
        dy = torch.randn(x.shape, generator=g).to(dtype)
        xd, wd = x.to(DEVICE).clone().requires_grad_(), w.to(DEVICE).clone().requires_grad_()
        y = norms.rmsnorm(xd, wd, 1e-6)
        assert y.dtype == dtype and y.shape == x.shape
        y.backward(dy.to(DEVICE))
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()  # fp64: the exact answer
        yr = norms.rmsnorm_reference(x, w, 1e-6)
        result = compare(y, yr, atol=tiny, rtol=rtol, name=name)
        assert result.ok, result.report
        rstd = torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = xr * rstd * wr
        ref.backward(dy.double())
        with torch.no_grad():  # the size of the terms before they cancel: what the fp32 sums err against
            dx_terms = (wr * dy.double() * rstd).abs().amax()
            dw_terms = (dy.double() * xr * rstd).abs().reshape(-1, n).sum(0).amax()
        for got, want, terms, what in ((xd.grad, xr.grad, dx_terms, "dx"), (wd.grad, wr.grad, dw_terms, "dw")):
            atol = float(terms) * 2.0**-16 + tiny
            result = compare(got, want, atol=atol, rtol=rtol, name=f"{name} {what}")
            assert result.ok, result.report
            assert got.dtype == dtype


def test_rmsnorm_module_and_saved_statistics():
    norm = norms.RMSNorm(64, eps=1e-5, dtype=torch.bfloat16, device=DEVICE)
    x = torch.randn(4, 64, device=DEVICE).to(torch.bfloat16)
    y, rstd = norms.rmsnorm_forward(x, norm.weight.detach(), 1e-5)
    assert rstd.dtype == torch.float32 and rstd.shape == (4,)
    want = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
    assert torch.allclose(rstd, want, rtol=1e-6)
    assert torch.equal(norm(x), y)
    assert "64, eps=1e-05" in repr(norm)


def test_rmsnorm_bad_input():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight must be 1-D"):
        norms.rmsnorm(x, torch.ones(7, device=DEVICE))
    with pytest.raises(TypeError, match="x must be float32"):
        norms.rmsnorm(x.long(), torch.ones(8, device=DEVICE))
    with pytest.raises(ValueError, match="eps must be"):
        norms.rmsnorm(x, torch.ones(8, device=DEVICE), eps=-1.0)


# -- LayerNorm ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layernorm_forward_and_backward_against_fp64_reference(dtype):
    # Same reasoning as RMSNorm: one rounding of an fp32 value (half an ulp), plus for dx, dw and db
    # the error of fp32 sums where the result cancels to near zero.
    tol = tolerance("elementwise", dtype)
    rtol = tol.rtol * (1 + 2.0**-12)  # as for RMSNorm: a few fp32 ulps between our value and the reference's
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2
    g = torch.Generator().manual_seed(2)
    for name, x in _rms_cases(dtype):
        n = x.shape[-1]
        if n == 1:  # x - mean is exactly 0; the fp64 reference's own rounding leaves ~1e-16 in dw there
            continue
        w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
        b = (0.1 * torch.randn(n, generator=g)).to(dtype)
        dy = torch.randn(x.shape, generator=g).to(dtype)
        xd, wd, bd = (t.to(DEVICE).clone().requires_grad_() for t in (x, w, b))
        y = norms.layernorm(xd, wd, bd, 1e-5)
        y.backward(dy.to(DEVICE))
        xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
        ref = torch.nn.functional.layer_norm(xr, (n,), wr, br, 1e-5)
        ref.backward(dy.double())
        result = compare(y, ref.detach(), atol=tiny + 1e-6 * float(br.detach().abs().max()), rtol=rtol, name=name)
        assert result.ok, result.report
        with torch.no_grad():
            rstd = torch.rsqrt(xr.var(-1, unbiased=False, keepdim=True) + 1e-5)
            x_hat = (xr - xr.mean(-1, keepdim=True)) * rstd
            terms = {
                "dx": (wr * dy.double() * rstd).abs().amax(),
                "dw": (dy.double() * x_hat).abs().reshape(-1, n).sum(0).amax(),
                "db": dy.double().abs().reshape(-1, n).sum(0).amax(),
            }
        for got, want, what in ((xd.grad, xr.grad, "dx"), (wd.grad, wr.grad, "dw"), (bd.grad, br.grad, "db")):
            result = compare(got, want, atol=float(terms[what]) * 2.0**-16 + tiny, rtol=rtol, name=f"{name} {what}")
            assert result.ok, result.report
            assert got.dtype == dtype


def test_layernorm_module_and_bad_input():
    norm = norms.LayerNorm(32, dtype=torch.bfloat16, device=DEVICE)
    x = torch.randn(3, 32, device=DEVICE).to(torch.bfloat16)
    y, mean, rstd = norms.layernorm_forward(x, norm.weight.detach(), norm.bias.detach(), 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32
    assert torch.equal(norm(x), y)
    ref = norms.layernorm_reference(x, norm.weight, norm.bias, 1e-5)
    assert compare(y, ref, atol=1e-6, rtol=2.0**-8).ok
    with pytest.raises(ValueError, match="bias must be"):
        norms.layernorm(x, norm.weight, torch.zeros(31, device=DEVICE))
