"""Checks for Lab 2, scaling: the quantization kernels of :mod:`kernels.quantize`, built by hand.

Every quantizer returns ``(q, S)``: e4m3fn codes and the *reconstruction* scales S (``x ~= S * q``);
for MXFP8 ``S`` is E8M0 bytes (uint8).  The truth is :mod:`kernels.quantize`'s plain-torch reference,
compared bit for bit (codes and scales) on fixed bf16 inputs whose groups hold zeros, an outlier,
NaN, +-inf, subnormals and a partial last group.

* q1 :func:`check_per_tensor`: ``quantize_tensor(x) -> (q, S)``; ``quantize_tensor(x, S)`` casts with a given S.
* q2 :func:`check_rowwise`: ``quantize_rowwise(x) -> (q, S)``, S of shape (M, 1).
* q3 :func:`check_blocks`: ``quantize_blocks(x, block)``, block (1, 128) or (128, 128).
* q4 :func:`check_mxfp8`: ``quantize_mxfp8(x, rounding) -> (q, e8m0 bytes)``, OCP floor and round-up.
* q5 :func:`check_delayed_scaling`: a class with ``scale()``, ``update(amax)`` and ``quantize(x)``.
* q6 :func:`check_dequantization`: ``dequantize(q, S, granularity)`` and ``block_scaled_matmul``.
* :func:`check_same_as_package`: the student's kernels and the package's give the same bits.

On a mismatch a check names the numeric smell it recognises (scale applied twice, S and 1/S swapped,
an all-zero group divided by zero, no saturation, NaN in amax, one scale for every group, the E8M0
bias, floor vs round-up, a block scale pulled out of the K sum, ...), then lists the first mismatches.
"""

import math

import numpy as np
import torch

from kernels import _hopper_math
from kernels import quantize as Q
from kernels.checks import call_student, type_name
from kernels.device import default_device

FMT = "e4m3"
GROUPS = {"tensor": None, "row": None, "1x128": (1, 128), "128x128": (128, 128), "mxfp8": (1, 32)}


# -- the fixed inputs ----------------------------------------------------------------------------------

M, K = 130, 300  # 300 = 2 x 128 + 44 = 9 x 32 + 12: a partial last group for 1x128 and MXFP8; 130 rows: a
# partial block row for 128x128


