"""Number formats as data, a decoder for all of them, and an integer-ops encoder fp32 -> fp8/bf16.

Chapter 1 and Lab 01 (formats encoder), which builds :func:`encode`.  Entry points: :data:`FORMATS`,
:func:`decode`, :func:`encode`, :func:`properties`.

The single source of truth for what a format *is*: every later chapter takes its field widths,
biases, special values and limits from :data:`FORMATS`.

* :class:`Format` describes a binary floating-point format by its fields (sign, exponent, mantissa),
  its exponent bias and its policy for special values; :class:`IntFormat` a two's-complement integer
  format, for contrast.
* :func:`decode` turns bit patterns into values, exactly, for every format here (vectorised torch).
* :func:`properties` and :func:`format_table` give max finite, min normal, min subnormal, epsilon and
  the special values, computed by decoding every code (formats of up to 16 bits) or from the fields
  (fp32, tf32).  The tests hold them against ``torch.finfo`` and ``ml_dtypes.finfo``.
* :func:`encode` rounds fp32 to e4m3fn, e5m2 or bf16 in a Triton kernel with integer operations
  only.  Saturating, it gives the bits of the GPU's conversion (:func:`hardware_encode`, a kernel doing
  ``x.to(tl.float8e4nv)``); non-saturating, the OCP rule that :func:`ocp_encode` (ml_dtypes) follows.
  :func:`encode_bits_reference` is the same integer recipe in plain PyTorch.

Special-value policies (the ``nan`` field of :class:`Format`):

* ``"ieee"``: exponent all ones is inf (mantissa zero) or NaN (mantissa non-zero): fp32, fp16, bf16,
  tf32, e5m2.
* ``"fn"`` ("finite, NaN"): no inf; only the all-ones magnitude is NaN, so the top binade holds
  numbers: e4m3fn (S.1111.111 is NaN, S.1111.110 = 448) and the e8m0 scale (0xFF is NaN).
* ``"fnuz"`` ("finite, NaN, unsigned zero"): no inf, no negative zero; the pattern of -0 (0x80) is
  the one NaN: e4m3fnuz, e5m2fnuz (the FP8 of AMD's MI300 and Graphcore).
* ``"none"``: every pattern is a number: the MX element formats e2m1, e3m2, e2m3.

Sources: IEEE 754-2019; OCP "OFP8 Formats for Deep Learning" v1.0 (2023) for e4m3fn and e5m2;
OCP "Microscaling Formats (MX) Specification" v1.0 (2023) for e2m1, e3m2, e2m3 and e8m0.  NVIDIA's
tf32 is a tensor-core input precision, not a storage format: the operand is an fp32 in memory whose
low 13 mantissa bits the multiplier ignores.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.device import check_device

NAN_POLICIES = ("ieee", "fn", "fnuz", "none")


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: ``bits = signed + exponent_bits + mantissa_bits``.

    A normal number with exponent field ``e`` and mantissa field ``m`` is
    ``(-1)^s * 2^(e - bias) * (1 + m / 2^mantissa_bits)``; with ``has_subnormals``, ``e == 0`` means
    ``(-1)^s * 2^(1 - bias) * (m / 2^mantissa_bits)`` (zero included).  Without subnormals (only the
    e8m0 scale here) ``e == 0`` is an ordinary binade and the format has no zero.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    has_inf: bool
    nan: str  # one of NAN_POLICIES
    has_subnormals: bool = True
    signed: bool = True
    storage: bool = True  # False for tf32: a precision the tensor cores compute in, never stored
    note: str = ""

    def __post_init__(self):
        if self.nan not in NAN_POLICIES:
            raise ValueError(f"nan must be one of {NAN_POLICIES}, got {self.nan!r}")
        if self.has_inf and self.nan != "ieee":
            raise ValueError(f"{self.name}: only the 'ieee' policy has inf")

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def codes(self) -> int:
        """Number of bit patterns."""
        return 1 << self.bits

    @property
    def exponent_max_field(self) -> int:
        return (1 << self.exponent_bits) - 1


@dataclass(frozen=True)
class IntFormat:
    """A two's-complement integer format (int8, int4): evenly spaced, no exponent, no specials."""

    name: str
    bits: int
    note: str = ""

    @property
    def codes(self) -> int:
        return 1 << self.bits


