"""Stochastic rounding fp32 -> bf16 / e4m3fn / e5m2 in a Triton kernel, seeded and reproducible.

Chapter 3 and Lab 03 (diagnostics).  Entry points: :func:`stochastic_round`, :func:`random_bits`,
:func:`stochastic_round_reference`.

Round to nearest maps ``x`` to the nearer of its two neighbours ``lo <= x <= hi`` in the target
format, so a small increment can vanish every time it is applied.  Stochastic rounding picks ``hi``
with probability ``(x - lo) / (hi - lo)`` and ``lo`` otherwise, so that ``E[SR(x)] = x`` exactly for
every ``x`` between two finite neighbours.  On bit patterns this is one integer addition: add ``d``
uniformly random bits below the ``d`` bits that the target drops, and truncate.  The dropped part
``t`` (``0 <= t < 2^d``) carries into the kept part exactly when ``t + r >= 2^d``, which happens for
``t`` of the ``2^d`` values of ``r``: probability ``t / 2^d``, the distance to ``lo`` in units of the
spacing.  A carry out of the mantissa moves to the next binade, as it should.

The random bits come from Triton's Philox generator, ``tl.randint(seed, offset)`` (the integer
stream that ``tl.rand`` turns into floats): the same ``seed`` and element index give the same bits on
the GPU and in the CPU interpreter, so a result is reproducible anywhere.  :func:`random_bits` hands
out exactly the bits the kernel uses, and :func:`stochastic_round_reference` is the same recipe in
plain PyTorch, given those bits.

What is not unbiased, on purpose:

* values beyond the largest finite value: with saturation (fp8's default, like the hardware
  conversion) they become +-max, so ``E[SR(500)] = 448`` in e4m3fn; without it, a value that rounds
  up past the largest finite value becomes inf (or NaN in e4m3fn, which has no inf);
* NaN becomes the canonical NaN of the hardware conversion (0x7FFF, 0x7F), never a random code;
* fp32 -> fp8 below the smallest subnormal: with more than 31 dropped bits only the top 31 are
  randomised (the rest are truncated), a bias below 2^-31 of the smallest subnormal.
"""

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import formats
from kernels.device import check_device, default_device

TARGETS = ("bf16", "e4m3fn", "e5m2")
# Elements per program: an elementwise, memory-bound kernel; 8 warps keep 32 elements per thread in flight.
BLOCK, WARPS = 8192, 8
# At most this many dropped bits get random bits: uint32 arithmetic must not overflow (v < 2^31).
RANDOM_BITS = 31


@triton.jit
def _round_bits(
    u,
    r,
    M: tl.constexpr,
    BIAS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    MAX_F32: tl.constexpr,
    OVERFLOW_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    SATURATE: tl.constexpr,
    RANDOM_BITS: tl.constexpr,
):
    """fp32 patterns ``u`` (uint32) and random words ``r`` (uint32) -> target codes (uint32)."""
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    nan = mag > 0x7F800000
    if SATURATE:
        mag = tl.minimum(mag, MAX_F32)  # +-max is exact: it rounds to itself, whatever r is
    # Exponent field of the target if the value is normal there; an fp32 subnormal sits in the
    # binade of exponent 1 without its implicit bit.
    e32 = mag >> 23
    e = tl.maximum(e32, 1).to(tl.int32) - (127 - BIAS)
    e1 = tl.maximum(e, 1)
    sig = tl.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    # v >> d is the code, rounded down: the significand re-based to the target's exponent field
    # (normal target), or shifted by 1 - e more bits (subnormal target).
    v = sig + ((e1 - 1) << 23).to(tl.uint32)
    d = (23 - M) + (e1 - e)  # dropped bits, >= 23 - M
    extra = tl.minimum(tl.maximum(d - RANDOM_BITS, 0), 31)  # dropped bits beyond the random ones
    v = v >> extra.to(tl.uint32)
    d = tl.minimum(d - extra, RANDOM_BITS).to(tl.uint32)  # v is 0 when d - extra would exceed it
    noise = r & ((tl.full(r.shape, 1, tl.uint32) << d) - 1)  # d uniform random bits
    code = (v + noise) >> d
    if not SATURATE:
        code = tl.where(code > MAX_CODE, OVERFLOW_CODE, code)
    out = code | (sign << SIGN_SHIFT)
    return tl.where(nan, NAN_CODE, out)


