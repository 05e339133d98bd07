"""Lab 7's checks (q1-q3: INT8) pass the right answers and catch each wrong one with the right diagnosis.

The quantizer and the GEMM are Triton kernels in the lab, so the wrong ones here are Triton kernels too,
each with one switch away from a right kernel (``quantize_variant``, ``w8a8_variant``); SmoothQuant is
plain PyTorch.  Every wrong solution must get the diagnosis that names its mistake and no other's.
"""

import math
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import _hopper_math, int8
from kernels.checks import ExerciseNotDone, lab07, passes
from kernels.device import default_device

ROOT = Path(__file__).resolve().parents[1]
DEVICE = default_device()

# -- q1: an INT8 quantizer kernel with a switch for each mistake ------------------------------------------

RNE = tl.constexpr(0)  # roundings
TOWARD_ZERO = tl.constexpr(1)
HALF_UP = tl.constexpr(2)
HALF_AWAY = tl.constexpr(3)
DIV_RN = tl.constexpr(0)  # how x / S is computed
SLASH = tl.constexpr(1)
RECIPROCAL_RN = tl.constexpr(2)


@triton.jit
def _quantize_variant_kernel(
    x_ptr, q_ptr, s_ptr, K, K_STOP, STATIC: tl.constexpr, QDIV: tl.constexpr, SCALE_SLASH: tl.constexpr,
    ZERO_GUARD: tl.constexpr, DIVISION: tl.constexpr, ROUNDING: tl.constexpr, CLAMP: tl.constexpr,
    LO: tl.constexpr, STORE_CODES: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # One program per row: the row's amax (first walk), S, then the codes (second walk).  The loops stop
    # at K_STOP (K, unless a variant leaves columns out); K is the row stride.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    if STATIC:
        s = tl.load(s_ptr)
    else:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K_STOP, BLOCK_K):
            x = tl.load(x_ptr + row * K + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        m = tl.max(amax, axis=0)
        if SCALE_SLASH:
            s = m / QDIV
        else:
            s = tl.math.div_rn(m, QDIV)
        if ZERO_GUARD:
            s = tl.where(m > 0, s, 1.0)
        tl.store(s_ptr + row, s)
    if STORE_CODES:
        for k0 in range(0, K_STOP, BLOCK_K):
            mask = k0 + cols < K
            x = tl.load(x_ptr + row * K + k0 + cols, mask=mask, other=0.0).to(tl.float32)
            if DIVISION == SLASH:
                y = x / s
            elif DIVISION == RECIPROCAL_RN:
                y = x * tl.math.div_rn(1.0, s)
            else:
                y = tl.math.div_rn(x, s)
            if CLAMP:
                y = tl.minimum(tl.maximum(y, LO), 127.0)
            if ROUNDING == TOWARD_ZERO:
                r = y  # the conversion below truncates
            elif ROUNDING == HALF_UP:
                r = tl.floor(y + 0.5)
            elif ROUNDING == HALF_AWAY:
                r = tl.where(y < 0, -tl.floor(0.5 - y), tl.floor(y + 0.5))
            else:
                r = (y + 12582912.0) - 12582912.0  # 1.5 * 2^23: rounds to nearest, ties to even
            tl.store(q_ptr + row * K + k0 + cols, r.to(tl.int8), mask=mask)


def quantize_variant(
    x, s=None, *, qdiv=127.0, scale_slash=False, zero_guard=True, division=0, rounding=0, clamp=True, lo=-127.0,
    per_tensor=False, ignore_static=False, s_out=None, codes_dtype=torch.int8, store_codes=True, k_stop=None,
):  # fmt: skip
    """q1 by the recipe, one switch per mistake."""
    x = x.contiguous()
    m, k = x.shape
    q = torch.zeros((m, k), dtype=codes_dtype, device=x.device)
    static = s is not None and not ignore_static
    if per_tensor and s is None:  # S from the whole tensor's amax, used as a static scale
        amax = x.float().abs().amax()
        s_used = torch.where(amax > 0, amax / torch.full_like(amax, 127.0), torch.ones_like(amax))
        scale = s_used.expand(m, 1).contiguous()
        static = True
    else:
        s_used = s if static else None
        scale = torch.ones((m, 1), dtype=torch.float32, device=x.device)
    _quantize_variant_kernel[(m,)](
        x, q, s_used if static else scale, k, k if k_stop is None else min(k, k_stop), STATIC=static, QDIV=qdiv,
        SCALE_SLASH=scale_slash, ZERO_GUARD=zero_guard, DIVISION=division, ROUNDING=rounding, CLAMP=clamp, LO=lo,
        STORE_CODES=store_codes, BLOCK_K=32 if k_stop is None else 128,
    )  # fmt: skip
    if s is not None:
        return q, s
    if s_out == "flat":
        scale = scale.reshape(-1)
    elif s_out == "bf16":
        scale = scale.to(torch.bfloat16)
    return q, scale


# -- q2: a W8A8 GEMM kernel with a switch for each mistake ------------------------------------------------

INT32_ACC, INT16_ACC, INT8_ACC, FP16_ACC = (tl.constexpr(i) for i in range(4))
BOTH, NO_A, NO_B, NEITHER, DIVIDED, TRANSPOSED = (tl.constexpr(i) for i in range(6))
B_NK, B_KN, B_UNTRANSPOSED = (tl.constexpr(i) for i in range(3))


@triton.jit
def _w8a8_variant_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, ACC: tl.constexpr, SCALES: tl.constexpr,
    B_LAYOUT: tl.constexpr, TAIL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if ACC == INT16_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int16)
    elif ACC == INT8_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int8)
    elif ACC == FP16_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    if TAIL:
        k_end = K
    else:
        k_end = K - BLOCK_K + 1  # whole tiles only
    for k0 in range(0, k_end, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0)
        if B_LAYOUT == B_KN:  # b's memory read as a (K, N) matrix
            b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0)
            acc += tl.dot(a, b).to(acc.dtype)
        else:
            b = tl.load(b_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0)
            if B_LAYOUT == B_UNTRANSPOSED:
                acc += tl.dot(a, b).to(acc.dtype)
            elif ACC == FP16_ACC:
                acc = tl.dot(a.to(tl.float16), tl.trans(b).to(tl.float16), acc, out_dtype=tl.float16)
            else:
                acc += tl.dot(a, tl.trans(b)).to(acc.dtype)
    c = acc.to(tl.float32)
    if SCALES == TRANSPOSED:
        c = (
            c
            * tl.load(sa_ptr + rn, mask=rn < N, other=0.0)[None, :]
            * tl.load(sb_ptr + rm, mask=rm < M, other=0.0)[:, None]
        )
    else:
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
        if SCALES == BOTH:
            c = c * sa[:, None] * sb[None, :]
        elif SCALES == NO_A:
            c = c * sb[None, :]
        elif SCALES == NO_B:
            c = c * sa[:, None]
        elif SCALES == DIVIDED:
            c = c / sa[:, None] / sb[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c.to(c_ptr.dtype.element_ty), mask=mask)


