"""A bit-exact NumPy model of Hopper's FP8 tensor-core dot with an fp32 accumulator.

Appendix A (CPU mode), no lab.  Entry point: :func:`fp8_matmul`.

On sm_90, Triton lowers ``tl.dot(a, b, acc)`` on FP8 operands (``float8e4nv`` = e4m3, ``float8e5`` =
e5m2) with an fp32 ``acc`` to a sequence of ``wgmma.mma_async ... .f32.e4m3.e4m3`` (or ``.e5m2``)
instructions, each adding K = :data:`MMA_K` = 32 products to the accumulator, in increasing K order.
Triton's default ``max_num_imprecise_acc`` on sm_90 is 2^30, so the accumulator is never promoted to a
separate fp32 sum: a chain ``acc = tl.dot(a_k, b_k, acc)`` over all of K is one chain of such
instructions.  One instruction computes, for every output ``(m, n)``:

1. each product exactly, as a significand ``s_a * s_b`` (in [0, 4): no normalisation of a product in
   [2, 4)) with exponent ``e_a + e_b``, where an operand's ``(s, e)`` has ``1 <= |s| < 2`` and a
   *subnormal* operand keeps the format's minimum exponent (-6 for e4m3, -14 for e5m2) with
   ``|s| < 1``; zero products take no part in step 2;
2. the largest exponent ``E`` among the 32 products and the incoming accumulator (taken the same
   way, fp32's minimum exponent -126 for subnormals);
3. every product and the accumulator aligned to ``E`` and truncated toward zero (sign and magnitude)
   to :data:`ALIGN_FRACTION_BITS` = 13 fraction bits, i.e. to a multiple of ``2^(E - 13)``;
4. the 33 aligned terms summed exactly;
5. the sum normalised and truncated toward zero to :data:`RESULT_FRACTION_BITS` = 13 fraction bits
   (an "e8m13" value in an fp32 register: its 10 lowest significand bits are zero).

So the accumulator never holds more than 14 significant bits, products far below the largest term
lose their low bits or vanish, and a product with a subnormal operand is aligned as if it were
larger than it is: its instruction keeps one bit less per leading zero of the subnormal's
significand (3 for e4m3's smallest, 2^-9 = 0.001b * 2^-6).  No finite inputs overflow: a product is
below 2^32, far under what an fp32 accumulator near its maximum would need to round up.

Evidence
--------
* ``tests/data/hopper_numerics.npz`` (an H200, compiled Triton 3.6): ``dot_e4m3_default`` and
  ``dot_e5m2_default``, each a (64, 64) result of ``acc = tl.dot(a[:, k:k+64], b[k:k+64, :], acc)``
  for k = 0, 64, ..., 448 (16 instructions per output).  This model reproduces **4096 / 4096** outputs
  bit for bit in both formats.  The nearest alternatives match far fewer (e4m3 / e5m2): products
  normalised to [1, 2) before alignment 61.0% / 69.3%; floor (two's-complement) truncation instead of
  toward zero 0% / 0%; accumulator left out of the alignment maximum 6.9% / 7.5%; accumulator added
  unaligned 86.2% / 84.2%; 12 or 14 alignment bits 5.1% / 5.0% and 8.0% / 8.5%; result rounded to
  nearest instead of truncated 52.2% / 54.4%; result kept to 23 bits 91.1% / 91.9%; groups of 16
  24.3% / 26.3%, of 64 21.3% / 22.9%; the two 32-wide halves of each 64-wide dot swapped 11.7% / 13.9%.
  (The existing rough model, ``kernels.fp8_gemm.emulate_hopper_fp8_accumulator``, is step 1-4 with
  normalised products and a round-to-nearest fp32 result.)
* Chapter 3's probe (:func:`kernels.accumulate.accumulator_probe`) on the H200: a large product at
  K-index 0 and a ``2^-j`` times smaller one at K-index ``k``, every operand a power of two, the large
  product's operands including a subnormal e4m3 (2^-9).  Bits kept: 10 for k = 1, 16, 31 (same
  instruction: the large product's exponent counts as ``-6 + 8 = 2`` while its value is ``2^-1``, 3
  bits higher) and 13 for k = 32 ... 255 (the large value now sits normalised in the accumulator).
  This model gives the same table; with subnormals normalised it would give 13 everywhere.
* 28 further H200 experiments (compiled Triton 3.6, torch 2.11; 132,096 outputs), all reproduced bit
  for bit: random codes over each format's whole range, subnormal-heavy operands, mixed e4m3 x e5m2
  and e5m2 x e4m3, BLOCK_K of 32 to 256, B loaded K-major and transposed, tiles from 64x16 to
  128x128 (4 and 8 warps), a loaded full-precision fp32 accumulator, ``max_num_imprecise_acc`` of
  32, 64 and 128, and targeted cases, which decide what the two sets above leave open: a zero
  operand does not enter the alignment maximum (taking the minimum exponent instead: 51.7% / 60.9%
  of a targeted set); a subnormal operand in an instruction's largest product aligns at the
  minimum exponent (normalising it: 9.4% / 13.1%); a subnormal accumulator is kept, truncated to
  13 fraction bits below 2^-126 (flushing it: 93.0%); a full-precision accumulator is truncated
  at the alignment before the sum (added exactly, the sum then truncated: 74.3%); an exactly zero
  result is +0 whatever the signs, even for a -0 accumulator; every NaN result is 0x7FFFFFFF
  (input payloads and signs are dropped), inf - inf and inf x 0 give that NaN, and infinities
  pass.  Single outputs of these runs are pinned in ``tests/test_hopper_mma.py``.
* The same algorithm as MMA-Sim's Hopper FP8 wgmma model (arXiv:2511.10909): 13 fraction bits, the
  accumulator in the alignment, toward-zero truncation, an "e8m13" result.

Where Triton does not use wgmma, this model does not apply.  In the runs above Triton 3.6 on sm_90
lowered FP8 ``tl.dot`` to wgmma for 4 or 8 warps and tiles of 64x16, 64x64, 128x64, 64x128 and
128x128; for tiles of 16x64, 32x64 and 64x8 with 4 warps, and for 1 or 2 warps, it widened the
operands to fp16 and used ``mma.sync.m16n8k16.f32.f16.f16.f32``, which keeps more bits (99% of its
results have bits set below the 13th fraction bit) and whose results this model misses (1 of 7,936
matches); that path is not modelled here.

K must be a multiple of 32.  Triton itself refuses FP8 (any 8-bit) ``tl.dot`` operands with K < 32 on
NVIDIA GPUs ("Input shapes should have M >= 1, N >= 1 and K >= 32"), and its block sizes are powers
of two, so every K it compiles is a multiple of 32; a K of 16 has no Hopper behaviour to model.
"""

