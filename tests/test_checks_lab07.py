"""Lab 7's checks pass the right answers and catch each wrong one with the right diagnosis: q1-q3 (INT8:
the quantizer, the W8A8 GEMM, SmoothQuant), q4 (attention in bf16) and q5 (attention in FP8).

The quantizer, the GEMM and both attentions are Triton kernels in the lab, so the wrong ones here are Triton
kernels too, each one switch away from a right kernel (``quantize_variant``, ``w8a8_variant``,
``attention_variant``, ``attention_fp8_variant``); SmoothQuant is plain PyTorch.  Every wrong solution must
get the diagnosis that names its mistake and no other's.  The right ones are written the ways different
students write them; for attention: other tiles, exp or exp2, masks by tl.where or by an added -inf, a host
loop over (batch, head) or a 2-D grid, strides; for q5 quantization on the host in torch or inside the
kernel, Hadamard rotations in other blocks.
"""

import math
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import _hopper_math, attention, hadamard, int8
from kernels.checks import ExerciseNotDone, lab07, passes
from kernels.device import default_device

ROOT = Path(__file__).resolve().parents[1]
DEVICE = default_device()
LOG2E = 1.4426950408889634

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


# -- q4: an attention kernel with a switch for each mistake -----------------------------------------------

ATTN_MASK_RIGHT = tl.constexpr(0)  # what a masked score becomes, and which keys are masked
ATTN_MASK_ZERO = tl.constexpr(1)
ATTN_MASK_FLIPPED = tl.constexpr(2)
ATTN_STATE_FP32 = tl.constexpr(0)  # where the online softmax keeps l and the accumulator
ATTN_STATE_L_BF16 = tl.constexpr(1)
ATTN_STATE_ACC_BF16 = tl.constexpr(2)


@triton.jit
def _attention_variant_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, N_Q, N_K, SHIFT, qk_scale, D: tl.constexpr, CAUSAL: tl.constexpr,
    MASK: tl.constexpr, STATE: tl.constexpr, RESCALE: tl.constexpr, MAX_SUB: tl.constexpr,
    GUARD: tl.constexpr, SCALE_Q: tl.constexpr, STORE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    # exp2 with log2(e) folded into qk_scale; SCALE_Q multiplies a bf16 Q by it before the product (the
    # older Triton tutorial's way) instead of the fp32 scores.
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    if SCALE_Q:
        q = (q.to(tl.float32) * qk_scale).to(tl.bfloat16)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if STATE == ATTN_STATE_L_BF16:
        l_i = tl.zeros([BLOCK_M], dtype=tl.bfloat16)
    else:
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if STATE == ATTN_STATE_ACC_BF16:
        acc = tl.zeros([BLOCK_M, D], dtype=tl.bfloat16)
    else:
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        v = tl.load(v_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        s = tl.dot(q, k.T)
        if not SCALE_Q:
            s = s * qk_scale
        if CAUSAL:
            if MASK == ATTN_MASK_FLIPPED:
                seen = cols[None, :] >= rows[:, None] + SHIFT
            else:
                seen = cols[None, :] <= rows[:, None] + SHIFT
            s = tl.where(seen, s, 0.0 if MASK == ATTN_MASK_ZERO else float("-inf"))
        s = tl.where(cols[None, :] < N_K, s, float("-inf"))  # the padding past N_K
        if MAX_SUB:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        else:
            m_new = tl.zeros([BLOCK_M], dtype=tl.float32)
        base = m_new
        if GUARD:
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - base)
        if not (RESCALE and MAX_SUB):
            alpha = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        p = tl.exp2(s - base[:, None])
        l_i = (l_i.to(tl.float32) * alpha + tl.sum(p, axis=1)).to(l_i.dtype)
        acc = (acc.to(tl.float32) * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)).to(acc.dtype)
        m_i = m_new
    l_f = l_i.to(tl.float32)
    if GUARD:
        l_f = tl.where(l_f == 0.0, 1.0, l_f)
    out = acc.to(tl.float32) / l_f[:, None]
    if STORE:
        tl.store(o_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], out.to(tl.bfloat16),
                 mask=rows[:, None] < N_Q)  # fmt: skip


