"""Lab 5 checks: the package's kernels and layer pass every check; each deliberately wrong solution is
caught by its question's check with the diagnosis the lab promises."""

import pytest
import torch
import triton
import triton.language as tl

from kernels import fp8_gemm as G
from kernels import fp8_linear as L
from kernels import quantize as Q
from kernels.checks import lab05

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
    return L.swap_linears(model, skip=lambda name, m: name in ("proj", "head"))


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
        "kernel: grouped order sends two programs to one tile": (G._grouped_tile, student("tensor", BAD_ORDER)),
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
    "q2": (G._grouped_tile, lambda a, b, sa, sb: G.fp8_gemm(a, b, sa, sb, kernel="grouped")),
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
    fn = {"q1": student("tensor"), "q2": (G._grouped_tile, student("tensor")), "q3": student("row")}.get(question)
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
    assert L.relative_error(got, want) < 1e-2