import ml_dtypes
import numpy as np

MMA_K = 32  # K-elements one Hopper FP8 wgmma instruction adds into the accumulator
ALIGN_FRACTION_BITS = 13  # fraction bits each aligned term keeps below the largest exponent
RESULT_FRACTION_BITS = 13  # fraction bits of the normalised result written back to the fp32 register
FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MIN_EXPONENT = {"e4m3": -6, "e5m2": -14, "fp32": -126}  # exponent a subnormal keeps (1 <= |s| < 2 otherwise)
CANONICAL_NAN = np.uint32(0x7FFFFFFF)

_ZERO_EXPONENT = -(1 << 20)  # zero operands: far below every other exponent, so they never set the maximum
_RESULT_MASK = np.uint32((0xFFFFFFFF << (23 - RESULT_FRACTION_BITS)) & 0xFFFFFFFF)


def _split(x: np.ndarray, fmt: str) -> tuple:
    """``x = s * 2^e`` with ``1 <= |s| < 2``, or ``|s| < 1`` at the format's minimum exponent."""
    m, e = np.frexp(x)
    emin = MIN_EXPONENT[fmt]
    e = e - 1
    low = e < emin
    s = np.where(low, np.ldexp(m, np.maximum(e - emin + 1, -1100)), m * 2)
    e = np.where(x == 0, _ZERO_EXPONENT, np.maximum(e, emin))
    return s, e.astype(np.int32)


def _operand(x, fmt, name: str) -> np.ndarray:
    if fmt not in FORMATS:
        raise ValueError(f"{name}_format must be one of {list(FORMATS)}, got {fmt!r}")
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        back = x64.astype(FORMATS[fmt]).astype(np.float64)
    ok = (back == x64) | (np.isnan(back) & np.isnan(x64))
    if not ok.all():
        i, j = np.argwhere(~ok)[0]
        raise ValueError(f"{name}[{i}, {j}] = {x64[i, j]!r} is not a {fmt} value")
    return x64