def lab_input(seed: int = 0) -> torch.Tensor:
    """The bf16 (130, 300) input of every quantizer check, with its adversarial rows and blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * 2
    x[:, 128:256] *= 20  # groups of different sizes: per-group scales differ from per-row ones
    x[3] = 0.0  # an all-zero row (zero groups for every granularity along the row)
    x[5, 7] = 1e4  # one outlier
    x[7, 10], x[7, 11], x[7, 200] = math.nan, math.inf, -math.inf  # non-finite inputs, one per kind
    x[9] = torch.randn(K, generator=g) * 1e-39  # subnormals (bf16 keeps them)
    x[11] = -0.75  # all equal
    x[128:, 256:] = 0.0  # an all-zero (partial) 128x128 block
    x[20, 290:] = 3.0e3  # an outlier in the partial last group only
    return x.to(torch.bfloat16).to(default_device())


def fresh_input(seed: int, shape: tuple) -> torch.Tensor:
    """A bf16 input of ``shape`` (at least 5 rows of ``shape[-1]`` >= 3 columns; the last dimension is K)
    drawn from ``seed``, with the kinds of rows :func:`lab_input` has, at rows the seed picks: magnitudes
    from 1e-2 to 1e2 that change from one block of 32 columns to the next, an all-zero row, NaN, +inf and
    -inf in one row, a row of subnormals, a constant row; and the largest finite value, an outlier of
    +-1e4, in the last row (the last block row of 128x128 blocks, far from a tensor's first elements)."""
    g = torch.Generator().manual_seed(seed)
    k = shape[-1]
    m = math.prod(shape[:-1])
    magnitude = 10.0 ** (torch.rand(-(-k // 32), generator=g) * 4 - 2)
    x = torch.randn(m, k, generator=g) * magnitude.repeat_interleave(32)[:k]
    zero, nonfinite, tiny, constant = torch.randperm(m - 1, generator=g)[:4].tolist()
    x[zero] = 0.0
    cols = torch.randperm(k, generator=g)[:3]
    x[nonfinite, cols] = torch.tensor([math.nan, math.inf, -math.inf])
    x[tiny] = torch.randn(k, generator=g) * 1e-39
    x[constant] = torch.randn(1, generator=g)
    sign = 1.0 if torch.rand(1, generator=g).item() < 0.5 else -1.0
    x[m - 1, torch.randint(k, (1,), generator=g)] = sign * 1e4
    return x.reshape(shape).to(torch.bfloat16).to(default_device())


def tensor_inputs() -> dict:
    x = lab_input()
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return {
        "random + outliers (130x300)": finite,
        "with NaN and +-inf": x,
        "all zeros (7x33)": torch.zeros(7, 33, dtype=torch.bfloat16, device=x.device),
        "one element": torch.full((1,), -3.5, dtype=torch.bfloat16, device=x.device),
    }


# -- diagnosis -------------------------------------------------------------------------------------------


def _scale_values(s: torch.Tensor, kind: str) -> torch.Tensor:
    return Q.e8m0_to_float(s) if kind == "mxfp8" else s.float()


def _groups_of(kind, shape):
    m, k = (1, math.prod(shape)) if kind == "tensor" else (math.prod(shape[:-1]), shape[-1])
    gm, gk = GROUPS[kind] or ((m, k) if kind == "tensor" else (1, k))
    return m, k, gm, gk


def _codes(q: torch.Tensor) -> np.ndarray:
    return q.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().astype(np.int64)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, for exact comparison (NaN == NaN when the bits agree)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.detach().cpu().contiguous().view(view)


def _reference(x, kind, **kw):
    kw = {k: v for k, v in kw.items() if k != "block"}
    return Q.quantize(x, kind, FMT, reference=True, **kw)


def _unpack(out, question, name):
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise AssertionError(f"{question}: {name} must return (q, S), a pair; got {type_name(out)}")
    q, s = out
    for v, what in ((q, "q"), (s, "S")):
        if not isinstance(v, torch.Tensor):
            raise AssertionError(f"{question}: {name} returned {what} of type {type_name(v)}, want a torch.Tensor")
    return q, s


def _check_layout(q, s, want, x, kind, question, name):
    if q.dtype != torch.float8_e4m3fn or tuple(q.shape) != tuple(x.shape):
        raise AssertionError(
            f"{question}: {name} returned q of {q.dtype} {tuple(q.shape)}, want torch.float8_e4m3fn {tuple(x.shape)}"
        )
    if s.dtype != want.s.dtype:
        raise AssertionError(f"{question}: {name} returned S of dtype {s.dtype}, want {want.s.dtype}")
    if (
        s.numel() == want.s.numel()
        and s.dim() == 2
        and tuple(s.shape) == tuple(want.s.shape[::-1]) != tuple(want.s.shape)
    ):
        raise AssertionError(
            f"{question}: {name} returned scales of shape {tuple(s.shape)}, want {tuple(want.s.shape)}: the layout is "
            f"transposed; a GEMM reads one row of scales per row of codes, (rows, groups), row-major"
        )
    if tuple(s.shape) != tuple(want.s.shape):
        raise AssertionError(
            f"{question}: {name} returned scales of shape {tuple(s.shape)}, want {tuple(want.s.shape)} "
            f"(one scale per {kind} group)"
        )


def _division_smell(amax: torch.Tensor, s_got: torch.Tensor, s_want: torch.Tensor) -> str:
    """The scale's division was not correctly rounded: which approximate division the scales match.

    Compiled Triton's fp32 ``/`` is ``div.full.f32`` (amax times an approximate reciprocal) and CPU mode
    gives the same bits (:mod:`kernels._hopper_math`), so ``amax / 448.0`` in a kernel is recognised
    exactly on both; so is torch's CUDA division by a Python number (a multiply by the fp32 reciprocal)."""
    a = amax.numpy().astype(np.float32)
    got, want = s_got.numpy().astype(np.float32), s_want.numpy().astype(np.float32)
    bad = (got != want) & (a > 0) & np.isfinite(got) & (got > 0)
    if not bad.any() or bad.sum() != ((got != want) & (a > 0)).sum():
        return ""
    floor = np.float32(Q.MIN_SCALE)
    slash = np.maximum(_hopper_math.div(a, np.float32(448.0)), floor)
    reciprocal = np.maximum(a * np.float32(1.0 / 448.0), floor)
    n = f"{int(bad.sum())} of {int((a > 0).sum())} scales"
    if np.array_equal(got[bad], slash[bad]) or np.array_equal(got[bad], reciprocal[bad]):
        return (
            f"S is not correctly rounded: {n} are amax times an approximate 1/448, an ulp or two off amax / 448.  "
            "In a kernel, fp32 `/` does that (div.full: times an approximate reciprocal; CPU mode gives the GPU's "
            "bits): compute S with tl.math.div_rn(amax, 448.0).  In torch on a GPU, amax / 448.0 does it too "
            "(dividing by a Python number multiplies by its reciprocal): divide by torch.full_like(amax, 448.0)"
        )
    ulps = np.abs(got[bad].view(np.int32).astype(np.int64) - want[bad].view(np.int32).astype(np.int64))
    if ulps.max() <= 2:
        return (
            f"S is not correctly rounded: {n} are {int(ulps.max())} ulp or less off amax / 448; the contract is one "
            "correctly rounded division per group (tl.math.div_rn in a kernel)"
        )
    return ""


def _inverse_smell(x2, s_want, got_c, expand) -> str:
    """Scales right, codes not: was 1/S computed with an approximate ``/``?"""
    sw = s_want.numpy().astype(np.float32)
    approx = _hopper_math.div(np.float32(1.0), sw).astype(np.float32)
    if np.array_equal(approx, (1.0 / s_want).numpy()):  # every group's 1/S comes out right either way
        return ""
    codes = _codes(Q.encode_reference(x2, expand(torch.from_numpy(approx)), FMT)).reshape(got_c.shape)
    if np.array_equal(got_c, codes):
        return (
            "alpha = 1/S is not correctly rounded: the codes are x times 1.0 / S computed with `/` (approximate on the "
            "GPU, and in CPU mode, which gives the GPU's bits); compute alpha with tl.math.div_rn(1.0, S)"
        )
    return ""


def diagnose(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, kind: str, **kw) -> list:
    """The smells recognised in a quantizer's ``(q, S)`` against the reference, most telling first."""
    want = _reference(x, kind, **kw)
    xf = x.float().cpu()
    m, k, gm, gk = _groups_of(kind, tuple(x.shape))
    x2 = xf.reshape(m, k)
    amax = Q.group_amax_reference(x2, gm, gk)  # (groups along M, groups along K)
    s_got = _scale_values(s.cpu(), kind).reshape(amax.shape)
    s_want = _scale_values(want.s.cpu(), kind).reshape(amax.shape)
    got_c, want_c = _codes(q).reshape(m, k), _codes(want.q).reshape(m, k)
    bad_c = got_c != want_c
    bad_s = (
        _codes(s).reshape(-1) != _codes(want.s).reshape(-1)
        if kind == "mxfp8"
        else ~(s_got == s_want).numpy().reshape(-1)
    )
    found = []
    finite_x = torch.isfinite(x2).numpy()

    def expand(v):
        return Q.expand_scales(v, gm, gk, m, k)

    zero = amax == 0
    if zero.any() and (~torch.isfinite(s_got[zero]) | (s_got[zero] == 0)).any():
        found.append(
            "all-zero group divides by zero: its S came back as "
            f"{s_got[zero][~torch.isfinite(s_got[zero]) | (s_got[zero] == 0)][0].item()} (amax / 448 = 0, and 1/S "
            "is inf, 0 * inf is NaN): give an all-zero group S = 1"
        )
    zero_el = expand(zero.float()).bool().numpy()
    if (zero_el & bad_c).any() and not found:
        found.append(
            "an all-zero group got non-zero or NaN codes: 0 * (1/S) must stay 0 (an all-zero group gets S = 1)"
        )
    has_nan = torch.isnan(x2)
    if has_nan.any():
        grp_nan = Q.group_amax_reference(torch.where(has_nan, 1.0, 0.0), gm, gk) > 0
        if torch.isnan(s_got[grp_nan]).any() or torch.isinf(s_got).any():
            found.append(
                "a NaN or inf input set its group's scale to NaN or inf: leave non-finite values out of amax "
                "(the scale comes from the finite values; the non-finite element alone becomes NaN)"
            )
    rounding = _division_smell(amax, s_got, s_want) if kind != "mxfp8" else ""
    if rounding:
        found.append(rounding)
    nonzero = ~zero & torch.isfinite(s_got) & (s_got > 0)
    if nonzero.any() and not rounding:
        ratio = (s_got[nonzero].double() * s_want[nonzero].double()).numpy()
        if np.allclose(ratio, 1.0, rtol=1e-3) and kind != "mxfp8":
            found.append("S and alpha swapped: S came back as 448 / amax (that is 1/S, alpha); S = amax / 448")
        elif kind == "mxfp8" and np.allclose(ratio, 1.0, rtol=0):
            found.append("S and alpha swapped: the exponent has the wrong sign, S = 2^-e; S = 2^e with e from amax")
        sq = (s_got[nonzero].double() / s_want[nonzero].double() ** 2).numpy()
        if np.allclose(sq, 1.0, rtol=1e-3) and not np.allclose(s_want[nonzero].numpy(), 1.0):
            found.append("scale applied twice: S came back squared")
    if kind not in ("tensor",) and s_want.numel() > 1 and s_want.unique().numel() > 1 and not rounding:
        if s_got.unique().numel() == 1 and torch.isfinite(s_got).all():
            found.append(
                f"one scale for every group: all of S is {s_got.flatten()[0].item():.6g}; each {kind} group needs "
                "its own amax"
            )
        elif kind in ("1x128", "mxfp8") and k % gk and bad_s.any() and not bad_s.reshape(amax.shape)[:, :-1].any():
            found.append(
                "only the last, partial group is wrong: mask the loads past K (other=0.0) so the partial group's "
                "amax comes from the elements present"
            )
        else:
            wrong = bad_s & torch.isfinite(s_got).numpy().reshape(-1) & ~zero.numpy().reshape(-1)
            # MXFP8 scales are powers of two, shared by many groups anyway: one exponent too large everywhere
            # is the round-up rule (diagnosed below), not an amax over several groups
            one_up = kind == "mxfp8" and np.all(_codes(s).reshape(-1)[wrong] == _codes(want.s).reshape(-1)[wrong] + 1)
            if wrong.any() and not one_up and bool((s_got.reshape(-1)[wrong] > s_want.reshape(-1)[wrong]).all()):
                shared = s_got.reshape(-1)[wrong]
                if bool((shared.unique().numel() < wrong.sum()) and (s_want.reshape(-1)[wrong] < shared).all()):
                    found.append(
                        "S is larger than the group's own amax / 448, and shared by several groups: the amax was "
                        f"taken over more than one {kind} group (a whole tile of rows?); reduce over the group only"
                    )
    if kind == "mxfp8":
        gc, wc = _codes(s).reshape(-1), _codes(want.s).reshape(-1)
        zero_g = zero.numpy().reshape(-1)
        if (gc[zero_g] != 127).any():
            found.append(
                f"all-zero block got E8M0 byte {int(gc[zero_g][gc[zero_g] != 127][0])}: an all-zero block gets S = 1 "
                "(byte 127); log2(0) is -inf"
            )
        clamped = (wc == 0) & ~zero_g
        if (gc[clamped] != 0).any():
            found.append(
                "blocks of tiny values (amax below 2^-119, subnormal inputs) need e clamped to -127 (byte 0); "
                "without the clamp, e + 127 wraps around in a byte"
            )
        normal = bad_s & ~zero_g & ~clamped
        bad_s = normal if normal.any() else bad_s
        if np.all((gc[bad_s] + 127) % 256 == wc[bad_s]) and bad_s.any():
            found.append("E8M0 bias missing: the stored byte is e; E8M0 stores e + 127")
        elif bad_s.any() and np.all(gc[bad_s] == wc[bad_s] + 1):
            found.append(
                "scale exponent one too large where amax's significand exceeds 1.75: that is the round-up rule "
                "(ceil(log2(amax / 448))); OCP's rule is floor(log2(amax)) - 8"
            )
        elif bad_s.any() and np.all(gc[bad_s] == wc[bad_s] - 1):
            found.append(
                "scale exponent one too small: amax / S exceeds 448 and values saturate; ceil(log2(amax / 448)) "
                "rounds up, floor(log2(amax)) - 8 is OCP's rule"
            )
    if not found:
        inv_want = (
            expand(1.0 / s_want)
            if kind != "mxfp8"
            else expand(Q.e8m0_inverse_reference(want.s.cpu().reshape(amax.shape)))
        )
        inverse = _inverse_smell(x2, s_want, got_c, expand) if bad_c.any() and kind != "mxfp8" else ""
        if inverse:
            found.append(inverse)
        elif bad_c.any():
            twice = _codes(Q.encode_reference(x2, inv_want * inv_want, FMT)).reshape(m, k)
            times_s = _codes(Q.encode_reference(x2, expand(s_want), FMT)).reshape(m, k)
            hit = bad_c & (got_c == twice)
            if hit.sum() >= 0.5 * bad_c.sum():
                found.append("scale applied twice: the codes are x / S^2; multiply x by 1/S once")
            elif (bad_c & (got_c == times_s)).sum() >= 0.5 * bad_c.sum():
                found.append("S and alpha swapped in the cast: the codes are x * S; the codes are x * (1/S)")
            nan_code = (got_c & 0x7F) == 0x7F
            if (nan_code & finite_x).any():
                found.append(
                    "no saturation: a finite input became the NaN code; clamp x * (1/S) to +-448 before the cast "
                    "(a conversion's own overflow rule differs between APIs: never rely on it)"
                )
            if ((~finite_x) & bad_c).any() and not found:
                found.append(
                    "non-finite inputs must encode to the NaN code 0x7F (e4m3fn has no inf); yours gave "
                    f"{hex(int(got_c[(~finite_x) & bad_c][0]))}"
                )
            if not found and kind in ("1x128", "mxfp8") and k % gk:
                tail = np.zeros_like(bad_c)
                tail[:, k - k % gk :] = True
                if (bad_c & tail).any() and not (bad_c & ~tail).any():
                    found.append(
                        "only the last, partial group is wrong: mask the loads past K (other=0.0) so the partial "
                        "group's amax comes from the elements present"
                    )
    if not found and (bad_c.any() or bad_s.any()):
        found.append("no known smell recognised")
    if bad_s.any():
        i = int(np.flatnonzero(bad_s)[0])
        where = tuple(int(v) for v in np.unravel_index(i, tuple(amax.shape)))
        found.append(
            f"first scale mismatch: group {where}: got {s_got.reshape(-1)[i].item():.9g}, "
            f"want {s_want.reshape(-1)[i].item():.9g}"
        )
    if bad_c.any():
        idx = np.argwhere(bad_c)[:4]
        shown = ", ".join(
            f"x[{r},{c}]={x2[r, c].item():.6g} -> {hex(int(got_c[r, c]))}, want {hex(int(want_c[r, c]))}"
            for r, c in idx
        )
        found.append(f"{int(bad_c.sum())} of {bad_c.size} codes differ; first: {shown}")
    return found


def _check_quantizer(fn, kind, question, name, inputs, **kw):
    n = 0
    for label, x in inputs.items():
        out = call_student(fn, x, *kw.values(), name=name, question=question)
        q, s = _unpack(out, question, name)
        want = _reference(x, kind, **kw)
        _check_layout(q, s, want, x, kind, question, name)
        same = torch.equal(_raw(q), _raw(want.q)) and torch.equal(_raw(s), _raw(want.s))
        if not same:
            problems = diagnose(x, q, s, kind, **kw)
            raise AssertionError(
                f"{question}: {name} differs from the reference on input '{label}':\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
        n += x.numel()
    return n


# -- q1: per tensor ------------------------------------------------------------------------------------


def check_per_tensor(quantize_tensor, inputs: dict | None = None) -> None:
    """q1: current scaling ``quantize_tensor(x) -> (q, S)`` on ``inputs`` ({label: bf16 tensor}, default
    :func:`tensor_inputs`); and ``quantize_tensor(x, S) -> (q, S)``, the cast alone with a given (here
    stale, too small) scale, which must saturate."""
    question = "q1"
    n = _check_quantizer(quantize_tensor, "tensor", question, "quantize_tensor", inputs or tensor_inputs())
    dev = default_device()
    x = torch.tensor([[500.0, -500.0, 9.0, 0.0, 1e6, math.nan]], dtype=torch.bfloat16, device=dev)
    stale = torch.tensor(10.0 / 448.0, device=dev)  # a scale from amax 10
    out = call_student(quantize_tensor, x, stale, name="quantize_tensor(x, S)", question=question)
    q, _ = _unpack(out, question, "quantize_tensor(x, S)")
    if q.dtype != torch.float8_e4m3fn or q.shape != x.shape:
        raise AssertionError(f"{question}: quantize_tensor(x, S) must return float8_e4m3fn codes of x's shape")
    want = Q.quantize_tensor_with_scale_reference(x, stale, FMT)
    got_c, want_c = _codes(q), _codes(want)
    if not np.array_equal(got_c, want_c):
        lines = []
        if ((got_c[:5] & 0x7F) == 0x7F).any():
            lines.append(
                "no saturation: 500 with S from amax 10 is 22400 / 448 codes over the top and became NaN; clamp "
                "x * (1/S) to +-448 before the cast, so it comes back as 448 * S = 10"
            )
        s2 = Q.quantize_tensor_with_scale_reference(x, stale * stale, FMT)
        if np.array_equal(got_c, _codes(s2)):
            lines.append("scale applied twice: the codes are x / S^2")
        if np.array_equal(got_c, _codes(Q.quantize_tensor_with_scale_reference(x, 1 / stale, FMT))):
            lines.append("S and alpha swapped in the cast: the codes are x * S; they are x * (1/S)")
        if not lines:
            lines.append("no known smell recognised")
        lines.append(f"got codes {[hex(int(c)) for c in got_c.ravel()]}, want {[hex(int(c)) for c in want_c.ravel()]}")
        raise AssertionError(f"{question}: quantize_tensor(x, S) with a stale S (from amax 10):\n" + "\n".join(
            f"  - {p}" for p in lines))  # fmt: skip
    included = f"inputs {', '.join(inputs)}" if inputs else "zeros, NaN, inf, one element included"
    print(
        f"{question} passed: quantize_tensor bit-identical to the reference on {n} elements ({included}); "
        "with a stale S a spike of 500 saturates to 448 * S = 10"
    )


# -- q2, q3, q4: groups -----------------------------------------------------------------------------------


def _group_inputs():
    x = lab_input()[:40]  # rows 0-39 hold every adversarial row (128x128 blocks get all 130)
    return {
        "40x300 bf16 (zeros, outlier, NaN, inf, subnormals, partial groups)": x,
        "(2, 3, 40)": x[:6, :40].reshape(2, 3, 40),
    }


def check_rowwise(fn, inputs: dict | None = None) -> None:
    """q2: ``quantize_rowwise(x) -> (q, S)`` with S of shape ``(..., 1)``, on ``inputs`` ({label: bf16
    tensor}, default the lab's)."""
    n = _check_quantizer(fn, "row", "q2", "quantize_rowwise", inputs or _group_inputs())
    print(f"q2 passed: quantize_rowwise bit-identical to the reference on {n} elements, one scale per row")


def check_blocks(fn, inputs: dict | None = None, block_inputs: dict | None = None) -> None:
    """q3: ``quantize_blocks(x, block) -> (q, S)`` for ``block=(1, 128)`` (S of shape (..., cdiv(K, 128)))
    on ``inputs`` and ``block=(128, 128)`` (2-D x; S of shape (cdiv(M, 128), cdiv(K, 128))) on
    ``block_inputs`` (each {label: bf16 tensor}, default the lab's)."""
    groups = inputs or _group_inputs()
    n = _check_quantizer(fn, "1x128", "q3", "quantize_blocks(x, (1, 128))", groups, block=(1, 128))
    if block_inputs is None:
        x = lab_input()
        block_inputs = {"130x300 bf16": x, "127x129": x[:127, :129]}
    n += _check_quantizer(fn, "128x128", "q3", "quantize_blocks(x, (128, 128))", block_inputs, block=(128, 128))
    print(f"q3 passed: quantize_blocks bit-identical to the reference for 1x128 groups and 128x128 blocks on {n} "
          "elements (partial groups and edge blocks included)")  # fmt: skip


def check_mxfp8(fn, inputs: dict | None = None) -> None:
    """q4: ``quantize_mxfp8(x, rounding) -> (q, scale_e8m0)``, for rounding "floor" (OCP) and "up", on
    ``inputs`` ({label: bf16 tensor}, default the lab's)."""
    n = 0
    for rounding in ("floor", "up"):
        name = f"quantize_mxfp8(x, {rounding!r})"
        n += _check_quantizer(fn, "mxfp8", "q4", name, inputs or _group_inputs(), rounding=rounding)
    print(f"q4 passed: quantize_mxfp8 bit-identical to the reference (codes and E8M0 bytes) on {n} elements, "
          "for OCP's floor rule and for rounding up")  # fmt: skip


# -- q5: delayed scaling ------------------------------------------------------------------------------


def check_delayed_scaling(
    cls, history_len: int = 4, margin: int = 1, steady: float = 10.0, spike: float = 500.0
) -> None:
    """q5: ``cls(history_len, margin)`` with ``scale()`` (S, 0-d tensor), ``update(amax)`` and
    ``quantize(x) -> (q, S)``, step for step like :class:`kernels.quantize.DelayedScaling`.

    A history of ``history_len`` without margin sees ``update(steady)``, then a spike of ``spike`` (a
    bf16 value above 5 and ``steady``) quantized, then quiet steps until the spike leaves the window;
    a history of 2 with ``margin`` sees ``update(7)``."""
    question, dev = "q5", default_device()

    def make(**kw):
        return call_student(lambda: cls(**kw), name=f"{getattr(cls, '__name__', 'cls')}(**{kw})", question=question)

    def scale_of(h, when):
        s = call_student(h.scale, name="scale()", question=question)
        if not isinstance(s, torch.Tensor) or s.numel() != 1:
            raise AssertionError(f"{question}: scale() must return a one-element tensor (S), got {s!r} {when}")
        return float(s)

    def expect(got, want, when):
        if math.isclose(got, want, rel_tol=1e-6):
            return
        hint = ""
        if want and math.isclose(got, 1 / want, rel_tol=1e-5):
            hint = "S and alpha swapped: S = amax / 448, not 448 / amax"
        elif math.isnan(got) or math.isinf(got) or got == 0:
            hint = "an empty (all-zero) history must give S = 1, not a division by zero"
        raise AssertionError(
            f"{question}: scale() {when} is {got:.9g}, want {want:.9g}" + (f": {hint}" if hint else "")
        )

    h = make(history_len=history_len, margin=0)
    expect(scale_of(h, "on an empty history"), 1.0, "on an empty history")
    h.update(torch.tensor(steady, device=dev))
    expect(scale_of(h, f"after update({steady:g})"), steady / 448, f"after update({steady:g})")
    x = torch.tensor([[spike, 5.0, -1.0, 0.0]], dtype=torch.bfloat16, device=dev)
    out = call_student(h.quantize, x, name="quantize(x)", question=question)
    q, s = _unpack(out, question, "quantize(x)")
    got_s = float(s)
    if math.isclose(got_s, spike / 448, rel_tol=1e-6):
        raise AssertionError(
            f"{question}: quantize(x) used x's own amax (S = {spike:g}/448): that is current scaling; delayed "
            f"scaling casts with the scale from the history (amax {steady:g}) and only then records x's amax"
        )
    expect(got_s, steady / 448, f"returned by quantize(x) after update({steady:g})")
    codes = _codes(q)
    if (codes[0] & 0x7F) == 0x7F:
        raise AssertionError(
            f"{question}: the spike of {spike:g} became NaN: no saturation; clamp x * (1/S) to +-448 before the "
            f"cast, so it comes back as 448 * S = {steady:g}"
        )
    back = float(q.float()[0, 0]) * got_s
    if not math.isclose(back, steady, rel_tol=1e-6):
        raise AssertionError(
            f"{question}: the spike of {spike:g} came back as {back:.6g}; with S from amax {steady:g} it "
            f"saturates to {steady:g}"
        )
    after = scale_of(h, "after quantize(spike)")
    if math.isclose(after, steady / 448, rel_tol=1e-6):
        raise AssertionError(
            f"{question}: quantize(x) did not record x's amax: the next scale must see the spike of {spike:g}"
        )
    expect(after, spike / 448, f"after quantize(spike of {spike:g})")
    for i in range(history_len - 1):
        h.update(torch.tensor(1.0, device=dev))
        got = scale_of(h, f"after {i + 1} update(1)")
        if i < history_len - 2 and math.isclose(got, 1.0 / 448, rel_tol=1e-6):
            raise AssertionError(
                f"{question}: scale() after {i + 1} update(1) forgot the spike of {spike:g} still in the "
                f"{history_len}-step window: take the max over the whole history, not the newest amax"
            )
        expect(got, spike / 448, f"after {i + 1} update(1) ({spike:g} still in the window of {history_len})")
    h.update(torch.tensor(1.0, device=dev))
    got = scale_of(h, "after the spike left the window")
    if math.isclose(got, spike / 448, rel_tol=1e-6):
        raise AssertionError(
            f"{question}: the spike of {spike:g} never leaves the history: keep only the last history_len amaxes"
        )
    expect(got, 1.0 / 448, f"after the spike left the window of {history_len}")
    hm = make(history_len=2, margin=margin)
    hm.update(torch.tensor(7.0, device=dev))
    got = scale_of(hm, f"with margin={margin} after update(7)")
    if math.isclose(got, 7.0 / 2**margin / 448, rel_tol=1e-6):
        raise AssertionError(
            f"{question}: margin applied the wrong way: it adds headroom, S = amax * 2^margin / 448 (larger S)"
        )
    expect(got, 7.0 * 2**margin / 448, f"with margin={margin} after update(7)")
    print(
        f"{question} passed: the history lags by one step (the spike of {spike:g} came back as {back:.6g}, "
        "finite), is remembered for history_len steps, then forgotten; margin adds headroom"
    )


# -- q6: dequantization and who owns the scale in a GEMM ---------------------------------------------


def _dequant_smells(q, s, kind, g, w) -> list:
    qf = q.float().cpu()
    m, k, gm, gk = _groups_of(kind, tuple(q.shape))
    n_gk = -(-k // gk)

    def per_element(v):
        return Q.expand_scales(v.reshape(-1, n_gk), gm, gk, m, k).reshape(q.shape)

    s_el = per_element(_scale_values(s.cpu(), kind))
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    ok = ~nan_w
    lines = []
    smells = [
        (qf * s_el * s_el, "scale applied twice: S * S * q"),
        (qf / s_el, "S and alpha swapped: q / S; the value is S * q"),
    ]
    if kind == "mxfp8":
        smells.append((qf * per_element(s.cpu().float()), "the E8M0 byte used as the scale's value: S = 2^(c - 127)"))
    for produced, smell in smells:
        if torch.allclose(g[ok], produced[ok], rtol=1e-6, atol=0) and not torch.allclose(produced[ok], w[ok]):
            lines.append(smell)
    byte_255 = kind == "mxfp8" and bool((~nan_g & (per_element(s.cpu().float()) == 255)).any())
    if byte_255:
        lines.append(
            "E8M0 byte 255 is NaN, whatever the code: 255 << 23 is the bit pattern of inf, so give 255 the NaN "
            "pattern (0x7FC00000) explicitly"
        )
    if not lines and kind != "tensor" and torch.allclose(g[ok], (qf * s_el.reshape(-1)[0])[ok], rtol=1e-6):
        lines.append(f"one scale used for every group: each {kind} group has its own S")
    if not torch.equal(nan_g, nan_w) and not byte_255:
        lines.append("NaN codes must dequantize to NaN, and only they")
    if not lines:
        lines.append("no known smell recognised")
    bad = torch.nonzero((g != w) & ~(nan_g & nan_w))[:3].tolist()
    shown = ", ".join(f"{tuple(i)}: got {g[tuple(i)].item():.9g}, want {w[tuple(i)].item():.9g}" for i in bad)
    lines.append("first: " + shown)
    return lines


def random_e8m0_case(seed: int, shape: tuple) -> tuple:
    """MXFP8 ``(q, scale bytes)`` for a 2-D ``shape`` drawn from ``seed``: codes and E8M0 bytes uniform over
    all 256 values (both sets hold each value once at least: ``shape`` must give 256 codes and 256 blocks
    of 32), so the scale bytes include 0 (2^-127, an fp32 subnormal) and 255 (NaN)."""
    m, k = shape
    rng = np.random.default_rng(seed)

    def every_byte(n):
        if n < 256:
            raise ValueError(f"shape {shape} gives {n} < 256 values: not every byte fits")
        return torch.from_numpy(rng.permutation(np.concatenate([np.arange(256), rng.integers(0, 256, n - 256)])))

    q = every_byte(m * k).to(torch.uint8).reshape(m, k).view(torch.float8_e4m3fn)
    s = every_byte(m * -(-k // 32)).to(torch.uint8).reshape(m, -(-k // 32))
    return q.to(default_device()), s.to(default_device())


def check_dequantize(fn, x: torch.Tensor | None = None, e8m0: tuple | None = None) -> None:
    """q6: ``dequantize(q, S, granularity) -> fp32`` equal to :func:`kernels.quantize.dequantize_reference`
    for every granularity (NaN positions equal, other bits equal), on the codes and scales of ``x``
    (default :func:`lab_input`); then, if given, on the MXFP8 ``e8m0 = (q, scale bytes)``."""
    question, x = "q6", lab_input() if x is None else x
    cases = [(kind, *_reference(x, kind)) for kind in Q.GRANULARITIES]
    if e8m0 is not None:
        cases.append(("mxfp8", *e8m0))
    n = 0
    for kind, q, s in cases:
        got = call_student(fn, q, s, kind, name=f"dequantize(q, S, {kind!r})", question=question)
        want = Q.dequantize_reference(q, s, kind)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.float32:
            raise AssertionError(
                f"{question}: dequantize(..., {kind!r}) must return fp32 of shape {tuple(want.shape)}, got "
                f"{getattr(got, 'dtype', type_name(got))} {tuple(getattr(got, 'shape', ()))}"
            )
        g, w = got.cpu(), want.cpu()
        nan_g, nan_w = torch.isnan(g), torch.isnan(w)
        same = torch.equal(nan_g, nan_w) and torch.equal(g[~nan_g].view(torch.int32), w[~nan_w].view(torch.int32))
        if same:
            n += g.numel()
            continue
        raise AssertionError(
            f"{question}: dequantize(q, S, {kind!r}) is wrong:\n"
            + "\n".join(f"  - {p}" for p in _dequant_smells(q, s, kind, g, w))
        )
    more = "" if e8m0 is None else ", and for E8M0 scale bytes of every value"
    print(f"{question} passed: dequantize bit-identical to S * q for all five granularities{more} ({n} elements)")


def matmul_inputs(seed: int = 1):
    """A (64, 384) activation in 1x128 groups and a (96, 384) weight in 128x128 blocks whose scales
    differ by orders of magnitude from one K block to the next."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 384, generator=g) * torch.tensor([1e-2, 1.0, 1e2]).repeat_interleave(128)
    w = torch.randn(96, 384, generator=g) * torch.tensor([1e2, 1e-1, 1.0]).repeat_interleave(128)
    dev = default_device()
    aq, as_ = Q.quantize_1x128_reference(a.to(torch.bfloat16).to(dev))
    wq, ws = Q.quantize_128x128_reference(w.to(torch.bfloat16).to(dev))
    return aq, as_, wq, ws


def fresh_matmul_inputs(seed: int, m: int, n: int, k: int):
    """Like :func:`matmul_inputs`, for an (m, k) activation and an (n, k) weight drawn from ``seed``: each K
    block of the activation, and each 128x128 block of the weight, has its own magnitude, from 1e-2 to 1e2,
    so that the weight's scales differ from one block row to the next as well as along K."""
    g = torch.Generator().manual_seed(seed)
    nb_k, nb_n = -(-k // 128), -(-n // 128)
    a_mag = 10.0 ** (torch.rand(nb_k, generator=g) * 4 - 2)
    w_mag = 10.0 ** (torch.rand(nb_n, nb_k, generator=g) * 4 - 2)
    a = torch.randn(m, k, generator=g) * a_mag.repeat_interleave(128)[:k]
    w = torch.randn(n, k, generator=g) * w_mag.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    dev = default_device()
    aq, as_ = Q.quantize_1x128_reference(a.to(torch.bfloat16).to(dev))
    wq, ws = Q.quantize_128x128_reference(w.to(torch.bfloat16).to(dev))
    return aq, as_, wq, ws


def block_scaled_matmul_reference(aq, a_s, wq, w_s) -> torch.Tensor:
    """``y[i, j] = sum_b a_s[i, b] * w_s[j // 128, b] * sum_{k in block b} aq[i, k] * wq[j, k]`` in float64."""
    a = aq.double().cpu() * Q.expand_scales(a_s.double().cpu(), 1, 128, *aq.shape)
    w = wq.double().cpu() * Q.expand_scales(w_s.double().cpu(), 128, 128, *wq.shape)
    return a @ w.T


def _near(y: torch.Tensor, produced: torch.Tensor) -> bool:
    """y is what ``produced`` gives, up to fp32 rounding of sums of a few hundred products."""
    return bool(((y - produced).abs() <= 1e-4 * produced.abs().max()).all())


def check_block_scaled_matmul(fn, inputs: tuple | None = None) -> None:
    """q6: ``fn(aq, a_s, wq, w_s) -> y (M, N)``: a GEMM whose scales change along K keeps them inside the
    K sum; compared with a float64 reference within 1e-5 of sum |a||w| per output, on ``inputs`` (default
    :func:`matmul_inputs`)."""
    question = "q6"
    aq, a_s, wq, w_s = inputs if inputs is not None else matmul_inputs()
    y = call_student(fn, aq, a_s, wq, w_s, name="block_scaled_matmul", question=question)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (aq.shape[0], wq.shape[0]):
        raise AssertionError(
            f"{question}: block_scaled_matmul must return a ({aq.shape[0]}, {wq.shape[0]}) tensor, got "
            f"{getattr(y, 'shape', y)}"
        )
    want = block_scaled_matmul_reference(aq, a_s, wq, w_s)
    a_abs = aq.double().cpu().abs() * Q.expand_scales(a_s.double().cpu(), 1, 128, *aq.shape)
    w_abs = wq.double().cpu().abs() * Q.expand_scales(w_s.double().cpu(), 128, 128, *wq.shape)
    bound = 1e-5 * (a_abs @ w_abs.T)
    err = (y.double().cpu() - want).abs()
    if (err <= bound).all():
        print(f"{question} passed: block_scaled_matmul within 1e-5 of sum|a||w| of the float64 reference "
              f"(max error {float((err / bound.clamp_min(1e-300)).max()) * 1e-5:.2g} of sum|a||w|)")  # fmt: skip
        return
    qa, qw = aq.double().cpu(), wq.double().cpu()
    lines = []
    outside = (
        (qa @ qw.T) * a_s.double().cpu()[:, :1] * w_s.double().cpu()[:, :1].repeat_interleave(128, 0)[: qw.shape[0]].T
    )
    mean_out = (
        (qa @ qw.T)
        * a_s.double().cpu().mean(1, keepdim=True)
        * (w_s.double().cpu().mean(1).repeat_interleave(128)[: qw.shape[0]][None, :])
    )
    yd = y.double().cpu()
    for produced in (outside, mean_out):
        if _near(yd, produced):
            lines.append(
                "block scale pulled out of the K sum: scales that change along K must multiply each block's partial "
                "sum, y = sum_b a_s[:, b] * w_s[:, b] * (aq_b @ wq_b^T), not (aq @ wq^T) * one scale"
            )
            break
    if not lines:
        sq = (qa * Q.expand_scales(a_s.double().cpu() ** 2, 1, 128, *aq.shape)) @ (
            qw * Q.expand_scales(w_s.double().cpu() ** 2, 128, 128, *wq.shape)
        ).T
        if _near(yd, sq):
            lines.append("scale applied twice: each operand multiplied by S^2")
        inv = (qa / Q.expand_scales(a_s.double().cpu(), 1, 128, *aq.shape)) @ (
            qw / Q.expand_scales(w_s.double().cpu(), 128, 128, *wq.shape)
        ).T
        if _near(yd, inv):
            lines.append("S and alpha swapped: the codes were divided by S; the values are S * q")
    if not lines:
        lines.append("no known smell recognised")
    i, j = np.unravel_index(int(torch.argmax(err / bound)), tuple(err.shape))
    lines.append(f"worst: y[{i},{j}] = {yd[i, j].item():.9g}, want {want[i, j].item():.9g}")
    raise AssertionError(f"{question}: block_scaled_matmul is wrong:\n" + "\n".join(f"  - {p}" for p in lines))


def check_dequantization(dequantize, block_scaled_matmul) -> None:
    """q6: both halves of the consumer side: :func:`check_dequantize` and :func:`check_block_scaled_matmul`."""
    check_dequantize(dequantize)
    check_block_scaled_matmul(block_scaled_matmul)


# -- the final comparison with the package ----------------------------------------------------------


def check_same_as_package(fns: dict) -> None:
    """Each of the student's quantizers, keyed by granularity ("tensor", "row", "1x128", "128x128",
    "mxfp8"), gives the same bits as the package's *kernel* on a larger bf16 input."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(256, 1000, generator=g) * 3).to(torch.bfloat16).to(default_device())
    x[17, 999] = 5e3
    x[100] = 0.0
    done = []
    for kind, fn in fns.items():
        if kind not in Q.GRANULARITIES:
            raise ValueError(f"fns keys must be among {list(Q.GRANULARITIES)}, got {kind!r}")
        got = _unpack(call_student(fn, x, name=f"your {kind} quantizer", question="final check"), "final check", kind)
        want = Q.quantize(x, kind)
        for a, b, what in ((got[0], want.q, "codes"), (got[1], want.s, "scales")):
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(_raw(a), _raw(b)):
                raise AssertionError(f"final check: your {kind} quantizer's {what} differ from kernels.quantize's")
        done.append(kind)
    print(f"same bits as kernels.quantize (codes and scales) for: {', '.join(done)} on a 256x1000 bf16 input")


__all__ = [
    "block_scaled_matmul_reference",
    "check_blocks",
    "check_block_scaled_matmul",
    "check_delayed_scaling",
    "check_dequantization",
    "check_dequantize",
    "check_mxfp8",
    "check_per_tensor",
    "check_rowwise",
    "check_same_as_package",
    "diagnose",
    "fresh_input",
    "fresh_matmul_inputs",
    "lab_input",
    "matmul_inputs",
    "random_e8m0_case",
]
