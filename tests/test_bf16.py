"""fp32 -> bf16: the integer-rounding kernel, the hardware cast and the PyTorch reference agree bit for bit.

The hardware cast is the authority (on the CPU, the corrected interpreter, itself proven against bits
recorded on an H200); the other two must reproduce it on every class of input where rounding can go
wrong, and on every one of the 2^16 possible upper halves.
"""

import numpy as np
import pytest
import torch

import kernels
from kernels import bf16
from kernels.device import default_device
from kernels.testing import STANDARD_SHAPES, assert_bits_equal, bits, check_kernel

DEVICE = default_device()
IMPLEMENTATIONS = [bf16.fp32_to_bf16_rne, bf16.fp32_to_bf16_reference]


def from_bits(patterns) -> torch.Tensor:
    u = np.asarray(patterns, dtype=np.uint32)
    return torch.from_numpy(u.view(np.float32).copy()).to(DEVICE)


# Each entry: fp32 pattern -> the bf16 pattern round-to-nearest-even demands (worked out by hand).
KNOWN = {
    0x3F800000: 0x3F80,  # 1.0, exact
    0x3F808000: 0x3F80,  # tie, kept part even: stays
    0x3F818000: 0x3F82,  # tie, kept part odd: rounds up to even
    0x3F808001: 0x3F81,  # just above half: up
    0x3F807FFF: 0x3F80,  # just below half: down
    0xBF808000: 0xBF80,  # negative tie, even: stays (magnitude rounding, sign untouched)
    0xBF818000: 0xBF82,  # negative tie, odd: magnitude up
    0x3F7FFFFF: 0x3F80,  # mantissa all ones: carry into the exponent gives 1.0
    0x3FFF8000: 0x4000,  # tie with odd kept part all ones: carry into the exponent
    0x7F7FFFFF: 0x7F80,  # largest fp32 rounds past bf16's largest finite: inf
    0x7F7F7FFF: 0x7F7F,  # just below the overflow threshold: bf16 max
    0x7F7F8000: 0x7F80,  # exactly halfway to 2^128, kept part odd: inf
    0xFF7FFFFF: 0xFF80,  # -> -inf
    0x7F800000: 0x7F80,  # inf
    0xFF800000: 0xFF80,  # -inf
    0x00000000: 0x0000,  # +0
    0x80000000: 0x8000,  # -0
    0x00000001: 0x0000,  # smallest subnormal: far below half of bf16's smallest subnormal
    0x00008000: 0x0000,  # subnormal tie, even: down to zero
    0x00018000: 0x0002,  # subnormal tie, odd: up
    0x0000FFFF: 0x0001,  # subnormal above half
    0x007FFFFF: 0x0080,  # largest subnormal carries into the smallest normal
    0x807F8000: 0x8080,  # negative subnormal tie, odd kept part: carries into the exponent
    0x7F800001: 0x7FFF,  # NaN with payload only in the dropped bits (truncation would give inf)
    0x7FC00000: 0x7FFF,  # quiet NaN
    0xFFC00000: 0x7FFF,  # negative quiet NaN: sign dropped
    0x7FFFFFFF: 0x7FFF,  # NaN whose rounding carry would run into the sign bit
    0xFFFFFFFF: 0x7FFF,  # NaN whose rounding carry would wrap 32 bits
    0x7F808000: 0x7FFF,  # NaN that is a "tie": rounding down would leave inf
    0xFF800001: 0x7FFF,  # negative signalling NaN
}


@pytest.mark.parametrize("fn", IMPLEMENTATIONS + [bf16.hardware_bf16], ids=lambda f: f.__name__)
def test_known_values(fn):
    x = from_bits(list(KNOWN))
    got = bits(fn(x))
    want = np.array(list(KNOWN.values()), dtype=np.uint16)
    bad = [f"{k:#010x} -> {g:#06x}, want {w:#06x}" for k, g, w in zip(KNOWN, got, want, strict=True) if g != w]
    assert not bad, f"{fn.__name__}: " + "; ".join(bad)


@pytest.mark.parametrize("fn", IMPLEMENTATIONS, ids=lambda f: f.__name__)
def test_standard_shapes_and_adversarial_inputs(fn):
    checked = check_kernel(fn, bf16.hardware_bf16, exact=True, device=DEVICE, shapes=STANDARD_SHAPES)
    assert checked == len(STANDARD_SHAPES) * 3 * 6


def test_standard_shapes_are_the_briefs():
    assert [s[0] for s in STANDARD_SHAPES] == [1, 7, 127, 1003, 4099]