def _format_of(x, given, name: str) -> str:
    dtype = getattr(x, "dtype", None)
    for fmt, np_dtype in FORMATS.items():
        if dtype == np_dtype:
            if given is not None and given != fmt:
                raise ValueError(f"{name} holds {fmt} values but {name}_format={given!r}")
            return fmt
    return "e4m3" if given is None else given


def _mma(at, eat, b, eb, acc: np.ndarray) -> np.ndarray:
    """One instruction: acc (M, N) fp32 plus the products of a (M, 32) and b (32, N), the hardware's way.

    ``at`` / ``b`` are the operand values as float32 (exact), ``at`` transposed to (32, M); ``eat`` /
    ``eb`` their exponents as the hardware takes them (:func:`_split`).  ``s_a s_b 2^(e_a + e_b)`` is
    just the product's value, so the exponent convention matters only for the alignment exponent."""
    with np.errstate(invalid="ignore"):  # signalling NaNs
        acc = acc.astype(np.float64)
    sc, ec = _split(np.where(np.isfinite(acc), acc, 0.0), "fp32")  # inf / NaN: handled by the caller
    top = np.maximum((eat[:, :, None] + eb[:, None, :]).max(axis=0), ec)  # (M, N): the alignment exponent E
    # 2^(13 - E) as float32; capped where E is tiny (then every product is zero and the cap is harmless)
    scale = np.ldexp(np.float32(1.0), np.minimum(ALIGN_FRACTION_BITS - top, 100)).astype(np.float32)
    # Products of FP8 values have at most 8 significant bits and lie in float32's normal range, and
    # each aligned term is below 2^15, so products, scaling (bar underflow of terms < 1, which truncate
    # to zero anyway), truncation and the sum of 32 terms are all exact in float32.
    terms = at[:, :, None] * b[:, None, :]  # (32, M, N)
    terms *= scale
    np.trunc(terms, out=terms)
    cterm = np.trunc(np.ldexp(sc, ALIGN_FRACTION_BITS + np.maximum(ec - top, -1100)))
    # At most 33 terms below 2^15: an integer of at most 21 bits, times a power of two >= 2^-139,
    # so the float32 conversion is exact (or overflows to inf); masking the bits truncates to 13.
    total = terms.sum(axis=0, dtype=np.float32).astype(np.float64) + cterm
    zero = total == 0
    total[zero] = 0.0  # an exact zero comes out +0, whatever the signs that cancelled
    exponent = np.where(zero, 0, top - ALIGN_FRACTION_BITS)
    with np.errstate(over="ignore"):
        out = np.ldexp(total, exponent).astype(np.float32)
    return (out.view(np.uint32) & _RESULT_MASK).view(np.float32)


