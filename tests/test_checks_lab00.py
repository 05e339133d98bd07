"""Lab 0's checks pass the right answer and catch each wrong one with the right diagnosis.

Every diagnosis the checks can give is demanded here from a deliberately wrong solution written the
way a student would write it, so a check that stopped diagnosing (or started blaming the wrong
thing) fails a test rather than misleading a student.  ``WRONG_SOLUTIONS`` holds them per otter
question (``tests/test_wrong_solutions.py`` demands a set for every question of every lab and runs
each through the lab's own otter test); ``DIAGNOSES`` says what each one's message must contain.
"""

import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import bf16
from kernels.checks import ExerciseNotDone, lab00, passes
from kernels.device import default_device

DEVICE = default_device()

# -- q1: round_bf16_bits in PyTorch, right and wrong --------------------------------------------------


def is_nan(b):
    return (b & 0x7FFFFFFF) > 0x7F800000


def canonical_nan(b, rounded):
    return torch.where(is_nan(b), torch.full_like(b, 0x7FFF), rounded)


def rne(b):
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


def correct(b):
    return canonical_nan(b, rne(b))


def truncate(b):
    return b >> 16


def ties_away(b):
    return canonical_nan(b, (b + 0x8000) >> 16)


def ties_away_no_nan(b):
    return (b + 0x8000) >> 16


def ties_down(b):
    return canonical_nan(b, (b + 0x7FFF) >> 16)


def rounds_up_below_half(b):
    return canonical_nan(b, (b + 0xFFFF) >> 16)


def no_nan_case(b):
    return rne(b) & 0xFFFF  # masked to 16 bits, so NaN shows up as inf, zero or another NaN


def no_nan_case_unmasked(b):
    return rne(b)


def nan_keeps_payload(b):
    return torch.where(is_nan(b), (b >> 16) | 0x0040, rne(b))


def nan_test_catches_inf(b):
    return torch.where((b & 0x7F800000) == 0x7F800000, torch.full_like(b, 0x7FFF), rne(b))


