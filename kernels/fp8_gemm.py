"""Scaled FP8 GEMMs: ``C = (S_a * A) @ (S_b * B)^T`` with FP8 codes, fp32 accumulation, bf16 output.

Chapter 5 and Lab 05 (FP8 GEMM).  Entry points: :func:`fp8_gemm`, :func:`fp8_gemm_rowwise`,
:func:`fp8_gemm_blockwise`, :func:`fp8_gemm_v1`, :func:`scaled_mm` (cuBLAS), :func:`fp8_gemm_reference`.

Operands and layout
-------------------
``a`` is ``(M, K)`` and ``b`` is ``(N, K)``, both row-major, so both are *K-major*: the layout Hopper's
FP8 tensor cores (wgmma) and cuBLAS's FP8 GEMMs demand for both operands.  A linear layer's forward
``Y = X W^T`` is exactly this with ``a = X`` and ``b = W``.  ``a`` is e4m3 or e5m2 (e5m2 for gradients),
``b`` is e4m3 (or e5m2).  The result is bf16 (or fp32 / fp16 with ``out_dtype``).

Scales are *reconstruction* scales ``S`` (``x ~= S * q``), what :mod:`kernels.quantize` returns and what
``torch._scaled_mm`` calls ``scale_a`` / ``scale_b``.  Three granularities:

* ``"tensor"``: one S per operand (any one-element fp32 tensor), applied once per output tile in the
  epilogue: ``C = S_a * S_b * (A_q @ B_q^T)``.
* ``"row"``: ``S_a`` of shape ``(M, 1)`` (one per row of ``a``) and ``S_b`` ``(N, 1)`` (one per row of
  ``b``, i.e. per output column), also applied in the epilogue as an outer product.
* ``"block"`` (DeepSeek-V3): ``S_a`` ``(M, cdiv(K, 128))`` (1x128 groups of activations) and ``S_b``
  ``(cdiv(N, 128), cdiv(K, 128))`` (128x128 blocks of weights).  The scale changes along K, so it cannot
  wait for the epilogue: each 128-wide K-block's product is computed by ``tl.dot`` into a *fresh* fp32
  accumulator, multiplied by its scales and added to the running fp32 sum on the CUDA cores.  That is
  also the *promotion* that repairs Hopper's FP8 accumulator, which keeps only ~13-14 bits when one
  ``tl.dot`` chain runs over all of K (Triton's default on sm_90, like cuBLAS's "fast accumulation").

Epilogue
--------
After the K loop, in fp32 and in this order: the scales (tensorwise and rowwise; block scales are
already in), ``+ bias`` (``(N,)`` in bf16, fp16 or fp32, widened to fp32), the activation (``"relu"`` or
``"silu"``, :data:`ACTIVATIONS`), and one rounding to ``out_dtype``.  :func:`fp8_gemm_reference` states the
same contract in float64; a different order is a different function (chapter 5 shows one caught).

Kernels
-------
* :func:`fp8_gemm_v1`: one output tile per program in row-major launch order, pointer loads, tensorwise
  scales; the lab's first version.
* :func:`fp8_gemm` (``kernel="grouped"``): the same loop, software-pipelined (``num_stages``), grouped
  launch order for L2 reuse, autotuned over :data:`CONFIGS`; every granularity.
* :func:`fp8_gemm` (``kernel="persistent"``, the default where the layout allows it): one program per SM
  looping over tiles (``tl.range``), operands loaded through TMA tensor descriptors
  (``tl.make_tensor_descriptor``), autotuned over :data:`PERSISTENT_CONFIGS`.

On Hopper (and Ada) the operands go to ``tl.dot`` as FP8, and in CPU mode too, where the interpreter
accumulates an FP8 dot as Hopper's tensor cores do (:mod:`kernels.hopper_mma`).  On older GPUs the same
kernels upcast the FP8 tiles to bf16 (exact for e4m3 and e5m2) before ``tl.dot``; :func:`fp8_path`
says which path runs.

References: :func:`fp8_gemm_reference` (float64 throughout, one rounding at the end) and
:func:`fp8_gemm_blockwise_reference` (the kernel's own promotion: exact per-K-block products rounded to
fp32, scaled and summed in fp32).  :func:`scaled_mm` calls ``torch._scaled_mm`` (cuBLAS) with the same
operands and scales, on a GPU.
"""

