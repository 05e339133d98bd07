"""The NumPy model of Hopper's FP8 tensor-core dot (kernels.hopper_mma) against what an H200 did.

The recorded dots (tests/data/hopper_numerics.npz, compiled Triton 3.6 on an H200) must come out bit
for bit, and Chapter 3's accumulator probe must give the table the H200 gave.  Pure NumPy: runs the
same on every machine.
"""

import pathlib

import ml_dtypes
import numpy as np
import pytest
import torch

from kernels import accumulate
from kernels import hopper_mma as H
from kernels import numerics_probe as probe
from kernels.testing import first_mismatches

TABLE = pathlib.Path(__file__).parent / "data" / "hopper_numerics.npz"

# kernels.accumulate.accumulator_probe on the H200 (one tl.dot chain, block_k = 32): bits kept for a
# small product at each K-index after a large one at index 0.
H200_PROBE = {1: 10, 16: 10, 31: 10, 32: 13, 64: 13, 96: 13, 127: 13, 128: 13, 200: 13, 255: 13}

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


@pytest.fixture(scope="module")
def table():
    return np.load(TABLE)


def _operands(table, fmt):
    np_dtype = probe.FORMATS[fmt][1]
    return table[f"dot_{fmt}_default_a"].view(np_dtype), table[f"dot_{fmt}_default_b"].view(np_dtype)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_recorded_dots_bit_exact(table, fmt):
    """numerics_probe._dot_kernel's chain, acc = tl.dot(a[:, k:k+64], b[k:k+64, :], acc) over K = 512."""
    a, b = _operands(table, fmt)
    want = table[f"dot_{fmt}_default"]
    got = H.fp8_matmul(a, b, block_k=probe.DOT_BLOCK_K).view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, first_mismatches(np.zeros(0), got, want, bad, what=f"{fmt} dot vs H200")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_one_call_equals_the_chain(table, fmt):
    a, b = _operands(table, fmt)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    zero = np.zeros((a.shape[0], b.shape[1]), np.float32)
    whole = H.fp8_dot(a64, b64, zero, fmt, fmt)
    for block_k in (32, 128, 256):
        np.testing.assert_array_equal(H.fp8_matmul(a64, b64, block_k, fmt, fmt).view(np.uint32), whole.view(np.uint32))


def test_results_hold_13_fraction_bits(table):
    for fmt in ("e4m3", "e5m2"):
        assert not (table[f"dot_{fmt}_default"] & 0x3FF).any()  # the H200's results
        a, b = _operands(table, fmt)
        got = H.fp8_dot(a[:, :32], b[:32], np.float32(np.pi) * np.ones((64, 64), np.float32))
        assert not (got.view(np.uint32) & 0x3FF).any()


def test_probe_table_matches_h200():
    def matmul(a, b):
        return torch.from_numpy(H.fp8_matmul(a.cpu().float().numpy(), b.cpu().float().numpy()))

    assert accumulate.accumulator_probe(matmul) == H200_PROBE


def _one(products, acc=0.0, fmt="e4m3"):
    """Sum the products (pairs of FP8 values) with one 32-wide instruction into a 1x1 accumulator."""
    a = np.zeros((1, 32))
    b = np.zeros((32, 1))
    for i, (x, y) in enumerate(products):
        a[0, i], b[i, 0] = x, y
    return float(H.fp8_dot(a, b, np.full((1, 1), acc, np.float32), fmt, fmt)[0, 0])


