"""W4A16: bf16 activations times FP4 weights (NVFP4 or MXFP4), the weights dequantized on the fly.

Chapter 6 and Lab 06 (FP4 weight-only, the GEMM question).  Entry points: :func:`w4a16_matmul`,
:func:`w4a16_dot_scaled`, :func:`w4a16_matmul_reference`.

Three GEMMs over the same packed weights (:class:`kernels.fp4.FP4Tensor`):

* the ``tl.dot`` kernel (``_w4a16_kernel``, the one Lab 06 builds): each K step loads a tile of packed
  codes and its block scales, decodes them to bf16 in registers (:func:`kernels.fp4.e2m1_to_bf16_fast`
  times the scale, exact in bf16), and feeds bf16 tensor cores with an fp32 accumulator; the NVFP4
  tensor scale multiplies the accumulator once at the end.  The GPU autotunes it over
  :data:`W4A16_CONFIGS` (16-row blocks) or :data:`W4A16_BATCH_CONFIGS` (32 and 64);
* the Gluon kernel of :mod:`kernels.w4a16_mma` for decode shapes on Hopper (M <= 16), which writes the
  decoded weights straight into the registers of the tensor-core operand; :func:`w4a16_matmul` picks
  it wherever it applies;
* :func:`w4a16_dot_scaled`, where ``tl.dot_scaled`` reads MXFP4 itself (natively on Blackwell, emulated
  by Triton elsewhere).

Above :data:`DEQUANT_ABOVE_M` rows :func:`w4a16_matmul` runs neither kernel: it dequantizes the weight to
bf16 once and hands the product to ``torch.matmul`` (cuBLAS).  By then every path is slower than bf16
weights, and the kernel's gap grows with M, since each further row block decodes the whole weight again
(:func:`path` says which path a call takes).
"""

import torch
import triton
import triton.language as tl

import kernels
from kernels import w4a16_mma
from kernels.device import check_device
from kernels.fp4 import (
    FP4Tensor,
    block_values,
    check_fp4,
    dequantize_fp4_reference,
    e2m1_to_bf16,
    e2m1_to_bf16_fast,
    e8m0_to_bf16,
    fast_decode_ok,
)

# The W4A16 GEMM on the GPU autotunes over these (BLOCK_N, BLOCK_K, GATHER, num_warps, num_stages):
# W4A16_CONFIGS for one row block of 16 (decode, M <= 16); both sets, W4A16_CONFIGS and
# W4A16_BATCH_CONFIGS, for the 32- and 64-row blocks of larger M.  At M <= 16 and N = 8192,
# BLOCK_N <= 64 gives >= 128 programs, one per SM or more, each streaming its weight rows through the
# whole of K: the kernel is a stream of 4.5-bit weights, so what matters is bytes in flight per SM
# (BLOCK_N * BLOCK_K / 2 per stage, times num_stages).  GATHER picks how nibbles are unpacked (see the
# kernel).
W4A16_CONFIGS = [
    (bn, bk, g, w, st)
    for bn in (16, 32, 64)
    for bk in (256, 512)
    for g in (False, True)
    for w in (4, 8)
    for st in (3, 4)
]
# With 32 or 64 rows the tensor cores and the decode share the time: wider N tiles, shorter K steps and
# two or three stages led a sweep of 48 launches at M = 32, 64 and 128 on an H100 (NVFP4, N x K =
# 14336 x 4096 and 28672 x 8192); each of these was within 7% of the best at one of those points at least.
# On 8192 x 8192 the decode set did better at M = 32 and 64 (BLOCK_N = 128 gives that shape 64 programs,
# fewer than the SMs), so the larger row blocks tune over both sets.
W4A16_BATCH_CONFIGS = [
    (64, 64, False, 4, 3),
    (64, 64, False, 4, 4),
    (64, 128, False, 4, 2),
    (64, 128, False, 4, 3),
    (64, 128, False, 8, 3),
    (64, 256, False, 4, 2),
    (128, 64, False, 4, 3),
    (128, 64, False, 8, 3),
    (128, 128, False, 8, 2),
    (128, 128, False, 8, 3),
]
W4A16_CPU_CONFIG = (32, 64, False, 4, 1)  # the interpreter: one small config, no autotuning
# Above this many rows of activations the default is dequantize-then-matmul.  The tl.dot kernel's row
# block is at most 64 rows, so a larger M makes every row block decode the whole weight again, while a
# dequantized bf16 copy is written once (2.56 bytes per weight moved) and cuBLAS reuses it for every row.
# Measured with the fp4_w4a16_gemm benchmark on an H100 (four weight shapes, both formats): at M = 64 the
# kernel beats the copy everywhere (0.63-1.07x bf16 against 0.41-0.43x); at M = 128 the two are close and
# both lose to bf16 (copy 0.41-0.46x, kernel 0.36-0.55x: ahead on 14336 x 4096 and 28672 x 8192, behind on
# 4096 x 14336 and 8192 x 8192); past 128 rows the kernel's decode passes only grow, the copy's do not.
DEQUANT_ABOVE_M = 64
PATHS = ("mma", "dot", "dequant")


