"""Lab 1's checks pass the right answers and catch each wrong one with the right diagnosis.

The wrong decoders and encoders below are written the way a student would write them; every
diagnosis the checks can give for the encoder is demanded of one of them, and none may get a
diagnosis that belongs to another bug.  ``WRONG_SOLUTIONS`` holds them per otter question
(``tests/test_wrong_solutions.py`` demands a set for every question of every lab and runs each
through the lab's own otter test); ``DIAGNOSES`` says what each one's message must contain.
"""

import functools
import importlib.util
import math
from fractions import Fraction
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import formats
from kernels.checks import ExerciseNotDone, lab01, passes
from kernels.device import default_device

DEVICE = default_device()
ROOT = Path(__file__).resolve().parents[1]

# -- q1: decoders, right and wrong ----------------------------------------------------------------


def student_decode(bits, fmt, *, bias_shift=0, implicit_in_subnormals=False, policy=None, signed=None, flush=False):
    """A decoder written from the fields, with switches for the mistakes students make."""
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    bias = fmt.bias + bias_shift
    b = bits.long()
    has_sign = fmt.signed if signed is None else signed
    s = (b >> (E + M)) & 1 if has_sign else torch.zeros_like(b)
    e = (b >> M) & ((1 << E) - 1)
    m = b & ((1 << M) - 1)
    frac = m.double() / 2**M
    normal = 2.0 ** (e.double() - bias) * (1 + frac)
    if fmt.has_subnormals and not flush:
        lead = 1.0 if implicit_in_subnormals else 0.0
        value = torch.where(e == 0, 2.0 ** (1 - bias) * (lead + frac), normal)
    elif fmt.has_subnormals:
        value = torch.where(e == 0, 0.0, normal)
    else:
        value = normal
    value = torch.where(s == 1, -value, value)
    policy = policy or fmt.nan
    top = e == (1 << E) - 1
    if policy == "ieee":
        value = torch.where(top & (m == 0), torch.where(s == 1, -math.inf, math.inf), value)
        value = torch.where(top & (m != 0), math.nan, value)
    elif policy == "fn":
        value = torch.where(top & (m == (1 << M) - 1), math.nan, value)
    elif policy == "fnuz":
        value = torch.where(b == 1 << (E + M), math.nan, value)
    return value.float()


def correct_decode(bits, fmt):
    return student_decode(bits, fmt)


def subnormals_halved(b, f):
    """Subnormals computed with exponent -bias instead of 1 - bias."""
    value = correct_decode(b, f)
    if not f.has_subnormals:
        return value
    exponent_field = (b >> f.mantissa_bits) & f.exponent_max_field
    return torch.where(exponent_field == 0, value / 2, value)


def e8m0_signed(b):
    """e8m0 read as if its top bit were a sign, the rest a 7-bit exponent."""
    magnitude = 2.0 ** ((b & 0x7F).double() - 127)
    return torch.where(b >= 0x80, -magnitude, magnitude).float()


WRONG_Q1 = {
    "implicit-one-in-subnormals": (
        lambda b, f: student_decode(b, f, implicit_in_subnormals=True),
        [
            "subnormals decoded with an implicit 1 in fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e3m2, e2m3 "
            "(fp16 0x0000 -> 6.10351562e-05, want 0)",
            "no leading 1",
        ],
    ),
    "bias-off-by-one": (
        lambda b, f: student_decode(b, f, bias_shift=1),
        [
            "values half what they should be in fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e3m2, e2m3, e8m0 "
            "(fp16 0x0001 -> 2.98023224e-08, want 5.96046448e-08): wrong exponent bias",
        ],
    ),
    "ieee-everywhere": (
        lambda b, f: student_decode(b, f, policy="ieee"),
        [
            "NaN or inf in the top binade (e4m3fn 0x78 -> inf, want 256): in e4m3fn there is no inf; only the "
            "all-ones magnitude (0x7F and 0xFF) is NaN",
            "NaN or inf in the top binade (e2m1 0x6 -> inf, want 4): in e2m1 every code is a number",
            "a NaN code decoded as -0 (e4m3fnuz 0x80 -> -0, want nan): in e4m3fnuz there is no inf and no -0",
            "a NaN code decoded as inf (e8m0 0xFF -> inf, want nan)",
        ],
    ),
    "no-nan-at-all": (
        lambda b, f: student_decode(b, f, policy="none"),
        [
            "a NaN code decoded as 480 (e4m3fn 0x7F -> 480, want nan)",
            "a NaN code decoded as -0 (e5m2fnuz 0x80 -> -0, want nan): in e5m2fnuz there is no inf and no -0; "
            "the one NaN is 0x80",
            "inf decoded wrongly (e5m2 0x7C -> 65536, want inf): in e5m2 exponent all ones is inf (mantissa 0) or NaN",
        ],
    ),
    "sign-ignored": (
        lambda b, f: student_decode(b, f, signed=False).abs(),
        [
            "sign bit ignored in fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e3m2, e2m3 "
            "(fp16 0x8000 -> 0, want -0)"
        ],
    ),
    "e8m0-signed": (
        lambda b, f: e8m0_signed(b) if f is formats.E8M0 else correct_decode(b, f),
        ["top bit read as a sign (e8m0 0x80 -> -5.87747175e-39, want 2): e8m0 has no sign bit"],
    ),
    "flushes-subnormals": (
        lambda b, f: student_decode(b, f, flush=True),
        ["subnormals decoded as zero in fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e3m2, e2m3 (fp16 0x0001"],
    ),
    "subnormal-exponent": (
        subnormals_halved,
        ["subnormals off by a factor of 2 in fp16,", "1 - bias, not -bias"],
    ),
}

# Diagnoses that a wrong decoder must not get unless they are its own.
DECODE_SMELLS = [
    "values half",
    "values twice",
    "implicit 1",
    "decoded as zero",
    "off by a factor of 2",
    "sign bit ignored",
    "top bit read as a sign",
    "NaN or inf",
    "a NaN code",
    "inf decoded wrongly",
    "zero decoded wrongly",
    "other mismatches",
]