def test_alignment_and_truncation_rules():
    # 1 + 2^-13 fits, 2^-14 below the largest term is cut, toward zero for either sign
    assert _one([(1, 1), (2.0**-7, 2.0**-6)]) == 1 + 2.0**-13
    assert _one([(1, 1), (2.0**-8, 2.0**-6)]) == 1.0
    assert _one([(-1, 1), (-(2.0**-8), 2.0**-6)]) == -1.0
    assert _one([(1, 1), (-(2.0**-8), 2.0**-6)]) == 1.0  # not 1 - 2^-13: each term truncates toward zero
    # a product in [2, 4) is aligned to the sum of its operands' exponents: 1.5 * 1.5 = 2.25 has
    # exponent 0, so two 2^-13 products survive the alignment (not below 2^1's 13 bits) and add up
    assert _one([(1.5, 1.5), (2.0**-7, 2.0**-6), (2.0**-7, 2.0**-6)]) == 2.25 + 2.0**-12
    # a subnormal operand (e4m3: 2^-9 = 0.125 * 2^-6) keeps exponent -6, so 2^-9 * 2^8 = 2^-1 is
    # aligned as 2^2: 10 bits below it survive, not 13 (the probe's 10 within one instruction)
    assert _one([(2.0**-9, 2.0**8), (2.0**-5, 2.0**-6)]) == 0.5 + 2.0**-11
    assert _one([(2.0**-9, 2.0**8), (2.0**-6, 2.0**-6)]) == 0.5
    assert _one([(2.0**-6, 2.0**5), (2.0**-6, 2.0**-6)]) == 0.5 + 2.0**-12  # the same 0.5 from normals
    assert _one([(2.0**-6, 2.0**5), (2.0**-8, 2.0**-6)]) == 0.5 + 2.0**-14
    # e5m2's subnormals start below 2^-14: 2^-16 * 2^15 = 0.5 is aligned as 2^1
    assert _one([(2.0**-16, 2.0**15), (2.0**-6, 2.0**-6)], fmt="e5m2") == 0.5 + 2.0**-12
    assert _one([(2.0**-16, 2.0**15), (2.0**-6, 2.0**-7)], fmt="e5m2") == 0.5
    # the accumulator takes part in the maximum and is truncated like a product
    assert _one([(2.0**-8, 2.0**-6)], acc=1.0) == 1.0
    assert _one([(2.0**-7, 2.0**-6)], acc=1 + 2.0**-20) == 1 + 2.0**-13
    # cancellation: terms are cut at 2^-13 below the largest (2^0) before the sum, though the
    # result, 0.125 + 2^-13, could hold more bits
    assert _one([(1, 1), (-0.5, 1.75), (2.0**-7, 2.0**-6), (2.0**-9, 2.0**-6)]) == 0.125 + 2.0**-13


# Single outputs measured on an H200 (compiled Triton 3.6, one tl.dot of K = 32 on a 64x64 tile, one
# wgmma m64n64k32): (format, a row as hex codes, b column as hex codes, fp32 acc in, fp32 out).
# Each is one where a plausible alternative differs: zero operands *do not* enter the alignment
# maximum (the first two: 0 x 448 and 0 x 57344 next to small products), and a full-precision
# accumulator is truncated at the alignment before the sum (the third).
H200_CASES = [
    (
        "e4m3",
        "0094a01f22160985a00188811219079aa79d118f8e9aa2a39e1ea006920c859b",
        "7e89312ca8333cb9b1abab3430222ea716ad3e361ca8b323a32431bab6b1bd35",
        0x00000000,
        0x3E608800,
    ),
    (
        "e5m2",
        "00aca9b229ab3325b093b428b2352e3129a0a822a62a2c29a6b4ae23ab3035ae",
        "7bacbdbabc35bd38baadbc3bb63e39b43d3c3038af333dbdbcb737bdbd3641b6",
        0x00000000,
        0x3FF28400,
    ),
    (
        "e4m3",
        "2827221e8fcda1012eb034b0ad97092e3d32c23029bdcda6a938a82faebd94a7",
        "2ecb289aa227c8a629a1abad3bab1e30c9b432493e949931a6c1b7401aaa3bb9",
        0xC80CA66A,
        0xC80CA400,
    ),
]
# The accumulator alone (all products zero), measured the same way: fp32 bits in -> out.  -0 comes
# out +0, subnormals are kept but truncated to 13 fraction bits below 2^-126, every NaN comes out
# 0x7FFFFFFF, infinities pass.
H200_ACC_ONLY = {
    0x80000000: 0x00000000,
    0x00000001: 0x00000000,
    0x80000001: 0x00000000,
    0x00080000: 0x00080000,
    0x00080001: 0x00080000,
    0x00600000: 0x00600000,
    0x80800000: 0x80800000,
    0x7F7FFFFF: 0x7F7FFC00,
    0xFF7FFFFF: 0xFF7FFC00,
    0x7F800000: 0x7F800000,
    0xFF800000: 0xFF800000,
    0x3F800001: 0x3F800000,
    0x3F7FFFFF: 0x3F7FFC00,
    0xBF800001: 0xBF800000,
    0x7FC00000: 0x7FFFFFFF,
    0xFFC00000: 0x7FFFFFFF,
    0x7F800001: 0x7FFFFFFF,
    0x7FA12345: 0x7FFFFFFF,
}


@pytest.mark.parametrize("case", H200_CASES, ids=["zero-x-max-e4m3", "zero-x-max-e5m2", "full-precision-acc"])
def test_h200_single_outputs(case):
    fmt, a_hex, b_hex, acc_bits, want = case
    dtype = probe.FORMATS[fmt][1]
    a = np.frombuffer(bytes.fromhex(a_hex), np.uint8).view(dtype).reshape(1, 32)
    b = np.frombuffer(bytes.fromhex(b_hex), np.uint8).view(dtype).reshape(32, 1)
    acc = np.array([[acc_bits]], np.uint32).view(np.float32)
    assert hex(int(H.fp8_dot(a, b, acc).view(np.uint32)[0, 0])) == hex(want)


