"""CPU mode must give the bits compiled Triton gives on Hopper (tests/data/hopper_numerics.npz).

The table was recorded on an H200 by tests/data/record_hopper_numerics.py; these tests replay its
inputs through the same kernels in the corrected interpreter.  On a GPU they are skipped unless
KERNELS_INTERPRET=1 forces the interpreter.
"""

import pathlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels import _interpreter
from kernels import numerics_probe as probe
from kernels.device import default_device
from kernels.testing import first_mismatches

TABLE = pathlib.Path(__file__).parent / "data" / "hopper_numerics.npz"

pytestmark = pytest.mark.skipif(not kernels.INTERPRETER, reason="needs CPU mode (the interpreter)")


@pytest.fixture(scope="module")
def table():
    return np.load(TABLE)


def test_table_provenance(table):
    assert str(table["meta_capability"]) == "9.0", "the table must come from a Hopper GPU"
    assert "H200" in str(table["meta_device"]) or "H100" in str(table["meta_device"])
    assert table["meta_failures"].size == 0


@pytest.mark.parametrize("src,dst", probe.CASTS, ids=[f"{s}->{d}" for s, d in probe.CASTS])
def test_cast_bits_match_hopper(table, src, dst):
    inputs = table[f"in_{src}"]
    got = probe.cast(inputs, src, dst, "cpu")
    want = table[f"cast_{src}_{dst}"]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, first_mismatches(inputs, got, want, bad, what=f"{src} -> {dst}")
    print(f"{src} -> {dst}: {inputs.size} inputs, 0 mismatches")


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_elementwise_bits_match_hopper(table, fmt):
    a, b = table["binary_a"], table["binary_b"]
    got = probe.binary(a, b, fmt, "cpu")
    for op in probe.BINARY_OPS:
        want = table[f"binary_{fmt}_{op}"]
        bad = np.flatnonzero(got[op] != want)
        pairs = np.stack([a, b], axis=1)
        assert bad.size == 0, first_mismatches(pairs, got[op], want, bad, what=f"{fmt} {op}")


def _f64(bits, fmt):
    return bits.view(probe.FORMATS[fmt][1]).astype(np.float64)


def _blockwise_reference(a64, b64, block_k):
    """``acc = tl.dot(a_blk, b_blk, acc)`` with each call exact and rounded once to fp32."""
    acc = np.zeros((a64.shape[0], b64.shape[1]), dtype=np.float32)
    for k in range(0, a64.shape[1], block_k):
        acc = (acc.astype(np.float64) + a64[:, k : k + block_k] @ b64[k : k + block_k]).astype(np.float32)
    return acc


WIDE_DOTS = [(f, p) for f, p in probe.DOTS if f not in ("e4m3", "e5m2")]


@pytest.mark.parametrize("fmt,precision", WIDE_DOTS, ids=[f"{f}-{p}" for f, p in WIDE_DOTS])
def test_each_dot_is_float64_rounded_once(table, fmt, precision):
    """CPU mode: each bf16/fp16/fp32 tl.dot is the exact (float64) dot plus accumulator, rounded once to fp32."""
    key = f"dot_{fmt}_{precision}"
    a, b = table[f"{key}_a"], table[f"{key}_b"]
    got = probe.dot(a, b, fmt, precision, "cpu").view(np.float32)
    if precision == "tf32":
        a, b = (x & np.uint32(0xFFFFE000) for x in (a, b))
    want = _blockwise_reference(_f64(a, fmt), _f64(b, fmt), probe.DOT_BLOCK_K)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} of {got.size} outputs differ from the float64 dots rounded to fp32"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_dot_bits_match_hopper(table, fmt):
    """CPU mode: an FP8 tl.dot on a wgmma-sized tile gives the H200's bits (Hopper's 13-bit accumulator)."""
    key = f"dot_{fmt}_default"
    a, b = table[f"{key}_a"], table[f"{key}_b"]
    got = probe.dot(a, b, fmt, "default", "cpu")
    want = table[key]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, first_mismatches(np.arange(want.size), got.ravel(), want.ravel(), bad, what=f"{fmt} dot")


