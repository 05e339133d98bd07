"""Checks for Lab 1, number formats: decode, encode, tabulate, and tell OCP from FNUZ.

* q1 :func:`check_decode`: ``decode(bits, fmt)``, bit patterns (int64 codes) -> float values for any
  :class:`kernels.formats.Format`, on every code of ten formats (fp16 and bf16 to e2m1 and e8m0).
* q2 :func:`check_encode`: ``fn(x, fmt)`` (fp32 tensor, "e4m3fn" or "e5m2" -> float8 tensor), the
  student's integer-ops Triton encoder, bit for bit against the hardware conversion
  (``x.to(tl.float8e4nv)`` / ``x.to(tl.float8e5)``, saturating) on a fixed adversarial input set.
* q3 :func:`check_format_table`: ``fn(fmt)`` -> dict of max finite, min normal, min subnormal,
  epsilon, has_inf, has_nan, held against :func:`kernels.formats.properties`.
* q4 :func:`check_fnuz_vs_ocp`: ``fn(ocp, fnuz)`` -> (bytes whose meaning differs, those of them not
  explained by a factor of 2), for e4m3fn/e4m3fnuz and e5m2/e5m2fnuz.
* :func:`check_same_as_package`: the student's encoder and :func:`kernels.formats.encode` give the
  same bits on the standard shapes and on a sweep of fp32 patterns.

The truth is computed, never typed in: the hardware conversion for encoding, :mod:`kernels.formats`
(tested against ml_dtypes) for decoding.  Inputs are fixed, so pass lines print the same counts on
every machine.  On a mismatch a check names the mistakes whose fingerprints it finds: the output a
wrong recipe (truncation, ties away from zero, no saturation, a wrong bias, ...) would produce,
found where the student's output differs from the truth, with one input, what came back and what
was wanted.
"""

import math

import numpy as np
import torch

from kernels import formats
from kernels.checks import InputSet, call_student, constant_output, type_name
from kernels.device import default_device
from kernels.testing import STANDARD_SHAPES, bits, check_kernel

ABS = 0x7FFFFFFF
INF32 = 0x7F800000

# The formats q1 and q3 run on: every floating-point format of at most 16 bits.
SMALL_FORMATS = (
    formats.FP16,
    formats.BF16,
    formats.E4M3FN,
    formats.E5M2,
    formats.E4M3FNUZ,
    formats.E5M2FNUZ,
    formats.E2M1,
    formats.E3M2,
    formats.E2M3,
    formats.E8M0,
)
FP8 = ("e4m3fn", "e5m2")
FNUZ_PAIRS = ((formats.E4M3FN, formats.E4M3FNUZ), (formats.E5M2, formats.E5M2FNUZ))


def _h(v, width=2) -> str:
    return f"0x{int(v):0{width}X}"


def _v(x) -> str:
    return f"{float(x):.9g}"


# -- q1: the decoder --------------------------------------------------------------------------------


_POLICY_HINTS = {
    "ieee": "exponent all ones is inf (mantissa 0) or NaN (mantissa non-zero)",
    "fn": "there is no inf; only the all-ones magnitude ({nan}) is NaN",
    "fnuz": "there is no inf and no -0; the one NaN is 0x80, the pattern -0 would have",
    "none": "every code is a number: no inf, no NaN",
}