def w8a8_variant(
    a, b, a_scale, b_scale, *, acc=0, scales=0, b_layout=0, tail=True, out_dtype=torch.bfloat16, row_tiles=None,
    block_m=16,
):  # fmt: skip
    """q2 by the recipe (16 x 16 tiles, K in steps of 32), one switch per mistake."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.zeros((m, n), dtype=out_dtype, device=a.device)
    grid = (triton.cdiv(m, block_m) if row_tiles is None else row_tiles, triton.cdiv(n, 16))
    _w8a8_variant_kernel[grid](
        a.contiguous(), b.contiguous(), c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, ACC=acc,
        SCALES=scales, B_LAYOUT=b_layout, TAIL=tail, BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=32,
    )  # fmt: skip
    return c


# -- q3: SmoothQuant, with a switch for each mistake ------------------------------------------------------


def smooth_variant(
    x, w, act_amax, alpha=0.5, *, swap_alpha=False, reverse=False, w_axis=0, rows=False, clamp=True,
    fixed_alpha=None, own_amax=False,
):  # fmt: skip
    al = alpha if fixed_alpha is None else fixed_alpha
    a = x.abs().amax(dim=0) if own_amax else act_amax.float()
    wm = w.abs().amax(dim=w_axis)
    if clamp:
        a, wm = a.clamp(min=1e-5), wm.clamp(min=1e-5)
    p = 1 - al if swap_alpha else al
    s = a.pow(p) / wm.pow(1 - p)
    if clamp:
        s = s.clamp(min=1e-5)
    if reverse:
        return x * s, w / s
    if rows:
        return x / s[:, None], w * s
    return x / s, w * s


WRONG_SOLUTIONS = {
    "q1": {
        "S = amax / 128": lambda x, s=None: quantize_variant(x, s, qdiv=128.0),
        "S = amax / 255": lambda x, s=None: quantize_variant(x, s, qdiv=255.0),
        "S with Triton's `/`": lambda x, s=None: quantize_variant(x, s, scale_slash=True),
        "all-zero row: S = 0": lambda x, s=None: quantize_variant(x, s, zero_guard=False),
        "one scale for the tensor": lambda x, s=None: quantize_variant(x, s, per_tensor=True),
        "truncation (the int8 conversion alone)": lambda x, s=None: quantize_variant(x, s, rounding=1),
        "ties up, floor(y + 0.5)": lambda x, s=None: quantize_variant(x, s, rounding=2),
        "ties away from zero": lambda x, s=None: quantize_variant(x, s, rounding=3),
        "codes with Triton's `/`": lambda x, s=None: quantize_variant(x, s, division=1),
        "codes with x * (1 / S)": lambda x, s=None: quantize_variant(x, s, division=2),
        "no clamp": lambda x, s=None: quantize_variant(x, s, clamp=False),
        "clamp to [-128, 127]": lambda x, s=None: quantize_variant(x, s, lo=-128.0),
        "the static scale ignored": lambda x, s=None: quantize_variant(x, s, ignore_static=True),
        "s of shape (rows,)": lambda x, s=None: quantize_variant(x, s, s_out="flat"),
        "s in bf16": lambda x, s=None: quantize_variant(x, s, s_out="bf16"),
        "codes stored as int32": lambda x, s=None: quantize_variant(x, s, codes_dtype=torch.int32),
        "codes never stored": lambda x, s=None: quantize_variant(x, s, store_codes=False),
    },
    "q2": {
        "a_scale left out": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, scales=NO_A),
        "b_scale left out": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, scales=NO_B),
        "both scales left out": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, scales=NEITHER),
        "scales divided": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, scales=DIVIDED),
        "scales transposed": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, scales=TRANSPOSED),
        "int16 accumulator": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, acc=INT16_ACC),
        "int8 accumulator": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, acc=INT8_ACC),
        "fp16 accumulator": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, acc=FP16_ACC),
        "b read as (K, N)": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, b_layout=B_KN),
        "b untransposed in tl.dot": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, b_layout=B_UNTRANSPOSED),
        "K tail dropped": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, tail=False),
        "fp32 output": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb, out_dtype=torch.float32),
    },
    "q3": {
        "alpha and 1 - alpha swapped": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, swap_alpha=True),
        "x multiplied, w divided": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, reverse=True),
        "max |W| per output row": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, w_axis=1),
        "s applied to the rows of x": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, rows=True),
        "no clamp at zero channels": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, clamp=False),
        "alpha ignored": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha, fixed_alpha=0.5),
        "w left unscaled": lambda x, w, am, alpha=0.5: (smooth_variant(x, w, am, alpha)[0], w),
    },
}

EXPECTED = {
    "q1": {
        "S = amax / 128": "S = amax / 128",
        "S = amax / 255": "S = amax / 255",
        "S with Triton's `/`": "scale is not correctly rounded",
        "all-zero row: S = 0": "all-zero row divides by zero",
        "one scale for the tensor": "one scale for the whole tensor",
        "truncation (the int8 conversion alone)": "rounded toward zero",
        "ties up, floor(y + 0.5)": "ties rounded up",
        "ties away from zero": "ties rounded away from zero",
        "codes with Triton's `/`": "division x / S is not correctly rounded",
        "codes with x * (1 / S)": "division x / S is not correctly rounded",
        "no clamp": "no saturation",
        "clamp to [-128, 127]": "-128 produced",
        "the static scale ignored": "static scale s is ignored",
        "s of shape (rows,)": "a column, so that s * q",
        "s in bf16": "s must be float32",
        "codes stored as int32": "codes not int8",
        "codes never stored": "whatever the input",
    },
    "q2": {
        "a_scale left out": "a_scale left out",
        "b_scale left out": "b_scale left out",
        "both scales left out": "both scales left out",
        "scales divided": "scales divided instead of multiplied",
        "scales transposed": "scales transposed",
        "int16 accumulator": "wrapped around at 2^15",
        "int8 accumulator": "wrapped around at 2^7",
        "fp16 accumulator": "an fp16 accumulator",
        "b read as (K, N)": "b read as a (K, N) matrix",
        "b untransposed in tl.dot": "multiply by its transpose",
        "K tail dropped": "the K tail is dropped",
        "fp32 output": "must return bfloat16",
    },
    "q3": {
        "alpha and 1 - alpha swapped": "alpha and 1 - alpha swapped",
        "x multiplied, w divided": "migration reversed",
        "max |W| per output row": "max |W| taken over the wrong axis",
        "s applied to the rows of x": "s applied to the rows of x",
        "no clamp at zero channels": "clamp both to at least 1e-5",
        "alpha ignored": "alpha ignored",
        "w left unscaled": "x_smooth @ w_smooth^T is not x @ w^T",
    },
}

CHECKS = {"q1": lab07.check_quantize, "q2": lab07.check_w8a8, "q3": lab07.check_smooth_quant}

RIGHT = {
    "q1": lambda x, s=None: quantize_variant(x, s),
    "q2": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb),
    "q3": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha),
}

PACKAGE = {
    "q1": lambda x, s=None: int8.quantize_int8(x) if s is None else (int8.quantize_int8_with_scale(x, s), s),
    "q2": lambda a, b, sa, sb: int8.w8a8_matmul(a, b, sa, sb),
    "q3": lambda x, w, am, alpha=0.5: int8.smooth(x, w, int8.smoothquant_scales(am, w, alpha)),
}


def test_every_question_has_wrong_solutions_with_expectations():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == set(EXPECTED) == set(RIGHT) == set(PACKAGE)
    for q, wrong in WRONG_SOLUTIONS.items():
        assert wrong and set(wrong) == set(EXPECTED[q])


@pytest.mark.parametrize("q", list(CHECKS))
def test_right_solutions_pass(q, capsys):
    CHECKS[q](RIGHT[q])
    assert f"{q} passed" in capsys.readouterr().out


@pytest.mark.parametrize("q", list(CHECKS))
def test_package_kernels_pass(q, capsys):
    CHECKS[q](PACKAGE[q])
    assert f"{q} passed" in capsys.readouterr().out


@pytest.mark.parametrize("q,name", [(q, n) for q, wrong in WRONG_SOLUTIONS.items() for n in wrong])
def test_wrong_solution_is_caught_with_its_diagnosis(q, name):
    with pytest.raises(AssertionError) as info:
        CHECKS[q](WRONG_SOLUTIONS[q][name])
    assert not isinstance(info.value, ExerciseNotDone)
    message = str(info.value)
    assert message.startswith(f"{q}: ")
    assert EXPECTED[q][name] in message, f"{q} / {name}: got\n{message}"
    others = {e for n, e in EXPECTED[q].items() if e != EXPECTED[q][name]}
    assert not any(o in message for o in others), f"{q} / {name}: a diagnosis of another mistake too:\n{message}"


@pytest.mark.parametrize("q", list(CHECKS))
def test_unfinished_exercise_reads_as_not_done(q):
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(ExerciseNotDone, match="not done yet"):
        CHECKS[q](stub)
    with pytest.raises(ExerciseNotDone):
        CHECKS[q](lambda *args: None)
    assert not passes(CHECKS[q], stub)


def test_a_quantizer_with_two_mistakes_gets_both_diagnoses():
    with pytest.raises(AssertionError) as info:
        lab07.check_quantize(lambda x, s=None: quantize_variant(x, s, rounding=1, division=1, clamp=False))
    message = str(info.value)
    assert "rounded toward zero" in message and "division x / S is not correctly rounded" in message
    assert "no saturation" in message


def test_quantizer_inputs_are_fixed_and_adversarial():
    a, b = lab07.quantizer_inputs(), lab07.quantizer_inputs()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ties = a["exact ties under powers of two"]
    _, s = int8.quantize_int8_reference(ties)
    assert bool((torch.log2(s) == torch.round(torch.log2(s))).all())  # S = 2^p
    y = ties / s
    assert bool((y - torch.floor(y) == 0.5).float().mean() > 0.9)  # exact ties, both parities, both signs
    assert {int(v) % 2 for v in torch.floor(y[(y - torch.floor(y)) == 0.5])} == {0, 1} and bool((y < -100).any())
    # Near ties under a scale that is no power of two: the input that tells an approximate division apart.
    near = a["near ties, S no power of two"]
    _, s = int8.quantize_int8_reference(near)
    slash = torch.from_numpy(_hopper_math.div(near.numpy(), s.numpy()))
    assert not torch.equal(torch.round(slash), torch.round(near / s))
    special = a["zero rows, negative zeros, an outlier"]
    amax = special.abs().amax(dim=1)
    assert int((amax == 0).sum()) == 2 and bool(torch.signbit(special[special == 0]).any())
    assert a["bf16 activations with outlier channels"].dtype == torch.bfloat16
    for label, x in a.items():  # the static case saturates some values of every input, both signs
        y = x.float() / lab07.static_scale(x)
        assert bool((y > 127.5).any()) and bool((y < -127.5).any()), label


def test_gemm_inputs_overflow_narrow_accumulators_and_have_k_tails():
    for label, case in lab07.gemm_inputs().items():
        k = case["a"].shape[1]
        assert k % 64, label
        acc = case["a"].long() @ case["b"].long().T
        if k == 2000:
            assert int(acc.abs().max()) == 2000 * 127**2 > 65504  # fp16's largest finite value
            assert int(acc.abs().max()) < 2**31


def test_the_gemm_bound_catches_a_second_bf16_rounding():
    """Rounding the int32 sum to bf16 before the scales (two bf16 roundings) exceeds the bound somewhere:
    the bound is no looser than the contract."""

    def bf16_before_scales(a, b, sa, sb):
        acc = (a.long() @ b.long().T).to(torch.bfloat16).float()
        return (acc * sa * sb.T).to(torch.bfloat16)

    with pytest.raises(AssertionError, match="bound 2\\^-8"):
        lab07.check_w8a8(bf16_before_scales)


def test_smooth_inputs_show_the_w8a8_error_dropping(capsys):
    lab07.check_smooth_quant(RIGHT["q3"])
    out = capsys.readouterr().out
    before, after = (float(v) for v in out.split("at alpha 0.5: ")[1].replace(" after", "").split(" before, "))
    assert after < 0.5 * before


# -- right solutions, written the ways different students write them ---------------------------------------
# Each differs from the others (and from the variant kernels above) where compiled Triton and CPU mode
# could disagree: one program per row or a tile of rows, scales on the host or on the device, rounding
# by 1.5 * 2^23, by 2^23 on |y| or by floor and a parity test; GEMM tiles, grid orders and epilogues.


@triton.jit
def _rows_two_walks_kernel(x_ptr, q_ptr, s_ptr, K, STATIC: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    if STATIC:
        s = tl.load(s_ptr)
    else:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(x_ptr + row * K + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        m = tl.max(amax, axis=0)
        s = tl.where(m > 0, tl.math.div_rn(m, 127.0), 1.0)
        tl.store(s_ptr + row, s)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        v = tl.load(x_ptr + row * K + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.clamp(tl.math.div_rn(v, s), -127.0, 127.0)
        tl.store(q_ptr + row * K + k0 + offs, ((y + 12582912.0) - 12582912.0).to(tl.int8), mask=mask)


def quantize_rows_two_walks(x, s=None):
    """q1 with one program per row, walking the row twice in steps of 32 (amax, then codes), rounding
    by adding and subtracting 1.5 * 2^23."""
    x = x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device) if s is None else s
    _rows_two_walks_kernel[(m,)](x, q, scale, k, STATIC=s is not None, BLOCK_K=32)
    return q, scale


@triton.jit
def _row_tile_kernel(x_ptr, q_ptr, s_ptr, M, K, STATIC: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    offs = rows[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (ROWS, BLOCK_K): whole rows
    if STATIC:
        s = tl.load(s_ptr + tl.zeros([ROWS], dtype=tl.int32))
    else:
        amax = tl.max(tl.abs(x), axis=1)  # (ROWS,)
        s = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, tl.full([ROWS], 127.0, tl.float32)))
        tl.store(s_ptr + rows, s, mask=rows < M)
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, s[:, None]), -127.0), 127.0)
    f = tl.floor(y)
    d = y - f  # exact: y and floor(y) share their exponent's ulp
    odd = f - 2.0 * tl.floor(f * 0.5) != 0.0
    r = f + ((d > 0.5) | ((d == 0.5) & odd)).to(tl.float32)
    tl.store(q_ptr + offs, r.to(tl.int8), mask=mask)


def quantize_row_tiles(x, s=None):
    """q1 with a 2-D tile of 4 whole rows per program (BLOCK_K the next power of two above K), the
    amax a tl.max along the rows, rounding by floor plus a test of the fraction and the parity."""
    x = x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device) if s is None else s
    _row_tile_kernel[(triton.cdiv(m, 4),)](
        x, q, scale, m, k, STATIC=s is not None, ROWS=4, BLOCK_K=triton.next_power_of_2(k)
    )
    return q, scale


@triton.jit
def _codes_flat_kernel(x_ptr, s_ptr, q_ptr, n, K, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + i // K, mask=mask, other=1.0)
    y = tl.math.div_rn(x, s)
    mag = (tl.minimum(tl.abs(y), 127.0) + 8388608.0) - 8388608.0  # 2^23: |y| to the nearest integer, ties even
    tl.store(q_ptr + i, tl.where(y < 0, -mag, mag).to(tl.int8), mask=mask)


def quantize_host_amax(x, s=None):
    """q1 with the row amax and S in torch (a tensor division, correctly rounded on CPU and GPU), the
    codes in a kernel over the flat matrix, 256 elements per program, rounding |y| by 2^23."""
    x = x.contiguous()
    m, k = x.shape
    if s is None:
        amax = x.float().abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / torch.full_like(amax, 127.0), torch.ones_like(amax))
    else:
        scale = s.reshape(1, 1).expand(m, 1).contiguous()
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    _codes_flat_kernel[(triton.cdiv(m * k, 256),)](x, scale, q, m * k, k, BLOCK=256)
    return q, (scale if s is None else s)


@triton.jit
def _w8a8_grid2d_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0)
        b = tl.load(b_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0)
        acc += tl.dot(a, tl.trans(b))  # int8 x int8 -> int32
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
    c = acc.to(tl.float32) * sa[:, None] * sb[None, :]
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def w8a8_grid2d(a, b, a_scale, b_scale):
    """q2 on a 2-D grid of 16 x 32 tiles, K in steps of 32 with masked loads, acc += tl.dot(...)."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    _w8a8_grid2d_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 32))](
        a, b, c, a_scale, b_scale, m, n, k, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32
    )
    return c