def mantissa_field_only(b):
    kept = (((b & 0x7FFFFF) + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0x7F
    return canonical_nan(b, ((b >> 16) & 0xFF80) | kept)


def saturates(b):
    r = correct(b)
    finite = (b & 0x7FFFFFFF) < 0x7F800000
    return torch.where(finite & ((r & 0x7FFF) == 0x7F80), r - 1, r)


def drops_sign(b):
    return correct(b & 0x7FFFFFFF)


def flushes_subnormals(b):
    subnormal = (b & 0x7F800000) == 0
    return torch.where(subnormal, (b >> 16) & 0x8000, correct(b))


def no_shift(b):
    return canonical_nan(b, b + 0x7FFF + ((b >> 16) & 1))


def in_place(b):
    b += 0x7FFF + ((b >> 16) & 1)
    return canonical_nan(b, b >> 16)


def stub(b):
    raise NotImplementedError("q1: write round_bf16_bits")


Q1_DIAGNOSES = {
    truncate: [
        "truncates instead of rounding (0x3F808001 -> 0x3F80, want 0x3F81)",
        "NaN became inf",
        "NaN payload/sign not canonical",
    ],
    ties_away: ["ties rounded away from zero (0x3F808000 -> 0x3F81, want 0x3F80)"],
    ties_away_no_nan: [
        "ties rounded away from zero",
        "values outside 0..0xFFFF (0xFFFFFFFF -> 0x10000",
        "the rounding carry of a NaN ran past bit 31",
        "NaN became inf",
        "NaN became zero",
        "not canonical",
    ],
    ties_down: ["ties always rounded down (0x3F818000 -> 0x3F81, want 0x3F82)"],
    rounds_up_below_half: ["rounds up below the halfway point (0x3F807FFF -> 0x3F81, want 0x3F80)"],
    no_nan_case: [
        "NaN became inf (0x7F800001 -> 0x7F80, want 0x7FFF)",
        "NaN became zero (0x7FFFFFFF -> 0x8000, want 0x7FFF): the rounding carry ran through",
        "NaN payload/sign not canonical",
    ],
    no_nan_case_unmasked: [
        "values outside 0..0xFFFF (0xFFFFFFFF -> 0x10000, want 0x7FFF): the rounding carry of a NaN ran past bit 31",
        "NaN became inf",
        "NaN became zero",
        "not canonical",
    ],
    nan_keeps_payload: ["NaN payload/sign not canonical (0x7F800001 -> 0x7FC0, want 0x7FFF)"],
    nan_test_catches_inf: ["inf became NaN (0x7F800000 -> 0x7FFF, want 0x7F80)"],
    mantissa_field_only: ["rounding carry lost into the exponent (0x3F7FFFFF -> 0x3F00, want 0x3F80)"],
    saturates: ["saturates instead of overflowing to inf (0x7F7FFFFF -> 0x7F7F, want 0x7F80)"],
    drops_sign: ["sign bit lost on negative inputs (0xBF808000 -> 0x3F80, want 0xBF80)"],
    flushes_subnormals: ["subnormals flushed to zero (0x00018000 -> 0x0000, want 0x0002)"],
    no_shift: [
        "values outside 0..0xFFFF (0x3F808001 -> 0x3F810000, want 0x3F81): a bf16 pattern is the top 16 "
        "bits: did you shift right by 16?"
    ],
}

Q1_NAMES = {
    truncate: "truncates instead of rounding",
    ties_away: "ties rounded away from zero",
    ties_away_no_nan: "ties away from zero, no NaN case",
    ties_down: "ties always rounded down",
    rounds_up_below_half: "rounds up below the halfway point",
    no_nan_case: "no NaN case, masked to 16 bits",
    no_nan_case_unmasked: "no NaN case, not masked",
    nan_keeps_payload: "NaN keeps its payload",
    nan_test_catches_inf: "NaN test also catches inf",
    mantissa_field_only: "rounds the mantissa field alone",
    saturates: "saturates instead of overflowing",
    drops_sign: "drops the sign",
    flushes_subnormals: "flushes subnormals",
    no_shift: "forgets the shift",
}

# Diagnoses that each wrong solution must NOT get (one bug, one finding).
ALL_SMELLS = [
    "truncates",
    "ties rounded away",
    "ties always rounded down",
    "rounds up below",
    "carry lost",
    "saturates",
    "sign bit lost",
    "subnormals flushed",
    "inf became NaN",
    "NaN became inf",
    "NaN became zero",
    "not canonical",
    "numbers became NaN",
    "values outside",
    "other mismatches",
]


def _finding_lines(message: str) -> list:
    return [line for line in message.splitlines() if line.startswith("  - ")]


@pytest.mark.parametrize("name", list(Q1_NAMES.values()))
def test_q1_wrong_solution_is_diagnosed(name):
    fn = WRONG_SOLUTIONS["q1"][name]
    with pytest.raises(AssertionError) as info:
        lab00.check_round_bf16_bits(fn)
    message = str(info.value)
    assert not isinstance(info.value, ExerciseNotDone)
    assert message.startswith("q1: round_bf16_bits differs from the hardware cast")
    for want in DIAGNOSES["q1"][name]:
        assert want in message, f"{fn.__name__}: expected {want!r} in:\n{message}"
    findings = " ".join(_finding_lines(message))
    expected = " ".join(DIAGNOSES["q1"][name])
    extra = [s for s in ALL_SMELLS if s in findings and s not in expected]
    assert not extra, f"{fn.__name__}: spurious diagnoses {extra} in:\n{message}"
    assert "first mismatches" in message


def test_q1_correct_passes_with_counts(capsys):
    assert lab00.check_round_bf16_bits(correct) is None
    assert lab00.check_round_bf16_bits(bf16.round_bf16_bits_reference) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == (
        "q1 passed: round_bf16_bits matches the hardware cast bit for bit on 10273/10273 inputs "
        "(special 33, tie 2048, neighbour 4096, random 4096)"
    )


def test_q1_accepts_16_bit_results():
    lab00.check_round_bf16_bits(lambda b: correct(b).to(torch.int16))
    lab00.check_round_bf16_bits(lambda b: correct(b).to(torch.int32))


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (stub, r"q1: round_bf16_bits raised NotImplementedError: exercise not done yet"),
        (lambda b: None, r"q1: round_bf16_bits returned None: exercise not done yet"),
        (None, r"q1: round_bf16_bits is not defined yet: exercise not done yet"),
        (..., r"q1: round_bf16_bits is not defined yet: exercise not done yet"),
    ],
    ids=["stub", "returns-None", "None", "Ellipsis"],
)
def test_q1_not_done(fn, pattern):
    with pytest.raises(ExerciseNotDone, match=pattern):
        lab00.check_round_bf16_bits(fn)


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (in_place, r"changed its argument in place"),
        (lambda b: b.float(), r"wrong dtype: round_bf16_bits returned torch.float32, want an integer tensor"),
        (lambda b: correct(b)[:-1], r"wrong shape: round_bf16_bits returned shape \(10272,\), want \(10273,\)"),
        (lambda b: correct(b).tolist(), r"wrong type: round_bf16_bits returned list"),
        (lambda b: b.no_such_method(), r"round_bf16_bits raised AttributeError: .*no_such_method"),
        (lambda b: torch.zeros_like(b), r"every output is 0x0000, whatever the input"),
        (42, r"round_bf16_bits must be a function, got int"),
    ],
    ids=["in-place", "float", "shape", "list", "crash", "constant", "not-callable"],
)
def test_q1_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab00.check_round_bf16_bits(fn)