@pytest.mark.parametrize("case", list(WRONG_Q1))
def test_q1_wrong_decoder_is_diagnosed(case):
    fn, wants = WRONG_SOLUTIONS["q1"][case], DIAGNOSES["q1"][case]
    with pytest.raises(AssertionError) as info:
        lab01.check_decode(fn)
    message = str(info.value)
    assert message.startswith("q1: decode differs from the formats' definitions:")
    for want in wants:
        assert want in message, f"{case}: expected {want!r} in:\n{message}"
    findings, expected = _findings(message), " ".join(wants)
    spurious = [s for s in DECODE_SMELLS if s in findings and s not in expected]
    assert not spurious, f"{case}: spurious diagnoses {spurious} in:\n{message}"


def test_q1_correct_decoders_pass(capsys):
    lab01.check_decode(correct_decode)
    lab01.check_decode(formats.decode)
    lab01.check_decode(lambda b, f: formats.decode(b, f).double())  # float64 is fine too
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == (
        "q1 passed: decode is exact on all 132496 codes of 10 formats "
        "(fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e3m2, e2m3, e8m0)"
    )


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (lambda b, f: (_ for _ in ()).throw(NotImplementedError()), r"q1: decode raised NotImplementedError"),
        (lambda b, f: None, r"q1: decode returned None: exercise not done yet"),
        (None, r"q1: decode is not defined yet"),
    ],
    ids=["stub", "None", "undefined"],
)
def test_q1_not_done(fn, pattern):
    with pytest.raises(ExerciseNotDone, match=pattern):
        lab01.check_decode(fn)


def _in_place(b, f):
    b += 1
    return formats.decode(b, f)


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (lambda b, f: b, r"wrong dtype: decode returned torch.int64, want torch.float32"),
        (lambda b, f: formats.decode(b, f)[1:], r"wrong shape for fp16: decode returned \(65535,\)"),
        (lambda b, f: formats.decode(b, f).tolist(), r"wrong type: decode returned list"),
        (_in_place, r"changed its argument bits in place"),
        (lambda b, f: f.no_such_field, r"decode raised AttributeError"),
    ],
    ids=["bits", "shape", "list", "in-place", "crash"],
)
def test_q1_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab01.check_decode(fn)


# -- q2: encoder kernels, right and wrong ------------------------------------------------------------