def attention_variant(
    q, k, v, causal=False, *, mask=0, state=0, rescale=True, max_sub=True, guard=True, scale_q=False,
    store=True, scale_power=1.0, bottom_right=True, block_m=32, block_n=64,
):  # fmt: skip
    """q4 with a switch for each mistake; ``scale_power``: the scale is (1/sqrt(D))^scale_power (0: left
    out, 2: applied twice); ``bottom_right=False``: "bottom_right" aligned as "top_left"."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    shift = n_k - n_q if causal == "bottom_right" and bottom_right else 0
    o = torch.zeros_like(q)
    qk_scale = (1.0 / math.sqrt(d)) ** scale_power * LOG2E
    _attention_variant_kernel[(triton.cdiv(n_q, block_m), b * h)](
        q.contiguous(), k.contiguous(), v.contiguous(), o, n_q, n_k, shift, qk_scale, D=d, CAUSAL=bool(causal),
        MASK=mask, STATE=state, RESCALE=rescale, MAX_SUB=max_sub, GUARD=guard, SCALE_Q=scale_q, STORE=store,
        BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    return o


# -- q5: an FP8 attention kernel with a switch for each mistake ----------------------------------------------


def quantize_blocks_torch(x, per_tensor=False):
    """E4M3 codes (B, H, N_pad, D) and fp32 scales (B * H * N_pad / 64,) of x, one per block of 64 rows of
    each head (or one for the whole tensor), the sequence padded with zeros."""
    b, h, n, d = x.shape
    n_pad = triton.cdiv(n, 64) * 64
    xp = torch.zeros((b, h, n_pad, d), dtype=torch.float32, device=x.device)
    xp[:, :, :n] = x.float()
    blocks = xp.reshape(b, h, n_pad // 64, 64 * d)
    amax = blocks.abs().amax(-1)  # (B, H, N_pad / 64)
    if per_tensor:
        amax = amax.max().expand_as(amax)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    codes = (blocks / s[..., None]).to(torch.float8_e4m3fn)
    return codes.reshape(b, h, n_pad, d), s.reshape(-1).contiguous()


@triton.jit
def _attention_fp8_variant_kernel(
    q_ptr, sq_ptr, k_ptr, sk_ptr, v_ptr, sv_ptr, o_ptr, N_Q, N_K, NQ_PAD, NK_PAD, SHIFT, qk_scale,
    D: tl.constexpr, CAUSAL: tl.constexpr, P_SCALE: tl.constexpr, USE_SK: tl.constexpr, USE_SV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Tiles of 64 query rows (one Q scale); key blocks of BLOCK_N (64 or 32), each within one K/V scale block.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid_m * 64 + tl.arange(0, 64)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * NQ_PAD * D + rows[:, None] * D + offs_d[None, :])
    sq = tl.load(sq_ptr + bh * (NQ_PAD // 64) + pid_m)
    m_i = tl.full([64], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([64], dtype=tl.float32)
    acc = tl.zeros([64, D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + bh * NK_PAD * D + cols[:, None] * D + offs_d[None, :])
        v = tl.load(v_ptr + bh * NK_PAD * D + cols[:, None] * D + offs_d[None, :])
        sk = tl.load(sk_ptr + bh * (NK_PAD // 64) + start_n // 64)
        sv = tl.load(sv_ptr + bh * (NK_PAD // 64) + start_n // 64)
        if not USE_SK:
            sk = 1.0
        if not USE_SV:
            sv = 1.0
        s = tl.dot(q, k.T) * (sq * sk * qk_scale)
        seen = cols[None, :] < N_K
        if CAUSAL:
            seen = seen & (cols[None, :] <= rows[:, None] + SHIFT)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - base)
        p = tl.exp2(s - base[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot((p * P_SCALE).to(tl.float8e4nv), v)
        acc = acc * alpha[:, None] + pv * (sv / P_SCALE)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < N_Q)  # fmt: skip


def attention_fp8_variant(
    q, k, v, causal=False, hadamard_rotation=False, *, per_tensor=False, p_scale=256.0, use_sk=True, use_sv=True,
    rotate="qk", out_dtype=torch.bfloat16, block_n=64, heads_only=False,
):  # fmt: skip
    """q5 with a switch for each mistake: ``rotate`` which of "qk" gets the rotation (a whole-head random
    Hadamard matrix in torch), ``heads_only``: a grid over the heads of batch 0 alone."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    if hadamard_rotation:
        r = hadamard.random_signs(d, seed=1, device=q.device)[:, None] * hadamard.hadamard_matrix(d, device=q.device)
        q = (q.float() @ r).to(torch.bfloat16) if "q" in rotate else q
        k = (k.float() @ r).to(torch.bfloat16) if "k" in rotate else k
    q8, sq = quantize_blocks_torch(q, per_tensor)
    k8, sk = quantize_blocks_torch(k, per_tensor)
    v8, sv = quantize_blocks_torch(v, per_tensor)
    o = torch.zeros((b, h, n_q, d), dtype=out_dtype, device=q.device)
    shift = n_k - n_q if causal == "bottom_right" else 0
    _attention_fp8_variant_kernel[(triton.cdiv(n_q, 64), h if heads_only else b * h)](
        q8, sq, k8, sk, v8, sv, o, n_q, n_k, q8.shape[2], k8.shape[2], shift, LOG2E / math.sqrt(d), D=d,
        CAUSAL=bool(causal), P_SCALE=p_scale, USE_SK=use_sk, USE_SV=use_sv, BLOCK_N=block_n,
    )  # fmt: skip
    return o


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
    "q4": {
        "no guard for a row that sees no key": lambda q, k, v, c=False: attention_variant(q, k, v, c, guard=False),
        "mask reversed (j >= i)": lambda q, k, v, c=False: attention_variant(q, k, v, c, mask=ATTN_MASK_FLIPPED),
        "masked scores set to 0": lambda q, k, v, c=False: attention_variant(q, k, v, c, mask=ATTN_MASK_ZERO),
        "no rescale by exp(m_old - m_new)": lambda q, k, v, c=False: attention_variant(q, k, v, c, rescale=False),
        "l kept in bf16": lambda q, k, v, c=False: attention_variant(q, k, v, c, state=ATTN_STATE_L_BF16),
        "accumulator kept in bf16": lambda q, k, v, c=False: attention_variant(q, k, v, c, state=ATTN_STATE_ACC_BF16),
        "scale folded into a bf16 q": lambda q, k, v, c=False: attention_variant(q, k, v, c, scale_q=True),
        "scale left out": lambda q, k, v, c=False: attention_variant(q, k, v, c, scale_power=0.0),
        "scale applied twice": lambda q, k, v, c=False: attention_variant(q, k, v, c, scale_power=2.0),
        "no max subtraction": lambda q, k, v, c=False: attention_variant(q, k, v, c, max_sub=False),
        "bottom_right aligned as top_left": lambda q, k, v, c=False: attention_variant(q, k, v, c, bottom_right=False),
        "no tl.store": lambda q, k, v, c=False: attention_variant(q, k, v, c, store=False),
    },
    "q5": {
        "one scale for the whole tensor": lambda q, k, v, c=False, r=False: attention_fp8_variant(
            q, k, v, c, r, per_tensor=True
        ),
        "P cast to E4M3 unscaled": lambda q, k, v, c=False, r=False: attention_fp8_variant(q, k, v, c, r, p_scale=1.0),
        "V's block scale left out": lambda q, k, v, c=False, r=False: attention_fp8_variant(
            q, k, v, c, r, use_sv=False
        ),
        "K's block scale left out": lambda q, k, v, c=False, r=False: attention_fp8_variant(
            q, k, v, c, r, use_sk=False
        ),
        "Hadamard on Q only": lambda q, k, v, c=False, r=False: attention_fp8_variant(q, k, v, c, r, rotate="q"),
        "Hadamard on K only": lambda q, k, v, c=False, r=False: attention_fp8_variant(q, k, v, c, r, rotate="k"),
        "hadamard ignored": lambda q, k, v, c=False, r=False: attention_fp8_variant(q, k, v, c, r, rotate=""),
        "fp32 output": lambda q, k, v, c=False, r=False: attention_fp8_variant(q, k, v, c, r, out_dtype=torch.float32),
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
    "q4": {
        "no guard for a row that sees no key": "fully masked rows give NaN (first rows NaN)",
        "mask reversed (j >= i)": "mask direction wrong: right without the mask, wrong with causal",
        "masked scores set to 0": "masked scores set to 0 instead of -inf",
        "no rescale by exp(m_old - m_new)": "no running-max correction (acc/l not rescaled by exp(m_old - m_new))",
        "l kept in bf16": "softmax state or accumulator kept in bf16: error grows with N_k",
        "accumulator kept in bf16": "softmax state or accumulator kept in bf16: error grows with N_k",
        "scale folded into a bf16 q": "softmax scale applied to bf16 q before the product (right at 1e-1, not 1e-2)",
        "scale left out": "scale 1/sqrt(D) missing or applied twice",
        "scale applied twice": "scale 1/sqrt(D) missing or applied twice",
        "no max subtraction": "no max subtraction: exp overflows (inf/NaN) on large scores",
        "bottom_right aligned as top_left": "bottom_right treated as top_left",
        "no tl.store": "every output is 0, whatever the input",
    },
    "q5": {
        "one scale for the whole tensor": "one scale for the whole tensor instead of per 64-row block",
        "P cast to E4M3 unscaled": "P cast to E4M3 unscaled (small probabilities flushed to 0)",
        "V's block scale left out": "a block scale left out when dequantizing (V's)",
        "K's block scale left out": "a block scale left out when dequantizing (K's)",
        "Hadamard on Q only": "Hadamard applied to Q only (or to K only) => wrong scores",
        "Hadamard on K only": "Hadamard applied to Q only (or to K only) => wrong scores",
        "hadamard ignored": "hadamard=True ignored (no error reduction)",
        "fp32 output": "output not bf16",
    },
}

