"""Checks for Lab 7 (inference in low precision): q1 the INT8 quantizer, q2 the W8A8 GEMM, q3 SmoothQuant,
q4 the FlashAttention-style forward in bf16, q5 the same attention with Q, K and V in FP8.

* q1 :func:`check_quantize`, q2 :func:`check_w8a8` and q3 :func:`check_smooth_quant` run the student's
  function on fixed, device-independent inputs and compare with :mod:`kernels.int8`: codes and scales bit
  for bit, the GEMM within a bound derived from its roundings against the float64 value of the
  dequantized product, the smoothed pair within fp32 rounding.
* q4 :func:`check_flash_attention`: ``fn(q, k, v, causal)`` -> bf16 ``(B, H, N_q, D)``, against float64
  attention (:func:`kernels.attention.attention_reference`) within the bf16 attention tolerance, on no
  mask, both causal alignments, a block of queries that sees no key, scores up to 100 and a long row of
  nearly equal scores.
* q5 :func:`check_flash_attention_fp8`: ``fn(q, k, v, causal, hadamard)`` -> bf16, within the FP8
  attention tolerance of float64 on inputs where one scale for the whole tensor, or P cast to E4M3
  unscaled, visibly fails; on inputs with outlier channels in Q and K, ``hadamard=True`` must lower the
  error, and on every input the error must stay near the package's
  (:func:`kernels.attention.flash_attention_fp8`, run by the check on the same inputs).

On failure a check says which numerical mistake the output looks like.  For q1-q3: S = amax / 128,
truncation, ties away from zero, no saturation, -128, an all-zero row divided by zero, one scale for the
tensor, an approximate division, a scale left out or divided, an int16 accumulator, a dropped K tail,
alpha and 1 - alpha swapped, the migration reversed.  For q4 and q5 the output is compared with what each
known mistake computes (attention in float64 with that mistake made: the scale left out, a bf16 Q scaled
before the product, the running maximum's correction missing, masked scores set to 0, the mask reversed,
an FP8 block scale dropped, P unscaled), and the one that fits is named, input by input, so that a kernel
with two mistakes hears of both.  The hidden tests run the same checks on inputs drawn by the ``fresh_*``
functions below, from a seed and at sizes that only they state.

The references run on the host, where torch's fp32 division is correctly rounded (on a GPU, torch
divides by a Python number through its reciprocal), so the expected bits are the same in both lanes.
"""

import math
from typing import NamedTuple

import numpy as np
import torch

from kernels import _hopper_math, attention, int8
from kernels.checks import call_student, constant_output, type_name
from kernels.device import default_device
from kernels.testing import first_mismatches, frobenius_error

QMAX = int8.QMAX
F32 = np.float32


def _fail(question: str, name: str, where: str, problems: list) -> AssertionError:
    return AssertionError(f"{question}: {name} is wrong on {where}\n" + "\n".join(f"  - {p}" for p in problems))


# -- q1: the quantizer: fixed and fresh inputs ------------------------------------------------------------


def _random_rows(g, rows: int, k: int) -> torch.Tensor:
    """Rows of N(0, 1) values, each row under its own magnitude, 10^-3 .. 10^3."""
    return torch.randn(rows, k, generator=g) * 10.0 ** (torch.rand(rows, 1, generator=g) * 6 - 3)


def _tie_rows(g, rows: int, k: int) -> torch.Tensor:
    """Rows whose amax is 127 * 2^p, so that S = 2^p exactly and every element (j + 1/2) * 2^p is an exact
    tie of x / S: small and large ones of both signs, then random ones."""
    half = torch.randint(-127, 127, (rows, k), generator=g).float() + 0.5  # -126.5 .. 126.5
    fixed = torch.tensor([0.5, 1.5, 2.5, 3.5, 125.5, 126.5])
    fixed = torch.cat([fixed, -fixed])[:k]
    half[:, : len(fixed)] = fixed
    sign = torch.where(torch.rand(rows, generator=g) < 0.5, -1.0, 1.0)
    half[torch.arange(rows), torch.randint(0, k, (rows,), generator=g)] = QMAX * sign
    return half * 2.0 ** torch.randint(-20, 21, (rows, 1), generator=g).float()


def _awkward_amax(g, rows: int) -> torch.Tensor:
    """(rows, 1) amax values, 10^-3 .. 10^3, whose S = amax / 127 an approximate division gets wrong: both
    compiled Triton's fp32 `/` and amax * fl(1/127) land an ulp off the correctly rounded quotient (about
    one value in ten does; each row takes the first of 64 candidates that does)."""
    cands = (10.0 ** (torch.rand(rows, 64, generator=g) * 6 - 3)).float()
    c = cands.numpy()
    right = c / F32(QMAX)
    off = (_hopper_math.div(c, F32(QMAX)) != right) & ((c * (F32(1.0) / F32(QMAX))).astype(F32) != right)
    pick = np.where(off.any(axis=1), off.argmax(axis=1), 0)
    return cands[torch.arange(rows), torch.from_numpy(pick)].reshape(rows, 1)


def _near_tie_rows(g, rows: int, k: int) -> torch.Tensor:
    """Rows whose S = amax / 127 is no power of two, nor what an approximate division makes of it, with
    elements fl((j + 1/2) * S): x / S is a tie or within an ulp of one, where a division that is not
    correctly rounded picks the other integer."""
    amax = _awkward_amax(g, rows)
    s = amax / torch.full_like(amax, float(QMAX))  # the reference's S, correctly rounded
    x = (torch.randint(-127, 127, (rows, k), generator=g).float() + 0.5) * s  # |x| < amax
    sign = torch.where(torch.rand(rows, generator=g) < 0.5, -1.0, 1.0)
    x[torch.arange(rows), torch.randint(0, k, (rows,), generator=g)] = amax[:, 0] * sign
    return x


def _special_rows(g, rows: int, k: int) -> torch.Tensor:
    """Rows of eight kinds, in an order the draw picks: all zero; all -0.0; half -0.0; one outlier of
    1e4 among N(0, 1); all equal; tiny (1e-30); huge (1e30); one non-zero element among zeros."""
    x = torch.randn(rows, k, generator=g)
    for r, kind in enumerate((torch.randperm(rows, generator=g) % 8).tolist()):
        col = int(torch.randint(0, k, (1,), generator=g))
        if kind == 0:
            x[r] = 0.0
        elif kind == 1:
            x[r] = -0.0
        elif kind == 2:
            x[r, torch.rand(k, generator=g) < 0.5] = -0.0
        elif kind == 3:
            x[r, col] = 1e4
        elif kind == 4:
            x[r] = -0.75
        elif kind == 5:
            x[r] *= 1e-30
        elif kind == 6:
            x[r] *= 1e30
        else:
            x[r] = 0.0
            x[r, col] = -3.0
    return x


def _activation_rows(g, rows: int, k: int) -> torch.Tensor:
    """bf16 activations with three outlier channels (x30), the inputs SmoothQuant is about."""
    x = torch.randn(rows, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:3]] *= 30.0
    return x.to(torch.bfloat16)


def quantizer_inputs() -> dict:
    """Named matrices ``(rows, K)`` (fp32 but the last, bf16), each exercising one part of the recipe:
    rows over six decades, exact ties, near ties under a scale that is no power of two, zero rows and
    negative zeros and an outlier, bf16 activations; K = 100 (a partial tile) or 64."""
    g = torch.Generator().manual_seed(7)
    return {
        "random rows over six decades": _random_rows(g, 12, 100),
        "exact ties under powers of two": _tie_rows(g, 6, 100),
        "near ties, S no power of two": _near_tie_rows(g, 6, 100),
        "zero rows, negative zeros, an outlier": _special_rows(g, 8, 100),
        "bf16 activations with outlier channels": _activation_rows(g, 16, 64),
    }


def fresh_quantizer_inputs(seed: int, rows: int = 37, k: int = 300) -> dict:
    """The groups of :func:`quantizer_inputs`, drawn from ``seed`` at another size ``(rows, k)``
    (``rows >= 8`` so that every special kind appears, ``k >= 12``)."""
    if rows < 8 or k < 12:
        raise ValueError(f"want rows >= 8 and k >= 12, got {rows} x {k}")
    g = torch.Generator().manual_seed(seed)
    return {
        "random rows": _random_rows(g, rows, k),
        "exact ties": _tie_rows(g, rows, k),
        "near ties": _near_tie_rows(g, rows, k),
        "zeros and outliers": _special_rows(g, rows, k),
        "bf16 activations": _activation_rows(g, rows, k),
    }