@triton.jit
def _student_kernel(
    x_ptr,
    y_ptr,
    n,
    M: tl.constexpr,
    BIAS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = x.to(tl.uint32, bitcast=True)
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    exp32 = (mag >> 23).to(tl.int32)
    bias = BIAS + 1 if MODE == "bias_off" else BIAS
    e = exp32 - 127 + bias
    if MODE == "stub":  # the lab's starting point: truncate, flush, no saturation, no NaN case
        man = (mag & 0x7FFFFF) >> (23 - M)
        code = tl.where(e >= 1, (e << M) | man, 0)
        out = code | (sign << 7)
    else:
        implicit = 0 if MODE == "no_implicit_sub" else 0x800000
        sig = tl.where(e >= 1, (mag & 0x7FFFFF) | 0x800000, (mag & 0x7FFFFF) | implicit)
        shift = tl.minimum(tl.where(e >= 1, 23 - M, 23 - M + 1 - e), 25)
        kept = sig >> shift
        rest = sig & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if MODE == "truncate":
            round_up = rest < 0
        elif MODE == "ties_away":
            round_up = rest >= half
        else:
            round_up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
        if MODE == "no_carry":  # rounds the mantissa field alone: an all-ones mantissa wraps to 0
            mm = (1 << M) - 1
            kept = (kept & ~mm) | ((kept + round_up) & mm)
        else:
            kept = kept + round_up
        code = tl.where(e >= 1, ((e - 1) << M) + kept, kept)
        if MODE == "flush":
            code = tl.where(e >= 1, code, 0)
        if MODE == "ocp_overflow":  # non-saturating OCP e4m3fn: overflow and inf become NaN
            code = tl.where(code > MAX_CODE, 0x7F, code)
        elif MODE == "inf_to_nan":
            code = tl.where(mag == 0x7F800000, 0x7F, tl.minimum(code, MAX_CODE))
        elif MODE != "no_saturation":
            code = tl.minimum(code, MAX_CODE)
        if MODE == "drops_sign":
            out = code
        else:
            out = code | (sign << 7)
        is_nan = mag > 0x7F800000
        if MODE == "nan_keeps_sign":
            out = tl.where(is_nan, 0x7F | (sign << 7), out)
        elif MODE != "no_nan":
            out = tl.where(is_nan, 0x7F, out)
    if MODE != "no_store":
        tl.store(y_ptr + offs, out.to(tl.uint8), mask=mask)
    if MODE == "writes_input":
        tl.store(x_ptr + offs, x * 2, mask=mask)


FP8_PARAMS = {
    "e4m3fn": dict(M=3, BIAS=7, MAX_CODE=0x7E),
    "e5m2": dict(M=2, BIAS=15, MAX_CODE=0x7B),
}


def launcher(mode):
    def fp32_to_fp8(x, fmt):
        y = torch.zeros(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
        n = x.numel()
        _student_kernel[(triton.cdiv(n, 1024),)](x, y.view(torch.uint8), n, **FP8_PARAMS[fmt], MODE=mode, BLOCK=1024)
        return y

    fp32_to_fp8.__name__ = f"fp32_to_fp8_{mode}"
    return fp32_to_fp8


# mode -> what the check must say (all of it), on e4m3fn, the format checked first.
WRONG_Q2 = {
    "truncate": [
        "truncates instead of rounding (1.10000002 (0x3F8CCCCD) -> 0x38, want 0x39)",
        "dropped bits must round",
    ],
    "ties_away": ["ties rounded away from zero (1.0625 (0x3F880000) -> 0x39, want 0x38)", "EVEN neighbour"],
    "no_saturation": [
        "no saturation (480 (0x43F00000) -> 0x7F, want 0x7E): it became NaN; values past 448 must clip to +-448 (0x7E)",
        "inf not saturated",
        "it became 0x",
    ],
    "ocp_overflow": [
        "no saturation (480 (0x43F00000) -> 0x7F, want 0x7E): it became NaN",
        "inf not saturated (inf (0x7F800000) -> 0x7F, want 0x7E): it became NaN",
    ],
    "inf_to_nan": ["inf not saturated (inf (0x7F800000) -> 0x7F, want 0x7E): it became NaN"],
    "flush": [
        "subnormals flushed to zero (0.001953125 (0x3B000000) -> 0x00, want 0x01)",
        "smallest normal (0.015625)",
    ],
    "no_implicit_sub": ["the implicit 1 is lost in subnormals (0.001953125 (0x3B000000) -> 0x00, want 0x01)"],
    "bias_off": ["wrong exponent bias (8 instead of 7) (1 (0x3F800000) -> 0x40, want 0x38)"],
    "no_carry": ["rounding carry lost into the exponent (0.99000001 (0x3F7D70A4) -> 0x30, want 0x38)"],
    "drops_sign": ["sign bit lost on negative inputs (-1.1875 (0xBF980000) -> 0x3A, want 0xBA)"],
    "no_nan": ["NaN mishandled (nan (0x7FC00000) -> 0x7E, want 0x7F): it was clipped to +-max"],
    "nan_keeps_sign": ["NaN mishandled (nan (0xFFC00000) -> 0xFF, want 0x7F): it kept its sign"],
    "no_store": ["every output is 0x00, whatever the input", "tl.store"],
    "stub": [
        "truncates instead of rounding",
        "subnormals flushed to zero",
        "no saturation (480 (0x43F00000) -> 0x7F, want 0x7E): it became NaN",
        "inf not saturated (inf (0x7F800000) -> 0x38, want 0x7E)",
        "NaN mishandled",
    ],
}

SMELLS = [
    "truncates",
    "rounds up below",
    "ties rounded away",
    "ties always rounded down",
    "wrong exponent bias",
    "subnormals flushed",
    "implicit 1 is lost",
    "carry lost",
    "sign bit lost",
    "no saturation",
    "inf not saturated",
    "NaN mishandled",
    "numbers became NaN",
    "other mismatches",
]


def _findings(message: str) -> str:
    return " ".join(line for line in message.splitlines() if line.startswith("  - "))


@pytest.mark.parametrize("mode", list(WRONG_Q2))
def test_q2_wrong_kernel_is_diagnosed(mode):
    with pytest.raises(AssertionError) as info:
        lab01.check_encode(WRONG_SOLUTIONS["q2"][mode])
    message = str(info.value)
    assert not isinstance(info.value, ExerciseNotDone)
    assert message.startswith("q2: your kernel differs from the hardware conversion to e4m3fn on ")
    for want in DIAGNOSES["q2"][mode]:
        assert want in message, f"{mode}: expected {want!r} in:\n{message}"
    findings, expected = _findings(message), " ".join(DIAGNOSES["q2"][mode])
    spurious = [s for s in SMELLS if s in findings and s not in expected]
    assert not spurious, f"{mode}: spurious diagnoses {spurious} in:\n{message}"
    assert "first mismatches" in message


def test_q2_correct_kernel_and_package_pass(capsys):
    lab01.check_encode(launcher("rne"))
    lab01.check_encode(lambda x, fmt: formats.encode(x, fmt))
    out = capsys.readouterr().out.strip().splitlines()
    assert (
        out[0]
        == out[1]
        == (
            "q2 passed: your kernel matches the hardware conversion bit for bit on 6524/6524 inputs for e4m3fn and "
            "for e5m2 (special 36, value 502, tie 502, neighbour 1004, fp32 subnormal 128, overflow 256, random 4096)"
        )
    )


def test_q2_e5m2_is_checked_too():
    """Right for e4m3fn, wrong for e5m2 (the e4m3fn bias used for both): e5m2 is diagnosed."""

    def fp32_to_fp8(x, fmt):
        if fmt == "e4m3fn":
            return formats.encode(x, fmt)
        y = torch.zeros(x.shape, dtype=torch.float8_e5m2, device=x.device)
        params = dict(FP8_PARAMS["e5m2"], BIAS=14)
        _student_kernel[(triton.cdiv(x.numel(), 1024),)](
            x, y.view(torch.uint8), x.numel(), **params, MODE="rne", BLOCK=1024
        )
        return y

    with pytest.raises(AssertionError, match=r"(?s)to e5m2 on .*wrong exponent bias \(14 instead of 15\)"):
        lab01.check_encode(fp32_to_fp8)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_q2_kernel_writing_its_input_is_caught():
    with pytest.raises(AssertionError, match="the kernel wrote into its input x"):
        lab01.check_encode(launcher("writes_input"))


def _stub(x, fmt):
    raise NotImplementedError("q2")


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (_stub, r"q2: .* raised NotImplementedError: exercise not done yet"),
        (lambda x, f: None, r"q2: .* returned None: exercise not done yet"),
        (lambda x, f: formats.encode(x, "bf16"), r"wrong dtype/shape for e4m3fn: returned torch.bfloat16"),
        (lambda x, f: formats.encode(x, f)[:3], r"wrong dtype/shape for e4m3fn: .* of shape \(3,\)"),
        (lambda x, f: formats.encode(x, f).tolist(), r"wrong type: returned list"),
    ],
    ids=["stub", "None", "dtype", "shape", "list"],
)
def test_q2_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab01.check_encode(fn)


def test_q2_not_done_is_not_done():
    with pytest.raises(ExerciseNotDone):
        lab01.check_encode(_stub)


def test_encode_variant_even_is_the_hardware():
    inputs = lab01.adversarial_fp32()
    for fmt in lab01.FP8:
        assert np.array_equal(lab01.encode_variant(inputs.bits, fmt), lab01._want_codes(inputs, fmt))


def test_input_set_is_fixed():
    a, b = lab01.adversarial_fp32(), lab01.adversarial_fp32()
    assert np.array_equal(a.bits, b.bits) and a.bits.size == 6524
    assert list(a.counts) == ["special", "value", "tie", "neighbour", "fp32 subnormal", "overflow", "random"]
    assert a.bits[0] == 0x3F800000  # 1.0, the first special


# -- q3: the format table ----------------------------------------------------------------------------


def table_row(fmt, decode=formats.decode):
    v = decode(formats.all_codes(fmt), fmt).double()
    finite = v[torch.isfinite(v)]
    positive = finite[finite > 0]
    e_field = (formats.all_codes(fmt) >> fmt.mantissa_bits) & fmt.exponent_max_field
    if fmt.has_subnormals:
        min_normal = v[(e_field > 0) & torch.isfinite(v) & (v > 0)].min().item()
        min_sub = positive.min().item()
    else:
        min_normal, min_sub = positive.min().item(), None
    return {
        "max_finite": finite.max().item(),
        "min_normal": min_normal,
        "min_subnormal": min_sub,
        "epsilon": finite[finite > 1].min().item() - 1,
        "has_inf": bool(torch.isinf(v).any()),
        "has_nan": bool(torch.isnan(v).any()),
    }