FP32 = Format("fp32", 8, 23, 127, True, "ieee", note="IEEE binary32")
FP16 = Format("fp16", 5, 10, 15, True, "ieee", note="IEEE binary16")
BF16 = Format("bf16", 8, 7, 127, True, "ieee", note="the top half of an fp32: fp32's range, 8 significant bits")
TF32 = Format(
    "tf32", 8, 10, 127, True, "ieee", storage=False, note="tensor-core input precision: an fp32 read to 10 bits"
)
E4M3FN = Format("e4m3fn", 4, 3, 7, False, "fn", note="OCP FP8 E4M3: no inf, NaN = S.1111.111")
E5M2 = Format("e5m2", 5, 2, 15, True, "ieee", note="OCP FP8 E5M2: IEEE-style inf and NaN")
E4M3FNUZ = Format("e4m3fnuz", 4, 3, 8, False, "fnuz", note="FP8 E4M3 with bias 8: 0x80 is the one NaN, no -0")
E5M2FNUZ = Format("e5m2fnuz", 5, 2, 16, False, "fnuz", note="FP8 E5M2 with bias 16: 0x80 is the one NaN, no -0")
E2M1 = Format("e2m1", 2, 1, 1, False, "none", note="MX FP4 element: 0, 0.5, 1, 1.5, 2, 3, 4, 6")
E3M2 = Format("e3m2", 3, 2, 3, False, "none", note="MX FP6 element (E3M2)")
E2M3 = Format("e2m3", 2, 3, 1, False, "none", note="MX FP6 element (E2M3)")
E8M0 = Format(
    "e8m0",
    8,
    0,
    127,
    False,
    "fn",
    has_subnormals=False,
    signed=False,
    note="MX block scale: 2^(c - 127), 0xFF = NaN; no zero, no sign",
)
INT8 = IntFormat("int8", 8, note="two's complement, -128..127")
INT4 = IntFormat("int4", 4, note="two's complement, -8..7")

FORMATS = {
    f.name: f for f in (FP32, TF32, FP16, BF16, E4M3FN, E5M2, E4M3FNUZ, E5M2FNUZ, E2M1, E3M2, E2M3, E8M0, INT8, INT4)
}

# Formats torch stores one element per byte or more, for viewing raw bits as values.
TORCH_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
    "e8m0": torch.float8_e8m0fnu,
    "int8": torch.int8,
}


def get(fmt) -> Format | IntFormat:
    """A format by name (``"e4m3fn"``) or the object itself; unknown names list the known ones."""
    if isinstance(fmt, Format | IntFormat):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"fmt must be one of {sorted(FORMATS)} or a Format, got {fmt!r}") from None


# -- decoding ------------------------------------------------------------------------------------


