"""Compiled Triton's approximate fp32 math on Hopper, reproduced bit for bit in NumPy for CPU mode.

Appendix A (CPU mode), no lab.  Entry points: :func:`div`, :func:`sqrt`, :func:`rsqrt`, :func:`exp`,
:func:`exp2`, :func:`log`, :func:`log2`.

On an H100/H200, Triton 3.6 compiles fp32 arithmetic that is *not* IEEE-correct:

* ``x / y`` is ``div.full.f32``, which ptxas turns into: if ``|y| > 2^126``, multiply both by 1/4; if
  ``|y| < 2^-126`` (or NaN), multiply both by ``2^24``; then ``x * MUFU.RCP(y)`` in one fp32 multiply.
* ``tl.sqrt``, ``tl.rsqrt`` and ``tl.exp2`` are ``sqrt / rsqrt / ex2.approx.ftz.f32``: one instruction
  of the special-function unit (MUFU), subnormal inputs and outputs flushed to zero.
* ``tl.exp(x)`` is ``ex2.approx.f32(x * 1.442695f)``, whose subnormal-preserving form ptxas writes as:
  if ``t < -126``, halve ``t``, take ``MUFU.EX2`` and square the result.
* ``tl.log`` and ``tl.log2`` are libdevice's ``logf`` / ``log2f``: an integer split of the input into
  exponent and mantissa, then a degree-9/10 polynomial of fp32 fused multiply-adds (``.ftz``).

The MUFU instructions are table-driven hardware whose results no formula gives; they were read on an
H200 (``tests/data/record_hopper_approx.py``) over the inputs that fix all their results: a
reciprocal depends on the mantissa only, a square root and reciprocal square root on the mantissa and
the exponent's parity, and ``ex2`` on the input truncated toward zero to a 23-bit fixed-point
fraction (measured: every x in [-1, 1) and 2^24 random inputs up to |x| = 130 agree with that
truncation).  ``kernels/data/hopper_mufu.npz`` keeps those tables (58.7 M results in 0.84 MB, as steps
between neighbours); the rest is exact fp32 arithmetic.  ``tests/test_hopper_math.py`` replays every
operation against what the GPU produced on adversarial inputs of every magnitude.

NaN results are the canonical ``0x7FFFFFFF`` that Hopper writes.  These functions take and return
float32 NumPy arrays.
"""

import functools
import pathlib

import numpy as np

TABLES = pathlib.Path(__file__).parent / "data" / "hopper_mufu.npz"

_NAN = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_MANT = np.uint32(0x7FFFFF)
F32 = np.float32


@functools.cache
def table(name: str) -> np.ndarray:
    """One instruction's recorded results (uint32 bits), decoded from its steps on first use."""
    with np.load(TABLES) as z:
        steps = np.concatenate([z[f"{name}_first"].astype(np.int64), z[f"{name}_steps"].astype(np.int64)])
    return np.cumsum(steps).astype(np.uint32)


def provenance() -> dict:
    with np.load(TABLES) as z:
        return {k[5:]: str(z[k]) for k in z.files if k.startswith("meta_")}


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(np.uint32)  # same width: a view of any layout, 0-d kept


