"""kernels.hazards: each kernel right by default, and each bug switch shows its smell."""

import math

import numpy as np
import pytest
import torch

from kernels import hazards
from kernels.device import default_device
from kernels.testing import bits, check_kernel

DEVICE = default_device()


def test_row_mean_fp32_exactish_and_bf16_stagnates():
    g = torch.Generator().manual_seed(0)
    small = (torch.rand((3, 100), generator=g) + 1).to(torch.bfloat16)
    large = (torch.rand((3, 32768), generator=g) + 1).to(torch.bfloat16)
    for x in (small, large):
        ref = hazards.row_mean_reference(x)
        assert torch.allclose(hazards.row_mean(x.to(DEVICE)).cpu(), ref, rtol=1e-6, atol=0)
    bad = hazards.row_mean(large.to(DEVICE), acc="bf16").cpu()
    assert ((bad - hazards.row_mean_reference(large)).abs() / hazards.row_mean_reference(large)).max() > 0.05


def test_softmax_mask_value():
    g = torch.Generator().manual_seed(1)
    x = torch.randn((3, 100), generator=g) - 200
    ref = hazards.softmax_reference(x)
    assert torch.allclose(hazards.softmax(x.to(DEVICE)).cpu(), ref, atol=1e-6)
    assert bool((hazards.softmax(x.to(DEVICE), other=0.0) == 0).all())  # the all-zeros smell
    x128 = torch.randn((3, 128), generator=g)
    assert torch.allclose(hazards.softmax(x128.to(DEVICE), other=0.0).cpu(), hazards.softmax_reference(x128), atol=1e-6)


def test_softmax_empty_row():
    x = torch.randn((2, 10))
    valid = torch.ones((2, 10), dtype=torch.bool)
    valid[0] = False
    assert bool(torch.isnan(hazards.softmax(x.to(DEVICE), valid.to(DEVICE), guard_empty=False)[0]).all())
    out = hazards.softmax(x.to(DEVICE), valid.to(DEVICE)).cpu()
    assert torch.equal(out[0], torch.zeros(10)) and math.isclose(out[1].sum().item(), 1.0, rel_tol=1e-6)
    assert torch.allclose(out, hazards.softmax_reference(x, valid), atol=1e-6)


@pytest.mark.parametrize("amax", [1e-3, 1.0, 1e4])
def test_quantize(amax):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(777, generator=g)
    x = x / x.abs().max() * amax
    q, s = hazards.quantize_fp8(x.to(DEVICE))
    qr, sr = hazards.quantize_fp8_reference(x)
    assert np.array_equal(bits(q), bits(qr)) and float(s) == float(sr)
    bad, _ = hazards.quantize_fp8(x.to(DEVICE), scale_first=False)
    assert not np.array_equal(bits(bad), bits(qr))


def test_quantize_zero_tensor():
    q, s = hazards.quantize_fp8(torch.zeros(16, device=DEVICE))
    assert bool((q.float() == 0).all()) and float(s) == float(torch.tensor(1 / 448))
    q, _ = hazards.quantize_fp8(torch.zeros(16, device=DEVICE), guard_zero=False)
    assert bool(q.float().isnan().all())  # the all-NaN smell: 0 * (448 / 0)


def test_variance():
    g = torch.Generator().manual_seed(3)
    for n in (1000, 32768):
        x = (torch.randn((3, n), generator=g) + 3).to(torch.float16)
        assert torch.allclose(hazards.variance(x.to(DEVICE)).cpu(), hazards.variance_reference(x), rtol=1e-4)
    assert bool(torch.isnan(hazards.variance(x.to(DEVICE), promote=False)).all())  # N = 32768


def test_to_bf16():
    x = torch.cat([torch.randn(5000), torch.tensor([math.nan, math.inf, -math.inf, 3.4e38, 0.0, -0.0])])
    assert np.array_equal(bits(hazards.to_bf16(x.to(DEVICE))), bits(hazards.to_bf16_reference(x)))
    t = hazards.to_bf16(x[:5000].to(DEVICE), truncate=True).cpu().double()
    assert bool((t.abs() <= x[:5000].double().abs()).all())


def test_to_bf16_through_the_standard_harness():
    # Chapter 3 runs the same two calls: the kernel passes every case bit for bit, its bug is named
    n = check_kernel(hazards.to_bf16, hazards.to_bf16_reference, exact=True, device=DEVICE, name="to_bf16")
    assert n == 90  # 5 shapes x 3 seeds x 6 adversarial inputs
    with pytest.raises(AssertionError, match=r"to_bf16\(truncate=True\) shape=\(1,\) seed=0 input=large"):
        check_kernel(
            lambda x: hazards.to_bf16(x, truncate=True),
            hazards.to_bf16_reference,
            exact=True,
            device=DEVICE,
            name="to_bf16(truncate=True)",
        )


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: hazards.row_mean(torch.zeros((2, 2))), TypeError),
        (lambda: hazards.row_mean(torch.zeros(2, dtype=torch.bfloat16)), ValueError),
        (lambda: hazards.row_mean(torch.zeros((2, 2), dtype=torch.bfloat16), acc="fp16"), ValueError),
        # on the operands' device, so that the shape is what is wrong (not the device)
        (
            lambda: hazards.softmax(
                torch.zeros((2, 2), device=DEVICE), valid=torch.ones((2, 3), dtype=torch.bool, device=DEVICE)
            ),
            TypeError,
        ),
        (lambda: hazards.quantize_fp8(torch.zeros(2, dtype=torch.float16)), TypeError),
        (lambda: hazards.variance(torch.zeros((2, 2))), TypeError),
        (lambda: hazards.to_bf16("x"), TypeError),
    ],
)
def test_bad_arguments(call, error):
    with pytest.raises(error):
        call()
