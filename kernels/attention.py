"""Attention's numerics: a FlashAttention-style forward kernel with its softmax state in fp32, and the
float64 reference it is checked against.

Chapter 7 (inference in low precision) and Lab 07 (its attention questions).  Entry points: :func:`flash_attention`,
:func:`flash_attention_fp8`, :func:`attention_reference`, :func:`causal_mask`.

``O = softmax(Q K^T * scale + mask) V`` for ``Q`` ``(B, H, N_q, D)``, ``K`` and ``V`` ``(B, H, N_k, D)``
in bf16 or fp16.  The kernel never forms the ``N_q x N_k`` matrix: each program owns ``BLOCK_M`` query
rows and walks the keys ``BLOCK_N`` at a time, keeping per row the running maximum ``m`` and the
running sum of exponentials ``l`` (fp32), and the output accumulator (fp32).  A new block of scores
``s`` moves the maximum to ``m' = max(m, max(s))``; the old sum and accumulator are rescaled by
``exp(m - m')``, the block adds ``exp(s - m')`` to ``l`` and ``exp(s - m') V`` to the accumulator; at
the end ``O = acc / l``.  Exponentials are taken base 2 with ``log2(e)`` folded into the scale.

What stays wide, and why (each is a failure the chapter makes happen):

* ``m`` and ``l`` in fp32: ``l`` sums up to ``N_k`` terms of at most 1, and in bf16 a sum of thousands
  of terms near 1 stops growing (each addition below half a unit of its last place is lost);
* the accumulator in fp32, for the same reason, rescaled rather than recomputed;
* the scale applied to the fp32 scores, not folded into bf16 ``Q`` before the product (a bf16 ``Q``
  times ``1/sqrt(D)`` is rounded once more, and the error is largest on the largest scores);
* a row whose keys are all masked (``causal="bottom_right"`` with ``N_q > N_k`` masks the first rows
  entirely) has ``m = -inf``; ``exp(-inf - (-inf))`` is NaN, so the kernel takes exponentials against
  0 in that case and writes zeros for the row (and ``-inf`` for its log-sum-exp), where a naive kernel
  writes NaN.

``causal``: False (no mask), True or "top_left" (query ``i`` sees keys ``j <= i``, PyTorch's
``is_causal``), or "bottom_right" (``j <= i + N_k - N_q``, the alignment of decoding with a cache).
"""

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import kernels
from kernels.device import check_device
from kernels.testing import Tolerance

CAUSAL = {False: 0, True: 1, "top_left": 1, "bottom_right": 2}
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634
# The same tiles on both lanes (the order of the online softmax's updates follows the key blocks):
# 128 query rows by 128 keys; for head_dim 256, 64 keys and two stages, which keeps Q and the pipelined
# K and V tiles inside shared memory.
BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 128}
BLOCKS_WIDE = {"BLOCK_M": 128, "BLOCK_N": 64}
GPU_LAUNCH = {"num_warps": 8, "num_stages": 3}
GPU_LAUNCH_WIDE = {"num_warps": 8, "num_stages": 2}
FP8_BLOCK = 64  # rows of Q, K and V that share one FP8 scale; also the FP8 kernel's step along the keys
FP8_BLOCK_M = 64  # query rows per program of the FP8 kernel: one block of Q's scales, one warp group
FP8_GPU_LAUNCH = {"num_warps": 4, "num_stages": 3}
# The attention forward's output against float64 attention, by the dtype of its products (atol = rtol).
TOLERANCES = {
    "bf16": Tolerance(
        1e-2, 1e-2, "two bf16-input GEMMs around an fp32 softmax; P rounded to bf16 before P V, O rounded once"
    ),
    "fp8": Tolerance(5e-2, 5e-2, "Q, K, V and P in e4m3 (2^-4 relative each): the scores' error is magnified by exp"),
}
P_SCALE = 256.0  # P in [0, 1] is cast to E4M3 as 256 P (exact: a power of two), keeping P >= 2^-17


