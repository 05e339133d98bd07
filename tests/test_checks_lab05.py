"""Lab 5 checks: the package's kernels and layer pass every check; each deliberately wrong solution is
caught by its question's check with the diagnosis the lab promises; each right one written another way
(``STUDENT_SOLUTIONS``: other tiles, warps, launch orders, promotions, autograd styles) passes."""

import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import fp8_gemm as G
from kernels import fp8_linear as L
from kernels import quantize as Q
from kernels.checks import lab05
from kernels.testing import frobenius_error

# -- a student-style kernel with switchable mistakes ----------------------------------------------------

OK, DIVIDE, NO_SCALES, BAD_ORDER, FIRST_BLOCK_SCALE, NO_PROMOTION, ONLY_A = range(7)  # MISTAKE codes


@triton.jit
def _student_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
    SCALING: tl.constexpr, MISTAKE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    npn = tl.cdiv(N, BN)
    pid_m = pid // npn
    pid_n = pid % npn
    if MISTAKE == 3:  # "grouped" order that sends two programs to one tile
        pid_m = (pid // npn) // 2 * 2
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    n_kb = tl.cdiv(K, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(n_kb):
        ks = kb * BK + offs_k
        a = tl.load(
            a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0
        )
        b = tl.load(
            b_ptr + offs_n[:, None] * K + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < K), other=0.0
        )
        if SCALING == 2 and MISTAKE != 5 and MISTAKE != 4:
            sa = tl.load(as_ptr + offs_m * n_kb + kb, mask=offs_m < M, other=0.0)
            sb = tl.load(bs_ptr + (offs_n // 128) * n_kb + kb, mask=offs_n < N, other=0.0)
            acc += tl.dot(a, b.T) * (sa[:, None] * sb[None, :])
        elif SCALING == 2 and MISTAKE == 5:  # the K sum stays in tl.dot's accumulator, rescaled around it
            sa = tl.load(as_ptr + offs_m * n_kb + kb, mask=offs_m < M, other=1.0)
            sb = tl.load(bs_ptr + (offs_n // 128) * n_kb + kb, mask=offs_n < N, other=1.0)
            s = sa[:, None] * sb[None, :]
            acc = tl.dot(a, b.T, acc / s) * s
        else:
            acc = tl.dot(a, b.T, acc)
    if SCALING == 0:
        sa = tl.load(as_ptr)
        sb = tl.load(bs_ptr)
        if MISTAKE == 1:
            acc = acc / (sa * sb)
        elif MISTAKE == 6:
            acc = acc * sa
        elif MISTAKE != 2:
            acc = acc * (sa * sb)
    elif SCALING == 1:
        sa = tl.load(as_ptr + offs_m, mask=offs_m < M, other=0.0)
        sb = tl.load(bs_ptr + offs_n, mask=offs_n < N, other=0.0)
        if MISTAKE == 1:
            acc = acc / (sa[:, None] * sb[None, :])
        elif MISTAKE == 6:
            acc = acc * sa[:, None]
        else:
            acc = acc * (sa[:, None] * sb[None, :])
    elif MISTAKE == 4:  # the first K-block's scales for the whole sum
        sa = tl.load(as_ptr + offs_m * n_kb, mask=offs_m < M, other=0.0)
        sb = tl.load(bs_ptr + (offs_n // 128) * n_kb, mask=offs_n < N, other=0.0)
        acc = acc * (sa[:, None] * sb[None, :])
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16), mask=mask)


def student(scaling, mistake=OK, bm=32):
    """The kernel with (bm, 32) tiles.  With bm = 32 Triton lowers an FP8 tl.dot to mma.sync on fp16
    operands, which accumulates in fp32: leaving out the promotion loses nothing there.  With bm = 64 it
    is Hopper's FP8 wgmma, whose 13-bit accumulator the promotion exists for."""

    def fn(a, b, a_scale, b_scale):
        m, k = a.shape
        n = b.shape[0]
        c = torch.zeros((m, n), dtype=torch.bfloat16, device=a.device)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, 32),)
        _student_kernel[grid](
            a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k,
            SCALING={"tensor": 0, "row": 1, "block": 2}[scaling], MISTAKE=mistake, BM=bm, BN=32, BK=128,
        )  # fmt: skip
        return c

    return fn


# -- q2: launch orders ----------------------------------------------------------------------------------


@triton.jit
def row_major_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    return pid // num_pid_n, pid % num_pid_n


@triton.jit
def unclipped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group_id = pid // (GROUP_M * num_pid_n)
    r = pid % (GROUP_M * num_pid_n)
    return group_id * GROUP_M + r % GROUP_M, r // GROUP_M  # the last group is assumed full


@triton.jit
def colliding_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group_id = pid // (GROUP_M * num_pid_n)
    first = group_id * GROUP_M
    size = tl.minimum(num_pid_m - first, GROUP_M)
    r = pid % (GROUP_M * num_pid_n)
    return first + r // num_pid_n, r % size  # the two roles mixed up: columns beyond size never visited


def check_q2(fn):
    """q2's otter test: the order function, then (for the package) the v2 kernel."""
    if isinstance(fn, tuple):
        tile_fn, gemm_fn = fn
        lab05.check_grouped_order(tile_fn)
        lab05.check_gemm_v2(gemm_fn)
    else:
        lab05.check_grouped_order(fn)


# -- q5: FP8 linear layers, right and wrong -------------------------------------------------------------


def make_linear(quant_mul=False, grad_unscaled=False, transpose_codes=False, no_fp8=False):
    """An FP8 linear Function with rowwise scales, optionally with one classic mistake."""

    def q(x, fmt):
        if quant_mul:  # q = x * S instead of x / S; dequantized with 1/S
            r = Q.quantize_rowwise(x, fmt)
            codes = (x.float() * r.s).clamp(-Q.FP8_MAX[fmt], Q.FP8_MAX[fmt]).to(Q.FP8_FORMATS[fmt])
            return Q.Quantized(codes, 1.0 / r.s)
        return Q.quantize_rowwise(x, fmt)

    def gemm(qa, qb):
        return G.fp8_gemm_rowwise(qa.q, qb.q, qa.s.float(), qb.s.float())

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            if no_fp8:
                return x @ w.T
            return gemm(q(x, "e4m3"), q(w, "e4m3"))

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dy = dy.contiguous()
            if grad_unscaled:
                ones = torch.ones(dy.shape[0], 1, device=dy.device), torch.ones(dy.shape[1], 1, device=dy.device)
                qdy = Q.Quantized(dy.to(torch.float8_e4m3fn), ones[0])
                qdyt = Q.Quantized(dy.t().contiguous().to(torch.float8_e4m3fn), ones[1])
            else:
                qdy = q(dy, "e5m2")
                qdyt = q(dy.t().contiguous(), "e5m2")
            dx = gemm(qdy, q(w.t().contiguous(), "e4m3"))
            if transpose_codes:
                qx = q(x, "e4m3")  # (T, in) codes, one scale per token
                qxt = Q.Quantized(qx.q.t().contiguous(), qx.s.max().expand(x.shape[1], 1).contiguous())
            else:
                qxt = q(x.t().contiguous(), "e4m3")
            return dx, gemm(qdyt, qxt)

    return lambda x, w: Fn.apply(x, w)


# -- q6: which layers -----------------------------------------------------------------------------------


def swap_right(model):
    return L.swap_linears(model, skip=lambda name, m: name in ("proj", "head"), min_features=0)


def swap_all(model):
    for i in range(len(model.ups)):
        model.ups[i] = L.FP8Linear.from_linear(model.ups[i])
        model.downs[i] = L.FP8Linear.from_linear(model.downs[i])
    model.head = L.FP8Linear.from_linear(model.head)
    return model


def swap_fresh(model):
    for i in range(len(model.ups)):
        model.ups[i] = L.FP8Linear(model.ups[i].in_features, model.ups[i].out_features, device=model.head.weight.device)
        model.downs[i] = L.FP8Linear(model.downs[i].in_features, model.downs[i].out_features)
    return model


def swap_nothing(model):
    return model


WRONG_SOLUTIONS = {
    "q1": {
        "scales divided instead of multiplied": student("tensor", DIVIDE),
        "no scales": student("tensor", NO_SCALES),
        "only a's scale": student("tensor", ONLY_A),
    },
    "q2": {
        "row-major order (the stub)": row_major_tile,
        "last group assumed full": unclipped_tile,
        "two programs on one tile": colliding_tile,
        "kernel: grouped order sends two programs to one tile": (G.grouped_tile, student("tensor", BAD_ORDER)),
    },
    "q3": {
        "scales divided instead of multiplied": student("row", DIVIDE),
        "only a's scale": student("row", ONLY_A),
    },
    "q4": {
        "block scale pulled out of the K sum": student("block", FIRST_BLOCK_SCALE),
        "no promotion": student("block", NO_PROMOTION, bm=64),
    },
    "q5": {
        "scales multiplied instead of divided": make_linear(quant_mul=True),
        "E4M3 used for gradients without scaling": make_linear(grad_unscaled=True),
        "transposed codes instead of requantizing": make_linear(transpose_codes=True),
        "bf16 matmul, no FP8": make_linear(no_fp8=True),
    },
    "q6": {
        "output head converted too": swap_all,
        "fresh, re-initialised FP8 layers": swap_fresh,
        "nothing converted": swap_nothing,
    },
}

DIAGNOSES = {
    ("q1", "scales divided instead of multiplied"): "scales divided instead of multiplied",
    ("q1", "no scales"): "no scales applied",
    ("q1", "only a's scale"): "b_scale is missing",
    ("q2", "row-major order (the stub)"): "row-major order",
    ("q2", "last group assumed full"): "outside the grid",
    ("q2", "two programs on one tile"): "programs",
    ("q2", "kernel: grouped order sends two programs to one tile"): "whole output tiles are wrong",
    ("q3", "scales divided instead of multiplied"): "scales divided instead of multiplied",
    ("q3", "only a's scale"): "b_scale is missing",
    ("q4", "block scale pulled out of the K sum"): "block scale pulled out of the K sum",
    ("q4", "no promotion"): "no promotion",
    ("q5", "scales multiplied instead of divided"): "scales multiplied instead of divided",
    ("q5", "E4M3 used for gradients without scaling"): "cast to FP8 without a scale",
    ("q5", "transposed codes instead of requantizing"): "transposing FP8 codes",
    ("q5", "bf16 matmul, no FP8"): "did not go through FP8",
    ("q6", "output head converted too"): "model.head was converted",
    ("q6", "fresh, re-initialised FP8 layers"): "re-initialised",
    ("q6", "nothing converted"): "no block layer became an FP8Linear",
}

CHECKS = {
    "q1": lab05.check_gemm_v1,
    "q2": check_q2,
    "q3": lab05.check_gemm_rowwise,
    "q4": lab05.check_gemm_blockwise,
    "q5": lab05.check_fp8_linear,
    "q6": lab05.check_fp8_swap,
}

REFERENCES = {
    "q1": G.fp8_gemm_v1,
    "q2": (G.grouped_tile, lambda a, b, sa, sb: G.fp8_gemm(a, b, sa, sb, kernel="grouped")),
    "q3": G.fp8_gemm_rowwise,
    "q4": G.fp8_gemm_blockwise,
    "q5": lambda x, w: L.fp8_linear(x, w, None, L.FP8Recipe(granularity="row")),
    "q6": swap_right,
}


def test_every_question_has_wrong_solutions_and_diagnoses():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == set(REFERENCES)
    assert set(DIAGNOSES) == {(q, name) for q, d in WRONG_SOLUTIONS.items() for name in d}


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_reference_passes(question, capsys):
    CHECKS[question](REFERENCES[question])
    assert f"{question} passed" in capsys.readouterr().out


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_student_style_correct_kernel_passes(question):
    fn = {"q1": student("tensor"), "q2": (G.grouped_tile, student("tensor")), "q3": student("row")}.get(question)
    fn = fn or {"q4": student("block")}.get(question)
    if fn is None:
        fn = {"q5": make_linear(), "q6": swap_right}[question]
    CHECKS[question](fn)


@pytest.mark.parametrize("question,name", sorted(DIAGNOSES))
def test_wrong_solution_is_caught(question, name):
    with pytest.raises(AssertionError) as e:
        CHECKS[question](WRONG_SOLUTIONS[question][name])
    print(e.value)
    assert DIAGNOSES[(question, name)] in str(e.value)


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_unfinished_exercise_says_not_done(question):
    def stub(*args):
        raise NotImplementedError

    if question == "q2":  # a jit function; the lab's stub is row-major order, caught above
        return
    with pytest.raises(AssertionError, match="not done yet"):
        CHECKS[question](stub)


def test_promotion_input_is_what_tells_the_kernels_apart():
    """The no-promotion kernel agrees with the reference on ordinary data (small tiles: mma.sync, fp32
    accumulation): only the big-then-small input, in Hopper's wgmma accumulator, tells them apart."""
    qa, qb = lab05._operands(96, 136, 384, "block", 0)
    got = student("block", NO_PROMOTION)(qa.q, qb.q, qa.s, qb.s)
    want = G.fp8_gemm_blockwise_reference(qa.q, qb.q, qa.s, qb.s)
    assert frobenius_error(got, want) < 1e-2


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, solutions that are right by the
# lab's contract but not the lab's own, each differing from it (and from the others) where compiled
# Triton and the interpreter could disagree: tiles of 64 and 128 rows with 4 or 8 warps (all lowered to
# wgmma, whose FP8 accumulator CPU mode models), b loaded as a (BK, BN) tile instead of tl.dot(a, b.T),
# clamped or wrapped rows instead of masks, other launch orders, promotion by an add or by tl.fma.
# Every one must pass its check here and get full marks from the lab's otter test
# (``tests/test_wrong_solutions.py``).


@triton.jit
def _v1_bt_tile_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)  # a 2-D grid of tiles
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]  # (BM, BK)
    bt_ptrs = b_ptr + offs_k[:, None] + offs_n[None, :] * K  # (BK, BN): b^T, read straight from (N, K)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        bt = tl.load(bt_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, bt, acc)
        a_ptrs += BK
        bt_ptrs += BK
    acc = acc * tl.load(sa_ptr) * tl.load(sb_ptr)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_v1_bt_tile(a, b, a_scale, b_scale):
    """q1 on 64x64 tiles (4 warps: wgmma, Hopper's FP8 accumulator), a 2-D grid, b loaded as a (BK, BN)
    tile of b^T, pointers advanced, the scales multiplied in one after the other."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    _v1_bt_tile_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, BM=64, BN=64, BK=128, num_warps=4)
    return c


@triton.jit
def _v1_column_order_kernel(
    a_ptr, b_ptr, c_ptr, s_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    pid_m, pid_n = pid % num_pid_m, pid // num_pid_m  # column-major order over the tiles
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_m, M - 1)  # clamped: loads need only the K mask; extra rows are not stored
    cols = tl.minimum(offs_n, N - 1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, BK)):
        ks = kb * BK + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
        b = tl.load(b_ptr + cols[:, None] * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
        acc = tl.dot(a, b.T, acc)
    acc = acc * tl.load(s_ptr)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_v1_column_order(a, b, a_scale, b_scale):
    """q1 on 128x128 tiles with 8 warps, column-major launch order, clamped row indices, tl.range over K,
    and S_a * S_b formed by torch on the device (one pointer; no host sync)."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    s = (a_scale.float() * b_scale.float()).reshape(1)
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 128),)
    _v1_column_order_kernel[grid](a, b, c, s, m, n, k, BM=128, BN=128, BK=128, num_warps=8)
    return c


