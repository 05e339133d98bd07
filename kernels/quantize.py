"""Scaled FP8 quantization kernels: per tensor, per row, 1x128 groups, 128x128 blocks and MXFP8.

Chapter 2 and Lab 02 (quantizers).  Entry points: :func:`quantize`, :func:`quantize_tensor`,
:func:`quantize_rowwise`, :func:`quantize_1x128`, :func:`quantize_128x128`, :func:`quantize_mxfp8`,
:func:`dequantize`, :class:`DelayedScaling`, each kernel with its ``*_reference`` beside it; and
:func:`quantize_tensor_and_transpose`, the codes of a matrix and of its transpose in one pass; for chapter
5's FP8 linear layer, :func:`quantize_tensor_fused` (amax, S, codes and transposed codes in one launch)
and :func:`quantize_columns_transposed` (per-row scaling of ``x.T`` read from ``x``).

The single implementation every later chapter imports (the FP8 GEMM reads what these write).

Convention, everywhere in this module
-------------------------------------
``S`` is the *reconstruction* scale: ``x ~= S * q`` and ``q = sat(RNE(x * (1 / S)))``.  Every function
here returns ``S`` (never its reciprocal, which many APIs call "scale" or "scale_inv").  The division
is done once per group, correctly rounded (``alpha = 1 / S`` in fp32, ``tl.math.div_rn`` in the kernels,
IEEE ``/`` in the references); each element is then *multiplied* by ``alpha``.  ``x / S`` per element
would give different bits in a few places, and Triton's plain ``/`` on fp32 is not correctly rounded.

* fp32 scales (per tensor, per row, 1x128, 128x128): ``S = max(amax / FP8_MAX, 2^-126)`` with
  ``FP8_MAX`` 448 (e4m3) or 57344 (e5m2).  The floor at the smallest normal fp32 keeps ``1 / S``
  finite for groups of subnormal inputs.
* MXFP8 (blocks of 32 along the row): ``S = 2^e`` stored as its E8M0 byte ``e + 127`` (uint8).
  ``rounding="floor"`` is the OCP MX v1.0 rule ``e = floor(log2(amax)) - emax_elem`` (emax_elem = 8
  for e4m3, 15 for e5m2); values in the top of the block's binade then saturate to 448.
  ``rounding="up"`` is the conservative rule ``e = ceil(log2(amax / FP8_MAX))``, which clips only at
  the top of fp32's range: for ``e`` from 120 up (e4m3; 113 for e5m2) a code of FP8_MAX, or even the
  binade's top, times ``2^e`` would pass fp32's maximum, so the elements saturate at the largest code
  whose product with S is finite (240 for ``e = 120``: 240 x 2^120 = 3.19e38).  Both are computed
  exactly from amax's bits; ``e`` is clamped to [-127, 127].

Policies
--------
* All-zero group (amax = 0): ``S = 1`` (E8M0 byte 127); nothing divides by zero.
* NaN and +-inf do not take part in amax: the scale is set by the finite values of the group.  A
  non-finite input encodes to the NaN code 0x7F in both e4m3fn and e5m2 (e4m3fn has no inf; one rule
  for both formats), and dequantizes to NaN.  A finite input never becomes non-finite.  With a scale
  from its own group's amax, ``|x / S|`` exceeds FP8_MAX by at most rounding, which the
  round-to-nearest-even cast takes back to FP8_MAX; where the scale need not cover the values (MX's
  floor rule, a given or delayed scale) they are clamped to +-FP8_MAX before the cast.  The cast's own
  overflow rule is never relied on.
* Shapes that are not multiples of a group are masked: the last group of a row (or the last block row)
  is partial and its scale comes from the elements present; scale tensors have ``cdiv`` extents.

Layouts (inputs are made contiguous; leading dimensions of row-group kinds are flattened)
* per tensor: ``S`` of shape ``()`` (a 0-d fp32 device tensor: no host sync between the passes).
* per row: ``S`` of shape ``(M, 1)``.  1x128: ``(M, cdiv(K, 128))``.  128x128: ``(cdiv(M, 128),
  cdiv(K, 128))``.  MXFP8: uint8 E8M0 bytes ``(M, cdiv(K, 32))``, row-major, which is what
  ``tl.dot_scaled`` reads; :func:`swizzle_mx_scales` gives the 128x4-tiled layout of cuBLAS/tcgen05.

Each kernel has a plain-PyTorch ``*_reference`` beside it, bit for bit identical (codes and scales).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

import kernels
from kernels import formats
from kernels.device import check_device, default_device
from kernels.launch import Launcher, resident_programs, spec_key

# -- formats and constants ------------------------------------------------------------------------

FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": formats.E4M3_MAX, "e5m2": formats.E5M2_MAX}
# The largest exponent of a normal element (OCP MX's emax_elem): 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15.
EMAX_ELEM = {"e4m3": 8, "e5m2": 15}
MIN_SCALE = 2.0**-126  # the smallest normal fp32: 1 / S stays finite
# The largest significand of each FP8 format's binades (1.111b, 1.11b): the largest code below 2^(k+1)
# is TOP_SIGNIFICAND * 2^k.  Times 2^127: the bound below which q * 2^e stays finite, given 2^-e.
TOP_SIGNIFICAND = {"e4m3": 1.875, "e5m2": 1.75}
FINITE_BOUND = {f: t * 2.0**127 for f, t in TOP_SIGNIFICAND.items()}
NAN_CODE = 0x7F  # the code every non-finite input becomes (NaN in e4m3fn and in e5m2)
E8M0_BIAS = 127
GRANULARITIES = ("tensor", "row", "1x128", "128x128", "mxfp8")
GROUP_1X128 = 128
BLOCK_128X128 = 128
MX_BLOCK = 32
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Launch sizes, measured on an H200 (bf16 16384x8192 and 32768x16384).  Every program moves 8192 or
# more elements with contiguous, 16-byte-vectorizable rows; the row-group kinds take whole groups along
# a row (as many rows as it takes to fill the program when K is short).
TENSOR_BLOCK, TENSOR_WARPS = 8192, 8  # per-tensor passes: elements per program
FINALIZE_BLOCK = 1024  # the amax of the per-program partial maxima, in one program
TRANSPOSE_TILE, TRANSPOSE_WARPS = 64, 4  # cast and transpose: (64, 64) tiles, read once, written twice
FUSED_TILE, FUSED_WARPS = 64, 4  # the one-launch per-tensor quantizer: (64, 64) tiles, walked twice
# Compiled for Hopper by Triton 3.6, the transposed store of 8-bit codes (``tl.trans(q)``) writes about a
# quarter of the bytes of x.T wrong when the tile was loaded from fp32 (measured on an H100; bf16 tiles are
# right, and the CPU interpreter is right for every dtype).  For 4-byte inputs the kernels below therefore
# write the codes only, and x.T's codes are a copy of them, transposed: the same bits.
_TRANSPOSE_IN_KERNEL_MAX_BYTES = 2
ROW_MAX_ONE_PASS = 16384  # rows up to this many elements stay in registers: one read
ROW_BLOCK_ELEMS, ROW_WARPS = 8192, 4  # rows per program = max(1, ROW_BLOCK_ELEMS // next_pow2(K))
G128_GROUPS, G128_WARPS = 64, 8  # 1x128: 64 groups (8192 elements) per program
B128_WARPS = 4  # 128x128: one block (16384 elements) per program
MX_GROUPS, MX_WARPS = 256, 4  # MXFP8: 256 blocks of 32 (8192 elements) per program
DEQUANT_BM, DEQUANT_BK, DEQUANT_WARPS = 32, 256, 8
INT32_LIMIT = 2**31  # below this many elements, offsets are computed in int32 (fewer instructions)


class Quantized(NamedTuple):
    """Codes and their reconstruction scales S (``x ~= S * q``); ``s`` is E8M0 bytes for MXFP8."""

    q: torch.Tensor
    s: torch.Tensor


# -- argument checks ------------------------------------------------------------------------------


def _check_fmt(fmt) -> str:
    if fmt == "e4m3fn":
        fmt = "e4m3"
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {list(FP8_FORMATS)}, got {fmt!r}")
    return fmt


def _check_input(x, name: str = "x", min_dim: int = 0, on_device: bool = True) -> torch.Tensor:
    """``x`` checked (a tensor of an input dtype, ``min_dim`` dimensions or more) and contiguous.
    ``on_device``: also on the device the kernels run on; the plain-PyTorch references take either."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must have dtype bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    if on_device:
        check_device(x, name)
    return x.contiguous()