CHECKS = {
    "q1": lab07.check_quantize,
    "q2": lab07.check_w8a8,
    "q3": lab07.check_smooth_quant,
    "q4": lab07.check_flash_attention,
    "q5": lab07.check_flash_attention_fp8,
}

RIGHT = {  # the switch kernels with every switch right
    "q1": lambda x, s=None: quantize_variant(x, s),
    "q2": lambda a, b, sa, sb: w8a8_variant(a, b, sa, sb),
    "q3": lambda x, w, am, alpha=0.5: smooth_variant(x, w, am, alpha),
    "q4": lambda q, k, v, causal=False: attention_variant(q, k, v, causal),
    "q5": lambda q, k, v, causal=False, rotate=False: attention_fp8_variant(q, k, v, causal, rotate),
}

PACKAGE = {
    "q1": lambda x, s=None: int8.quantize_int8(x) if s is None else (int8.quantize_int8_with_scale(x, s), s),
    "q2": lambda a, b, sa, sb: int8.w8a8_matmul(a, b, sa, sb),
    "q3": lambda x, w, am, alpha=0.5: int8.smooth(x, w, int8.smoothquant_scales(am, w, alpha)),
    "q4": lambda q, k, v, causal=False: attention.flash_attention(q, k, v, causal),
    "q5": lambda q, k, v, causal=False, rotate=False: attention.flash_attention_fp8(q, k, v, causal, hadamard=rotate),
}