@triton.jit
def grouped_tile_full_or_short(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """The grouped order with the full groups and the short last one told apart by tl.where."""
    full_groups = num_pid_m // GROUP_M
    in_full = pid < full_groups * GROUP_M * num_pid_n
    height = tl.where(in_full, GROUP_M, num_pid_m - full_groups * GROUP_M)  # rows of pid's group
    group = pid // (GROUP_M * num_pid_n)
    local = pid % (GROUP_M * num_pid_n)
    return group * GROUP_M + local % height, local // height


@triton.jit
def grouped_tile_column_first(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """The grouped order with the column found first and the row from what is left (no % by the height)."""
    width = GROUP_M * num_pid_n
    group = pid // width
    first = group * GROUP_M
    height = tl.minimum(num_pid_m - first, GROUP_M)
    local = pid - group * width
    pid_n = local // height
    return first + local - pid_n * height, pid_n


@triton.jit
def _v2_bt_tile_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile_full_or_short(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        bt = tl.load(b_ptr + offs_n[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (offs_n[None, :] < N),
                     other=0.0)  # fmt: skip
        acc = tl.dot(a, bt, acc)
    acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_v2_bt_tile(a, b, a_scale, b_scale):
    """q2's kernel on 64x32 tiles, GROUP_M = 4, 4 warps and 3 stages, a (BK, BN) tile of b^T."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64) * triton.cdiv(n, 32),)
    _v2_bt_tile_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, BM=64, BN=32, BK=128, GROUP_M=4, num_warps=4,
                             num_stages=3)  # fmt: skip
    return c


@triton.jit
def _v2_clamped_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile_column_first(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + (offs_m % M).to(tl.int64)[:, None] * K + offs_k[None, :]  # wrapped rows, int64
    b_ptrs = b_ptr + (offs_n % N).to(tl.int64)[:, None] * K + offs_k[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, BK), num_stages=3):
        k_left = K - kb * BK
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        acc = tl.dot(a, b.T, acc)
        a_ptrs += BK
        b_ptrs += BK
    sa = tl.load(sa_ptr)
    sb = tl.load(sb_ptr)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], (acc * sa * sb).to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_v2_clamped(a, b, a_scale, b_scale):
    """q2's kernel on 128x64 tiles, GROUP_M = 2, 8 warps, the K loop pipelined by tl.range(num_stages=3),
    rows past the edge wrapped back into the matrix (offs % M) instead of masked, int64 row offsets."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 64),)
    _v2_clamped_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, BM=128, BN=64, BK=128, GROUP_M=2, num_warps=8)
    return c


@triton.jit
def _rowwise_two_broadcasts_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BN)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        bt = tl.load(b_ptr + offs_n[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (offs_n[None, :] < N),
                     other=0.0)  # fmt: skip
        acc = tl.dot(a, bt, acc)
    sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=1.0)
    sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=1.0)
    acc = acc * sa[:, None]  # the rows' scales, then the columns'
    acc = acc * sb[None, :]
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_rowwise_two_broadcasts(a, b, a_scale, b_scale):
    """q3 on 64x64 tiles with 4 warps, a (BK, BN) tile of b^T, the epilogue as two broadcast multiplies
    (rows, then columns), scales loaded with other=1.0."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64) * triton.cdiv(n, 64),)
    _rowwise_two_broadcasts_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=64, BN=64, BK=128, num_warps=4
    )
    return c


@triton.jit
def _rowwise_gathered_scales_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid_m, pid_n = tl.program_id(1), tl.program_id(0)  # the grid's first axis runs along N
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        ks = kb * BK + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
        b = tl.load(b_ptr + cols[:, None] * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
        acc = tl.dot(a, b.T, acc)
    sa = tl.load(sa_ptr + rows[:, None])  # (BM, 1) from clamped indices: no masks needed
    sb = tl.load(sb_ptr + cols[None, :])  # (1, BN)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], (acc * (sa * sb)).to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_rowwise_gathered_scales(a, b, a_scale, b_scale):
    """q3 on 128x32 tiles with 8 warps on an N-major 2-D grid, clamped int64 row indices, the scales
    loaded as (BM, 1) and (1, BN) tiles whose product broadcasts."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(n, 32), triton.cdiv(m, 128))
    _rowwise_gathered_scales_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=128, BN=32, BK=128, num_warps=8
    )
    return c


