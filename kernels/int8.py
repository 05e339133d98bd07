"""INT8 for inference: symmetric scales per tensor, per token or per channel, calibration, SmoothQuant, and
a W8A8 GEMM that accumulates in int32 and dequantizes in its epilogue.

Chapter 7 (inference in low precision) and Lab 07 (its INT8 questions).  Entry points: :func:`quantize_int8`,
:func:`quantize_int8_with_scale`, :func:`dequantize_int8`, :func:`calibrate_amax`,
:func:`smoothquant_scales`, :func:`smooth`, :func:`w8a8_matmul`, with plain-PyTorch references beside
them (:func:`quantize_int8_reference`, :func:`quantize_int8_asymmetric_reference`,
:func:`w8a8_matmul_reference`).

The encoding (symmetric, as GPUs' int8 tensor cores multiply it): ``x ~= S * q`` with ``q`` an int8 in
[-127, 127] (-128 is never produced, so negation is exact and the range is symmetric), ``S = amax / 127``
computed in fp32 (correctly rounded), ``q = clamp(rne(x / S), -127, 127)`` with the division correctly
rounded and ``rne`` rounding to the nearest integer, ties to even.  A group whose amax is 0 gets ``S = 1``
(every code 0).  *Per token* is one S per row of an activation ``(T, K)``; *per channel* one S per row of
a weight ``(N, K)`` (an output channel); the kernel is the same, one S per row.  *Per tensor* is one S.

INT8 has no NaN and no infinity.  A non-finite input would leave a wrong code silently, so the
quantizers make a non-finite element's group amax infinite, and the host refuses the result with an
error naming the rows (``check_finite=False`` skips that check and its device sync; the codes of such a
group are then meaningless).

The GEMM ``C = (S_a * A) (S_b * B)^T``: ``A`` ``(M, K)`` and ``B`` ``(N, K)`` int8 codes, both K-major;
``tl.dot`` multiplies int8 tiles into an int32 accumulator, exactly while ``K * 127^2 < 2^31`` (K up to
:data:`MAX_K`); the epilogue converts the int32 sum to fp32 (exact below 2^24, rounded to nearest above)
and multiplies by ``S_a`` (per tensor or per row) and then ``S_b`` (per tensor or per column), adds an
optional bias in fp32 and rounds once to the output dtype.  The same operations in the same order in
PyTorch (:func:`w8a8_matmul_reference` with ``exact=True``) give the same bits on both lanes.
"""

import torch
import triton
import triton.language as tl

import kernels
from kernels.device import check_device
from kernels.fp8_gemm import grouped_tile

QMAX = 127
MAX_K = (2**31 - 1) // QMAX**2  # the longest K whose int32 sum of int8 products cannot overflow
GRANULARITIES = ("tensor", "token", "channel")  # token and channel: one scale per row of their matrix
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: fp32's spacing there is 1, so (y + it) - it rounds y
QUANT_BLOCK_K = 1024  # elements of a row per step of the quantizer's loops
CALIBRATIONS = ("max", "percentile", "mse")


# -- argument checks ------------------------------------------------------------------------------