def test_every_question_has_wrong_solutions_with_expectations():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == set(EXPECTED) == set(RIGHT) == set(PACKAGE) == set(STUDENT_SOLUTIONS)
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
        acc = (a.double() @ b.double().T).to(torch.bfloat16).float()  # exact (|sum| < 2^53); CUDA has no int64 mm
        return (acc * sa * sb.T).to(torch.bfloat16)

    with pytest.raises(AssertionError, match="bound 2\\^-8"):
        lab07.check_w8a8(bf16_before_scales)


def test_smooth_inputs_show_the_w8a8_error_dropping(capsys):
    lab07.check_smooth_quant(RIGHT["q3"])
    out = capsys.readouterr().out
    before, after = (float(v) for v in out.split("at alpha 0.5: ")[1].replace(" after", "").split(" before, "))
    assert after < 0.5 * before


def test_attention_kernel_with_three_mistakes_gets_each_diagnosis():
    """The lab's starting kernel: masked scores 0, no rescaling, no guard at the end."""
    with pytest.raises(AssertionError) as info:
        lab07.check_flash_attention(
            lambda q, k, v, c=False: attention_variant(q, k, v, c, mask=ATTN_MASK_ZERO, rescale=False, guard=False)
        )
    message = str(info.value)
    assert "masked scores set to 0 instead of -inf" in message and "no running-max correction" in message


def test_fp8_attention_kernel_with_three_mistakes_gets_each_diagnosis():
    """The lab's starting FP8 kernel: one scale for the tensor, P unscaled, the rotation ignored."""
    with pytest.raises(AssertionError) as info:
        lab07.check_flash_attention_fp8(
            lambda q, k, v, c=False, r=False: attention_fp8_variant(
                q, k, v, c, r, per_tensor=True, p_scale=1.0, rotate=""
            )
        )
    message = str(info.value)
    for smell in ("one scale for the whole tensor", "P cast to E4M3 unscaled", "hadamard=True ignored"):
        assert smell in message, message


def test_attention_inputs_are_fixed_and_make_their_hazards_happen():
    a, b = lab07.attention_inputs(), lab07.attention_inputs()
    assert a.keys() == b.keys() and all(torch.equal(a[k].q, b[k].q) and torch.equal(a[k].v, b[k].v) for k in a)
    masked = a["bottom_right, N_q > N_k: the first 60 rows see no key"]
    _, lse = attention.attention_reference(masked.q, masked.k, masked.v, masked.causal)
    assert int((~torch.isfinite(lse)).sum()) == 60
    large = a["scores up to 100"]
    top = (large.q.double() @ large.k.double().transpose(-1, -2)).abs().max() / math.sqrt(large.q.shape[-1])
    assert 88.7 < float(top) < 110.0  # beyond e^88.7, fp32's largest exponential
    long_row = a[f"nearly equal scores, N_k = {lab07.ATTN_LONG_N_K}"]
    assert long_row.k.shape[2] == lab07.ATTN_LONG_N_K
    s = (long_row.q.double() @ long_row.k.double().transpose(-1, -2)) / math.sqrt(long_row.q.shape[-1])
    assert float((s.amax(-1) - s.amin(-1)).max()) < 0.3  # every p above e^-0.3 = 0.74: l sums N_k terms near 1