@triton.jit
def _w8a8_n_major_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % tiles_m  # consecutive programs share a tile of b (a weight's output channels)
    pid_n = pid // tiles_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] + rn[None, :].to(tl.int64) * K  # (BLOCK_K, BLOCK_N): b^T's tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0)
        bt = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0)
        acc = tl.dot(a, bt, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    scale = (
        tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None] * tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    )
    tl.store(
        c_ptr + rm[:, None] * N + rn[None, :], (acc.to(tl.float32) * scale).to(tl.bfloat16),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )  # fmt: skip


def w8a8_n_major(a, b, a_scale, b_scale):
    """q2 on a 1-D grid walking M fastest, 32 x 16 tiles, K in steps of 64 with advanced pointers, b^T's
    tile loaded directly, the two scales multiplied together first (fl(S_a S_b) then one product)."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 32) * triton.cdiv(n, 16),)
    _w8a8_n_major_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, BLOCK_M=32, BLOCK_N=16, BLOCK_K=64)
    return c


def smooth_one_liner(x, w, act_amax, alpha=0.5):
    """q3 in three lines, torch.maximum for the clamps."""
    floor = torch.tensor(1e-5, device=x.device)
    s = torch.maximum(
        torch.maximum(act_amax, floor) ** alpha / torch.maximum(w.abs().amax(0), floor) ** (1 - alpha), floor
    )
    return x / s, w * s


def smooth_channel_loop(x, w, act_amax, alpha=0.5):
    """q3 one input channel at a time, s_j in Python floats (float64, rounded to fp32 once)."""
    xs, ws = x.clone(), w.clone()
    for j in range(x.shape[1]):
        a = max(float(act_amax[j]), 1e-5)
        m = max(float(w[:, j].abs().max()), 1e-5)
        s = max(a**alpha / m ** (1 - alpha), 1e-5)
        xs[:, j] = x[:, j] / s
        ws[:, j] = w[:, j] * s
    return xs, ws


def smooth_exp_log(x, w, act_amax, alpha=0.5):
    """q3 through logarithms: s = exp(alpha log a - (1 - alpha) log m)."""
    log_s = alpha * torch.log(act_amax.clamp(min=1e-5)) - (1 - alpha) * torch.log(w.abs().amax(0).clamp(min=1e-5))
    s = torch.exp(log_s).clamp(min=1e-5)
    return x / s[None, :], w * s[None, :]


STUDENT_SOLUTIONS = {
    "q1": {
        "one program per row, two walks of 32, rounding by 1.5 * 2^23": quantize_rows_two_walks,
        "tiles of 4 whole rows, floor plus a parity test": quantize_row_tiles,
        "amax and S in torch on the host, a flat codes kernel, |y| rounded by 2^23": quantize_host_amax,
    },
    "q2": {
        "2-D grid of 16 x 32 tiles, acc += tl.dot": w8a8_grid2d,
        "1-D grid M fastest, 32 x 16 x 64, advanced pointers, S_a S_b first": w8a8_n_major,
    },
    "q3": {
        "torch one-liner with torch.maximum": smooth_one_liner,
        "a Python loop over the input channels": smooth_channel_loop,
        "exp and log": smooth_exp_log,
    },
}


@pytest.mark.parametrize(
    "question, name", [(q, name) for q, right in STUDENT_SOLUTIONS.items() for name in right], ids=str
)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


@pytest.mark.parametrize("name", list(STUDENT_SOLUTIONS["q1"]))
def test_student_quantizers_give_the_package_bits(name):
    g = torch.Generator().manual_seed(70)
    x = (torch.randn(20, 200, generator=g) * 3).to(DEVICE)
    x[4, 17] = 900.0
    q, s = STUDENT_SOLUTIONS["q1"][name](x)
    ref_q, ref_s = int8.quantize_int8(x)
    assert torch.equal(q.cpu(), ref_q.cpu()) and torch.equal(s.cpu(), ref_s.cpu())


# -- wrong solutions the public tests pass and the hidden tests catch -------------------------------------


def quantize_one_tile_of_128(x, s=None):
    """One tile of 128 columns per row, no loop over K (the public K is at most 100): the columns past
    128 keep the zeros q was allocated with, and the row's amax comes from its first 128 columns."""
    return quantize_variant(x, s, k_stop=128)