def static_scale(x: torch.Tensor) -> torch.Tensor:
    """The calibrated scale (a 0-d fp32 tensor) of the static case for ``x``: the reference S of its
    median row among those not all zero, so that the rows above the median saturate."""
    xf = x.detach().cpu().float()
    amax = xf.abs().amax(dim=1)
    _, s = int8.quantize_int8_reference(xf, "token")
    rows = torch.nonzero(amax > 0).reshape(-1)
    if rows.numel() == 0:
        return torch.tensor(1.0)
    median = rows[torch.argsort(amax[rows])[(rows.numel() - 1) // 2]]
    return s[median, 0].clone()


# -- q1: diagnosis -----------------------------------------------------------------------------------------

_DIVISIONS = {
    "correct": "",
    "slash": "Triton's fp32 x / S",
    "reciprocal": "x * (1 / S)",
    "approximate reciprocal": "x * (1.0 / S) with Triton's `/`",
}
_ROUNDINGS = {
    "nearest even": (np.rint, ""),
    "toward zero": (
        np.trunc,
        "rounded toward zero: {n} codes are trunc(x / S) instead of the nearest integer (2.7 -> 2, want 3); a "
        "float-to-int conversion truncates, so round to nearest first (ties to even: adding and subtracting "
        "1.5 * 2^23 in fp32 does it for |y| < 2^22)",
    ),
    "half up": (
        lambda y: np.floor(y + 0.5),
        "ties rounded up: {n} codes take x / S = k + 1/2 to k + 1, as floor(y + 0.5) does (-2.5 -> -2 but "
        "2.5 -> 3); a tie goes to the even integer (2.5 -> 2, 3.5 -> 4, -2.5 -> -2)",
    ),
    "half away": (
        lambda y: np.sign(y) * np.floor(np.abs(y) + 0.5),
        "ties rounded away from zero: {n} codes take x / S = k + 1/2 away from 0 (2.5 -> 3, -2.5 -> -3), as "
        "C's roundf or sign(y) * floor(|y| + 0.5) do; a tie goes to the even integer (2.5 -> 2, 3.5 -> 4)",
    ),
}


def _divisions(x32: np.ndarray, s32: np.ndarray) -> dict:
    """x / S (fp32) as kernels compute it: correctly rounded, and the approximate ways."""
    x32, s32 = np.broadcast_arrays(x32, s32)
    with np.errstate(all="ignore"):
        return {
            "correct": (x32 / s32).astype(F32),
            "slash": _hopper_math.div(x32, s32),
            "reciprocal": (x32 * (F32(1.0) / s32)).astype(F32),
            "approximate reciprocal": (x32 * _hopper_math.div(np.ones_like(s32), s32)).astype(F32),
        }


def _code_smells(x: torch.Tensor, got: np.ndarray, want: np.ndarray, s: torch.Tensor) -> list:
    """What is wrong with codes ``got`` (int64) of ``x`` under the right scales ``s``; [] if nothing."""
    bad = got != want
    if not bad.any():
        return []
    smell = constant_output(got.ravel(), want.ravel(), show=int)
    if smell:
        return [f"the codes: {smell}"]
    x32 = x.float().numpy()
    divs = _divisions(x32, s.float().numpy())
    inside = np.abs(divs["correct"]) < QMAX + 0.5  # where the clamp does not decide the code
    found = []
    match = None  # (the divisions that give these codes, the rounding)
    for rname, (rounding, _) in _ROUNDINGS.items():
        with np.errstate(all="ignore"):
            hits = [
                dname
                for dname, d in divs.items()
                if np.array_equal(got[inside], rounding(np.clip(d.astype(np.float64), -QMAX, QMAX))[inside])
            ]
        if hits:
            match = hits, rname
            break
    n_in = int((bad & inside).sum())
    if match is None and n_in:
        idx = np.flatnonzero((bad & inside).ravel())
        return [first_mismatches(x32, got, want, idx, what="codes")]
    if match is not None and match[1] != "nearest even":
        found.append(_ROUNDINGS[match[1]][1].format(n=n_in))
    if match is not None and "correct" not in match[0]:
        found.append(
            f"the codes' division x / S is not correctly rounded: {n_in} codes are one off where x / S is within "
            f"an ulp of k + 1/2, as {' or '.join(_DIVISIONS[d] for d in match[0])} gives; use tl.math.div_rn(x, S) "
            "(Triton's `/` multiplies x by an approximate 1 / S, on the GPU and in CPU mode alike)"
        )
    out_bad = bad & ~inside
    if out_bad.any():
        if bool((got[out_bad] == -128).all()) and bool((want[out_bad] == -QMAX).all()):
            found.append(
                f"-128 produced: {int(out_bad.sum())} codes below -127.5 * S became -128; clamp to [-127, 127], "
                "the symmetric range (-128 has no positive partner, and negating it overflows)"
            )
        else:
            i = int(np.flatnonzero(out_bad.ravel())[0])
            found.append(
                f"no saturation: {int(out_bad.sum())} values beyond 127.5 * S did not become +-127 (x = "
                f"{x32.flat[i]:.6g} gave {int(got.flat[i])}, want {int(want.flat[i])}); clamp x / S to "
                "[-127, 127] before the conversion, which wraps or is undefined out of range"
            )
    return found or [first_mismatches(x32, got, want, np.flatnonzero(bad.ravel()), what="codes")]


def _scale_smells(x: torch.Tensor, s_got: np.ndarray, s_want: np.ndarray) -> list:
    """What is wrong with per-row scales ``s_got`` (fp32, (rows,)) against ``s_want``; [] if nothing."""
    if np.array_equal(s_got.view(np.uint32), s_want.view(np.uint32)):
        return []
    xf = x.float()
    amax = xf.abs().amax(dim=1).numpy().astype(F32)
    zero = amax == 0
    pos = ~zero
    if zero.any() and not bool((s_got[zero] == 1).all()):
        v = float(s_got[zero][s_got[zero] != 1][0])
        if v == 0 or not np.isfinite(v):
            return [
                f"an all-zero row divides by zero: its S came back as {v:g} (amax / 127 = 0, then 0 / 0 is NaN); "
                "give a row whose amax is 0 the scale S = 1 (every code 0)"
            ]
        return [f"an all-zero row must get S = 1 (every code 0), got {v:.9g}"]
    tensor_s = float(np.float32(xf.abs().max().item()) / np.float32(QMAX))
    if np.unique(s_want[pos]).size > 1 and np.unique(s_got).size == 1:
        v = float(s_got[0])
        how = " = amax(x) / 127" if np.isclose(v, tensor_s, rtol=1e-6) else ""
        return [
            f"one scale for the whole tensor: every S is {v:.6g}{how}; each row needs its own, amax_row / 127 "
            "(per token for activations, per output channel for a weight)"
        ]
    with np.errstate(all="ignore"):
        ratio = amax[pos].astype(np.float64) / s_got[pos].astype(np.float64)
        product = s_got[pos].astype(np.float64) * s_want[pos].astype(np.float64)
    for d in (128.0, 255.0, 256.0, 127.5, 254.0):
        if np.allclose(ratio, d, rtol=1e-5):
            return [
                f"S = amax / {d:g}: symmetric INT8 codes reach 127 (and -127; -128 is left out), so S = amax / 127 "
                "and the row's largest element becomes exactly +-127"
            ]
    if pos.any() and np.allclose(product, 1.0, rtol=1e-5) and not np.allclose(s_want[pos], 1.0):
        return ["S and 1/S swapped: S came back as 127 / amax; the reconstruction scale is S = amax / 127, x ~= S * q"]
    bad = (s_got.view(np.uint32) != s_want.view(np.uint32)) & pos
    slash = _hopper_math.div(amax, F32(QMAX))
    times = (amax * (F32(1.0) / F32(QMAX))).astype(F32)
    for approx, how in ((slash, "Triton's fp32 `/`"), (times, "amax * (1 / 127)")):
        if bad.any() and np.array_equal(s_got[bad], approx[bad]):
            return [
                f"the scale is not correctly rounded: {int(bad.sum())} of {int(pos.sum())} scales are those of "
                f"{how}, an ulp off amax / 127; in a kernel compute S with tl.math.div_rn(amax, 127.0) (`/` "
                "multiplies by an approximate reciprocal on the GPU, and in CPU mode); in torch on a GPU divide by "
                "torch.full_like(amax, 127.0) (a division by a Python number multiplies by its reciprocal there)"
            ]
    idx = np.flatnonzero(s_got.view(np.uint32) != s_want.view(np.uint32))
    return [first_mismatches(amax, s_got, s_want, idx, what="scales (input: the row's amax)")]


def _unpack_codes(out, x: torch.Tensor, want_q: torch.Tensor, question: str, name: str) -> tuple:
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise AssertionError(f"{question}: {name} must return (q, s), a pair; got {type_name(out)}")
    q, s = out
    for what, t in (("q", q), ("s", s)):
        if not isinstance(t, torch.Tensor):
            raise AssertionError(f"{question}: {name} returned {what} of type {type_name(t)}, want a torch.Tensor")
    q, s = q.detach().cpu(), s.detach().cpu()
    if q.dtype != torch.int8:
        same = q.shape == want_q.shape and not q.dtype.is_complex and torch.equal(q.double(), want_q.double())
        hint = " (its values are the right codes)" if same else ""
        raise AssertionError(
            f"{question}: {name}: codes not int8: q has dtype {q.dtype}{hint}; INT8 codes are torch.int8 (allocate "
            "q with dtype=torch.int8, store .to(tl.int8))"
        )
    if tuple(q.shape) != tuple(x.shape):
        raise AssertionError(f"{question}: {name}: q has shape {tuple(q.shape)}, want x's {tuple(x.shape)}")
    if s.dtype != torch.float32:
        raise AssertionError(f"{question}: {name}: s must be float32 (the scales are fp32), got {s.dtype}")
    return q, s


def diagnose_quantizer(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, given: torch.Tensor | None = None) -> list:
    """What is wrong with the codes ``q`` and scales ``s`` of ``x`` (host tensors; ``given``: the static
    scale, or None for one scale per row), most basic first; [] if they are right."""
    rows = x.shape[0]
    want_q, want_s = int8.quantize_int8_reference(x, "token" if given is None else "tensor", s=given)
    got, want = q.numpy().astype(np.int64), want_q.numpy().astype(np.int64)
    if given is not None:
        if s.numel() != 1 or s.reshape(()).item() != given.item():
            return [
                f"with a static scale, return it as given: (q, s) with s = {given.item():.9g}, got s of shape "
                f"{tuple(s.shape)}" + (f" = {s.reshape(()).item():.9g}" if s.numel() == 1 else "")
            ]
        own_q, _ = int8.quantize_int8_reference(x, "token")
        if not np.array_equal(got, want) and np.array_equal(got, own_q.numpy().astype(np.int64)):
            return [
                "the static scale s is ignored: the codes are those of each row's own scale; with s given, "
                "q = clamp(rne(x / s), -127, 127) with that one s"
            ]
        return _code_smells(x, got, want, given.float().reshape(1, 1))
    if s.numel() == 1 and rows > 1:
        return _scale_smells(x, np.full(rows, s.reshape(()).item(), dtype=F32), want_s.numpy().reshape(-1)) or [
            f"s has shape {tuple(s.shape)}, want ({rows}, 1): one scale per row"
        ]
    if s.numel() != rows or tuple(s.shape) != (rows, 1):
        return [
            f"s has shape {tuple(s.shape)}, want ({rows}, 1): one scale per row, a column, so that s * q "
            "broadcasts along each row"
        ]
    found = _scale_smells(x, s.numpy().reshape(-1).astype(F32), want_s.numpy().reshape(-1))
    if found:
        return found
    return _code_smells(x, got, want, want_s)


def check_quantize(fn, inputs: dict | None = None) -> None:
    """q1: ``fn(x)`` -> ``(q, s)``, one scale per row, and ``fn(x, s)`` -> ``(q, s)`` with a static scale,
    bit for bit against :func:`kernels.int8.quantize_int8_reference`, on ``inputs`` ({label: matrix};
    :func:`quantizer_inputs` unless given; the static scale of each is :func:`static_scale`)."""
    question, name = "q1", "quantize_int8"
    dev = default_device()
    inputs = quantizer_inputs() if inputs is None else inputs
    problems, codes, scales = [], 0, 0
    for mode in ("one scale per row", "a static scale"):
        for label, x in inputs.items():
            xc = x.detach().cpu()
            if mode == "one scale per row":
                given, who = None, name
                out = call_student(fn, x.to(dev), name=who, question=question)
            else:
                given, who = static_scale(xc), f"{name}(x, s)"
                out = call_student(fn, x.to(dev), given.to(dev), name=who, question=question)
            want_q = int8.quantize_int8_reference(xc, "token" if given is None else "tensor", s=given)[0]
            q, s = _unpack_codes(out, xc, want_q, question, who)
            found = diagnose_quantizer(xc, q, s, given)
            if found:
                problems.append(f"{mode}, input '{label}': " + "; ".join(found))
                break  # one diagnosis per mode: the first input that shows it
            codes += q.numel()
            scales += s.numel()
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(
        f"{question} passed: {len(inputs)} inputs per row and {len(inputs)} with a static scale, {codes} codes and "
        f"{scales} scales bit for bit"
    )


# -- q2: the W8A8 GEMM ---------------------------------------------------------------------------------------

# The bound against the float64 product P = S_a[m] S_b[n] sum_k a[m,k] b[n,k].  The int32 sum is exact;
# the epilogue rounds at most three times in fp32 (the int32 -> fp32 conversion above 2^24, two
# multiplies), each by at most 2^-24 relative, then once to bf16, by at most 2^-8 relative (8 significant
# bits, round to nearest): |C - P| <= 2^-8 |P| + 3 * 2^-24 * (1 + 2^-8) |P|, below (2^-8 + 2^-21) |P|.
# Near zero, that bound meets the yardstick's own error: w8a8_matmul_reference(exact=False) sums K float64
# products, each and each partial sum rounded by 2^-53, so where the int32 sum is 0 (exactly 0 in C)
# P comes out as a residue up to K * 2^-53 * sum_k |S_a a_k S_b b_k|; that much is allowed on top.  The
# absolute 2^-126 lets a GPU flush fp32 or bf16 subnormals.
GEMM_RTOL = 2.0**-8 + 2.0**-21
GEMM_ATOL = 2.0**-126


def _codes_and_scales(g, rows: int, k: int) -> tuple:
    x = torch.randn(rows, k, generator=g) * 10.0 ** (torch.rand(rows, 1, generator=g) * 4 - 2)
    return int8.quantize_int8_reference(x, "token")


def _gemm_case(g, m: int, n: int, k: int, saturated: bool) -> dict:
    """Codes and scales of one GEMM: quantized random rows (scales over four decades), or codes of
    +-127 with rows of a and b all +127 and a row of b all -127, whose sums are +-K * 127^2."""
    if saturated:
        a = torch.where(torch.rand(m, k, generator=g) < 0.5, -QMAX, QMAX).to(torch.int8)
        b = torch.where(torch.rand(n, k, generator=g) < 0.5, -QMAX, QMAX).to(torch.int8)
        a[0], b[0], b[-1] = QMAX, QMAX, -QMAX
        sa = (10.0 ** (torch.rand(m, 1, generator=g) * 4 - 2) / QMAX).float()
        sb = (10.0 ** (torch.rand(n, 1, generator=g) * 4 - 2) / QMAX).float()
        return {"a": a, "b": b, "a_scale": sa, "b_scale": sb}
    a, sa = _codes_and_scales(g, m, k)
    b, sb = _codes_and_scales(g, n, k)
    return {"a": a, "b": b, "a_scale": sa, "b_scale": sb}


def gemm_inputs() -> dict:
    """Named GEMMs ``{"a", "b", "a_scale", "b_scale"}``: codes of +-127 over K = 2000 (square, so a scale
    applied along the wrong axis still runs), random codes with K = 100 (square), a rectangular one with
    K = 160; no K is a multiple of 64."""
    g = torch.Generator().manual_seed(17)
    return {
        "codes +-127, K = 2000": _gemm_case(g, 8, 8, 2000, saturated=True),
        "random codes, 16 x 16, K = 100": _gemm_case(g, 16, 16, 100, saturated=False),
        "random codes, 5 x 40, K = 160": _gemm_case(g, 5, 40, 160, saturated=False),
    }


def fresh_gemm_inputs(seed: int, m: int, n: int, k: int) -> dict:
    """A GEMM of random codes and one of codes +-127, both ``(m, k) x (n, k)``, drawn from ``seed``."""
    if min(m, n, k) < 1 or n < 2:
        raise ValueError(f"want m, k >= 1 and n >= 2, got m={m}, n={n}, k={k}")
    g = torch.Generator().manual_seed(seed)
    return {
        f"random codes, {m} x {n}, K = {k}": _gemm_case(g, m, n, k, saturated=False),
        f"codes +-127, {m} x {n}, K = {k}": _gemm_case(g, m, n, k, saturated=True),
    }


def _slack(case: dict) -> torch.Tensor:
    """The float64 yardstick's own error bound, K * 2^-53 * sum_k |S_a a_k S_b b_k|, per output."""
    mags = case["a"].double().abs() @ case["b"].double().abs().T
    k = case["a"].shape[1]
    return k * 2.0**-53 * mags * case["a_scale"].double().reshape(-1, 1) * case["b_scale"].double().reshape(1, -1)


def _outside(got: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    return ~((got - ref).abs() <= GEMM_RTOL * ref.abs() + slack + GEMM_ATOL)


def _near(got: torch.Tensor, ref: torch.Tensor, slack: torch.Tensor) -> bool:
    return not bool(_outside(got, ref, slack).any())


def _gemm_smell(case: dict, got: torch.Tensor, want: torch.Tensor) -> str:
    """The known mistake ``got`` (float64) shows against the float64 product ``want``, or ""."""
    a, b = case["a"].long(), case["b"].long()
    sa, sb = case["a_scale"].double().reshape(-1, 1), case["b_scale"].double().reshape(1, -1)
    m, k = a.shape
    n = b.shape[0]
    acc = a @ b.T  # exact
    accd = acc.double()
    if torch.isinf(got).any():
        return (
            f"accumulator overflow: {int(torch.isinf(got).sum())} outputs are infinite where the exact product is "
            f"finite (the largest sum of code products here is {int(acc.abs().max())}): an fp16 accumulator (largest "
            "finite 65504) overflows; accumulate the int8 products in int32"
        )
    if torch.isnan(got).any():
        return f"{int(torch.isnan(got).sum())} outputs are NaN where the exact product is finite"
    smell = constant_output(got.numpy().ravel(), want.numpy().ravel(), show=lambda v: f"{v:g}")
    if smell:
        return smell
    candidates = [
        ("a_scale left out: C = (A B^T) * b_scale, without the per-token a_scale[m]", accd * sb),
        ("b_scale left out: C = a_scale * (A B^T), without the per-channel b_scale[n]", accd * sa),
        ("both scales left out: C is the raw int32 sum A B^T; dequantize it: times a_scale[m] * b_scale[n]", accd),
        (
            "scales divided instead of multiplied: C = A B^T / (a_scale b_scale); x ~= S * q, so "
            "C = a_scale[m] * b_scale[n] * (A B^T)",
            accd / sa / sb,
        ),
        ("a_scale divided instead of multiplied: x ~= S * q, so C = a_scale[m] * b_scale[n] * (A B^T)", accd / sa * sb),
        ("b_scale divided instead of multiplied: x ~= S * q, so C = a_scale[m] * b_scale[n] * (A B^T)", accd * sa / sb),
    ]
    if m == n:
        candidates.append(
            (
                "scales transposed: a_scale applied along C's columns and b_scale along its rows; a_scale (M, 1) "
                "belongs to C's rows (tokens), b_scale (N, 1) to its columns (output channels)",
                accd * sa.reshape(1, -1) * sb.reshape(-1, 1),
            )
        )
    for bits, what in ((16, "an int16"), (8, "an int8")):
        half = 1 << (bits - 1)
        wrapped = torch.remainder(acc + half, 2 * half) - half
        candidates.append(
            (
                f"accumulator overflow: the sums wrapped around at 2^{bits - 1}, as in {what} accumulator; "
                f"K * 127^2 = {k * QMAX**2} needs int32 (acc = tl.zeros(..., dtype=tl.int32); tl.dot of int8 "
                "tiles gives int32)",
                wrapped.double() * sa * sb,
            )
        )
    candidates.append(
        (
            "b read as a (K, N) matrix: b is (N, K), K-major like a weight (row n holds output channel n's K "
            "codes): element (n, k) is at b_ptr + n * K + k, and C = A B^T",
            (a @ case["b"].reshape(k, n).long()).double() * sa * sb,
        )
    )
    blocks = {}  # columns kept -> the BLOCK_K that keep that many
    for bk in (16, 32, 64, 128, 256):
        if 0 < k // bk * bk < k:
            blocks.setdefault(k // bk * bk, []).append(str(bk))
    for kk, bks in blocks.items():
        candidates.append(
            (
                f"the K tail is dropped: the last {k - kk} of K = {k} columns are left out (K is not a multiple of "
                f"BLOCK_K = {' or '.join(bks)}); loop over tl.cdiv(K, BLOCK_K) tiles and mask the last one's loads "
                "(other=0)",
                (a[:, :kk] @ b[:, :kk].T).double() * sa * sb,
            )
        )
    slack = _slack(case)
    for message, cand in candidates:
        if _near(got, cand, slack) and not _near(want, cand, slack):
            return message
    return ""


def _call_gemm(fn, case: dict, dev: str, question: str, name: str):
    args = [case[key].to(dev) for key in ("a", "b", "a_scale", "b_scale")]
    try:
        return call_student(fn, *args, name=name, question=question)
    except AssertionError as e:
        text = str(e)
        shapes = ("shapes cannot be multiplied", "equal reduction dimensions", "not compatible for matmul")
        if type(e) is AssertionError and any(s in text for s in shapes):
            raise AssertionError(
                f"{text}\n  - b is (N, K), K-major like a weight: multiply by its transpose (a @ b.T, or "
                "tl.dot(a, tl.trans(b)) on tiles of both loaded (rows, BLOCK_K))"
            ) from e
        raise


def check_w8a8(fn, inputs: dict | None = None) -> None:
    """q2: ``fn(a, b, a_scale, b_scale)`` -> bf16 ``(S_a a)(S_b b)^T`` within :data:`GEMM_RTOL` of the
    float64 product, on ``inputs`` ({label: {"a", "b", "a_scale", "b_scale"}}; :func:`gemm_inputs`
    unless given)."""
    question, name = "q2", "w8a8_matmul"
    dev = default_device()
    inputs = gemm_inputs() if inputs is None else inputs
    max_abs = max_rel = 0.0
    for label, case in inputs.items():
        out = _call_gemm(fn, case, dev, question, name)
        if not isinstance(out, torch.Tensor):
            raise AssertionError(f"{question}: {name} must return a torch.Tensor, got {type_name(out)}")
        m, n = case["a"].shape[0], case["b"].shape[0]
        if tuple(out.shape) != (m, n):
            hint = ": that is C transposed, b a^T" if tuple(out.shape) == (n, m) and m != n else ""
            raise AssertionError(f"{question}: {name} returned shape {tuple(out.shape)}, want (M, N) = {(m, n)}{hint}")
        if out.dtype != torch.bfloat16:
            raise AssertionError(
                f"{question}: {name} must return bfloat16 (the fp32 epilogue rounded once), got {out.dtype}"
            )
        got = out.detach().cpu().double()
        want = int8.w8a8_matmul_reference(case["a"], case["b"], case["a_scale"], case["b_scale"], exact=False)
        bad = _outside(got, want, _slack(case))
        if not bad.any():
            err = (got - want).abs()
            max_abs = max(max_abs, float(err.max()))
            nonzero = got != 0  # where C is 0, its exact value is too; P holds the yardstick's residue
            max_rel = max(max_rel, float((err / want.abs())[nonzero].max()) if nonzero.any() else 0.0)
            continue
        smell = _gemm_smell(case, got, want)
        if not smell:
            rel = float(((got - want).abs() / want.abs().clamp_min(1e-300))[bad].max())
            smell = f"max_rel {rel:.3g} (bound 2^-8)\n" + first_mismatches(
                np.empty(0), got.numpy(), want.numpy(), np.flatnonzero(bad.numpy().ravel()), what="outputs"
            )
        raise _fail(question, name, f"input '{label}'", [smell])
    print(
        f"{question} passed: {len(inputs)} GEMMs within 2^-8 relative of the float64 product "
        f"(max_abs {max_abs:.3g}, max_rel {max_rel:.3g})"
    )


# -- q3: SmoothQuant -----------------------------------------------------------------------------------------

ALPHAS = (0.5, 0.75)
# The smoothed pair against smooth(x, w, smoothquant_scales(...)): s from fp32 powers (or exp and log)
# is within a few ulps of the reference's, and the division and the product add one rounding each:
# 2^-16 relative leaves a wide margin, while every known mistake changes values by factors of s.
SMOOTH_RTOL = 2.0**-16
# x_smooth @ w_smooth^T against x @ w^T, per element: each term x_j w_j comes back as
# fl(x_j / s_j) fl(w_j s_j), within 2^-23 relative of it, so the sums differ by at most
# 2^-23 sum_j |x_j w_j|; 2^-20 of that sum for margin.
PRODUCT_RTOL = 2.0**-20


def _smooth_case(g, t: int, k: int, n: int, zero_channels: bool, separate_calibration: bool) -> dict:
    def acts(rows):
        v = torch.randn(rows, k, generator=g)
        v[:, outliers] *= 40.0
        if zero_channels:
            v[:, zero_x] = 0.0
        return v

    outliers = torch.randperm(k, generator=g)[:4]
    picks = torch.randperm(k, generator=g)
    zero_x, zero_w = picks[:2], picks[1:3]  # channel picks[1] is zero in both
    x = acts(t)
    w = torch.randn(n, k, generator=g) * 0.05
    if zero_channels:
        w[:, zero_w] = 0.0
    calib = acts(2 * t) if separate_calibration else x
    return {"x": x, "w": w, "act_amax": calib.abs().amax(dim=0)}


def smooth_inputs() -> dict:
    """Named cases ``{"x", "w", "act_amax"}``: activations with four outlier channels (x40) and a weight;
    the first square (T = K = N, so that s applied along the wrong axis still runs), the second with
    zero channels (x's, w's and both); ``act_amax`` is the largest |x| per channel of x itself."""
    g = torch.Generator().manual_seed(27)
    return {
        "outlier channels, 48 x 48 x 48": _smooth_case(g, 48, 48, 48, zero_channels=False, separate_calibration=False),
        "zero channels, T = 24, K = 64, N = 40": _smooth_case(
            g, 24, 64, 40, zero_channels=True, separate_calibration=False
        ),
    }


def fresh_smooth_inputs(seed: int, t: int, k: int, n: int) -> dict:
    """The two kinds of :func:`smooth_inputs` at ``(t, k, n)``, drawn from ``seed``, with ``act_amax``
    from a calibration batch of their own (as a deployed model is calibrated once, then run)."""
    if min(t, n) < 1 or k < 8:
        raise ValueError(f"want t, n >= 1 and k >= 8, got t={t}, k={k}, n={n}")
    g = torch.Generator().manual_seed(seed)
    return {
        f"outlier channels, T = {t}, K = {k}, N = {n}": _smooth_case(g, t, k, n, False, True),
        f"zero channels, T = {t}, K = {k}, N = {n}": _smooth_case(g, t, k, n, True, True),
    }


def w8a8_error(x: torch.Tensor, w: torch.Tensor, reference: torch.Tensor) -> float:
    """Frobenius error of ``x @ w^T`` through per-token / per-channel INT8 (the package's reference
    quantizers, float64 product) against ``reference``."""
    qx, sx = int8.quantize_int8_reference(x.float(), "token")
    qw, sw = int8.quantize_int8_reference(w.float(), "channel")
    return frobenius_error(int8.w8a8_matmul_reference(qx, qw, sx, sw, exact=False), reference)


def _close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool(((got.double() - ref.double()).abs() <= SMOOTH_RTOL * ref.double().abs() + 1e-30).all())


def _smooth_smell(case: dict, alpha: float, xs: torch.Tensor, ws: torch.Tensor) -> str:
    x, w, act = case["x"], case["w"], case["act_amax"]
    t, k = x.shape
    n = w.shape[0]

    def scales(a_amax, w_amax, al):
        a = a_amax.float().clamp(min=1e-5)
        return (a.pow(al) / w_amax.float().clamp(min=1e-5).pow(1 - al)).clamp(min=1e-5)

    s = int8.smoothquant_scales(act, w, alpha)
    w_cols = w.abs().amax(dim=0)
    candidates = [
        ("reversed", (x * s, w / s)),
    ]
    if alpha != 0.5:
        candidates.append(
            (
                f"alpha and 1 - alpha swapped: s_j = max|X_j|^{1 - alpha:g} / max|W_j|^{alpha:g} at alpha = {alpha:g}; "
                "the activations' amax takes the power alpha, the weight's the power 1 - alpha",
                int8.smooth(x, w, scales(act, w_cols, 1 - alpha)),
            )
        )
        candidates.append(
            (
                f"alpha ignored: at alpha = {alpha:g} the result is the one of alpha = 0.5; use the alpha passed",
                int8.smooth(x, w, scales(act, w_cols, 0.5)),
            )
        )
    if n == k:
        candidates.append(
            (
                "max |W| taken over the wrong axis: per output row (dim 1) instead of per input channel; s_j "
                "needs max_n |W[n, j]|, the largest weight that multiplies channel j (dim 0 of W (N, K))",
                int8.smooth(x, w, scales(act, w.abs().amax(dim=1), alpha)),
            )
        )
    if t == k:
        candidates.append(
            (
                "s applied to the rows of x (tokens) instead of its columns (input channels): x_smooth[t, j] = "
                "x[t, j] / s_j, so that x_smooth @ w_smooth^T = x @ w^T",
                ((x / s[:, None]), (w * s)),
            )
        )
    own = x.abs().amax(dim=0)
    if not torch.equal(own, act):
        candidates.append(
            (
                "act_amax ignored: s comes from x's own largest |x| per channel; use the calibration act_amax passed "
                "in (the activations of one batch are not the ones the scales were calibrated on)",
                int8.smooth(x, w, scales(own, w_cols, alpha)),
            )
        )
    reference = x.double() @ w.double().T
    for message, (cx, cw) in candidates:
        if _close(xs, cx) and _close(ws, cw):
            if message == "reversed":
                before, after = w8a8_error(x, w, reference), w8a8_error(xs, ws, reference)
                return (
                    "migration reversed: x multiplied by s and w divided by it; x @ w^T is kept but the outlier "
                    f"channels grow, and the W8A8 error grows from {before:.3g} to {after:.3g}: x_smooth = x / s, "
                    "w_smooth = w * s"
                )
            return message
    prod = xs.double() @ ws.double().T
    bound = PRODUCT_RTOL * (x.double().abs() @ w.double().abs().T) + 1e-30
    if not bool(((prod - reference).abs() <= bound).all()):
        rel = frobenius_error(prod, reference)
        return (
            f"x_smooth @ w_smooth^T is not x @ w^T (Frobenius error {rel:.3g}): divide column j of x by s_j and "
            "multiply column j of w by the same s_j"
        )
    return ""


def check_smooth_quant(fn, inputs: dict | None = None) -> None:
    """q3: ``fn(x, w, act_amax, alpha)`` -> ``(x_smooth, w_smooth)`` within fp32 rounding of
    :func:`kernels.int8.smooth` with :func:`kernels.int8.smoothquant_scales`, at alpha 0.5 and 0.75;
    the product kept, the W8A8 error lower.  ``inputs``: {label: {"x", "w", "act_amax"}}
    (:func:`smooth_inputs` unless given)."""
    question, name = "q3", "smooth_quant"
    dev = default_device()
    inputs = smooth_inputs() if inputs is None else inputs
    report = []
    for label, case in inputs.items():
        x, w, act = case["x"], case["w"], case["act_amax"]
        reference = x.double() @ w.double().T
        for alpha in ALPHAS:
            where = f"input '{label}' at alpha = {alpha:g}"
            out = call_student(fn, x.to(dev), w.to(dev), act.to(dev), alpha, name=name, question=question)
            if not isinstance(out, tuple | list) or len(out) != 2:
                raise AssertionError(f"{question}: {name} must return (x_smooth, w_smooth), got {type_name(out)}")
            for what, t, ref in (("x_smooth", out[0], x), ("w_smooth", out[1], w)):
                if not isinstance(t, torch.Tensor):
                    raise AssertionError(f"{question}: {name} returned {what} of type {type_name(t)}, want a tensor")
                if tuple(t.shape) != tuple(ref.shape):
                    raise AssertionError(
                        f"{question}: {name} returned {what} of shape {tuple(t.shape)}, want {tuple(ref.shape)} "
                        "(the shape of the matrix it smooths)"
                    )
                if t.dtype != torch.float32:
                    raise AssertionError(f"{question}: {name} returned {what} of dtype {t.dtype}, want float32")
            xs, ws = out[0].detach().cpu(), out[1].detach().cpu()
            want_x, want_w = int8.smooth(x, w, int8.smoothquant_scales(act, w, alpha))
            finite = torch.isfinite(want_x).all(dim=0) & torch.isfinite(want_w).all(dim=0)
            broken = (~torch.isfinite(xs)).any(dim=0) | (~torch.isfinite(ws)).any(dim=0)
            if (broken & finite).any():
                cols = torch.nonzero(broken & finite).reshape(-1)[:8].tolist()
                zero = torch.nonzero((act == 0) | (w.abs().amax(dim=0) == 0)).reshape(-1)[:8].tolist()
                raise _fail(
                    question,
                    name,
                    where,
                    [
                        f"NaN or inf in the smoothed pair at input channels {cols}; act_amax or max |W_j| is 0 at "
                        f"channels {zero}: clamp both to at least 1e-5 before the powers (as "
                        "kernels.int8.smoothquant_scales does), so that every s_j is finite and positive"
                    ],
                )
            if not (_close(xs, want_x) and _close(ws, want_w)):
                smell = _smooth_smell(case, alpha, xs, ws)
                if not smell:
                    which, got, want = ("x_smooth", xs, want_x) if not _close(xs, want_x) else ("w_smooth", ws, want_w)
                    bad = ~((got.double() - want.double()).abs() <= SMOOTH_RTOL * want.double().abs() + 1e-30)
                    smell = first_mismatches(
                        np.empty(0), got.numpy(), want.numpy(), np.flatnonzero(bad.numpy().ravel()), what=which
                    )
                raise _fail(question, name, where, [smell])
            prod = xs.double() @ ws.double().T
            if not bool(((prod - reference).abs() <= PRODUCT_RTOL * (x.double().abs() @ w.double().abs().T)).all()):
                raise _fail(question, name, where, ["x_smooth @ w_smooth^T is not x @ w^T to fp32 rounding"])
            before, after = w8a8_error(x, w, reference), w8a8_error(xs, ws, reference)
            if not after < before:  # a right pair on inputs with outlier channels always gets here
                raise _fail(
                    question, name, where, [f"the W8A8 error does not drop: {before:.3g} before, {after:.3g} after"]
                )
            report.append((label, alpha, before, after))
    label, alpha, before, after = report[0]
    print(
        f"{question} passed: {len(inputs)} inputs at alpha {' and '.join(f'{a:g}' for a in ALPHAS)}, within 2^-16 of "
        f"int8.smooth, x_smooth @ w_smooth^T = x @ w^T; W8A8 error on '{label}' at alpha {alpha:g}: {before:.3g} "
        f"before, {after:.3g} after"
    )


# -- q4 and q5: attention's tolerances and the type of its inputs ------------------------------------------

ATTN_TOL = attention.TOLERANCES["bf16"].atol  # bf16 in and out: the output's rounding and P rounded to bf16
ATTN_FP8_TOL = attention.TOLERANCES["fp8"].atol  # E4M3 operands: up to 2^-4 relative error each
ATTN_FP8_BLOCK = attention.FP8_BLOCK  # rows of Q, K and V per FP8 scale
ATTN_FP8_VS_PACKAGE = 1.5  # the most an FP8 kernel's error may exceed the package kernel's, as a factor,
ATTN_FP8_VS_PACKAGE_SLACK = 0.01  # plus this much relative RMS error (a rotation of other blocks costs it)
# hadamard=True must leave at most this fraction of the hadamard=False error on the outlier input, or the
# package's own fraction there plus 0.25 where that is larger (a draw whose outliers cost little gains
# little), never more than 0.9.  On the public input the package's rotation (blocks of 32 channels) leaves
# 0.45, whole-head and 16-channel rotations 0.41-0.46; over a dozen other draws the package left 0.26-0.62
# and a 16-channel rotation up to 0.74.
ATTN_HADAMARD_GAIN = 0.75
_ATTN_OVERFLOW = 80.0  # e^80 ~ 5.5e34: scores beyond this overflow fp32 once summed without the max
_ATTN_EMULATION_MATCH = 0.25  # a mistake "fits" when the output is 4x closer to it than to the truth


class AttentionCase(NamedTuple):
    """One input of an attention check: bf16 ``q`` (B, H, N_q, D), ``k`` and ``v`` (B, H, N_k, D) on the
    host, the ``causal`` argument, and its ``kind``: "plain", "large scores", "nearly equal scores" (q4);
    "plain", "magnitudes", "small probabilities", "outliers" (q5)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: object
    kind: str = "plain"


def _attn_shape(case: AttentionCase) -> str:
    b, h, n_q, d = case.q.shape
    return f"B={b} H={h} N_q={n_q} N_k={case.k.shape[2]} D={d}, causal={case.causal!r}"


def _attn_bf16(*ts) -> tuple:
    return tuple(t.to(torch.bfloat16) for t in ts)


# -- q4: the inputs ---------------------------------------------------------------------------------------


def _attn_random(g, b, h, n_q, n_k, d, causal) -> AttentionCase:
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (n_q, n_k, n_k))
    return AttentionCase(*_attn_bf16(q, k, v), causal)


def _attn_large(g, b, h, n_q, n_k, d, s_max) -> AttentionCase:
    """Q and K scaled so that the largest score is ``s_max`` (e^88.7 is fp32's largest: beyond that, an
    exponential taken without subtracting the maximum overflows)."""
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (n_q, n_k, n_k))
    top = (q @ k.transpose(-1, -2)).abs().max() / math.sqrt(d)
    a = (s_max / top).sqrt()
    return AttentionCase(*_attn_bf16(q * a, k * a, v), False, "large scores")


def _attn_nearly_equal(g, n_q, n_k, d) -> AttentionCase:
    """Scores of standard deviation 0.03 (a row's all within 0.3), so each row sums ``n_k`` terms near 1
    into l.  The first half of V's channels is 4 + noise (the output is about 4: a relative error of l
    shows); the second half is +16 on the first half of the keys and -16 on the rest, so the accumulator
    climbs to about 8 n_k and comes back near 0, and a bf16 accumulator's lost low bits are what is left."""
    q = torch.randn(1, 1, n_q, d, generator=g) * 0.3
    k = torch.randn(1, 1, n_k, d, generator=g) * 0.1
    v = torch.randn(1, 1, n_k, d, generator=g) * 0.5
    v[..., : d // 2] += 4.0
    v[..., d // 2 :] += torch.where(torch.arange(n_k) < n_k // 2, 16.0, -16.0)[:, None]
    return AttentionCase(*_attn_bf16(q, k, v), False, "nearly equal scores")


# The nearly-equal-scores row long enough for a bf16 l to fail: with the package's tile of 64 keys, l in
# bf16 leaves the tolerance from N_k = 1024 on (at 512 it is at 0.8-0.9 of it; fp32 l stays below 0.3).
# A bf16 accumulator fails from N_k = 256 on.
ATTN_LONG_N_K = 1024


def attention_inputs() -> dict:
    """q4's fixed inputs: {label: :class:`AttentionCase`}."""
    g = torch.Generator().manual_seed(74)
    return {
        "no mask": _attn_random(g, 2, 2, 80, 80, 64, False),
        "no mask, N_q < N_k": _attn_random(g, 1, 2, 33, 100, 32, False),
        "causal=True": _attn_random(g, 1, 2, 80, 80, 64, True),
        "top_left, N_q < N_k": _attn_random(g, 1, 1, 48, 90, 32, "top_left"),
        "bottom_right, N_q < N_k": _attn_random(g, 1, 1, 33, 100, 32, "bottom_right"),
        "bottom_right, N_q > N_k: the first 60 rows see no key": _attn_random(g, 1, 1, 100, 40, 32, "bottom_right"),
        "scores up to 100": _attn_large(g, 1, 2, 64, 64, 32, 100.0),
        "nearly equal scores, N_k = 128": _attn_nearly_equal(g, 64, 128, 32),
        f"nearly equal scores, N_k = {ATTN_LONG_N_K}": _attn_nearly_equal(g, 64, ATTN_LONG_N_K, 32),
    }


def fresh_attention_inputs(seed: int, n_q: int = 150, n_k: int = 97, heads: int = 3, d: int = 64) -> dict:
    """q4's kinds of input drawn from ``seed`` at other sizes: ``n_q > n_k`` query and key lengths (used in
    both orders, so that bottom_right has rows that see no key), ``heads`` heads, head dimension ``d``,
    and a nearly-equal-scores row of ``ATTN_LONG_N_K`` keys and a few more."""
    if not (n_q > n_k >= 1 and heads >= 1 and d in attention.HEAD_DIMS):
        raise ValueError(f"want n_q > n_k >= 1, heads >= 1, d in {attention.HEAD_DIMS}; got {n_q}, {n_k}, {heads}, {d}")
    g = torch.Generator().manual_seed(seed)
    return {
        "no mask": _attn_random(g, 2, heads, n_q, n_k, d, False),
        "causal=True": _attn_random(g, 1, heads, n_q, n_q, d, True),
        "top_left, N_q < N_k": _attn_random(g, 1, heads, n_k, n_q, d, "top_left"),
        "bottom_right, N_q < N_k": _attn_random(g, 2, 1, n_k, n_q, d, "bottom_right"),
        "bottom_right, N_q > N_k": _attn_random(g, 1, heads, n_q, n_k, d, "bottom_right"),
        "scores up to 120": _attn_large(g, 1, heads, n_k, n_q, d, 120.0),
        "nearly equal scores, N_k = 160": _attn_nearly_equal(g, 48, 160, d),
        f"nearly equal scores, N_k = {ATTN_LONG_N_K + 37}": _attn_nearly_equal(g, 48, ATTN_LONG_N_K + 37, d),
    }


# -- q4: attention with a mistake made, in float64 ----------------------------------------------------------


def _attn_visible(n_q: int, n_k: int, causal, mask: str) -> torch.Tensor:
    """The keys each query sees: the right mask, or "flipped" (j >= i + shift), or "top_left" in place of
    "bottom_right"."""
    if mask == "top_left" and causal == "bottom_right":
        causal = "top_left"
    visible = attention.causal_mask(n_q, n_k, causal)
    if mask == "flipped" and attention.CAUSAL[causal]:
        shift = n_k - n_q if causal == "bottom_right" else 0
        i = torch.arange(n_q)[:, None]
        visible = torch.arange(n_k)[None, :] >= i + shift
    return visible


def _attn_variant(
    case: AttentionCase, *, q=None, scale=None, mask="right", pad=None, rescale="both", block_n=64
) -> torch.Tensor:
    """Attention in float64 of ``case`` with one or two mistakes: ``q`` in place of case.q, ``scale`` in
    place of 1/sqrt(D); ``mask`` "right", "zero" (masked scores 0 instead of -inf; with ``pad``, also
    those of the zero keys that pad N_k to a multiple of ``pad``, as a kernel's tiles do), "flipped" or
    "top_left"; ``rescale`` "both" (right), "neither", "l only" or "acc only": which of the running sum and
    the accumulator an online softmax over key blocks of ``block_n`` rescales when the maximum moves."""
    qd = (case.q if q is None else q).double()
    kd, vd = case.k.double(), case.v.double()
    n_q, n_k, d = qd.shape[2], kd.shape[2], qd.shape[3]
    visible = _attn_visible(n_q, n_k, case.causal, mask)
    if pad and mask == "zero":
        extra = -(-n_k // pad) * pad - n_k
        kd, vd = (torch.nn.functional.pad(t, (0, 0, 0, extra)) for t in (kd, vd))
        visible = torch.nn.functional.pad(visible, (0, extra), value=False)
    s = (qd @ kd.transpose(-1, -2)) * (1.0 / math.sqrt(d) if scale is None else scale)
    s = s.masked_fill(~visible, 0.0 if mask == "zero" else float("-inf"))
    m = s.amax(-1, keepdim=True)
    exact = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))  # against the row's maximum
    stale = exact if rescale == "both" else _attn_stale_weights(s, block_n)
    num = (exact if rescale in ("both", "acc only") else stale) @ vd
    den = (exact if rescale in ("both", "l only") else stale).sum(-1, keepdim=True)
    return num / torch.where(den == 0, 1.0, den)


def _attn_stale_weights(s: torch.Tensor, block_n: int) -> torch.Tensor:
    """exp(s - m) with m the running maximum as of each key's block (key blocks of ``block_n``): what
    an online softmax that never rescales adds up."""
    n_k = s.shape[-1]
    blocks = -(-n_k // block_n)
    padded = torch.nn.functional.pad(s, (0, blocks * block_n - n_k), value=float("-inf"))
    running = padded.reshape(*s.shape[:-1], blocks, block_n).amax(-1).cummax(-1).values
    running = torch.where(torch.isinf(running), 0.0, running)  # nothing visible yet: against 0
    return torch.exp(s - running.repeat_interleave(block_n, -1)[..., :n_k])


def _attn_excess(got: torch.Tensor, want: torch.Tensor, tol: float) -> torch.Tensor:
    """|got - want| / (tol + tol |want|) per element: above 1 is outside the tolerance (NaN counts as inf)."""
    e = (got - want).abs() / (tol + tol * want.abs())
    return torch.nan_to_num(e, nan=float("inf"))


def _attn_unwritten(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether some query rows of ``got`` are all zero where ``want``'s are not, while others are written:
    tiles of rows, or (batch, head)s, that were never launched."""
    zero = (got == 0).all(-1)
    return bool((zero & (want != 0).any(-1)).any() and (~zero).any())


_ATTN_SMELLS = {
    "nan rows": "fully masked rows give NaN (first rows NaN): a row whose keys are all masked has m = -inf, "
    "and exp(-inf - (-inf)) is NaN; take its exponentials against 0 (m = -inf -> 0) and divide by l only "
    "where l > 0, so that the row comes out as zeros",
    "overflow": "no max subtraction: exp overflows (inf/NaN) on large scores (e^s passes fp32's largest "
    "number at s = 88.7): take p = exp(s - m) with m the running maximum",
    "scale": "scale 1/sqrt(D) missing or applied twice: the scores are q k^T / sqrt(D)",
    "scale on q": "softmax scale applied to bf16 q before the product (right at 1e-1, not 1e-2): q * scale "
    "rounded to bf16 moves every score by up to 2^-9 of itself, several hundredths on large scores; "
    "multiply the fp32 scores instead",
    "no rescale": "no running-max correction (acc/l not rescaled by exp(m_old - m_new)): when a later key "
    "block raises the maximum, the sum and the accumulator built against the old one must be multiplied "
    "by exp(m_old - m_new)",
    "mask zero": "masked scores set to 0 instead of -inf: a masked key (past the diagonal, or past N_k in the "
    "last tile) must get p = 0, and exp(0 - m) is not 0",
    "mask direction": "mask direction wrong: right without the mask, wrong with causal (query i sees keys "
    "j <= i, or j <= i + N_k - N_q for bottom_right)",
    "bottom_right": "bottom_right treated as top_left: bottom_right aligns the last query with the last key, "
    "query i sees keys j <= i + N_k - N_q",
    "unwritten": "query rows left at zero where the output is not: is every tile of query rows launched "
    "(triton.cdiv(N_q, BLOCK_M) programs) for every (batch, head), and stored with a mask on N_q only?",
    "bf16 state": "softmax state or accumulator kept in bf16: error grows with N_k (right on short rows, "
    "wrong on the long row of nearly equal scores, where l sums N_k terms near 1 and bf16 keeps 8 bits); "
    "keep m, l and acc in fp32 and round once, at the store",
}


def _attn_prescaled(case: AttentionCase) -> list:
    """The kernels that scale a bf16 Q before the product: by 1/sqrt(D), or by log2(e)/sqrt(D) for exp2."""
    d = case.q.shape[-1]
    out = []
    for c in (1.0 / math.sqrt(d), math.log2(math.e) / math.sqrt(d)):
        q_scaled = (case.q.float() * torch.tensor(c, dtype=torch.float32)).to(torch.bfloat16)
        out.append(_attn_variant(case, q=q_scaled, scale=1.0 / math.sqrt(d) / c))
    return out


def _attn_explain(case: AttentionCase, got: torch.Tensor, compare: torch.Tensor) -> list:
    """The smells (keys of ``_ATTN_SMELLS``) that account for ``got`` where ``compare`` is set: one
    mistake, or a mask mistake together with a missing correction; [] if none does."""

    def fits(ref):
        return bool((_attn_excess(got, ref, ATTN_TOL)[compare] <= 1).all())

    d = case.q.shape[-1]
    if any(fits(_attn_variant(case, scale=s)) for s in (1.0, 1.0 / d)):
        return ["scale"]
    if any(fits(ref) for ref in _attn_prescaled(case)):
        return ["scale on q"]
    tiles = (16, 32, 64, 128)
    masks = [("right", None, [])]  # (mask, pad, smells): masked scores 0 also pad the keys to a tile
    masks += [("zero", pad, ["mask zero"]) for pad in (None, *tiles)]
    if attention.CAUSAL[case.causal]:
        masks.append(("flipped", None, ["mask direction"]))
    if case.causal == "bottom_right" and case.q.shape[2] != case.k.shape[2]:
        masks.append(("top_left", None, ["bottom_right"]))
    for mask, pad, smells in masks[1:]:
        if fits(_attn_variant(case, mask=mask, pad=pad)):
            return smells
    for mask, pad, smells in masks:
        for rescale in ("neither", "l only", "acc only"):
            for block_n in (pad,) if pad else tiles:
                if fits(_attn_variant(case, mask=mask, pad=pad, rescale=rescale, block_n=block_n)):
                    return ["no rescale", *smells]
    return []


def _attn_score_max(case: AttentionCase) -> torch.Tensor:
    """The largest visible score of each query row (B, H, N_q), float64."""
    s = (case.q.double() @ case.k.double().transpose(-1, -2)) / math.sqrt(case.q.shape[-1])
    visible = attention.causal_mask(case.q.shape[2], case.k.shape[2], case.causal)
    return s.masked_fill(~visible, float("-inf")).amax(-1)


class _AttnRun(NamedTuple):
    label: str
    case: AttentionCase
    got: torch.Tensor  # float64, on the host
    want: torch.Tensor
    excess: torch.Tensor  # per element, above 1 outside the tolerance
    hidden: torch.Tensor  # (B, H, N_q): rows that see no key


def _attn_output(out, q: torch.Tensor, question: str, name: str) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{question}: {name} must return a torch.Tensor, got {type_name(out)}")
    if tuple(out.shape) != tuple(q.shape):
        raise AssertionError(
            f"{question}: {name} returned shape {tuple(out.shape)}, want q's shape (B, H, N_q, D) = {tuple(q.shape)}"
        )
    if out.dtype != torch.bfloat16:
        raise AssertionError(
            f"{question}: {name} returned {out.dtype}: output not bf16 (o is bf16, the fp32 accumulator "
            "divided by l and rounded once at the store)"
        )
    return out.detach().cpu().double()


def _attn_fail(question: str, name: str, problems: list) -> AssertionError:
    return AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))


def _attn_seen(smells: dict) -> list:
    """``{smell text: [labels]}`` -> one line per smell, naming the inputs it was seen on."""
    return [f"{text} (seen on: {'; '.join(labels)})" for text, labels in smells.items()]


def _attn_mismatch(run: _AttnRun, tol: float) -> str:
    bad = np.flatnonzero((run.excess > 1).numpy().ravel())
    head = f"input '{run.label}' ({_attn_shape(run.case)}), outside atol = rtol = {tol:g}"
    return first_mismatches(np.empty(0), run.got.numpy(), run.want.numpy(), bad, what=head)


def _attn_diagnose(runs: list) -> list:
    """What is wrong with a q4 kernel, from its outputs on the check's inputs (``_AttnRun``s): a list of
    problems, each naming its smell and the inputs that show it; [] if every output is right."""
    found, unexplained = {}, []  # {smell text: quoted labels}, runs no smell accounts for

    def note(key, run):
        found.setdefault(_ATTN_SMELLS[key], []).append(f"'{run.label}'")

    for run in runs:
        compare = torch.ones_like(run.got, dtype=torch.bool)
        broken = ~torch.isfinite(run.got).all(-1)  # (B, H, N_q): rows with NaN or inf
        if bool(broken.any()):
            if bool((broken & ~run.hidden & (_attn_score_max(run.case) > _ATTN_OVERFLOW)).any()):
                note("overflow", run)
                continue
            if bool((broken & ~run.hidden).any()):  # NaN in a row that sees keys, on moderate scores
                unexplained.append(run)
                continue
            note("nan rows", run)
            compare = ~run.hidden[..., None].expand_as(run.got)  # the rows that see keys
        if bool((run.excess[compare] <= 1).all()):
            continue
        smells = ["unwritten"] if _attn_unwritten(run.got, run.want) else _attn_explain(run.case, run.got, compare)
        for key in smells:
            note(key, run)
        if not smells:
            unexplained.append(run)
    problems = _attn_seen(found)
    if not unexplained:
        return problems
    failing = [f"'{run.label}'" for run in unexplained]
    right = [run for run in runs if f"'{run.label}'" not in failing + sum(found.values(), [])]
    long_rows = sorted((r for r in runs if r.case.kind == "nearly equal scores"), key=lambda r: r.case.k.shape[2])
    worst = {run.label: float(run.excess.max()) for run in long_rows}
    if all(attention.CAUSAL[run.case.causal] for run in unexplained) and any(
        not attention.CAUSAL[run.case.causal] for run in right
    ):
        problems += _attn_seen({_ATTN_SMELLS["mask direction"]: failing})
    elif (
        all(run.case.kind == "nearly equal scores" for run in unexplained)
        and len(long_rows) > 1
        and f"'{long_rows[-1].label}'" in failing
        and worst[long_rows[-1].label] > worst[long_rows[0].label]
    ):
        growth = ", ".join(f"N_k = {r.case.k.shape[2]}: {worst[r.label]:.2g}" for r in long_rows)
        problems += _attn_seen({_ATTN_SMELLS["bf16 state"] + f"; error / tolerance {growth}": failing})
    else:
        problems += [_attn_mismatch(run, ATTN_TOL) for run in unexplained[:2]]
    return problems


def _attn_run(label, case, out, question, name, tol) -> _AttnRun:
    got = _attn_output(out, case.q, question, name)
    want, lse = attention.attention_reference(case.q, case.k, case.v, case.causal)
    return _AttnRun(label, case, got, want, _attn_excess(got, want, tol), ~torch.isfinite(lse))


def check_flash_attention(fn, inputs: dict | None = None) -> None:
    """q4: ``fn(q, k, v, causal)`` -> bf16 attention within atol = rtol = 1e-2 of float64, on ``inputs``
    ({label: :class:`AttentionCase`}; :func:`attention_inputs` unless given)."""
    question, name = "q4", "flash_attention"
    dev = default_device()
    inputs = attention_inputs() if inputs is None else inputs
    runs = []
    for label, case in inputs.items():
        q, k, v = (t.to(dev) for t in (case.q, case.k, case.v))
        out = call_student(fn, q, k, v, case.causal, name=name, question=question)
        runs.append(_attn_run(label, case, out, question, name, ATTN_TOL))
    for run in runs:
        smell = constant_output(run.got.numpy().ravel(), run.want.numpy().ravel(), show=lambda x: f"{x:g}")
        if smell:
            raise _attn_fail(question, name, [f"input '{run.label}': {smell}"])
    problems = _attn_diagnose(runs)
    if problems:
        raise _attn_fail(question, name, problems)
    max_abs = max(float((run.got - run.want).abs().max()) for run in runs)
    worst = max(float(run.excess.max()) for run in runs)
    longest = max(case.k.shape[2] for case in inputs.values())
    print(
        f"{question} passed: {len(runs)} inputs (no mask, top_left and bottom_right, rows that see no key, "
        f"large scores, N_k up to {longest}) within atol = rtol = {ATTN_TOL:g} of float64; max_abs {max_abs:.3g}, "
        f"worst error / tolerance {worst:.2f}"
    )


# -- q5: the inputs -----------------------------------------------------------------------------------------


def _attn_fp8_random(g, b, h, n_q, n_k, d, causal) -> AttentionCase:
    """Gaussian Q and K; V of standard deviation 0.35, so that the output's error from E4M3 scores (a few
    hundredths of |V|) stays well inside 0.05 + 0.05 |O| for every correct kernel (at 0.5, the package's
    own kernel reaches 0.94 of the tolerance on one draw in a dozen)."""
    q, k, v = (torch.randn(b, h, n, d, generator=g) for n in (n_q, n_k, n_k))
    return AttentionCase(*_attn_bf16(q, k, v * 0.35), causal)


def _attn_fp8_magnitudes(g, h, n_q, n_k, d) -> AttentionCase:
    """Causal top_left with N_q < N_k: keys from N_q on are masked for every query.  Their block of K and
    V is 2^16 times the rest, and the visible V blocks alternate between 1/4 and 1/32: a scale per block
    of 64 rows holds every block's precision; one scale for the tensor (or the head), set by the unseen
    block, leaves the visible values 2^-16 of its range, below E4M3's smallest subnormal.  (V at 1/4: a
    query row that sees one or two keys gets E4M3's full relative error, within 0.05 + 0.05 |O| there.)"""
    q, k, v = (torch.randn(1, h, n, d, generator=g) for n in (n_q, n_k, n_k))
    unseen = torch.arange(n_k) >= n_q
    odd = (torch.arange(n_k) // ATTN_FP8_BLOCK) % 2 == 1
    k = k * torch.where(unseen, 2.0**16, 1.0)[:, None]
    v = v * torch.where(unseen, 2.0**14, torch.where(odd, 1.0 / 32, 1.0 / 4))[:, None]
    return AttentionCase(*_attn_bf16(q, k, v), "top_left", "magnitudes")


def _attn_fp8_small_p(g, h, n_q, n_k, d, gap=7.5) -> AttentionCase:
    """Every query's scores: about 0 for key 0, about -``gap`` for all the others, whose p = e^-7.5 ~ 5.5e-4
    sit below half of E4M3's smallest subnormal (2^-10) yet together hold an eighth of the weight.  256 P
    keeps them; P unscaled flushes them to 0.  V is 0 at key 0 and about 2 elsewhere, so the output is
    that eighth of the weight."""
    u = torch.randn(d, generator=g)
    u = u / u.norm()
    q = math.sqrt(d) * u + 0.1 * torch.randn(1, h, n_q, d, generator=g)
    c = torch.full((n_k,), -gap) + 0.1 * torch.randn(n_k, generator=g)
    c[0] = 0.0
    k = c[:, None] * u + 0.05 * torch.randn(1, h, n_k, d, generator=g)
    v = 2.0 + torch.randn(1, h, n_k, d, generator=g)
    v[:, :, 0] = 0.0
    return AttentionCase(*_attn_bf16(q, k, v), False, "small probabilities")


def _attn_fp8_outliers(g, h, n, d, factor=8.0) -> AttentionCase:
    """Gaussian Q, K and V (V at 1/2) with two channels of Q and K, at places of the draw's choosing,
    ``factor`` times the others, as trained models' attention inputs have."""
    q, k, v = (torch.randn(1, h, n, d, generator=g) for _ in range(3))
    channels = torch.randperm(d, generator=g)[:2]
    q[..., channels] *= factor
    k[..., channels] *= factor
    return AttentionCase(*_attn_bf16(q, k, v * 0.5), False, "outliers")


def fp8_attention_inputs() -> dict:
    """q5's fixed inputs: {label: :class:`AttentionCase`}."""
    g = torch.Generator().manual_seed(75)
    return {
        "Gaussian, no mask": _attn_fp8_random(g, 1, 2, 70, 100, 64, False),
        "a 2^16 block no query sees": _attn_fp8_magnitudes(g, 1, 128, 192, 64),
        "small probabilities": _attn_fp8_small_p(g, 1, 32, 256, 64),
        "two outlier channels in Q and K": _attn_fp8_outliers(g, 2, 128, 64),
    }


def fresh_fp8_attention_inputs(seed: int, batch: int = 2, n_q: int = 150, n_k: int = 90, d: int = 64) -> dict:
    """q5's kinds of input drawn from ``seed`` at other sizes: ``batch`` sequences of ``n_q`` queries and
    ``n_k`` keys, head dimension ``d`` (and the same kinds at lengths of their own)."""
    if not (batch >= 1 and n_q >= 1 and n_k >= 1 and d in attention.HEAD_DIMS and d >= 32):
        raise ValueError(
            f"want batch, n_q, n_k >= 1 and d in {attention.HEAD_DIMS[1:]}; got {batch}, {n_q}, {n_k}, {d}"
        )
    g = torch.Generator().manual_seed(seed)
    return {
        "Gaussian, no mask": _attn_fp8_random(g, batch, 2, n_q, n_k, d, False),
        "Gaussian, bottom_right": _attn_fp8_random(g, batch, 1, n_k, n_q, d, "bottom_right"),
        "a 2^16 block no query sees": _attn_fp8_magnitudes(g, 2, 130, 200, d),
        "small probabilities": _attn_fp8_small_p(g, 2, 40, 300, d),
        "two outlier channels in Q and K": _attn_fp8_outliers(g, 2, 160, d),
    }


# -- q5: FP8 attention with a mistake made, in float64 --------------------------------------------------------


def _attn_fp8_dequantized(x: torch.Tensor, per: str = "block", drop_scale: bool = False) -> torch.Tensor:
    """``x`` (B, H, N, D) through E4M3 and back, with one scale S = amax / 448 per block of 64 rows of each
    head (``per="block"``), per head ("head") or for the tensor ("tensor"); ``drop_scale``: the codes
    alone, the scale never multiplied back."""
    b, h, n, d = x.shape
    n_pad = -(-n // ATTN_FP8_BLOCK) * ATTN_FP8_BLOCK
    xp = torch.zeros(b, h, n_pad, d)
    xp[:, :, :n] = x.float()
    blocks = xp.reshape(b, h, n_pad // ATTN_FP8_BLOCK, ATTN_FP8_BLOCK * d)
    amax = blocks.abs().amax(-1, keepdim=True)  # (B, H, blocks, 1)
    if per == "head":
        amax = amax.amax(-2, keepdim=True).expand_as(amax)
    elif per == "tensor":
        amax = amax.max().expand_as(amax)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    codes = (blocks / s).to(torch.float8_e4m3fn).double()
    y = codes if drop_scale else codes * s.double()
    return y.reshape(b, h, n_pad, d)[:, :, :n]


def _attn_fp8_variant(case: AttentionCase, *, per="block", drop=None, p_unscaled=False) -> torch.Tensor:
    """Float64 attention of ``case``'s operands through E4M3 with one mistake: ``per`` "head" or "tensor"
    scales, the scale of ``drop`` ("q", "k" or "v") left out, or ``p_unscaled`` (P against the row's
    maximum cast to E4M3 as it is, l summed from the unrounded P)."""
    q, k, v = (_attn_fp8_dequantized(t, per, drop == name) for name, t in (("q", case.q), ("k", case.k), ("v", case.v)))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(case.q.shape[-1])
    visible = attention.causal_mask(case.q.shape[2], case.k.shape[2], case.causal)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))
    l_sum = p.sum(-1, keepdim=True)
    if p_unscaled:
        p = p.float().to(torch.float8_e4m3fn).double()
    return (p @ v) / torch.where(l_sum == 0, 1.0, l_sum)


_ATTN_FP8_SMELLS = {
    "tensor": "one scale for the whole tensor instead of per 64-row block: here the largest block sets S = "
    "amax / 448 and the other blocks' values fall below E4M3's smallest subnormal, 2^-9 S; give each block "
    "of 64 rows of each head its own amax and S",
    "drop": "a block scale left out when dequantizing ({}'s): the product of codes is S_Q S_K (scores) or "
    "S_V / 256 (output) times the product of the values",
    "p unscaled": "P cast to E4M3 unscaled (small probabilities flushed to 0): p < 2^-10 rounds to 0 in "
    "E4M3; cast 256 P (a power of two, exact) and divide the product by 256",
    "q only": "Hadamard applied to Q only (or to K only) => wrong scores: rotate both by the same "
    "orthonormal R, (Q R)(K R)^T = Q K^T",
    "ignored": "hadamard=True ignored (no error reduction): on Q and K with outlier channels the rotation "
    "must lower the error; rotate Q and K along D by the same random-signed Hadamard matrix before "
    "quantizing",
}


def _attn_fp8_explain(case: AttentionCase, got: torch.Tensor) -> str:
    """The text of the FP8 mistake that ``got`` (hadamard=False) fits: 4x closer to float64 attention of
    the operands quantized with that mistake than of the operands quantized right; "" if none fits."""

    def distance(**kw):
        return float((got - _attn_fp8_variant(case, **kw)).norm())

    candidates = [("tensor", {"per": "tensor"}), ("tensor", {"per": "head"})]
    candidates += [(f"drop {t}", {"drop": t}) for t in ("q", "k", "v")]
    candidates += [("p unscaled", {"p_unscaled": True})]
    best, key = min((distance(**kw), key) for key, kw in candidates)
    if best > _ATTN_EMULATION_MATCH * distance():
        return ""
    if key.startswith("drop"):
        return _ATTN_FP8_SMELLS["drop"].format(key[-1].upper())
    return _ATTN_FP8_SMELLS[key]


class _AttnFp8Run(NamedTuple):
    label: str
    case: AttentionCase
    hadamard: bool
    got: torch.Tensor
    want: torch.Tensor
    excess: torch.Tensor
    error: float  # relative RMS error against float64
    package_error: float  # the package kernel's, on the same input

    @property
    def where(self) -> str:
        return f"'{self.label}', hadamard={self.hadamard}"

    @property
    def worse_than_package(self) -> bool:
        return self.error > ATTN_FP8_VS_PACKAGE * self.package_error + ATTN_FP8_VS_PACKAGE_SLACK

    @property
    def bad(self) -> bool:
        """Outside the FP8 tolerance somewhere, or (outlier inputs, beyond any elementwise tolerance even
        for the package's kernel) well above the package's error."""
        if self.case.kind == "outliers":
            return self.worse_than_package
        return not bool((self.excess <= 1).all())


def _attn_fp8_runs(fn, inputs: dict, question: str, name: str) -> dict:
    """{label: {hadamard: _AttnFp8Run}}: hadamard=False on every input, and True on the plain and outlier
    ones."""
    dev = default_device()
    runs = {}
    for label, case in inputs.items():
        q, k, v = (t.to(dev) for t in (case.q, case.k, case.v))
        want, _ = attention.attention_reference(case.q, case.k, case.v, case.causal)
        for rotate in (False, True) if case.kind in ("plain", "outliers") else (False,):
            out = call_student(fn, q, k, v, case.causal, rotate, name=name, question=question)
            got = _attn_output(out, case.q, question, name)
            ours = attention.flash_attention_fp8(q, k, v, case.causal, hadamard=rotate).detach().cpu().double()
            excess = _attn_excess(got, want, ATTN_FP8_TOL)
            err, ours_err = frobenius_error(got, want), frobenius_error(ours, want)
            runs.setdefault(label, {})[rotate] = _AttnFp8Run(label, case, rotate, got, want, excess, err, ours_err)
    return runs


def _attn_fp8_unexplained(run: _AttnFp8Run) -> str:
    smell = constant_output(run.got.numpy().ravel(), run.want.numpy().ravel(), show=lambda x: f"{x:g}")
    if smell:
        return f"input {run.where}: {smell}"
    if run.case.kind == "outliers" or bool((run.excess <= 1).all()):
        return (
            f"input {run.where}: relative RMS error {run.error:.3g}, more than {ATTN_FP8_VS_PACKAGE:g}x the "
            f"package kernel's {run.package_error:.3g} on the same input"
        )
    return _attn_mismatch(run, ATTN_FP8_TOL)


def _attn_gain_limit(plain: _AttnFp8Run, rotated: _AttnFp8Run) -> float:
    """The largest fraction of its hadamard=False error a kernel may keep with hadamard=True."""
    package = rotated.package_error / plain.package_error
    return min(0.9, max(ATTN_HADAMARD_GAIN, package + 0.25))


def _attn_fp8_diagnose(runs: dict) -> list:
    """What is wrong with a q5 kernel, from its outputs ({label: {hadamard: run}}): a list of problems,
    each naming its smell and the inputs that show it; [] if every output is right."""
    found, unexplained = {}, []

    def note(text, run):
        found.setdefault(text, []).append(run.where)

    for pair in runs.values():
        plain, rotated = pair[False], pair.get(True)
        if plain.bad:
            smell = _attn_fp8_explain(plain.case, plain.got) if bool(torch.isfinite(plain.got).all()) else ""
            if not smell and _attn_unwritten(plain.got, plain.want):
                smell = _ATTN_SMELLS["unwritten"]
            if smell:
                note(smell, plain)
            else:
                unexplained.append(plain)
        if rotated is None:
            continue
        gain = (
            f" (relative RMS error {plain.error:.3f} without, {rotated.error:.3f} with; the package's "
            f"{plain.package_error:.3f} -> {rotated.package_error:.3f})"
        )
        if plain.case.kind == "outliers" and torch.equal(rotated.got, plain.got):
            note(_ATTN_FP8_SMELLS["ignored"] + gain, rotated)
        elif plain.bad:
            continue  # its problem is the plain run's
        elif rotated.bad and rotated.error > max(plain.error, 2 * rotated.package_error):
            note(_ATTN_FP8_SMELLS["q only"], rotated)
        elif plain.case.kind == "outliers" and rotated.error > _attn_gain_limit(plain, rotated) * plain.error:
            note(_ATTN_FP8_SMELLS["ignored"] + gain, rotated)
        elif rotated.bad:
            unexplained.append(rotated)
    return _attn_seen(found) + [_attn_fp8_unexplained(run) for run in unexplained[:2]]


def check_flash_attention_fp8(fn, inputs: dict | None = None) -> None:
    """q5: ``fn(q, k, v, causal, hadamard)`` -> bf16 attention through FP8, on ``inputs`` ({label:
    :class:`AttentionCase`}; :func:`fp8_attention_inputs` unless given): within atol = rtol = 5e-2 of
    float64 (but on the outlier input), a relative RMS error at most 1.5x the package kernel's plus 0.01
    on every input, and with ``hadamard=True`` at most ``ATTN_HADAMARD_GAIN`` of the error without it on
    the outlier input (more where the package's own rotation gains less)."""
    question, name = "q5", "flash_attention_fp8"
    inputs = fp8_attention_inputs() if inputs is None else inputs
    runs = _attn_fp8_runs(fn, inputs, question, name)
    problems = _attn_fp8_diagnose(runs)
    if not problems:  # within the tolerance, yet well above the package's error
        flat = [run for pair in runs.values() for run in pair.values()]
        problems = [_attn_fp8_unexplained(run) for run in flat if run.worse_than_package]
    if problems:
        raise _attn_fail(question, name, problems)
    flat = [run for pair in runs.values() for run in pair.values()]
    worst = max(float(run.excess.max()) for run in flat if run.case.kind != "outliers")
    ratio = max(run.error / run.package_error for run in flat)
    gains = ", ".join(
        f"{pair[False].error:.3f} -> {pair[True].error:.3f} (package {pair[False].package_error:.3f} -> "
        f"{pair[True].package_error:.3f})"
        for pair in runs.values()
        if pair[False].case.kind == "outliers"
    )
    print(
        f"{question} passed: {len(flat)} runs; within atol = rtol = {ATTN_FP8_TOL:g} of float64 but on outlier "
        f"channels (worst error / tolerance {worst:.2f}); relative RMS error at most {ratio:.2f}x the package "
        f"kernel's; outlier channels, without -> with the Hadamard rotation: {gains}"
    )


__all__ = [
    "ALPHAS",
    "ATTN_FP8_BLOCK",
    "ATTN_FP8_TOL",
    "ATTN_FP8_VS_PACKAGE",
    "ATTN_FP8_VS_PACKAGE_SLACK",
    "ATTN_HADAMARD_GAIN",
    "ATTN_LONG_N_K",
    "ATTN_TOL",
    "AttentionCase",
    "GEMM_ATOL",
    "GEMM_RTOL",
    "PRODUCT_RTOL",
    "SMOOTH_RTOL",
    "attention_inputs",
    "check_flash_attention",
    "check_flash_attention_fp8",
    "check_quantize",
    "check_smooth_quant",
    "check_w8a8",
    "diagnose_quantizer",
    "fp8_attention_inputs",
    "fresh_attention_inputs",
    "fresh_fp8_attention_inputs",
    "fresh_gemm_inputs",
    "fresh_quantizer_inputs",
    "fresh_smooth_inputs",
    "gemm_inputs",
    "quantizer_inputs",
    "smooth_inputs",
    "static_scale",
    "w8a8_error",
]