def _decode_findings(f: formats.Format, codes: np.ndarray, got: np.ndarray, want: np.ndarray) -> list:
    """The decoding mistakes whose fingerprints appear in ``got`` for format ``f``, as
    (smell, example, hint) triples; hints do not name the format, so that one bug found in several
    formats can be reported once."""
    m_bits, e_max = f.mantissa_bits, f.exponent_max_field
    sign = (codes >> (f.exponent_bits + m_bits)) & 1 if f.signed else np.zeros_like(codes)
    e = (codes >> m_bits) & e_max
    m = codes & ((1 << m_bits) - 1)
    frac = m / float(1 << m_bits)
    signed = np.where(sign == 1, -1.0, 1.0)
    with np.errstate(invalid="ignore"):
        same = (np.isnan(got) & np.isnan(want)) | ((got == want) & (np.signbit(got) == np.signbit(want)))
    open_ = ~same
    found = []
    width = max(1, (f.bits + 3) // 4)

    def example(idx) -> str:
        i = idx[0]
        return f"{f.name} {_h(codes[i], width)} -> {_v(got[i])}, want {_v(want[i])}"

    def matches(produced):
        with np.errstate(invalid="ignore"):
            return ((got == produced) & (np.signbit(got) == np.signbit(produced))) | (
                np.isnan(got) & np.isnan(produced)
            )

    def smell(region, produced, name, hint, share=0.0):
        """Name the smell if any of the ``produced`` arrays appears where it should not (and, with
        ``share``, the decoder reproduces at least that fraction of what the mistake changes)."""
        produced = produced if isinstance(produced, list) else [produced]
        match = np.zeros_like(open_)
        changed = np.zeros_like(open_)
        for p in produced:
            match |= matches(p)
            changed |= ~((np.isnan(p) & np.isnan(want)) | (p == want))
        hit = np.flatnonzero(open_ & region & match)
        if hit.size and hit.size >= share * np.count_nonzero(region & changed):
            found.append((name, example(hit), hint))
            open_[hit] = False

    finite = np.isfinite(want)
    nonzero_finite = finite & (want != 0)
    with np.errstate(over="ignore"):
        # A wrong bias scales every value, subnormals included; it comes first, and only if it
        # explains most of what it would change.
        for k in (1, -1, 2, -2):
            smell(
                nonzero_finite,
                want * 2.0**k,
                f"values {'twice' if k == 1 else 'half' if k == -1 else f'2^{k} times'} what they should be",
                "wrong exponent bias: value = 2^(e - bias) * (1 + m / 2^M) with the format's own bias "
                "(15 for fp16, 7 for e4m3fn, 8 for e4m3fnuz, ...)",
                share=0.5,
            )
        if f.has_subnormals:
            smell(
                finite & (e == 0),
                [signed * np.ldexp(1.0 + frac, 1 - f.bias), signed * np.ldexp(1.0 + frac, -f.bias)],
                "subnormals decoded with an implicit 1",
                "exponent field 0 means 2^(1 - bias) * m / 2^M, with no leading 1 (and code 0 is zero)",
            )
            smell(
                finite & (e == 0) & (m != 0),
                signed * 0.0,
                "subnormals decoded as zero",
                "exponent field 0 with a non-zero mantissa is a subnormal, 2^(1 - bias) * m / 2^M, not 0",
            )
            smell(
                finite & (e == 0),
                signed * np.ldexp(frac, -f.bias),
                "subnormals off by a factor of 2",
                "subnormals have the exponent of the smallest normal binade, 1 - bias, not -bias",
            )
        else:  # e8m0: no subnormals, no zero
            smell(
                e == 0,
                signed * frac,
                "code 0 decoded as a subnormal",
                "a format without subnormals has no zero: exponent field 0 is 2^-bias",
            )
    if f.signed:
        smell(sign == 1, -want, "sign bit ignored", "the top bit is the sign: negate the value when it is set")
    else:
        smell(
            codes >= 0x80,
            -np.ldexp(1.0 + frac, (e & 0x7F) - f.bias),
            "top bit read as a sign",
            "e8m0 has no sign bit: all 8 bits are the exponent, 2^(c - 127)",
        )
    nan_codes = [_h(c, width) for c in np.unique(codes[np.isnan(want)])]
    hint = f"in {f.name} " + _POLICY_HINTS[f.nan].format(nan=" and ".join(nan_codes))
    top = e == e_max
    hit = np.flatnonzero(open_ & finite & ~np.isfinite(got))
    if hit.size:
        where = "in the top binade" if top[hit].all() else "where there are numbers"
        found.append((f"NaN or inf {where}", example(hit), hint))
        open_[hit] = False
    hit = np.flatnonzero(open_ & np.isnan(want))
    if hit.size:
        found.append((f"a NaN code decoded as {_v(got[hit[0]])}", example(hit), hint))
        open_[hit] = False
    hit = np.flatnonzero(open_ & np.isinf(want))
    if hit.size:
        found.append(("inf decoded wrongly", example(hit), hint))
        open_[hit] = False
    hit = np.flatnonzero(open_ & (want == 0))
    if hit.size:
        found.append(("zero decoded wrongly", example(hit), "exponent 0 and mantissa 0 is +-0 (keep the sign: -0.0)"))
        open_[hit] = False
    rest = np.flatnonzero(open_)
    if rest.size:
        found.append(
            (f"{rest.size} other mismatches, none of them a known smell", example(rest), "compare with the formula")
        )
    return found


def _group(findings: list) -> list:
    """One line per (smell, hint): the formats it was found in, the first example."""
    groups = {}
    for name, example, hint in findings:
        groups.setdefault((name, hint), []).append(example)
    lines = []
    for (name, hint), examples in groups.items():
        fmts = [ex.split(" ", 1)[0] for ex in examples]
        where = f" in {', '.join(fmts)}" if len(fmts) > 1 else ""
        lines.append(f"{name}{where} ({examples[0]}): {hint}")
    return lines


def shuffled_codes(f: formats.Format, rng: np.random.Generator, shape: tuple) -> torch.Tensor:
    """Every code of ``f`` once in an order drawn from ``rng``, then as many again drawn with repeats,
    as an int64 tensor of ``shape`` (which may hold one -1)."""
    order = rng.permutation(f.codes)
    repeats = rng.integers(0, f.codes, size=f.codes)
    return torch.from_numpy(np.concatenate([order, repeats]).astype(np.int64)).reshape(shape)


def check_decode(fn, seed: int | None = None, shape: tuple = (2, -1), fmts: tuple = SMALL_FORMATS) -> None:
    """q1: ``fn(bits, fmt)`` decodes every code of every format in ``fmts`` (:data:`SMALL_FORMATS`) exactly.

    Each format's codes are passed as one 1-D tensor, all of them in increasing order; with ``seed``,
    as :func:`shuffled_codes` drawn from it, in a tensor of ``shape``."""
    question, name = "q1", "decode"
    rng = np.random.default_rng(seed) if seed is not None else None
    total, failures, findings = 0, [], []
    for f in fmts:
        codes = formats.all_codes(f) if rng is None else shuffled_codes(f, rng, shape)
        arg = codes.clone()
        out = call_student(fn, arg, f, name=name, question=question)
        if not torch.equal(arg, codes):
            raise AssertionError(f"{question}: {name} changed its argument bits in place; leave the input alone")
        if not isinstance(out, torch.Tensor):
            raise AssertionError(f"{question}: wrong type: {name} returned {type_name(out)}, want a torch.Tensor")
        if out.shape != codes.shape:
            raise AssertionError(
                f"{question}: wrong shape for {f.name}: {name} returned {tuple(out.shape)}, want {tuple(codes.shape)}"
            )
        if not out.dtype.is_floating_point:
            raise AssertionError(
                f"{question}: wrong dtype: {name} returned {out.dtype}, want torch.float32 (values, not bit patterns)"
            )
        got = out.detach().cpu().to(torch.float64).numpy().reshape(-1)
        want = formats.decode(codes, f).to(torch.float64).numpy().reshape(-1)
        c = codes.numpy().reshape(-1)
        with np.errstate(invalid="ignore"):
            bad = ~((np.isnan(got) & np.isnan(want)) | ((got == want) & (np.signbit(got) == np.signbit(want))))
        total += c.size
        if bad.any():
            failures.append(f"{f.name} {int(bad.sum())}/{c.size}")
            findings += _decode_findings(f, c, got, want)
    if not failures:
        what = f"all {total} codes" if rng is None else f"{total} codes (shuffled, repeated, shape {tuple(shape)})"
        print(
            f"{question} passed: {name} is exact on {what} of {len(fmts)} formats ({', '.join(f.name for f in fmts)})"
        )
        return
    lines = [f"{question}: {name} differs from the formats' definitions: {', '.join(failures)} codes wrong"]
    lines += [f"  - {d}" for d in _group(findings)]
    raise AssertionError("\n".join(lines))


# -- q2: the encoder ---------------------------------------------------------------------------------

# Hand-picked inputs, listed first so that each diagnosis quotes the textbook example of its smell:
# (value, what it demonstrates), then NaNs of other signs and payloads as fp32 patterns.
SPECIALS = (
    (1.0, "1.0, exact"),
    (1.0625, "e4m3 tie between 1 and 1.125: stays at 1 (even)"),
    (1.1875, "e4m3 tie between 1.125 and 1.25: up to 1.25 (even)"),
    (1.125, "e5m2 tie between 1 and 1.25: stays at 1 (even)"),
    (1.375, "e5m2 tie between 1.25 and 1.5: up to 1.5 (even)"),
    (1.1, "above an e4m3 half step: rounds up"),
    (-1.1875, "negative tie"),
    (-1.1, "negative, rounds up in magnitude"),
    (0.99, "rounds up across the binade into 1.0"),
    (3.0, "exact"),
    (480.0, "past e4m3fn's 448: saturates to 448"),
    (464.00003, "just past the e4m3fn tie at 464: saturates"),
    (1e4, "far past 448"),
    (-1e4, "far past -448"),
    (65536.0, "past e5m2's 57344: saturates"),
    (3e38, "near fp32's max"),
    (2.0**-9, "e4m3fn's smallest subnormal"),
    (0.75 * 2.0**-9, "rounds up to e4m3fn's smallest subnormal"),
    (3 * 2.0**-10, "e4m3 subnormal tie: up to 2^-8 (even)"),
    (0.9375 * 2.0**-6, "rounds up from e4m3's largest subnormal to its smallest normal"),
    (2.0**-6, "e4m3fn's smallest normal"),
    (0.01, "e4m3fn subnormal range"),
    (-0.01, "negative subnormal"),
    (2.0**-16, "e5m2's smallest subnormal"),
    (3e-5, "e5m2 subnormal range"),
    (2.0**-12, "below half of e4m3's smallest subnormal: 0"),
    (1e-40, "an fp32 subnormal"),
    (0.0, "+0"),
    (-0.0, "-0"),
    (math.inf, "inf: saturates to the largest finite value"),
    (-math.inf, "-inf: saturates to -max"),
    (math.nan, "NaN"),
)
SPECIAL_NAN_BITS = (0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFF800001)


def _grid(fmt: str) -> np.ndarray:
    """The non-negative finite values of an fp8 format, sorted, as float64."""
    v = formats.decode(formats.all_codes(fmt), fmt).to(torch.float64).numpy()
    return np.unique(np.abs(v[np.isfinite(v)]))


def adversarial_fp32() -> InputSet:
    """The fixed inputs of the encoder checks: hand-picked specials; every e4m3fn and e5m2 value;
    every tie between neighbours (and the one above the largest value); the fp32 neighbours of each
    tie; fp32 subnormals; overflow up to fp32's max; 4096 random bit patterns.  Both signs throughout."""
    picked = np.array([v for v, _ in SPECIALS], dtype=np.float32).view(np.uint32)
    special = np.concatenate([picked, np.array(SPECIAL_NAN_BITS, dtype=np.uint32)])
    grids = [_grid(f) for f in FP8]
    values = np.concatenate(grids).astype(np.float32)
    ties = []
    for g in grids:
        step_top = g[-1] - g[-2]
        ties.append(np.concatenate([(g[:-1] + g[1:]) / 2, [g[-1] + step_top / 2]]))
    ties = np.concatenate(ties).astype(np.float32)  # exact: fp8 midpoints have few significant bits
    neighbours = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(0))])
    rng = np.random.default_rng(1)
    sub = rng.integers(1, 1 << 23, 64, dtype=np.uint32)
    overflow = np.geomspace(400.0, 3.0e38, 128).astype(np.float32)
    random = rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)

    def both(a):
        u = a.view(np.uint32) if a.dtype == np.float32 else a
        return np.concatenate([u, u | np.uint32(0x80000000)])

    parts = {
        "special": special,
        "value": both(values),
        "tie": both(ties),
        "neighbour": both(neighbours),
        "fp32 subnormal": both(sub),
        "overflow": both(overflow),
        "random": random,
    }
    labels = np.concatenate([np.full(len(v), k) for k, v in parts.items()])
    return InputSet(np.concatenate(list(parts.values())), labels, {k: len(v) for k, v in parts.items()})