# -- q2: Triton kernels, right and wrong ----------------------------------------------------------


@triton.jit
def _variant_kernel(x_ptr, y_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = x.to(tl.uint32, bitcast=True)
    lsb = (u >> 16) & 1
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if MODE == "truncate":
        out = u >> 16
    elif MODE == "ties_away":
        out = tl.where(nan, 0x7FFF, (u + 0x8000) >> 16)
    elif MODE == "no_nan":
        out = (u + 0x7FFF + lsb) >> 16
    elif MODE == "nan_keeps_sign":
        out = tl.where(nan, (u >> 16) | 0x7FFF, (u + 0x7FFF + lsb) >> 16)
    elif MODE == "int32_bits":  # signed bit pattern: still right, the low 16 bits are the same
        s = x.to(tl.int32, bitcast=True)
        out = tl.where(nan, 0x7FFF, (s + 0x7FFF + ((s >> 16) & 1)) >> 16)
    else:
        out = tl.where(nan, 0x7FFF, (u + 0x7FFF + lsb) >> 16)
    y = out.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    if MODE != "no_store":
        tl.store(y_ptr + offs, y, mask=mask)
    if MODE == "writes_input":
        tl.store(x_ptr + offs, x * 2, mask=mask)


def launcher(mode):
    def fp32_to_bf16(x):
        y = torch.zeros(x.shape, dtype=torch.bfloat16, device=x.device)
        n = x.numel()
        _variant_kernel[(triton.cdiv(n, 1024),)](x, y, n, MODE=mode, BLOCK=1024)
        return y

    fp32_to_bf16.__name__ = f"fp32_to_bf16_{mode}"
    return fp32_to_bf16


@pytest.mark.parametrize("mode", ["rne", "int32_bits"])
def test_q2_correct_kernel_passes(mode, capsys):
    lab00.check_round_bf16(launcher(mode))
    assert capsys.readouterr().out.strip() == (
        "q2 passed: your kernel matches the hardware cast bit for bit on 10273/10273 inputs "
        "(special 33, tie 2048, neighbour 4096, random 4096)"
    )


def test_q2_package_kernel_passes():
    lab00.check_round_bf16(bf16.fp32_to_bf16_rne)


Q2_MODES = {
    "truncates instead of rounding": "truncate",
    "ties rounded away from zero": "ties_away",
    "no NaN case": "no_nan",
    "NaN keeps its sign": "nan_keeps_sign",
    "no tl.store": "no_store",
}
Q2_DIAGNOSES = {
    "truncates instead of rounding": [
        "truncates instead of rounding (0x3F808001 -> 0x3F80, want 0x3F81)",
        "NaN became inf",
    ],
    "ties rounded away from zero": ["ties rounded away from zero (0x3F808000 -> 0x3F81, want 0x3F80)"],
    "no NaN case": [
        "NaN became inf (0x7F800001 -> 0x7F80, want 0x7FFF)",
        "NaN became zero (0x7FFFFFFF -> 0x8000, want 0x7FFF)",
    ],
    "NaN keeps its sign": ["NaN payload/sign not canonical (0xFFC00000 -> 0xFFFF, want 0x7FFF)"],
    "no tl.store": ["every output is 0x0000, whatever the input", "tl.store"],
}

# The convention every lab's check tests follow: per otter question, deliberately wrong solutions by
# description, and what each one's diagnosis must contain.
WRONG_SOLUTIONS = {
    "q1": {name: fn for fn, name in Q1_NAMES.items()},
    "q2": {name: launcher(mode) for name, mode in Q2_MODES.items()},
}
DIAGNOSES = {
    "q1": {name: Q1_DIAGNOSES[fn] for fn, name in Q1_NAMES.items()},
    "q2": Q2_DIAGNOSES,
}
CHECKS = {"q1": lab00.check_round_bf16_bits, "q2": lab00.check_round_bf16}


def test_every_question_has_wrong_solutions_with_diagnoses():
    assert set(WRONG_SOLUTIONS) == set(DIAGNOSES) == set(CHECKS) == {"q1", "q2"}
    for q, wrongs in WRONG_SOLUTIONS.items():
        assert wrongs and set(wrongs) == set(DIAGNOSES[q]), q
    assert set(Q1_NAMES) == set(Q1_DIAGNOSES)


@pytest.mark.parametrize("name", list(Q2_MODES))
def test_q2_wrong_kernel_is_diagnosed(name):
    with pytest.raises(AssertionError) as info:
        lab00.check_round_bf16(WRONG_SOLUTIONS["q2"][name])
    message = str(info.value)
    assert not isinstance(info.value, ExerciseNotDone)
    assert message.startswith("q2: your kernel differs from the hardware cast")
    for want in DIAGNOSES["q2"][name]:
        assert want in message, f"{name}: expected {want!r} in:\n{message}"


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_q2_kernel_writing_its_input_is_caught():
    with pytest.raises(AssertionError, match="the kernel wrote into its input x"):
        lab00.check_round_bf16(launcher("writes_input"))


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (lambda x: x.clone(), r"wrong dtype/shape: returned torch.float32 of shape \(10273,\), want torch.bfloat16"),
        (lambda x: bf16.fp32_to_bf16_rne(x)[:5], r"wrong dtype/shape: .* of shape \(5,\)"),
        (lambda x: None, r"q2: .* returned None: exercise not done yet"),
        (lambda x: bf16.fp32_to_bf16_rne(x).tolist(), r"wrong type: returned list"),
    ],
    ids=["float32", "shape", "None", "list"],
)
def test_q2_bad_return(fn, pattern):
    with pytest.raises(AssertionError, match=pattern):
        lab00.check_round_bf16(fn)