def _check_matrix(x, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D matrix (rows, K), got shape {tuple(x.shape)}")
    check_device(x, name)
    return x.contiguous()


def _check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
    return granularity


def _refuse_non_finite(s: torch.Tensor, name: str) -> None:
    bad = torch.nonzero(~torch.isfinite(s.reshape(-1))).reshape(-1)
    if bad.numel():
        rows = bad[:8].tolist()
        more = f" and {bad.numel() - 8} more" if bad.numel() > 8 else ""
        where = "the tensor" if s.numel() == 1 else f"rows {rows}{more}"
        raise ValueError(f"{name} has NaN or infinite values in {where}: INT8 cannot encode them")


# -- the quantizer kernel -----------------------------------------------------------------------------


@triton.jit
def _rne(y):
    """y rounded to the nearest integer, ties to even, for |y| < 2^22 (fp32 adds, each correctly rounded)."""
    return (y + ROUND_MAGIC) - ROUND_MAGIC


@triton.jit
def _group_abs(x):
    """|x|, with NaN counted as infinite, so that a group holding one has an infinite amax."""
    return tl.where(x == x, tl.abs(x), float("inf"))


@triton.jit
def _int8_rows_kernel(x_ptr, q_ptr, s_ptr, M, K, OWN_SCALE: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program per row.  OWN_SCALE: the row's amax first (one walk), S = amax / 127, then the codes
    # (a second walk, from L2); otherwise S is the one number at s_ptr (per tensor, or a calibrated scale).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    if OWN_SCALE:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + row * K + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, _group_abs(x))
        amax_row = tl.max(amax, axis=0)
        s = tl.where(amax_row > 0, tl.math.div_rn(amax_row, 127.0), 1.0)
        tl.store(s_ptr + row, s)
    else:
        s = tl.load(s_ptr)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + cols < K
        x = tl.load(x_ptr + row * K + k0 + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.clamp(tl.math.div_rn(x, s), -127.0, 127.0)  # clamp first: |y| stays far below 2^22
        tl.store(q_ptr + row * K + k0 + cols, _rne(y).to(tl.int8), mask=mask)


@triton.jit
def _row_amax_kernel(x_ptr, amax_ptr, M, K, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * K + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, _group_abs(x))
    tl.store(amax_ptr + row, tl.max(amax, axis=0))


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """S = amax / 127 in fp32 (1 where amax is 0): the quantizer kernel's rule, in PyTorch.  The divisor
    is a tensor on amax's device: divided by a Python number, a CUDA tensor is multiplied by the number's
    reciprocal instead (PyTorch's shortcut), which can differ from the division in the last bit."""
    amax = amax.float()
    return torch.where(amax > 0, amax / amax.new_tensor(QMAX), torch.ones_like(amax))


def quantize_int8(x: torch.Tensor, granularity: str = "token", check_finite: bool = True) -> tuple:
    """Symmetric INT8 codes of a matrix ``x`` ``(rows, K)`` and their fp32 scales: ``(q, s)``.

    ``granularity``: "token" or "channel" (one S per row, ``s`` of shape ``(rows, 1)``; "channel" is the
    name for the rows of a weight ``(N, K)``) or "tensor" (one S, ``s`` of shape ``()``).  Bit for bit
    :func:`quantize_int8_reference`.  A NaN or infinity in ``x`` raises ``ValueError`` naming its rows
    (see the module docstring; ``check_finite=False`` skips the check and its sync)."""
    _check_granularity(granularity)
    x = _check_matrix(x)
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    if granularity == "tensor":
        amax = torch.empty(m, dtype=torch.float32, device=x.device)
        if m * k:
            _row_amax_kernel[(m,)](x, amax, m, k, BLOCK_K=QUANT_BLOCK_K)
        s = _scale_from_amax(amax.amax() if m else torch.zeros((), device=x.device))
        if check_finite:
            _refuse_non_finite(s, "x")
        if m * k:
            _int8_rows_kernel[(m,)](x, q, s, m, k, OWN_SCALE=False, BLOCK_K=QUANT_BLOCK_K)
        return q, s
    s = torch.ones((m, 1), dtype=torch.float32, device=x.device)
    if m * k:
        _int8_rows_kernel[(m,)](x, q, s, m, k, OWN_SCALE=True, BLOCK_K=QUANT_BLOCK_K)
    if check_finite:
        _refuse_non_finite(s, "x")
    return q, s


def quantize_int8_with_scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """INT8 codes of ``x`` with a given scale ``s`` (one element: static quantization with a calibrated
    scale).  Values beyond ``127 * s`` saturate to +-127; a NaN becomes a meaningless code, so static
    quantization of untrusted activations should check them upstream."""
    x = _check_matrix(x)
    if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
        raise ValueError(f"s must be a one-element float32 tensor, got {getattr(s, 'shape', type(s))}")
    check_device(s, "s")
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise ValueError(f"s must be positive and finite, got {s.item()}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    if m * k:
        _int8_rows_kernel[(m,)](x, q, s.reshape(1).contiguous(), m, k, OWN_SCALE=False, BLOCK_K=QUANT_BLOCK_K)
    return q


def quantize_int8_reference(x: torch.Tensor, granularity: str = "token", s: torch.Tensor | None = None) -> tuple:
    """Plain-PyTorch :func:`quantize_int8` (or, with ``s``, :func:`quantize_int8_with_scale`): the same
    fp32 operations, so the same bits.  Returns ``(q, s)``; no finiteness check."""
    _check_granularity(granularity)
    xf = x.float()
    if s is None:
        mag = torch.where(torch.isnan(xf), torch.full_like(xf, float("inf")), xf.abs())
        if granularity == "tensor":
            amax = mag.amax() if mag.numel() else torch.zeros((), device=x.device)
        else:
            amax = mag.amax(dim=1, keepdim=True) if x.shape[1] else torch.zeros((x.shape[0], 1), device=x.device)
        s = _scale_from_amax(amax)
    y = torch.clamp(xf / s, -QMAX, QMAX)
    return torch.round(y).to(torch.int8), s


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, zero_point: torch.Tensor | int | None = None) -> torch.Tensor:
    """``S * (q - zero_point)`` in fp32 (``zero_point`` only for asymmetric codes)."""
    qf = q.float()
    if zero_point is not None:
        qf = qf - (zero_point.float() if isinstance(zero_point, torch.Tensor) else float(zero_point))
    return qf * s


def quantize_int8_asymmetric_reference(x: torch.Tensor) -> tuple:
    """Asymmetric (affine) per-tensor INT8, the other common encoding: ``x ~= S * (q - z)`` with ``q`` in
    [-128, 127], ``S = (max - min) / 255`` over a range that includes 0, and the zero point ``z`` the
    integer that 0.0 maps to, so that 0 (padding, ReLU's zeros) is exact.  Returns ``(q, s, z)``.  It
    spends all 256 codes on a one-sided range (ReLU outputs) where symmetric codes waste half; the
    price is the zero point's cross terms in every GEMM, which is why GPU inference kernels keep
    activations symmetric or fold ``z`` into a bias."""
    xf = x.float()
    lo = torch.clamp(xf.min(), max=0.0)
    hi = torch.clamp(xf.max(), min=0.0)
    s = torch.where(hi > lo, (hi - lo) / hi.new_tensor(255.0), torch.ones_like(hi))
    z = torch.round(-128 - lo / s)
    q = torch.clamp(torch.round(xf / s) + z, -128, 127)
    return q.to(torch.int8), s, z.to(torch.int32)


# -- calibration ----------------------------------------------------------------------------------------


def calibrate_amax(samples, method: str = "max", percentile: float = 99.99, candidates: int = 64) -> torch.Tensor:
    """The amax a static per-tensor scale is built from (``S = amax / 127``), from calibration
    activations ``samples`` (a tensor or a list of tensors, any shapes).

    ``method``: "max" (the largest magnitude seen: nothing saturates, outliers stretch the scale),
    "percentile" (the ``percentile``-th percentile of the magnitudes: the rare values above it saturate)
    or "mse" (of ``candidates`` clip levels between 1/``candidates`` of the max and the max, the one whose
    quantize-dequantize round trip has the smallest mean squared error over the samples)."""
    if method not in CALIBRATIONS:
        raise ValueError(f"method must be one of {list(CALIBRATIONS)}, got {method!r}")
    if isinstance(samples, torch.Tensor):
        samples = [samples]
    mags = torch.cat([s.detach().float().reshape(-1).abs() for s in samples])
    if mags.numel() == 0:
        raise ValueError("samples holds no values to calibrate on")
    if not bool(torch.isfinite(mags).all()):
        raise ValueError("samples hold NaN or infinite values: calibrate on finite activations")
    top = mags.max()
    if method == "max" or top == 0:
        return top
    if method == "percentile":
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        rank = max(1, min(mags.numel(), int(round(percentile / 100 * mags.numel()))))
        return torch.kthvalue(mags.cpu(), rank).values.to(mags.device)
    if candidates < 2:
        raise ValueError(f"candidates must be at least 2, got {candidates}")
    best, best_err = top, None
    for i in range(1, candidates + 1):
        amax = top * i / candidates
        s = amax / amax.new_tensor(QMAX)
        err = ((torch.clamp(torch.round(mags / s), max=QMAX) * s - mags) ** 2).mean()
        if best_err is None or err < best_err:
            best, best_err = amax, err
    return best


# -- SmoothQuant ----------------------------------------------------------------------------------------


def smoothquant_scales(act_amax: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``.

    ``act_amax``: ``(K,)`` the calibration activations' largest magnitude per input channel;
    ``weight``: ``(N, K)``.  Dividing X's column j by ``s_j`` and multiplying W's column j by it leaves
    ``X W^T`` unchanged and moves the outliers' range from the activations (per-token scales cannot
    isolate a channel) into the weights (per-channel scales of W absorb it along N, not K, so the
    migration evens out their per-row amax only partly; ``alpha`` sets the split)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if weight.dim() != 2 or act_amax.shape != (weight.shape[1],):
        raise ValueError(
            f"act_amax must have shape (K,) = ({weight.shape[-1]},) for a weight (N, K), got {tuple(act_amax.shape)}"
        )
    w_amax = weight.detach().float().abs().amax(dim=0)
    a = act_amax.float().clamp(min=1e-5)
    s = a.pow(alpha) / w_amax.clamp(min=1e-5).pow(1 - alpha)
    return s.clamp(min=1e-5)


def smooth(x: torch.Tensor, weight: torch.Tensor, s: torch.Tensor) -> tuple:
    """``(x / s, weight * s)``, s broadcast over the input channels (the last dimension of both)."""
    return (x.float() / s).to(x.dtype), (weight.float() * s).to(weight.dtype)


# -- the W8A8 GEMM ---------------------------------------------------------------------------------------

W8A8_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_stages=st, num_warps=w)
    for bm, bn, st, w in ((128, 256, 3, 8), (256, 128, 3, 8), (128, 128, 4, 8), (128, 128, 4, 4), (64, 128, 4, 4))
]
CPU_W8A8_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4}