def w8a8_one_row_tile(a, b, a_scale, b_scale):
    """One tile of 32 token rows (M assumed at most 32, as at decode; the public M is at most 16): the
    rows past it stay zero."""
    return w8a8_variant(a, b, a_scale, b_scale, row_tiles=1, block_m=32)


def smooth_own_amax(x, w, act_amax, alpha=0.5):
    """act_amax recomputed from x itself, which the public inputs (calibrated on x) cannot tell apart."""
    return smooth_variant(x, w, act_amax, alpha, own_amax=True)


HIDDEN_CATCHES = {
    "q1": {"one tile of 128 columns per row, no loop over K": quantize_one_tile_of_128},
    "q2": {"one tile of 32 token rows": w8a8_one_row_tile},
    "q3": {"act_amax recomputed from x": smooth_own_amax},
}

ARGUMENT = {"q1": "quantize_int8", "q2": "w8a8_matmul", "q3": "smooth_quant"}


def hidden_cases(question: str) -> list:
    """The hidden otter test cases of ``question`` (from solutions/, or drafts/ until they move there)."""
    from otter.test_files.exception_test import test_case

    for folder in ("solutions", "drafts/solutions"):
        path = ROOT / folder / "hidden_tests" / "07_inference" / f"{question}.py"
        if path.is_file():
            env = runpy.run_path(str(path))
            assert env["name"] == question
            cases = [v for v in env.values() if isinstance(v, test_case)]
            assert cases and all(c.hidden for c in cases)
            assert all(c._get_func_params() == [ARGUMENT[question]] for c in cases)
            return cases
    raise AssertionError(f"no hidden test file for {question}")