def fresh_encode_inputs(seed: int, n: int) -> InputSet:
    """``n`` fp32 patterns drawn from ``seed``, their groups mixed in a random order and labelled: a quarter
    uniform over all 2^32 patterns; three eighths of both signs with a random mantissa and an exponent
    from below e5m2's subnormals to past its largest value; three eighths a random fp8 tie (of either
    format, the one above the largest value included) moved by -64 to 64 fp32 steps, so that rounding
    is close."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.25, 0.375, 0.375])  # 0: random; 1: in range; 2: near a tie
    random = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    exponent = rng.integers(127 - 20, 127 + 17, size=n).astype(np.uint32)
    in_range = (exponent << 23) | rng.integers(0, 1 << 23, size=n).astype(np.uint32)
    ties = []
    for g in (_grid(f) for f in FP8):
        ties.append(np.concatenate([(g[:-1] + g[1:]) / 2, [g[-1] + (g[-1] - g[-2]) / 2]]))
    ties = np.concatenate(ties).astype(np.float32).view(np.uint32)
    picked = ties[rng.integers(0, ties.size, size=n)].astype(np.int64) + rng.integers(-64, 65, size=n)
    near = np.clip(picked, 0, ABS).astype(np.uint32)
    sign = rng.integers(0, 2, size=n).astype(np.uint32) << 31
    u = np.where(kind == 0, random, np.where(kind == 1, in_range, near) | sign)
    labels = np.array(["random", "in range", "near a tie"])[kind]
    counts = {g: int((labels == g).sum()) for g in ("random", "in range", "near a tie") if (labels == g).any()}
    return InputSet(u.astype(np.uint32), labels, counts)


def _rounding_fields(u: np.ndarray, fmt: str, bias_shift: int = 0, implicit_in_subnormals: bool = True) -> tuple:
    """Where an fp32 pattern's rounding happens in ``fmt``: (sign, magnitude, subnormal target?, kept
    bits, dropped bits, half of the dropped range), all int64 arrays."""
    spec = formats.ENCODE_SPECS[fmt]
    m, bias = spec.mantissa_bits, spec.bias + bias_shift
    u = u.astype(np.int64)
    sign, mag = (u >> 31) & 1, u & ABS
    exp32 = mag >> 23
    e = np.maximum(exp32, 1) - (127 - bias)
    subnormal = e < 1
    implicit = np.where(subnormal & (not implicit_in_subnormals), 0, 0x800000)
    sig = np.where(exp32 == 0, mag, (mag & 0x7FFFFF) | implicit)
    v = np.where(subnormal, sig, mag - ((127 - bias) << 23))
    shift = np.where(subnormal, np.minimum(24 - m - e, 40), 23 - m)
    return sign, mag, subnormal, v >> shift, v & ((1 << shift) - 1), 1 << (shift - 1)


def encode_variant(
    u: np.ndarray,
    fmt: str,
    *,
    rounding: str = "even",
    bias_shift: int = 0,
    flush: bool = False,
    implicit_in_subnormals: bool = True,
    carry: bool = True,
) -> np.ndarray:
    """fp32 patterns -> fp8 codes (int64) by the hardware's recipe, or by a wrong one.

    ``rounding``: "even" (nearest, ties to even), "trunc", "away" (ties away from zero), "down"
    (ties toward zero) or "up" (any dropped bit rounds up); ``bias_shift``: added to the bias;
    ``flush``: results below the smallest normal become 0; ``implicit_in_subnormals=False``: the
    implicit 1 is forgotten when denormalising; ``carry=False``: rounding up wraps inside the
    mantissa field instead of carrying into the exponent.  Saturation and NaN -> 0x7F as the hardware.
    """
    spec = formats.ENCODE_SPECS[fmt]
    m = spec.mantissa_bits
    sign, mag, subnormal, kept, rem, half = _rounding_fields(u, fmt, bias_shift, implicit_in_subnormals)
    up = {
        "even": (rem > half) | ((rem == half) & ((kept & 1) == 1)),
        "trunc": np.zeros_like(rem, dtype=bool),
        "away": rem >= half,
        "down": rem > half,
        "up": rem > 0,
    }[rounding]
    if carry:
        code = kept + up
    else:
        mmask = (1 << m) - 1
        code = (kept & ~mmask) | ((kept + up) & mmask)
    if flush:
        code = np.where(subnormal, 0, code)
    code = np.minimum(code, spec.max_code) | (sign << 7)
    return np.where(mag > INF32, spec.sat_nan, code)


def diagnose_encode(u: np.ndarray, got: np.ndarray, want: np.ndarray, fmt: str) -> list:
    """Name the wrong recipes whose fingerprints appear in ``got`` (int64 fp8 codes).

    A smell is a region of inputs plus the output a particular mistake produces there.  Once one is
    named, every mismatch that mistake explains is set aside, so one bug is reported once.
    """
    spec = formats.ENCODE_SPECS[fmt]
    constant = constant_output(got, want, _h)
    if constant:
        return [constant]
    u = u.astype(np.int64)
    mag = u & ABS
    nan, inf = mag > INF32, mag == INF32
    finite = ~(nan | inf)
    with np.errstate(invalid="ignore"):  # NaN inputs: their magnitude is not used
        x = np.abs(u.astype(np.uint32).view(np.float32).astype(np.float64))
    max_value = formats.properties(fmt).max_finite
    min_normal = formats.properties(fmt).min_normal
    overflow = finite & ((want & 0x7F) == spec.max_code) & (x > max_value)
    in_range = finite & ~overflow
    normal = in_range & (x >= min_normal)
    subnormal = in_range & (x < min_normal)
    _, _, _, kept, rem, half = _rounding_fields(u, fmt)
    above_half, below_half = rem > half, (rem > 0) & (rem < half)
    tie_even, tie_odd = (rem == half) & ((kept & 1) == 0), (rem == half) & ((kept & 1) == 1)
    trunc = encode_variant(u, fmt, rounding="trunc")
    open_ = got != want
    found = []

    def example(idx) -> str:
        i = idx[0]
        return f"{_v(u.astype(np.uint32).view(np.float32)[i])} ({_h(u[i], 8)}) -> {_h(got[i])}, want {_h(want[i])}"

    def smell(region, produced, name, hint, share=0.0):
        """Name the smell if ``produced`` appears where it should not, and the student reproduces at
        least ``share`` of the wrong recipe's own mistakes in the region; then set aside every finite
        mismatch that the same recipe reproduces."""
        hit = np.flatnonzero(open_ & region & (got == produced))
        if hit.size and hit.size >= share * np.count_nonzero(region & (produced != want)):
            found.append(f"{name} ({example(hit)}): {hint}")
            open_[hit] = False
            open_[finite & (got == produced)] = False

    for k in (1, -1):
        # A wrong bias moves every value, so it comes first, or its outputs would pass for other
        # smells here and there; named only if most of what it would change is changed that way.
        smell(
            normal,
            encode_variant(u, fmt, bias_shift=k),
            f"wrong exponent bias ({spec.bias + k} instead of {spec.bias})",
            f"{fmt}'s exponent field is the fp32 exponent - 127 + {spec.bias}",
            share=0.5,
        )
    smell(
        normal & above_half,
        trunc,
        "truncates instead of rounding",
        "the dropped bits must round: add just under half of their range plus the lowest kept bit, then shift",
    )
    smell(
        in_range & below_half,
        encode_variant(u, fmt, rounding="up"),
        "rounds up below the halfway point",
        "only more than half a step (or exactly half with an odd kept part) rounds up",
    )
    smell(
        in_range & tie_even,
        encode_variant(u, fmt, rounding="away"),
        "ties rounded away from zero",
        "an exact tie goes to the EVEN neighbour: the bias is (half - 1) + lsb, not half",
    )
    smell(
        in_range & tie_odd,
        encode_variant(u, fmt, rounding="down"),
        "ties always rounded down",
        "a tie with an odd kept part rounds up to the even neighbour: add the lowest kept bit to the bias",
    )
    # Flushing and a lost implicit 1 both give 0 for some subnormals: each is named only if it explains
    # most of the subnormal mismatches it could explain.
    smell(
        subnormal,
        encode_variant(u, fmt, implicit_in_subnormals=False),
        "the implicit 1 is lost in subnormals",
        "when denormalising, shift the full significand (mantissa | 1 << 23), not the mantissa alone",
        share=0.5,
    )
    smell(
        subnormal & ((trunc & 0x7F) != 0),
        encode_variant(u, fmt, flush=True),
        "subnormals flushed to zero",
        f"below {fmt}'s smallest normal ({_v(min_normal)}) the code is a subnormal: shift the significand, "
        f"implicit 1 included, right by 1 - e more bits and round there",
        share=0.5,
    )
    smell(
        in_range,
        encode_variant(u, fmt, carry=False),
        "rounding carry lost into the exponent",
        "when the kept mantissa bits are all ones, rounding up must carry into the exponent: round the "
        "rebiased pattern as a whole, not the mantissa field",
    )
    smell(
        ~nan & ((u >> 31) == 1),
        want & 0x7F,
        "sign bit lost on negative inputs",
        "round the magnitude and put the sign back in bit 7",
    )

    def region_smell(region, name, explain):
        hit = np.flatnonzero(open_ & region)
        if hit.size:
            found.append(f"{name} ({example(hit)}): {explain(got[hit[0]])}")
            open_[hit] = False

    fp8_nan = np.array([0x7F, 0xFF]) if fmt == "e4m3fn" else np.array([0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF])

    def overflow_hint(g):
        if g in fp8_nan:
            what = "NaN"
        elif fmt == "e5m2" and g & 0x7F == 0x7C:
            what = "inf"
        else:
            what = "another number: the exponent ran past its field into the sign bit or beyond"
        return (
            f"it became {what}; values past {_v(max_value)} must clip to +-{_v(max_value)} "
            f"({_h(spec.max_code)}), as Hopper's saturating conversion does"
        )

    region_smell(overflow, "no saturation", overflow_hint)
    region_smell(
        inf,
        "inf not saturated",
        lambda g: (
            f"{'it became NaN' if g in fp8_nan else 'it became ' + _h(g)}; the hardware conversion "
            f"turns +-inf into +-{_v(max_value)} like any other overflow"
        ),
    )

    def nan_hint(g):
        if g == 0xFF or (g & 0x80 and g in fp8_nan):
            what = "kept its sign"
        elif g & 0x7F == spec.max_code:
            what = "was clipped to +-max: it was rounded and saturated like a number"
        elif g in fp8_nan:
            what = "is a NaN, but not the hardware's"
        else:
            what = "became a number"
        return f"it {what}; every NaN must become {_h(spec.sat_nan)} (decide on the input: magnitude > 0x7F800000)"

    region_smell(nan, "NaN mishandled", nan_hint)
    region_smell(
        finite & np.isin(got, fp8_nan),
        "numbers became NaN",
        lambda g: "test for NaN on the fp32 input, not on the rounded code",
    )
    rest = np.flatnonzero(open_)
    if rest.size:
        found.append(f"{rest.size} other mismatches, none of them a known smell (first: {example(rest)})")
    return found


def _want_codes(inputs: InputSet, fmt: str) -> np.ndarray:
    return bits(formats.hardware_encode(inputs.fp32(default_device()), fmt)).astype(np.int64)


def check_encode(fn, inputs: InputSet | None = None, shape: tuple | None = None) -> None:
    """q2: ``fn(x, fmt)`` (fp32 tensor -> float8 tensor, fmt "e4m3fn" or "e5m2") matches the hardware
    conversion bit for bit.

    ``inputs`` (default :func:`adversarial_fp32`) are passed as one tensor of ``shape`` (default 1-D)."""
    question, name = "q2", "fp32_to_fp8 (your kernel's launcher)"
    inputs = inputs if inputs is not None else adversarial_fp32()
    x = inputs.fp32(default_device()).reshape(shape if shape is not None else -1)
    keep = bits(x).copy()
    lines, total = [], inputs.bits.size
    for fmt in FP8:
        out = call_student(fn, x, fmt, name=name, question=question)
        dtype = formats.TORCH_DTYPES[fmt]
        if not isinstance(out, torch.Tensor):
            raise AssertionError(f"{question}: wrong type: returned {type_name(out)}, want a torch.Tensor")
        if out.dtype != dtype or out.shape != x.shape:
            raise AssertionError(
                f"{question}: wrong dtype/shape for {fmt}: returned {out.dtype} of shape {tuple(out.shape)}, "
                f"want {dtype} of shape {tuple(x.shape)}"
            )
        if not np.array_equal(bits(x), keep):
            raise AssertionError(f"{question}: the kernel wrote into its input x; store into y_ptr only")
        got, want = bits(out).astype(np.int64).reshape(-1), _want_codes(inputs, fmt)
        bad = np.flatnonzero(got != want)
        if not bad.size:
            continue
        lines.append(
            f"{question}: your kernel differs from the hardware conversion to {fmt} on {bad.size} of {total} inputs"
        )
        lines += [f"  - {d}" for d in diagnose_encode(inputs.bits, got, want, fmt)]
        lines.append("  first mismatches (input -> got, want):")
        for i in bad[:6]:
            value = _v(inputs.bits[i : i + 1].view(np.float32)[0])
            lines.append(
                f"    {value} ({_h(inputs.bits[i], 8)}) [{inputs.group[i]}] -> {_h(got[i])}, want {_h(want[i])}"
            )
        break  # e5m2 is checked once e4m3fn is right: one format's diagnosis at a time
    if lines:
        raise AssertionError("\n".join(lines))
    groups = ", ".join(f"{k} {v}" for k, v in inputs.counts.items())
    print(
        f"{question} passed: your kernel matches the hardware conversion bit for bit on {total}/{total} inputs "
        f"for e4m3fn and for e5m2 ({groups})"
    )


# -- q3: the format table ----------------------------------------------------------------------------

TABLE_KEYS = ("max_finite", "min_normal", "min_subnormal", "epsilon", "has_inf", "has_nan")

_TABLE_HINTS = {
    "max_finite": "the largest FINITE value: leave inf and NaN out before taking the max",
    "min_normal": "the smallest positive value whose exponent field is not 0 (exponent 1, mantissa 0), "
    "or for a format without subnormals the smallest positive value",
    "min_subnormal": "the smallest positive value (exponent field 0, mantissa 1); None if the format has no subnormals",
    "epsilon": "the gap between 1.0 and the next larger value, 2^-mantissa_bits",
    "has_inf": "does any code decode to +-inf?",
    "has_nan": "does any code decode to NaN?",
}


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(b, bool):
        return isinstance(a, bool | np.bool_) and bool(a) == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def check_format_table(fn, fmts: tuple = SMALL_FORMATS) -> None:
    """q3: ``fn(fmt)`` returns a dict with :data:`TABLE_KEYS` equal to :func:`kernels.formats.properties`,
    for every format of ``fmts`` (formats of at most 16 bits)."""
    question, name = "q3", "format_properties"
    problems, truths = [], {f.name: formats.properties(f) for f in fmts}
    for f in fmts:
        row = call_student(fn, f, name=name, question=question)
        if not isinstance(row, dict):
            raise AssertionError(f"{question}: wrong type: {name} returned {type_name(row)}, want a dict")
        missing = [k for k in TABLE_KEYS if k not in row]
        if missing:
            raise AssertionError(f"{question}: {name}({f.name}) returned a dict without {missing}")
        truth = truths[f.name]
        for key in TABLE_KEYS:
            got, want = row[key], getattr(truth, key)
            if isinstance(got, torch.Tensor):
                got = got.item()
            if not _same(got, want):
                problems.append((f.name, key, got, want))
    if not problems:
        shown = "" if fmts is SMALL_FORMATS else f" ({', '.join(f.name for f in fmts)})"
        print(
            f"{question} passed: {name} matches kernels.formats.properties on {len(fmts)} formats{shown} "
            f"x {len(TABLE_KEYS)} properties"
        )
        return
    lines = [f"{question}: {name} is wrong in {len(problems)} of {len(fmts) * len(TABLE_KEYS)} entries"]
    for key in TABLE_KEYS:
        wrong = [p for p in problems if p[1] == key]
        if not wrong:
            continue
        shown = ", ".join(f"{fmt} {got!r} (want {want!r})" for fmt, _, got, want in wrong[:3])
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        hint = _TABLE_HINTS[key]
        got0, want0 = wrong[0][2], wrong[0][3]
        if key == "max_finite" and isinstance(got0, float) and not math.isfinite(got0):
            hint = "inf or NaN got into the max: " + hint
        elif key == "min_normal" and any(p[2] == truths[p[0]].min_subnormal for p in wrong):
            hint = "that is a subnormal; " + hint
        elif key == "epsilon" and isinstance(got0, float) and want0 and got0 == 2 * want0:
            hint = "twice too large; " + hint
        lines.append(f"  - {key}: {shown}{more}: {hint}")
    raise AssertionError("\n".join(lines))


# -- q4: OCP vs FNUZ ---------------------------------------------------------------------------------


def fnuz_vs_ocp_reference(ocp: formats.Format, fnuz: formats.Format) -> tuple:
    """(bytes whose value differs between the two readings, those among them where the FNUZ value is
    not the OCP value halved), each a sorted list of ints.  NaN equals NaN; -0 differs from NaN."""
    codes = formats.all_codes(ocp)
    a = formats.decode(codes, ocp).double()
    b = formats.decode(codes, fnuz).double()
    same = (torch.isnan(a) & torch.isnan(b)) | ((a == b) & (torch.signbit(a) == torch.signbit(b)))
    halved = b == a / 2
    differ = torch.nonzero(~same).ravel().tolist()
    return differ, [c for c in differ if not halved[c]]


def _as_byte_list(value, what: str, question: str) -> list:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().ravel().tolist()
    try:
        out = sorted({int(v) for v in value})
    except (TypeError, ValueError) as e:
        raise AssertionError(f"{question}: {what} must be a list (or tensor) of byte values 0..255") from e
    if out and (out[0] < 0 or out[-1] > 255):
        raise AssertionError(f"{question}: {what} holds values outside 0..255: {out[0]}..{out[-1]}")
    return out


def _byte_ranges(codes) -> str:
    """[0x7C, 0x7D, 0x7E, 0x7F, 0x80] -> '0x7C..0x7F, 0x80'."""
    parts, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        parts.append(_h(codes[i]) if i == j else f"{_h(codes[i])}..{_h(codes[j])}")
        i = j + 1
    return ", ".join(parts)


def check_fnuz_vs_ocp(fn, pairs: tuple = FNUZ_PAIRS) -> None:
    """q4: ``fn(ocp, fnuz)`` -> (differing bytes, differing bytes not explained by a factor of 2), for
    every pair of 8-bit formats with the same fields in ``pairs``."""
    question, name = "q4", "fnuz_vs_ocp"
    summary, problems = [], []
    for ocp, fnuz in pairs:
        out = call_student(fn, ocp, fnuz, name=name, question=question)
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise AssertionError(f"{question}: {name} must return two lists (differ, not_halved), got {type_name(out)}")
        differ = _as_byte_list(out[0], "differ", question)
        not_halved = _as_byte_list(out[1], "not_halved", question)
        want_differ, want_not_halved = fnuz_vs_ocp_reference(ocp, fnuz)
        pair = f"{ocp.name} vs {fnuz.name}"
        for what, got, want in (("differ", differ, want_differ), ("not_halved", not_halved, want_not_halved)):
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            if not (missing or extra):
                continue
            msg = f"{pair}, {what}:"
            if missing:
                msg += f" missing {_byte_ranges(missing)}"
            if extra:
                msg += f"{';' if missing else ''} not expected {_byte_ranges(extra)}"
            if what == "differ" and len(missing) > 200:
                msg += " (compare the decoded values, not the codes: almost every byte means something else)"
            elif 0x80 in missing:
                msg += " (0x80 is -0 in OCP but NaN in FNUZ: a comparison that treats -0 and NaN alike misses it)"
            elif 0x00 in extra:
                msg += " (0x00 is +0 in both)"
            elif what == "not_halved" and extra:
                msg += " (halved means fnuz == ocp / 2; NaN, inf and -0 are where that fails)"
            problems.append(msg)
        which = f" ({_byte_ranges(want_not_halved)})" if want_not_halved else ""
        summary.append(
            f"{pair} differ on {len(want_differ)} of 256 bytes, {len(want_not_halved)} of them not by a factor of 2"
            + which
        )
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: " + "; ".join(summary))


# -- the final comparison with the package -------------------------------------------------------------


def check_same_as_package(fn) -> None:
    """``fn(x, fmt)`` and :func:`kernels.formats.encode` agree bit for bit for e4m3fn and e5m2 on the
    standard shapes and inputs of ``kernels.testing`` and on every fp32 upper half with the low half
    0x0000 or 0xFFFF."""
    device = default_device()
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    sweep = (upper[:, None] | np.array([0x0000, 0xFFFF], dtype=np.uint32)).ravel()
    x = torch.from_numpy(sweep.view(np.float32).copy()).to(device)
    cases = 0
    for fmt in FP8:

        def ours(t, fmt=fmt):
            return call_student(fn, t, fmt, name="your encoder", question="final check")

        def package(t, fmt=fmt):
            return formats.encode(t, fmt, saturate=True)

        cases += check_kernel(
            ours, package, exact=True, shapes=STANDARD_SHAPES, seeds=(0,), device=device, name=f"your encoder ({fmt})"
        )
        got, want = bits(ours(x)), bits(package(x))
        bad = np.flatnonzero(got != want)
        if bad.size:
            i = bad[0]
            raise AssertionError(
                f"final check: your encoder and kernels.formats.encode differ for {fmt} on {bad.size} of "
                f"{sweep.size} patterns (first: {_h(sweep[i], 8)} -> {_h(got[i])}, package {_h(want[i])})"
            )
    print(
        f"same bits as kernels.formats.encode for e4m3fn and e5m2: {cases} standard cases and "
        f"{len(FP8)} x {sweep.size} patterns"
    )


__all__ = [
    "FNUZ_PAIRS",
    "InputSet",
    "SMALL_FORMATS",
    "SPECIALS",
    "TABLE_KEYS",
    "adversarial_fp32",
    "check_decode",
    "check_encode",
    "check_fnuz_vs_ocp",
    "check_format_table",
    "check_same_as_package",
    "diagnose_encode",
    "encode_variant",
    "fnuz_vs_ocp_reference",
    "fresh_encode_inputs",
    "shuffled_codes",
]