@triton.jit
def _w8a8_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, M, N, K,
    SA_ROWS: tl.constexpr, SB_COLS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k[None, :] < K - k0
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_mask, other=0)
        b = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & k_mask, other=0)
        acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)  # int8 x int8 -> int32, exact
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    # The epilogue: int32 -> fp32, times S_a, times S_b, plus the bias, one rounding to C's dtype.
    c = acc.to(tl.float32)
    if SA_ROWS:
        c = c * tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    else:
        c = c * tl.load(sa_ptr)
    if SB_COLS:
        c = c * tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    else:
        c = c * tl.load(sb_ptr)
    if HAS_BIAS:
        c = c + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], c.to(c_ptr.dtype.element_ty), mask=mask)


_w8a8_tuned = triton.autotune(configs=W8A8_CONFIGS, key=["M", "N", "K", "SA_ROWS", "SB_COLS", "HAS_BIAS"])(_w8a8_kernel)


def _check_codes(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int8 codes, got {type(t).__name__}")
    if t.dtype != torch.int8:
        raise TypeError(f"{name} must have dtype int8, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, K), got shape {tuple(t.shape)}")
    check_device(t, name)
    return t.contiguous()


def _check_w8a8_scale(s, name: str, rows: int) -> tuple:
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor of scales, got {getattr(s, 'dtype', type(s))}")
    check_device(s, name)
    if s.numel() == 1:
        return s.reshape(1).contiguous(), False
    if s.numel() != rows:
        raise ValueError(f"{name} must hold one scale or one per row ({rows}), got shape {tuple(s.shape)}")
    return s.reshape(rows).contiguous(), True


def w8a8_matmul(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``C = (S_a * a) @ (S_b * b)^T (+ bias)`` in ``out_dtype``: ``a`` ``(M, K)`` int8 (per-tensor or
    per-token scales, one or ``(M, 1)``), ``b`` ``(N, K)`` int8 (per-tensor or per-channel scales, one or
    ``(N, 1)``), ``bias`` ``(N,)`` added in fp32.  int32 accumulation (K at most :data:`MAX_K`), the
    dequantization in the epilogue; see the module docstring."""
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: both must be (rows, K) with the same K")
    m, k = a.shape
    n = b.shape[0]
    if k > MAX_K:
        raise ValueError(f"K = {k} is longer than {MAX_K}, where an int32 sum of int8 products could overflow")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype}")
    sa, sa_rows = _check_w8a8_scale(a_scale, "a_scale", m)
    sb, sb_cols = _check_w8a8_scale(b_scale, "b_scale", n)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (n,):
            raise ValueError(f"bias must be a tensor of shape ({n},), got {getattr(bias, 'shape', type(bias))}")
        check_device(bias, "bias")
        bias = bias.float().contiguous()
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if c.numel() == 0:
        return c
    args = (a, b, c, sa, sb, bias if bias is not None else sa, m, n, k)
    meta = {"SA_ROWS": sa_rows, "SB_COLS": sb_cols, "HAS_BIAS": bias is not None}
    # enable_fp_fusion=False: the epilogue's multiplies and the bias add are rounded apart, as in the
    # reference (a fused multiply-add would round once where PyTorch rounds twice).
    if kernels.INTERPRETER:
        cfg = CPU_W8A8_CONFIG
        grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        _w8a8_kernel[grid](*args, **meta, **cfg, enable_fp_fusion=False)
    else:
        grid = lambda cfg: (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)  # noqa: E731
        _w8a8_tuned[grid](*args, **meta, enable_fp_fusion=False)
    return c


def w8a8_matmul_reference(a, b, a_scale, b_scale, bias=None, out_dtype=torch.bfloat16, exact: bool = True):
    """Plain-PyTorch :func:`w8a8_matmul`.  ``exact=True``: the kernel's own operations (an exact integer
    product, then fp32 scales and bias in its order, one rounding), so the same bits; ``exact=False``:
    the float64 value of the dequantized product, the yardstick for the encoding's error."""
    m, n = a.shape[0], b.shape[0]
    sa = a_scale.float().reshape(-1, 1) if a_scale.numel() > 1 else a_scale.float().reshape(1, 1)
    sb = b_scale.float().reshape(1, -1) if b_scale.numel() > 1 else b_scale.float().reshape(1, 1)
    if not exact:
        c = (a.double() * sa.double()) @ (b.double() * sb.double().reshape(-1, 1)).T
        return c + bias.double() if bias is not None else c
    acc = a.cpu().long() @ b.cpu().long().T  # exact
    c = acc.to(a.device).float() * sa.expand(m, 1) * sb.expand(1, n)
    if bias is not None:
        c = c + bias.float()
    return c.to(out_dtype)


__all__ = [
    "CALIBRATIONS",
    "GRANULARITIES",
    "MAX_K",
    "QMAX",
    "calibrate_amax",
    "dequantize_int8",
    "quantize_int8",
    "quantize_int8_asymmetric_reference",
    "quantize_int8_reference",
    "quantize_int8_with_scale",
    "smooth",
    "smoothquant_scales",
    "w8a8_matmul",
    "w8a8_matmul_reference",
]