def _check_matrix(x, on_device: bool = True) -> torch.Tensor:
    x = _check_input(x, on_device=on_device)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix (rows, K) to be transposed, got shape {tuple(x.shape)}")
    return x


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K), M the product of the leading dimensions."""
    return x.reshape(-1, x.shape[-1])


# -- shared pieces of every kernel: the scale rule and the saturating encode ----------------------


@triton.jit
def _fp32_scale(amax, FP8_MAX: tl.constexpr):
    """amax (>= 0, finite) -> (S, 1/S): S = max(amax / FP8_MAX, 2^-126), or 1 for an all-zero group."""
    s = tl.math.div_rn(amax, FP8_MAX)  # correctly rounded, like torch's fp32 division
    s = tl.maximum(s, 1.1754943508222875e-38)  # 2^-126
    s = tl.where(amax == 0.0, 1.0, s)
    return s, tl.math.div_rn(1.0, s)


@triton.jit
def e8m0_scale(amax, EMAX: tl.constexpr, ROUND_UP: tl.constexpr):
    """amax (>= 0, finite) -> (E8M0 byte of S = 2^e, 1/S = 2^-e), exactly, from amax's fp32 bits."""
    bits = amax.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127 - EMAX  # floor(log2(amax)) - emax_elem; a subnormal amax clamps below
    if ROUND_UP:
        # amax <= 1.75 * 2^(E + 8) iff the significand is at most 1.75 (0x600000 in the mantissa field)
        e += ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -127), 127)
    e = tl.where(amax == 0.0, 0, e)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e: 127 - e is in [7, 254] here
    return (e + 127).to(tl.uint8), inv


@triton.jit
def nan_if_not_finite(x):
    """fp32 x with every inf turned into NaN, in one fused multiply-add and no comparison: ``x * 0`` is
    +-0 for a finite x (and adding x back is exact, signed zeros included) and NaN for inf or NaN.

    Everything downstream then needs no special case: Triton's ``tl.max`` drops a NaN operand (the
    hardware max returns the other one), so NaNs take no part in amax, and the fp32 -> fp8 conversion
    turns a NaN into the NaN code 0x7F in both formats."""
    return x * 0.0 + x


@triton.jit
def finite_amax(xn, axis):
    """max |x| over ``axis`` of :func:`nan_if_not_finite` values: the NaNs are skipped, and a group
    with nothing finite has amax 0."""
    amax = tl.max(tl.abs(xn), axis=axis)
    return tl.where(amax == amax, amax, 0.0)


@triton.jit
def _to_fp8(q, E5M2: tl.constexpr):
    if E5M2:
        return q.to(tl.float8e5).to(tl.uint8, bitcast=True)
    return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _encode_own_scale(xn, inv, E5M2: tl.constexpr):
    """Codes of x (inf already NaN) with 1/S from *this group's own* amax: |x / S| is at most
    FP8_MAX * (1 + 3 ulp), which round-to-nearest-even takes to FP8_MAX itself, so no clamp is needed."""
    return _to_fp8(xn * inv, E5M2)


@triton.jit
def _encode(xn, inv, FP8_MAX: tl.constexpr, E5M2: tl.constexpr):
    """Codes of x (inf already NaN) with a scale that need not cover it (MX's floor rule, a delayed
    scale): clamp to +-FP8_MAX first, keeping NaN a NaN, then the RNE cast."""
    q = tl.clamp(xn * inv, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    return _to_fp8(q, E5M2)


@triton.jit
def _mx_bound(inv, FP8_MAX: tl.constexpr, FINITE_BOUND: tl.constexpr):
    """The largest |code| of a block whose scale is S = 2^e, given 1/S = 2^-e: FP8_MAX, or less where
    FP8_MAX * S would pass fp32's maximum (only for e >= 120 in e4m3, 113 in e5m2).  The product
    ``2^-e * 1.875 * 2^127`` is exact, or inf (then FP8_MAX) for e <= 0."""
    return tl.minimum(inv * FINITE_BOUND, FP8_MAX)


@triton.jit
def _encode_bounded(xn, inv, bound, E5M2: tl.constexpr):
    """:func:`_encode` with a bound per group (a tensor broadcastable to ``xn``) instead of FP8_MAX."""
    q = tl.clamp(xn * inv, -bound, bound, propagate_nan=tl.PropagateNan.ALL)
    return _to_fp8(q, E5M2)


@triton.jit
def _finite_abs(x):
    """|x| with NaN and inf counted as 0: they must not set (or poison) a group's scale."""
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)


# -- plain-torch references of the same pieces -----------------------------------------------------


def _finite_abs_ref(xf: torch.Tensor) -> torch.Tensor:
    a = xf.abs()
    return torch.where(a < torch.inf, a, torch.zeros_like(a))


