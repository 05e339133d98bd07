"""Checks for Lab 0, rounding fp32 to bf16.

* q1 :func:`check_round_bf16_bits`: ``round_bf16_bits(bits)``, the rounding in plain PyTorch integer
  ops, fp32 bit patterns (int64 in [0, 2^32)) -> bf16 bit patterns (integers in [0, 2^16)).
* q2 :func:`check_round_bf16`: a function with the signature of ``kernels.bf16.fp32_to_bf16_rne``
  (fp32 tensor -> bf16 tensor) that launches the student's Triton kernel.
* :func:`check_same_as_package`: the student's converter and the package's give the same bits on the
  standard shapes and adversarial inputs of ``kernels.testing`` and on every upper half.

The truth is always the hardware cast, ``x.to(tl.bfloat16)`` in a Triton kernel.  The input set is
fixed (no dependence on device or seed), so the pass line prints the same counts everywhere.  On a
mismatch the check does not stop at "N differ": it tries the wrong recipes students actually write
(truncation, ties away from zero, no NaN case, ...) and names each one whose fingerprint it finds,
with one input, what came back and what was wanted.
"""

import numpy as np
import torch

from kernels import bf16
from kernels.checks import InputSet, call_student, constant_output, type_name
from kernels.device import default_device
from kernels.testing import STANDARD_SHAPES, bits, check_kernel

ABS = 0x7FFFFFFF
INF32 = 0x7F800000

# Hand-picked inputs, listed first so that each diagnosis quotes the textbook example of its smell.
# Each pattern -> what it demonstrates.
SPECIALS = {
    0x3F808001: "just above half",
    0x3F807FFF: "just below half",
    0x3F808000: "tie, even kept part",
    0x3F818000: "tie, odd kept part",
    0xBF808000: "negative tie, even",
    0xBF818000: "negative tie, odd",
    0x3F800000: "1.0, exact",
    0xBF800000: "-1.0, exact",
    0x3F7FFFFF: "carry into the exponent",
    0x3FFF8000: "tie carrying into the exponent",
    0x7F7FFFFF: "fp32 max: overflows to inf",
    0x7F7F8000: "tie at the overflow threshold",
    0x7F7F7FFF: "just below the overflow threshold",
    0xFF7FFFFF: "-fp32 max: overflows to -inf",
    0x00000000: "+0",
    0x80000000: "-0",
    0x00018000: "subnormal tie, odd",
    0x00008000: "subnormal tie, even",
    0x0000FFFF: "subnormal above half",
    0x007FFFFF: "largest subnormal",
    0x807F8000: "negative subnormal tie",
    0x00000001: "smallest subnormal",
    0x7F800000: "inf",
    0xFF800000: "-inf",
    0x7F800001: "NaN, payload in the low half only",
    0x7FFFFFFF: "NaN, all ones",
    0x7FC00000: "quiet NaN",
    0xFFC00000: "negative quiet NaN",
    0xFFFFFFFF: "negative NaN, all ones",
    0x7F808000: "NaN that looks like a tie",
    0xFF800001: "negative NaN, low payload",
    0x7FBFFFFF: "NaN, carry into the quiet bit",
    0x7FFF8000: "NaN, tie carrying into the sign",
}


def adversarial_fp32() -> InputSet:
    """The fixed inputs the checks use: hand-picked specials; ties and their two neighbours for every
    sign and exponent with kept mantissas 0x00, 0x01, 0x7E, 0x7F; 4096 random bit patterns."""
    upper = np.arange(512, dtype=np.uint32) << 23  # every sign and exponent
    kept = np.array([0x00, 0x01, 0x7E, 0x7F], dtype=np.uint32) << 16
    base = (upper[:, None] | kept[None, :]).ravel()
    ties = base | 0x8000
    neighbours = (base[:, None] | np.array([0x7FFF, 0x8001], dtype=np.uint32)[None, :]).ravel()
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, size=4096, dtype=np.uint64).astype(np.uint32)
    parts = {
        "special": np.array(list(SPECIALS), dtype=np.uint32),
        "tie": ties,
        "neighbour": neighbours,
        "random": random,
    }
    labels = np.concatenate([np.full(len(v), k) for k, v in parts.items()])
    return InputSet(np.concatenate(list(parts.values())), labels, {k: len(v) for k, v in parts.items()})