def fp8_dot(
    a, b, acc, a_format: str | None = None, b_format: str | None = None, max_num_imprecise_acc: int | None = None
) -> np.ndarray:
    """One ``tl.dot(a, b, acc)`` on FP8 operands with an fp32 accumulator, as an H100/H200 computes it.

    ``a`` is (M, K) and ``b`` (K, N): FP8 values as float64 (or any float array), or arrays of
    ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``, whose dtype then names the format; otherwise
    ``a_format`` / ``b_format`` do ("e4m3", the default, or "e5m2"; Hopper allows mixing them).  The
    format matters only for subnormals, which keep its minimum exponent.  ``acc`` is the (M, N)
    fp32 accumulator going in.  K must be a multiple of :data:`MMA_K` (see the module docstring).

    Returns the (M, N) float32 accumulator coming out: ``K / 32`` instructions applied in increasing K
    order, each as the module docstring describes.  A chain of calls over consecutive K-slices is
    the same as one call over their concatenation, whatever the slices' widths.

    ``max_num_imprecise_acc`` is ``tl.dot``'s argument of that name.  None (Triton's default on sm_90,
    2^30) or any value above K: no promotion.  A value ``P <= K``: Triton's lowering runs the
    instructions into a separate partial accumulator starting from zero, and adds it to ``acc`` with
    an ordinary fp32 add (round to nearest) after every ``ceil(P / 32)`` instructions and after the
    dot's last one; P = 0 promotes after every instruction.
    """
    a_format = _format_of(a, a_format, "a")
    b_format = _format_of(b, b_format, "b")
    a64 = _operand(a, a_format, "a")
    b64 = _operand(b, b_format, "b")
    acc = np.asarray(acc)
    if acc.dtype != np.float32:
        raise TypeError(f"acc must be float32 (the fp32 accumulator), got {acc.dtype}")
    (M, K), (K2, N) = a64.shape, b64.shape
    if K != K2:
        raise ValueError(f"a is {a64.shape} and b is {b64.shape}: a's columns must equal b's rows")
    if acc.shape != (M, N):
        raise ValueError(f"acc must have shape {(M, N)}, got {acc.shape}")
    if K % MMA_K:
        raise ValueError(
            f"K = {K} is not a multiple of {MMA_K}: Hopper's FP8 MMA adds {MMA_K} products per instruction, "
            f"and Triton refuses FP8 tl.dot with K < 32"
        )
    finite = np.isfinite(a64).all() and np.isfinite(b64).all() and np.isfinite(acc).all()
    af = a64 if finite else np.where(np.isfinite(a64), a64, 0)
    bf = b64 if finite else np.where(np.isfinite(b64), b64, 0)
    eat, eb = np.ascontiguousarray(_split(af, a_format)[1].T), _split(bf, b_format)[1]
    at, b32 = np.ascontiguousarray(af.T.astype(np.float32)), bf.astype(np.float32)
    if max_num_imprecise_acc is not None and (
        isinstance(max_num_imprecise_acc, bool) or not isinstance(max_num_imprecise_acc, int | np.integer)
    ):
        raise TypeError(f"max_num_imprecise_acc must be an int or None, got {max_num_imprecise_acc!r}")
    promote = max_num_imprecise_acc is not None and max_num_imprecise_acc <= K  # else one chain through acc
    every = max(1, -(-int(max_num_imprecise_acc) // MMA_K)) if promote else K // MMA_K
    out = acc.copy()
    part = np.zeros_like(out) if promote else out
    for i, k in enumerate(range(0, K, MMA_K)):
        g = slice(k, k + MMA_K)
        new = _mma(at[g], eat[g], b32[g], eb[g], part)
        if not finite:  # inf and NaN go around the fixed-point datapath
            with np.errstate(invalid="ignore", over="ignore"):
                exact = (a64[:, g] @ b64[g]) + part.astype(np.float64)
            new = np.where(np.isfinite(exact), new, exact.astype(np.float32))
            new = np.where(np.isnan(exact), CANONICAL_NAN.view(np.float32), new)
        part = new
        if promote and ((i + 1) % every == 0 or k + MMA_K == K):
            with np.errstate(invalid="ignore", over="ignore"):
                # fp32 add, round to nearest: the float64 sum rounded to fp32 is it (53 >= 2 * 24 + 2)
                summed = out.astype(np.float64) + part
            out = np.where(np.isnan(summed), CANONICAL_NAN.view(np.float32), summed.astype(np.float32))
            part = np.zeros_like(out)
    return out if promote else part


def fp8_matmul(
    a,
    b,
    block_k: int = MMA_K,
    a_format: str | None = None,
    b_format: str | None = None,
    max_num_imprecise_acc: int | None = None,
) -> np.ndarray:
    """``acc = 0; for each block_k-wide K-slice: acc = tl.dot(a_k, b_k, acc)``: one output tile of an FP8
    GEMM on Hopper.  Without promotion ``block_k`` does not change the result (see :func:`fp8_dot`)."""
    if block_k % MMA_K:
        raise ValueError(f"block_k must be a multiple of {MMA_K}, got {block_k}")
    a = np.asarray(a)
    b = np.asarray(b)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(0, a.shape[1], block_k):
        acc = fp8_dot(a[:, k : k + block_k], b[k : k + block_k], acc, a_format, b_format, max_num_imprecise_acc)
    return acc


__all__ = [
    "ALIGN_FRACTION_BITS",
    "FORMATS",
    "MIN_EXPONENT",
    "MMA_K",
    "RESULT_FRACTION_BITS",
    "fp8_dot",
    "fp8_matmul",
]