@triton.jit
def _rowwise_scaled_blocks_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BN)
    offs_m = (pid // num_pid_n) * BM + tl.arange(0, BM)
    offs_n = (pid % num_pid_n) * BN + tl.arange(0, BN)
    sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
    sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)
    s = sa[:, None] * sb[None, :]  # before the loop: the same for every K-block
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        b = tl.load(b_ptr + offs_n[:, None] * K + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        acc += tl.dot(a, b.T) * s  # each K-block's product scaled and added in fp32 (promoted too)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_rowwise_scaled_blocks(a, b, a_scale, b_scale):
    """q3 with the scales applied inside the K loop (they do not change along K, so it is the same sum),
    each 128-K block a fresh tl.dot added in fp32; 64x128 tiles, 4 warps."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64) * triton.cdiv(n, 128),)
    _rowwise_scaled_blocks_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=64, BN=128, BK=128, num_warps=4
    )
    return c


@triton.jit
def _blockwise_fma_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    n_kb = tl.cdiv(K, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(n_kb):
        ks = kb * BK + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        bt = tl.load(b_ptr + offs_n[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (offs_n[None, :] < N),
                     other=0.0)  # fmt: skip
        part = tl.dot(a, bt)  # this K-block alone
        sa = tl.load(as_ptr + offs_m * n_kb + kb, mask=offs_m < M, other=0.0)
        sb = tl.load(bs_ptr + (offs_n // 128) * n_kb + kb, mask=offs_n < N, other=0.0)
        acc = tl.fma(part, sa[:, None] * sb[None, :], acc)  # promotion: one rounding per block
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_blockwise_fma(a, b, a_scale, b_scale):
    """q4 on 64x64 tiles with 4 warps (wgmma: the promotion matters), a (BK, BN) tile of b^T, each
    K-block's product promoted by tl.fma into the fp32 sum."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    _blockwise_fma_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=64, BN=64, BK=128, num_warps=4
    )
    return c


