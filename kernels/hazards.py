"""Small kernels that each show one numerical failure, with a switch that puts the classic bug in.

Chapter 3 and Lab 03 (diagnostics).  Entry points: :func:`row_mean`, :func:`softmax`,
:func:`variance`, :func:`to_bf16`, :func:`quantize_fp8`, each with its ``*_reference``.

Every function takes the correct path by default; the keyword that names the bug selects the broken
one, so a chapter or a test can show the failure, the fix and the detector side by side, and a lab
can hand out the broken kernel.  A plain-PyTorch reference (float64 inside) sits beside each.

* :func:`row_mean` of bf16 rows, with an fp32 or (bug) a bf16 running accumulator: the bf16 one
  stagnates as the sum grows, so its error grows with N.
* :func:`softmax` of fp32 rows padded to a power of two; padded lanes load ``other``, which must be
  -inf (bug: 0, which joins the max and the sum); ``valid`` masks positions out, and a row with none
  left gives NaN unless ``guard_empty``.
* :func:`quantize_fp8` to e4m3fn with a per-tensor scale: the scale must be applied before the cast
  (bug: after, so small tensors flush to zero and large ones clip at 448); an all-zero tensor needs a
  guard, or ``0 / 0`` makes every code NaN.
* :func:`variance` of fp16 rows from sums of ``x`` and ``x^2``: promoted to fp32 before summing, or
  (bug) summed in fp16, which overflows at 65504 and gives ``inf - inf = NaN`` at large N.
* :func:`to_bf16`: fp32 -> bf16 by the conversion (round to nearest even) or (bug) by keeping the high
  16 bits, which rounds toward zero and biases every result.
"""

import math

import torch
import triton
import triton.language as tl

from kernels import formats
from kernels.device import check_device

E4M3_MAX = formats.E4M3_MAX


def _check_2d(x, name, dtypes):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, N), got shape {tuple(x.shape)}")
    check_device(x, name)


@triton.jit
def _tree_sum(t, ROWS: tl.constexpr, LANES: tl.constexpr, LOG2_LANES: tl.constexpr):
    """Sum (ROWS, LANES) over the lanes by a fixed pairwise tree, in t's dtype: the same order, so
    the same bits, on every device (``tl.sum``'s order is the compiler's choice)."""
    for i in tl.static_range(LOG2_LANES):
        t = tl.reshape(t, (ROWS, LANES >> (i + 1), 2))
        lo, hi = tl.split(t)
        t = lo + hi
    return tl.reshape(t, (ROWS,))


# -- row mean: the accumulator's width --------------------------------------------------------------

MEAN_LANES = 128
ROWS = 8  # rows per program


@triton.jit
def _row_mean_kernel(
    x_ptr, out_ptr, M, N, ACC: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr, LOG2_LANES: tl.constexpr
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    base = rows.to(tl.int64)[:, None] * N  # (ROWS, 1)
    acc = tl.zeros((ROWS, LANES), dtype=ACC)
    for k in range(0, N, LANES):
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + base + k + lanes[None, :], mask=mask, other=0.0)  # (ROWS, LANES)
        acc = acc + x.to(ACC)
    total = _tree_sum(acc.to(tl.float32), ROWS, LANES, LOG2_LANES)  # (ROWS,)
    tl.store(out_ptr + rows, total / N, mask=rows < M)


def row_mean(x: torch.Tensor, acc: str = "fp32") -> torch.Tensor:
    """Mean of each row of a bf16 (M, N) tensor, fp32 out; ``acc="bf16"`` is the bug."""
    _check_2d(x, "x", (torch.bfloat16,))
    if acc not in ("fp32", "bf16"):
        raise ValueError(f"acc must be 'fp32' or 'bf16', got {acc!r}")
    x = x.contiguous()
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    if M and N:
        _row_mean_kernel[(triton.cdiv(M, ROWS),)](
            x, out, M, N, ACC=tl.float32 if acc == "fp32" else tl.bfloat16, ROWS=ROWS, LANES=MEAN_LANES, LOG2_LANES=7
        )
    elif M:
        out.fill_(math.nan)
    return out