@triton.jit
def _key_range(start_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_Q, N_K, CAUSAL: tl.constexpr):
    """``(shift, full, hi)``: key j is visible to query i if j <= i + shift (causal); the key blocks before
    ``full`` (a multiple of ``BLOCK_N``) are visible to every row of start_m .. start_m + BLOCK_M - 1 and
    lie inside N_K, so they need no mask; the blocks from ``full`` to ``hi`` need one; no block from ``hi``
    on holds a key visible to any of the rows."""
    shift = 0 if CAUSAL != 2 else N_K - N_Q
    hi = N_K
    full = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL != 0:  # no key block beyond the last row's diagonal; none masked before the first row's
        hi = tl.minimum(N_K, tl.maximum(start_m + BLOCK_M + shift, 0))
        full = tl.minimum(full, (tl.maximum(start_m + shift + 1, 0) // BLOCK_N) * BLOCK_N)
    return shift, full, hi


@triton.jit
def _query_block(BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """The query block of this program.  With a causal mask the last blocks see the most keys, so they
    are given the first program ids, which the GPU starts first: the long programs do not end the grid
    alone.  (The order changes no result: each program's rows are computed the same way.)"""
    pid = tl.program_id(0)
    if CAUSAL != 0:
        pid = tl.num_programs(0) - 1 - pid
    return pid * BLOCK_M


@triton.jit
def _softmax_step(s, cols, offs_m, shift, N_K, m_i, l_i, CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """One key block of the online softmax: mask the scores ``s`` (log2 units; ``MASKED`` False for a
    block that :func:`_key_range` found visible to every row), move the running maximum, and return
    ``(p, alpha, m_new, l_new)``, where the caller rescales its accumulator by ``alpha`` and adds ``p V``.
    A row with nothing visible yet takes its exponentials against 0, not -inf."""
    if MASKED:
        visible = cols[None, :] < N_K
        if CAUSAL != 0:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    base = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - base)
    p = tl.exp2(s - base[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _attn_block(acc, m_i, l_i, q, k_desc, v_desc, bh, start_n, offs_m, offs_n, shift, N_K, qk_scale,
                D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """One block of keys: scores, the online softmax's step, and ``P V`` added to the rescaled
    accumulator inside the second product.  K and V arrive through TMA descriptors, which fill rows
    past the end of the sequence with zeros; only a ``MASKED`` block masks its scores."""
    k = k_desc.load([bh, start_n, 0]).reshape(BLOCK_N, D)
    s = tl.dot(q, k.T) * qk_scale  # fp32 scores, in log2 units
    p, alpha, m_new, l_i = _softmax_step(s, start_n + offs_n, offs_m, shift, N_K, m_i, l_i, CAUSAL, MASKED)
    v = v_desc.load([bh, start_n, 0]).reshape(BLOCK_N, D)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _attn_fwd_kernel(
    q_desc, k_desc, v_desc, o_ptr, lse_ptr, N_Q, N_K, qk_scale,
    D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = _query_block(BLOCK_M, CAUSAL)
    bh = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = q_desc.load([bh, start_m, 0]).reshape(BLOCK_M, D)  # rows past N_Q come back as zeros
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    shift, full, hi = _key_range(start_m, BLOCK_M, BLOCK_N, N_Q, N_K, CAUSAL)
    for start_n in range(0, full, BLOCK_N):  # key blocks every row sees: no masks
        acc, m_i, l_i = _attn_block(
            acc, m_i, l_i, q, k_desc, v_desc, bh, start_n, offs_m, offs_n, shift, N_K, qk_scale, D, BLOCK_N, CAUSAL,
            False,
        )  # fmt: skip
    for start_n in range(full, hi, BLOCK_N):  # the diagonal's blocks and the last, partial one
        acc, m_i, l_i = _attn_block(
            acc, m_i, l_i, q, k_desc, v_desc, bh, start_n, offs_m, offs_n, shift, N_K, qk_scale, D, BLOCK_N, CAUSAL,
            True,
        )  # fmt: skip
    empty = l_i == 0.0  # every key masked: zeros, not 0 / 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    bh64 = bh.to(tl.int64)
    tl.store(o_ptr + bh64 * N_Q * D + offs_m[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < N_Q)  # fmt: skip
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # log2 units
    tl.store(lse_ptr + bh64 * N_Q + offs_m, lse, mask=offs_m < N_Q)


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, sequence, head_dim), got shape {tuple(t.shape)}")
        check_device(t, name)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must match, and share "
            "batch, heads and head_dim with q"
        )
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {list(HEAD_DIMS)}, got {q.shape[3]}")
    return _aligned(q), _aligned(k), _aligned(v)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte-aligned address, as a TMA descriptor needs (a view that starts
    mid-allocation is copied; the caller's tensor is never changed)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def tiles(head_dim: int) -> tuple:
    """``(blocks, gpu_launch)`` of the bf16 kernel for ``head_dim``: the same tiles on both lanes."""
    return (BLOCKS, GPU_LAUNCH) if head_dim <= 128 else (BLOCKS_WIDE, GPU_LAUNCH_WIDE)


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """A TMA descriptor of ``t`` ``(B, H, R, C)`` viewed as ``(B * H, R, C)``, loading ``rows`` x ``cols``
    tiles of one head (past R or C they read as zeros, never the next head's)."""
    b, h, r, c = t.shape
    return TensorDescriptor.from_tensor(t.view(b * h, r, c), [1, rows, cols])


def _check_args(q, k, v, causal, scale) -> tuple:
    """What both forwards check and default: ``(q, k, v, scale)``, contiguous, scale 1/sqrt(head_dim)."""
    if causal not in CAUSAL:
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    q, k, v = _check_qkv(q, k, v)
    return q, k, v, 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)


def flash_attention(q, k, v, causal=False, scale: float | None = None, return_lse: bool = False):
    """Attention forward without the score matrix in memory (see the module docstring): ``O`` in q's
    dtype, and with ``return_lse`` the natural-log log-sum-exp of each row's scores (fp32,
    ``(B, H, N_q)``; ``-inf`` for a row with every key masked).  ``scale`` defaults to
    ``1 / sqrt(head_dim)``."""
    q, k, v, scale = _check_args(q, k, v, causal, scale)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    if o.numel() and n_k:
        blocks, gpu_launch = tiles(d)
        launch = {} if kernels.INTERPRETER else gpu_launch
        grid = (triton.cdiv(n_q, blocks["BLOCK_M"]), b * h)
        bm, bn = blocks["BLOCK_M"], blocks["BLOCK_N"]
        descs = _descriptor(q, bm, d), _descriptor(k, bn, d), _descriptor(v, bn, d)
        _attn_fwd_kernel[grid](*descs, o, lse, n_q, n_k, scale * LOG2E, D=d, CAUSAL=CAUSAL[causal], **blocks, **launch)
    elif o.numel():  # no keys at all: every row is fully masked
        o.zero_()
        lse.fill_(float("-inf"))
    if return_lse:
        return o, lse / LOG2E
    return o


@triton.jit
def _attn_fp8_block(acc, m_i, l_i, q, sq, k_desc, sk_ptr, vt_desc, sv_ptr, bh, start_n, offs_m, offs_n, shift, N_K,
                    qk_scale, D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr, P_SCALE: tl.constexpr,
                    MASKED: tl.constexpr):  # fmt: skip
    """One block of ``BLOCK`` keys of the FP8 kernel (one scale for its K rows, one for its V rows);
    ``sq`` holds each query row's scale."""
    kb = start_n // BLOCK
    k = k_desc.load([bh, start_n, 0]).reshape(BLOCK, D)  # padded to NK_PAD: no mask
    sk = tl.load(sk_ptr + kb)
    s = tl.dot(q, k.T) * (sq * sk * qk_scale)[:, None]
    p, alpha, m_new, l_i = _softmax_step(s, start_n + offs_n, offs_m, shift, N_K, m_i, l_i, CAUSAL, MASKED)
    vt = vt_desc.load([bh, 0, start_n]).reshape(D, BLOCK)
    sv = tl.load(sv_ptr + kb)
    pv = tl.dot((p * P_SCALE).to(vt.dtype), vt.T)  # (BLOCK_M, D), fp32
    acc = acc * alpha[:, None] + pv * (sv / P_SCALE)
    return acc, m_new, l_i


@triton.jit
def _attn_fwd_fp8_kernel(
    q_desc, sq_ptr, k_desc, sk_ptr, vt_desc, sv_ptr, o_ptr, N_Q, N_K, NQ_PAD, NK_PAD, qk_scale,
    D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, P_SCALE: tl.constexpr,
):  # fmt: skip
    # The bf16 kernel's loop with FP8 operands: Q and K codes (E4M3, one scale per BLOCK rows) for the
    # scores, 256 P (E4M3) and V's codes (one scale per BLOCK keys, stored transposed so that both
    # operands of P V are K-major, as FP8 tensor cores want) for the output.  A program owns BLOCK_M query
    # rows and loads each row's own block's scale (one block when BLOCK_M == BLOCK); the keys go BLOCK at a
    # time, so the K and V scales are one number per step.  Each block's two products come out of the tensor cores
    # in fp32 and are scaled there, so the scales never meet a code.
    start_m = _query_block(BLOCK_M, CAUSAL)
    bh = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    q = q_desc.load([bh, start_m, 0]).reshape(BLOCK_M, D)  # rows past NQ_PAD come back as zeros
    sq = tl.load(sq_ptr + bh * (NQ_PAD // BLOCK) + offs_m // BLOCK, mask=offs_m < NQ_PAD, other=0.0)
    sk_ptr += bh * (NK_PAD // BLOCK)
    sv_ptr += bh * (NK_PAD // BLOCK)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    shift, full, hi = _key_range(start_m, BLOCK_M, BLOCK, N_Q, N_K, CAUSAL)
    # fmt: off
    for start_n in range(0, full, BLOCK):  # key blocks every row sees: no mask
        acc, m_i, l_i = _attn_fp8_block(acc, m_i, l_i, q, sq, k_desc, sk_ptr, vt_desc, sv_ptr, bh, start_n, offs_m,
                                        offs_n, shift, N_K, qk_scale, D, CAUSAL, BLOCK, P_SCALE, False)
    for start_n in range(full, hi, BLOCK):  # the diagonal's blocks and the last, partial one
        acc, m_i, l_i = _attn_fp8_block(acc, m_i, l_i, q, sq, k_desc, sk_ptr, vt_desc, sv_ptr, bh, start_n, offs_m,
                                        offs_n, shift, N_K, qk_scale, D, CAUSAL, BLOCK, P_SCALE, True)
    # fmt: on
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    bh64 = bh.to(tl.int64)
    tl.store(o_ptr + bh64 * N_Q * D + offs_m[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < N_Q)  # fmt: skip


def _blocks_fp8(x: torch.Tensor, block: int) -> tuple:
    """E4M3 codes of ``x`` ``(B, H, N, D)`` with one scale per ``block`` rows of each head (the
    sequence padded with zeros to a multiple of ``block``): chapter 2's rowwise quantizer applied to
    the flattened blocks.  Returns ``(codes (B, H, N_pad, D), scales (B * H * N_pad / block,))``."""
    from kernels import quantize as Q

    b, h, n, d = x.shape
    n_pad = triton.cdiv(max(n, 1), block) * block
    padded = torch.zeros((b, h, n_pad, d), dtype=x.dtype, device=x.device)
    padded[:, :, :n] = x
    codes, s = Q.quantize_rowwise(padded.reshape(-1, block * d), "e4m3")
    return codes.reshape(b, h, n_pad, d), s.reshape(-1)


def flash_attention_fp8(q, k, v, causal=False, scale: float | None = None, hadamard: bool = False, seed: int = 0):
    """:func:`flash_attention` with both products in FP8 (E4M3): Q, K and V quantized in blocks of
    :data:`FP8_BLOCK` rows along the sequence, each with its own scale, P cast to E4M3 as ``256 P``; the
    output in q's dtype.  ``hadamard``: rotate Q and K along the head dimension by the same random
    orthonormal Hadamard matrix first (``(Q R)(K R)^T = Q K^T``; blocks of up to 128 of the head's
    channels, :data:`kernels.hadamard.HADAMARD_BLOCKS`), which spreads an outlier channel over its block
    and lowers each block's amax relative to its typical value (FlashAttention-3's incoherent
    processing)."""
    q, k, v, scale = _check_args(q, k, v, causal, scale)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    if d < 32:
        raise ValueError(
            f"head_dim must be at least 32 for FP8 attention (an FP8 tensor-core product needs K >= 32), got {d}"
        )
    if hadamard:
        from kernels import hadamard as HD

        block = max(b for b in HD.HADAMARD_BLOCKS if d % b == 0)  # the whole head, or blocks of it
        signs = HD.random_signs(block, seed, device=q.device)
        q, k = HD.hadamard_rotate(q, block, signs), HD.hadamard_rotate(k, block, signs)
    o = torch.empty_like(q)
    if o.numel() == 0:
        return o
    q8, sq = _blocks_fp8(q, FP8_BLOCK)
    k8, sk = _blocks_fp8(k, FP8_BLOCK)
    v8, sv = _blocks_fp8(v, FP8_BLOCK)
    vt = v8.transpose(2, 3).contiguous()  # (B, H, D, N_pad): codes moved, not requantized
    launch = {} if kernels.INTERPRETER else FP8_GPU_LAUNCH
    grid = (triton.cdiv(n_q, FP8_BLOCK_M), b * h)
    q_desc, k_desc = _descriptor(q8, FP8_BLOCK_M, d), _descriptor(k8, FP8_BLOCK, d)
    vt_desc = _descriptor(vt, d, FP8_BLOCK)
    _attn_fwd_fp8_kernel[grid](
        q_desc, sq, k_desc, sk, vt_desc, sv, o, n_q, n_k, q8.shape[2], k8.shape[2], scale * LOG2E,
        D=d, CAUSAL=CAUSAL[causal], BLOCK_M=FP8_BLOCK_M, BLOCK=FP8_BLOCK, P_SCALE=P_SCALE, **launch,
    )  # fmt: skip
    return o


def causal_mask(n_q: int, n_k: int, causal, device=None) -> torch.Tensor:
    """The boolean ``(n_q, n_k)`` mask of visible keys for ``causal`` (True where query i sees key j)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    if CAUSAL[causal] == 0:
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    shift = 0 if CAUSAL[causal] == 1 else n_k - n_q
    return j <= i + shift


def attention_reference(q, k, v, causal=False, scale: float | None = None, dtype=torch.float64):
    """Attention in ``dtype`` (float64 by default) from the same inputs, with the kernel's rule for a
    fully masked row (zeros).  Returns ``(O, lse)`` in ``dtype``."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale
    visible = causal_mask(q.shape[-2], k.shape[-2], causal, q.device)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return p @ v.to(dtype), lse


__all__ = [
    "BLOCKS",
    "CAUSAL",
    "FP8_BLOCK",
    "HEAD_DIMS",
    "P_SCALE",
    "TOLERANCES",
    "attention_reference",
    "causal_mask",
    "flash_attention",
    "flash_attention_fp8",
]