@pytest.mark.parametrize("q", list(CHECKS))
def test_hidden_tests_pass_the_right_solutions(q, capsys):
    for case in hidden_cases(q):
        case.call_func({ARGUMENT[q]: PACKAGE[q]})
        case.call_func({ARGUMENT[q]: list(STUDENT_SOLUTIONS[q].values())[-1]})
    assert capsys.readouterr().out.count(f"{q} passed") >= 2


@pytest.mark.parametrize("q,name", [(q, n) for q, c in HIDDEN_CATCHES.items() for n in c])
def test_hidden_catch_passes_the_public_check_and_fails_a_hidden_test(q, name, capsys):
    catch = HIDDEN_CATCHES[q][name]
    CHECKS[q](catch)
    assert f"{q} passed" in capsys.readouterr().out
    failed = 0
    for case in hidden_cases(q):
        try:
            case.call_func({ARGUMENT[q]: catch})
        except AssertionError as e:
            assert not isinstance(e, ExerciseNotDone)
            failed += 1
    assert failed, f"{q}: {name!r} passed the hidden tests too"


def test_act_amax_recomputed_from_x_gets_its_diagnosis():
    inputs = lab07.fresh_smooth_inputs(5, t=20, k=32, n=24)
    with pytest.raises(AssertionError, match="act_amax ignored"):
        lab07.check_smooth_quant(smooth_own_amax, inputs=inputs)


def test_fresh_inputs_are_deterministic_and_refuse_bad_sizes():
    a, b = lab07.fresh_quantizer_inputs(3, 9, 40), lab07.fresh_quantizer_inputs(3, 9, 40)
    assert all(torch.equal(a[k], b[k]) for k in a) and all(v.shape == (9, 40) for v in a.values())
    c = lab07.fresh_gemm_inputs(4, 3, 5, 70)
    assert all(v["a"].shape == (3, 70) and v["b"].shape == (5, 70) for v in c.values())
    for bad in (lambda: lab07.fresh_quantizer_inputs(1, 4, 40), lambda: lab07.fresh_gemm_inputs(1, 1, 1, 8)):
        with pytest.raises(ValueError, match="want"):
            bad()
    assert math.isclose(float(lab07.static_scale(torch.zeros(3, 4))), 1.0)
    assert np.isfinite(lab07.GEMM_RTOL)
