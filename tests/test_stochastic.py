"""kernels.stochastic: the kernel equals its plain-PyTorch recipe bit for bit, every result is a
neighbour of its input, specials follow the hardware conversion, and the rounding is unbiased."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from kernels import formats, stochastic
from kernels.device import default_device
from kernels.testing import STANDARD_SHAPES, adversarial_inputs, bits

DEVICE = default_device()
FORMATS = stochastic.TARGETS


def _random_patterns(n=1 << 14, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    return torch.from_numpy(raw.view(np.float32).copy())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("saturate", [None, True, False])
def test_kernel_equals_reference_bit_for_bit(fmt, saturate):
    x = torch.cat(
        [_random_patterns(), torch.randn(4096) * 300, torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])]
    )
    got = stochastic.stochastic_round(x.to(DEVICE), fmt, seed=5, saturate=saturate)
    want = stochastic.stochastic_round_reference(x, fmt, seed=5, saturate=saturate)
    assert np.array_equal(bits(got), bits(want)), "kernel and reference differ"


@pytest.mark.parametrize("shape", STANDARD_SHAPES)
def test_shapes_and_adversarial_inputs(shape):
    for case, x in adversarial_inputs(shape, device=DEVICE).items():
        got = stochastic.stochastic_round(x, "e4m3fn", seed=1)
        want = stochastic.stochastic_round_reference(x.cpu(), "e4m3fn", seed=1)
        assert got.shape == x.shape
        assert np.array_equal(bits(got), bits(want)), case


@pytest.mark.parametrize("fmt", FORMATS)
def test_results_are_neighbours_and_representables_are_kept(fmt):
    x = torch.randn(4000) * torch.exp2(torch.randint(-12, 8, (4000,))).float()
    limit = formats.properties(fmt).max_finite
    x = x[x.abs() <= limit]
    y = stochastic.stochastic_round(x.to(DEVICE), fmt, seed=3).cpu().double()
    lo, hi = stochastic.neighbours(x, fmt)
    assert bool(((y == lo) | (y == hi)).all())
    grid = formats.decode(formats.all_codes(fmt), fmt)
    grid = grid[torch.isfinite(grid)]
    again = stochastic.stochastic_round(grid.to(DEVICE), fmt, seed=4).cpu().float()
    assert torch.equal(again, grid)


def test_specials():
    x = torch.tensor([math.nan, -math.nan, math.inf, -math.inf, 500.0, -50000.0, 0.0, -0.0])
    e4 = stochastic.stochastic_round(x.to(DEVICE), "e4m3fn", seed=0)
    assert bits(e4).tolist() == [0x7F, 0x7F, 0x7E, 0xFE, 0x7E, 0xFE, 0x00, 0x80]
    bf = stochastic.stochastic_round(x.to(DEVICE), "bf16", seed=0)
    assert bits(bf).tolist()[:4] == [0x7FFF, 0x7FFF, 0x7F80, 0xFF80]
    assert stochastic.stochastic_round(x.to(DEVICE), "e4m3fn", seed=0, saturate=False).float().isnan()[4:6].all()
    big = torch.tensor([3.4e38] * 4096)  # between bf16's max and 2^128: rounds up into inf sometimes
    out = stochastic.stochastic_round(big.to(DEVICE), "bf16", seed=2)
    assert bool(torch.isinf(out.float()).any()) and bool(torch.isfinite(out.float()).any())
    clipped = stochastic.stochastic_round(big.to(DEVICE), "bf16", seed=2, saturate=True)
    assert bool(torch.isfinite(clipped.float()).all())


def test_seeds_reproduce_and_differ():
    x = torch.full((10000,), 1.01)
    a = stochastic.stochastic_round(x.to(DEVICE), "e4m3fn", seed=7)
    b = stochastic.stochastic_round(x.to(DEVICE), "e4m3fn", seed=7)
    c = stochastic.stochastic_round(x.to(DEVICE), "e4m3fn", seed=8)
    assert np.array_equal(bits(a), bits(b))
    assert not np.array_equal(bits(a), bits(c))


def test_probability_is_the_exact_fraction():
    # 1.01 in fp32 lies between e4m3's 1 and 1.125: p(up) = (x - 1) / 0.125 exactly
    x32 = float(np.float32(1.01))
    p = (Fraction(x32) - 1) / Fraction(1, 8)
    n = 1 << 16
    y = stochastic.stochastic_round(torch.full((n,), x32).to(DEVICE), "e4m3fn", seed=9).cpu().double()
    ups = int((y == 1.125).sum())
    sd = math.sqrt(n * float(p) * (1 - float(p)))
    print(f"p(up) measured {ups / n:.5f}, exact {float(p):.5f}")
    assert abs(ups - n * float(p)) < 5 * sd


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn"])
def test_unbiased_z_scores(fmt):
    values = torch.tensor([1.0 + k / 37 for k in range(1, 30)] + [-0.3, 2.0**-8 * 1.3], dtype=torch.float32)
    copies = 2048
    x = values.repeat_interleave(copies)
    y = stochastic.stochastic_round(x.to(DEVICE), fmt, seed=21).cpu().double().reshape(values.numel(), copies)
    z = stochastic.unbiasedness_z(y.T, values, fmt)
    print("max |z|:", z.abs().max().item())
    assert z.abs().max().item() < 5


def test_clipping_breaks_unbiasedness():
    y = stochastic.stochastic_round(torch.full((4096,), 500.0).to(DEVICE), "e4m3fn", seed=1).float()
    assert bool((y == 448).all())


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: stochastic.stochastic_round(torch.zeros(3, dtype=torch.float64), "bf16", 0), TypeError),
        (lambda: stochastic.stochastic_round([1.0], "bf16", 0), TypeError),
        (lambda: stochastic.stochastic_round(torch.zeros(3), "fp16", 0), ValueError),
        (lambda: stochastic.stochastic_round(torch.zeros(3), "bf16", -1), ValueError),
        (lambda: stochastic.stochastic_round(torch.zeros(3), "bf16", 1.5), ValueError),
        (lambda: stochastic.stochastic_round(torch.zeros(3), "bf16", 0, saturate="yes"), TypeError),
        (lambda: stochastic.random_bits(-1, 0), ValueError),
    ],
)
def test_bad_arguments(call, error):
    with pytest.raises(error):
        call()


def test_empty():
    assert stochastic.stochastic_round(torch.zeros(0, device=DEVICE), "bf16", 0).numel() == 0