def _max_but_nan(f):
    v = formats.decode(formats.all_codes(f), f)
    return v[~v.isnan()].max().item()


WRONG_Q3 = {
    "max-with-inf": (
        lambda f: {
            **table_row(f),
            "max_finite": _max_but_nan(f),
        },
        "max_finite: fp16 inf (want 65504.0)",
        "inf or NaN got into the max",
    ),
    "min-normal-is-smallest-positive": (
        lambda f: {**table_row(f), "min_normal": table_row(f)["min_subnormal"] or table_row(f)["min_normal"]},
        "min_normal: fp16 5.960464477539063e-08 (want 6.103515625e-05)",
        "that is a subnormal",
    ),
    "epsilon-as-next-minus-previous": (
        lambda f: {**table_row(f), "epsilon": 2 * table_row(f)["epsilon"]},
        "epsilon: fp16 0.001953125 (want 0.0009765625)",
        "twice too large",
    ),
    "zero-as-min-subnormal": (
        lambda f: {**table_row(f), "min_subnormal": 0.0 if f.has_subnormals else None},
        "min_subnormal: fp16 0.0 (want 5.960464477539063e-08)",
        "the smallest positive value",
    ),
}


@pytest.mark.parametrize("case", list(WRONG_Q3))
def test_q3_wrong_table_is_diagnosed(case):
    fn, wants = WRONG_SOLUTIONS["q3"][case], DIAGNOSES["q3"][case]
    with pytest.raises(AssertionError) as info:
        lab01.check_format_table(fn)
    message = str(info.value)
    assert message.startswith("q3: format_properties is wrong in ")
    for want in wants:
        assert want in message, f"{case}: expected {want!r} in:\n{message}"


def test_q3_correct_table_passes(capsys):
    lab01.check_format_table(table_row)
    lab01.check_format_table(
        lambda f: {k: torch.tensor(v) if isinstance(v, float) else v for k, v in table_row(f).items()}
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "q3 passed: format_properties matches kernels.formats.properties on 10 formats x 6 properties"


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (lambda f: None, r"q3: format_properties returned None: exercise not done yet"),
        (lambda f: [1, 2], r"wrong type: format_properties returned list, want a dict"),
        (lambda f: {"max_finite": 1.0}, r"returned a dict without \['min_normal'"),
    ],
    ids=["None", "list", "keys"],
)
def test_q3_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab01.check_format_table(fn)


def test_q3_booleans_must_be_booleans():
    with pytest.raises(AssertionError, match="has_inf"):
        lab01.check_format_table(lambda f: {**table_row(f), "has_inf": 1.0})


# -- q4: OCP vs FNUZ ---------------------------------------------------------------------------------


def fnuz_vs_ocp(ocp, fnuz):
    codes = torch.arange(256)
    a, b = formats.decode(codes, ocp), formats.decode(codes, fnuz)
    same = (a.isnan() & b.isnan()) | ((a == b) & (a.signbit() == b.signbit()))
    differ = codes[~same]
    return differ.tolist(), [c for c in differ.tolist() if not b[c] == a[c] / 2]


def ignores_signed_zero(ocp, fnuz):
    codes = torch.arange(256)
    a, b = formats.decode(codes, ocp), formats.decode(codes, fnuz)
    same = (a.isnan() & b.isnan()) | (a == b) | (a.isnan() & (b == 0)) | (b.isnan() & (a == 0))
    differ = codes[~same].tolist()
    return differ, [c for c in differ if not b[c] == a[c] / 2]


def compares_codes(ocp, fnuz):
    return [], []


def nan_counts_as_halved(ocp, fnuz):
    differ, not_halved = fnuz_vs_ocp(ocp, fnuz)
    return differ, [c for c in not_halved if c != 0x80]


def counts_zero(ocp, fnuz):
    differ, not_halved = fnuz_vs_ocp(ocp, fnuz)
    return [0] + differ, not_halved


WRONG_Q4 = {
    "-0 and NaN treated as equal": (
        ignores_signed_zero,
        ["e4m3fn vs e4m3fnuz, differ: missing 0x80 (0x80 is -0 in OCP but NaN in FNUZ"],
    ),
    "codes compared, not values": (
        compares_codes,
        ["differ: missing 0x01..0xFF (compare the decoded values, not the codes"],
    ),
    "NaN counted as halved": (nan_counts_as_halved, ["not_halved: missing 0x80"]),
    "zero counted as different": (counts_zero, ["differ: not expected 0x00 (0x00 is +0 in both)"]),
}

# The convention every lab's check tests follow: per otter question, deliberately wrong solutions by
# description, and what each one's diagnosis must contain.
WRONG_SOLUTIONS = {
    "q1": {case: fn for case, (fn, _) in WRONG_Q1.items()},
    "q2": {mode: launcher(mode) for mode in WRONG_Q2},
    "q3": {case: fn for case, (fn, *_) in WRONG_Q3.items()},
    "q4": {case: fn for case, (fn, _) in WRONG_Q4.items()},
}
DIAGNOSES = {
    "q1": {case: wants for case, (_, wants) in WRONG_Q1.items()},
    "q2": dict(WRONG_Q2),
    "q3": {case: wants for case, (_, *wants) in WRONG_Q3.items()},
    "q4": {case: wants for case, (_, wants) in WRONG_Q4.items()},
}
CHECKS = {
    "q1": lab01.check_decode,
    "q2": lab01.check_encode,
    "q3": lab01.check_format_table,
    "q4": lab01.check_fnuz_vs_ocp,
}


def test_every_question_has_wrong_solutions_with_diagnoses():
    assert set(WRONG_SOLUTIONS) == set(DIAGNOSES) == set(CHECKS) == {"q1", "q2", "q3", "q4"}
    for q, wrongs in WRONG_SOLUTIONS.items():
        assert wrongs and set(wrongs) == set(DIAGNOSES[q]), q