def row_mean_reference(x: torch.Tensor) -> torch.Tensor:
    return x.double().mean(dim=1).float()


# -- softmax: the mask value ------------------------------------------------------------------------


@triton.jit
def _softmax_kernel(
    x_ptr, valid_ptr, out_ptr, N, OTHER: tl.constexpr, HAS_VALID: tl.constexpr, GUARD: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=inside, other=OTHER)  # padded lanes read OTHER
    if HAS_VALID:
        keep = tl.load(valid_ptr + row * N + cols, mask=inside, other=0) != 0
        x = tl.where(keep, x, float("-inf"))
    m = tl.max(x, axis=0)
    if GUARD:
        m = tl.where(m == float("-inf"), 0.0, m)  # nothing valid: exp(-inf - 0) = 0, not NaN
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    if GUARD:
        y = tl.where(s > 0, e / s, 0.0)
    else:
        y = e / s
    tl.store(out_ptr + row * N + cols, y, mask=inside)


def softmax(
    x: torch.Tensor, valid: torch.Tensor | None = None, other: float = -math.inf, guard_empty: bool = True
) -> torch.Tensor:
    """Softmax of each row of an fp32 (M, N) tensor; positions where ``valid`` is False get weight 0.

    ``other`` is what the lanes beyond N (the row is padded to a power of two) load: -inf is right;
    ``other=0.0`` is the bug.  A row with no valid position gives zeros with ``guard_empty``, NaN
    (``-inf - (-inf)``) without.
    """
    _check_2d(x, "x", (torch.float32,))
    if valid is not None:
        if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool or valid.shape != x.shape:
            raise TypeError(f"valid must be None or a bool tensor of shape {tuple(x.shape)}")
    x = x.contiguous()
    M, N = x.shape
    out = torch.empty_like(x)
    if M and N:
        v = valid.to(torch.int8).contiguous() if valid is not None else x
        _softmax_kernel[(M,)](
            x,
            v,
            out,
            N,
            OTHER=float(other),
            HAS_VALID=valid is not None,
            GUARD=guard_empty,
            BLOCK=triton.next_power_of_2(N),
        )
    return out


def softmax_reference(x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """float64 softmax; rows with no valid position are zeros."""
    x64 = x.double()
    if valid is not None:
        x64 = x64.masked_fill(~valid, -math.inf)
    m = x64.amax(dim=1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), 0.0, m)
    e = torch.exp(x64 - m)
    s = e.sum(dim=1, keepdim=True)
    return torch.where(s > 0, e / torch.where(s > 0, s, 1.0), 0.0).float()


# -- fp8 quantization: where the scale goes ---------------------------------------------------------


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_inv_ptr, n, SCALE_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    scale_inv = tl.load(scale_inv_ptr)  # 448 / amax: x * scale_inv fills e4m3's range
    if SCALE_FIRST:
        q = (x * scale_inv).to(tl.float8e4nv)
    else:
        q = (x.to(tl.float8e4nv).to(tl.float32) * scale_inv).to(tl.float8e4nv)
    tl.store(q_ptr + offs, q, mask=mask)