def test_small_fp8_tiles_accumulate_in_fp32():
    """A tile of fewer than 64 rows lowers to mma.sync on fp16 operands: no 13-bit accumulator."""
    assert _interpreter.uses_wgmma(64, 64, 4) and _interpreter.uses_wgmma(128, 8, 8)
    assert not _interpreter.uses_wgmma(32, 64, 4) and not _interpreter.uses_wgmma(64, 64, 2)


# How far the Hopper GPU itself is from the exact dot, in units of sum_k |a_ik b_kj| * 2^-24.
# fp32-accumulated dots of K=512 land within ~10 such units (measured 9.0 bf16, 9.8 fp16, 10.3 fp32
# ieee, 16.8 tf32, whose truncated operands add their own error); Triton's default fp8 dot on Hopper
# (max_num_imprecise_acc = 2^30) keeps fewer accumulator bits: measured 12,510 (e4m3), 10,385 (e5m2).
GPU_DOT_BOUND = {"bf16": 16, "fp16": 16, "fp32": 32, "e4m3": 16_384, "e5m2": 16_384}


@pytest.mark.parametrize("fmt,precision", probe.DOTS, ids=[f"{f}-{p}" for f, p in probe.DOTS])
def test_dot_close_to_hopper(table, fmt, precision):
    key = f"dot_{fmt}_{precision}"
    a, b = table[f"{key}_a"], table[f"{key}_b"]
    got = probe.dot(a, b, fmt, precision, "cpu").view(np.float32).astype(np.float64)
    gpu = table[key].view(np.float32).astype(np.float64)
    a64, b64 = _f64(a, fmt), _f64(b, fmt)
    scale = np.abs(a64) @ np.abs(b64) * 2.0**-24
    units = np.max(np.abs(got - gpu) / scale)
    print(f"{key}: CPU vs H200 differ by at most {units:.1f} x sum|ab| * 2^-24")
    assert units <= GPU_DOT_BOUND[fmt]


def test_bf16_dot_matches_float64_reference():
    """A fresh bf16 dot, not from the table: exact to fp32 rounding."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 256, generator=g).to(torch.bfloat16)
    b = torch.randn(256, 16, generator=g).to(torch.bfloat16)
    a_bits, b_bits = probe.to_bits(a), probe.to_bits(b)
    old = probe.DOT_M, probe.DOT_N, probe.DOT_K
    try:
        probe.DOT_M, probe.DOT_N, probe.DOT_K = 32, 16, 256
        got = probe.dot(a_bits, b_bits, "bf16", "default", "cpu").view(np.float32)
    finally:
        probe.DOT_M, probe.DOT_N, probe.DOT_K = old
    want = _blockwise_reference(a.double().numpy(), b.double().numpy(), probe.DOT_BLOCK_K)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} of {got.size} outputs differ from the float64 reference"
    # and the rounding is really happening: a bf16-accumulated dot would be far off
    assert np.abs(got - (a.double() @ b.double()).numpy()).max() < 1e-4


def test_upstream_interpreter_still_needs_the_correction(table):
    """Fails once Triton's own interpreter gets these right: then retire kernels/_interpreter.py."""
    ties = table["in_fp32"][65536 : 65536 + 4096]  # exact bf16 ties (low half 0x8000)
    fp8_cases = np.array([0x42F92E14, 0x43E80000, 0x3F880000], dtype=np.uint32)  # 124.59, 464, 1.0625
    _interpreter.uninstall()
    try:
        raw_bf16 = probe.cast(ties, "fp32", "bf16", "cpu")
        raw_e4m3 = probe.cast(fp8_cases, "fp32", "e4m3", "cpu")
    finally:
        _interpreter.install()
    assert _interpreter.installed()
    fixed_bf16 = probe.cast(ties, "fp32", "bf16", "cpu")
    fixed_e4m3 = probe.cast(fp8_cases, "fp32", "e4m3", "cpu")
    assert fixed_e4m3.tolist() == [0x70, 0x7E, 0x38]  # 128, 448 (saturated), 1.0 (tie to even)
    broken = (raw_bf16 != fixed_bf16).any() or (raw_e4m3 != fixed_e4m3).any()
    assert broken, (
        f"Triton {triton.__version__}'s interpreter now rounds "
        "fp32 -> bf16 and fp32 -> fp8 like Hopper: drop the correction in kernels/_interpreter.py"
    )