@pytest.mark.parametrize("case", list(WRONG_Q4))
def test_q4_wrong_answers_are_diagnosed(case):
    fn, wants = WRONG_SOLUTIONS["q4"][case], DIAGNOSES["q4"][case]
    with pytest.raises(AssertionError) as info:
        lab01.check_fnuz_vs_ocp(fn)
    message = str(info.value)
    assert message.startswith("q4: fnuz_vs_ocp is wrong")
    for want in wants:
        assert want in message, f"expected {want!r} in:\n{message}"


def test_q4_correct_passes(capsys):
    lab01.check_fnuz_vs_ocp(fnuz_vs_ocp)
    lab01.check_fnuz_vs_ocp(lambda o, f: tuple(torch.tensor(v) for v in fnuz_vs_ocp(o, f)))
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == (
        "q4 passed: e4m3fn vs e4m3fnuz differ on 255 of 256 bytes, 3 of them not by a factor of 2 "
        "(0x7F..0x80, 0xFF); e5m2 vs e5m2fnuz differ on 255 of 256 bytes, 9 of them not by a factor of 2 "
        "(0x7C..0x80, 0xFC..0xFF)"
    )


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (lambda o, f: None, r"q4: fnuz_vs_ocp returned None: exercise not done yet"),
        (lambda o, f: [1, 2, 3], r"must return two lists \(differ, not_halved\)"),
        (lambda o, f: ([300], []), r"differ holds values outside 0..255"),
        (lambda o, f: (["a"], []), r"differ must be a list"),
    ],
    ids=["None", "one-list", "range", "strings"],
)
def test_q4_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab01.check_fnuz_vs_ocp(fn)


def test_fnuz_reference_examples():
    differ, not_halved = lab01.fnuz_vs_ocp_reference(formats.E4M3FN, formats.E4M3FNUZ)
    assert 0x38 in differ and 0x38 not in not_halved  # 1.0 in OCP, 0.5 in FNUZ
    assert not_halved == [0x7F, 0x80, 0xFF] and 0x00 not in differ


# -- the final comparison with the package, and the quiet pass/fail used for fallbacks -------------------


def test_same_as_package(capsys):
    lab01.check_same_as_package(launcher("rne"))
    assert capsys.readouterr().out.strip() == (
        "same bits as kernels.formats.encode for e4m3fn and e5m2: 60 standard cases and 2 x 131072 patterns"
    )


def test_same_as_package_catches_a_difference():
    with pytest.raises(AssertionError, match=r"differ for e4m3fn on \d+ of 131072 patterns|your encoder \(e4m3fn\)"):
        lab01.check_same_as_package(launcher("ties_away"))


def test_passes_is_quiet(capsys):
    assert passes(lab01.check_decode, correct_decode) is True
    assert passes(lab01.check_encode, launcher("truncate")) is False
    assert passes(lab01.check_fnuz_vs_ocp, compares_codes) is False
    assert capsys.readouterr().out == ""


# -- the lab's own starting point and solution -------------------------------------------------------