# -- the final comparison with the package, and the quiet pass/fail used for fallbacks ----------------


def test_same_as_package(capsys):
    lab00.check_same_as_package(launcher("rne"))
    assert capsys.readouterr().out.strip() == (
        "same bits as kernels.bf16.fp32_to_bf16_rne: 30 standard cases and 327680 patterns"
    )


def test_same_as_package_catches_a_difference():
    # ties away from zero is right on the random inputs of check_kernel, wrong on the sweep's ties
    with pytest.raises(
        AssertionError,
        match=re.escape("differ on 32640 of 327680 patterns (first: 0x00008000 -> 0x0001, package 0x0000)"),
    ):
        lab00.check_same_as_package(launcher("ties_away"))
    with pytest.raises(AssertionError, match="your converter"):
        lab00.check_same_as_package(launcher("truncate"))


def test_passes_is_quiet(capsys):
    assert passes(lab00.check_round_bf16_bits, correct) is True
    assert passes(lab00.check_round_bf16_bits, truncate) is False
    assert passes(lab00.check_round_bf16_bits, stub) is False
    assert capsys.readouterr().out == ""


def test_input_set_is_fixed():
    inputs = lab00.adversarial_fp32()
    again = lab00.adversarial_fp32()
    assert (inputs.bits == again.bits).all() and inputs.bits.size == 10273
    assert list(inputs.counts) == ["special", "tie", "neighbour", "random"]
    assert inputs.bits[0] == 0x3F808001  # the first special is the one quoted for truncation


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, solutions that are right by the
# lab's contract but not the lab's own, each differing from it (and from the others) where compiled
# Triton and the interpreter, or one integer width and another, could disagree.  Every one must pass
# its check here and get full marks from the lab's otter test (``tests/test_wrong_solutions.py``).