def _want_bits(inputs: InputSet) -> np.ndarray:
    """The hardware cast's bf16 patterns for the input set, as int64."""
    device = default_device()
    return bits(bf16.hardware_bf16(inputs.fp32(device))).astype(np.int64)


# -- diagnosis ---------------------------------------------------------------------------------


def _h(v, width=4) -> str:
    return f"0x{int(v):0{width}X}"


def _example(u, got, want, idx) -> str:
    i = idx[0]
    return f"{_h(u[i], 8)} -> {_h(got[i])}, want {_h(want[i])}"


def diagnose(u: np.ndarray, got: np.ndarray, want: np.ndarray) -> list:
    """Name the wrong recipes whose fingerprints appear in ``got`` (int64 bf16 patterns).

    Each smell is a region of inputs plus the value a particular mistake produces there.  Once a
    smell is named, every mismatch that mistake explains is set aside, so one bug is reported once
    (a truncating kernel also rounds odd ties down; that is not a second finding).
    """
    constant = constant_output(got, want, _h)
    if constant:
        return [constant]
    u = u.astype(np.int64)
    mag = u & ABS
    nan = mag > INF32
    inf = mag == INF32
    finite = ~(nan | inf)
    low = u & 0xFFFF
    trunc = u >> 16
    lsb = trunc & 1
    subnormal = finite & ((u & INF32) == 0) & (mag != 0)
    # Inputs that must overflow to inf are kept out of the rounding smells' regions: a saturating
    # kernel returns trunc there, which is not truncation.
    overflow = finite & ((want & 0x7FFF) == 0x7F80)
    rounding = finite & ~overflow
    open_ = got != want  # mismatches not yet explained
    found = []

    def smell(region, produced, name, hint, recipe=None):
        """Name the smell if ``produced`` appears where it should not; set aside what it explains:
        with a ``recipe`` (the whole wrong computation), every finite mismatch it reproduces."""
        hit = np.flatnonzero(open_ & region & (got == produced))
        if hit.size:
            found.append(f"{name} ({_example(u, got, want, hit)}): {hint}")
            open_[hit] = False
            if recipe is not None:
                open_[finite & (got == recipe)] = False

    outside = (got < 0) | (got > 0xFFFF)
    if outside.any():
        only_nan = nan[outside].all()
        smell(
            outside,
            got,
            "values outside 0..0xFFFF",
            "the rounding carry of a NaN ran past bit 31; handle NaN before adding the bias"
            if only_nan
            else "a bf16 pattern is the top 16 bits: did you shift right by 16?",
        )
        if not only_nan:
            return found  # no shift at all: everything else follows from that

    # Flushing is judged only where a zero cannot come from another bug: the truncated pattern is not
    # zero (truncation) and rounding does not carry into the exponent (a lost carry).
    no_carry = (want & 0xFF80) == (trunc & 0xFF80)
    smell(
        subnormal & ((trunc & 0x7FFF) != 0) & no_carry,
        trunc & 0x8000,
        "subnormals flushed to zero",
        "bf16 has fp32's exponent range, so subnormals round exactly like normal numbers; no special case is needed",
        recipe=np.where(subnormal, trunc & 0x8000, -1),
    )
    smell(
        rounding & (low > 0x8000) & (want == trunc + 1),
        trunc,
        "truncates instead of rounding",
        "a dropped half above 0x8000 must round the kept part up; add 0x7FFF + lsb before the shift",
        recipe=trunc,
    )
    # Before the ties: rounding up everything (ceiling) also rounds even ties up.
    smell(
        rounding & (low < 0x8000) & (want == trunc),
        trunc + 1,
        "rounds up below the halfway point",
        "only a dropped half above 0x8000 (or exactly 0x8000 with an odd kept part) rounds up",
        recipe=(u + 0xFFFF) >> 16,
    )
    smell(
        rounding & (low == 0x8000) & (lsb == 0),
        trunc + 1,
        "ties rounded away from zero",
        "a tie goes to the EVEN neighbour; the bias is 0x7FFF + lsb (lsb = bit 16, the lowest kept bit), not 0x8000",
        recipe=(u + 0x8000) >> 16,
    )
    smell(
        rounding & (low == 0x8000) & (lsb == 1),
        trunc,
        "ties always rounded down",
        "with an odd kept part a tie rounds up to the even neighbour; add lsb = (bits >> 16) & 1 to the 0x7FFF bias",
        recipe=(u + 0x7FFF) >> 16,
    )
    smell(
        finite & ((trunc & 0x7F) == 0x7F) & (want == trunc + 1),
        trunc & 0xFF80,
        "rounding carry lost into the exponent",
        "when the 7 kept mantissa bits are all ones, rounding up must carry into the exponent; add "
        "the bias to the whole 32-bit pattern, not to the mantissa field alone",
    )
    smell(
        overflow,
        want - 1,
        "saturates instead of overflowing to inf",
        "values that round past bf16's largest finite number (0x7F7F) become inf, as the hardware cast does",
    )
    smell(
        ~nan & (want >= 0x8000),
        want & 0x7FFF,
        "sign bit lost on negative inputs",
        "rounding acts on the magnitude; the sign bit must come through unchanged",
    )
    smell(
        inf,
        np.full_like(u, 0x7FFF),
        "inf became NaN",
        "inf has an all-ones exponent too, but a zero mantissa; test (bits & 0x7FFFFFFF) > 0x7F800000 for NaN",
    )
    smell(
        nan,
        (u >> 16) & 0xFF80,
        "NaN became inf",
        "its payload sat only in the 16 dropped bits, leaving the inf pattern; handle NaN (return "
        "0x7FFF) before adding the bias and shifting",
    )
    smell(
        nan,
        np.where((got & 0x7FFF) == 0, got, -1),
        "NaN became zero",
        "the rounding carry ran through the exponent (into the sign bit or past bit 31); handle NaN "
        "before adding the bias",
    )
    nan_got = ((got & 0x7F80) == 0x7F80) & ((got & 0x7F) != 0)
    smell(
        nan & nan_got,
        got,
        "NaN payload/sign not canonical",
        "want 0x7FFF, the hardware cast's answer for every NaN whatever its sign or payload",
    )
    smell(
        finite,
        np.full_like(u, 0x7FFF),
        "numbers became NaN",
        "test for NaN on the input: exponent all ones AND mantissa non-zero",
    )
    rest = np.flatnonzero(open_)
    if rest.size:
        found.append(
            f"{rest.size} other mismatches, none of them a known smell (first: {_example(u, got, want, rest)})"
        )
    return found