@triton.jit
def _blockwise_one_weight_block_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    tl.static_assert(BN == 128, "a tile's columns lie in one 128-row block of b: one weight scale per K-block")
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    pid_m, pid_n = pid % num_pid_m, pid // num_pid_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * K + tl.arange(0, BK)[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[:, None] * K + tl.arange(0, BK)[None, :]
    n_kb = tl.cdiv(K, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in tl.range(0, n_kb):
        k_ok = tl.arange(0, BK)[None, :] < K - kb * BK
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok, other=0.0)
        b = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & k_ok, other=0.0)
        sa = tl.load(as_ptr + offs_m * n_kb + kb, mask=offs_m < M, other=0.0)
        sb = tl.load(bs_ptr + pid_n * n_kb + kb)  # a scalar: the tile is one weight block wide
        acc += tl.dot(a, b.T) * sa[:, None] * sb
        a_ptrs += BK
        b_ptrs += BK
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_blockwise_one_weight_block(a, b, a_scale, b_scale):
    """q4 on 128x128 tiles with 8 warps in column-major order: each tile's columns are one 128-row block
    of b, so its weight scale per K-block is a scalar load; int64 row offsets; tl.range."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 128),)
    _blockwise_one_weight_block_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=128, BN=128, BK=128, num_warps=8
    )
    return c


# -- q5: the FP8 linear layer, two more ways --------------------------------------------------------------


def _rowwise_q(t, fmt):
    r = Q.quantize_rowwise(t.contiguous(), fmt)
    return r.q, r.s


def _transposed_backward_linear():
    """Both backward GEMMs computed transposed, dX^T = W^T dY^T and dW^T = X^T dY (C = A B^T with the
    e4m3 operand as A and the e5m2 one as B), through the 64x64 rowwise kernel above."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            (x_q, x_s), (w_q, w_s) = _rowwise_q(x, "e4m3"), _rowwise_q(w, "e4m3")
            return gemm_rowwise_two_broadcasts(x_q, w_q, x_s, w_s)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dy = dy.contiguous()
            wt_q, wt_s = _rowwise_q(w.t(), "e4m3")  # W^T (in, out): K = out
            dy_q, dy_s = _rowwise_q(dy, "e5m2")  # dY (T, out): K = out
            dx = gemm_rowwise_two_broadcasts(wt_q, dy_q, wt_s, dy_s).t()  # (in, T) -> (T, in)
            xt_q, xt_s = _rowwise_q(x.t(), "e4m3")  # X^T (in, T): K = T
            dyt_q, dyt_s = _rowwise_q(dy.t(), "e5m2")  # dY^T (out, T): K = T
            dw = gemm_rowwise_two_broadcasts(xt_q, dyt_q, xt_s, dyt_s).t()  # (in, out) -> (out, in)
            return dx.contiguous(), dw.contiguous()

    return lambda x, w: Fn.apply(x, w)


