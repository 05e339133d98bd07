"""Accumulation: a dot-product kernel with a selectable accumulator, Kahan summation, and a probe of
the FP8 tensor-core accumulator with the fp32 promotion that repairs it.

Chapter 3 and Lab 03 (diagnostics).  Entry points: :func:`dot`, :func:`fp8_matmul`,
:func:`accumulator_probe`, :func:`relative_error`.

* :func:`dot` computes row-wise dot products ``sum_k a[m, k] * b[m, k]`` (or row sums) with a running
  accumulator of fp16, bf16 or fp32, plain or compensated (Kahan).  Each of ``LANES`` lanes adds every
  ``LANES``-th product in sequence, so a lane's chain has ``K / LANES`` additions, each rounded to the
  accumulator's format; the lanes are then combined in fp32 by a fixed pairwise tree.  Every
  operation is elementwise and correctly rounded, so the bits are the same on a GPU and in the CPU
  interpreter.  :func:`dot_reference` is the same recipe in NumPy.
* :func:`fp8_matmul` multiplies e4m3 matrices with ``tl.dot``, either accumulating the whole K
  dimension in the tensor core's accumulator (``promote_every=None``) or, as DeepSeek-V3 does, only
  ``promote_every`` (e.g. 128) K-elements at a time, adding each partial product into an fp32
  register accumulator with an ordinary fp32 add.  On Hopper the first keeps fewer bits than fp32;
  the second bounds the loss to one chunk.  :func:`fp8_matmul_reference` models the kernel with each
  ``tl.dot`` exact (what the CPU interpreter computes) and fp32 roundings between them: on the CPU it
  gives the kernel's bits, on a GPU the difference between the two *is* the hardware's loss.
* :func:`accumulator_probe` measures how many bits a matmul keeps when a small product is added to a
  large one: exact answers need ``j`` bits for a ratio of ``2^j`` between the two.  Only a GPU run
  measures hardware; in the interpreter every ``tl.dot`` is exact.
"""

import math

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import hopper_mma
from kernels.device import check_device, default_device

ACCUMULATORS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_TL = {"fp16": tl.float16, "bf16": tl.bfloat16, "fp32": tl.float32}
LANES = 16
BLOCK_M = 16


# -- dot products with a chosen accumulator ---------------------------------------------------------


@triton.jit
def _dot_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    M,
    K,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,  # the running accumulator's dtype
    COMPENSATED: tl.constexpr,  # Kahan: carry the rounding error of each addition in c
    BLOCK_M: tl.constexpr,
    LANES: tl.constexpr,
    LOG2_LANES: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, LANES)
    row_ok = rows < M
    base = rows.to(tl.int64)[:, None] * K  # (BLOCK_M, 1)
    s = tl.zeros((BLOCK_M, LANES), dtype=ACC)
    c = tl.zeros((BLOCK_M, LANES), dtype=ACC)
    for k0 in range(0, K, LANES):
        cols = k0 + lanes
        mask = row_ok[:, None] & (cols < K)[None, :]  # (BLOCK_M, LANES)
        p = tl.load(a_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            p = p * tl.load(b_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        p = p.to(ACC)  # the product, rounded into the accumulator's format
        if COMPENSATED:
            y = p - c  # the product, corrected by what the last addition lost
            t = s + y
            c = (t - s) - y  # what this addition lost (exactly, for round-to-nearest)
            s = t
        else:
            s = s + p
    total = s.to(tl.float32)
    if COMPENSATED:
        total = total - c.to(tl.float32)
    # Lanes combined by a fixed pairwise tree of fp32 adds: the same order on every device.
    for i in tl.static_range(LOG2_LANES):
        total = tl.reshape(total, (BLOCK_M, LANES >> (i + 1), 2))
        lo, hi = tl.split(total)
        total = lo + hi
    total = tl.reshape(total, (BLOCK_M,))
    tl.store(out_ptr + rows, total, mask=row_ok)


def _check_dot_args(a, b, acc, compensated, lanes, on_device: bool = True):
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a must be a torch.Tensor, got {type(a).__name__}")
    if a.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"a must have dtype float32, bfloat16 or float16, got {a.dtype}")
    if a.dim() not in (1, 2):
        raise ValueError(f"a must be 1-D (one vector) or 2-D (one vector per row), got shape {tuple(a.shape)}")
    if b is not None:
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"b must be a torch.Tensor or None, got {type(b).__name__}")
        if b.shape != a.shape:
            raise ValueError(f"b must have a's shape {tuple(a.shape)}, got {tuple(b.shape)}")
        if b.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"b must have dtype float32, bfloat16 or float16, got {b.dtype}")
    if acc not in ACCUMULATORS:
        raise ValueError(f"acc must be one of {list(ACCUMULATORS)}, got {acc!r}")
    if not isinstance(compensated, bool):
        raise TypeError(f"compensated must be True or False, got {compensated!r}")
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 2 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two >= 2, got {lanes!r}")
    if on_device:
        check_device(a, "a")