@triton.jit
def _reductions_kernel(x_ptr, out_ptr, idx_ptr, scan_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr, tl.sum(x, axis=0))
    tl.store(out_ptr + 1, tl.max(x, axis=0))
    tl.store(out_ptr + 2, tl.min(x, axis=0))
    tl.store(idx_ptr, tl.argmax(x, axis=0))
    tl.store(idx_ptr + 1, tl.argmin(x, axis=0))
    tl.store(scan_ptr + tl.arange(0, N), tl.cumsum(x, axis=0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reductions_act_on_values_not_bit_patterns(dtype):
    # Negative bf16 patterns are large unsigned integers: max, argmax and sums of the patterns
    # would all be wrong.  Values chosen so that every partial sum is exact in bf16.
    dev = default_device()
    x = torch.tensor([-3.0, -1.0, 2.5, -7.0, 0.5, 1.0, 2.0, 0.25], dtype=dtype, device=dev)
    out = torch.zeros(3, dtype=dtype, device=dev)
    idx = torch.zeros(2, dtype=torch.int32, device=dev)
    scan = torch.zeros(8, dtype=dtype, device=dev)
    _reductions_kernel[(1,)](x, out, idx, scan, N=8)
    assert out.float().tolist() == [-4.75, 2.5, -7.0]
    assert idx.tolist() == [2, 3]
    assert torch.equal(scan.float(), x.float().cumsum(0))


def test_bf16_sum_is_rounded_once_from_fp32():
    dev = default_device()
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(256, generator=g) * 0.2 + 1.0).to(torch.bfloat16).to(dev)
    out = torch.zeros(3, dtype=torch.bfloat16, device=dev)
    idx = torch.zeros(2, dtype=torch.int32, device=dev)
    scan = torch.zeros(256, dtype=torch.bfloat16, device=dev)
    _reductions_kernel[(1,)](x, out, idx, scan, N=256)
    exact = x.double().sum().item()
    # One bf16 rounding of the fp32 sum here; the GPU rounds at each step of its tree: a few ulps.
    ulps = 1 if kernels.INTERPRETER else 8
    assert abs(out[0].item() - exact) <= ulps * 2.0 ** (int(np.floor(np.log2(exact))) - 7)
    assert out[1].item() == x.max().item() and out[2].item() == x.min().item()


@triton.jit
def _libdevice_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(out_ptr + offs, tl.extra.libdevice.rint(x))
    tl.store(out_ptr + N + offs, tl.extra.libdevice.round(x))
    tl.store(out_ptr + 2 * N + offs, tl.extra.libdevice.trunc(x))
    tl.store(out_ptr + 3 * N + offs, tl.extra.libdevice.floor(x))
    tl.store(out_ptr + 4 * N + offs, tl.extra.libdevice.ceil(x))
    tl.store(out_ptr + 5 * N + offs, tl.extra.libdevice.abs(x))
    tl.store(out_ptr + 6 * N + offs, tl.extra.libdevice.nearbyint(x))
    tl.store(out_ptr + 7 * N + offs, tl.extra.libdevice.copysign(x, y))


def test_exact_libdevice_functions_give_the_same_bits_on_both_lanes():
    """rint, round, trunc, floor, ceil, abs, nearbyint and copysign on ties, signed zeros, the largest
    fp32 values, infinities and NaN: exact operations, so CPU mode (numpy) and the GPU (libdevice) must
    agree bit for bit; NaN results are compared as NaN, whatever their payload.  Triton links libdevice
    with flush-to-zero on, so a subnormal input is a signed zero to all but copysign."""
    ties = [k + 0.5 for k in range(-4, 4)]
    special = [0.0, -0.0, 0.49999997, -0.49999997, 1.0000001, 2.0**23 + 1, -(2.0**24), 3.4e38, float("inf"),
               float("-inf"), float("nan"), 1e-45, -1e-45, 7.7, -7.7, 1e10, -1e-39]  # fmt: skip
    x = torch.tensor(ties + special + [0.3] * 7, dtype=torch.float32)
    y = torch.tensor([1.0, -1.0, float("nan"), -0.0] * 8, dtype=torch.float32)
    n = x.numel()
    out = torch.empty(8 * n, dtype=torch.float32, device=default_device())
    _libdevice_kernel[(1,)](x.to(out.device), y.to(out.device), out, N=n)
    got = out.cpu().numpy().reshape(8, n)
    xs, ys = x.numpy(), y.numpy()
    flushed = np.where(np.abs(xs) < 2.0**-126, np.copysign(np.float32(0), xs), xs).astype(np.float32)
    copysign = np.copysign(xs, ys)
    xs = flushed
    t = np.trunc(xs)
    away = np.copysign(np.floor(np.abs(xs.astype(np.float64)) + 0.5), xs).astype(np.float32)  # half away
    want = np.stack([np.rint(xs), away, t, np.floor(xs), np.ceil(xs), np.abs(xs), np.rint(xs), copysign])
    names = ["rint", "round", "trunc", "floor", "ceil", "abs", "nearbyint", "copysign"]
    for name, g, w in zip(names, got, want, strict=True):
        both_nan = np.isnan(g) & np.isnan(w)
        bad = np.flatnonzero((g.view(np.uint32) != w.view(np.uint32)) & ~both_nan)
        assert bad.size == 0, first_mismatches(x.numpy(), g, w, bad, what=f"libdevice.{name}")


@pytest.mark.skipif(not kernels.INTERPRETER, reason="compiled Triton has every libdevice function")
def test_an_inexact_libdevice_function_is_refused_by_name_in_cpu_mode():
    @triton.jit
    def kernel(x_ptr):
        offs = tl.arange(0, 4)
        tl.store(x_ptr + offs, tl.extra.libdevice.exp(tl.load(x_ptr + offs)))

    with pytest.raises(Exception, match="__nv_expf has no bit-exact version in CPU mode"):
        kernel[(1,)](torch.ones(4))


@triton.jit
def _float_argument_kernel(x_ptr, arg_ptr, lit_ptr, scale, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))  # bf16
    by_arg = x * scale  # a float argument is an fp32 scalar: the product is fp32
    tl.static_assert(by_arg.dtype == tl.float32)
    tl.store(arg_ptr + tl.arange(0, N), by_arg)
    by_literal = x * 0.3  # a float literal takes the tensor's type: a bf16 product
    tl.static_assert(by_literal.dtype == tl.bfloat16)
    tl.store(lit_ptr + tl.arange(0, N), by_literal)


def test_float_arguments_are_fp32_and_literals_take_the_tensors_type():
    """As compiled Triton types them: ``bf16 * scale`` (a float argument) is fp32 and ``bf16 * 0.3`` is bf16;
    CPU mode once kept the argument a Python float and failed on the bf16 constant it then needed."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(default_device())
    by_arg = torch.empty(64, dtype=torch.float32, device=x.device)
    by_literal = torch.empty(64, dtype=torch.bfloat16, device=x.device)
    _float_argument_kernel[(1,)](x, by_arg, by_literal, 0.3, N=64)
    scale32 = torch.tensor(0.3, dtype=torch.float32)
    assert torch.equal(by_arg.cpu(), x.cpu().float() * scale32), "the argument is not an fp32 scalar"
    assert torch.equal(by_literal.cpu(), x.cpu() * scale32.to(torch.bfloat16)), "the literal is not a bf16 constant"
