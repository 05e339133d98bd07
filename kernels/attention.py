"""Attention's numerics: a FlashAttention-style forward kernel with its softmax state in fp32, and the
float64 reference it is checked against.

Chapter 7 (inference in low precision), no lab yet.  Entry points: :func:`flash_attention`,
:func:`attention_reference`, :func:`causal_mask`.

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

import kernels
from kernels.device import check_device

CAUSAL = {False: 0, True: 1, "top_left": 1, "bottom_right": 2}
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634
GPU_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
CPU_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32}


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N_Q, N_K, qk_scale,
    D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * N_Q * D + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < N_Q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    shift = 0 if CAUSAL != 2 else N_K - N_Q  # key j is visible to query i if j <= i + shift
    hi = N_K
    if CAUSAL != 0:  # no key block beyond the last row's diagonal
        hi = tl.minimum(N_K, tl.maximum(start_m + BLOCK_M + shift, 0))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        s = tl.dot(q, k.T) * qk_scale  # fp32 scores, in log2 units
        visible = cols[None, :] < N_K
        if CAUSAL != 0:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        alpha = tl.exp2(m_i - base)
        p = tl.exp2(s - base[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + bh * N_K * D + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < N_K, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    empty = l_i == 0.0  # every key masked: zeros, not 0 / 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(o_ptr + bh * N_Q * D + offs_m[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < N_Q)  # fmt: skip
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # log2 units
    tl.store(lse_ptr + bh * N_Q + offs_m, lse, mask=offs_m < N_Q)


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
    return q.contiguous(), k.contiguous(), v.contiguous()


def flash_attention(q, k, v, causal=False, scale: float | None = None, return_lse: bool = False):
    """Attention forward without the score matrix in memory (see the module docstring): ``O`` in q's
    dtype, and with ``return_lse`` the natural-log log-sum-exp of each row's scores (fp32,
    ``(B, H, N_q)``; ``-inf`` for a row with every key masked).  ``scale`` defaults to
    ``1 / sqrt(head_dim)``."""
    if causal not in CAUSAL:
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    q, k, v = _check_qkv(q, k, v)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    if o.numel():
        cfg = CPU_CONFIG if kernels.INTERPRETER else GPU_CONFIG
        grid = (triton.cdiv(n_q, cfg["BLOCK_M"]), b * h)
        _attn_fwd_kernel[grid](q, k, v, o, lse, n_q, n_k, scale * LOG2E, D=d, CAUSAL=CAUSAL[causal], **cfg)
    if return_lse:
        return o, lse / LOG2E
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


__all__ = ["CAUSAL", "HEAD_DIMS", "attention_reference", "causal_mask", "flash_attention"]