import numpy as np
import torch
import triton
import triton.language as tl

import kernels
from kernels.device import check_device, sm_facts
from kernels.launch import Launcher, scratch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REF_DTYPES = (*OUT_DTYPES, torch.float64)
SCALINGS = ("tensor", "row", "block")  # the kernels' SCALING: tl.constexpr takes these names
ACTIVATIONS = (None, "relu", "silu")  # what the epilogue may apply after the bias
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK_GROUP = 128  # the K-extent (and weight-row extent) of one block scale
KERNELS = ("persistent", "grouped")

# The autotuning space for Hopper (sm_90): 128-wide K steps (one block scale each), 128x128 or
# 128x256 / 256x128 output tiles, 3-5 pipeline stages (a 256x128 stage of fp8 operands is 48 KB of
# the 228 KB of shared memory; configs that do not fit are skipped by the autotuner), 4 or 8 warps;
# and 64x128 tiles with one warp group, for a few tokens (M <= 128): twice as many tiles to spread over
# the SMs, and room for two programs per SM.
# A module constant, so that measurements on the target GPU can prune it.
CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_stages=s, num_warps=w)
    for bm, bn, s, w in (
        (128, 256, 3, 8),
        (128, 256, 4, 8),
        (256, 128, 3, 8),
        (256, 128, 4, 8),
        (128, 128, 4, 8),
        (128, 128, 5, 4),
        (64, 128, 4, 4),
    )
]
# The persistent kernel may also store its (BM, BN) result as two (BM, BN / 2) halves
# (EPILOGUE_SUBTILE): the staging buffer for the TMA store halves, which leaves room in shared memory
# for a fourth pipeline stage of 128x256 or 256x128 tiles (4 x 48 KB + 32 KB < 227 KB).
PERSISTENT_CONFIGS = [
    triton.Config({**c.kwargs, "EPILOGUE_SUBTILE": sub}, num_stages=c.num_stages, num_warps=c.num_warps)
    for c in CONFIGS
    for sub in (False, True)
    if not (sub and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] < 128 * 256)
]
V1_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 1}
# CPU mode: no autotuning (the interpreter would run every config), small tiles, K-steps of 128.
CPU_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 4}
CPU_PERSISTENT_CONFIG = {**CPU_CONFIG, "EPILOGUE_SUBTILE": True}  # the interpreter runs both halves' stores
CPU_PROGRAMS = 4  # "SMs" of the persistent kernel in CPU mode


def _upcast(device: int | None = None) -> bool:
    """True where FP8 tiles are widened to bf16 before ``tl.dot`` (a GPU without FP8 tensor cores; the
    current one unless ``device`` says which).  CPU mode keeps them FP8: its ``tl.dot`` accumulates as
    Hopper's FP8 tensor cores do."""
    from kernels.device import cuda_capabilities

    if kernels.INTERPRETER:
        return False
    return cuda_capabilities(torch.cuda.current_device() if device is None else device).fp8 == "emulated"


def fp8_path() -> str:
    """One line saying how the FP8 operands reach the tensor cores on this machine."""
    from kernels.device import capabilities

    caps = capabilities()
    if caps.fp8 == "native":
        return f"native FP8 tl.dot on {caps.device} ({caps.sm})"
    if caps.interpreter:
        return "CPU mode (Triton interpreter): FP8 tl.dot accumulated as Hopper's FP8 tensor cores do, bit for bit"
    return f"{caps.device} ({caps.sm}, no FP8 tensor cores): FP8 tiles upcast to bf16 (exactly) before tl.dot"


# -- argument checks ------------------------------------------------------------------------------