def dot(
    a: torch.Tensor, b: torch.Tensor | None = None, acc: str = "fp32", compensated: bool = False, lanes: int = LANES
) -> torch.Tensor:
    """Dot products of the rows of ``a`` and ``b`` (row sums of ``a`` if ``b`` is None), accumulated in
    ``acc`` ("fp16", "bf16" or "fp32"), with Kahan compensation if ``compensated``.

    ``a`` is (K,) or (M, K) of float32, bfloat16 or float16.  Each product is computed in fp32 and
    rounded to ``acc``; lane ``l`` adds products ``l, l + lanes, ...`` into its own accumulator (so a
    chain has ``ceil(K / lanes)`` roundings); the lanes are summed in fp32 at the end.  Returns fp32:
    a scalar tensor for 1-D input, (M,) otherwise.
    """
    _check_dot_args(a, b, acc, compensated, lanes)
    squeeze = a.dim() == 1
    a2 = (a[None, :] if squeeze else a).contiguous()
    b2 = None if b is None else (b[None, :] if squeeze else b).contiguous()
    M, K = a2.shape
    out = torch.zeros(M, dtype=torch.float32, device=a.device)
    if M and K:
        _dot_kernel[(triton.cdiv(M, BLOCK_M),)](
            a2,
            a2 if b2 is None else b2,
            out,
            M,
            K,
            HAS_B=b2 is not None,
            ACC=_TL[acc],
            COMPENSATED=compensated,
            BLOCK_M=BLOCK_M,
            LANES=lanes,
            LOG2_LANES=lanes.bit_length() - 1,
            enable_fp_fusion=False,  # products and sums rounded apart, as in the reference and the interpreter
        )
    return out[0] if squeeze else out