def power_of_two_rowwise(t, fmt):
    """Per-row power-of-two scales S = 2^e >= amax / FP8_MAX, e from torch.frexp (an all-zero row: e = 0,
    S = 1) and S built from its bits, so that x / S is exact before the (clamped) cast."""
    tf = t.float().contiguous()
    fp8_max = Q.FP8_MAX[fmt]
    amax = tf.abs().amax(dim=1, keepdim=True)
    _, e = torch.frexp(amax / fp8_max)  # amax / FP8_MAX = m * 2^e with m in [0.5, 1)
    s = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)  # 2^e, exactly, on any device
    q = (tf / s).clamp(-fp8_max, fp8_max).to(Q.FP8_FORMATS[fmt])
    return q, s


class _PowerOfTwoLinearFn(torch.autograd.Function):
    """The forward without ctx, and setup_context saving the wide inputs (torch's newer Function style)."""

    @staticmethod
    def forward(x, w):
        qx, sx = power_of_two_rowwise(x, "e4m3")
        qw, sw = power_of_two_rowwise(w, "e4m3")
        return G.fp8_gemm_rowwise(qx, qw, sx, sw)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        qdy, sdy = power_of_two_rowwise(dy, "e5m2")
        qwt, swt = power_of_two_rowwise(w.t(), "e4m3")
        qdyt, sdyt = power_of_two_rowwise(dy.t(), "e5m2")
        qxt, sxt = power_of_two_rowwise(x.t(), "e4m3")
        dx = G.fp8_gemm_rowwise(qdy, qwt, sdy, swt)
        dw = G.fp8_gemm_rowwise(qdyt, qxt, sdyt, sxt)
        return dx, dw