def compares_the_dropped_half(b):
    """q1 without a bias: NaN read off the exponent and mantissa fields, and the dropped low half
    compared with 0x8000; the carry of 0x7F7F + 1 into 0x7F80 (inf) is an ordinary integer carry."""
    exponent, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
    upper, dropped = b >> 16, b & 0xFFFF
    up = (dropped > 0x8000) | ((dropped == 0x8000) & ((upper & 1) == 1))
    return torch.where((exponent == 0xFF) & (mantissa != 0), 0x7FFF, upper + up.long())


def int32_twos_complement(b):
    """q1 in 32-bit signed arithmetic: the patterns wrap into int32 (negative numbers have the sign bit
    set), the shift is arithmetic and the result is masked back to 16 bits."""
    s = b.to(torch.int32)  # values >= 2^31 wrap to negative int32
    r = ((s + 0x7FFF + ((s >> 16) & 1)) >> 16) & 0xFFFF
    return torch.where((s & 0x7FFFFFFF) > 0x7F800000, 0x7FFF, r).to(torch.int32)


def float64_round_half_even(b):
    """q1 with float operations: the value in float64, rounded to 8 significant bits (or, below bf16's
    smallest normal 2^-126, to a multiple of its subnormal step 2^-133) by torch.round, which rounds
    halves to even; then the bf16 pattern is the top half of the fp32 it lands on."""
    x = b.to(torch.int32).view(torch.float32).double()
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2^exponent, |mantissa| in [0.5, 1)
    normal = torch.ldexp(torch.round(torch.ldexp(mantissa, torch.full_like(exponent, 8))), exponent - 8)
    tiny = torch.ldexp(torch.round(torch.ldexp(x, torch.full_like(exponent, 133))), torch.full_like(exponent, -133))
    r = torch.where(x.abs() < 2.0**-126, tiny, normal)
    r = torch.where(torch.isinf(x), x, r)  # frexp leaves inf's exponent at 0: keep inf as it is
    pattern = r.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # past bf16's max: fp32 inf
    return torch.where(torch.isnan(x), 0x7FFF, pattern >> 16)


NAN_BF16 = tl.constexpr(0x7FFF)
ABS_MASK = tl.constexpr(0x7FFFFFFF)
INF_BITS = tl.constexpr(0x7F800000)


@triton.jit
def _q2_compare_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64 offsets
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)  # no other=: masked lanes are never stored
    u = x.to(tl.uint32, bitcast=True)
    upper = u >> 16
    dropped = u & 0xFFFF
    up = (dropped > 0x8000) | ((dropped == 0x8000) & ((upper & 1) == 1))
    out = tl.where((u & ABS_MASK) > INF_BITS, NAN_BF16, upper + up.to(tl.uint32))
    tl.store(y_ptr + offs, out.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)