def _report(question: str, what: str, inputs: InputSet, got: np.ndarray, want: np.ndarray) -> None:
    """Print the pass line, or raise with the diagnoses and the first mismatches."""
    bad = np.flatnonzero(got != want)
    total = got.size
    if not bad.size:
        groups = ", ".join(f"{k} {v}" for k, v in inputs.counts.items())
        print(f"{question} passed: {what} matches the hardware cast bit for bit on {total}/{total} inputs ({groups})")
        return
    lines = [f"{question}: {what} differs from the hardware cast on {bad.size} of {total} inputs"]
    lines += [f"  - {d}" for d in diagnose(inputs.bits, got, want)]
    lines.append("  first mismatches (input -> got, want):")
    for i in bad[:6]:
        lines.append(f"    {_h(inputs.bits[i], 8)} [{inputs.group[i]}] -> {_h(got[i])}, want {_h(want[i])}")
    raise AssertionError("\n".join(lines))


def check_round_bf16_bits(fn, inputs: InputSet | None = None, shape: tuple | None = None) -> None:
    """q1: ``fn(bits)`` rounds fp32 patterns (int64 tensor) to bf16 patterns like the hardware cast.

    ``inputs`` (default :func:`adversarial_fp32`) are passed as one tensor of ``shape`` (default 1-D)."""
    question, name = "q1", "round_bf16_bits"
    inputs = inputs if inputs is not None else adversarial_fp32()
    arg = torch.from_numpy(inputs.bits.astype(np.int64)).reshape(shape if shape is not None else -1)
    keep = arg.clone()
    out = call_student(fn, arg, name=name, question=question)
    if not torch.equal(arg, keep):
        raise AssertionError(
            f"{question}: {name} changed its argument in place (e.g. `bits += ...`); "
            f"compute into a new tensor and leave the input alone"
        )
    if not isinstance(out, torch.Tensor):
        raise AssertionError(
            f"{question}: wrong type: {name} returned {type_name(out)}, want a torch.Tensor of integers"
        )
    if out.shape != arg.shape:
        raise AssertionError(
            f"{question}: wrong shape: {name} returned shape {tuple(out.shape)}, "
            f"want {tuple(arg.shape)} (one bf16 pattern per input)"
        )
    if out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool:
        raise AssertionError(
            f"{question}: wrong dtype: {name} returned {out.dtype}, want an integer "
            f"tensor (torch.int64 like its input) holding bit patterns"
        )
    got = out.detach().cpu().to(torch.int64).numpy().reshape(-1)
    if out.dtype in (torch.int16, torch.uint16):
        got = got & 0xFFFF  # a 16-bit result is the pattern itself, negative or not
    want = _want_bits(inputs)
    _report(question, name, inputs, got, want)