def power_of_two_linear(x, w):
    return _PowerOfTwoLinearFn.apply(x, w)


# -- q6: which layers, two more ways ------------------------------------------------------------------------


def swap_by_rebuilt_lists(model):
    """New ModuleLists of FP8Linear.from_linear for the blocks, assigned over the old ones."""
    model.ups = torch.nn.ModuleList(L.FP8Linear.from_linear(m) for m in model.ups)
    model.downs = torch.nn.ModuleList(L.FP8Linear.from_linear(m) for m in model.downs)
    return model


def swap_by_names_sharing_parameters(model):
    """Every module named ups.i or downs.i found by named_modules, replaced through its parent by an
    FP8Linear (per-row recipe) built at the layer's device and dtype and given the layer's own Parameters."""
    for name, layer in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        if parent in ("ups", "downs") and isinstance(layer, torch.nn.Linear):
            new = L.FP8Linear(layer.in_features, layer.out_features, layer.bias is not None,
                              device=layer.weight.device, dtype=layer.weight.dtype,
                              recipe=L.FP8Recipe(granularity="row"))  # fmt: skip
            new.weight, new.bias = layer.weight, layer.bias
            setattr(model.get_submodule(parent), child, new)
    return model


STUDENT_SOLUTIONS = {
    "q1": {
        "64x64 tiles, 4 warps, 2-D grid, a (BK, BN) tile of b^T": gemm_v1_bt_tile,
        "128x128 tiles, 8 warps, column-major order, clamped rows": gemm_v1_column_order,
    },
    "q2": {
        "full groups and the short one by tl.where; 64x32 tiles, b^T tile": (
            grouped_tile_full_or_short,
            gemm_v2_bt_tile,
        ),
        "column first, no % by the height; 128x64, 8 warps, wrapped rows": (
            grouped_tile_column_first,
            gemm_v2_clamped,
        ),
    },
    "q3": {
        "64x64, two broadcast multiplies, scales other=1.0": gemm_rowwise_two_broadcasts,
        "128x32, 8 warps, N-major grid, (BM, 1) x (1, BN) scales": gemm_rowwise_gathered_scales,
        "scales applied to every K-block's product": gemm_rowwise_scaled_blocks,
    },
    "q4": {
        "64x64, 4 warps, promotion by tl.fma": gemm_blockwise_fma,
        "128x128, 8 warps, a scalar weight scale per K-block": gemm_blockwise_one_weight_block,
    },
    "q5": {
        "backward GEMMs computed transposed, own rowwise kernel": _transposed_backward_linear(),
        "power-of-two row scales, setup_context, package GEMM": power_of_two_linear,
    },
    "q6": {
        "rebuilt ModuleLists": swap_by_rebuilt_lists,
        "named_modules, parameters assigned, per-row recipe": swap_by_names_sharing_parameters,
    },
}