# -- the W4A16 GEMM: packed FP4 weights dequantized in registers, bf16 tensor cores -----------------


@triton.jit
def _w4a16_kernel(
    a_ptr,  # (M, K) bf16 activations
    q_ptr,  # (N, K // 2) uint8 packed weights
    s_ptr,  # (N, K // BS) uint8 block scales
    ts_ptr,  # NVFP4: the tensor scale (fp32)
    c_ptr,  # (M, N) bf16
    M,
    N,
    K,
    stride_am,
    stride_cm,
    BS: tl.constexpr,
    NV: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of BLOCK_K: no K masks in the loop
    GATHER: tl.constexpr,  # unpack by loading each byte twice (L1 hits) instead of join + reshape
    FAST: tl.constexpr,  # decode with e2m1_to_bf16_fast (3 integer ops per weight instead of ~10)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm[:, None] < M
    n_ok = rn[:, None] < N
    a_row = a_ptr + rm.to(tl.int64)[:, None] * stride_am  # (BLOCK_M, 1)
    q_row = q_ptr + rn.to(tl.int64)[:, None] * (K // 2)  # (BLOCK_N, 1)
    s_row = s_ptr + rn.to(tl.int64)[:, None] * (K // BS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk  # (BLOCK_K,) this step's K indices
        a_mask = m_ok if EVEN_K else m_ok & (kk[None, :] < K)
        a = tl.load(a_row + kk[None, :], mask=a_mask, other=0.0)  # (BLOCK_M, BLOCK_K) bf16
        if GATHER:
            w_mask = n_ok if EVEN_K else n_ok & (kk[None, :] < K)
            b = tl.load(q_row + (kk // 2)[None, :], mask=w_mask, other=0).to(tl.int32)  # (BLOCK_N, BLOCK_K)
            c = b >> ((kk & 1) * 4)[None, :]  # even k: low nibble, odd k: high (the decoders read bits 0-3)
            s = tl.load(s_row + (kk // BS)[None, :], mask=w_mask, other=0).to(tl.int32)  # (BLOCK_N, BLOCK_K)
            if NV:
                sw = s.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)  # exact: E4M3 fits bf16
            else:
                sw = e8m0_to_bf16(s)
            q = e2m1_to_bf16_fast(c) if FAST else e2m1_to_bf16(c)
            w = q * sw  # exact in bf16: 2 + 4 significant bits at most
        else:
            k2 = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            kg = k0 // BS + tl.arange(0, BLOCK_K // BS)
            b_mask = n_ok if EVEN_K else n_ok & (k2[None, :] < K // 2)
            g_mask = n_ok if EVEN_K else n_ok & (kg[None, :] < K // BS)
            b = tl.load(q_row + k2[None, :], mask=b_mask, other=0).to(tl.int32)  # (BLOCK_N, BLOCK_K // 2)
            s = tl.load(s_row + kg[None, :], mask=g_mask, other=0)  # (BLOCK_N, BLOCK_K // BS)
            # low nibble first; no "& 0xF": both decoders read only bits 0-3 of a code
            c = tl.reshape(tl.join(b, b >> 4), (BLOCK_N, BLOCK_K // BS, BS))
            if NV:
                sw = s.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
            else:
                sw = e8m0_to_bf16(s.to(tl.int32))
            q = e2m1_to_bf16_fast(c) if FAST else e2m1_to_bf16(c)
            w = tl.reshape(q * sw[:, :, None], (BLOCK_N, BLOCK_K))
        acc = tl.dot(a, tl.trans(w), acc)  # bf16 x bf16 -> fp32 accumulator
    if NV:
        acc = acc * tl.load(ts_ptr)  # the tensor scale, once per output
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(tl.bfloat16), mask=m_ok & (rn[None, :] < N))


def _configs(table):
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "GATHER": g}, num_warps=w, num_stages=st)
        for bn, bk, g, w, st in table
    ]


_DECODE_CONFIGS, _BATCH_CONFIGS = _configs(W4A16_CONFIGS), _configs(W4A16_BATCH_CONFIGS)


def configs_for_rows(configs, named_args, **kwargs):
    """The autotuner's pruning: the decode set for a 16-row block; for 32 or 64 rows both sets, less
    the tiles whose BLOCK_K does not divide K (``configs``, all of both, are not read)."""
    if kwargs["BLOCK_M"] <= 16:
        return _DECODE_CONFIGS
    return [c for c in _DECODE_CONFIGS + _BATCH_CONFIGS if named_args["K"] % c.kwargs["BLOCK_K"] == 0]


# Keyed on BLOCK_M, not M: the decode sizes 1..16 share a tile, and a new M does not rerun the tuning.
_w4a16_tuned = triton.autotune(
    configs=_DECODE_CONFIGS + _BATCH_CONFIGS,
    key=["N", "K", "BS", "NV", "BLOCK_M", "FAST"],
    prune_configs_by={"early_config_prune": configs_for_rows},
)(_w4a16_kernel)


def path(a: torch.Tensor, n: int, k: int) -> str:
    """Which implementation :func:`w4a16_matmul` runs by default for activations ``a`` (``(M, K)``, bf16)
    and an ``(n, k)`` weight: ``"dequant"`` above :data:`DEQUANT_ABOVE_M` rows, else ``"mma"`` where the
    Gluon kernel applies (:func:`kernels.w4a16_mma.supported`), else ``"dot"``."""
    a2 = a.reshape(-1, a.shape[-1])
    if a2.shape[0] > DEQUANT_ABOVE_M:
        return "dequant"
    return "mma" if w4a16_mma.supported(a2, n, k) else "dot"


def _dequant_matmul(a2: torch.Tensor, w: FP4Tensor) -> torch.Tensor:
    """``a2 @ W^T`` by dequantize-then-matmul: codes times block scales in bf16 (exact), one GEMM summing
    in fp32 (cuBLAS on the GPU), the NVFP4 tensor scale applied to the fp32 result, one rounding to bf16:
    the rounding of :func:`w4a16_matmul`'s kernels, with cuBLAS's order of summation."""
    nv = w.fmt == "nvfp4"
    wd = block_values(w)  # (N, K): exact in bf16
    if a2.device.type == "cuda" and not nv:
        return torch.matmul(a2, wd.T)  # cuBLAS: fp32 accumulation, one rounding to bf16
    if a2.device.type == "cuda":
        acc = torch.mm(a2, wd.T, out_dtype=torch.float32)
    else:  # the CPU has no bf16 GEMM with an fp32 result: the same products (exact in fp32), summed in fp32
        acc = a2.float() @ wd.float().T
    if nv:
        acc = acc * w.tensor_scale.float()
    return acc.to(torch.bfloat16)


def w4a16_matmul(
    a: torch.Tensor, w: FP4Tensor, config: tuple | None = None, fast: bool | None = None, kernel: str | None = None
) -> torch.Tensor:
    """``a @ W^T`` with ``a`` bf16 ``(..., K)`` and ``W`` an FP4 weight ``(N, K)`` (NVFP4 or MXFP4):
    the packed codes and scales are read from memory and dequantized in registers, the product runs on
    bf16 tensor cores with fp32 accumulation (the NVFP4 tensor scale multiplies the accumulator) and the
    output is bf16 ``(..., N)``.

    ``config`` = ``(BLOCK_N, BLOCK_K, GATHER, num_warps, num_stages)`` fixes the launch; by default the
    GPU autotunes over :data:`W4A16_CONFIGS` for M <= 16 (K a multiple of 512) and over it and
    :data:`W4A16_BATCH_CONFIGS` above (K a multiple of 256; the tiles that divide K), and the interpreter uses
    :data:`W4A16_CPU_CONFIG`.  ``fast`` picks the E2M1 decoder: the three-operation one
    (:func:`kernels.fp4.e2m1_to_bf16_fast`) or the one with selects; by default the fast one wherever
    :func:`kernels.fp4.fast_decode_ok` has found it exact on this device.  At decode shapes the kernel
    has ~2 integer operations per weight to spend before the integer units, not memory, set its speed.

    ``kernel`` picks the implementation: ``"dot"`` the ``tl.dot`` kernel above, ``"mma"`` the Gluon
    kernel of :mod:`kernels.w4a16_mma` (sm_90, 1 <= M <= 16, K a multiple of
    :func:`kernels.w4a16_mma.k_multiple`), which writes the decoded weights straight into the tensor-core
    operand's registers, ``"dequant"`` the weight dequantized to bf16 (exact: codes times block scales)
    and multiplied by ``torch.matmul`` with an fp32 result, the NVFP4 tensor scale applied to it before
    the one rounding to bf16.  By default (:func:`path`) ``"dequant"`` above :data:`DEQUANT_ABOVE_M` rows,
    else ``"mma"`` wherever it applies, else ``"dot"``; giving ``config`` or ``fast`` means ``"dot"``."""
    bs = check_fp4(w)
    if kernel not in (None, *PATHS):
        raise ValueError(f"kernel must be None, 'dot', 'mma' or 'dequant', got {kernel!r}")
    if kernel in ("mma", "dequant") and (config is not None or fast is not None):
        raise ValueError(f"config and fast choose among the tl.dot kernel's variants; kernel={kernel!r} takes neither")
    if not isinstance(a, torch.Tensor) or a.dtype != torch.bfloat16:
        raise TypeError(f"a must be a bfloat16 tensor of activations, got {getattr(a, 'dtype', type(a))}")
    if w.q.dim() != 2:
        raise ValueError(f"the weight must be a 2-D (N, K) matrix, got codes of shape {tuple(w.q.shape)}")
    n, k = w.shape
    if a.dim() < 1 or a.shape[-1] != k:
        raise ValueError(f"a's last dimension must be K = {k} (the weight's), got shape {tuple(a.shape)}")
    if config is not None and (len(config) != 5 or config[1] % bs or config[1] < 16 or config[0] < 16):
        raise ValueError(
            f"config must be (BLOCK_N >= 16, BLOCK_K a multiple of the block size {bs}, GATHER, num_warps, "
            f"num_stages), got {config!r}"
        )
    check_device(a, "a")
    if a.device != w.q.device:
        raise ValueError(f"a is on {a.device} but the weight is on {w.q.device}")
    a2 = a.reshape(-1, k).contiguous()
    m = a2.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if c.numel() == 0:
        return c.reshape(*a.shape[:-1], n)
    s = w.s.view(torch.uint8).contiguous()
    ts = w.tensor_scale.float().reshape(1) if w.fmt == "nvfp4" else s
    if kernel == "mma" and not w4a16_mma.supported(a2, n, k):
        raise ValueError(
            f"kernel='mma' needs an sm_90 GPU, 1 <= M <= {w4a16_mma.MAX_M} rows and K a multiple of "
            f"{w4a16_mma.k_multiple()}; got {a.device}, M = {m}, K = {k}"
        )
    if kernel is None:
        kernel = "dot" if config is not None or fast is not None else path(a2, n, k)
    if kernel == "dequant":
        return _dequant_matmul(a2, w).reshape(*a.shape[:-1], n)
    if kernel == "mma":
        w4a16_mma.w4a16_mma(a2, w.q.contiguous(), s, ts, c, w.fmt == "nvfp4")
        return c.reshape(*a.shape[:-1], n)
    block_m = min(max(16, triton.next_power_of_2(m)), 64)
    args = (a2, w.q.contiguous(), s, ts, c, m, n, k, a2.stride(0), c.stride(0))
    nv = w.fmt == "nvfp4"
    fast = fast_decode_ok(a.device) if fast is None else bool(fast)
    table = W4A16_BATCH_CONFIGS if block_m > 16 else W4A16_CONFIGS
    if config is None and (kernels.INTERPRETER or k % max(cfg[1] for cfg in table)):
        config = W4A16_CPU_CONFIG if kernels.INTERPRETER else (64, 128, True, 4, 3)
    if config is not None:
        bn, bk, gather, warps, stages = config
        grid = (triton.cdiv(n, bn), triton.cdiv(m, block_m))
        _w4a16_kernel[grid](
            *args, BS=bs, NV=nv, EVEN_K=k % bk == 0, GATHER=bool(gather), FAST=fast, BLOCK_M=block_m, BLOCK_N=bn,
            BLOCK_K=bk, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    else:

        def grid(meta):
            return (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, block_m))

        _w4a16_tuned[grid](*args, BS=bs, NV=nv, EVEN_K=True, FAST=fast, BLOCK_M=block_m)
    return c.reshape(*a.shape[:-1], n)


# -- Blackwell: the tensor cores read MXFP4 themselves (tl.dot_scaled) ----------------------------------

DOT_SCALED_CONFIG = (128, 128, 128, 8)  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps on the GPU
DOT_SCALED_CPU_CONFIG = (16, 32, 64, 4)


@triton.jit
def _dot_scaled_kernel(
    a_ptr, q_ptr, s_ptr, c_ptr, M, N, K, stride_am, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k2 = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kg = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        a = tl.load(a_ptr + rm.to(tl.int64)[:, None] * stride_am + kk[None, :], mask=rm[:, None] < M, other=0.0)
        # W^T as the right operand: (BLOCK_K // 2, BLOCK_N) packed along K, first element in the low nibble
        b = tl.load(q_ptr + rn.to(tl.int64)[None, :] * (K // 2) + k2[:, None], mask=rn[None, :] < N, other=0)
        s = tl.load(s_ptr + rn.to(tl.int64)[:, None] * (K // 32) + kg[None, :], mask=rn[:, None] < N, other=127)
        acc = tl.dot_scaled(a, None, "bf16", b, s, "e2m1", acc)  # s: (BLOCK_N, BLOCK_K // 32), not transposed
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def w4a16_dot_scaled(a: torch.Tensor, w: FP4Tensor) -> torch.Tensor:
    """``a @ W^T`` for an MXFP4 weight with ``tl.dot_scaled``: on Blackwell (sm_100) the tensor cores read
    the packed E2M1 codes and E8M0 scales directly; elsewhere Triton emulates it by upcasting to bf16.
    ``a`` bf16 ``(M, K)``, K a multiple of BLOCK_K (128 on the GPU); output bf16 ``(M, N)``."""
    check_fp4(w)
    if w.fmt != "mxfp4":
        raise ValueError(f"w must be MXFP4 (E8M0 scales, blocks of 32) for tl.dot_scaled, got {w.fmt}")
    if not isinstance(a, torch.Tensor) or a.dtype != torch.bfloat16 or a.dim() != 2:
        raise TypeError(f"a must be a 2-D bfloat16 tensor, got {getattr(a, 'dtype', type(a))}")
    n, k = w.shape
    bm, bn, bk, warps = DOT_SCALED_CPU_CONFIG if kernels.INTERPRETER else DOT_SCALED_CONFIG
    if a.shape[1] != k or k % bk:
        raise ValueError(f"a must be (M, K = {k}) with K a multiple of {bk}, got {tuple(a.shape)}")
    check_device(a, "a")
    m = a.shape[0]
    a = a.contiguous()
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if c.numel():
        grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
        _dot_scaled_kernel[grid](
            a, w.q.contiguous(), w.s.contiguous(), c, m, n, k, a.stride(0), c.stride(0), BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_K=bk, num_warps=warps,
        )  # fmt: skip
    return c


def w4a16_matmul_reference(a: torch.Tensor, w: FP4Tensor) -> torch.Tensor:
    """Dequantize then matmul, in float64 (the accuracy reference: exact products, one rounding)."""
    wd = dequantize_fp4_reference(w).double()
    return (a.double() @ wd.T).to(torch.bfloat16)


__all__ = [
    "DEQUANT_ABOVE_M",
    "DOT_SCALED_CONFIG",
    "DOT_SCALED_CPU_CONFIG",
    "PATHS",
    "W4A16_BATCH_CONFIGS",
    "W4A16_CONFIGS",
    "W4A16_CPU_CONFIG",
    "configs_for_rows",
    "path",
    "w4a16_dot_scaled",
    "w4a16_matmul",
    "w4a16_matmul_reference",
]
