"""INT4 weights with one scale (and one zero point) per group of K: the weight-only format of GPTQ, AWQ and
PyTorch's tinygemm kernel, its packing two codes to a byte, and what it costs in bits.

Chapter 7 (inference in low precision), no lab.  Entry points: :func:`quantize_int4`,
:func:`dequantize_int4`, :func:`pack_int4`, :func:`unpack_int4`, :func:`bits_per_weight`,
:func:`tinygemm_operands`, :func:`tinygemm_weight`.  Everything here but the last is plain PyTorch and
runs on any device: the quantizer and dequantizer are the references of the format.  The GPU GEMM that
reads these weights is PyTorch's ``torch.ops.aten._weight_int4pack_mm`` (tinygemm), fed by
:func:`tinygemm_operands`, or by :func:`tinygemm_weight`, which builds its CUDA layout from a weight.

The encoding works on groups of ``group`` consecutive elements along a row of a weight ``(N, K)`` (K is the
GEMM's reduction axis; 128 by default), each with its own reconstruction scale ``S``:

* **asymmetric** (the default; the layout of GPTQ's and AWQ's checkpoints): ``x ~= S * (q - z)`` with codes
  ``q`` in [0, 15] and an integer zero point ``z`` in [0, 15].  The group's range ``[lo, hi] =
  [min(min x, 0), max(max x, 0)]`` includes 0; ``S = (hi - lo) / 15`` in fp32, then rounded to
  ``scale_dtype``; ``z = clamp(rne(-lo / S), 0, 15)``; ``q = clamp(rne(x / S) + z, 0, 15)``.  0.0 is
  exact (it is code ``z``), and every element lies within ``S / 2`` of its reconstruction (a little more
  when ``S`` is stored in bf16 or fp16 and its rounding shrinks the range: at most ``15 u S`` more, ``u``
  the scale format's unit roundoff).
* **symmetric** (``symmetric=True``): ``x ~= S * q`` with ``q`` in [-8, 7], ``S = amax / 7.5`` (GPTQ's
  symmetric rule) and no zero point.  The sixteen codes cover ``[-8 S, 7 S]``; the one value they miss,
  ``+7.5 S``, is ``S / 2`` from ``7 S``, no worse than rounding.  Unlike INT8's symmetric codes (which skip
  -128 so that an int8 GEMM can negate them), nothing here multiplies codes: a weight-only kernel turns
  them back into floats first, so all sixteen are used.

``rne`` rounds to the nearest integer, ties to even (``torch.round``), after a correctly rounded fp32
division.  An all-zero group gets ``S = 1`` and ``z = 0``, so its codes are 0 (8 in the symmetric
variant's offset form below).  INT4 has no NaN and no infinity: a non-finite element is refused with a
``ValueError`` naming its rows.

Storage (:class:`Int4Tensor`): codes packed two per byte along K, **element 2i in the low nibble**, as
:func:`kernels.fp4.pack` packs FP4 and as GPTQ packs eight codes into each int32 word (symmetric codes
as two's-complement nibbles); scales ``(N, K // group)`` in ``scale_dtype``; zero points ``(N, K // group)``
uint8 (``None`` when symmetric).  PyTorch's CUDA converter for tinygemm,
``torch.ops.aten._convert_weight_to_int4pack(packed, inner_k_tiles)``, reads bytes with element 2i in the
**high** nibble (``order="high"``); its CPU twin ``_convert_weight_to_int4pack_for_cpu`` takes the codes
unpacked, as int32.  tinygemm dequantizes ``(u - 8) * scale + zero`` with ``u`` in [0, 15] and a *float*
zero, its ``scales_and_zeros`` shaped ``(K // group, N, 2)``: an asymmetric code is ``u = q`` with
``zero = S * (8 - z)``, a symmetric one ``u = q + 8`` with ``zero = 0``.
"""

from typing import NamedTuple

import torch

GROUP = 128  # elements of K per scale: GPTQ's, AWQ's and tinygemm's usual choice
QMAX_ASYMMETRIC = 15  # codes 0..15
QMIN_SYMMETRIC, QMAX_SYMMETRIC = -8, 7
SYMMETRIC_DIVISOR = 7.5  # S = amax / 7.5: the codes' range [-8, 7] is centred on -0.5
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ORDERS = ("low", "high")  # which nibble holds element 2i: ours and GPTQ's, or tinygemm's CUDA packer's
TINYGEMM_OFFSET = 8  # tinygemm reads u - 8