STUDENT_CASES = [(q, name) for q, rights in STUDENT_SOLUTIONS.items() for name in rights]


@pytest.mark.parametrize("question, name", STUDENT_CASES, ids=str)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


@triton.jit
def _v1_split_by_rows_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    pid_m, pid_n = pid // num_pid_m, pid % num_pid_m  # the two counts' roles mixed up
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        b = tl.load(b_ptr + offs_n[:, None] * K + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        acc = tl.dot(a, b.T, acc)
    acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_v1_split_by_rows(a, b, a_scale, b_scale):
    """q1 on 64x64 tiles whose program id is split by the number of tile rows instead of tile columns:
    right whenever the grid of tiles is square, as both public shapes' (one tile each) are."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.zeros((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64) * triton.cdiv(n, 64),)
    _v1_split_by_rows_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, BM=64, BN=64, BK=128, num_warps=4)
    return c


@triton.jit
def old_tutorial_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """The grouped order with pid_m = first + pid % height (an older matmul tutorial's line): in a short
    last group it is the right order only when the group starts at a multiple of its height."""
    num_pid_in_group = GROUP_M * num_pid_n
    first = (pid // num_pid_in_group) * GROUP_M
    height = tl.minimum(num_pid_m - first, GROUP_M)
    return first + pid % height, (pid % num_pid_in_group) // height


@triton.jit
def _rowwise_first_tile_scales_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BN)
    offs_m = (pid // num_pid_n) * BM + tl.arange(0, BM)
    offs_n = (pid % num_pid_n) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        b = tl.load(b_ptr + offs_n[:, None] * K + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        acc = tl.dot(a, b.T, acc)
    rows, cols = tl.arange(0, BM), tl.arange(0, BN)  # the tile's offsets left out
    sa = tl.load(sa_ptr + rows, mask=rows < M, other=0.0)
    sb = tl.load(sb_ptr + cols, mask=cols < N, other=0.0)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], (acc * (sa[:, None] * sb[None, :])).to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_rowwise_first_tile_scales(a, b, a_scale, b_scale):
    """q3 on 128x128 tiles, every tile scaled by the first tile's row and column scales (tl.arange(0, BM)
    where offs_m belongs): right on the public shapes, each one tile."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 128),)
    _rowwise_first_tile_scales_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=128, BN=128, BK=128, num_warps=8
    )
    return c