def decode(bits: torch.Tensor, fmt) -> torch.Tensor:
    """Bit patterns -> their values, exactly, as float32 (every value of every format here fits).

    ``bits`` is an integer tensor holding one pattern per element; only the low ``fmt.bits`` bits
    are read, so an int8 tensor of e4m3 bytes (where 0x80 reads as -128) works as well as int64
    codes in ``[0, 2^bits)``.  NaN patterns decode to NaN (payload and sign are not kept), inf to inf,
    and negative zero to -0.0.
    """
    f = get(fmt)
    if not isinstance(bits, torch.Tensor):
        raise TypeError(f"bits must be a torch.Tensor of integers, got {type(bits).__name__}")
    if bits.dtype.is_floating_point or bits.dtype.is_complex or bits.dtype == torch.bool:
        raise TypeError(f"bits must have an integer dtype (bit patterns), got {bits.dtype}")
    b = bits.to(torch.int64) & (f.codes - 1)
    if isinstance(f, IntFormat):
        return torch.where(b >= f.codes // 2, b - f.codes, b).to(torch.float32)
    m_bits = f.mantissa_bits
    sign = (b >> (f.exponent_bits + m_bits)) & 1 if f.signed else torch.zeros_like(b)
    e = (b >> m_bits) & f.exponent_max_field
    m = b & ((1 << m_bits) - 1)
    # float64 holds every intermediate exactly: at most 24 significant bits, exponents in [-149, 128).
    frac = m.to(torch.float64) / (1 << m_bits)
    normal = torch.ldexp(1.0 + frac, (e - f.bias).to(torch.float64))
    if f.has_subnormals:
        sub = torch.ldexp(frac, torch.full_like(frac, 1 - f.bias))
        value = torch.where(e == 0, sub, normal)
    else:
        value = normal
    magnitude = b & ((1 << (f.exponent_bits + m_bits)) - 1)
    nan = torch.zeros_like(b, dtype=torch.bool)
    if f.nan == "ieee":
        top = e == f.exponent_max_field
        value = torch.where(top & (m == 0), math.inf, value)
        nan = top & (m != 0)
    elif f.nan == "fn":
        nan = magnitude == (1 << (f.exponent_bits + m_bits)) - 1
    elif f.nan == "fnuz":
        nan = b == 1 << (f.bits - 1)
    value = torch.where(sign == 1, -value, value)
    value = torch.where(nan, math.nan, value)
    return value.to(torch.float32)


def all_codes(fmt) -> torch.Tensor:
    """Every bit pattern of a format of at most 16 bits, as int64 in increasing order."""
    f = get(fmt)
    if f.bits > 16:
        raise ValueError(f"{f.name} has {f.bits}-bit codes: too many to list (at most 16 bits)")
    return torch.arange(f.codes, dtype=torch.int64)


# -- properties ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Properties:
    """The numbers that characterise a format.  ``epsilon`` is the spacing at 1 (2^-mantissa_bits);
    ``decimal_digits`` is log10(2^p) for p significant bits (including the implicit one)."""

    name: str
    bits: int
    max_finite: float
    min_normal: float | None  # None for integers
    min_subnormal: float | None  # None without subnormals
    epsilon: float
    decimal_digits: float
    has_inf: bool
    has_nan: bool
    has_negative_zero: bool
    finite_codes: int
    nan_codes: int
    storage: bool = True

    @property
    def dynamic_range(self) -> float:
        """log2(max finite / smallest positive): how many binades the format spans."""
        smallest = self.min_subnormal or self.min_normal or 1.0
        return math.log2(self.max_finite / smallest)


def properties_from_fields(fmt) -> Properties:
    """The properties by formula from the fields alone (no decoding): used for fp32 and tf32, and as
    a second derivation that the tests compare with the decoded one."""
    f = get(fmt)
    if isinstance(f, IntFormat):
        top = (1 << (f.bits - 1)) - 1
        return Properties(f.name, f.bits, float(top), None, None, 1.0, math.log10(top), False, False, False, f.codes, 0)
    m, emax = f.mantissa_bits, f.exponent_max_field
    if f.nan == "ieee":
        e_top, m_top = emax - 1, (1 << m) - 1
    elif f.nan == "fn":
        # the all-ones magnitude is NaN: the largest number is one code below it
        e_top, m_top = (emax, (1 << m) - 2) if m > 0 else (emax - 1, 0)
    else:
        e_top, m_top = emax, (1 << m) - 1
    max_finite = math.ldexp(1.0 + m_top / (1 << m), e_top - f.bias)
    min_normal = math.ldexp(1.0, (1 if f.has_subnormals else 0) - f.bias)
    min_sub = math.ldexp(1.0, 1 - f.bias - m) if f.has_subnormals and m > 0 else None
    signs = 2 if f.signed else 1
    if f.nan == "ieee":
        nan_codes = signs * ((1 << m) - 1)
    elif f.nan == "fn":
        nan_codes = signs
    elif f.nan == "fnuz":
        nan_codes = 1
    else:
        nan_codes = 0
    inf_codes = signs if f.has_inf else 0
    return Properties(
        name=f.name,
        bits=f.bits,
        max_finite=max_finite,
        min_normal=min_normal,
        min_subnormal=min_sub,
        epsilon=math.ldexp(1.0, -m),
        decimal_digits=(m + 1) * math.log10(2.0),
        has_inf=f.has_inf,
        has_nan=nan_codes > 0,
        has_negative_zero=f.signed and f.has_subnormals and f.nan != "fnuz",
        finite_codes=f.codes - nan_codes - inf_codes,
        nan_codes=nan_codes,
        storage=f.storage,
    )


# The largest finite values, which the kernels saturate to: every module reads them here.
E4M3_MAX = properties_from_fields(E4M3FN).max_finite  # 448
E5M2_MAX = properties_from_fields(E5M2).max_finite  # 57344
E2M1_MAX = properties_from_fields(E2M1).max_finite  # 6


def properties(fmt) -> Properties:
    """The properties of a format, read off the decoded values of all its codes (formats of up to 16
    bits), or computed from the fields (fp32, tf32)."""
    f = get(fmt)
    if f.bits > 16:
        return properties_from_fields(f)
    codes = all_codes(f)
    v = decode(codes, f).to(torch.float64)
    finite = torch.isfinite(v)
    positive = finite & (v > 0)
    eps = v[finite & (v > 1)].min().item() - 1.0
    if isinstance(f, IntFormat):
        min_normal = min_sub = None
        digits = math.log10(v.max().item())
    else:
        if f.has_subnormals:
            e_field = (codes >> f.mantissa_bits) & f.exponent_max_field
            min_normal = v[positive & (e_field > 0)].min().item()
            min_sub = v[positive & (e_field == 0)].min().item()
        else:  # e8m0: every code is a normal number
            min_normal, min_sub = v[positive].min().item(), None
        digits = math.log10(2.0 / eps)  # p = mantissa_bits + 1 significant bits: log10(2^p)
    n_nan = int(torch.isnan(v).sum())
    return Properties(
        name=f.name,
        bits=f.bits,
        max_finite=v[finite].max().item(),
        min_normal=min_normal,
        min_subnormal=min_sub,
        epsilon=eps,
        decimal_digits=digits,
        has_inf=bool(torch.isinf(v).any()),
        has_nan=n_nan > 0,
        has_negative_zero=bool(((v == 0) & torch.signbit(v)).any()),
        finite_codes=int(finite.sum()),
        nan_codes=n_nan,
        storage=getattr(f, "storage", True),
    )


def format_table(names=None) -> list:
    """:func:`properties` of the named formats (default: all of :data:`FORMATS`), in that order."""
    return [properties(n) for n in (names or FORMATS)]


# -- encoding fp32 -> e4m3fn / e5m2 / bf16 with integer operations ---------------------------------

# One program handles BLOCK elements of the hardware conversion, which is memory-bound.
BLOCK = 1024
# The integer encoder spends ~21 integer instructions per element (sm_90 SASS, e4m3fn), where the
# conversion instruction needs half of one: with this few bytes per element it is ALU-bound.
ENCODE_BLOCK, ENCODE_WARPS = 8192, 8

ENCODABLE = ("e4m3fn", "e5m2", "bf16")


@dataclass(frozen=True)
class EncodeSpec:
    """What the encoder needs of a target format, as integers.  Codes are magnitudes (sign apart)."""

    mantissa_bits: int
    bias: int
    max_code: int  # largest finite magnitude
    overflow_code: int  # non-saturating: what overflow becomes (inf, or NaN without inf)
    quiet_nan: int  # non-saturating: the NaN a NaN input becomes, sign kept (ml_dtypes' choice)
    sat_nan: int  # saturating: the NaN of the hardware conversion, sign dropped
    width: int  # bits per stored element
    max_f32: int  # the fp32 bit pattern of the largest finite value


def _spec(f: Format) -> EncodeSpec:
    m = f.mantissa_bits
    magnitude_bits = f.exponent_bits + m
    all_ones = (1 << magnitude_bits) - 1
    top = f.exponent_max_field << m  # exponent all ones, mantissa zero
    if f.nan == "ieee":
        max_code, overflow, quiet = top - 1, top, top | (1 << (m - 1))
    else:  # "fn": the all-ones magnitude is the only NaN
        max_code, overflow, quiet = all_ones - 1, all_ones, all_ones
    max_exp, max_mant = max_code >> m, max_code & ((1 << m) - 1)
    max_f32 = ((max_exp - f.bias + 127) << 23) | (max_mant << (23 - m))
    return EncodeSpec(m, f.bias, max_code, overflow, quiet, all_ones, f.bits, max_f32)


ENCODE_SPECS = {name: _spec(FORMATS[name]) for name in ENCODABLE}


@triton.jit
def _encode_kernel(
    x_ptr,
    y_ptr,
    n,
    M: tl.constexpr,  # mantissa bits of the target
    BIAS: tl.constexpr,  # its exponent bias
    SIGN_SHIFT: tl.constexpr,  # position of its sign bit (exponent + mantissa bits)
    MAX_CODE: tl.constexpr,  # largest finite magnitude code
    MAX_F32: tl.constexpr,  # the fp32 pattern of the largest finite value
    OVERFLOW_CODE: tl.constexpr,  # non-saturating: inf, or NaN where there is no inf
    NAN_CODE: tl.constexpr,  # the magnitude code a NaN input becomes
    NAN_KEEPS_SIGN: tl.constexpr,  # OCP/ml_dtypes keep a NaN's sign, the hardware drops it
    SATURATE: tl.constexpr,  # clip overflow to +-max instead of OVERFLOW_CODE
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,  # every program is full: no mask (n a multiple of BLOCK)
    WIDE: tl.constexpr,  # int64 offsets: past 2^31 elements int32 offsets would wrap silently
):
    pid = tl.program_id(0)
    # Below 2^31 elements int32 offsets are exact, and cheaper: this kernel is ALU-bound.
    offs = (pid.to(tl.int64) if WIDE else pid) * BLOCK + tl.arange(0, BLOCK)
    mask = None if EVEN else offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=None if EVEN else 0.0)
    u = x.to(tl.uint32, bitcast=True)
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    nan = mag > 0x7F800000  # decided on the input: rounding a NaN's pattern could carry it anywhere
    if SATURATE:
        # Clip before rounding: the largest finite value is exactly representable, and everything
        # above it (inf included) must end there.  Cheaper than comparing codes afterwards.
        mag = tl.minimum(mag, MAX_F32)
    if BIAS == 127:
        # bf16 keeps fp32's exponent field, subnormals included: the pattern is already in place and
        # only the low 16 mantissa bits go.
        v = mag
        shift = 23 - M
        half = 1 << (22 - M)
    else:
        # The target's exponent field if the value is normal there.  fp32 subnormals get exponent
        # -(127 - BIAS) here, not 1 - (127 - BIAS); both round to 0 in every fp8 format.
        e = (mag >> 23).to(tl.int32) - (127 - BIAS)
        e1 = tl.maximum(e, 1)
        # Normal target (e >= 1): the significand re-based to the target's exponent field, i.e. the
        # fp32 pattern with a rebiased exponent; a carry out of the mantissa lands in the exponent,
        # the next binade.  Subnormal target (e < 1): the significand loses d = 1 - e more bits.
        # Past d = 5 every significand (< 2^24) rounds to 0, and shifts of 32 or more are undefined.
        v = (mag & 0x7FFFFF) + (e1 << 23).to(tl.uint32)
        d = tl.minimum(e1 - e, 5).to(tl.uint32)
        shift = d + (23 - M)
        half = (1 << (22 - M)) << d
    # Round to nearest, ties to even: add just under half of the dropped range, plus the lowest kept
    # bit, so that an exact half carries only from an odd kept part.  v < 2^31 and the addend is at
    # most 2^24, so the uint32 sum cannot wrap.
    lsb = (v >> shift) & 1
    code = (v + (half - 1) + lsb) >> shift
    if not SATURATE:
        code = tl.where(code > MAX_CODE, OVERFLOW_CODE, code)
    out = code | (sign << SIGN_SHIFT)
    if NAN_KEEPS_SIGN:
        out = tl.where(nan, NAN_CODE | (sign << SIGN_SHIFT), out)
    else:
        out = tl.where(nan, NAN_CODE, out)
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _hardware_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)