@triton.jit
def _stochastic_kernel(
    x_ptr,
    y_ptr,
    n,
    seed,
    M: tl.constexpr,
    BIAS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    MAX_F32: tl.constexpr,
    OVERFLOW_CODE: tl.constexpr,
    NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    SATURATE: tl.constexpr,
    RANDOM_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = x.to(tl.uint32, bitcast=True)
    # One Philox word per element, from (seed, element index): the same bits on every device and
    # for every launch configuration.
    r = tl.randint(seed, offs).to(tl.uint32, bitcast=True)
    out = _round_bits(u, r, M, BIAS, MAX_CODE, MAX_F32, OVERFLOW_CODE, NAN_CODE, SIGN_SHIFT, SATURATE, RANDOM_BITS)
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _random_bits_kernel(r_ptr, n, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    r = tl.randint(seed, offs).to(tl.int32, bitcast=True)
    tl.store(r_ptr + offs, r, mask=offs < n)


def _check(x, fmt, seed, saturate, on_device: bool = True):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of dtype torch.float32, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x must have dtype torch.float32, got {x.dtype}")
    if fmt not in TARGETS:
        raise ValueError(f"fmt must be one of {list(TARGETS)}, got {fmt!r}")
    _check_seed(seed)
    if saturate is not None and not isinstance(saturate, bool):
        raise TypeError(f"saturate must be True, False or None, got {saturate!r}")
    if on_device:
        check_device(x, "x")


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= int(seed) < 2**31:
        raise ValueError(f"seed must be an int in [0, 2^31), got {seed!r}")


def _params(fmt: str, saturate: bool | None) -> dict:
    """Kernel constants for target ``fmt``; ``saturate=None`` means the hardware conversion's choice."""
    spec = formats.ENCODE_SPECS[fmt]
    clip = (fmt != "bf16") if saturate is None else saturate
    return dict(
        M=spec.mantissa_bits,
        BIAS=spec.bias,
        MAX_CODE=spec.max_code,
        MAX_F32=spec.max_f32,
        OVERFLOW_CODE=spec.overflow_code,
        NAN_CODE=spec.sat_nan,  # the hardware's NaN, sign dropped: 0x7FFF, 0x7F
        SIGN_SHIFT=spec.width - 1,
        SATURATE=clip,
        RANDOM_BITS=RANDOM_BITS,
    )


def stochastic_round(x: torch.Tensor, fmt: str, seed: int, saturate: bool | None = None) -> torch.Tensor:
    """Round fp32 ``x`` to ``fmt`` ("bf16", "e4m3fn" or "e5m2") stochastically, reproducibly.

    Element ``i`` uses the Philox word ``tl.randint(seed, i)`` (:func:`random_bits`), so the same
    ``seed`` gives the same result on any device; use a new seed for each call that must be
    independent of the last.  Every finite result is one of the two neighbours of ``x``, ``hi`` with
    probability ``(x - lo) / (hi - lo)``; representable values come back unchanged.

    ``saturate``: ``None`` (default) as the hardware conversion: fp8 clips to +-max first (inf too),
    bf16 may round up into inf.  ``True`` clips for bf16 too; ``False`` lets fp8 overflow to NaN
    (e4m3fn) or inf (e5m2).  NaN becomes 0x7FFF / 0x7F.  Returns a tensor of ``x``'s shape and device
    of dtype torch.bfloat16, torch.float8_e4m3fn or torch.float8_e5m2.
    """
    _check(x, fmt, seed, saturate)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    if n:
        y_int = y.view(torch.uint8 if y.element_size() == 1 else torch.int16)
        _stochastic_kernel[(triton.cdiv(n, BLOCK),)](
            x, y_int, n, int(seed), **_params(fmt, saturate), BLOCK=BLOCK, num_warps=WARPS
        )
    return y


def random_bits(n: int, seed: int, device=None) -> torch.Tensor:
    """The Philox words ``tl.randint(seed, i)`` for ``i < n`` (int64 in [0, 2^32)), on the CPU: the
    random bits that :func:`stochastic_round` adds to element ``i``.  ``device`` is where the kernel
    runs (default: the CPU in the interpreter, the GPU otherwise)."""
    device = device or default_device()
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    _check_seed(seed)
    r = torch.empty(n, dtype=torch.int32, device=device)
    if n:
        _random_bits_kernel[(triton.cdiv(n, BLOCK),)](r, n, int(seed), BLOCK=BLOCK)
    return r.cpu().to(torch.int64) & 0xFFFFFFFF


def stochastic_round_bits_reference(
    bits: torch.Tensor, rand: torch.Tensor, fmt: str, saturate: bool | None = None
) -> torch.Tensor:
    """The kernel's recipe in plain PyTorch (int64): fp32 patterns and random words (both int64 in
    [0, 2^32)) -> codes of ``fmt`` (int64)."""
    if fmt not in TARGETS:
        raise ValueError(f"fmt must be one of {list(TARGETS)}, got {fmt!r}")
    if bits.shape != rand.shape:
        raise ValueError(f"rand must have the shape of bits, {tuple(bits.shape)}, got {tuple(rand.shape)}")
    p = _params(fmt, saturate)
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    nan = mag > 0x7F800000
    if p["SATURATE"]:
        mag = mag.clamp(max=p["MAX_F32"])
    e32 = mag >> 23
    e = e32.clamp(min=1) - (127 - p["BIAS"])
    e1 = e.clamp(min=1)
    sig = torch.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    v = sig + ((e1 - 1) << 23)
    d = (23 - p["M"]) + (e1 - e)
    extra = (d - RANDOM_BITS).clamp(min=0, max=31)
    v = v >> extra
    d = (d - extra).clamp(max=RANDOM_BITS)
    code = (v + (rand & ((1 << d) - 1))) >> d
    if not p["SATURATE"]:
        code = torch.where(code > p["MAX_CODE"], p["OVERFLOW_CODE"], code)
    out = code | (sign << p["SIGN_SHIFT"])
    return torch.where(nan, p["NAN_CODE"], out)


def stochastic_round_reference(x: torch.Tensor, fmt: str, seed: int, saturate: bool | None = None) -> torch.Tensor:
    """:func:`stochastic_round` computed in plain PyTorch on the CPU from :func:`random_bits`;
    returned on ``x``'s device."""
    _check(x, fmt, seed, saturate, on_device=False)
    bits = x.detach().cpu().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rand = random_bits(x.numel(), seed).reshape(x.shape)
    codes = stochastic_round_bits_reference(bits, rand, fmt, saturate)
    width = formats.ENCODE_SPECS[fmt].width
    int_dtype = torch.uint8 if width == 8 else torch.int16
    return formats.from_codes(codes, int_dtype).view(formats.TORCH_DTYPES[fmt]).to(x.device)


# -- statistics --------------------------------------------------------------------------------------


@functools.cache
def _grid(fmt: str) -> torch.Tensor:
    f = formats.get(fmt)
    grid = formats.decode(formats.all_codes(f), f).double()
    return torch.unique(grid[torch.isfinite(grid)])  # sorted, -max .. max (+0 and -0 merged)


def neighbours(x: torch.Tensor, fmt: str) -> tuple:
    """(lo, hi): the representable values of ``fmt`` just below and above (or equal to) each finite
    ``x`` within the format's range, as float64 (round toward -inf and toward +inf of ``x``)."""
    grid = _grid(fmt)
    xd = x.detach().cpu().double().reshape(-1)
    hi_i = torch.searchsorted(grid, xd, side="left").clamp(max=grid.numel() - 1)
    lo_i = (torch.searchsorted(grid, xd, side="right") - 1).clamp(min=0)
    return grid[lo_i].reshape(x.shape), grid[hi_i].reshape(x.shape)


def unbiasedness_z(samples: torch.Tensor, x: torch.Tensor, fmt: str) -> torch.Tensor:
    """z-scores of the sample means of stochastic rounding: ``samples`` (n, *x.shape) rounded values.

    For each element, the mean of the ``n`` samples against ``x``, in units of the standard error of
    a correct stochastic rounding, ``(hi - lo) * sqrt(p (1 - p) / n)`` with ``p = (x - lo) / (hi - lo)``.
    For an unbiased rounding every z is approximately standard normal; a value that must round
    exactly (``lo == hi``, or a correct rounding with p in {0, 1}) gets z = 0 if every sample equals it,
    and inf otherwise.
    """
    lo, hi = neighbours(x, fmt)
    s = samples.detach().cpu().double()
    n = s.shape[0]
    xd = x.detach().cpu().double()
    width = hi - lo
    p = torch.where(width > 0, (xd - lo) / torch.where(width > 0, width, 1.0), 0.0)
    se = width * torch.sqrt(p * (1 - p) / n)
    dev = s.mean(0) - xd
    exact = se == 0
    z = torch.where(exact, torch.where(dev.abs() == 0, 0.0, torch.inf), dev / torch.where(exact, 1.0, se))
    return z


__all__ = [
    "BLOCK",
    "RANDOM_BITS",
    "TARGETS",
    "neighbours",
    "random_bits",
    "stochastic_round",
    "stochastic_round_bits_reference",
    "stochastic_round_reference",
    "unbiasedness_z",
]