@triton.jit
def _blockwise_first_tile_weight_scales_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BN)
    offs_m = (pid // num_pid_n) * BM + tl.arange(0, BM)
    offs_n = (pid % num_pid_n) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BN)  # the tile's offset left out of the weight scales' rows
    n_kb = tl.cdiv(K, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(n_kb):
        ks = kb * BK + tl.arange(0, BK)
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        b = tl.load(b_ptr + offs_n[:, None] * K + ks[None, :], mask=(offs_n[:, None] < N) & (ks[None, :] < K),
                    other=0.0)  # fmt: skip
        sa = tl.load(as_ptr + offs_m * n_kb + kb, mask=offs_m < M, other=0.0)
        sb = tl.load(bs_ptr + (cols // 128) * n_kb + kb, mask=cols < N, other=0.0)
        acc += tl.dot(a, b.T) * (sa[:, None] * sb[None, :])
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def gemm_blockwise_first_tile_weight_scales(a, b, a_scale, b_scale):
    """q4 on 64x256 tiles, promoted, whose weight scales are read for the first tile's columns
    (tl.arange(0, BN) // 128): right while N fits one tile, as the public shapes' N (at most 136) does."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64) * triton.cdiv(n, 256),)
    _blockwise_first_tile_weight_scales_kernel[grid](
        a, b, c, a_scale.contiguous(), b_scale.contiguous(), m, n, k, BM=64, BN=256, BK=128, num_warps=8
    )
    return c


class _PerTensorLinearFn(torch.autograd.Function):
    """q5 with one scale per tensor (section 1's Q.quantize_tensor) where the lab asks for one per row:
    Y, dX and dW as a whole stay within their bounds, the smallest tokens do not."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        qx, qw = Q.quantize_tensor(x, "e4m3"), Q.quantize_tensor(w, "e4m3")
        return G.fp8_gemm(qx.q, qw.q, qx.s, qw.s)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        qdy, qwt = Q.quantize_tensor(dy, "e5m2"), Q.quantize_tensor(w.t().contiguous(), "e4m3")
        qdyt, qxt = Q.quantize_tensor(dy.t().contiguous(), "e5m2"), Q.quantize_tensor(x.t().contiguous(), "e4m3")
        return G.fp8_gemm(qdy.q, qwt.q, qdy.s, qwt.s), G.fp8_gemm(qdyt.q, qxt.q, qdyt.s, qxt.s)


def per_tensor_linear(x, w):
    return _PerTensorLinearFn.apply(x, w)


def swap_two_blocks(model):
    """The blocks of a depth-2 model, the public check's, converted by index."""
    for i in (0, 1):
        model.ups[i] = L.FP8Linear.from_linear(model.ups[i])
        model.downs[i] = L.FP8Linear.from_linear(model.downs[i])
    return model


HIDDEN_CATCHES = {
    "q1": {"program id split by the number of tile rows (64x64 tiles)": gemm_v1_split_by_rows},
    "q2": {"pid_m = first + pid % height (an older tutorial's order)": (old_tutorial_tile, gemm_v2_bt_tile)},
    "q3": {"the first tile's scales for every tile (128x128 tiles)": gemm_rowwise_first_tile_scales},
    "q4": {"the first tile's weight scales for every tile (64x256 tiles)": gemm_blockwise_first_tile_weight_scales},
    "q5": {"one scale per tensor": per_tensor_linear},
    "q6": {"two blocks converted, by index": swap_two_blocks},
}