class Int4Tensor(NamedTuple):
    """A group-quantized INT4 weight: ``q`` packed codes (uint8 ``(N, K // 2)``, element 2i in the low
    nibble), ``scale`` reconstruction scales ``(N, K // group)``, ``zero`` integer zero points (uint8
    ``(N, K // group)``, ``None`` for symmetric codes) and ``group``."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group: int

    @property
    def shape(self) -> tuple:
        """The shape of the weight the codes stand for: ``(N, K)``."""
        return (self.q.shape[0], self.q.shape[1] * 2)

    @property
    def symmetric(self) -> bool:
        return self.zero is None


# -- argument checks ------------------------------------------------------------------------------


def _check_weight(w, group) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in INPUT_DTYPES:
        raise TypeError(f"w must be bfloat16, float16 or float32, got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"w must be a 2-D weight (N, K), got shape {tuple(w.shape)}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")
    if w.shape[1] % group or w.shape[1] % 2:
        raise ValueError(f"w's K = {w.shape[1]} must be even (two codes per byte) and a multiple of group = {group}")
    bad = torch.nonzero(~torch.isfinite(w).all(dim=1)).reshape(-1)
    if bad.numel():
        rows = bad[:8].tolist()
        more = f" and {bad.numel() - 8} more" if bad.numel() > 8 else ""
        raise ValueError(f"w has NaN or infinite values in rows {rows}{more}: INT4 cannot encode them")
    return w


def _check_scales(s: torch.Tensor, spread: torch.Tensor, scale_dtype: torch.dtype) -> None:
    bad = ((s.float() == 0) & (spread > 0)) | ~torch.isfinite(s.float())  # (N, K // group)
    rows = torch.nonzero(bad.any(dim=1)).reshape(-1)
    if rows.numel():
        raise ValueError(
            f"the scales of rows {rows[:8].tolist()} underflow to 0 or overflow in {scale_dtype}: "
            "the weight's range there is too small or too large for that scale format"
        )


def _check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    return order


def check_int4(t) -> int:
    """The group size of an :class:`Int4Tensor` whose parts agree with each other; errors otherwise."""
    if not isinstance(t, Int4Tensor):
        raise TypeError(f"expected an Int4Tensor (from quantize_int4), got {type(t).__name__}")
    if t.q.dtype != torch.uint8 or t.q.dim() != 2:
        raise TypeError(f"q must be 2-D uint8 packed codes, got {t.q.dtype} of shape {tuple(t.q.shape)}")
    n, k = t.shape
    if isinstance(t.group, bool) or not isinstance(t.group, int) or t.group < 1 or k % t.group:
        raise ValueError(f"group must be an int that divides K = {k}, got {t.group!r}")
    groups = (n, k // t.group)
    if t.scale.dtype not in SCALE_DTYPES or tuple(t.scale.shape) != groups:
        raise ValueError(f"scale must be {groups} in one of {SCALE_DTYPES}, got {t.scale.dtype} {tuple(t.scale.shape)}")
    if t.zero is not None and (t.zero.dtype != torch.uint8 or tuple(t.zero.shape) != groups):
        raise ValueError(f"zero must be uint8 of shape {groups} (or None), got {t.zero.dtype} {tuple(t.zero.shape)}")
    return t.group


# -- quantize and dequantize ------------------------------------------------------------------------------


def quantize_int4(
    w: torch.Tensor, group: int = GROUP, symmetric: bool = False, scale_dtype: torch.dtype = torch.float32
) -> Int4Tensor:
    """INT4 codes of a weight ``w`` ``(N, K)``, one scale (and zero point) per ``group`` elements of K.

    Asymmetric codes 0..15 with an integer zero point by default, symmetric codes -8..7 with
    ``symmetric=True``; scales stored in ``scale_dtype`` (fp32, bf16 or fp16) and used for the codes as
    stored.  See the module docstring for the rules."""
    w = _check_weight(w, group)
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {[str(d) for d in SCALE_DTYPES]}, got {scale_dtype}")
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)  # (N, K // group, group)
    if symmetric:
        amax = wg.abs().amax(dim=-1) if wg.numel() else torch.zeros(n, k // group, device=w.device)
        s = torch.where(amax > 0, amax / amax.new_tensor(SYMMETRIC_DIVISOR), torch.ones_like(amax)).to(scale_dtype)
        _check_scales(s, amax, scale_dtype)
        q = torch.clamp(torch.round(wg / s.float()[..., None]), QMIN_SYMMETRIC, QMAX_SYMMETRIC)
        return Int4Tensor(pack_int4(q.to(torch.int8).reshape(n, k)), s, None, group)
    lo = wg.amin(dim=-1).clamp(max=0.0) if wg.numel() else torch.zeros(n, k // group, device=w.device)
    hi = wg.amax(dim=-1).clamp(min=0.0) if wg.numel() else torch.zeros(n, k // group, device=w.device)
    s = torch.where(hi > lo, (hi - lo) / hi.new_tensor(float(QMAX_ASYMMETRIC)), torch.ones_like(hi)).to(scale_dtype)
    _check_scales(s, hi - lo, scale_dtype)
    sf = s.float()  # (N, K // group): the scale as stored is the one the codes are computed with
    z = torch.clamp(torch.round(-lo / sf), 0, QMAX_ASYMMETRIC)
    q = torch.clamp(torch.round(wg / sf[..., None]) + z[..., None], 0, QMAX_ASYMMETRIC)
    return Int4Tensor(pack_int4(q.to(torch.uint8).reshape(n, k)), s, z.to(torch.uint8), group)


def int4_codes(t: Int4Tensor) -> torch.Tensor:
    """The codes of ``t`` unpacked, ``(N, K)`` int16: 0..15 (asymmetric) or -8..7 (symmetric)."""
    check_int4(t)
    return unpack_int4(t.q, signed=t.symmetric)


def dequantize_int4(t: Int4Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``S * (q - z)`` (``S * q`` when symmetric) for every element: the integer difference is exact, so one
    rounding in fp32, and one more if ``out_dtype`` is narrower."""
    group = check_int4(t)
    n, k = t.shape
    q = int4_codes(t).float().reshape(n, k // group, group)  # (N, K // group, group)
    if t.zero is not None:
        q = q - t.zero.float()[..., None]
    return (q * t.scale.float()[..., None]).reshape(n, k).to(out_dtype)


# -- packing ------------------------------------------------------------------------------------------------


def pack_int4(codes: torch.Tensor, order: str = "low") -> torch.Tensor:
    """Codes ``(N, K)`` (integers in [0, 15], or in [-8, 7] stored as two's complement) -> bytes
    ``(N, K // 2)``.  ``order="low"``: element 2i in the low nibble (this module's storage);
    ``order="high"``: element 2i in the high nibble (what tinygemm's CUDA converter reads)."""
    _check_order(order)
    if not isinstance(codes, torch.Tensor) or codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor, got {getattr(codes, 'dtype', type(codes))}")
    if codes.dim() != 2 or codes.shape[1] % 2:
        raise ValueError(f"codes must be 2-D with an even K to pack two per byte, got {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < QMIN_SYMMETRIC or int(codes.max()) > QMAX_ASYMMETRIC):
        raise ValueError("codes must be in [0, 15] (or [-8, 7]): INT4 codes are 4 bits")
    c = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    even, odd = c[:, 0::2], c[:, 1::2]
    return even | (odd << 4) if order == "low" else (even << 4) | odd


def unpack_int4(packed: torch.Tensor, signed: bool = False, order: str = "low") -> torch.Tensor:
    """Bytes ``(N, K // 2)`` -> codes ``(N, K)`` int16, the inverse of :func:`pack_int4`: 0..15, or -8..7
    with ``signed=True`` (each nibble read as two's complement)."""
    _check_order(order)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TypeError(f"packed must be a 2-D uint8 tensor, got {getattr(packed, 'dtype', type(packed))}")
    p = packed.to(torch.int16)
    lo, hi = p & 0xF, p >> 4
    pairs = (lo, hi) if order == "low" else (hi, lo)
    c = torch.stack(pairs, dim=-1).reshape(p.shape[0], p.shape[1] * 2)
    return c - ((c & 8) << 1) if signed else c  # 8..15 -> -8..-1


# -- bits and the tinygemm layout ---------------------------------------------------------------------------


def bits_per_weight(group: int = GROUP, scale_bits: int = 16, zero_bits: int = 4) -> float:
    """Stored bits per weight: 4 for the code plus the group's scale and zero point spread over its
    ``group`` elements.  GPTQ and AWQ checkpoints: fp16 scales and 4-bit zero points (the defaults);
    tinygemm: a bf16 scale and a bf16 zero (``zero_bits=16``); symmetric codes: ``zero_bits=0``."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")
    if scale_bits < 0 or zero_bits < 0:
        raise ValueError(f"scale_bits and zero_bits must be >= 0, got {scale_bits} and {zero_bits}")
    return 4 + (scale_bits + zero_bits) / group


def tinygemm_operands(t: Int4Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """``(codes, scales_and_zeros)`` for PyTorch's int4 GEMM: ``codes`` ``(N, K)`` int32 in [0, 15] (give
    them to ``_convert_weight_to_int4pack_for_cpu`` as they are, or to the CUDA
    ``_convert_weight_to_int4pack`` as ``pack_int4(codes, order="high")``) and ``scales_and_zeros``
    ``(K // group, N, 2)`` in ``dtype``, such that ``(u - 8) * scale + zero`` is the weight.  The float zero
    ``S * (8 - z)`` is rounded to ``dtype``: in bf16 it carries a rounding error that the integer zero
    point did not have (up to ``2^-8`` of its value, and its value is at most ``8 S``)."""
    check_int4(t)
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"dtype must be one of {[str(d) for d in SCALE_DTYPES]}, got {dtype}")
    c = int4_codes(t).to(torch.int32)
    s = t.scale.float()
    if t.zero is None:
        u, zero = c + TINYGEMM_OFFSET, torch.zeros_like(s)
    else:
        u, zero = c, s * (TINYGEMM_OFFSET - t.zero.float())
    scales_and_zeros = torch.stack((s.T, zero.T), dim=-1).to(dtype).contiguous()  # (K // group, N, 2)
    return u.contiguous(), scales_and_zeros


def tinygemm_weight(w: torch.Tensor, group: int = GROUP, inner_k_tiles: int = 8) -> tuple:
    """A weight ``w`` ``(N, K)`` on a CUDA GPU, ready for PyTorch's int4 GEMM (what torchao's int4
    weight-only layout calls): ``(t, packed, scales_and_zeros)`` with ``t`` the asymmetric
    :class:`Int4Tensor` (bf16 scales, groups of ``group``), ``packed`` its codes in tinygemm's tiled layout
    and ``scales_and_zeros`` as :func:`tinygemm_operands` makes them, such that
    ``torch.ops.aten._weight_int4pack_mm(a, packed, group, scales_and_zeros)`` is ``a @ W^T`` for bf16
    activations ``a`` ``(M, K)``.  tinygemm needs K a multiple of ``32 * inner_k_tiles`` (2, 4 or 8)."""
    if not isinstance(w, torch.Tensor) or w.device.type != "cuda":
        raise ValueError(f"w must be a tensor on a CUDA GPU (tinygemm's layout is built there), got {w!r:.60}")
    if inner_k_tiles not in (2, 4, 8) or w.dim() != 2 or w.shape[1] % (32 * inner_k_tiles):
        raise ValueError(
            f"inner_k_tiles must be 2, 4 or 8 and w (N, K) with K a multiple of 32 * inner_k_tiles; "
            f"got {inner_k_tiles} and shape {tuple(w.shape)}"
        )
    t = quantize_int4(w, group=group, scale_dtype=torch.bfloat16)
    codes, scales_and_zeros = tinygemm_operands(t, torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack(pack_int4(codes, order="high"), inner_k_tiles)
    return t, packed, scales_and_zeros


__all__ = [
    "GROUP",
    "INPUT_DTYPES",
    "ORDERS",
    "QMAX_ASYMMETRIC",
    "QMAX_SYMMETRIC",
    "QMIN_SYMMETRIC",
    "SCALE_DTYPES",
    "SYMMETRIC_DIVISOR",
    "Int4Tensor",
    "bits_per_weight",
    "check_int4",
    "dequantize_int4",
    "int4_codes",
    "pack_int4",
    "quantize_int4",
    "tinygemm_operands",
    "tinygemm_weight",
    "unpack_int4",
]
