"""FP4 (E2M1) with block scales: the NVFP4 and MXFP4 formats, their quantizers, packing and
dequantization.

Chapter 6 and Lab 06 (FP4 weight-only).  Entry points: :func:`quantize_fp4`, :func:`dequantize_fp4`,
:func:`fake_quantize`, :func:`pack`, :func:`unpack`, each kernel with its ``*_reference``; the GEMMs
that read these weights are in :mod:`kernels.w4a16`, the rotation in :mod:`kernels.hadamard`.

The element format is E2M1 (:data:`kernels.formats.E2M1`): a sign and eight magnitudes
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``, no inf, no NaN.  Four bits cannot carry a tensor's range, so every
small block of consecutive elements along a row (the GEMM's K axis) shares a scale:

* **MXFP4** (OCP MX v1.0): blocks of 32, one E8M0 byte each, ``S = 2^e`` with OCP's rule
  ``e = floor(log2(block_amax)) - 2`` (2 is E2M1's largest exponent: 6 = 1.5 * 2^2), the same
  computation as MXFP8's (:func:`kernels.quantize.e8m0_scale` with ``EMAX = 2``).  Elements whose
  scaled value exceeds 6 saturate to 6.  4 + 8/32 = 4.25 bits per element.
* **NVFP4**: blocks of 16, one E4M3 byte each, plus one fp32 scale for the whole tensor (two levels).
  ``tensor_scale = amax / (448 * 6)`` and ``block_scale = e4m3(block_amax / (6 * tensor_scale))``, so
  the block scales use E4M3's whole range; an element is reconstructed as
  ``x ~= q * block_scale * tensor_scale``.  4 + 8/16 = 4.5 bits per element (the one fp32 is free).

Conventions
-----------
* Scales are *reconstruction* scales: ``x ~= S * q``.  Per block, ``1 / S`` is computed once, correctly
  rounded (``tl.math.div_rn`` in the kernels, IEEE ``/`` in the references), and each element is
  multiplied by it; the references do the same fp32 operations in the same order, so kernel and
  reference agree bit for bit.
* Rounding to E2M1 is round to nearest, ties to even (even codes win: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
  1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at 6; the sign of ``-0.0`` and of negative values
  that round to zero is kept (code 8, ``-0``), as ml_dtypes' ``float4_e2m1fn`` does.  ``stochastic=True``
  rounds up with probability equal to the distance from the lower neighbour (for gradients, as in the
  NVFP4 training recipe), with Philox bits ``tl.randint(seed, i)`` for element ``i`` of the row-major
  tensor (:func:`kernels.stochastic.random_bits` gives the same words on the host).
* Packing: two codes per byte along the row, **element 2i in the low nibble, element 2i+1 in the high
  nibble**, the order of ``torch.float4_e2m1fn_x2`` (``packed.view(torch.float4_e2m1fn_x2)`` is what
  ``torch._scaled_mm`` reads).  Codes ``(M, K)`` -> bytes ``(M, K // 2)``.
* Scale layouts, row-major, one per block: NVFP4 ``(M, K // 16)`` ``float8_e4m3fn`` and a 0-d fp32 tensor
  scale; MXFP4 ``(M, K // 32)`` uint8 E8M0 (what ``tl.dot_scaled`` reads;
  :func:`kernels.quantize.swizzle_mx_scales` gives cuBLAS's tiled order).  ``K`` must be a multiple of
  the block size; the leading dimensions are flattened into rows.

Policies
--------
* An all-zero block gets ``S = 1`` (E8M0 byte 127) in MXFP4 and block scale 0 in NVFP4 (E4M3 has a
  zero); its codes are 0.  An all-zero tensor gets ``tensor_scale = 1``.  The tensor scale is floored at
  2^-126 so that ``1 / tensor_scale`` stays finite; where ``S = block_scale * tensor_scale`` is still
  an fp32 subnormal (a tensor of amax below 7e-38), the elements are multiplied by ``1 / tensor_scale``
  before ``1 / block_scale``, so that no reciprocal overflows.
* E2M1 has no NaN: a block holding NaN or +-inf gets the NaN *scale* (E8M0 0xFF, E4M3 0x7F) and codes 0,
  so it dequantizes to NaN as a whole instead of silently turning into numbers.  Non-finite values do not
  take part in any amax.
* ``block_2d=True`` (NVFP4, weights in the training recipe): one scale per 16x16 tile, stored repeated
  on each of the tile's 16 rows, so the layout and the dequantizer are the same.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import formats, quantize, stochastic
from kernels.device import check_device, default_device
from kernels.hadamard import hadamard_rotate, random_signs
from kernels.quantize import e8m0_scale

# -- formats and constants ------------------------------------------------------------------------

E2M1_MAX = formats.E2M1_MAX  # 6
E2M1_EMAX = 2  # largest exponent of E2M1: 6 = 1.5 * 2^2
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7; code | 8 is negative
E4M3_MAX = formats.E4M3_MAX  # 448: the NVFP4 block scale is an e4m3 number
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
FORMATS = {"nvfp4": NVFP4_BLOCK, "mxfp4": MXFP4_BLOCK}
TENSOR_SCALE_DIVISOR = E4M3_MAX * E2M1_MAX  # 2688: tensor_scale = amax / 2688
MIN_TENSOR_SCALE = 2.0**-126
E8M0_NAN, E4M3_NAN = 0xFF, 0x7F
FP32_MAX = 3.4028234663852886e38
INPUT_DTYPES = quantize.INPUT_DTYPES  # the activation dtypes every quantizer takes

# Launch sizes.  The quantizer runs one warp per program on tiles of 512 elements (2 rows of 256 columns
# when the rows are that long), several tiles per program along the row, each loaded while the previous
# one is quantized (measured on an H200: benchmarks/results, fp4_quantize*).
QUANT_TILE_ELEMS, QUANT_COLS, QUANT_WARPS = 512, 256, 1
QUANT_TILES = {NVFP4_BLOCK: 2, MXFP4_BLOCK: 8}
DEQUANT_ROWS, DEQUANT_COLS, DEQUANT_WARPS = 32, 256, 8


class FP4Tensor(NamedTuple):
    """A block-scaled FP4 tensor: ``q`` packed codes (uint8, ``(..., K // 2)``), ``s`` block scales
    (``float8_e4m3fn`` for NVFP4, uint8 E8M0 for MXFP4, ``(..., K // block)``), ``tensor_scale`` (0-d
    fp32 for NVFP4, ``None`` for MXFP4) and ``fmt`` ("nvfp4" or "mxfp4")."""

    q: torch.Tensor
    s: torch.Tensor
    tensor_scale: torch.Tensor | None
    fmt: str

    @property
    def shape(self) -> tuple:
        """The shape of the tensor the codes stand for: ``(..., K)``."""
        return (*self.q.shape[:-1], self.q.shape[-1] * 2)


# -- argument checks ------------------------------------------------------------------------------


def _check_fmt(fmt) -> int:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def _check_input(x, block: int, name: str = "x", kernel: bool = True) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must have dtype bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (the K axis last), got a 0-d tensor")
    if x.shape[-1] % block:
        raise ValueError(f"{name}'s last dimension must be a multiple of the block size {block}, got {x.shape[-1]}")
    if kernel:  # the references run on any device
        check_device(x, name)
    return x.contiguous()


def _check_seed(stochastic_rounding: bool, seed) -> int:
    if not stochastic_rounding:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an int in [0, 2^31) for stochastic rounding, got {seed!r}")
    return seed


# -- shared pieces: E2M1 rounding, decoding and the scale rules ------------------------------------


@triton.jit
def _e2m1_code(v):
    """fp32 v (finite) -> E2M1 magnitude code 0..7 of |v|: nearest, ties to the even code, saturating
    at 6, in six instructions and no comparison chain.

    The grid step is 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]: half of 2^e for e = floor(log2(max(a, 1))).
    Adding ``M = 2^(e + 22)`` to ``a`` puts the sum in the binade whose fp32 spacing is exactly that step,
    so the fp32 addition itself rounds ``a`` to the E2M1 grid, once, to nearest even (an even multiple
    of the step is an even code).  The sum's low bits then count steps, ``k``, and the code is
    ``k + 2e``: the exponent field of M gives ``e`` without a branch.  :func:`e2m1_rne_reference`
    counts boundaries instead; the tests hold the two to the same bits."""
    a = tl.minimum(tl.abs(v), 6.0)  # E2M1_MAX
    m = tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000  # 2^e, e in {0, 1, 2}
    s = m.to(tl.float32, bitcast=True) * 4194304.0 + a  # M + a, rounded once (M * 2^22 is exact)
    # bits(s) = bits(M) + k, bits(M) = m + (22 << 23), and 2e = (m >> 22) - 254
    return s.to(tl.int32, bitcast=True) - m + (m >> 22) - ((22 << 23) + 254)


@triton.jit
def _e2m1_stochastic(mag, r):
    """|v| in [0, 6] and 32 random bits -> E2M1 magnitude code, rounded up with probability
    (|v| - lo) / (hi - lo).  The grid step is 0.5 below 2, 1 below 4, then 2: all powers of two, so
    lo, the fraction and the comparison are exact."""
    step = tl.where(mag < 2.0, 0.5, tl.where(mag < 4.0, 1.0, 2.0))
    inv_step = tl.where(mag < 2.0, 2.0, tl.where(mag < 4.0, 1.0, 0.5))
    lo = tl.floor(mag * inv_step) * step  # exact: powers of two
    frac = (mag - lo) * inv_step
    u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08  # 24 random bits -> [0, 1), exactly
    v = tl.where(u < frac, lo + step, lo)
    return _e2m1_code(v)  # v is on the grid: the nearest code is v's own


@triton.jit
def e2m1_to_bf16(c):
    """E2M1 codes (int32, 0..15) -> bf16 values, exactly, by building bf16 bits: magnitudes 2..7 are
    normal numbers whose bf16 pattern is ``(mag << 6) + 0x3F00``; 1 is 0.5 (0x3F00); 0 is 0."""
    mag = c & 7
    bits = tl.where(mag >= 2, (mag << 6) + 0x3F00, tl.where(mag == 1, 0x3F00, 0))
    bits = bits | ((c & 8) << 12)  # sign: bit 3 of the code -> bit 15
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_to_bf16_fast(c):
    """E2M1 codes -> bf16 in three integer operations and one multiplication: the fields go where bf16's
    are, the exponent field unchanged.  For e >= 1 that reads 2^(e - 127) (1 + m / 2); for e = 0 it is the
    bf16 subnormal m * 2^-127.  Both are the E2M1 value times 2^-126, which one exact multiplication by
    2^126 (bf16 0x7E80) undoes.  Needs bf16 subnormal inputs kept, not flushed: :func:`fast_decode_ok`
    checks that on the device before the GEMM uses it."""
    bits = ((c & 7) << 6) | ((c & 8) << 12)
    two126 = tl.full(c.shape, 0x7E80, tl.uint16).to(tl.bfloat16, bitcast=True)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True) * two126


@triton.jit
def _decode_probe_kernel(out_ptr, FAST: tl.constexpr):
    c = tl.arange(0, 16)
    v = e2m1_to_bf16_fast(c) if FAST else e2m1_to_bf16(c)
    tl.store(out_ptr + c, v)


_FAST_DECODE_OK = {}


def fast_decode_ok(device=None) -> bool:
    """Whether :func:`e2m1_to_bf16_fast` gives the exact E2M1 values on ``device`` (checked once, by
    running it on all 16 codes): it relies on bf16 subnormals surviving a multiplication."""
    device = device or default_device()
    key = str(device)
    if key not in _FAST_DECODE_OK:
        out = torch.empty(16, dtype=torch.bfloat16, device=device)
        _decode_probe_kernel[(1,)](out, FAST=True)
        want = e2m1_decode(torch.arange(16)).to(torch.bfloat16)
        _FAST_DECODE_OK[key] = torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
    return _FAST_DECODE_OK[key]


@triton.jit
def e8m0_to_bf16(c):
    """E8M0 bytes (int32) -> bf16 2^(c - 127), exactly (0 is the bf16 subnormal 2^-127, 255 NaN)."""
    bits = tl.where(c == 0, 0x0040, c << 7)
    bits = tl.where(c == 255, 0x7FC0, bits)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _tensor_scale(amax):
    """Tensor amax (fp32, finite, >= 0) -> NVFP4 tensor scale max(amax / 2688, 2^-126), 1 for 0."""
    ts = tl.maximum(tl.math.div_rn(amax, 2688.0), 1.1754943508222875e-38)
    return tl.where(amax == 0.0, 1.0, ts)


def e2m1_rne_reference(mag: torch.Tensor) -> torch.Tensor:
    """E2M1 rounding by definition: magnitudes (fp32, >= 0) -> codes 0..7 (int32), by counting the
    boundaries between neighbours that ``mag`` lies above (``>=`` where the upper code is even, ``>``
    where it is odd, so ties go to even codes; everything above 5 is code 7, 6)."""
    bounds = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
    c = torch.zeros(mag.shape, dtype=torch.int32, device=mag.device)
    for b, inclusive in bounds:
        c += (mag >= b if inclusive else mag > b).to(torch.int32)
    return c


def e2m1_stochastic_reference(mag: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """:func:`_e2m1_stochastic` in torch: magnitudes in [0, 6] and random words (int64 in [0, 2^32))."""
    step = torch.where(mag < 2.0, 0.5, torch.where(mag < 4.0, 1.0, 2.0)).float()
    inv_step = torch.where(mag < 2.0, 2.0, torch.where(mag < 4.0, 1.0, 0.5)).float()
    lo = torch.floor(mag * inv_step) * step
    frac = (mag - lo) * inv_step
    u = (r >> 8).to(torch.float32) * 2.0**-24
    v = torch.where(u < frac, lo + step, lo)
    return e2m1_rne_reference(v.clamp(max=E2M1_MAX))


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (integers, low 4 bits read) -> fp32 values, exactly; code 8 is -0.0."""
    c = codes.to(torch.int64) & 0xF
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=c.device)
    v = table[c & 7]
    return torch.where((c & 8) != 0, -v, v)


def e8m0_from_amax(amax: torch.Tensor, emax: int = E2M1_EMAX) -> torch.Tensor:
    """OCP's MX scale byte for any element format: ``e = floor(log2(amax)) - emax`` clamped to
    [-127, 127], byte ``e + 127``; 127 (S = 1) for amax 0.  :func:`kernels.quantize.e8m0_from_amax`
    with ``rounding="floor"`` is this rule for the FP8 elements (emax 8 or 15); this is the same bits
    arithmetic with ``emax`` as a parameter (2 for E2M1)."""
    bits = amax.float().contiguous().view(torch.int32)
    e = ((bits >> 23) - 127 - emax).clamp(-127, 127)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    return (e + 127).to(torch.uint8)


def tensor_scale_reference(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's tensor scale for a tensor amax: ``max(amax / 2688, 2^-126)``, 1 for amax 0."""
    amax = amax.float()
    # A tensor divisor: on CUDA, PyTorch divides by a Python number by multiplying with its
    # reciprocal, which is not correctly rounded.
    ts = torch.clamp(amax / torch.full_like(amax, TENSOR_SCALE_DIVISOR), min=MIN_TENSOR_SCALE)
    return torch.where(amax == 0, torch.ones_like(ts), ts)


# -- packing --------------------------------------------------------------------------------------


def pack(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes ``(..., K)`` (integers in [0, 16)) -> bytes ``(..., K // 2)``: element 2i in the low
    nibble, element 2i+1 in the high nibble (``torch.float4_e2m1fn_x2``'s order)."""
    if not isinstance(codes, torch.Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor of E2M1 codes, got {getattr(codes, 'dtype', type(codes))}")
    if codes.dim() < 1 or codes.shape[-1] % 2:
        raise ValueError(f"codes must have an even last dimension to pack two per byte, got {tuple(codes.shape)}")
    if codes.numel() and (codes.min() < 0 or codes.max() > 15):
        raise ValueError("codes must be in [0, 16): E2M1 codes are 4 bits")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``(..., K // 2)`` -> codes ``(..., K)`` (uint8), the inverse of :func:`pack`."""
    if not isinstance(packed, torch.Tensor) or packed.dtype not in (torch.uint8, torch.float4_e2m1fn_x2):
        raise TypeError(f"packed must be a uint8 (or float4_e2m1fn_x2) tensor, got {getattr(packed, 'dtype', packed)}")
    p = packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


# -- quantization kernels -------------------------------------------------------------------------


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _load_tile(x_ptr, poffs, mask, PAIRS: tl.constexpr, EVEN: tl.constexpr):
    """A tile of element pairs (2i, 2i + 1), addressed by pair index: int32 words holding two bf16 if
    PAIRS, else (..., 2) elements of any input dtype."""
    if PAIRS:
        if EVEN:
            raw = tl.load(x_ptr + poffs)
        else:
            raw = tl.load(x_ptr + poffs, mask=mask, other=0)
    else:
        offs = poffs[:, :, :, None] * 2 + tl.arange(0, 2)[None, None, None, :]  # (ROWS, G, BS // 2, 2)
        if EVEN:
            raw = tl.load(x_ptr + offs)
        else:
            raw = tl.load(x_ptr + offs, mask=mask[:, :, :, None], other=0.0)
    return raw


@triton.jit
def _quantize_tile(
    raw, q_ptr, s_ptr, rows, blocks, poffs, mask, ts, seed, M, K,
    BS: tl.constexpr, NV: tl.constexpr, BLOCK_2D: tl.constexpr, STOCHASTIC: tl.constexpr, ROWS: tl.constexpr,
    G: tl.constexpr, PAIRS: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    if PAIRS:  # a bf16 pair in one word: moving each half to the top of a word is its fp32 value
        lo = (raw << 16).to(tl.float32, bitcast=True)
        hi = (raw & -65536).to(tl.float32, bitcast=True)
        signs = raw  # the signs of elements 2i and 2i + 1 are bits 15 and 31
    else:
        lo, hi = tl.split(raw.to(tl.float32))
        signs = _signs(lo, hi)
    _quantize_halves(
        lo, hi, signs, q_ptr, s_ptr, rows, blocks, poffs, mask, ts, seed, M, K,
        BS, NV, BLOCK_2D, STOCHASTIC, ROWS, G, EVEN,
    )  # fmt: skip


@triton.jit
def _signs(lo, hi):
    """An int32 word with the sign of fp32 ``lo`` in bit 15 and that of ``hi`` in bit 31 (-0.0 included)."""
    return ((lo.to(tl.int32, bitcast=True) >> 16) & 0xFFFF) | (hi.to(tl.int32, bitcast=True) & -65536)


@triton.jit
def _quantize_halves(
    lo, hi, signs, q_ptr, s_ptr, rows, blocks, poffs, mask, ts, seed, M, K,
    BS: tl.constexpr, NV: tl.constexpr, BLOCK_2D: tl.constexpr, STOCHASTIC: tl.constexpr, ROWS: tl.constexpr,
    G: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    # lo and hi: (ROWS, G, BS // 2) fp32, the elements 2i and 2i + 1 of each block (their codes share a
    # byte), and their signs (:func:`_signs`)
    # NaN-propagating max: a block's amax is NaN or inf exactly when the block holds a non-finite value
    amax = tl.reduce(_max_nan(tl.abs(lo), tl.abs(hi)), 2, _max_nan)  # (ROWS, G)
    if BLOCK_2D:
        tile = tl.reduce(tl.reshape(amax, (ROWS // 16, 16, G)), 1, _max_nan)  # (ROWS // 16, G)
        amax = tl.reshape(tl.broadcast_to(tile[:, None, :], (ROWS // 16, 16, G)), (ROWS, G))
    bad = ~(amax < float("inf"))
    amax = tl.where(bad, 0.0, amax)
    if NV:
        sb8 = tl.minimum(tl.math.div_rn(amax, 6.0 * ts), 448.0).to(tl.float8e4nv)  # E2M1_MAX, E4M3_MAX
        code_s = tl.where(bad, 0x7F, sb8.to(tl.uint8, bitcast=True).to(tl.int32))
        sbf = sb8.to(tl.float32)
        denom = sbf * ts
        # S = block scale x tensor scale is an fp32 subnormal when the tensor scale sits at its floor
        # and the block scale is below 1: 1 / S would overflow, so the elements take 1 / ts first.
        # (For ts = 2^-126 that is exact, and x * (2^126 * rn(1 / sb)) would give the same bits.)
        tiny = (denom > 0.0) & (denom < 1.1754943508222875e-38)
        pre = tl.where(tiny, tl.math.div_rn(1.0, ts), 1.0)[:, :, None]
        lo = lo * pre
        hi = hi * pre
        inv = tl.math.div_rn(1.0, tl.where(tiny, sbf, tl.where(denom > 0.0, denom, 1.0)))
        inv = tl.where(denom > 0.0, inv, 0.0)  # a zero block scale: codes 0
    else:
        c8, inv = e8m0_scale(amax, 2, False)
        code_s = tl.where(bad, 0xFF, c8.to(tl.int32))
    vlo = lo * inv[:, :, None]  # (ROWS, G, BS // 2)
    vhi = hi * inv[:, :, None]
    if STOCHASTIC:
        i = poffs.to(tl.int32) * 2  # element index in the row-major tensor
        clo = _e2m1_stochastic(tl.minimum(tl.abs(vlo), 6.0), tl.randint(seed, i).to(tl.uint32, bitcast=True))
        chi = _e2m1_stochastic(tl.minimum(tl.abs(vhi), 6.0), tl.randint(seed, i + 1).to(tl.uint32, bitcast=True))
    else:
        clo = _e2m1_code(vlo)
        chi = _e2m1_code(vhi)
    # Element 2i's code in bits 0-2 and 2i + 1's in bits 16-18, each sign (-0.0 included) on top of its
    # code; adding the word shifted down by 12 then lays the high nibble beside the low one.
    nib = (clo + (chi << 16)) | ((signs >> 12) & 0x80008)
    byte = tl.where(bad[:, :, None], 0, nib + (nib >> 12)).to(tl.uint8)
    s_offs = rows[:, None] * (K // BS) + blocks[None, :]  # (ROWS, G)
    if EVEN:
        tl.store(q_ptr + poffs, byte)
        tl.store(s_ptr + s_offs, code_s.to(tl.uint8))
    else:
        tl.store(q_ptr + poffs, byte, mask=mask)
        tl.store(s_ptr + s_offs, code_s.to(tl.uint8), mask=(rows[:, None] < M) & (blocks[None, :] < K // BS))


@triton.jit
def _quantize_kernel(
    x_ptr,  # (M, K) input; int32 words of two bf16 when PAIRS
    q_ptr,  # (M, K // 2) uint8
    s_ptr,  # (M, K // BS) uint8: E4M3 or E8M0 bytes
    amax_ptr,  # NVFP4: the tensor amax (fp32), when TS_GIVEN is False
    ts_ptr,  # NVFP4: the tensor scale: read if TS_GIVEN, else written by program (0, 0)
    seed,
    M,
    K,
    BS: tl.constexpr,  # block size: 16 (NVFP4) or 32 (MXFP4)
    NV: tl.constexpr,
    TS_GIVEN: tl.constexpr,
    BLOCK_2D: tl.constexpr,  # one scale per 16x16 tile (NVFP4 weights)
    STOCHASTIC: tl.constexpr,
    ROWS: tl.constexpr,
    G: tl.constexpr,  # blocks per tile along the row
    TILES: tl.constexpr,  # tiles per program, one after another along the row
    PAIRS: tl.constexpr,  # bf16 input read as int32 words
    EVEN: tl.constexpr,  # every tile lies inside the matrix: no masks
    I64: tl.constexpr,  # offsets past 2^31 elements
):
    pid_m = tl.program_id(0)
    pid_g = tl.program_id(1)
    W: tl.constexpr = BS // 2  # pairs per block
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    if I64:
        rows = rows.to(tl.int64)  # and with it every offset below
    blocks = pid_g * (G * TILES) + tl.arange(0, G)
    pcols = blocks[None, :, None] * W + tl.arange(0, W)[None, None, :]  # (1, G, W): pair index in the row
    poffs = rows[:, None, None] * (K // 2) + pcols  # (ROWS, G, W)
    ts = 1.0
    if NV:
        if TS_GIVEN:
            ts = tl.load(ts_ptr)
        else:
            ts = _tensor_scale(tl.load(amax_ptr))
            if (pid_m == 0) & (pid_g == 0):
                tl.store(ts_ptr, ts)
    rmask = rows[:, None, None] < M
    raw = _load_tile(x_ptr, poffs, rmask & (pcols < K // 2), PAIRS, EVEN)
    # Each tile's load is issued before the previous tile is quantized, so a program always has one
    # tile in flight from memory while it computes: with one warp per program, that is what keeps
    # HBM busy.
    for _t in range(TILES - 1):
        nxt = _load_tile(x_ptr, poffs + G * W, rmask & (pcols + G * W < K // 2), PAIRS, EVEN)
        _quantize_tile(
            raw, q_ptr, s_ptr, rows, blocks, poffs, rmask & (pcols < K // 2), ts, seed, M, K,
            BS, NV, BLOCK_2D, STOCHASTIC, ROWS, G, PAIRS, EVEN,
        )  # fmt: skip
        raw = nxt
        poffs += G * W
        pcols += G * W
        blocks += G
    _quantize_tile(
        raw, q_ptr, s_ptr, rows, blocks, poffs, rmask & (pcols < K // 2), ts, seed, M, K,
        BS, NV, BLOCK_2D, STOCHASTIC, ROWS, G, PAIRS, EVEN,
    )  # fmt: skip


def _quantize_launch(m: int, k: int, bs: int, block_2d: bool) -> tuple:
    """(ROWS, G, TILES) for an (m, k) input: tiles of QUANT_TILE_ELEMS elements, QUANT_COLS columns wide
    where the row is that long (16 rows for 16x16 tiles), QUANT_TILES[bs] tiles per program."""
    n_blocks = k // bs
    rows = 16 if block_2d else 1
    g = max(1, min(QUANT_TILE_ELEMS // (rows * bs), QUANT_COLS // bs, triton.next_power_of_2(n_blocks)))
    rows = max(rows, QUANT_TILE_ELEMS // (g * bs))
    return rows, g, max(1, min(QUANT_TILES[bs], triton.cdiv(n_blocks, g)))


def _quantize(x, fmt, tensor_scale, block_2d, stochastic_rounding, seed) -> FP4Tensor:
    bs = _check_fmt(fmt)
    x = _check_input(x, bs)
    seed = _check_seed(stochastic_rounding, seed)
    if block_2d and fmt != "nvfp4":
        raise ValueError("block_2d=True is NVFP4's 16x16 weight tiling; MXFP4 scales 1x32 blocks")
    if tensor_scale is not None and fmt != "nvfp4":
        raise ValueError("tensor_scale is NVFP4's second level; MXFP4 has no tensor scale")
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    q = torch.empty((*x.shape[:-1], k // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((*x.shape[:-1], k // bs), dtype=torch.uint8, device=x.device)
    nv = fmt == "nvfp4"
    ts = amax = None
    if nv:
        if tensor_scale is not None:
            if not isinstance(tensor_scale, torch.Tensor) or tensor_scale.numel() != 1:
                raise ValueError(f"tensor_scale must be a one-element fp32 tensor, got {tensor_scale!r}")
            if tensor_scale.device != x.device:
                raise ValueError(f"tensor_scale is on {tensor_scale.device} but x is on {x.device}")
            ts = tensor_scale.float().reshape(())
        else:
            amax = quantize.tensor_amax(x) if x.numel() else torch.zeros((), device=x.device)
            ts = torch.empty((), dtype=torch.float32, device=x.device)
    if x.numel():
        rows, g, tiles = _quantize_launch(m, k, bs, block_2d)
        # bf16 pairs as one int32 word each (needs a 4-byte aligned start; a view at an odd element
        # offset takes the general path)
        pairs = x2.dtype == torch.bfloat16 and x2.data_ptr() % 4 == 0
        grid = (triton.cdiv(m, rows), triton.cdiv(k // bs, g * tiles))
        even = m % rows == 0 and (k // bs) % (g * tiles) == 0
        dummy = s  # MXFP4 reads neither amax nor the tensor scale
        _quantize_kernel[grid](
            x2.view(torch.int32) if pairs else x2, q, s, amax if amax is not None else dummy,
            ts if ts is not None else dummy, seed, m, k, BS=bs, NV=nv, TS_GIVEN=tensor_scale is not None,
            BLOCK_2D=block_2d, STOCHASTIC=stochastic_rounding, ROWS=rows, G=g, TILES=tiles, PAIRS=pairs,
            EVEN=even, I64=x2.numel() >= 2**31, num_warps=QUANT_WARPS,
        )  # fmt: skip
    elif nv and tensor_scale is None:
        ts = tensor_scale_reference(amax)
    if nv:
        s = s.view(torch.float8_e4m3fn)
    return FP4Tensor(q, s, ts, fmt)


def quantize_nvfp4(
    x: torch.Tensor,
    tensor_scale: torch.Tensor | None = None,
    block_2d: bool = False,
    stochastic_rounding: bool = False,
    seed: int = 0,
) -> FP4Tensor:
    """NVFP4: E2M1 codes in blocks of 16 along the last axis, an E4M3 scale per block and an fp32 tensor
    scale.  Without ``tensor_scale`` it is computed from this tensor's amax (a reduction pass first:
    the input is read twice); with one (a 0-d fp32 device tensor, e.g. from calibration) one pass."""
    return _quantize(x, "nvfp4", tensor_scale, block_2d, stochastic_rounding, seed)


def quantize_mxfp4(x: torch.Tensor, stochastic_rounding: bool = False, seed: int = 0) -> FP4Tensor:
    """MXFP4: E2M1 codes in blocks of 32 along the last axis, an E8M0 scale per block (OCP's floor rule)."""
    return _quantize(x, "mxfp4", None, False, stochastic_rounding, seed)


def quantize_fp4(x: torch.Tensor, fmt: str, **kw) -> FP4Tensor:
    """:func:`quantize_nvfp4` or :func:`quantize_mxfp4` by name."""
    _check_fmt(fmt)
    return quantize_nvfp4(x, **kw) if fmt == "nvfp4" else quantize_mxfp4(x, **kw)


# -- the wgrad operands: transposed, rotated and quantized in one pass ----------------------------------

RHT_BLOCK = 16  # the training recipe's rotation along the tokens
QUANT_T_TILE, QUANT_T_WARPS = (32, 64), 4  # the (tokens, features) tile of x a program reads
QUANT_T_LAYOUT = "transpose"  # or "pairs": _quantize_t_kernel or _quantize_t_pairs_kernel


@triton.jit
def _rotate_rows(x, h_ptr, d_ptr, rows, scale, TB: tl.constexpr, IEEE: tl.constexpr):
    """Rows ``rows`` of the rotation of a (TB tokens, FB features) tile ``x`` along its tokens, in blocks of
    16, rounded to x's dtype: one tl.dot by those rows of a (TB, TB) block-diagonal matrix whose blocks are
    diag(d) H (transposed), built from the 16x16 H and the 16 signs.  Each rotated value is the sum of
    the same 16 exact products as in hadamard_rotate on x^T, in the same order along K, and the other
    blocks add exact zeros, so the values are its bits."""
    c = tl.arange(0, TB)  # a token the rotated one mixes
    i = c[None, :] % 16
    same = (rows[:, None] // 16) == (c[None, :] // 16)
    rot = tl.where(same, tl.load(h_ptr + i * 16 + rows[:, None] % 16) * tl.load(d_ptr + i), 0.0)  # H[i, j] d[i]
    # A zero of the matrix times an inf or NaN of another group would be NaN: those are multiplied as 0,
    # and every rotated value of a group that holds one is made NaN afterwards (in hadamard_rotate it is
    # inf or NaN, which the quantizer treats alike).
    bad = (x.to(tl.float32) * 0.0) != 0.0
    xs = tl.where(bad, 0.0, x)
    if IEEE:
        y = tl.dot(rot.to(x.dtype), xs, input_precision="ieee")
    else:
        y = tl.dot(rot.to(x.dtype), xs)
    y = (y * scale).to(x.dtype)
    if tl.max(bad.to(tl.int32)) > 0:  # rare: count each group's non-finite values, exactly
        y = tl.where(tl.dot(same.to(x.dtype), bad.to(x.dtype)) > 0, float("nan"), y).to(x.dtype)
    return y


@triton.jit
def _load_tile_t(x_ptr, t, f, T, F, EVEN: tl.constexpr):
    """The (len(t) tokens, len(f) features) tile x[t, f] of a (T, F) row-major x, with coalesced rows;
    zeros outside x (``EVEN``: the tile lies inside, no mask)."""
    offs = t.to(tl.int64)[:, None] * F + f[None, :]
    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=(t[:, None] < T) & (f[None, :] < F), other=0.0)
    return x


@triton.jit
def _t_tile_out(f, pid_t, T, F, TB: tl.constexpr, BS: tl.constexpr):
    """Where a wgrad-quantizer program's codes go: its FB rows ``f`` of x^T, from token ``pid_t * TB`` on,
    hold ``TB // BS`` blocks; returns the block indices and the byte offsets of the code pairs,
    (FB, TB // BS, BS // 2), with their mask."""
    G: tl.constexpr = TB // BS
    W: tl.constexpr = BS // 2
    blocks = pid_t * G + tl.arange(0, G)
    pcols = blocks[None, :, None] * W + tl.arange(0, W)[None, None, :]  # (1, G, W): pair index in the row
    poffs = f.to(tl.int64)[:, None, None] * (T // 2) + pcols  # (FB, G, W)
    mask = (f[:, None, None] < F) & (pcols < T // 2)
    return blocks, poffs, mask


@triton.jit
def _quantize_t_kernel(
    x_ptr,  # (T, F) input, row-major: tokens by features
    h_ptr,  # (16, 16) Hadamard matrix of +-1 (bf16, or fp32 for fp32 input)
    d_ptr,  # (16,) the rotation's random signs, +-1 (fp32)
    q_ptr,  # (F, T // 2) uint8: the codes of x^T
    s_ptr,  # (F, T // BS) uint8 block scales
    amax_ptr,  # NVFP4: the amax of the rotated x (fp32), written by the AMAX pass, read by the next
    ts_ptr,  # NVFP4: the tensor scale, written by program (0, 0)
    partial_ptr,  # AMAX pass: one maximum per program
    seed, T, F, scale,
    BS: tl.constexpr, NV: tl.constexpr, STOCHASTIC: tl.constexpr, ROTATE: tl.constexpr, IEEE: tl.constexpr,
    AMAX: tl.constexpr, TB: tl.constexpr, FB: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    # A (TB tokens, FB features) tile of x, read once with coalesced rows, rotated along its tokens
    # (_rotate_rows), then transposed in registers into FB rows of x^T and quantized along the tokens.
    pid_f = tl.program_id(0)
    pid_t = tl.program_id(1)
    f = pid_f * FB + tl.arange(0, FB)
    x = _load_tile_t(x_ptr, pid_t * TB + tl.arange(0, TB), f, T, F, EVEN)
    if ROTATE:
        x = _rotate_rows(x, h_ptr, d_ptr, tl.arange(0, TB), scale, TB, IEEE)
    if AMAX:  # the amax of the tile, whichever way it is read
        v = quantize.nan_if_not_finite(x.to(tl.float32))
        tl.store(partial_ptr + pid_f * tl.num_programs(1) + pid_t, tl.max(quantize.finite_amax(v, 1), 0))
    else:
        ts = 1.0
        if NV:
            ts = _tensor_scale(tl.load(amax_ptr))
            if (pid_f == 0) & (pid_t == 0):
                tl.store(ts_ptr, ts)
        blocks, poffs, mask = _t_tile_out(f, pid_t, T, F, TB, BS)
        G: tl.constexpr = TB // BS
        raw = tl.reshape(tl.trans(x), (FB, G, BS // 2, 2))  # FB rows of x^T
        _quantize_tile(
            raw, q_ptr, s_ptr, f, blocks, poffs, mask, ts, seed, F, T,
            BS, NV, False, STOCHASTIC, FB, G, False, EVEN,
        )  # fmt: skip


@triton.jit
def _quantize_t_pairs_kernel(
    x_ptr, h_ptr, d_ptr, q_ptr, s_ptr, amax_ptr, ts_ptr, partial_ptr,  # as _quantize_t_kernel's
    seed, T, F, scale,
    BS: tl.constexpr, NV: tl.constexpr, STOCHASTIC: tl.constexpr, ROTATE: tl.constexpr, IEEE: tl.constexpr,
    AMAX: tl.constexpr, TB: tl.constexpr, FB: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    # _quantize_t_kernel's work with no transposition: the codes of tokens 2i and 2i + 1 share a byte of
    # x^T, so the tile is kept as its even tokens (lo) and its odd tokens (hi), (TB / 2, FB) each, read
    # (or rotated: _rotate_rows by the even and by the odd rows of the rotation) with coalesced
    # rows.  Each feature's blocks then lie down its column; a reshape and a permutation (which moves no
    # data) give the (FB, G, BS / 2) halves that _quantize_halves takes.
    pid_f = tl.program_id(0)
    pid_t = tl.program_id(1)
    f = pid_f * FB + tl.arange(0, FB)
    TP: tl.constexpr = TB // 2
    te = pid_t * TB + 2 * tl.arange(0, TP)  # the even tokens
    if ROTATE:
        x = _load_tile_t(x_ptr, pid_t * TB + tl.arange(0, TB), f, T, F, EVEN)
        re = 2 * tl.arange(0, TP)  # the even rows of the rotation; re + 1, the odd ones
        lo = _rotate_rows(x, h_ptr, d_ptr, re, scale, TB, IEEE)
        hi = _rotate_rows(x, h_ptr, d_ptr, re + 1, scale, TB, IEEE)
    else:
        offs = te.to(tl.int64)[:, None] * F + f[None, :]
        if EVEN:
            lo = tl.load(x_ptr + offs)
            hi = tl.load(x_ptr + offs + F)
        else:
            m = (te[:, None] < T) & (f[None, :] < F)
            lo = tl.load(x_ptr + offs, mask=m, other=0.0)
            hi = tl.load(x_ptr + offs + F, mask=m, other=0.0)
    lo = lo.to(tl.float32)
    hi = hi.to(tl.float32)
    if AMAX:
        a = tl.maximum(quantize.finite_amax(quantize.nan_if_not_finite(lo), 1),
                       quantize.finite_amax(quantize.nan_if_not_finite(hi), 1))  # fmt: skip
        tl.store(partial_ptr + pid_f * tl.num_programs(1) + pid_t, tl.max(a, 0))
    else:
        ts = 1.0
        if NV:
            ts = _tensor_scale(tl.load(amax_ptr))
            if (pid_f == 0) & (pid_t == 0):
                tl.store(ts_ptr, ts)
        blocks, poffs, mask = _t_tile_out(f, pid_t, T, F, TB, BS)
        G: tl.constexpr = TB // BS
        W: tl.constexpr = BS // 2
        lo = tl.permute(tl.reshape(lo, (G, W, FB)), (2, 0, 1))  # (FB, G, W)
        hi = tl.permute(tl.reshape(hi, (G, W, FB)), (2, 0, 1))
        _quantize_halves(
            lo, hi, _signs(lo, hi), q_ptr, s_ptr, f, blocks, poffs, mask, ts, seed, F, T,
            BS, NV, False, STOCHASTIC, FB, G, EVEN,
        )  # fmt: skip


def quantize_fp4_t(
    x: torch.Tensor, fmt: str, signs: torch.Tensor | None = None, stochastic_rounding: bool = False, seed: int = 0
) -> FP4Tensor:
    """``x^T`` quantized to FP4 along its last axis, from the 2-D ``x`` (tokens, features) in one kernel:
    with ``signs`` (16 of +-1), each row of ``x^T`` is first rotated by the Random Hadamard Transform
    ``diag(signs) H / 4`` in blocks of 16.  Bit for bit
    ``quantize_fp4(hadamard_rotate(x.t().contiguous(), 16, signs), fmt, ...)``, which writes and reads the
    transposed copy and the rotated copy in between: the training recipe's wgrad operands ``dY^T`` and
    ``X^T``.  NVFP4's tensor scale comes from the amax of the rotated values: a first pass rotates to
    find it (reading ``x`` twice, as :func:`quantize_nvfp4` does)."""
    bs = _check_fmt(fmt)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D (tokens, features) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    check_device(x, "x")
    tokens, features = x.shape
    need = max(bs, RHT_BLOCK if signs is not None else 1)
    if tokens % need:
        raise ValueError(f"x's tokens (its first dimension, {tokens}) must be a multiple of {need}: x^T is "
                         "quantized along them")  # fmt: skip
    seed = _check_seed(stochastic_rounding, seed)
    if signs is not None:
        if not isinstance(signs, torch.Tensor) or signs.shape != (RHT_BLOCK,):
            raise ValueError(f"signs must be a ({RHT_BLOCK},) tensor of +-1, got {getattr(signs, 'shape', signs)}")
        if not bool(((signs == 1) | (signs == -1)).all()):
            raise ValueError("signs must hold only +1 and -1 (a rotation must stay orthogonal)")
    x = x.contiguous()
    q = torch.empty((features, tokens // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((features, tokens // bs), dtype=torch.uint8, device=x.device)
    nv = fmt == "nvfp4"
    ts = torch.empty((), dtype=torch.float32, device=x.device) if nv else None
    amax = torch.zeros(3, dtype=torch.float32, device=x.device)  # amax, and what the fold also writes
    if x.numel():
        from kernels.hadamard import hadamard_matrix

        h = hadamard_matrix(RHT_BLOCK, dtype=torch.float32 if x.dtype == torch.float32 else torch.bfloat16,
                            device=x.device, normalized=False)  # fmt: skip
        d = (signs if signs is not None else torch.ones(RHT_BLOCK)).float().to(x.device)
        tb, fb = QUANT_T_TILE
        grid = (triton.cdiv(features, fb), triton.cdiv(tokens, tb))
        even = features % fb == 0 and tokens % tb == 0
        partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=x.device)

        kernel = {"transpose": _quantize_t_kernel, "pairs": _quantize_t_pairs_kernel}[QUANT_T_LAYOUT]

        def launch(amax_pass):
            kernel[grid](
                x, h, d, q, s, amax, ts if nv else amax, partial, seed, tokens, features, 1.0 / math.sqrt(RHT_BLOCK),
                BS=bs, NV=nv, STOCHASTIC=stochastic_rounding, ROTATE=signs is not None,
                IEEE=x.dtype == torch.float32, AMAX=amax_pass, TB=tb, FB=fb, EVEN=even, num_warps=QUANT_T_WARPS,
            )  # fmt: skip

        if nv:
            launch(True)
            quantize.fold_amax(partial, amax)
        launch(False)
    elif nv:
        ts = tensor_scale_reference(torch.zeros((), device=x.device))
    if nv:
        s = s.view(torch.float8_e4m3fn)
    return FP4Tensor(q, s, ts, fmt)


def quantize_fp4_reference(
    x: torch.Tensor,
    fmt: str,
    tensor_scale: torch.Tensor | None = None,
    block_2d: bool = False,
    stochastic_rounding: bool = False,
    seed: int = 0,
) -> FP4Tensor:
    """Plain-torch :func:`quantize_fp4`, bit for bit (codes, scales, tensor scale)."""
    bs = _check_fmt(fmt)
    x = _check_input(x, bs, kernel=False)
    seed = _check_seed(stochastic_rounding, seed)
    if block_2d and fmt != "nvfp4":
        raise ValueError("block_2d=True is NVFP4's 16x16 weight tiling; MXFP4 scales 1x32 blocks")
    if tensor_scale is not None and fmt != "nvfp4":
        raise ValueError("tensor_scale is NVFP4's second level; MXFP4 has no tensor scale")
    xf = x.reshape(-1, x.shape[-1]).float()
    m, k = xf.shape
    xg = xf.reshape(m, k // bs, bs)
    finite = torch.isfinite(xg)
    a = torch.where(finite, xg.abs(), torch.zeros_like(xg))
    amax = a.amax(dim=-1) if xg.numel() else torch.zeros(m, k // bs, device=x.device)  # (M, K // BS)
    bad = (~finite).any(dim=-1)
    if block_2d:
        pad = (-m) % 16
        tile = torch.nn.functional.pad(amax, (0, 0, 0, pad)).reshape(-1, 16, k // bs).amax(dim=1)
        amax = tile.repeat_interleave(16, 0)[:m]
        bad_t = torch.nn.functional.pad(bad, (0, 0, 0, pad)).reshape(-1, 16, k // bs).any(dim=1)
        bad = bad_t.repeat_interleave(16, 0)[:m]
    ts = None
    if fmt == "nvfp4":
        if tensor_scale is not None:
            ts = tensor_scale.float().reshape(()).to(x.device)
        else:
            ts = tensor_scale_reference(a.amax() if a.numel() else torch.zeros((), device=x.device))
        sb8 = (amax / (E2M1_MAX * ts)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        s_codes = torch.where(bad, torch.full_like(sb8.view(torch.uint8), E4M3_NAN), sb8.view(torch.uint8))
        denom = sb8.float() * ts
        tiny = (denom > 0) & (denom < MIN_TENSOR_SCALE)  # S subnormal: 1 / S would overflow
        ones = torch.ones_like(denom)
        xg = xg * torch.where(tiny, 1.0 / ts, ones)[..., None]
        inv = 1.0 / torch.where(tiny, sb8.float(), torch.where(denom > 0, denom, ones))
        inv = torch.where(denom > 0, inv, torch.zeros_like(inv))
    else:
        c8 = e8m0_from_amax(amax, E2M1_EMAX)
        s_codes = torch.where(bad, torch.full_like(c8, E8M0_NAN), c8)
        inv = ((254 - c8.to(torch.int32)) << 23).view(torch.float32)  # 2^-e
    mag = (xg * inv[..., None]).abs().clamp(max=E2M1_MAX)
    if stochastic_rounding:
        # the Philox words come from a Triton kernel: on the GPU when there is one, then moved to x
        r = stochastic.random_bits(m * k, seed, device=default_device())
        r = r.to(x.device).reshape(m, k // bs, bs)
        c = e2m1_stochastic_reference(mag, r)
    else:
        c = e2m1_rne_reference(mag)
    sign = (xg.view(torch.int32) < 0).to(torch.int32)
    c = c | (sign << 3)
    c = torch.where(bad[..., None] | ~finite, torch.zeros_like(c), c)
    q = pack(c.reshape(m, k)).reshape(*x.shape[:-1], k // 2)
    s = s_codes.reshape(*x.shape[:-1], k // bs)
    if fmt == "nvfp4":
        s = s.view(torch.float8_e4m3fn)
    return FP4Tensor(q, s, ts, fmt)


# -- dequantization ---------------------------------------------------------------------------------


def check_fp4(t) -> int:
    if not isinstance(t, FP4Tensor):
        raise TypeError(f"expected an FP4Tensor (from quantize_nvfp4 / quantize_mxfp4), got {type(t).__name__}")
    bs = _check_fmt(t.fmt)
    if t.q.dtype != torch.uint8:
        raise TypeError(f"q must be uint8 packed codes, got {t.q.dtype}")
    want_s = torch.float8_e4m3fn if t.fmt == "nvfp4" else torch.uint8
    if t.s.dtype != want_s:
        raise TypeError(f"s must have dtype {want_s} for {t.fmt}, got {t.s.dtype}")
    k = t.q.shape[-1] * 2
    if k % bs or t.s.shape != (*t.q.shape[:-1], k // bs):
        raise ValueError(
            f"s has shape {tuple(t.s.shape)}, but codes of shape {t.shape} need {(*t.q.shape[:-1], k // bs)}"
        )
    if t.fmt == "nvfp4" and (not isinstance(t.tensor_scale, torch.Tensor) or t.tensor_scale.numel() != 1):
        raise ValueError("an NVFP4 tensor needs its one-element fp32 tensor_scale")
    return bs


@triton.jit
def _dequantize_kernel(
    q_ptr, s_ptr, ts_ptr, y_ptr, M, K, BS: tl.constexpr, NV: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    G: tl.constexpr = COLS // BS
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    cols2 = pid_k * (COLS // 2) + tl.arange(0, COLS // 2)
    rmask = rows[:, None] < M
    b = tl.load(q_ptr + rows.to(tl.int64)[:, None] * (K // 2) + cols2[None, :], mask=rmask & (cols2[None, :] < K // 2))
    b = b.to(tl.int32)
    c = tl.reshape(tl.join(b & 0xF, b >> 4), (ROWS, G, BS))  # low nibble first: element 2i, then 2i+1
    q = e2m1_to_bf16(c).to(tl.float32)
    gcols = pid_k * G + tl.arange(0, G)
    s = tl.load(
        s_ptr + rows.to(tl.int64)[:, None] * (K // BS) + gcols[None, :], mask=rmask & (gcols[None, :] < K // BS)
    )
    if NV:
        sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        y = (q * sf[:, :, None]) * tl.load(ts_ptr)  # q * block scale is exact; one rounding with the tensor scale
    else:
        y = q * e8m0_to_bf16(s.to(tl.int32)).to(tl.float32)[:, :, None]
    cols = pid_k * COLS + tl.arange(0, COLS)
    tl.store(
        y_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
        tl.reshape(y, (ROWS, COLS)).to(y_ptr.dtype.element_ty),
        mask=rmask & (cols[None, :] < K),
    )


def dequantize_fp4(t: FP4Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """``q * S`` for every element (NVFP4: ``(q * block_scale) * tensor_scale``); fp32 is exact for
    MXFP4 and one rounding for NVFP4, bf16/fp16 one rounding more.  A NaN scale gives NaN."""
    bs = check_fp4(t)
    if out_dtype not in INPUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.float32, torch.bfloat16 or torch.float16, got {out_dtype}")
    check_device(t.q, "t.q")
    q2 = t.q.reshape(-1, t.q.shape[-1]).contiguous()
    s2 = t.s.reshape(-1, t.s.shape[-1]).contiguous().view(torch.uint8)
    m, k = q2.shape[0], q2.shape[1] * 2
    y = torch.empty((m, k), dtype=out_dtype, device=t.q.device)
    if y.numel():
        ts = t.tensor_scale.float().reshape(1) if t.fmt == "nvfp4" else s2
        grid = (triton.cdiv(m, DEQUANT_ROWS), triton.cdiv(k, DEQUANT_COLS))
        _dequantize_kernel[grid](
            q2, s2, ts, y, m, k, BS=bs, NV=t.fmt == "nvfp4", ROWS=DEQUANT_ROWS, COLS=DEQUANT_COLS,
            num_warps=DEQUANT_WARPS,
        )  # fmt: skip
    return y.reshape(t.shape)


def block_values(t: FP4Tensor) -> torch.Tensor:
    """``q * block_scale`` for every element, in bf16, without the NVFP4 tensor scale: exact (a code has
    at most 2 significant bits, an E4M3 scale 4 and an E8M0 scale 1; bf16 holds 8, with fp32's exponent
    range), so a bf16 GEMM of two such operands with an fp32 accumulator sums the exact products of an FP4
    GEMM, and the tensor scales can multiply its fp32 result."""
    if check_fp4(t) and t.fmt == "nvfp4":
        t = t._replace(tensor_scale=torch.ones((), dtype=torch.float32, device=t.q.device))
    return dequantize_fp4(t, torch.bfloat16)


def dequantize_fp4_reference(t: FP4Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """Plain-torch :func:`dequantize_fp4`."""
    bs = check_fp4(t)
    q = e2m1_decode(unpack(t.q))  # (..., K)
    shape = q.shape
    qg = q.reshape(*shape[:-1], shape[-1] // bs, bs)
    if t.fmt == "nvfp4":
        y = (qg * t.s.float()[..., None]) * t.tensor_scale.float()
    else:
        y = qg * quantize.e8m0_to_float(t.s)[..., None]
    return y.reshape(shape).to(out_dtype)


def fake_quantize(x: torch.Tensor, fmt: str, rotate_block: int | None = None, **kw) -> torch.Tensor:
    """Quantize then dequantize (fp32), optionally inside a blockwise Hadamard rotation (rotate, round,
    rotate back): the error a weight or activation carries into the matmul."""
    if rotate_block is not None:
        signs = random_signs(rotate_block, device=x.device)
        xr = hadamard_rotate(x, rotate_block, signs).float()
        back = dequantize_fp4(quantize_fp4(xr, fmt, **kw))
        return hadamard_rotate(back, rotate_block, signs, inverse=True)
    return dequantize_fp4(quantize_fp4(x, fmt, **kw))


def bits_per_element(fmt: str, shape=(8192, 8192)) -> float:
    """Stored bits per element, scales included: 4 + 8 / block (+ 32 bits of tensor scale for NVFP4,
    spread over the tensor)."""
    bs = _check_fmt(fmt)
    m, k = shape
    total = m * k * 4 + m * (k // bs) * 8 + (32 if fmt == "nvfp4" else 0)
    return total / (m * k)


__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "FORMATS",
    "MXFP4_BLOCK",
    "RHT_BLOCK",
    "NVFP4_BLOCK",
    "FP4Tensor",
    "bits_per_element",
    "block_values",
    "check_fp4",
    "dequantize_fp4",
    "dequantize_fp4_reference",
    "e2m1_decode",
    "e2m1_rne_reference",
    "e2m1_to_bf16",
    "e2m1_to_bf16_fast",
    "e8m0_from_amax",
    "e8m0_to_bf16",
    "fast_decode_ok",
    "fake_quantize",
    "pack",
    "quantize_fp4",
    "quantize_fp4_t",
    "quantize_fp4_reference",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "tensor_scale_reference",
    "unpack",
]