def q2_compares_the_dropped_half(x):
    """Module-level constants declared tl.constexpr, int64 offsets, 256 elements per program, a masked
    load without other=, and the round-up decided by comparing the dropped half with 0x8000."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    _q2_compare_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
    return y


@triton.jit
def _q2_int32_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, TILES: tl.constexpr):
    start = tl.program_id(0) * (BLOCK * TILES)
    for t in tl.static_range(TILES):  # several blocks per program
        offs = start + t * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        s = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.int32, bitcast=True)
        exponent = (s >> 23) & 0xFF  # arithmetic shift, masked: the field whatever the sign
        mantissa = s & 0x7FFFFF
        r = (s + 0x7FFF + ((s >> 16) & 1)) >> 16  # arithmetic shift: the low 16 bits are the pattern
        r = tl.where((exponent == 0xFF) & (mantissa != 0), 0x7FFF, r)
        tl.store(y_ptr + offs, r.to(tl.int16), mask=mask)  # truncated to 16 bits


def q2_int32_bits(x):
    """Signed int32 patterns and an arithmetic shift, NaN from the fields, four blocks of 128 per
    program in a static loop, stored as int16 into an int16 view of the bf16 output."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    _q2_int32_kernel[(triton.cdiv(n, 512),)](x, y.view(torch.int16), n, BLOCK=128, TILES=4)
    return y


@triton.jit
def _q2_uint64_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # a 2-D grid, flattened
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    w = x.to(tl.uint32, bitcast=True).to(tl.uint64)  # room above bit 31: no carry is ever lost
    rounded = (w + 0x7FFF + ((w >> 16) & 1)) >> 16
    out = tl.where((w & 0x7FFFFFFF) > 0x7F800000, 0x7FFF, rounded & 0xFFFF)
    tl.store(y_ptr + offs, out.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)


def q2_uint64_words(x):
    """The bias-and-shift recipe in 64-bit unsigned integers, on a 2-D grid of 8 columns whose last
    programs may lie wholly past the end (their lanes are all masked)."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    programs = triton.cdiv(n, 1024)
    _q2_uint64_kernel[(8, triton.cdiv(programs, 8))](x, y, n, BLOCK=1024)
    return y


STUDENT_SOLUTIONS = {
    "q1": {
        "compares the dropped half with 0x8000": compares_the_dropped_half,
        "int32 two's complement, masked to 16 bits": int32_twos_complement,
        "float64 frexp and round-half-even": float64_round_half_even,
    },
    "q2": {
        "constexpr constants, int64 offsets, dropped half compared": q2_compares_the_dropped_half,
        "signed int32, static loop of blocks, int16 view": q2_int32_bits,
        "uint64 words on a 2-D grid": q2_uint64_words,
    },
}


@pytest.mark.parametrize(
    "question, name", [(q, name) for q, right in STUDENT_SOLUTIONS.items() for name in right], ids=str
)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


def _public_answers():
    inputs = lab00.adversarial_fp32()
    b = torch.from_numpy(inputs.bits.astype(np.int64))
    return dict(zip(b.tolist(), correct(b).tolist(), strict=True))


PUBLIC_ANSWERS = _public_answers()


def answers_from_a_table(b):
    """Right on every input the public check shows (a table of them), truncation elsewhere."""
    flat = b.reshape(-1).tolist()
    out = [PUBLIC_ANSWERS.get(v, v >> 16) for v in flat]
    return torch.tensor(out, dtype=torch.int64).reshape(b.shape)


def flattens(b):
    """Right values, returned as one flat row whatever the input's shape."""
    return correct(b.reshape(-1))


def q2_flat_output(x):
    """Right kernel, but the launcher allocates a flat output, the only shape the public check passes."""
    y = torch.empty(x.numel(), dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    _variant_kernel[(triton.cdiv(n, 1024),)](x.contiguous(), y, n, MODE="rne", BLOCK=1024)
    return y


HIDDEN_CATCHES = {
    "q1": {"answers from a table of the public inputs": answers_from_a_table, "flattens its result": flattens},
    "q2": {"flat output whatever the input's shape": q2_flat_output},
}