def _check_operand(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of FP8 codes, got {type(x).__name__}")
    if x.dtype not in FP8_DTYPES:
        raise TypeError(f"{name} must have dtype float8_e4m3fn or float8_e5m2, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, K), got shape {tuple(x.shape)}")
    check_device(x, name)
    if x.stride(1) != 1:
        raise ValueError(
            f"{name} must be K-major (row-major (rows, K), stride(1) == 1), got strides {x.stride()}: "
            f"quantize the transposed operand from its wide original instead of transposing codes"
        )
    return x.contiguous()


def _scale_shapes(scaling: str, m: int, n: int, k: int) -> tuple:
    if scaling == "tensor":
        return (1, 1), (1, 1)
    if scaling == "row":
        return (m, 1), (n, 1)
    kb = triton.cdiv(k, BLOCK_GROUP)
    return (m, kb), (triton.cdiv(n, BLOCK_GROUP), kb)


def _check_scale(s, name: str, want: tuple, scaling: str, device) -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of fp32 reconstruction scales, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (reconstruction scales S, x ~= S * q), got {s.dtype}")
    if s.numel() != want[0] * want[1] or (scaling == "block" and tuple(s.shape) != want):
        raise ValueError(f"{name} has shape {tuple(s.shape)}, but {scaling!r} scaling needs {want}")
    if s.device != device:
        raise ValueError(f"{name} is on {s.device} but the operands are on {device}")
    if s.numel() == 1:  # one scale: the kernels read its one element, whatever its shape
        return s
    return s.reshape(want).contiguous()


def _check_args(a, b, a_scale, b_scale, scaling, out_dtype, out_dtypes=OUT_DTYPES):
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")
    a = _check_operand(a, "a")
    b = _check_operand(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: both must be (rows, K) with the same K")
    if b.dtype == torch.float8_e5m2 and a.dtype == torch.float8_e5m2:
        raise TypeError("a and b are both float8_e5m2: one operand of an FP8 GEMM is e4m3 (the HYBRID recipe)")
    if out_dtype not in out_dtypes:
        raise ValueError(f"out_dtype must be one of {[str(d) for d in out_dtypes]}, got {out_dtype}")
    m, k = a.shape
    n = b.shape[0]
    want_a, want_b = _scale_shapes(scaling, m, n, k)
    a_scale = _check_scale(a_scale, "a_scale", want_a, scaling, a.device)
    b_scale = _check_scale(b_scale, "b_scale", want_b, scaling, a.device)
    return a, b, a_scale, b_scale, m, n, k


# -- shared jit pieces ----------------------------------------------------------------------------


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (pid_m, pid_n) in grouped order: GROUP_M tile rows are swept column by column, so
    programs running at the same time share A rows and B columns in L2 (Triton tutorial 03)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b^T for (BM, BK) and (BN, BK) FP8 tiles; widened to bf16 first without FP8 MMA."""
    if UPCAST:
        a = a.to(tl.bfloat16)
        b = b.to(tl.bfloat16)
    return tl.dot(a, b.T, acc)


@triton.jit
def _block_scales(ast_ptr, bs_ptr, offs_m, off_n, kb, M, N, n_kb, BLOCK_N: tl.constexpr):
    """The scale of K-block ``kb``'s partial product: 1x128 activation scales times 128x128 weight scales.

    ``ast_ptr`` holds the activation scales *K-major*, ``(cdiv(K, 128), M)``, so each K-block's BM
    scales are one contiguous load (row-major ``(M, cdiv(K, 128))`` would make it BM separate ones).  A
    tile at most 128 wide lies inside one weight block: its weight scale is a single number and the
    factor is a ``(BM, 1)`` column, one multiplication per row instead of one per output."""
    sa = tl.load(ast_ptr + kb * M + offs_m, mask=offs_m < M, other=0.0)  # (BM,)
    if BLOCK_N <= 128:
        factor = (sa * tl.load(bs_ptr + (off_n // 128) * n_kb + kb))[:, None]  # (BM, 1)
    else:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        sb = tl.load(bs_ptr + (offs_n // 128) * n_kb + kb, mask=offs_n < N, other=0.0)  # (BN,)
        factor = sa[:, None] * sb[None, :]  # (BM, BN)
    return factor


@triton.jit
def _epilogue_scale(acc, as_ptr, bs_ptr, offs_m, offs_n, M, N, SCALING: tl.constexpr):
    """Tensorwise or rowwise dequantization of the fp32 accumulator (block scales are already in)."""
    if SCALING == "tensor":
        acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
    elif SCALING == "row":
        sa = tl.load(as_ptr + offs_m, mask=offs_m < M, other=0.0)  # (BM,)
        sb = tl.load(bs_ptr + offs_n, mask=offs_n < N, other=0.0)  # (BN,)
        acc = acc * (sa[:, None] * sb[None, :])
    return acc


@triton.jit
def _epilogue_ops(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """The rest of the epilogue, in fp32 after the dequantization: the bias (one per output column,
    widened to fp32), then the activation; the caller rounds to the output dtype once.  ReLU keeps a
    NaN a NaN (``x < 0`` is false for it); SiLU is ``x / (1 + exp(-x))``."""
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == "relu":
        acc = tl.where(acc < 0.0, 0.0, acc)
    elif ACTIVATION == "silu":
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


# -- v1: one tile per program, tensorwise ---------------------------------------------------------


@triton.jit
def _fp8_gemm_v1_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n  # row-major launch order
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]  # (BM, BK)
    b_ptrs = b_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]  # (BN, BK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < k_left), other=0.0)
        acc = _mma(a, b, acc, UPCAST)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))  # S_a * S_b once per tile: the epilogue
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def fp8_gemm_v1(a, b, a_scale, b_scale, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Version 1: ``S_a * S_b * (a @ b^T)`` with tensorwise scales; one 128x128 tile per program
    (64x64 in CPU mode), row-major launch order, no pipelining beyond what the compiler does."""
    a, b, a_scale, b_scale, m, n, k = _check_args(a, b, a_scale, b_scale, "tensor", out_dtype)
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if c.numel() == 0:
        return c
    cfg = dict(V1_CONFIG)
    if kernels.INTERPRETER:
        cfg.update(BLOCK_M=CPU_CONFIG["BLOCK_M"], BLOCK_N=CPU_CONFIG["BLOCK_N"])
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _fp8_gemm_v1_kernel[grid](a, b, c, a_scale, b_scale, m, n, k, UPCAST=_upcast(), **cfg)
    return c


# -- v2: pipelined, grouped, autotuned; every scaling ----------------------------------------------


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, bias_ptr, M, N, K,
    SCALING: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped row indices instead of row masks: every load is in bounds and the edge rows are computed
    # twice and never stored (as in Triton tutorial 03).
    rows_a = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    rows_b = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows_a[:, None] * K + offs_k[None, :]  # (BM, BK)
    b_ptrs = b_ptr + rows_b[:, None] * K + offs_k[None, :]  # (BN, BK)
    n_kb = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, n_kb):  # pipelined num_stages deep by the compiler
        k_mask = offs_k[None, :] < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=k_mask, other=0.0)
        b = tl.load(b_ptrs, mask=k_mask, other=0.0)
        if SCALING == "block":
            # Promotion: this K-block's product from a fresh accumulator, scaled, added in fp32.
            part = _mma(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
            acc += part * _block_scales(as_ptr, bs_ptr, offs_m, pid_n * BLOCK_N, kb, M, N, n_kb, BLOCK_N)
        else:
            acc = _mma(a, b, acc, UPCAST)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    acc = _epilogue_scale(acc, as_ptr, bs_ptr, offs_m, offs_n, M, N, SCALING)
    acc = _epilogue_ops(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_TUNING_KEY = ["M", "N", "K", "SCALING", "UPCAST", "HAS_BIAS", "ACTIVATION"]
_fp8_gemm_tuned = triton.autotune(configs=CONFIGS, key=_TUNING_KEY)(_fp8_gemm_kernel)


# -- persistent, TMA descriptors -------------------------------------------------------------------


@triton.jit
def _fp8_gemm_persistent_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, bias_ptr, M, N, K,
    SCALING: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
):  # fmt: skip
    # TMA descriptors: the copy engine fetches whole (BM, BK) / (BN, BK) tiles, zero-padding outside
    # the matrix, and stores the (BM, BN) result clipped to it.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    C_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N  # columns per TMA store
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, C_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    n_kb = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    # One program per SM walks tiles start, start + NUM_SMS, ...; flatten=True lets the compiler
    # pipeline across tile boundaries (the next tile's loads overlap this tile's epilogue), which is
    # why the epilogue recomputes its own tile index (tile_id_c) instead of reusing the loop's.
    tile_id_c = tl.program_id(0) - NUM_SMS
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(n_kb):
            a = a_desc.load([off_m, kb * BLOCK_K])  # (BM, BK)
            b = b_desc.load([off_n, kb * BLOCK_K])  # (BN, BK)
            if SCALING == "block":
                part = _mma(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
                offs_m = off_m + tl.arange(0, BLOCK_M)
                acc += part * _block_scales(as_ptr, bs_ptr, offs_m, off_n, kb, M, N, n_kb, BLOCK_N)
            else:
                acc = _mma(a, b, acc, UPCAST)
        tile_id_c += NUM_SMS
        pid_m, pid_n = grouped_tile(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue_scale(acc, as_ptr, bs_ptr, offs_m, offs_n, M, N, SCALING)
        acc = _epilogue_ops(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
        c = acc.to(c_ptr.dtype.element_ty)
        if EPILOGUE_SUBTILE:  # columns [0, BN/2) and [BN/2, BN) as two stores
            c0, c1 = tl.split(tl.permute(tl.reshape(c, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c0)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], c1)
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c)


_fp8_gemm_persistent_tuned = triton.autotune(configs=PERSISTENT_CONFIGS, key=_TUNING_KEY)(_fp8_gemm_persistent_kernel)


_LAUNCH_PERSISTENT = Launcher(_fp8_gemm_persistent_tuned)  # tuned once per shape, then launched directly
_LAUNCH_GROUPED = Launcher(_fp8_gemm_tuned)


def _tma_allocator() -> None:
    """Device-side TMA descriptors live in a global scratch buffer that Triton asks the host for.

    Set before every launch, not once: Triton keeps the allocator per thread (a context variable), and
    autograd runs a layer's backward on a thread of its own."""
    if not kernels.INTERPRETER:
        triton.set_allocator(scratch)


def tma_ok(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> bool:
    """TMA needs 16-byte-aligned bases and row strides: K % 16 == 0 (fp8) and N * c.element_size() % 16 == 0."""
    aligned = all(t.data_ptr() % 16 == 0 for t in (a, b, c))
    return aligned and a.shape[1] % 16 == 0 and (c.shape[1] * c.element_size()) % 16 == 0


def fp8_gemm(
    a, b, a_scale, b_scale, scaling: str = "tensor", out_dtype=torch.bfloat16, kernel: str = "persistent",
    bias=None, activation=None,
) -> torch.Tensor:  # fmt: skip
    """``C = act((S_a * a) @ (S_b * b)^T + bias)`` in ``out_dtype`` (bf16 by default); see the module
    docstring, whose "Epilogue" section gives the order of the epilogue's steps.

    ``a`` ``(M, K)`` e4m3/e5m2 codes, ``b`` ``(N, K)`` e4m3/e5m2 codes (not both e5m2); ``a_scale``,
    ``b_scale`` fp32 reconstruction scales shaped by ``scaling``: "tensor" (one element each), "row"
    (``(M, 1)``, ``(N, 1)``) or "block" (``(M, cdiv(K, 128))``, ``(cdiv(N, 128), cdiv(K, 128))``, with
    fp32 promotion of every 128-K partial product).  ``kernel="persistent"`` (TMA, one program per SM;
    falls back to "grouped" when the layout is not TMA-aligned) or ``"grouped"`` (pointer loads, one
    tile per program; also used before sm_90, which has no TMA).  Both are autotuned on a GPU over
    :data:`CONFIGS` and use :data:`CPU_CONFIG` in CPU mode.  ``bias``: ``None`` or ``(N,)`` in bf16,
    fp16 or fp32, added in fp32; ``activation``: one of :data:`ACTIVATIONS`, applied after the bias."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    a, b, a_scale, b_scale, _, n, _ = _check_args(a, b, a_scale, b_scale, scaling, out_dtype)
    bias = _check_epilogue(bias, activation, n, a.device)
    return fp8_gemm_unchecked(a, b, a_scale, b_scale, scaling, out_dtype, kernel, bias, activation)


def _check_epilogue(bias, activation, n: int, device):
    """The epilogue's arguments checked: ``bias`` contiguous, or None."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.dtype not in BIAS_DTYPES:
        raise TypeError(f"bias must be bfloat16, float16 or float32, got {bias.dtype}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, but the output has N = {n} columns: it must be ({n},)")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the operands are on {device}")
    return bias.contiguous()


_DEVICE = {}  # device index -> (TMA present, SM count, UPCAST): asked once per device


def _device_facts(device: int) -> tuple:
    facts = _DEVICE.get(device)
    if facts is None:
        major, sms = sm_facts(device)
        facts = _DEVICE[device] = (major >= 9, sms, _upcast(device))
    return facts


def fp8_gemm_unchecked(
    a, b, a_scale, b_scale, scaling, out_dtype=torch.bfloat16, kernel="persistent", bias=None, activation=None
) -> torch.Tensor:
    """:func:`fp8_gemm` without its argument checks, for operands that satisfy them by construction
    (the outputs of this package's quantizers, as :class:`kernels.fp8_linear.FP8Linear` passes them):
    the checks cost an FP8 layer's step host time on every GEMM.  Anything else goes through
    :func:`fp8_gemm`."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if c.numel() == 0:
        return c
    if k == 0:  # an empty sum: the epilogue still applies to it
        zeros = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        return c.copy_(_epilogue_torch(zeros, bias, activation))
    if scaling == "block":  # K-major activation scales: one contiguous vector per K-block (see _block_scales)
        a_scale = a_scale.t().contiguous()
    args = (a, b, c, a_scale, b_scale, c if bias is None else bias, m, n, k)
    epilogue = {"HAS_BIAS": bias is not None, "ACTIVATION": str(activation).lower()}
    if kernels.INTERPRETER:
        meta = {"SCALING": scaling, "UPCAST": False, **epilogue}
        if kernel == "persistent" and tma_ok(a, b, c):
            grid = (min(CPU_PROGRAMS, triton.cdiv(m, CPU_CONFIG["BLOCK_M"]) * triton.cdiv(n, CPU_CONFIG["BLOCK_N"])),)
            _fp8_gemm_persistent_kernel[grid](*args, **meta, NUM_SMS=CPU_PROGRAMS, **CPU_PERSISTENT_CONFIG)
        else:
            _fp8_gemm_kernel[(triton.cdiv(m, CPU_CONFIG["BLOCK_M"]) * triton.cdiv(n, CPU_CONFIG["BLOCK_N"]),)](
                *args, **meta, **CPU_CONFIG
            )
        return c
    device = a.get_device()
    has_tma, sms, upcast = _device_facts(device)
    # What the compiled kernel depends on (spec_key's facts, written out for these nine arguments):
    # dtypes, the 16-byte alignment of each pointer, the sizes, the constexprs.
    aligned = tuple(t.data_ptr() % 16 == 0 for t in args[:6])
    epilogue_key = (bias is not None, args[5].dtype, activation)
    key = (device, a.dtype, b.dtype, out_dtype, aligned, m, n, k, scaling, upcast, epilogue_key)
    tma = all(aligned[:3]) and k % 16 == 0 and (n * c.element_size()) % 16 == 0  # tma_ok(a, b, c)
    if kernel == "persistent" and has_tma and tma:
        _tma_allocator()
        _LAUNCH_PERSISTENT(
            lambda cfg: (min(sms, triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])),),
            args, key, SCALING=scaling, UPCAST=upcast, NUM_SMS=sms, **epilogue,
        )  # fmt: skip
        return c
    _LAUNCH_GROUPED(
        lambda cfg: (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),),
        args, key, SCALING=scaling, UPCAST=upcast, **epilogue,
    )  # fmt: skip
    return c


def fp8_gemm_rowwise(a, b, a_scale, b_scale, out_dtype=torch.bfloat16, kernel: str = "persistent") -> torch.Tensor:
    """:func:`fp8_gemm` with per-row scales ``(M, 1)`` for ``a`` and ``(N, 1)`` for ``b``."""
    return fp8_gemm(a, b, a_scale, b_scale, "row", out_dtype, kernel)


def fp8_gemm_blockwise(a, b, a_scale, b_scale, out_dtype=torch.bfloat16, kernel: str = "persistent") -> torch.Tensor:
    """:func:`fp8_gemm` with 1x128 scales for ``a`` and 128x128 scales for ``b``, promoted every 128 K."""
    return fp8_gemm(a, b, a_scale, b_scale, "block", out_dtype, kernel)


# -- references -----------------------------------------------------------------------------------


def expanded_scales(a_scale, b_scale, scaling, m, n, k, dtype):
    """Per-element scales: (M, K) for a and (N, K) for b."""
    want_a, want_b = _scale_shapes(scaling, m, n, k)
    sa, sb = a_scale.reshape(want_a).to(dtype), b_scale.reshape(want_b).to(dtype)
    if scaling == "block":
        sa = sa.repeat_interleave(BLOCK_GROUP, 1)[:, :k]
        sb = sb.repeat_interleave(BLOCK_GROUP, 0).repeat_interleave(BLOCK_GROUP, 1)[:n, :k]
    return sa, sb


def _epilogue_torch(y: torch.Tensor, bias, activation) -> torch.Tensor:
    """The epilogue's contract in PyTorch, in ``y``'s dtype: ``y + bias``, then the activation."""
    if bias is not None:
        y = y + bias.to(y.dtype)
    if activation == "relu":
        y = torch.where(y < 0, torch.zeros_like(y), y)  # NaN stays NaN, as in the kernel
    elif activation == "silu":
        y = torch.nn.functional.silu(y)
    return y


def fp8_gemm_reference(
    a, b, a_scale, b_scale, scaling: str = "tensor", out_dtype=torch.bfloat16, bias=None, activation=None
) -> torch.Tensor:
    """float64 all the way: ``act((S_a * a) @ (S_b * b)^T + bias)`` with exact products and sums,
    rounded once to ``out_dtype``.  The truth every kernel is measured against."""
    a, b, a_scale, b_scale, m, n, k = _check_args(a, b, a_scale, b_scale, scaling, out_dtype, _REF_DTYPES)
    bias = _check_epilogue(bias, activation, n, a.device)
    sa, sb = expanded_scales(a_scale, b_scale, scaling, m, n, k, torch.float64)
    return _epilogue_torch((a.double() * sa) @ (b.double() * sb).T, bias, activation).to(out_dtype)


def fp8_gemm_blockwise_reference(a, b, a_scale, b_scale, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The block-scaled GEMM with the kernel's promotion: for each 128-wide K-block, the exact product
    of the codes (what one fresh ``tl.dot`` gives, rounded once to fp32), times ``S_a[:, kb] *
    S_b[n // 128, kb]`` in fp32, added to an fp32 running sum in K order; rounded to ``out_dtype``.

    In CPU mode the kernel matches it bit for bit; on a GPU, up to the FMA the compiler may fuse."""
    a, b, a_scale, b_scale, m, n, k = _check_args(a, b, a_scale, b_scale, "block", out_dtype, _REF_DTYPES)
    acc = torch.zeros((m, n), dtype=torch.float32, device=a.device)
    sb_cols = b_scale.repeat_interleave(BLOCK_GROUP, 0)[:n]  # (N, n_kb)
    for kb in range(triton.cdiv(k, BLOCK_GROUP)):
        ks = slice(kb * BLOCK_GROUP, (kb + 1) * BLOCK_GROUP)
        part = (a[:, ks].double() @ b[:, ks].double().T).float()  # (M, N)
        acc = acc + part * (a_scale[:, kb : kb + 1] * sb_cols[:, kb][None, :])
    return acc.to(out_dtype)


def magnitudes(a, b, a_scale, b_scale, scaling: str = "tensor") -> torch.Tensor:
    """``sum_k |S_a a| |S_b b|`` per output (float64): the scale of a dot product's rounding error."""
    m, k = a.shape
    n = b.shape[0]
    sa, sb = expanded_scales(a_scale, b_scale, scaling, m, n, k, torch.float64)
    return (a.double() * sa).abs() @ (b.double() * sb).abs().T


# Error bounds against the float64 reference, elementwise: |got - ref| <= REL * |ref| + MAG * sum|a||b|.
# REL: one ulp of the output format, since both sides are rounded to it (a sum within a hair of a rounding
# boundary lands on either neighbour).  MAG: in CPU mode every tl.dot is exact and only fp32 roundings of
# the running sum remain (~K/128 of 2^-24).  On Hopper the FP8 accumulator keeps ~13-14 bits of a running
# sum (DeepSeek-V3 reports errors near 2% of the result at K = 4096); 2^-7 of sum|a||b| covers K of a few
# thousand with room, and is still ~8x tighter than what a wrong scale or a missing K-block produces.
GEMM_REL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-22}
GEMM_MAG = {"exact": 2.0**-20, "hopper": 2.0**-7}


def gemm_tolerance_report(got, ref, mag, out_dtype=torch.bfloat16, accumulator=None) -> tuple:
    """(ok, message): every element within ``GEMM_REL * |ref| + GEMM_MAG * mag``; prints nothing."""
    if accumulator is None:
        accumulator = "exact" if _upcast() else "hopper"
    g, r, mg = got.double().cpu(), ref.double().cpu(), mag.double().cpu()
    err = (g - r).abs()
    bound = GEMM_REL[out_dtype] * r.abs() + GEMM_MAG[accumulator] * mg
    bad = ~(err <= bound)  # NaN counts as bad
    rel_mag = (err / mg.clamp_min(1e-300)).max().item() if err.numel() else 0.0
    msg = f"max |err| = {err.max().item() if err.numel() else 0.0:.3e}, max |err| / sum|a||b| = {rel_mag:.2e}"
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad.numpy())[0])
        msg += (
            f"; {int(bad.sum())} of {bad.numel()} outside the bound, first at ({i}, {j}): got {g[i, j].item():.6g},"
            f" want {r[i, j].item():.6g}"
        )
    return not bool(bad.any()), msg


# -- cuBLAS ---------------------------------------------------------------------------------------


def scaled_mm(a, b, a_scale, b_scale, scaling: str = "tensor", out_dtype=torch.bfloat16, use_fast_accum=None):
    """``torch._scaled_mm`` (cuBLASLt) on the same operands: ``a`` ``(M, K)`` row-major and ``b``
    ``(N, K)`` row-major, passed as ``b.t()`` (the column-major ``(K, N)`` it wants).  Its ``scale_a`` /
    ``scale_b`` are reconstruction scales, like ours: one element each (tensorwise), ``(M, 1)`` and
    ``(1, N)`` (rowwise), or 1x128 and 128x128 blocks (blockwise, CUDA 12.9+ on Hopper: ``(M, K / 128)``
    stored K-major, and ``(K / 128, N / 128)``).  ``use_fast_accum=True`` (the default for tensorwise
    and rowwise) accumulates all of K in the tensor core, as our tensorwise and rowwise kernels do; False
    asks cuBLAS to promote, which blockwise scaling always does (True is refused there)."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")
    if use_fast_accum is None:
        use_fast_accum = scaling != "block"
    if scaling == "block" and use_fast_accum:
        raise ValueError("use_fast_accum must be False with block scaling: cuBLAS promotes every 128 K there")
    if a.device.type != "cuda":
        raise ValueError("scaled_mm needs CUDA tensors: torch._scaled_mm runs cuBLASLt")
    a, b, a_scale, b_scale, m, n, k = _check_args(a, b, a_scale, b_scale, scaling, out_dtype)
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"torch._scaled_mm needs dimensions that are multiples of 16, got M, N, K = {m}, {n}, {k}")
    if scaling == "block" and k % BLOCK_GROUP:
        raise ValueError(f"cuBLAS's block scaling needs K to be a multiple of {BLOCK_GROUP}, got K = {k}")
    if scaling == "tensor":
        sa, sb = a_scale.reshape(()), b_scale.reshape(())
    elif scaling == "row":
        sa, sb = a_scale.reshape(m, 1), b_scale.reshape(1, n)
    else:  # cuBLAS reads the 1x128 scales outer-dim-major (each K-block's M scales contiguous)
        sa, sb = a_scale.t().contiguous().t(), b_scale.t()
    return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=use_fast_accum)


__all__ = [
    "ACTIVATIONS",
    "CONFIGS",
    "CPU_CONFIG",
    "PERSISTENT_CONFIGS",
    "SCALINGS",
    "expanded_scales",
    "fp8_gemm",
    "fp8_gemm_blockwise",
    "fp8_gemm_blockwise_reference",
    "fp8_gemm_reference",
    "fp8_gemm_rowwise",
    "fp8_gemm_unchecked",
    "fp8_gemm_v1",
    "fp8_path",
    "gemm_tolerance_report",
    "grouped_tile",
    "magnitudes",
    "scaled_mm",
    "tma_ok",
]