def check_round_bf16(fn, inputs: InputSet | None = None, shape: tuple | None = None) -> None:
    """q2: ``fn(x)`` (fp32 tensor -> bf16 tensor, like ``fp32_to_bf16_rne``) matches the hardware cast.

    ``inputs`` (default :func:`adversarial_fp32`) are passed as one tensor of ``shape`` (default 1-D)."""
    question, name = "q2", "fp32_to_bf16 (your kernel's launcher)"
    inputs = inputs if inputs is not None else adversarial_fp32()
    device = default_device()
    x = inputs.fp32(device).reshape(shape if shape is not None else -1)
    keep = bits(x).copy()
    out = call_student(fn, x, name=name, question=question)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{question}: wrong type: returned {type_name(out)}, want a torch.Tensor")
    if out.dtype != torch.bfloat16 or out.shape != x.shape:
        raise AssertionError(
            f"{question}: wrong dtype/shape: returned {out.dtype} of shape {tuple(out.shape)}, "
            f"want torch.bfloat16 of shape {tuple(x.shape)}"
        )
    if not np.array_equal(bits(x), keep):
        raise AssertionError(f"{question}: the kernel wrote into its input x; store into y_ptr only")
    _report(question, "your kernel", inputs, bits(out).astype(np.int64).reshape(-1), _want_bits(inputs))


def check_same_as_package(fn) -> None:
    """``fn`` and ``kernels.bf16.fp32_to_bf16_rne`` agree bit for bit on the standard shapes and inputs of
    ``kernels.testing`` and on every upper half with low halves 0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF."""
    device = default_device()

    def ours(x):
        return call_student(fn, x, name="your converter", question="final check")

    cases = check_kernel(
        ours,
        bf16.fp32_to_bf16_rne,
        exact=True,
        shapes=STANDARD_SHAPES,
        seeds=(0,),
        device=device,
        name="your converter",
    )
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    sweep = (upper[:, None] | np.array([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)).ravel()
    x = torch.from_numpy(sweep.view(np.float32).copy()).to(device)
    got, want = bits(ours(x)), bits(bf16.fp32_to_bf16_rne(x))
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[0]
        raise AssertionError(
            f"final check: your converter and kernels.bf16.fp32_to_bf16_rne differ on {bad.size} "
            f"of {sweep.size} patterns (first: {_h(sweep[i], 8)} -> {_h(got[i])}, "
            f"package {_h(want[i])})"
        )
    print(f"same bits as kernels.bf16.fp32_to_bf16_rne: {cases} standard cases and {sweep.size} patterns")


__all__ = [
    "InputSet",
    "SPECIALS",
    "adversarial_fp32",
    "check_round_bf16",
    "check_round_bf16_bits",
    "check_same_as_package",
    "diagnose",
]