@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 3, 5), (4, 1003), (1, 1, 4099)])
@pytest.mark.parametrize("fn", IMPLEMENTATIONS, ids=lambda f: f.__name__)
def test_any_shape(fn, shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 100).to(DEVICE)
    y = fn(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.device == x.device
    assert_bits_equal(y, bf16.hardware_bf16(x), name=fn.__name__)


@pytest.mark.parametrize("fn", IMPLEMENTATIONS, ids=lambda f: f.__name__)
def test_non_contiguous_input(fn):
    base = torch.randn(64, 48, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x = base.t()[::2]  # transposed and strided
    assert not x.is_contiguous()
    assert_bits_equal(fn(x), bf16.hardware_bf16(x.contiguous()), name=fn.__name__)
    assert_bits_equal(fn(x), x.contiguous().cpu().to(torch.bfloat16).to(DEVICE), name="torch cast")


def all_upper_halves(lows) -> np.ndarray:
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    return (upper[:, None] | np.asarray(lows, dtype=np.uint32)[None, :]).ravel()


# For every possible bf16 pattern (upper half): exact, smallest step, just below a tie, the tie, just
# above it and the largest low half.  That covers every sign, exponent (subnormals, inf and NaN
# included) and kept mantissa, and every way rounding can go.
LOW_HALVES = (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF)


@pytest.mark.parametrize("fn", IMPLEMENTATIONS, ids=lambda f: f.__name__)
def test_every_upper_half(fn):
    x = from_bits(all_upper_halves(LOW_HALVES))
    assert_bits_equal(fn(x), bf16.hardware_bf16(x), name=fn.__name__, inputs=bits(x).reshape(-1, 1))


def test_random_bit_patterns():
    rng = np.random.default_rng(2024)
    x = from_bits(rng.integers(0, 1 << 32, size=200_003, dtype=np.uint64).astype(np.uint32))
    want = bf16.hardware_bf16(x)
    for fn in IMPLEMENTATIONS:
        assert_bits_equal(fn(x), want, name=fn.__name__, inputs=bits(x).reshape(-1, 1))


def test_nan_always_canonical():
    u = all_upper_halves(range(1, 1 << 16, 257))
    u = u[(u & 0x7FFFFFFF) > 0x7F800000]  # NaN of every sign, upper half and some low halves
    x = from_bits(u)
    assert torch.isnan(x).all()
    for fn in IMPLEMENTATIONS + [bf16.hardware_bf16]:
        assert (bits(fn(x)) == 0x7FFF).all(), fn.__name__


def test_agrees_with_torch_cast_on_numbers():
    # torch's own CPU cast also rounds to nearest even; it keeps NaN payloads, so compare numbers only.
    u = all_upper_halves(LOW_HALVES)
    u = u[(u & 0x7FFFFFFF) <= 0x7F800000]
    x = from_bits(u)
    assert_bits_equal(bf16.fp32_to_bf16_rne(x), x.cpu().to(torch.bfloat16).to(DEVICE), name="vs torch")


def test_round_bf16_bits_reference_range():
    u = torch.from_numpy(all_upper_halves(LOW_HALVES).astype(np.int64))
    out = bf16.round_bf16_bits_reference(u)
    assert out.dtype == torch.int64 and int(out.min()) >= 0 and int(out.max()) <= 0xFFFF


@pytest.mark.parametrize("fn", IMPLEMENTATIONS + [bf16.hardware_bf16], ids=lambda f: f.__name__)
def test_bad_input_names_x(fn):
    with pytest.raises(TypeError, match=r"\bx\b.*torch\.float32.*float64"):
        fn(torch.zeros(4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match=r"\bx\b.*torch\.Tensor.*list"):
        fn([1.0, 2.0])
    with pytest.raises(TypeError, match=r"\bx\b.*bfloat16"):
        fn(torch.zeros(4, dtype=torch.bfloat16, device=DEVICE))


@pytest.mark.skipif(kernels.INTERPRETER, reason="only compiled Triton needs the tensor on the GPU")
def test_cpu_tensor_on_gpu_machine_names_x():
    with pytest.raises(ValueError, match=r"\bx\b is on cpu.*x\.cuda\(\)"):
        bf16.fp32_to_bf16_rne(torch.zeros(4))


def test_wrong_kernel_is_caught():
    # The tests above must be able to fail: plain truncation (what the uncorrected interpreter does)
    # differs from the hardware cast on the known values.
    x = from_bits(list(KNOWN))
    truncated = bf16.bf16_from_bits(bf16.fp32_bits(x) >> 16).to(DEVICE)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(truncated, bf16.hardware_bf16(x), name="truncation", inputs=bits(x).reshape(-1, 1))