def test_h200_accumulator_alone():
    bits = np.array(list(H200_ACC_ONLY), np.uint32).reshape(1, -1)
    got = H.fp8_dot(np.zeros((1, 32)), np.ones((32, bits.size)), bits.view(np.float32)).view(np.uint32)
    want = np.array(list(H200_ACC_ONLY.values()), np.uint32).reshape(1, -1)
    assert [hex(v) for v in got.ravel()] == [hex(v) for v in want.ravel()]
    # an exact cancellation of two products still sets the alignment exponent (2^0 here): the
    # accumulator 1 - 2^-24 is cut to 1 - 2^-13 (measured 0x3f7ff800)
    acc = np.array([[0x3F7FFFFF]], np.uint32).view(np.float32)
    a = np.zeros((1, 32))
    a[0, :2] = 1.0, -1.0
    b = np.zeros((32, 1))
    b[:2, 0] = -1.125
    assert H.fp8_dot(a, b, acc).view(np.uint32)[0, 0] == 0x3F7FF800


def test_promotion_max_num_imprecise_acc():
    """Triton's partial accumulator: each run of instructions starts from zero and is added in fp32."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 128)).astype(E4M3)
    b = rng.standard_normal((128, 16)).astype(E4M3)
    acc = rng.standard_normal((16, 16)).astype(np.float32)
    for p in (0, 32, 64, 128):
        want = acc.copy()
        step = max(32, p)
        for k in range(0, 128, step):
            part = H.fp8_dot(a[:, k : k + step], b[k : k + step], np.zeros_like(acc))
            want = (want + part).astype(np.float32)
        np.testing.assert_array_equal(H.fp8_dot(a, b, acc, max_num_imprecise_acc=p), want)
    for p in (None, 129, 2**30):  # no promotion
        np.testing.assert_array_equal(H.fp8_dot(a, b, acc, max_num_imprecise_acc=p), H.fp8_dot(a, b, acc))
    # the probe with promotion after every instruction: the first instruction still keeps 10 bits,
    # later small products meet the large value only in an fp32 add: 23 bits, what fp32 holds

    def matmul(x, y):
        return torch.from_numpy(
            H.fp8_matmul(x.cpu().float().numpy(), y.cpu().float().numpy(), 32, max_num_imprecise_acc=32)
        )

    kept = accumulate.accumulator_probe(matmul)
    assert kept == {p: (10 if p < 32 else 23) for p in accumulate.PROBE_POSITIONS}


def test_exact_when_every_term_fits():
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (16, 64)).astype(np.float64)
    b = rng.integers(-4, 5, (64, 8)).astype(np.float64)
    acc = rng.integers(-64, 64, (16, 8)).astype(np.float32)
    np.testing.assert_array_equal(H.fp8_dot(a, b, acc), (a @ b + acc).astype(np.float32))


def test_mixed_formats_and_dtype_inference():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 64)).astype(E4M3)
    b = (rng.standard_normal((64, 8)) * 2.0**-12).astype(E5M2)
    acc = np.zeros((8, 8), np.float32)
    got = H.fp8_dot(a, b, acc)
    np.testing.assert_array_equal(got, H.fp8_dot(a.astype(np.float64), b.astype(np.float64), acc, "e4m3", "e5m2"))
    with pytest.raises(ValueError, match="b_format"):
        H.fp8_dot(a, b, acc, b_format="e4m3")


def test_special_values():
    a = np.ones((2, 32))
    b = np.ones((32, 2))
    a[0, 3] = np.nan
    out = H.fp8_dot(a, b, np.zeros((2, 2), np.float32))
    assert (out[0].view(np.uint32) == 0x7FFFFFFF).all() and (out[1] == 32).all()
    b = np.ones((32, 2))
    b[5, 1] = np.inf
    out = H.fp8_dot(np.ones((2, 32)), b, np.zeros((2, 2), np.float32), "e5m2", "e5m2")
    assert (out[:, 0] == 32).all() and (out[:, 1] == np.inf).all()


def test_argument_checks():
    acc = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        H.fp8_dot(np.ones((4, 16)), np.ones((16, 4)), acc)
    with pytest.raises(ValueError, match="not a e4m3 value"):
        H.fp8_dot(np.full((4, 32), 0.3), np.ones((32, 4)), acc)
    with pytest.raises(TypeError, match="float32"):
        H.fp8_dot(np.ones((4, 32)), np.ones((32, 4)), acc.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        H.fp8_dot(np.ones((4, 32)), np.ones((32, 4)), np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="a_format"):
        H.fp8_dot(np.ones((4, 32)), np.ones((32, 4)), acc, a_format="fp16")