def _float(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(F32)


def _fields(bits):
    return bits & _SIGN, ((bits >> 23) & 0xFF).astype(np.int64), bits & _MANT


def _scaled(t: np.ndarray, shift: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Table bits ``t`` (a normal value) times ``2^shift``, with ``sign``; past fp32's normal range the
    result is inf (overflow) or zero (the .ftz flush)."""
    e = ((t >> 23) & 0xFF).astype(np.int64) + shift
    out = sign | (np.clip(e, 1, 254).astype(np.uint32) << 23) | (t & _MANT)
    out = np.where(e >= 255, sign | np.uint32(0x7F800000), out)
    return np.where(e <= 0, sign, out).astype(np.uint32)


def rcp(x: np.ndarray) -> np.ndarray:
    """``rcp.approx.ftz.f32`` (MUFU.RCP)."""
    b = _bits(x)
    sign, e, m = _fields(b)
    out = _scaled(table("rcp")[m], 127 - np.maximum(e, 1), sign)
    out = np.where(e == 0, sign | np.uint32(0x7F800000), out)  # +-0 and flushed subnormals: +-inf
    out = np.where(e == 255, np.where(m == 0, sign, _NAN), out)  # 1/inf = 0; NaN
    return _float(out)


def _root(x: np.ndarray, name: str) -> np.ndarray:
    b = _bits(x)
    sign, e, m = _fields(b)
    exp = e - 127  # x = 1.m * 2^exp = y * 4^k with y = 1.m * 2^(exp mod 2) in [1, 4)
    k = np.floor_divide(exp, 2)
    idx = (m | ((exp & 1).astype(np.uint32) << 23)).astype(np.int64)
    t = table(name)[idx]
    out = _scaled(t, k if name == "sqrt" else -k, np.uint32(0))
    zero, inf = sign, np.uint32(0x7F800000)
    if name == "sqrt":
        out = np.where(e == 0, zero, out)  # sqrt(+-0) = +-0 (subnormals flushed first)
        out = np.where(e == 255, np.where((m == 0) & (sign == 0), inf, _NAN), out)
    else:
        out = np.where(e == 0, sign | inf, out)  # rsqrt(+-0) = +-inf
        out = np.where(e == 255, np.where((m == 0) & (sign == 0), np.uint32(0), _NAN), out)
    out = np.where((sign != 0) & (e != 0) & ~((e == 255) & (m != 0)), _NAN, out)  # negative: NaN
    return _float(out)


def sqrt(x: np.ndarray) -> np.ndarray:
    """``sqrt.approx.ftz.f32`` (MUFU.SQRT): ``tl.sqrt``."""
    return _root(x, "sqrt")


def rsqrt(x: np.ndarray) -> np.ndarray:
    """``rsqrt.approx.ftz.f32`` (MUFU.RSQ): ``tl.rsqrt``."""
    return _root(x, "rsqrt")


def ex2_ftz(x: np.ndarray) -> np.ndarray:
    """``ex2.approx.ftz.f32`` (MUFU.EX2): ``tl.exp2``."""
    b = _bits(x)
    sign, e, m = _fields(b)
    mag = np.where((e == 0) | np.isnan(_float(b)), F32(0), np.abs(_float(b))).astype(np.float64)  # .ftz
    fixed = np.trunc(np.minimum(mag, 256.0) * (1 << 23)).astype(np.int64)  # 23-bit fraction, toward zero
    whole, frac = fixed >> 23, fixed & 0x7FFFFF
    pos = _scaled(table("ex2_pos")[frac], whole, np.uint32(0))
    neg = _scaled(table("ex2_neg")[frac], -whole, np.uint32(0))
    out = np.where(sign != 0, neg, pos)
    return _float(np.where((e == 255) & (m != 0), _NAN, out))


def ex2(x: np.ndarray) -> np.ndarray:
    """``ex2.approx.f32`` as ptxas writes it (halve below -126, MUFU.EX2, square): subnormal results."""
    x = np.asarray(x, dtype=F32)
    low = ~(x >= F32(-126))  # NaN too, as FSETP.GEU
    with np.errstate(all="ignore"):
        r = ex2_ftz(np.where(low, x * F32(0.5), x))
        return np.where(low, r * r, r).astype(F32)


def exp(x: np.ndarray) -> np.ndarray:
    """``tl.exp``: one fp32 multiply by log2(e) (rounded), then :func:`ex2`."""
    with np.errstate(all="ignore"):
        return ex2(np.asarray(x, dtype=F32) * F32(1.4426950216293334961))


def div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``div.full.f32``: fp32 ``x / y`` in compiled Triton."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=F32), np.asarray(y, dtype=F32))
    with np.errstate(all="ignore"):
        big = np.abs(y) > F32(2.0**126)
        small = ~(np.abs(y) >= F32(2.0**-126))
        scale = np.where(big, F32(0.25), np.where(small, F32(2.0**24), F32(1.0)))
        q = (x * scale) * rcp(y * scale)
    return _canonical(q.astype(F32))


def _canonical(v: np.ndarray) -> np.ndarray:
    b = _bits(v)
    return _float(np.where(np.isnan(v), _NAN, b))


def _flush(v: np.ndarray) -> np.ndarray:
    """.ftz: subnormal fp32 values become zero of the same sign."""
    b = _bits(v)
    return _float(np.where((b & np.uint32(0x7F800000)) == 0, b & _SIGN, b))


def fma(a, b, c, ftz: bool = False) -> np.ndarray:
    """fp32 fused multiply-add rounded once (to nearest even), as ``fma.rn[.ftz].f32``.

    The product of two fp32 values is exact in float64; the sum is computed in float64 with its
    rounding error (two-sum) and rounded to odd, so the final rounding to fp32 is the correct one."""
    a, b, c = (np.asarray(v, dtype=F32) for v in np.broadcast_arrays(a, b, c))
    if ftz:
        a, b, c = _flush(a), _flush(b), _flush(c)
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bp = s - c64
        err = (p - bp) + (c64 - (s - bp))  # exact: s + err == p + c
        sb = s.view(np.uint64)
        inexact = np.isfinite(s) & (err != 0) & ((sb & 1) == 0)
        toward = np.where((err > 0) == (s > 0), sb + 1, sb - 1)  # away from or toward zero by one ulp
        s = np.where(inexact, toward.view(np.float64), s)
        s = np.where(s == 0, p + c64, s)  # exact zero: IEEE's sign rule
        out = s.astype(F32)
    out = _canonical(out)
    return _flush(out) if ftz else out


# libdevice's logf / log2f (as Triton 3.6 inlines them): x = m * 2^e with m in [0.666, 1.333) (log2f) or
# [0.707, 1.414) (logf), then a polynomial in m - 1; constants as the fp32 bit patterns in the PTX.
_LOG2 = (-1060439283, [0x3DC6B27F, 0xBE2C7F30, 0x3E2FCF2A, 0xBE374E43, 0x3E520BF4, 0xBE763C8B, 0x3E93BF99,
                       0xBEB8AA49, 0x3EF6384A, 0xBF38AA3B])  # fmt: skip
_LOG = (-1059760811, [0xBE055027, 0x3E1039F6, 0xBDF8CDCC, 0x3E0F2955, 0xBE2AD8B9, 0x3E4CED0B, 0xBE7FFF22,
                      0x3EAAAA78, 0xBF000000])  # fmt: skip


def _const(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(F32)[0]


def _libdevice_log(x: np.ndarray, base2: bool) -> np.ndarray:
    x = np.asarray(x, dtype=F32)
    offset, coeffs = _LOG2 if base2 else _LOG
    with np.errstate(all="ignore"):
        tiny = x < F32(2.0**-126)
        xs = np.where(tiny, x * F32(2.0**23), x)  # exact: subnormals made normal
        bias = np.where(tiny, F32(-23.0), F32(0.0))
        ib = _bits(xs).view(np.int32)
        e = (ib + np.int32(offset)) & np.int32(-8388608)  # the exponent, as an integer times 2^23
        m = _float((ib - e).view(np.uint32))
        f = (m - F32(1.0)).astype(F32)
        k = fma(e.astype(F32), F32(2.0**-23), bias, ftz=True)  # the exponent as a float
        r = np.full_like(f, _const(coeffs[0]))
        for c in coeffs[1:]:
            r = fma(r, f, _const(c), ftz=True)
        if base2:
            r = (f * ((f * r).astype(F32))).astype(F32)
            r = fma(f, _const(0x3FB8AA3B), r, ftz=True)  # f * log2(e) + f^2 * poly
            out = (k + r).astype(F32)
        else:
            r = (f * r).astype(F32)
            r = fma(r, f, f, ftz=True)
            out = fma(k, _const(0x3F317218), r, ftz=True)  # k * ln(2) + ...
        special = ~(_bits(xs) < np.uint32(0x7F800000))  # negative, inf or NaN
        out = np.where(special, fma(xs, F32(np.inf), F32(np.inf), ftz=True), out)
        out = np.where(xs == 0, F32(-np.inf), out)
    return _canonical(out.astype(F32))


def log2(x: np.ndarray) -> np.ndarray:
    """``tl.log2`` (libdevice log2f)."""
    return _libdevice_log(x, base2=True)


def log(x: np.ndarray) -> np.ndarray:
    """``tl.log`` (libdevice logf)."""
    return _libdevice_log(x, base2=False)


UNARY = {"sqrt": sqrt, "rsqrt": rsqrt, "exp": exp, "exp2": ex2_ftz, "log": log, "log2": log2}

__all__ = ["UNARY", "div", "ex2", "ex2_ftz", "exp", "fma", "log", "log2", "provenance", "rcp", "rsqrt", "sqrt"]