def _notebook_kernel(path, tmp_path):
    """``fp32_to_fp8_kernel`` exactly as a notebook defines it, imported from a file (Triton reads the
    source of a kernel, so it cannot come from a string)."""
    nb = nbformat.read(path, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and "def fp32_to_fp8_kernel" in c.source)
    module_path = tmp_path / f"{path.parent.name}_kernel.py"
    module_path.write_text("import triton\nimport triton.language as tl\n\n\n" + source + "\n")
    spec = importlib.util.spec_from_file_location(module_path.stem, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.fp32_to_fp8_kernel

    def fp32_to_fp8(x, fmt):
        y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
        kernel[(triton.cdiv(x.numel(), 1024),)](x, y.view(torch.uint8), x.numel(), **FP8_PARAMS[fmt], BLOCK=1024)
        return y

    return fp32_to_fp8


def test_the_labs_starting_kernel_gets_the_promised_diagnoses(tmp_path):
    """The lab says its q2 kernel truncates, flushes, does not saturate and ignores NaN: the check must
    say so too, and nothing else."""
    with pytest.raises(AssertionError) as info:
        lab01.check_encode(_notebook_kernel(ROOT / "labs" / "01_formats_encoder.ipynb", tmp_path))
    message = str(info.value)
    wants = ["truncates instead of rounding", "subnormals flushed to zero", "no saturation", "NaN mishandled"]
    for want in wants:
        assert want in message, f"expected {want!r} in:\n{message}"
    spurious = [s for s in SMELLS if s in _findings(message) and s not in " ".join(wants) + " inf not saturated"]
    assert not spurious, f"spurious diagnoses {spurious} in:\n{message}"


def test_the_solution_kernel_passes(tmp_path):
    lab01.check_encode(_notebook_kernel(ROOT / "solutions" / "01_formats_encoder.ipynb", tmp_path))


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, solutions that are right by the
# lab's contract but not the lab's own, each differing from it (and from the others) where compiled
# Triton and the interpreter, integer and float arithmetic, or torch's own dtypes could disagree.  Every
# one must pass its check here and get full marks from the lab's otter test
# (``tests/test_wrong_solutions.py``).


def decode_by_ldexp(bits, fmt):
    """q1 from an integer significand: (2^M + m) * 2^(e - bias - M) for normals, m * 2^(1 - bias - M)
    below, by torch.ldexp in float64 (returned as float64); the specials by fmt.nan's rule."""
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    b = bits.long()
    sign = (b >> (E + M)) & 1 if fmt.signed else torch.zeros_like(b)
    e = (b >> M) & ((1 << E) - 1)
    m = b & ((1 << M) - 1)
    sub = (e == 0) if fmt.has_subnormals else torch.zeros_like(e, dtype=torch.bool)
    significand = torch.where(sub, m, m + (1 << M))
    exponent = torch.where(sub, torch.full_like(e, 1 - fmt.bias), e - fmt.bias) - M
    value = torch.ldexp(significand.double(), exponent.double())
    value = torch.where(sign == 1, -value, value)
    magnitude = b & ((1 << (E + M)) - 1)
    if fmt.nan == "ieee":
        top = e == (1 << E) - 1
        value = torch.where(top, torch.where(m == 0, value.sign() * math.inf, math.nan), value)
    elif fmt.nan == "fn":
        value = torch.where(magnitude == (1 << (E + M)) - 1, math.nan, value)
    elif fmt.nan == "fnuz":
        value = torch.where(b == 1 << (E + M), math.nan, value)  # the pattern of -0
    return value


# The formats torch has a dtype for: (integer dtype of the same width, the float dtype).
TORCH_VIEWS = {
    "fp16": (torch.int16, torch.float16),
    "bf16": (torch.int16, torch.bfloat16),
    "e4m3fn": (torch.uint8, torch.float8_e4m3fn),
    "e5m2": (torch.uint8, torch.float8_e5m2),
    "e4m3fnuz": (torch.uint8, torch.float8_e4m3fnuz),
    "e5m2fnuz": (torch.uint8, torch.float8_e5m2fnuz),
    "e8m0": (torch.uint8, torch.float8_e8m0fnu),
}


def decode_by_torch_views(bits, fmt):
    """q1 by reinterpreting the codes as torch's own dtypes where torch has one (int64 -> int16 wraps
    codes >= 2^15 into the sign, as the view needs); any other format from a table built in Python,
    code by code, with its NaN rule."""
    if fmt.name in TORCH_VIEWS:
        int_dtype, dtype = TORCH_VIEWS[fmt.name]
        return bits.to(int_dtype).view(dtype).float()
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    table = []
    for c in range(1 << fmt.bits):
        s, e, m = c >> (E + M), (c >> M) & ((1 << E) - 1), c & ((1 << M) - 1)
        v = (m / 2**M) * 2.0 ** (1 - fmt.bias) if e == 0 else (1 + m / 2**M) * 2.0 ** (e - fmt.bias)
        top = e == (1 << E) - 1
        if fmt.nan == "ieee" and top:
            v = math.inf if m == 0 else math.nan
        elif fmt.nan == "fn" and top and m == (1 << M) - 1:
            v = math.nan
        elif fmt.nan == "fnuz" and c == 1 << (E + M):  # the "negative zero" pattern
            v = math.nan
        table.append(-v if s else v)
    return torch.tensor(table, dtype=torch.float32)[bits]


@functools.cache
def _exact_table(fmt) -> torch.Tensor:
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    values = []
    for c in range(1 << fmt.bits):
        s = (c >> (E + M)) & 1 if fmt.signed else 0
        e, m = (c >> M) & ((1 << E) - 1), c & ((1 << M) - 1)
        if e == 0 and fmt.has_subnormals:
            v = Fraction(m, 2**M) * Fraction(2) ** (1 - fmt.bias)
        else:
            v = (1 + Fraction(m, 2**M)) * Fraction(2) ** (e - fmt.bias)
        v = float(-v if s else v)
        if s and v == 0:
            v = -0.0
        top, magnitude = e == (1 << E) - 1, c & ((1 << (E + M)) - 1)
        if fmt.nan == "ieee" and top:
            v = math.copysign(math.inf, -1 if s else 1) if m == 0 else math.nan
        elif (fmt.nan == "fn" and magnitude == (1 << (E + M)) - 1) or (fmt.nan == "fnuz" and c == 1 << (E + M)):
            v = math.nan
        values.append(v)
    return torch.tensor(values, dtype=torch.float64)


def decode_by_exact_table(bits, fmt):
    """q1 as a lookup: every code decoded once in exact rational arithmetic (fractions.Fraction), the
    table kept per format, then indexed by the codes."""
    return _exact_table(fmt)[bits.long()].float()


SIGN_MASK = tl.constexpr(0x7FFFFFFF)
INF_BITS = tl.constexpr(0x7F800000)


@triton.jit
def _encode_bias_kernel(
    x_ptr, y_ptr, n, M: tl.constexpr, BIAS: tl.constexpr, MAX_F32: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64 offsets
    mask = offs < n
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    sign = u >> 31
    mag = u & SIGN_MASK
    is_nan = mag > INF_BITS
    mag = tl.minimum(mag, MAX_F32)  # clip first (inf too): the largest value rounds to itself
    e32 = (mag >> 23).to(tl.int32)
    e = e32 - 127 + BIAS
    e1 = tl.maximum(e, 1)
    sig = tl.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    shift = tl.minimum((23 - M) + (e1 - e), 26)  # 26 or more: 2^25 is past any significand, all round to 0
    lsb = (sig >> shift) & 1
    rounded = (sig + ((1 << (shift - 1)) - 1) + lsb) >> shift  # Lab 0's bias: half - 1 + lsb
    code = ((e1 - 1) << M) + rounded  # a carry out of the mantissa moves into the exponent
    out = tl.where(is_nan, 0x7F, code | (sign << 7))
    tl.store(y_ptr + offs, out.to(tl.uint8), mask=mask)


@triton.jit
def _encode_float_kernel(
    x_ptr, y_ptr, n, M: tl.constexpr, BIAS: tl.constexpr, MAX_VAL: tl.constexpr, SUB_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)  # no other=: masked lanes are never stored
    sign = x.to(tl.uint32, bitcast=True) >> 31
    a = tl.abs(x)
    a = tl.where(a < MAX_VAL, a, MAX_VAL)  # clips overflow and inf; NaN too, but NaN is decided below
    exp2 = (a.to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 127  # floor(log2 a) for a normal a
    exp2 = tl.maximum(exp2, 1 - BIAS)  # below the normal range the spacing stays that of the lowest binade
    # Adding 2^(exp2 - M + 23) makes the fp32 sum's last place 2^(exp2 - M), the target's spacing: the
    # addition rounds to nearest even there, and subtracting it again is exact.
    magic = ((exp2 - M + 23 + 127) << 23).to(tl.float32, bitcast=True)
    r = (a + magic) - magic
    rb = r.to(tl.uint32, bitcast=True)
    field = (rb >> 23).to(tl.int32) - 127 + BIAS
    normal = (field << M) | ((rb >> (23 - M)) & ((1 << M) - 1)).to(tl.int32)
    subnormal = (r * SUB_SCALE).to(tl.int32)  # r / 2^(1 - BIAS - M): an integer, exactly
    code = tl.where(field >= 1, normal, subnormal)
    out = tl.where(x != x, 0x7F, code | (sign << 7).to(tl.int32))
    tl.store(y_ptr + offs, out.to(tl.uint8), mask=mask)


@triton.jit
def _encode_tiles_kernel(
    x_ptr, y_ptr, n, M: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr, BLOCK: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    for t in tl.static_range(TILES):  # several blocks per program
        offs = (tl.program_id(0) * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
        sign = u >> 31
        mag = u & 0x7FFFFFFF
        e = (mag >> 23).to(tl.int32) - 127 + BIAS
        sig = (mag & 0x7FFFFF) | 0x800000
        shift = tl.where(e >= 1, 23 - M, 24 - M - e)
        gone = shift > 24  # 2^24 > sig: rounds to 0; a shift past 31 would be undefined on the GPU
        s = tl.where(gone, 24, shift)
        kept = sig >> s
        rest = sig - (kept << s)
        up = (rest + (kept & 1)) > (1 << (s - 1))  # above half, or exactly half with an odd kept part
        kept = tl.where(gone, 0, kept + up.to(tl.uint32))
        code = tl.where(e >= 1, (e << M) + kept.to(tl.int32) - (1 << M), kept.to(tl.int32))
        code = tl.minimum(code, MAX_CODE)  # saturate after rounding: inf's huge code too
        out = tl.where(mag > 0x7F800000, 0x7F, code | (sign << 7).to(tl.int32))
        tl.store(y_ptr + offs, out.to(tl.uint8).to(y_ptr.dtype.element_ty, bitcast=True), mask=mask)


ENCODER_PARAMS = {
    "e4m3fn": dict(M=3, BIAS=7, MAX_F32=0x43E00000, MAX_VAL=448.0, MAX_CODE=0x7E, SUB_SCALE=2.0**9),
    "e5m2": dict(M=2, BIAS=15, MAX_F32=0x47600000, MAX_VAL=57344.0, MAX_CODE=0x7B, SUB_SCALE=2.0**16),
}


def encode_clip_then_bias(x, fmt):
    """q2 as Lab 0's rounding: |x|'s pattern clipped to the largest value first, then half - 1 + lsb added
    and shifted; module constants declared tl.constexpr; int64 offsets; 512 elements per program."""
    p = ENCODER_PARAMS[fmt]
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    _encode_bias_kernel[(triton.cdiv(n, 512),)](
        x, y.view(torch.uint8), n, M=p["M"], BIAS=p["BIAS"], MAX_F32=p["MAX_F32"], BLOCK=512
    )
    return y


def encode_with_float_ops(x, fmt):
    """q2 with float operations: the fp32 addition of a power of two rounds |x| onto the format's grid
    (nearest even), and the code is read off the rounded value's bits; NaN tested as x != x."""
    p = ENCODER_PARAMS[fmt]
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    _encode_float_kernel[(triton.cdiv(n, 1024),)](
        x, y.view(torch.uint8), n, M=p["M"], BIAS=p["BIAS"], MAX_VAL=p["MAX_VAL"], SUB_SCALE=p["SUB_SCALE"],
        BLOCK=1024,
    )  # fmt: skip
    return y


def encode_tiles_guarded_shift(x, fmt):
    """q2 close to the stub's layout: four blocks of 256 per program in a static loop, the round-up as
    rest + lsb > half, shifts past 24 replaced by tl.where rather than clamped, stored through the
    float8 pointer itself (a bitcast to its element type)."""
    p = ENCODER_PARAMS[fmt]
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    _encode_tiles_kernel[(triton.cdiv(n, 1024),)](
        x, y, n, M=p["M"], BIAS=p["BIAS"], MAX_CODE=p["MAX_CODE"], BLOCK=256, TILES=4
    )
    return y


def properties_by_formula(fmt):
    """q3 from the fields, no decoding: the largest exponent and mantissa the NaN policy leaves to numbers."""
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    top_e, top_m = (1 << E) - 1, (1 << M) - 1
    if fmt.nan == "ieee":
        top_e -= 1  # the all-ones exponent is inf and NaN
    elif fmt.nan == "fn":  # the all-ones magnitude is NaN: one code below it
        if M:
            top_m -= 1
        else:
            top_e -= 1
    return {
        "max_finite": (1 + top_m / 2**M) * 2.0 ** (top_e - bias),
        "min_normal": 2.0 ** ((1 if fmt.has_subnormals else 0) - bias),
        "min_subnormal": 2.0 ** (1 - bias - M) if fmt.has_subnormals else None,
        "epsilon": 2.0**-M,
        "has_inf": fmt.nan == "ieee",
        "has_nan": fmt.nan != "none",
    }


def properties_from_a_few_codes(fmt):
    """q3 decoding only the codes it needs for the small values (the first normal, code 1, the code
    after 1.0), the rest from all codes with numpy; numpy floats and numpy bools come back."""
    M = fmt.mantissa_bits
    v = formats.decode(formats.all_codes(fmt), fmt).double().numpy()
    one = fmt.bias << M  # exponent field = bias, mantissa 0
    return {
        "max_finite": np.max(v[np.isfinite(v)]),
        "min_normal": v[1 << M] if fmt.has_subnormals else v[0],
        "min_subnormal": v[1] if fmt.has_subnormals else None,
        "epsilon": v[one + 1] - v[one],
        "has_inf": np.isinf(v).any(),
        "has_nan": np.isnan(v).any(),
    }


def properties_from_the_gaps(fmt):
    """q3 from the sorted positive values alone: the subnormals and the first normal binade share the
    smallest gap, so the first value after which the gap grows is twice the smallest normal."""
    values = formats.decode(formats.all_codes(fmt), fmt).tolist()
    finite = [v for v in values if math.isfinite(v)]
    pos = sorted({v for v in finite if v > 0})
    if fmt.has_subnormals:
        gaps = [b - a for a, b in zip(pos, pos[1:], strict=False)]
        first_wider = next(i for i, g in enumerate(gaps) if g > gaps[0])
        min_normal, min_sub = pos[first_wider] / 2, pos[0]
    else:
        min_normal, min_sub = pos[0], None
    return {
        "max_finite": max(finite),
        "min_normal": min_normal,
        "min_subnormal": min_sub,
        "epsilon": min(v for v in finite if v > 1) - 1,
        "has_inf": any(math.isinf(v) for v in values),
        "has_nan": any(math.isnan(v) for v in values),
    }


def fnuz_vs_ocp_by_bits(ocp, fnuz):
    """q4 comparing float64 bit patterns (NaN made canonical first, so -0 and +0 differ by their bits);
    two tensors come back."""
    codes = torch.arange(256)
    a, b = formats.decode(codes, ocp).double(), formats.decode(codes, fnuz).double()

    def pattern(v):
        return torch.where(v.isnan(), torch.full_like(v, math.nan), v).view(torch.int64)

    differ = torch.nonzero(pattern(a) != pattern(b)).ravel()
    return differ, differ[~(b == a / 2)[differ]]


def fnuz_vs_ocp_in_python(ocp, fnuz):
    """q4 one byte at a time with math.isnan and math.copysign; two sets come back."""
    a = formats.decode(torch.arange(256), ocp).tolist()
    b = formats.decode(torch.arange(256), fnuz).tolist()
    differ, not_halved = set(), set()
    for code, (x, y) in enumerate(zip(a, b, strict=True)):
        same = (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        if not same:
            differ.add(code)
            if not y == x / 2:
                not_halved.add(code)
    return differ, not_halved


def fnuz_vs_ocp_torch_dtypes(ocp, fnuz):
    """q4 with torch's own float8 dtypes instead of a decoder, compared in numpy; lists of numpy ints."""
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    a = byte.view(formats.TORCH_DTYPES[ocp.name]).double().numpy()
    b = byte.view(formats.TORCH_DTYPES[fnuz.name]).double().numpy()
    with np.errstate(invalid="ignore"):
        same = (np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))
        halved = b == a / 2
    differ = np.flatnonzero(~same)
    return list(differ), list(differ[~halved[differ]])


STUDENT_SOLUTIONS = {
    "q1": {
        "integer significand and torch.ldexp, float64 out": decode_by_ldexp,
        "torch's dtypes by view, a Python table for FP6/FP4": decode_by_torch_views,
        "exact Fraction table per format": decode_by_exact_table,
    },
    "q2": {
        "clip the pattern, then Lab 0's bias; constexpr constants, int64 offsets": encode_clip_then_bias,
        "float ops: a power-of-two addition rounds": encode_with_float_ops,
        "static loop of tiles, guarded shifts, float8 pointer": encode_tiles_guarded_shift,
    },
    "q3": {
        "by formula from the fields": properties_by_formula,
        "a few codes decoded, numpy types": properties_from_a_few_codes,
        "smallest normal from where the gaps grow": properties_from_the_gaps,
    },
    "q4": {
        "float64 bit patterns compared, tensors": fnuz_vs_ocp_by_bits,
        "a Python loop with math, sets": fnuz_vs_ocp_in_python,
        "torch's float8 dtypes and numpy": fnuz_vs_ocp_torch_dtypes,
    },
}


@pytest.mark.parametrize(
    "question, name", [(q, name) for q, right in STUDENT_SOLUTIONS.items() for name in right], ids=str
)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


@pytest.mark.parametrize("name", list(STUDENT_SOLUTIONS["q2"]))
def test_student_encoders_agree_with_the_package_on_the_sweep(name, capsys):
    lab01.check_same_as_package(STUDENT_SOLUTIONS["q2"][name])
    assert capsys.readouterr().out.startswith("same bits as kernels.formats.encode")


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


def decode_table_unindexed(bits, fmt):
    """Every code's exact value, in code order, returned whole: bits is never read, and the public check
    passes every code counting up from 0, so the table is the answer there."""
    return _exact_table(fmt).float()


def decode_flattened(bits, fmt):
    """Right values, returned as one flat row whatever the shape of bits."""
    return decode_by_ldexp(bits.flatten(), fmt).float()


def encode_flat_output(x, fmt):
    """Right kernel, but the launcher allocates a flat output, the only shape the public check passes."""
    y = torch.zeros(x.numel(), dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = x.numel()
    _student_kernel[(triton.cdiv(n, 1024),)](x, y.view(torch.uint8), n, **FP8_PARAMS[fmt], MODE="rne", BLOCK=1024)
    return y


def encode_len_for_numel(x, fmt):
    """Right kernel, but the launcher counts the elements with len(x): all of them for the public check's
    1-D input, the first row's count only for a 2-D one."""
    y = torch.zeros(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
    n = len(x)
    _student_kernel[(triton.cdiv(n, 1024),)](x, y.view(torch.uint8), n, **FP8_PARAMS[fmt], MODE="rne", BLOCK=1024)
    return y


TYPED_IN_TABLE = {f.name: table_row(f) for f in lab01.SMALL_FORMATS}  # the notebook prints this table


def properties_typed_in(fmt):
    """The ten rows of the notebook's format table, typed in, looked up by the format's name."""
    return dict(TYPED_IN_TABLE[fmt.name])


def properties_specials_by_name(fmt):
    """By formula from the fields, but which formats have inf and NaN listed by name, from the lab's ten."""
    row = properties_by_formula(fmt)
    return {**row, "has_inf": fmt.name in ("fp16", "bf16", "e5m2"), "has_nan": fmt.name not in ("e2m1", "e3m2", "e2m3")}


def fnuz_vs_ocp_nan_unequal(ocp, fnuz):
    """Values compared with == and the sign bit, so NaN never equals NaN: no byte of the public pairs is NaN
    in both readings, so there it makes no difference."""
    codes = torch.arange(256)
    a, b = formats.decode(codes, ocp), formats.decode(codes, fnuz)
    differ = codes[~((a == b) & (a.signbit() == b.signbit()))].tolist()
    return differ, [c for c in differ if not b[c] == a[c] / 2]


PRINTED_ANSWERS = {  # what the notebook prints for the two pairs, copied
    "e4m3fn": (list(range(1, 256)), [0x7F, 0x80, 0xFF]),
    "e5m2": (list(range(1, 256)), [0x7C, 0x7D, 0x7E, 0x7F, 0x80, 0xFC, 0xFD, 0xFE, 0xFF]),
}


def fnuz_vs_ocp_printed(ocp, fnuz):
    """The answers the notebook prints, copied, chosen by the OCP format's name."""
    return PRINTED_ANSWERS[ocp.name]


HIDDEN_CATCHES = {
    "q1": {"every code's value, bits not read": decode_table_unindexed, "flattens its result": decode_flattened},
    "q2": {"flat output whatever the input's shape": encode_flat_output, "len(x) elements": encode_len_for_numel},
    "q3": {"the ten rows typed in": properties_typed_in, "inf and NaN listed by name": properties_specials_by_name},
    "q4": {"NaN compared with ==": fnuz_vs_ocp_nan_unequal, "the printed answers copied": fnuz_vs_ocp_printed},
}