def scale_from_amax(amax: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """The fp32 reconstruction scale S for an amax (any shape, on any device, no host sync):
    ``S = max(amax / FP8_MAX, 2^-126)``, and ``S = 1`` where amax is 0."""
    fmt = _check_fmt(fmt)
    amax = amax.float()
    # A tensor divisor, not a Python number: on CUDA, PyTorch divides by a scalar by multiplying with
    # its reciprocal, which is not correctly rounded (amax / 448 comes out one ulp off now and then).
    s = torch.clamp(amax / torch.full_like(amax, FP8_MAX[fmt]), min=MIN_SCALE)
    return torch.where(amax == 0, torch.ones_like(s), s)


def e8m0_from_amax(amax: torch.Tensor, fmt: str = "e4m3", rounding: str = "floor") -> torch.Tensor:
    """The E8M0 byte (uint8) of the MX scale S = 2^e for an amax: ``e = floor(log2(amax)) - emax_elem``
    (OCP, ``rounding="floor"``) or ``ceil(log2(amax / FP8_MAX))`` (``"up"``); 127 (S = 1) for amax 0."""
    fmt = _check_fmt(fmt)
    if rounding not in ("floor", "up"):
        raise ValueError(f"rounding must be 'floor' (OCP) or 'up' (conservative), got {rounding!r}")
    bits = amax.float().contiguous().view(torch.int32)
    e = (bits >> 23) - 127 - EMAX_ELEM[fmt]
    if rounding == "up":
        e = e + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    e = e.clamp(-127, 127)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    return (e + 127).to(torch.uint8)


def e8m0_to_float(code: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> fp32 values 2^(c - 127), exactly (c = 0 is the subnormal 2^-127; 255 is NaN)."""
    c = code.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 0x00400000), c << 23)
    bits = torch.where(c == 255, torch.full_like(c, 0x7FC00000), bits)
    return bits.view(torch.float32)


def e8m0_inverse_reference(code: torch.Tensor) -> torch.Tensor:
    """1 / S for E8M0 bytes in [0, 254]: 2^(127 - c) as fp32 bits."""
    return ((254 - code.to(torch.int32)) << 23).view(torch.float32)


def encode_reference(xf: torch.Tensor, inv: torch.Tensor, fmt: str, bound: torch.Tensor | None = None) -> torch.Tensor:
    """The reference of :func:`_encode`: fp32 x, broadcastable 1/S -> fp8 codes (NaN code 0x7F); with
    ``bound`` (broadcastable, as :func:`_encode_bounded`), clamped to it instead of FP8_MAX."""
    m = FP8_MAX[fmt] if bound is None else bound
    q = torch.clamp(xf * inv, -m, m).to(FP8_FORMATS[fmt])
    codes = q.view(torch.uint8).clone()
    codes[~torch.isfinite(xf)] = NAN_CODE
    return codes.view(FP8_FORMATS[fmt])


def _pad_to(a: torch.Tensor, gm: int, gk: int) -> torch.Tensor:
    m, k = a.shape
    return torch.nn.functional.pad(a, (0, (-k) % gk, 0, (-m) % gm))


def group_amax_reference(xf: torch.Tensor, gm: int, gk: int) -> torch.Tensor:
    """(M, K) -> (cdiv(M, gm), cdiv(K, gk)) amax of finite |x|, padding with zeros."""
    a = _pad_to(_finite_abs_ref(xf), gm, gk)
    mp, kp = a.shape
    return a.reshape(mp // gm, gm, kp // gk, gk).amax(dim=(1, 3))


def expand_scales(s: torch.Tensor, gm: int, gk: int, m: int, k: int) -> torch.Tensor:
    """Per-group values -> per-element, cropped to (m, k)."""
    return s.repeat_interleave(gm, 0).repeat_interleave(gk, 1)[:m, :k]


def _groups_reference(x: torch.Tensor, gm: int, gk: int, fmt: str) -> Quantized:
    xf = x.float()
    m, k = xf.shape
    s = scale_from_amax(group_amax_reference(xf, gm, gk), fmt)
    inv = 1.0 / s
    return Quantized(encode_reference(xf, expand_scales(inv, gm, gk, m, k), fmt), s)


# -- per tensor: amax pass, finalize, scale-and-cast pass ------------------------------------------


@triton.jit
def _amax_partial_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, finite_amax(nan_if_not_finite(x), 0))


@triton.jit
def _amax_finalize_kernel(partial_ptr, n_partial, amax_ptr, s_ptr, inv_ptr, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    # One program folds the per-program maxima (a few thousand floats) and writes S and 1/S to the
    # device: the cast pass reads them from there, so the host never waits.
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_partial, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(partial_ptr + offs, mask=offs < n_partial, other=0.0))
    amax = tl.max(acc, axis=0)
    s, inv = _fp32_scale(amax, FP8_MAX)
    tl.store(amax_ptr, amax)
    tl.store(s_ptr, s)
    tl.store(inv_ptr, inv)


@triton.jit
def _scale_cast_kernel(x_ptr, inv_ptr, q_ptr, n, FP8_MAX: tl.constexpr, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inv = tl.load(inv_ptr)  # from this tensor's amax, or a given (delayed) scale: clamp
    tl.store(q_ptr + offs, _encode(nan_if_not_finite(x), inv, FP8_MAX, E5M2), mask=mask)


def _tensor_amax_and_scale(x: torch.Tensor, fmt: str):
    n = x.numel()
    grid = max(triton.cdiv(n, TENSOR_BLOCK), 1)
    partial = torch.empty(grid, dtype=torch.float32, device=x.device)
    out = torch.empty(3, dtype=torch.float32, device=x.device)  # amax, S, 1/S
    if n:
        _amax_partial_kernel[(grid,)](x, partial, n, BLOCK=TENSOR_BLOCK, num_warps=TENSOR_WARPS)
    else:
        partial.zero_()
    _amax_finalize_kernel[(1,)](partial, grid, out[0:], out[1:], out[2:], FP8_MAX=FP8_MAX[fmt], BLOCK=FINALIZE_BLOCK)
    return out[0], out[1], out[2:3]


def fold_amax(partial: torch.Tensor, out: torch.Tensor) -> None:
    """Fold per-program maxima ``partial`` (fp32) into ``out[0]`` on the device, in one program (``out``:
    three fp32, of which ``out[1:]`` receive an E4M3 scale and its inverse that the caller may ignore)."""
    _amax_finalize_kernel[(1,)](partial, partial.numel(), out[0:], out[1:], out[2:], FP8_MAX=FP8_MAX["e4m3"],
                                BLOCK=FINALIZE_BLOCK)  # fmt: skip


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the finite elements of ``x`` (0 if none), as a 0-d fp32 device tensor."""
    x = _check_input(x)
    return _tensor_amax_and_scale(x, "e4m3")[0].clone()


def _cast(x: torch.Tensor, inv: torch.Tensor, fmt: str) -> torch.Tensor:
    q = torch.empty(x.shape, dtype=FP8_FORMATS[fmt], device=x.device)
    n = x.numel()
    if n:
        _scale_cast_kernel[(triton.cdiv(n, TENSOR_BLOCK),)](
            x, inv, q.view(torch.uint8), n, FP8_MAX=FP8_MAX[fmt], E5M2=fmt == "e5m2", BLOCK=TENSOR_BLOCK,
            num_warps=TENSOR_WARPS,
        )  # fmt: skip
    return q


def quantize_tensor(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """Per-tensor current scaling: one S for the whole tensor, from this tensor's amax.

    Two passes over ``x``: an amax reduction (per-program maxima, folded by one small program that
    also computes S and 1/S on the device), then the scale-and-cast pass, which reads 1/S from device
    memory.  Returns ``(q, S)``: codes of ``x``'s shape and a 0-d fp32 tensor S."""
    fmt = _check_fmt(fmt)
    x = _check_input(x)
    _, s, inv = _tensor_amax_and_scale(x, fmt)
    return Quantized(_cast(x, inv, fmt), s.clone())


@triton.jit
def _scale_cast_transpose_kernel(
    x_ptr, inv_ptr, q_ptr, qt_ptr, M, K,
    FP8_MAX: tl.constexpr, E5M2: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # One (BM, BK) tile of x, read once, written twice: its codes in place and, transposed, at (k, m)
    # of the (K, M) copy.  The compiler stages the transposed tile through shared memory so that both
    # stores are coalesced.  A 1-D grid, tile rows outermost (a 2-D grid's second extent stops at 65535).
    tiles_k = tl.cdiv(K, BK)
    offs_m = (tl.program_id(0) // tiles_k) * BM + tl.arange(0, BM)
    offs_k = (tl.program_id(0) % tiles_k) * BK + tl.arange(0, BK)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    rows, cols = offs_m.to(tl.int64), offs_k.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    q = _encode(nan_if_not_finite(x), tl.load(inv_ptr), FP8_MAX, E5M2)  # (BM, BK)
    tl.store(q_ptr + rows[:, None] * K + cols[None, :], q, mask=mask)
    tl.store(qt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


def _transposes_in_kernel(x: torch.Tensor) -> bool:
    return x.element_size() <= _TRANSPOSE_IN_KERNEL_MAX_BYTES


def _transposed_codes(q: torch.Tensor) -> torch.Tensor:
    """The (K, M) codes of an (M, K) matrix of codes: a copy, for inputs not transposed in a kernel."""
    return q.view(torch.uint8).t().contiguous().view(q.dtype)


def _cast_transpose(x: torch.Tensor, inv: torch.Tensor, fmt: str) -> tuple:
    if not _transposes_in_kernel(x):
        q = _cast(x, inv, fmt)
        return q, _transposed_codes(q)
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_FORMATS[fmt], device=x.device)
    qt = torch.empty((k, m), dtype=FP8_FORMATS[fmt], device=x.device)
    if q.numel():
        grid = (triton.cdiv(m, TRANSPOSE_TILE) * triton.cdiv(k, TRANSPOSE_TILE),)
        _scale_cast_transpose_kernel[grid](
            x, inv, q.view(torch.uint8), qt.view(torch.uint8), m, k, FP8_MAX=FP8_MAX[fmt], E5M2=fmt == "e5m2",
            BM=TRANSPOSE_TILE, BK=TRANSPOSE_TILE, num_warps=TRANSPOSE_WARPS,
        )  # fmt: skip
    return q, qt


@triton.jit
def _tile(x_ptr, t, tiles_k, M, K, BM: tl.constexpr, BK: tl.constexpr):
    """Tile ``t`` of a row-major (M, K) matrix cut into (BM, BK) tiles, tile rows outermost: its rows,
    columns, mask and values in fp32."""
    rows = (t // tiles_k).to(tl.int64) * BM + tl.arange(0, BM)
    cols = (t % tiles_k).to(tl.int64) * BK + tl.arange(0, BK)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return rows, cols, mask, x


@triton.jit
def _grid_barrier(count_ptr, nprog):
    """Wait until all ``nprog`` programs of the launch have arrived.  Many threads of a program may have
    updated global memory, one arrives for it: a barrier across the program first, so that the
    arrival's release covers every thread's updates."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")
    while tl.atomic_add(count_ptr, 0, sem="acquire") < nprog:
        pass


@triton.jit
def _fused_tensor_kernel(
    x_ptr, q_ptr, qt_ptr, s_ptr, amax_ptr, count_ptr, M, K,
    FP8_MAX: tl.constexpr, E5M2: tl.constexpr, TRANSPOSE: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # Per-tensor current scaling in one launch.  Every program walks its share of the (BM, BK) tiles
    # twice: first for the amax, which it folds into one global maximum (atomic_max); then, once all
    # programs have arrived at a grid-wide barrier (a counter in global memory), for the codes with
    # S from that maximum (and, with TRANSPOSE, the codes of x.T too).  The programs must all be
    # resident at once, so the host launches no more than the GPU holds, cooperatively.  The last
    # program to leave resets the maximum and the counters for the next launch.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles_k = tl.cdiv(K, BK)
    n_tiles = tl.cdiv(M, BM) * tiles_k
    acc = tl.zeros([BM, BK], dtype=tl.float32)
    for t in range(pid, n_tiles, nprog):
        _, _, _, x = _tile(x_ptr, t, tiles_k, M, K, BM, BK)
        acc = tl.maximum(acc, _finite_abs(x))
    tl.atomic_max(amax_ptr, tl.max(tl.max(acc, axis=1), axis=0), sem="relaxed")
    _grid_barrier(count_ptr, nprog)
    amax = tl.atomic_max(amax_ptr, 0.0, sem="acquire")  # reads the maximum (every amax is >= 0)
    s, inv = _fp32_scale(amax, FP8_MAX)
    if pid == 0:
        tl.store(s_ptr, s)
    for t in range(pid, n_tiles, nprog):
        rows, cols, mask, x = _tile(x_ptr, t, tiles_k, M, K, BM, BK)
        q = _encode(nan_if_not_finite(x), inv, FP8_MAX, E5M2)
        tl.store(q_ptr + rows[:, None] * K + cols[None, :], q, mask=mask)
        if TRANSPOSE:
            tl.store(qt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))
    if tl.atomic_add(count_ptr + 1, 1, sem="acq_rel") == nprog - 1:  # the last to leave: reset
        tl.atomic_xchg(count_ptr - 1, 0, sem="relaxed")  # the amax word, as int32 bits (0.0)
        tl.atomic_xchg(count_ptr, 0, sem="relaxed")
        tl.atomic_xchg(count_ptr + 1, 0, sem="relaxed")


_RESIDENT = {}  # (kernel, launch key) -> programs resident at once


def _launch_with_barrier(launcher: Launcher, m: int, k: int, args: tuple, meta: dict, constexprs=None) -> None:
    """Launch a kernel whose programs meet at :func:`_grid_barrier`, over the (M, K) matrix ``args[0]``
    in (FUSED_TILE, FUSED_TILE) tiles: one program per tile, but never more than the GPU holds at once
    (asked of the compiled kernel once per launch key), launched cooperatively.  In CPU mode
    one program walks every tile.  ``constexprs``: ``tuple(meta.items())``, if the caller keeps it.

    ``args`` are tensors, then M and K; every tensor but ``args[0]`` is one this package allocated, its
    dtype fixed by ``meta``, so ``args[0]``'s dtype, each tensor's alignment, M, K and ``meta`` are all
    that the compiled kernel depends on (the key of :class:`kernels.launch.Launcher`)."""
    if kernels.INTERPRETER:
        launcher.fn[(1,)](*args, **meta)
        return
    x = args[0]
    device = x.get_device()
    constexprs = tuple(meta.items()) if constexprs is None else constexprs
    aligned = tuple(a.data_ptr() % 16 == 0 for a in args[:-2])  # the tensors (a slice of words may not be)
    key = (device, x.dtype, aligned, args[-2:], constexprs)
    # Registers and shared memory, hence how many programs fit, belong to one compiled variant: ask for
    # the one these arguments select (the dtype and alignment of x, the sizes' specializations).
    resident = _RESIDENT.get((launcher, key))
    if resident is None:
        compiled = launcher.fn.warmup(*args, grid=(1,), launch_cooperative_grid=True, **meta)
        resident = _RESIDENT[(launcher, key)] = resident_programs(compiled, device)
    grid = (min(triton.cdiv(m, FUSED_TILE) * triton.cdiv(k, FUSED_TILE), resident),)
    launcher(grid, args, key, launch_cooperative_grid=True, **meta)


_FUSED_LAUNCH = Launcher(_fused_tensor_kernel)
_FUSED_SYNC = {}  # (device, stream) -> the barrier's words as the kernel takes them: amax (fp32), counters
_FUSED_META = {}  # (fmt, transpose) -> (the launch's constexprs, as a dict and as a tuple)


def _fused_sync(device: int) -> tuple:
    """The barrier words of the fused kernel for this device and stream, zero between launches (each
    launch leaves them as it found them): ``(amax, counters)``, one fp32 word and two int32 words of one
    buffer.  Per stream, so launches on two streams never share them; during CUDA-graph capture, fresh
    zeros that the graph keeps."""
    if kernels.INTERPRETER:
        words = torch.zeros(3, dtype=torch.int32)
    elif torch.cuda.is_current_stream_capturing():
        words = torch.zeros(3, dtype=torch.int32, device="cuda")
    else:
        key = (device, torch.cuda.current_stream(device).cuda_stream)
        views = _FUSED_SYNC.get(key)
        if views is None:
            words = torch.zeros(3, dtype=torch.int32, device="cuda")
            views = _FUSED_SYNC[key] = (words[:1].view(torch.float32), words[1:])
        return views
    return words[:1].view(torch.float32), words[1:]


def _fused_meta(fmt: str, transpose: bool) -> tuple:
    meta = _FUSED_META.get((fmt, transpose))
    if meta is None:
        d = {"FP8_MAX": FP8_MAX[fmt], "E5M2": fmt == "e5m2", "TRANSPOSE": transpose,
             "BM": FUSED_TILE, "BK": FUSED_TILE, "num_warps": FUSED_WARPS}  # fmt: skip
        meta = _FUSED_META[(fmt, transpose)] = (d, tuple(d.items()))
    return meta


def quantize_tensor_fused(x: torch.Tensor, fmt: str = "e4m3", transpose: bool = False) -> tuple:
    """Per-tensor current scaling of a matrix in **one kernel launch**: amax, S, the codes and, with
    ``transpose``, the codes of ``x.T``: ``(Quantized(q, S), qt or None)``, bit for bit what
    :func:`quantize_tensor_and_transpose` (or :func:`quantize_tensor`) returns.

    The launch's programs meet at a grid-wide barrier between the amax and the cast, so S never
    leaves the device and no second kernel is launched; the cast reads ``x`` a second time (from L2
    when ``x`` fits there).  In CPU mode one program does both walks.  For fp32 ``x`` the codes of ``x.T``
    are a copy of the codes, transposed (see :func:`_transposes_in_kernel`)."""
    fmt = _check_fmt(fmt)
    x = _check_matrix(x)
    if transpose and not _transposes_in_kernel(x):
        out, _ = quantize_tensor_fused(x, fmt, False)
        return out, _transposed_codes(out.q)
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_FORMATS[fmt], device=x.device)
    qt = torch.empty((k, m), dtype=FP8_FORMATS[fmt], device=x.device) if transpose else q
    s = torch.empty((), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        s.fill_(1.0)
        return Quantized(q, s), (qt if transpose else None)
    amax, counters = _fused_sync(-1 if kernels.INTERPRETER else x.get_device())
    args = (x, q.view(torch.uint8), qt.view(torch.uint8), s, amax, counters, m, k)
    meta, constexprs = _fused_meta(fmt, transpose)
    _launch_with_barrier(_FUSED_LAUNCH, m, k, args, meta, constexprs)
    return Quantized(q, s), (qt if transpose else None)


def quantize_tensor_and_transpose(x: torch.Tensor, fmt: str = "e4m3", s: torch.Tensor | None = None) -> tuple:
    """Per-tensor scaling of a matrix and of its transpose at once: ``(Quantized(q, S), qt)`` with
    ``qt`` the ``(K, M)`` codes of ``x.T``, bit for bit ``q.T`` (one S for both, so the transposed
    operand of a backward GEMM is the forward's codes, transposed).

    One read of ``x`` for the codes and their transpose (plus the amax pass of :func:`quantize_tensor`
    when ``s`` is None; with ``s``, a given reconstruction scale as in :func:`quantize_tensor_with_scale`,
    none).  A transpose of the codes afterwards would read and write the codes once more."""
    fmt = _check_fmt(fmt)
    x = _check_matrix(x)
    if s is None:
        _, s, inv = _tensor_amax_and_scale(x, fmt)
        s = s.clone()
    else:
        _check_given_scale(s, x)
        inv = _inverse_scale(s).reshape(1)
    q, qt = _cast_transpose(x, inv, fmt)
    return Quantized(q, s), qt


def quantize_tensor_and_transpose_reference(x: torch.Tensor, fmt: str = "e4m3", s: torch.Tensor | None = None) -> tuple:
    """Plain-torch :func:`quantize_tensor_and_transpose`: the per-tensor reference, its codes transposed."""
    x = _check_matrix(x, on_device=False)
    if s is None:
        out = quantize_tensor_reference(x, fmt)
    else:
        out = Quantized(quantize_tensor_with_scale_reference(x, s, fmt), s)
    return out, out.q.t().contiguous()


def quantize_tensor_with_scale(x: torch.Tensor, s: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """The cast pass alone, with a given reconstruction scale S (one element, on ``x``'s device): what
    delayed scaling runs.  1/S is computed on the device as ``1 / S`` (fp32, correctly rounded).

    S should be positive and finite.  One so small that 1/S overflows (S = 0, or below about 2.9e-39)
    is read as 1/S = FLT_MAX: zeros stay zero and everything else saturates, rather than 0 x inf
    turning zeros into NaN codes.  (The value is not checked on the host: that would cost a device
    sync on every call of a delayed-scaling step.)"""
    fmt = _check_fmt(fmt)
    x = _check_input(x)
    _check_given_scale(s, x)
    return _cast(x, _inverse_scale(s).reshape(1), fmt)


def _check_given_scale(s, x: torch.Tensor) -> None:
    if not isinstance(s, torch.Tensor) or s.numel() != 1:
        raise ValueError(f"s must be a one-element tensor (the reconstruction scale S), got {s!r}")
    if s.device != x.device:
        raise ValueError(f"s is on {s.device} but x is on {x.device}: keep the scale on x's device")


def _inverse_scale(s: torch.Tensor) -> torch.Tensor:
    """fp32 ``1 / S``, with an overflowed reciprocal (S = 0, or S subnormal) held at FLT_MAX."""
    return (1.0 / s.float()).clamp(max=torch.finfo(torch.float32).max)


def quantize_tensor_reference(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """Plain-torch :func:`quantize_tensor`."""
    fmt = _check_fmt(fmt)
    x = _check_input(x, on_device=False)
    xf = x.float()
    amax = _finite_abs_ref(xf).amax() if xf.numel() else torch.zeros((), device=x.device)
    s = scale_from_amax(amax, fmt)
    return Quantized(encode_reference(xf, 1.0 / s, fmt), s)


def quantize_tensor_with_scale_reference(x: torch.Tensor, s: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    fmt = _check_fmt(fmt)
    return encode_reference(_check_input(x, on_device=False).float(), _inverse_scale(s).reshape(()), fmt)


# -- groups along the row: per row, 1x128, MXFP8 ---------------------------------------------------


@triton.jit
def _row_groups_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    n_groups,
    G: tl.constexpr,  # elements per group (a power of two: 32, 128, or next_pow2(K) for per-row)
    BM: tl.constexpr,  # rows per program
    NG: tl.constexpr,  # groups per program along the row
    FP8_MAX: tl.constexpr,
    E5M2: tl.constexpr,
    MX: tl.constexpr,  # E8M0 power-of-two scales instead of fp32 ones
    EMAX: tl.constexpr,
    FINITE_BOUND: tl.constexpr,  # MX: see _mx_bound
    ROUND_UP: tl.constexpr,
    EVEN: tl.constexpr,  # every program's tile lies inside the matrix: no masks
    I64: tl.constexpr,  # offsets past 2^31 elements: int64 arithmetic
):
    pid_m = tl.program_id(0)
    pid_g = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)  # (BM,)
    groups = pid_g * NG + tl.arange(0, NG)  # (NG,)
    # A 3-D tile (BM, NG, G): each group's G elements are contiguous (16-byte vector loads), and the
    # group reduction is a reduction over the last axis, with no reshape.
    cols = groups[None, :, None] * G + tl.arange(0, G)[None, None, :]  # (1, NG, G)
    if I64:
        offs = rows.to(tl.int64)[:, None, None] * K + cols  # (BM, NG, G)
    else:
        offs = rows[:, None, None] * K + cols
    s_offs = rows[:, None] * n_groups + groups[None, :]  # (BM, NG)
    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        mask = (rows[:, None, None] < M) & (cols < K)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    xn = nan_if_not_finite(x.to(tl.float32))
    amax = finite_amax(xn, 2)  # (BM, NG)
    if MX:
        s, inv = e8m0_scale(amax, EMAX, ROUND_UP)
        bound = _mx_bound(inv, FP8_MAX, FINITE_BOUND)  # the floor rule can leave values above it
        c = _encode_bounded(xn, inv[:, :, None], bound[:, :, None], E5M2)
    else:
        s, inv = _fp32_scale(amax, FP8_MAX)
        c = _encode_own_scale(xn, inv[:, :, None], E5M2)
    if EVEN:
        tl.store(q_ptr + offs, c)
        tl.store(s_ptr + s_offs, s)
    else:
        tl.store(q_ptr + offs, c, mask=mask)
        tl.store(s_ptr + s_offs, s, mask=(rows[:, None] < M) & (groups[None, :] < n_groups))


@triton.jit
def _row_two_pass_kernel(
    x_ptr, q_ptr, s_ptr, K, FP8_MAX: tl.constexpr, E5M2: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    # Rows too long for registers: an amax loop, then a cast loop (the row is then in L2).
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(nan_if_not_finite(x)))  # tl.maximum, like tl.max, drops NaNs
    s, inv = _fp32_scale(finite_amax(acc, 0), FP8_MAX)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * K + cols, _encode_own_scale(nan_if_not_finite(x), inv, E5M2), mask=cols < K)
    tl.store(s_ptr + row, s)


def _launch_row_groups(x2, q, s, group, per_program, warps, fmt, mx=False, round_up=False):
    """Launch :func:`_row_groups_kernel` with ``per_program`` groups in each program: as many along
    the row as the row has (up to ``per_program``), the rest as further rows."""
    m, k = x2.shape
    n_groups = triton.cdiv(k, group)
    ng = min(per_program, triton.next_power_of_2(n_groups))
    bm = max(1, per_program // ng)
    even = m % bm == 0 and n_groups % ng == 0 and k % group == 0
    grid = (triton.cdiv(m, bm), triton.cdiv(n_groups, ng))
    args = (x2, q.view(torch.uint8), s, m, k, n_groups)
    meta = dict(
        G=group, BM=bm, NG=ng, FP8_MAX=FP8_MAX[fmt], E5M2=fmt == "e5m2", MX=mx, EMAX=EMAX_ELEM[fmt],
        FINITE_BOUND=FINITE_BOUND[fmt], ROUND_UP=round_up, EVEN=even, I64=x2.numel() >= INT32_LIMIT, num_warps=warps,
    )  # fmt: skip
    _ROW_GROUPS_LAUNCH(grid, args, (spec_key(*args), tuple(meta.items())), **meta)


_ROW_GROUPS_LAUNCH = Launcher(_row_groups_kernel)


def quantize_rowwise(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """One fp32 S per row (per token of an activation, per output channel of a ``(N, K)`` weight).

    Rows of up to ``ROW_MAX_ONE_PASS`` elements are read once (amax and cast from registers).  ``x`` of
    shape ``(..., K)``; returns codes of that shape and S of shape ``(..., 1)``."""
    fmt = _check_fmt(fmt)
    x = _check_input(x, min_dim=1)
    x2 = _rows(x)
    m, k = x2.shape
    q = torch.empty(x.shape, dtype=FP8_FORMATS[fmt], device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return Quantized(q, s)
    if k <= ROW_MAX_ONE_PASS:
        width = triton.next_power_of_2(max(k, 1))
        _launch_row_groups(x2, q, s, width, max(1, ROW_BLOCK_ELEMS // width), ROW_WARPS, fmt)
    else:
        _row_two_pass_kernel[(m,)](
            x2, q.view(torch.uint8), s, k, FP8_MAX=FP8_MAX[fmt], E5M2=fmt == "e5m2", BLOCK=ROW_BLOCK_ELEMS,
            num_warps=ROW_WARPS,
        )  # fmt: skip
    return Quantized(q, s)


@triton.jit
def _columns_kernel(
    x_ptr, qt_ptr, s_ptr, colmax_ptr, count_ptr, M, K,
    FP8_MAX: tl.constexpr, E5M2: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # Per-row scaling of x.T without writing x.T in the wide format: one S per *column* of x, codes
    # stored transposed.  As in _fused_tensor_kernel, the programs walk their tiles twice with a
    # grid-wide barrier between: first every column's amax (atomic_max into a zeroed vector of K),
    # then S and 1/S per column and the codes, written at (k, m) of the (K, M) result.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles_k = tl.cdiv(K, BK)
    n_tiles = tl.cdiv(M, BM) * tiles_k
    for t in range(pid, n_tiles, nprog):
        _, cols, _, x = _tile(x_ptr, t, tiles_k, M, K, BM, BK)
        tl.atomic_max(colmax_ptr + cols, tl.max(_finite_abs(x), axis=0), mask=cols < K, sem="relaxed")
    _grid_barrier(count_ptr, nprog)
    for t in range(pid, n_tiles, nprog):
        rows, cols, mask, x = _tile(x_ptr, t, tiles_k, M, K, BM, BK)
        amax = tl.atomic_max(colmax_ptr + cols, 0.0, mask=cols < K, sem="acquire")  # reads (BK,)
        s, inv = _fp32_scale(tl.where(cols < K, amax, 0.0), FP8_MAX)
        if t < tiles_k:  # the first row of tiles writes the scales
            tl.store(s_ptr + cols, s, mask=cols < K)
        q = _encode_own_scale(nan_if_not_finite(x), inv[None, :], E5M2)
        tl.store(qt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


_COLUMNS_LAUNCH = Launcher(_columns_kernel)


def quantize_columns_transposed(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """Per-row scaling of ``x.T``, read from ``x`` itself: ``(qt, S)`` with ``qt`` the ``(K, M)`` codes
    and ``S`` ``(K, 1)``, bit for bit ``quantize_rowwise(x.T.contiguous())``, without the wide
    transposed copy (which reads and writes ``x`` once more, and strided).

    One launch: a grid-wide barrier separates the column maxima from the cast (see
    :func:`quantize_tensor_fused`), plus the zeroing of K maxima.  What a rowwise FP8 linear layer's
    backward needs for its transposed operands (``W^T``, ``dY^T``, ``X^T``).  For fp32 ``x``, the wide
    transposed copy after all (see :func:`_transposes_in_kernel`)."""
    fmt = _check_fmt(fmt)
    x = _check_matrix(x)
    if not _transposes_in_kernel(x):  # the wide transposed copy after all (see _transposes_in_kernel)
        return quantize_rowwise(x.t().contiguous(), fmt)
    m, k = x.shape
    qt = torch.empty((k, m), dtype=FP8_FORMATS[fmt], device=x.device)
    s = torch.empty((k, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return Quantized(qt, s)
    words = torch.zeros(k + 1, dtype=torch.int32, device=x.device)  # K column maxima (fp32 bits), a counter
    args = (x, qt.view(torch.uint8), s, words[:k].view(torch.float32), words[k:], m, k)  # see _launch_with_barrier
    meta = {"FP8_MAX": FP8_MAX[fmt], "E5M2": fmt == "e5m2", "BM": FUSED_TILE, "BK": FUSED_TILE,
            "num_warps": FUSED_WARPS}  # fmt: skip
    _launch_with_barrier(_COLUMNS_LAUNCH, m, k, args, meta)
    return Quantized(qt, s)


def quantize_rowwise_reference(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    fmt = _check_fmt(fmt)
    x = _check_input(x, min_dim=1, on_device=False)
    x2 = _rows(x)
    q, s = _groups_reference(x2, 1, max(x2.shape[1], 1), fmt)
    return Quantized(q.reshape(x.shape), s.reshape(*x.shape[:-1], 1))


def quantize_1x128(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """One fp32 S per 128 consecutive elements of a row (DeepSeek-V3's activation groups).

    ``x`` of shape ``(..., K)``; S of shape ``(..., cdiv(K, 128))``; a last partial group is masked."""
    fmt = _check_fmt(fmt)
    x = _check_input(x, min_dim=1)
    x2 = _rows(x)
    m, k = x2.shape
    q = torch.empty(x.shape, dtype=FP8_FORMATS[fmt], device=x.device)
    s = torch.empty((*x.shape[:-1], triton.cdiv(k, GROUP_1X128)), dtype=torch.float32, device=x.device)
    if q.numel():
        _launch_row_groups(x2, q, s, GROUP_1X128, G128_GROUPS, G128_WARPS, fmt)
    return Quantized(q, s)


def quantize_1x128_reference(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    fmt = _check_fmt(fmt)
    x = _check_input(x, min_dim=1, on_device=False)
    x2 = _rows(x)
    q, s = _groups_reference(x2, 1, GROUP_1X128, fmt)
    return Quantized(q.reshape(x.shape), s.reshape(*x.shape[:-1], s.shape[-1]))


def _check_rounding(rounding):
    if rounding not in ("floor", "up"):
        raise ValueError(f"rounding must be 'floor' (OCP MX v1.0) or 'up' (conservative), got {rounding!r}")
    return rounding == "up"


def quantize_mxfp8(x: torch.Tensor, fmt: str = "e4m3", rounding: str = "floor") -> Quantized:
    """MXFP8: blocks of 32 consecutive elements of a row share S = 2^e, stored as E8M0 bytes (uint8).

    ``rounding="floor"``: OCP's ``e = floor(log2(amax)) - emax_elem`` (elements above FP8_MAX * S
    saturate); ``"up"``: ``e = ceil(log2(amax / FP8_MAX))`` (nothing saturates, but in blocks whose
    amax is above 1.75 x 2^127, where the codes stop before ``q * S`` would overflow: module docstring).  ``x`` of shape
    ``(..., K)``; scales of shape ``(..., cdiv(K, 32))``, row-major (the layout ``tl.dot_scaled``
    reads).  Returns ``(q, scale_e8m0)``."""
    fmt = _check_fmt(fmt)
    round_up = _check_rounding(rounding)
    x = _check_input(x, min_dim=1)
    x2 = _rows(x)
    m, k = x2.shape
    q = torch.empty(x.shape, dtype=FP8_FORMATS[fmt], device=x.device)
    s = torch.empty((*x.shape[:-1], triton.cdiv(k, MX_BLOCK)), dtype=torch.uint8, device=x.device)
    if q.numel():
        _launch_row_groups(x2, q, s, MX_BLOCK, MX_GROUPS, MX_WARPS, fmt, mx=True, round_up=round_up)
    return Quantized(q, s)


def quantize_mxfp8_reference(x: torch.Tensor, fmt: str = "e4m3", rounding: str = "floor") -> Quantized:
    fmt = _check_fmt(fmt)
    _check_rounding(rounding)
    x = _check_input(x, min_dim=1, on_device=False)
    xf = _rows(x).float()
    m, k = xf.shape
    code = e8m0_from_amax(group_amax_reference(xf, 1, MX_BLOCK), fmt, rounding)
    inv = e8m0_inverse_reference(code)
    bound = torch.clamp(inv * FINITE_BOUND[fmt], max=FP8_MAX[fmt])
    q = encode_reference(xf, expand_scales(inv, 1, MX_BLOCK, m, k), fmt, expand_scales(bound, 1, MX_BLOCK, m, k))
    return Quantized(q.reshape(x.shape), code.reshape(*x.shape[:-1], code.shape[-1]))


# -- 128x128 blocks ------------------------------------------------------------------------------


@triton.jit
def _block_kernel(
    x_ptr, q_ptr, s_ptr, M, K, n_bk, B: tl.constexpr, FP8_MAX: tl.constexpr, E5M2: tl.constexpr,
    EVEN: tl.constexpr, I64: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * B + tl.arange(0, B)
    cols = pid_k * B + tl.arange(0, B)
    if I64:
        offs = rows.to(tl.int64)[:, None] * K + cols[None, :]  # (B, B)
    else:
        offs = rows[:, None] * K + cols[None, :]
    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    xn = nan_if_not_finite(x.to(tl.float32))
    s, inv = _fp32_scale(finite_amax(tl.max(tl.abs(xn), axis=1), 0), FP8_MAX)
    c = _encode_own_scale(xn, inv, E5M2)
    if EVEN:
        tl.store(q_ptr + offs, c)
    else:
        tl.store(q_ptr + offs, c, mask=mask)
    tl.store(s_ptr + pid_m * n_bk + pid_k, s)


def quantize_128x128(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    """One fp32 S per 128x128 block of a 2-D ``(N, K)`` matrix (DeepSeek-V3's weight blocks).

    Returns codes of ``x``'s shape and S of shape ``(cdiv(N, 128), cdiv(K, 128))``; edge blocks are
    masked."""
    fmt = _check_fmt(fmt)
    x = _check_input(x)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix for 128x128 blocks, got shape {tuple(x.shape)}")
    m, k = x.shape
    n_bm, n_bk = triton.cdiv(m, BLOCK_128X128), triton.cdiv(k, BLOCK_128X128)
    q = torch.empty(x.shape, dtype=FP8_FORMATS[fmt], device=x.device)
    s = torch.empty((n_bm, n_bk), dtype=torch.float32, device=x.device)
    if q.numel():
        _block_kernel[(n_bm, n_bk)](
            x, q.view(torch.uint8), s, m, k, n_bk, B=BLOCK_128X128, FP8_MAX=FP8_MAX[fmt], E5M2=fmt == "e5m2",
            EVEN=m % BLOCK_128X128 == 0 and k % BLOCK_128X128 == 0, I64=x.numel() >= INT32_LIMIT,
            num_warps=B128_WARPS,
        )  # fmt: skip
    return Quantized(q, s)


def quantize_128x128_reference(x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
    fmt = _check_fmt(fmt)
    x = _check_input(x, on_device=False)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix for 128x128 blocks, got shape {tuple(x.shape)}")
    return _groups_reference(x, BLOCK_128X128, BLOCK_128X128, fmt)


# -- dequantization ----------------------------------------------------------------------------------


@triton.jit
def _dequant_kernel(
    q_ptr, s_ptr, y_ptr, M, K, GM, GK, s_stride, E8M0: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_k * BK + tl.arange(0, BK)
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    q = tl.load(q_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s_offs = (rows // GM).to(tl.int64)[:, None] * s_stride + (cols // GK)[None, :]  # (BM, BK), cached gathers
    s = tl.load(s_ptr + s_offs, mask=mask, other=1)
    if E8M0:
        c = s.to(tl.int32)
        bits = tl.where(c == 0, 0x00400000, c << 23)
        bits = tl.where(c == 255, 0x7FC00000, bits)
        s = bits.to(tl.float32, bitcast=True)
    tl.store(y_ptr + offs, (q * s).to(y_ptr.dtype.element_ty), mask=mask)


_GROUPS = {"row": None, "1x128": (1, GROUP_1X128), "128x128": (BLOCK_128X128, BLOCK_128X128), "mxfp8": (1, MX_BLOCK)}


def _dequant_args(q, s, granularity):
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
    if not isinstance(q, torch.Tensor) or q.dtype not in FP8_FORMATS.values():
        raise TypeError(f"q must be a float8_e4m3fn or float8_e5m2 tensor, got {getattr(q, 'dtype', type(q))}")
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"s must be a torch.Tensor of scales, got {type(s).__name__}")
    want_dtype = torch.uint8 if granularity == "mxfp8" else torch.float32
    if s.dtype != want_dtype:
        raise TypeError(f"s must have dtype {want_dtype} for granularity {granularity!r}, got {s.dtype}")
    if granularity == "tensor":
        if s.numel() != 1:
            raise ValueError(f"s must have one element for a per-tensor scale, got shape {tuple(s.shape)}")
        k = q.shape[-1] if q.dim() else 1
        q2 = q.reshape(-1, k)
        return q2, s.reshape(1, 1), q2.shape[0], k
    if q.dim() < 1 or (granularity == "128x128" and q.dim() != 2):
        raise ValueError(f"q has shape {tuple(q.shape)}, which granularity {granularity!r} cannot have")
    q2 = _rows(q)
    m, k = q2.shape
    gm, gk = _GROUPS[granularity] or (1, max(k, 1))
    want = (triton.cdiv(m, gm), triton.cdiv(k, gk))
    if s.numel() != want[0] * want[1] or (s.dim() and s.shape[-1] != want[1]):
        raise ValueError(f"s has shape {tuple(s.shape)}, but q of shape {tuple(q.shape)} needs {want} scales")
    return q2, s.reshape(want), gm, gk


def dequantize(q: torch.Tensor, s: torch.Tensor, granularity: str, out_dtype=torch.float32) -> torch.Tensor:
    """``S * q`` for every element, S chosen by ``granularity`` ("tensor", "row", "1x128", "128x128",
    "mxfp8"); returns ``out_dtype``: the product correctly rounded to it, once (exact in fp32 when S is
    a power of two, as MXFP8's is; an fp32 scale times a code is rounded in about a third of cases).
    NaN codes give NaN."""
    q2, s2, gm, gk = _dequant_args(q, s, granularity)
    if out_dtype not in INPUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.float32, torch.bfloat16 or torch.float16, got {out_dtype}")
    check_device(q, "q")
    q2, s2 = q2.contiguous(), s2.contiguous()
    m, k = q2.shape
    y = torch.empty((m, k), dtype=out_dtype, device=q.device)
    if y.numel():
        grid = (triton.cdiv(m, DEQUANT_BM), triton.cdiv(k, DEQUANT_BK))
        _dequant_kernel[grid](
            q2, s2, y, m, k, gm, gk, s2.shape[1], E8M0=granularity == "mxfp8", BM=DEQUANT_BM, BK=DEQUANT_BK,
            num_warps=DEQUANT_WARPS,
        )  # fmt: skip
    return y.reshape(q.shape)


def dequantize_reference(q: torch.Tensor, s: torch.Tensor, granularity: str, out_dtype=torch.float32) -> torch.Tensor:
    q2, s2, gm, gk = _dequant_args(q, s, granularity)
    m, k = q2.shape
    sf = e8m0_to_float(s2) if granularity == "mxfp8" else s2.float()
    y = q2.float() * expand_scales(sf, gm, gk, m, k)
    return y.to(out_dtype).reshape(q.shape)


# -- dispatch ----------------------------------------------------------------------------------------

_QUANTIZERS = {
    "tensor": (quantize_tensor, quantize_tensor_reference),
    "row": (quantize_rowwise, quantize_rowwise_reference),
    "1x128": (quantize_1x128, quantize_1x128_reference),
    "128x128": (quantize_128x128, quantize_128x128_reference),
    "mxfp8": (quantize_mxfp8, quantize_mxfp8_reference),
}


def quantize(x: torch.Tensor, granularity: str, fmt: str = "e4m3", reference: bool = False, **kw) -> Quantized:
    """Quantize ``x`` with the named granularity (kernel, or its plain-torch reference)."""
    if granularity not in _QUANTIZERS:
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
    return _QUANTIZERS[granularity][int(reference)](x, fmt, **kw)


def scale_bytes_per_element(granularity: str, shape=(16384, 8192)) -> float:
    """Scale bytes per element of a ``(M, K)`` tensor: the payload overhead of the granularity."""
    m, k = shape
    counts = {
        "tensor": (1, 4),
        "row": (m, 4),
        "1x128": (m * triton.cdiv(k, 128), 4),
        "128x128": (triton.cdiv(m, 128) * triton.cdiv(k, 128), 4),
        "mxfp8": (m * triton.cdiv(k, 32), 1),
    }
    if granularity not in counts:
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
    n, size = counts[granularity]
    return n * size / (m * k)


def swizzle_mx_scales(s: torch.Tensor) -> torch.Tensor:
    """Row-major E8M0 scales ``(M, G)`` -> the 128x4-tiled order that cuBLAS's MX GEMMs and Blackwell's
    block-scaled MMA read, as a flat uint8 tensor: padded with zeros to ``(cdiv(M, 128) * 128,
    cdiv(G, 4) * 4)``; tiles of 128 rows x 4 scales in row-major tile order, each stored as
    ``(32, 4, 4)`` with the scale of tile row ``r``, column ``c`` at ``[r % 32, r // 32, c]``."""
    if not isinstance(s, torch.Tensor) or s.dim() != 2:
        raise ValueError(f"s must be a 2-D tensor of E8M0 scales (M, K // 32), got {getattr(s, 'shape', s)!r}")
    m, g = s.shape
    mp, gp = triton.cdiv(m, 128) * 128, triton.cdiv(g, 4) * 4
    p = torch.nn.functional.pad(s, (0, gp - g, 0, mp - m))
    tiles = p.reshape(mp // 128, 4, 32, gp // 4, 4).permute(0, 3, 2, 1, 4)  # (tile row, tile col, r % 32, r // 32, c)
    return tiles.contiguous().reshape(-1)


# -- delayed scaling ---------------------------------------------------------------------------------


class DelayedScaling:
    """Per-tensor delayed scaling: the scale of this step comes from the amax of earlier steps.

    ``amax_history`` (on the device) holds the last ``history_len`` amaxes, newest first.  The scale
    is ``S = scale_from_amax(A * 2^margin)`` with ``A`` the history's maximum (``algo="max"``) or its
    newest entry (``"most_recent"``); an empty (all-zero) history gives S = 1.  :meth:`quantize` casts
    with that S, then records this tensor's amax: a spike larger than ``FP8_MAX * S`` saturates, and
    only the *next* call's scale reflects it.  Everything stays on the device (no host sync); the
    history is state that checkpoints must save (:meth:`state_dict`) and that data-parallel ranks
    must agree on.
    """

    def __init__(self, history_len: int = 16, margin: int = 0, algo: str = "max", fmt: str = "e4m3", device=None):
        if not isinstance(history_len, int) or history_len < 1:
            raise ValueError(f"history_len must be a positive int, got {history_len!r}")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"algo must be 'max' or 'most_recent', got {algo!r}")
        if not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin must be a non-negative int (powers of two of headroom), got {margin!r}")
        self.fmt = _check_fmt(fmt)
        self.margin = margin
        self.algo = algo
        if device is None:
            device = default_device()
        self.amax_history = torch.zeros(history_len, dtype=torch.float32, device=device)

    def scale(self) -> torch.Tensor:
        """The reconstruction scale S this step uses (0-d fp32, on the device)."""
        a = self.amax_history.max() if self.algo == "max" else self.amax_history[0]
        return scale_from_amax(a * 2.0**self.margin, self.fmt)

    def update(self, amax: torch.Tensor) -> None:
        """Push an amax (a device tensor) into the history, dropping the oldest.  In place: the history
        stays one tensor, which ``torch.compile`` can update inside a graph (and CUDA graphs replay)."""
        h = self.amax_history
        h.copy_(torch.cat([amax.reshape(1).to(h), h[:-1]]))

    def quantize(self, x: torch.Tensor, reference: bool = False) -> Quantized:
        """Cast ``x`` with the scale from the history, then record its amax.  Returns ``(q, S)``."""
        s = self.scale()
        if reference:
            q = quantize_tensor_with_scale_reference(x, s, self.fmt)
            amax = _finite_abs_ref(x.float()).amax()
        else:
            q = quantize_tensor_with_scale(x, s, self.fmt)
            amax = tensor_amax(x)
        self.update(amax)
        return Quantized(q, s)

    def state_dict(self) -> dict:
        return {"amax_history": self.amax_history.clone(), "margin": self.margin, "algo": self.algo, "fmt": self.fmt}

    def load_state_dict(self, state: dict) -> None:
        self.amax_history = state["amax_history"].clone().to(self.amax_history.device)
        self.margin, self.algo, self.fmt = state["margin"], state["algo"], state["fmt"]


__all__ = [
    "BLOCK_128X128",
    "DelayedScaling",
    "E8M0_BIAS",
    "EMAX_ELEM",
    "fold_amax",
    "FP8_FORMATS",
    "FP8_MAX",
    "GRANULARITIES",
    "GROUP_1X128",
    "MIN_SCALE",
    "MX_BLOCK",
    "NAN_CODE",
    "Quantized",
    "dequantize",
    "dequantize_reference",
    "e8m0_from_amax",
    "e8m0_inverse_reference",
    "e8m0_scale",
    "e8m0_to_float",
    "encode_reference",
    "expand_scales",
    "finite_amax",
    "group_amax_reference",
    "nan_if_not_finite",
    "quantize",
    "quantize_128x128",
    "quantize_128x128_reference",
    "quantize_1x128",
    "quantize_1x128_reference",
    "quantize_mxfp8",
    "quantize_mxfp8_reference",
    "quantize_columns_transposed",
    "quantize_rowwise",
    "quantize_rowwise_reference",
    "quantize_tensor",
    "quantize_tensor_and_transpose",
    "quantize_tensor_and_transpose_reference",
    "quantize_tensor_fused",
    "quantize_tensor_reference",
    "quantize_tensor_with_scale",
    "quantize_tensor_with_scale_reference",
    "scale_bytes_per_element",
    "scale_from_amax",
    "swizzle_mx_scales",
    "tensor_amax",
]