def quantize_fp8(x: torch.Tensor, scale_first: bool = True, guard_zero: bool = True) -> tuple:
    """Per-tensor e4m3fn quantization: returns (q, scale) with ``x ~= q.float() * scale``.

    ``scale = amax / 448`` (reconstruction convention), ``q = (x / scale)`` rounded to e4m3fn.
    ``scale_first=False`` is the bug (cast, then scale).  ``guard_zero=False`` lets an all-zero tensor
    compute ``448 / 0``: every code becomes NaN.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"x must be a torch.float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    check_device(x, "x")
    x = x.contiguous()
    amax = x.abs().amax() if x.numel() else torch.zeros((), device=x.device)
    if guard_zero:
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    # A tensor divisor, not a Python number: CUDA torch divides by a scalar by multiplying with its
    # reciprocal, which is not correctly rounded, so the scale would differ from the CPU's by an ulp.
    scale = (amax / torch.full_like(amax, E4M3_MAX)).float()
    scale_inv = (E4M3_MAX / amax).float().reshape(1)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    n = x.numel()
    if n:
        _quantize_kernel[(triton.cdiv(n, 1024),)](x, q, scale_inv, n, SCALE_FIRST=scale_first, BLOCK=1024)
    return q, scale


def quantize_fp8_reference(x: torch.Tensor) -> tuple:
    """Saturating e4m3fn quantization in torch (the clamp makes torch's cast agree with the GPU's)."""
    amax = x.abs().amax() if x.numel() else torch.zeros(())
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    scale_inv = (E4M3_MAX / amax).float()
    q = (x * scale_inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, (amax / torch.full_like(amax, E4M3_MAX)).float()


# -- variance: promotion before the sums ------------------------------------------------------------

VAR_LANES = 256


@triton.jit
def _variance_kernel(
    x_ptr, out_ptr, M, N, PROMOTE: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr, LOG2_LANES: tl.constexpr
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    base = rows.to(tl.int64)[:, None] * N  # (ROWS, 1)
    if PROMOTE:
        s1 = tl.zeros((ROWS, LANES), dtype=tl.float32)
        s2 = tl.zeros((ROWS, LANES), dtype=tl.float32)
    else:
        s1 = tl.zeros((ROWS, LANES), dtype=tl.float16)
        s2 = tl.zeros((ROWS, LANES), dtype=tl.float16)
    for k in range(0, N, LANES):
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + base + k + lanes[None, :], mask=mask, other=0.0)  # (ROWS, LANES)
        if PROMOTE:
            x = x.to(tl.float32)
        s1 = s1 + x
        s2 = s2 + x * x
    mean = _tree_sum(s1, ROWS, LANES, LOG2_LANES) / N
    mean_sq = _tree_sum(s2, ROWS, LANES, LOG2_LANES) / N
    var = mean_sq - mean * mean
    tl.store(out_ptr + rows, var.to(tl.float32), mask=rows < M)


def variance(x: torch.Tensor, promote: bool = True) -> torch.Tensor:
    """Population variance of each row of an fp16 (M, N) tensor, as E[x^2] - E[x]^2, fp32 out;
    ``promote=False`` (sums kept in fp16) is the bug."""
    _check_2d(x, "x", (torch.float16,))
    x = x.contiguous()
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    if M and N:
        _variance_kernel[(triton.cdiv(M, ROWS),)](
            x, out, M, N, PROMOTE=promote, ROWS=ROWS, LANES=VAR_LANES, LOG2_LANES=8, enable_fp_fusion=False
        )
    elif M:
        out.fill_(math.nan)
    return out


def variance_reference(x: torch.Tensor) -> torch.Tensor:
    return x.double().var(dim=1, unbiased=False).float()


# -- fp32 -> bf16: the rounding ---------------------------------------------------------------------


@triton.jit
def _to_bf16_kernel(x_ptr, y_ptr, n, TRUNCATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if TRUNCATE:
        hi = (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
        y = hi.to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(tl.bfloat16)
    tl.store(y_ptr + offs, y, mask=mask)


def to_bf16(x: torch.Tensor, truncate: bool = False) -> torch.Tensor:
    """fp32 -> bf16 by the conversion instruction; ``truncate=True`` (keep the top 16 bits) is the bug."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"x must be a torch.float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    check_device(x, "x")
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    if n:
        _to_bf16_kernel[(triton.cdiv(n, 1024),)](x, y, n, TRUNCATE=truncate, BLOCK=1024)
    return y


def to_bf16_reference(x: torch.Tensor) -> torch.Tensor:
    """The hardware conversion's bits (round to nearest even, NaN -> 0x7FFF), by the package's encoder."""
    return formats.encode_reference(x, "bf16")


__all__ = [
    "E4M3_MAX",
    "quantize_fp8",
    "quantize_fp8_reference",
    "row_mean",
    "row_mean_reference",
    "softmax",
    "softmax_reference",
    "to_bf16",
    "to_bf16_reference",
    "variance",
    "variance_reference",
]