def _check_encode_args(x, fmt, saturate, on_device: bool = True):
    """Validate the arguments of the encoders; returns ``x`` contiguous (a copy only if strided)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of dtype torch.float32, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x must have dtype torch.float32, got {x.dtype}")
    if fmt not in ENCODABLE:
        name = getattr(fmt, "name", fmt)
        raise ValueError(f"fmt must be one of {list(ENCODABLE)}, got {name!r}")
    if saturate is not None and not isinstance(saturate, bool):
        raise TypeError(f"saturate must be True, False or None, got {saturate!r}")
    if on_device:
        check_device(x, "x")
    return x.contiguous()


def _modes(fmt: str, saturate: bool | None) -> tuple:
    """(clip overflow?, NaN magnitude code, NaN keeps its sign?) for ``encode``'s ``saturate``."""
    spec = ENCODE_SPECS[fmt]
    if saturate is None:  # the hardware conversion: fp8 saturates, bf16 overflows to inf
        return fmt != "bf16", spec.sat_nan, False
    if saturate:
        return True, spec.sat_nan, False
    return False, spec.quiet_nan, True


def _int_view(y: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the element's width, for a kernel that stores bit patterns."""
    return y.view(torch.uint8 if y.element_size() == 1 else torch.int16)


def encode(x: torch.Tensor, fmt: str, saturate: bool | None = None) -> torch.Tensor:
    """Round an fp32 tensor to ``fmt`` ("e4m3fn", "e5m2" or "bf16"), nearest even, with integer ops.

    ``saturate`` says what happens past the largest finite value (448 for e4m3fn, 57344 for e5m2):

    * ``None`` (default): exactly what the GPU's conversion does (``x.to(tl.float8e4nv)`` etc.,
      measured on Hopper): fp8 saturates as below; bf16 overflows to inf; every NaN becomes the
      unsigned all-ones magnitude, 0x7F or 0x7FFF.
    * ``True``: saturate: finite values beyond the largest finite one, and inf, become +-max; NaN as
      for ``None``.  For fp8 this is the same as ``None``.
    * ``False``: OCP/IEEE: beyond the largest finite value (from the midpoint to the next power of
      two's code on, nearest even) is inf for e5m2 and bf16, NaN for e4m3fn, which has no inf; inf
      likewise; a NaN becomes the format's quiet NaN with its sign kept (0x7F/0xFF, 0x7E/0xFE,
      0x7FC0/0xFFC0).  This is bit for bit what ml_dtypes does (:func:`ocp_encode`).

    Returns a new tensor of ``x``'s shape on ``x``'s device, of dtype torch.float8_e4m3fn,
    torch.float8_e5m2 or torch.bfloat16.
    """
    x = _check_encode_args(x, fmt, saturate)
    clip, nan_code, nan_keeps_sign = _modes(fmt, saturate)
    spec = ENCODE_SPECS[fmt]
    y = torch.empty(x.shape, dtype=TORCH_DTYPES[fmt], device=x.device)
    consts = dict(
        M=spec.mantissa_bits,
        BIAS=spec.bias,
        SIGN_SHIFT=spec.width - 1,
        MAX_CODE=spec.max_code,
        MAX_F32=spec.max_f32,
        OVERFLOW_CODE=spec.overflow_code,
        NAN_CODE=nan_code,
        NAN_KEEPS_SIGN=nan_keeps_sign,
        SATURATE=clip,
        BLOCK=ENCODE_BLOCK,
        WIDE=x.numel() >= 2**31,
        num_warps=ENCODE_WARPS,
    )
    # Full programs without a mask, then the ragged tail (if any) with one: the masks cost ~5% here.
    x_flat, y_flat = x.view(-1), _int_view(y).view(-1)
    n = x_flat.numel()
    full = n // ENCODE_BLOCK * ENCODE_BLOCK
    if full:
        _encode_kernel[(full // ENCODE_BLOCK,)](x_flat, y_flat, full, EVEN=True, **consts)
    if n > full:
        _encode_kernel[(1,)](x_flat[full:], y_flat[full:], n - full, EVEN=False, **consts)
    return y


def hardware_encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The GPU's conversion instruction: ``x.to(tl.float8e4nv / tl.float8e5 / tl.bfloat16)`` in a
    Triton kernel (on the CPU, the corrected interpreter reproduces Hopper's bits)."""
    x = _check_encode_args(x, fmt, None)
    y = torch.empty(x.shape, dtype=TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    if n:
        _hardware_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    return y


def ocp_encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The OCP (non-saturating) conversion as ml_dtypes implements it, on the CPU: nearest even,
    overflow to NaN (e4m3fn) or inf (e5m2, bf16), NaN to the quiet NaN with its sign."""
    import ml_dtypes
    import numpy as np

    x = _check_encode_args(x, fmt, None, on_device=False)
    target = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "bf16": ml_dtypes.bfloat16}[fmt]
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.detach().cpu().numpy().astype(target)
    unsigned = np.uint8 if out.itemsize == 1 else np.uint16
    signed = torch.uint8 if out.itemsize == 1 else torch.int16
    raw = torch.from_numpy(out.view(unsigned).astype(np.int64))
    return from_codes(raw, signed).view(TORCH_DTYPES[fmt]).to(x.device)


def from_codes(codes: torch.Tensor, int_dtype: torch.dtype) -> torch.Tensor:
    if int_dtype == torch.int16:
        codes = torch.where(codes >= 0x8000, codes - 0x10000, codes)
    return codes.to(int_dtype)


def encode_bits_reference(bits: torch.Tensor, fmt: str, saturate: bool | None = None) -> torch.Tensor:
    """The integer recipe of :func:`encode` in plain PyTorch: fp32 patterns (int64 in [0, 2^32)) ->
    codes of ``fmt`` (int64).  Readable without Triton, and a third opinion when two disagree."""
    if fmt not in ENCODABLE:
        raise ValueError(f"fmt must be one of {list(ENCODABLE)}, got {fmt!r}")
    clip, nan_code, nan_keeps_sign = _modes(fmt, saturate)
    s = ENCODE_SPECS[fmt]
    m = s.mantissa_bits
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    exp32 = mag >> 23
    sig = torch.where(exp32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    e = exp32.clamp(min=1) - (127 - s.bias)
    subnormal = e < 1
    v = torch.where(subnormal, sig, mag - ((127 - s.bias) << 23))
    shift = torch.where(subnormal, (24 - m - e).clamp(max=25), torch.full_like(e, 23 - m))
    lsb = (v >> shift) & 1
    code = (v + (1 << (shift - 1)) - 1 + lsb) >> shift
    code = code.clamp(max=s.max_code) if clip else torch.where(code > s.max_code, s.overflow_code, code)
    signed_nan = (nan_code | (sign << (s.width - 1))) if nan_keeps_sign else torch.full_like(code, nan_code)
    return torch.where(mag > 0x7F800000, signed_nan, code | (sign << (s.width - 1)))


def encode_reference(x: torch.Tensor, fmt: str, saturate: bool | None = None) -> torch.Tensor:
    """:func:`encode_bits_reference` on an fp32 tensor, computed on the CPU, returned on ``x``'s device."""
    x = _check_encode_args(x, fmt, saturate, on_device=False)
    bits = x.detach().cpu().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    codes = encode_bits_reference(bits, fmt, saturate)
    int_dtype = torch.uint8 if ENCODE_SPECS[fmt].width == 8 else torch.int16
    return from_codes(codes, int_dtype).view(TORCH_DTYPES[fmt]).to(x.device)


__all__ = [
    "BF16",
    "BLOCK",
    "E2M1",
    "E2M1_MAX",
    "E2M3",
    "E3M2",
    "E4M3FN",
    "E4M3FNUZ",
    "E4M3_MAX",
    "E5M2",
    "E5M2FNUZ",
    "E5M2_MAX",
    "E8M0",
    "ENCODABLE",
    "ENCODE_SPECS",
    "EncodeSpec",
    "FORMATS",
    "FP16",
    "FP32",
    "Format",
    "INT4",
    "INT8",
    "IntFormat",
    "NAN_POLICIES",
    "Properties",
    "TF32",
    "TORCH_DTYPES",
    "all_codes",
    "decode",
    "encode",
    "encode_bits_reference",
    "encode_reference",
    "format_table",
    "from_codes",
    "get",
    "hardware_encode",
    "ocp_encode",
    "properties",
    "properties_from_fields",
]