@pytest.mark.parametrize("block_n", [32, 64])
def test_the_long_row_is_where_a_bf16_sum_starts_failing(block_n):
    """ATTN_LONG_N_K is the shortest row (a power of two) on which l in bf16 leaves the tolerance with the
    package's tile of 64 keys: at half of it the bf16 kernel passes, at it fp32 still passes easily."""
    g = torch.Generator().manual_seed(1)
    short, long_row = (lab07._attn_nearly_equal(g, 64, n, 32) for n in (lab07.ATTN_LONG_N_K // 2, lab07.ATTN_LONG_N_K))

    def excess(case, **kw):
        q, k, v = (t.to(DEVICE) for t in (case.q, case.k, case.v))  # the cases are built on the host
        o = attention_variant(q, k, v, block_n=block_n, **kw).double().cpu()
        want, _ = attention.attention_reference(case.q, case.k, case.v)
        return float(lab07._attn_excess(o, want, lab07.ATTN_TOL).max())

    assert excess(long_row) < 0.5 and excess(long_row, state=ATTN_STATE_L_BF16) > 1.0
    if block_n == 64:
        assert excess(short, state=ATTN_STATE_L_BF16) < 1.0


def test_fp8_inputs_make_a_tensor_scale_and_an_unscaled_p_fail():
    inputs = lab07.fp8_attention_inputs()
    magnitudes = inputs["a 2^16 block no query sees"]
    unseen = torch.arange(magnitudes.k.shape[2]) >= magnitudes.q.shape[2]
    assert float(magnitudes.v[:, :, unseen].abs().max()) > 2.0**12 * float(magnitudes.v[:, :, ~unseen].abs().max())
    small = inputs["small probabilities"]
    s = (small.q.double() @ small.k.double().transpose(-1, -2)) / math.sqrt(small.q.shape[-1])
    p = torch.softmax(s, -1)
    flushed = (torch.exp(s - s.amax(-1, keepdim=True)) < 2.0**-10).double()
    assert float((p * flushed).sum(-1).min()) > 0.1  # what an unscaled P loses of each row's weight


def test_fresh_attention_inputs_are_deterministic_and_refuse_bad_sizes():
    a, b = lab07.fresh_attention_inputs(3), lab07.fresh_attention_inputs(3)
    assert all(torch.equal(a[k].q, b[k].q) for k in a)
    assert max(c.q.shape[2] for c in a.values()) == 150
    c, d = lab07.fresh_fp8_attention_inputs(4), lab07.fresh_fp8_attention_inputs(4)
    assert all(torch.equal(c[k].k, d[k].k) for k in c) and all(x.q.shape[0] in (1, 2) for x in c.values())
    for bad in (
        lambda: lab07.fresh_attention_inputs(1, n_q=40, n_k=50),
        lambda: lab07.fresh_attention_inputs(1, d=48),
        lambda: lab07.fresh_fp8_attention_inputs(1, batch=0),
    ):
        with pytest.raises(ValueError, match="want"):
            bad()


# -- right solutions, written the ways different students write them ---------------------------------------
# Each differs from the others (and from the variant kernels above) where compiled Triton and CPU mode
# could disagree: one program per row or a tile of rows, scales on the host or on the device, rounding
# by 1.5 * 2^23, by 2^23 on |y| or by floor and a parity test; GEMM tiles, grid orders and epilogues;
# attention tiles, exp or exp2, masks by tl.where or by -inf added, grids and strides, FP8 codes made on
# the host or in the kernel, Hadamard rotations of other blocks.


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


@triton.jit
def _attention_exp2_where_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, N_Q, N_K, SHIFT, qk_scale, D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + bh * N_Q * D
    kv_off = bh * N_K * D
    q = tl.load(q_base + rows[:, None] * D + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv = kv_off + cols[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + kv, mask=cols[:, None] < N_K, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # log2 units
        keep = (cols[None, :] < N_K) & ((cols[None, :] <= rows[:, None] + SHIFT) | (CAUSAL == 0))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        corr = tl.exp2(m_i - m_safe)
        v = tl.load(v_ptr + kv, mask=cols[:, None] < N_K, other=0.0)
        acc = acc * corr[:, None] + tl.dot(p.to(tl.bfloat16), v)
        l_i = l_i * corr + tl.sum(p, axis=1)
        m_i = m_new
    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(o_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(tl.bfloat16),
             mask=rows[:, None] < N_Q)  # fmt: skip


def attention_exp2_where(q, k, v, causal=False):
    """q4 with exp2 and log2(e) folded into the scale, every mask by tl.where, a 2-D grid (query tiles,
    batch x head), 64 x 32 tiles."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    shift = n_k - n_q if causal == "bottom_right" else 0
    grid = (triton.cdiv(n_q, 64), b * h)
    _attention_exp2_where_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), o, n_q, n_k, shift, LOG2E / math.sqrt(d), D=d,
        CAUSAL=1 if causal else 0, BLOCK_M=64, BLOCK_N=32,
    )  # fmt: skip
    return o


@triton.jit
def _attention_exp_bias_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, N_Q, N_K, SHIFT, sm_scale, D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One (batch, head) per launch: the pointers already point at it.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    hi = N_K
    if CAUSAL:  # no key block past the last row's diagonal
        hi = tl.minimum(N_K, tl.maximum(tl.program_id(0) * BLOCK_M + BLOCK_M + SHIFT, 0))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        v = tl.load(v_ptr + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        bias = tl.where(cols[None, :] < N_K, 0.0, float("-inf"))
        if CAUSAL:
            bias += tl.where(cols[None, :] > rows[:, None] + SHIFT, float("-inf"), 0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale + bias
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        empty = m_new == float("-inf")
        p = tl.exp(s - tl.where(empty, 0.0, m_new)[:, None])
        scale_old = tl.where(empty, 1.0, tl.exp(m_i - m_new))
        l_i = l_i * scale_old + tl.sum(p, axis=1)
        acc = acc * scale_old[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    tl.store(o_ptr + rows[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < N_Q)


def attention_exp_bias_host_loop(q, k, v, causal=False):
    """q4 with natural exp, the causal mask added as a bias of -inf, a host loop over (batch, head) with
    a 1-D grid each, 16 x 64 tiles, and the key loop stopped at the diagonal."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    shift = n_k - n_q if causal == "bottom_right" else 0
    for i in range(b):
        for j in range(h):
            _attention_exp_bias_kernel[(triton.cdiv(n_q, 16),)](
                q[i, j].contiguous(), k[i, j].contiguous(), v[i, j].contiguous(), o[i, j], n_q, n_k, shift,
                1.0 / math.sqrt(d), D=d, CAUSAL=causal is not False, BLOCK_M=16, BLOCK_N=64,
            )  # fmt: skip
    return o


@triton.jit
def _attention_strided_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, H, N_Q, N_K, SHIFT,
    qk_scale, D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)  # the grid's first axis over (batch, head), as in Triton's tutorial
    b = pid_bh // H
    h = pid_bh % H
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqn + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(
            k_ptr + b * skb + h * skh + cols[:, None] * skn + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0
        )
        v = tl.load(
            v_ptr + b * svb + h * svh + cols[:, None] * svn + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0
        )
        s = tl.dot(q, tl.trans(k)) * qk_scale
        ok = cols[None, :] < N_K
        if CAUSAL:
            ok = ok & (cols[None, :] - rows[:, None] <= SHIFT)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.exp2(s - m_use[:, None]).to(tl.bfloat16)  # rounded once, and summed as rounded
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p.to(tl.float32), axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    o = acc / tl.maximum(l_i, 1e-30)[:, None]  # an empty row: 0 / tiny = 0
    tl.store(
        o_ptr + b * sob + h * soh + rows[:, None] * son + offs_d[None, :], o.to(tl.bfloat16), mask=rows[:, None] < N_Q
    )


def attention_strided(q, k, v, causal=False):
    """q4 with strides passed (no copies), the grid's first axis over (batch, head), 128 x 128 tiles, P
    rounded to bf16 once and l summed from the rounded P."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    shift = n_k - n_q if causal == "bottom_right" else 0
    _attention_strided_kernel[(b * h, triton.cdiv(n_q, 128))](
        q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], h, n_q, n_k, shift,
        LOG2E / math.sqrt(d), D=d, CAUSAL=bool(causal), BLOCK_M=128, BLOCK_N=128,
    )  # fmt: skip
    return o


def fp8_attention_host_codes(q, k, v, causal=False, hadamard_rotation=False):
    """q5 quantizing Q, K and V in torch on the host (the variant kernel's right switches), tiles of 64 x 32
    keys, the rotation a whole-head random Hadamard matrix multiplied in torch."""
    return attention_fp8_variant(q, k, v, causal, hadamard_rotation, block_n=32)


@triton.jit
def _e4m3_block(x, ROWS: tl.constexpr):
    """A tile's E4M3 codes and its reconstruction scale S = amax / 448 (1 for an all-zero tile)."""
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    s = tl.where(amax > 0.0, tl.math.div_rn(amax, 448.0), 1.0)
    return (x * tl.math.div_rn(1.0, s)).to(tl.float8e4nv), s


@triton.jit
def _attention_fp8_in_kernel_kernel(
    q_ptr, k_ptr, v_ptr, r_ptr, o_ptr, N_Q, N_K, SHIFT, sm_scale, D: tl.constexpr, CAUSAL: tl.constexpr,
    ROTATE: tl.constexpr,
):  # fmt: skip
    # bf16 tiles of 64 rows loaded, rotated (fp32 dot with R), quantized and multiplied here: nothing on
    # the host but the launch.  Every program quantizes the K and V blocks it reads again.
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * 64 + tl.arange(0, 64)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    q = q.to(tl.float32)
    if ROTATE:
        r = tl.load(r_ptr + offs_d[:, None] * D + offs_d[None, :])
        q = tl.dot(q, r, input_precision="ieee").to(tl.bfloat16).to(tl.float32)
    q8, sq = _e4m3_block(q, 64)
    m_i = tl.full([64], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([64], dtype=tl.float32)
    acc = tl.zeros([64, D], dtype=tl.float32)
    for start_n in range(0, N_K, 64):
        cols = start_n + tl.arange(0, 64)
        k = tl.load(k_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        k = k.to(tl.float32)
        if ROTATE:
            k = tl.dot(k, r, input_precision="ieee").to(tl.bfloat16).to(tl.float32)
        k8, sk = _e4m3_block(k, 64)
        v = tl.load(v_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        v8, sv = _e4m3_block(v.to(tl.float32), 64)
        s = tl.dot(q8, tl.trans(k8)) * (sq * sk * sm_scale)
        seen = cols[None, :] < N_K
        if CAUSAL:
            seen = seen & (cols[None, :] <= rows[:, None] + SHIFT)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_ref[:, None])
        alpha = tl.exp(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot((p * 256.0).to(tl.float8e4nv), v8) * (sv * 0.00390625)  # / 256
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + bh * N_Q * D + rows[:, None] * D + offs_d[None, :], out.to(tl.bfloat16), mask=rows[:, None] < N_Q)


def fp8_attention_in_kernel(q, k, v, causal=False, hadamard_rotation=False):
    """q5 with the quantization inside the kernel (a 64-row tile's amax, S, codes) and the rotation too: R
    = diag(signs) H / sqrt(32) in blocks of 32 channels (block-diagonal), natural exp."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    r32 = hadamard.random_signs(32, seed=7)[:, None] * hadamard.hadamard_matrix(32)
    r = torch.block_diag(*[r32] * (d // 32)).to(q.device).contiguous()
    o = torch.empty_like(q)
    shift = n_k - n_q if causal == "bottom_right" else 0
    _attention_fp8_in_kernel_kernel[(triton.cdiv(n_q, 64), b * h)](
        q.contiguous(), k.contiguous(), v.contiguous(), r, o, n_q, n_k, shift, 1.0 / math.sqrt(d), D=d,
        CAUSAL=bool(causal), ROTATE=bool(hadamard_rotation),
    )  # fmt: skip
    return o


def fp8_attention_rotated_in_blocks_of_16(q, k, v, causal=False, hadamard_rotation=False):
    """q5 with Lab 6's blockwise rotation (kernels.hadamard.hadamard_rotate, blocks of 16 channels, its
    own signs) and the host's codes, 64 x 64 tiles."""
    if hadamard_rotation:
        signs = hadamard.random_signs(16, seed=3, device=q.device)
        q, k = hadamard.hadamard_rotate(q, 16, signs), hadamard.hadamard_rotate(k, 16, signs)
    return attention_fp8_variant(q, k, v, causal)


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
    "q4": {
        "exp2, tl.where masks, 2-D grid, 64 x 32 tiles": attention_exp2_where,
        "exp, -inf bias, host loop over (batch, head), 16 x 64 tiles, early stop": attention_exp_bias_host_loop,
        "strides, (batch x head) first, 128 x 128 tiles, l from the rounded P": attention_strided,
    },
    "q5": {
        "codes from torch on the host, 64 x 32 tiles, whole-head rotation": fp8_attention_host_codes,
        "quantized and rotated inside the kernel, natural exp": fp8_attention_in_kernel,
        "Lab 6's rotation in blocks of 16": fp8_attention_rotated_in_blocks_of_16,
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


@pytest.mark.parametrize("name", list(STUDENT_SOLUTIONS["q4"]))
def test_student_attention_agrees_with_the_package(name):
    """The lab's final cell: within two bf16 steps of kernels.attention on a larger causal input."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 2, 150, 64, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(3))
    ours = STUDENT_SOLUTIONS["q4"][name](q, k, v, True).float()
    assert (ours - attention.flash_attention(q, k, v, True).float()).abs().max().item() <= 2e-2


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


def attention_one_row_tile(q, k, v, causal=False):
    """One program of 128 query rows per (batch, head), no grid over query tiles: right while N_q <= 128,
    as on every public input; the rows past 128 stay as allocated, zero."""
    b, h, n_q, d = q.shape
    o = torch.zeros_like(q)
    shift = k.shape[2] - n_q if causal == "bottom_right" else 0
    _attention_exp2_where_kernel[(1, b * h)](
        q.contiguous(), k.contiguous(), v.contiguous(), o, n_q, k.shape[2], shift, LOG2E / math.sqrt(d), D=d,
        CAUSAL=1 if causal else 0, BLOCK_M=128, BLOCK_N=64,
    )  # fmt: skip
    return o


def fp8_attention_heads_only(q, k, v, causal=False, hadamard_rotation=False):
    """A grid over the heads only, (cdiv(N_q, 64), H): the public inputs have one sequence each, so batch
    element 1 and beyond are never computed."""
    return attention_fp8_variant(q, k, v, causal, hadamard_rotation, heads_only=True)


HIDDEN_CATCHES = {
    "q1": {"one tile of 128 columns per row, no loop over K": quantize_one_tile_of_128},
    "q2": {"one tile of 32 token rows": w8a8_one_row_tile},
    "q3": {"act_amax recomputed from x": smooth_own_amax},
    "q4": {"one tile of 128 query rows": attention_one_row_tile},
    "q5": {"a grid over the heads of the first sequence only": fp8_attention_heads_only},
}

ARGUMENT = {
    "q1": "quantize_int8",
    "q2": "w8a8_matmul",
    "q3": "smooth_quant",
    "q4": "flash_attention",
    "q5": "flash_attention_fp8",
}


def hidden_cases(question: str) -> list:
    """The hidden otter test cases of ``question``, from solutions/hidden_tests/."""
    from otter.test_files.exception_test import test_case

    env = runpy.run_path(str(ROOT / "solutions" / "hidden_tests" / "07_inference" / f"{question}.py"))
    assert env["name"] == question
    cases = [v for v in env.values() if isinstance(v, test_case)]
    assert cases and all(c.hidden for c in cases)
    assert all(c._get_func_params() == [ARGUMENT[question]] for c in cases)
    return cases


@pytest.mark.parametrize("q", list(CHECKS))
def test_hidden_tests_pass_the_right_solutions(q, capsys):
    students = list(STUDENT_SOLUTIONS[q].values())
    for case in hidden_cases(q):
        for right in (PACKAGE[q], students[0], students[-1]):
            case.call_func({ARGUMENT[q]: right})
    assert capsys.readouterr().out.count(f"{q} passed") >= 3


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


def test_rows_never_computed_get_their_diagnosis():
    with pytest.raises(AssertionError, match="query rows left at zero where the output is not"):
        lab07.check_flash_attention(attention_one_row_tile, inputs=lab07.fresh_attention_inputs(11))
    with pytest.raises(AssertionError, match="query rows left at zero where the output is not"):
        lab07.check_flash_attention_fp8(fp8_attention_heads_only, inputs=lab07.fresh_fp8_attention_inputs(12))


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


# -- the lab notebook's kernels: the solution's pass, the starting ones get the diagnoses of their mistakes --


_PROMPT_MARK = re.compile(r'"""\s*# (BEGIN|END) PROMPT')
_SOLUTION_MARK = re.compile(r"# (BEGIN|END) SOLUTION")


def _cell_as(source: str, student: bool) -> str:
    """A solution cell as the lab shows it (``student``: each SOLUTION block dropped, each PROMPT block's
    text kept) or as the solution runs it (each PROMPT block dropped)."""
    drop, skip = (_SOLUTION_MARK, _PROMPT_MARK) if student else (_PROMPT_MARK, _SOLUTION_MARK)
    lines, inside = [], False
    for line in source.splitlines():
        mark = line.strip()
        if drop.match(mark):
            inside = "BEGIN" in mark
        elif not (inside or skip.match(mark)):
            lines.append(line)
    return "\n".join(lines)


def _attention_lab_module(tmp_path, starting: bool):
    """The lab's attention kernels and host functions (q4, q5) as an importable module (``@triton.jit``
    reads its function's source from a file): the solution's, or the starting ones a student is given."""
    import importlib.util

    import nbformat

    path = ROOT / ("labs" if starting else "solutions") / "07_inference.ipynb"
    keep = ("@triton.jit\ndef attention_kernel", "def flash_attention(", "BLOCK = 64")
    sources = [
        "import math\n\nimport torch\nimport triton\nimport triton.language as tl\n\nfrom kernels import hadamard"
    ]
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.startswith(keep):
            sources.append(_cell_as(cell.source, student=starting))
    assert len(sources) == 4, f"{path}: the attention cells were not found"
    module_path = tmp_path / f"lab07_attention_{'start' if starting else 'solution'}.py"
    module_path.write_text("\n\n".join(sources) + "\n")
    spec = importlib.util.spec_from_file_location(module_path.stem, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lab_solution_kernels_pass(tmp_path, capsys):
    sol = _attention_lab_module(tmp_path, starting=False)
    lab07.check_flash_attention(sol.flash_attention)
    lab07.check_flash_attention_fp8(sol.flash_attention_fp8)
    assert capsys.readouterr().out.count("passed") == 2


def test_the_lab_starting_kernels_get_the_diagnoses_of_their_mistakes(tmp_path):
    start = _attention_lab_module(tmp_path, starting=True)
    with pytest.raises(AssertionError) as info:
        lab07.check_flash_attention(start.flash_attention)
    message = str(info.value)
    assert "masked scores set to 0 instead of -inf" in message and "no running-max correction" in message
    with pytest.raises(AssertionError) as info:
        lab07.check_flash_attention_fp8(start.flash_attention_fp8)
    message = str(info.value)  # the three the lab's prose names
    for smell in ("one scale for the whole tensor", "P cast to E4M3 unscaled", "hadamard=True ignored"):
        assert smell in message, message