def dot_reference(
    a: torch.Tensor, b: torch.Tensor | None = None, acc: str = "fp32", compensated: bool = False, lanes: int = LANES
) -> torch.Tensor:
    """:func:`dot`'s recipe in NumPy (ml_dtypes for bf16): the same roundings in the same order."""
    import ml_dtypes

    _check_dot_args(a, b, acc, compensated, lanes, on_device=False)
    np_acc = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}[acc]
    squeeze = a.dim() == 1
    a2 = (a[None, :] if squeeze else a).detach().cpu().float().numpy()
    p = a2 if b is None else a2 * (b[None, :] if squeeze else b).detach().cpu().float().numpy()
    M, K = p.shape
    padded = np.zeros((M, -(-K // lanes) * lanes), np.float32)
    padded[:, :K] = p
    chunks = padded.reshape(M, -1, lanes).astype(np_acc)  # (M, K / lanes, lanes), products rounded
    s = np.zeros((M, lanes), np_acc)
    c = np.zeros((M, lanes), np_acc)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(chunks.shape[1]):
            x = chunks[:, i]
            if compensated:
                y = (x.astype(np.float32) - c.astype(np.float32)).astype(np_acc)
                t = (s.astype(np.float32) + y.astype(np.float32)).astype(np_acc)
                c = (
                    (t.astype(np.float32) - s.astype(np.float32)).astype(np_acc).astype(np.float32)
                    - y.astype(np.float32)
                ).astype(np_acc)
                s = t
            else:
                s = (s.astype(np.float32) + x.astype(np.float32)).astype(np_acc)
        total = s.astype(np.float32)
        if compensated:
            total = total - c.astype(np.float32)
        while total.shape[1] > 1:
            total = total[:, 0::2] + total[:, 1::2]
    out = torch.from_numpy(total[:, 0].copy())
    return out[0] if squeeze else out


def relative_error(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """|got - exact| / sum_k |a_k b_k| per row, with the exact dot products in float64 (float64 holds
    every product of two fp32 values exactly; the sum's error is negligible at this scale)."""
    a64 = a.detach().cpu().double()
    p = a64 if b is None else a64 * b.detach().cpu().double()
    exact = p.sum(-1)
    scale = p.abs().sum(-1)
    return (got.detach().cpu().double() - exact).abs() / torch.where(scale > 0, scale, 1.0)


# -- the FP8 tensor-core accumulator ----------------------------------------------------------------

FP8_BLOCK_M, FP8_BLOCK_N = 64, 64  # one warpgroup MMA tile on Hopper
FP8_BLOCK_K = 32  # the K of one Hopper FP8 MMA instruction
PROMOTE_EVERY = 128  # DeepSeek-V3's promotion interval


@triton.jit
def _fp8_matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    scale,  # runtime fp32: the promotion multiplies by it, as a scaled FP8 GEMM would
    CHUNK: tl.constexpr,  # K-elements accumulated by tl.dot before the fp32 promotion
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the fp32 register accumulator
    for k0 in range(0, K, CHUNK):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the tensor core's accumulator
        for k1 in range(0, CHUNK, BLOCK_K):
            ks = k0 + k1 + rk
            a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=rm[:, None] < M, other=0.0)  # (BLOCK_M, BLOCK_K)
            b = tl.load(b_ptr + ks[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)  # (BLOCK_K, BLOCK_N)
            part = tl.dot(a, b, part)
        acc = acc + part * scale  # promotion: an fp32 add on the CUDA cores
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _check_fp8_args(a, b, promote_every, block_k, on_device: bool = True):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of dtype torch.float8_e4m3fn, got {type(t).__name__}")
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name} must have dtype torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must equal b's rows")
    if block_k not in (16, 32, 64, 128):
        raise ValueError(f"block_k must be 16, 32, 64 or 128, got {block_k!r}")
    if promote_every is not None and (
        isinstance(promote_every, bool)
        or not isinstance(promote_every, int)
        or promote_every <= 0
        or promote_every % block_k
    ):
        raise ValueError(
            f"promote_every must be None or a positive multiple of block_k={block_k}, got {promote_every!r}"
        )
    if on_device:
        check_device(a, "a")


def _pad_k(a, b, multiple):
    K = a.shape[1]
    Kp = -(-K // multiple) * multiple
    if Kp == K:
        return a.contiguous(), b.contiguous()
    # zero products change no sum; padding is done in a wider type, fp8 has no zero-fill kernel everywhere
    ap = torch.zeros((a.shape[0], Kp), dtype=torch.float32, device=a.device)
    bp = torch.zeros((Kp, b.shape[1]), dtype=torch.float32, device=b.device)
    ap[:, :K] = a.float()
    bp[:K] = b.float()
    return ap.to(torch.float8_e4m3fn), bp.to(torch.float8_e4m3fn)


def fp8_matmul(
    a: torch.Tensor, b: torch.Tensor, promote_every: int | None = None, block_k: int = FP8_BLOCK_K, scale: float = 1.0
) -> torch.Tensor:
    """``scale * (a @ b)`` for e4m3fn ``a`` (M, K) and ``b`` (K, N), fp32 out, by ``tl.dot``.

    ``promote_every=None``: one accumulator for all of K, the tensor core's (``acc = tl.dot(a, b, acc)``).
    ``promote_every=P`` (a multiple of ``block_k``): each run of P K-elements is accumulated by
    ``tl.dot`` from zero, then added into an fp32 accumulator (times ``scale``), DeepSeek-V3's fix for
    Hopper's FP8 accumulator.  K is zero-padded to a multiple of the chunk.
    """
    _check_fp8_args(a, b, promote_every, block_k)
    M, N = a.shape[0], b.shape[1]
    chunk = promote_every or max(block_k, -(-a.shape[1] // block_k) * block_k)
    a, b = _pad_k(a, b, chunk)
    K = a.shape[1]
    c = torch.empty((M, N), dtype=torch.float32, device=a.device)
    if M and N:
        if K == 0:
            return c.zero_()
        grid = (triton.cdiv(M, FP8_BLOCK_M), triton.cdiv(N, FP8_BLOCK_N))
        _fp8_matmul_kernel[grid](
            a, b, c, M, N, K, float(scale), CHUNK=chunk, BLOCK_M=FP8_BLOCK_M, BLOCK_N=FP8_BLOCK_N, BLOCK_K=block_k
        )
    return c


def fp8_matmul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    promote_every: int | None = None,
    block_k: int = FP8_BLOCK_K,
    scale: float = 1.0,
    tensor_core: str = "exact",
) -> torch.Tensor:
    """:func:`fp8_matmul` in NumPy, the promotions fp32 multiply-and-adds.

    ``tensor_core="exact"``: every ``tl.dot`` exact (float64) and rounded once to fp32, a lossless
    accumulator.  ``"hopper"``: every ``tl.dot`` as Hopper's FP8 tensor cores compute it
    (:func:`kernels.hopper_mma.fp8_dot`), which is what the kernel gives on an H100/H200 and in CPU mode."""
    if tensor_core not in ("exact", "hopper"):
        raise ValueError(f"tensor_core must be 'exact' or 'hopper', got {tensor_core!r}")
    _check_fp8_args(a, b, promote_every, block_k, on_device=False)
    chunk = promote_every or max(block_k, -(-a.shape[1] // block_k) * block_k)
    a, b = _pad_k(a.detach().cpu(), b.detach().cpu(), chunk)
    a64 = a.float().numpy().astype(np.float64)
    b64 = b.float().numpy().astype(np.float64)
    K = a64.shape[1]
    s = np.float32(scale)
    acc = np.zeros((a64.shape[0], b64.shape[1]), np.float32)
    for k0 in range(0, K, chunk):
        part = np.zeros_like(acc)
        for k1 in range(k0, k0 + chunk, block_k):
            a_k, b_k = a64[:, k1 : k1 + block_k], b64[k1 : k1 + block_k]
            if tensor_core == "hopper":
                part = hopper_mma.fp8_dot(a_k, b_k, part)
            else:
                part = (a_k @ b_k + part).astype(np.float32)
        acc = acc + part * s
    return torch.from_numpy(acc)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, fast_accum: bool) -> torch.Tensor:
    """``a @ b`` by cuBLAS's FP8 GEMM (``torch._scaled_mm``, unit scales, fp32 out); with
    ``fast_accum`` it accumulates in the tensor core like ``promote_every=None``.  Needs a GPU with FP8."""
    one = torch.ones((), device=a.device)
    return torch._scaled_mm(
        a, b.t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast_accum
    )


# -- probes ------------------------------------------------------------------------------------------

PROBE_POSITIONS = (1, 16, 31, 32, 64, 96, 127, 128, 200, 255)
PROBE_RATIOS = tuple(range(1, 35))  # the small product is 2^-j times the large one


def probe_inputs(positions=PROBE_POSITIONS, ratios=PROBE_RATIOS, k: int = 256) -> tuple:
    """Matrices whose product needs ``j`` bits: ``c[m, n] = big_m + small_m`` with
    ``small_m / big_m = 2^-ratios[m]``; the large product sits at K-index 0, the small one at K-index
    ``positions[n]``.  Every value is a power of two in e4m3fn, so any exact answer is a rounding of
    ``big + small`` to fp32, and any loss is the accumulator's.  Returns (a, b, exact) on the CPU: e4m3fn
    (M, k) and (k, N), and the float64 (M, N) exact products; M = N = 64 (unused rows/columns zero)."""
    if len(ratios) > 64 or len(positions) > 64:
        raise ValueError("at most 64 ratios and 64 positions")
    if not all(1 <= j <= 34 for j in ratios):
        raise ValueError(f"ratios must lie in [1, 34] (e4m3fn powers of two span 2^-9..2^8), got {ratios}")
    if not all(0 < p < k for p in positions) or len(set(positions)) != len(positions):
        raise ValueError(f"positions must be distinct and in (0, k={k}), got {positions}")
    a = torch.zeros((64, k), dtype=torch.float64)
    b = torch.zeros((k, 64), dtype=torch.float64)
    b[0, : len(positions)] = 2.0**8
    for n, p in enumerate(positions):
        b[p, n] = 2.0**-9
    for m, j in enumerate(ratios):
        # big = 2^(ha + 8), small = 2^(sa - 9): ha - sa = j - 17, with both exponents in [-9, 8]
        d = j - 17
        ha, sa = (d - 9, -9) if d >= 0 else (-9, -9 - d)
        a[m, 0] = 2.0**ha
        a[m, list(positions)] = 2.0**sa
    exact = a @ b
    return a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), exact


def accumulator_probe(matmul, positions=PROBE_POSITIONS, ratios=PROBE_RATIOS) -> dict:
    """For each K-position of the small product: the largest ``j`` such that every ratio ``2^-i``,
    ``i <= j``, came out exactly as ``big + small``.  ``matmul(a, b)`` takes e4m3fn (M, K), (K, N) on
    the kernels' device and returns fp32 (M, N).  An fp32 result holds at most 23 (24 significant
    bits), which is what an exact or fp32 accumulator gives."""
    a, b, exact = probe_inputs(positions, ratios)
    dev = default_device()
    got = matmul(a.to(dev), b.to(dev)).detach().cpu().double()
    kept = {}
    for n, p in enumerate(positions):
        ok = (got[: len(ratios), n] == exact[: len(ratios), n]).tolist()
        j = 0
        while j < len(ratios) and ok[j]:
            j += 1
        kept[p] = ratios[j - 1] if j else 0
    return kept


def random_fp8(m: int, k: int, n: int, seed: int = 0) -> tuple:
    """Positive e4m3fn operands (|N(0, 1)| values): partial sums only grow, as in the worst case for
    an accumulator; returned on the CPU."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=g).abs().to(torch.float8_e4m3fn)
    b = torch.randn((k, n), generator=g).abs().to(torch.float8_e4m3fn)
    return a, b


def matmul_error(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """max |got - exact| / (|a| @ |b|), exact in float64 (products of e4m3 values and their sums are
    exact in float64 for these sizes)."""
    a64, b64 = a.cpu().double(), b.cpu().double()
    err = (got.detach().cpu().double() - a64 @ b64).abs() / (a64.abs() @ b64.abs())
    return float(err.max())


def bits_of_error(err: float) -> float:
    """An error relative to the sum of magnitudes, as bits: -log2(err) (inf for 0)."""
    return math.inf if err == 0 else -math.log2(err)


__all__ = [
    "ACCUMULATORS",
    "FP8_BLOCK_K",
    "LANES",
    "PROBE_POSITIONS",
    "PROBE_RATIOS",
    "PROMOTE_EVERY",
    "accumulator_probe",
    "bits_of_error",
    "dot",
    "dot_reference",
    "fp8_matmul",
    "fp8_matmul_reference",
    "matmul_error",
    "probe_inputs",
    "random_fp8",
    "relative_error",
    "scaled_mm",
]
