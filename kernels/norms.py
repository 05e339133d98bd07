"""Mixed-precision RMSNorm and LayerNorm in Triton: load narrow, compute wide, store narrow.

Chapter 4 and Lab 04 (loss scaling, its RMSNorm question).  Entry points: :func:`rmsnorm`,
:class:`RMSNorm`, :func:`rmsnorm_forward`, :func:`rmsnorm_backward`, :func:`layernorm`,
:class:`LayerNorm`, each with its ``*_reference``.

* :func:`rmsnorm` (an ``autograd.Function``) and :class:`RMSNorm` (an ``nn.Module``) run the forward
  and backward of RMSNorm in Triton: bf16/fp16 rows in and out, statistics in fp32 registers, the
  reciprocal RMS saved in fp32 for the backward, the weight gradient reduced in fp32 (per-program
  partial sums, then a second small reduction).  :func:`rmsnorm_reference` is the fp32 reference.
* :func:`layernorm` and :class:`LayerNorm` do the same with the mean subtracted (two fp32 statistics
  per row, dW and dB reduced in fp32).
"""

import math

import torch
import triton
import triton.language as tl

import kernels
from kernels.device import check_device, sm_facts

# -- tuning constants ---------------------------------------------------------------------------------

RMSNORM_BWD_PROGRAMS_PER_SM = 2  # persistent backward programs per SM, each owning a dW partial sum
RMSNORM_BWD_PROGRAMS_CPU = 4  # the interpreter runs programs one after another: few and long is faster
RMSNORM_DW_BLOCK_N = 128  # columns per program of the second dW reduction
RMSNORM_DW_BLOCK_G = 64  # partial rows summed per iteration there


# -- mixed-precision RMSNorm -------------------------------------------------------------------------


def rmsnorm_warps(block: int) -> int:
    """Warps for one row of ``block`` elements: about 16 elements per thread, 4 to 16 warps."""
    return max(4, min(16, block // 512))


@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, stride_x, stride_y, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)  # load narrow
    # fp32 statistics in registers: a bf16 running sum of 8192 squares would keep ~3 digits
    mean_sq = tl.sum(x * x, axis=0) / N
    rstd = tl.div_rn(1.0, tl.sqrt_rn(mean_sq + eps))  # IEEE-rounded: the same bits on every device
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w  # compute wide
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)  # store narrow
    tl.store(rstd_ptr + row, rstd)  # 4 bytes per row, fp32: the backward's only saved statistic


@triton.jit
def _rmsnorm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, M, N, stride_dy, stride_x, stride_dx, BLOCK: tl.constexpr
):
    """Persistent: program ``pid`` takes rows pid, pid + G, ... and keeps its share of dW in fp32
    registers, written once to row ``pid`` of the (G, N) partial-sum buffer."""
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    # Row pointers advance by n_programs rows a step, so no row * stride product can overflow int32.
    dy_row = dy_ptr + pid * stride_dy
    x_row = x_ptr + pid * stride_x
    dx_row = dx_ptr + pid * stride_dx
    for row in range(pid, M, n_programs):
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        wdy = w * dy
        # dx = rstd * (w*dy - x_hat * mean(w*dy * x_hat)): one fp32 reduction per row
        c = tl.sum(x_hat * wdy, axis=0) / N
        dx = (wdy - x_hat * c) * rstd
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * x_hat
        dy_row += n_programs * stride_dy
        x_row += n_programs * stride_x
        dx_row += n_programs * stride_dx
    tl.store(dw_partial_ptr + pid * N + cols, dw, mask=mask)


@triton.jit
def _sum_rows_kernel(partial_ptr, out_ptr, G, N, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n] = sum over g of partial[g, n], in fp32, rounded once to out's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        r = g0 + rows
        tile = tl.load(
            partial_ptr + r[:, None].to(tl.int64) * N + cols[None, :],
            mask=(r[:, None] < G) & (cols[None, :] < N),
            other=0.0,
        )  # (BLOCK_G, BLOCK_N)
        acc += tl.sum(tile, axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < N)


_NORM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_norm_inputs(x, weight, eps):
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("x and weight must be tensors")
    if x.dtype not in _NORM_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if weight.dtype not in _NORM_DTYPES:
        raise TypeError(f"weight must be float32, float16 or bfloat16, got {weight.dtype}")
    if weight.dim() != 1 or x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"weight must be 1-D with x's last dimension: x {tuple(x.shape)}, weight {tuple(weight.shape)}"
        )
    if x.shape[-1] == 0:
        raise ValueError("x: the normalised dimension is empty")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite non-negative number, got {eps}")
    check_device(x, "x")
    check_device(weight, "weight")


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """``(y, rstd)``: y = x * rstd * weight in x's dtype, rstd = 1/sqrt(mean(x^2) + eps) in fp32 per row."""
    _check_norm_inputs(x, weight, eps)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)  # (M, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(n)
        _rmsnorm_fwd_kernel[(m,)](
            x2, weight, y, rstd, x2.stride(0), y.stride(0), n, eps, BLOCK=block, num_warps=rmsnorm_warps(block)
        )
    return y.reshape(x.shape), rstd


def _bwd_programs(m: int, device: torch.device) -> int:
    if kernels.INTERPRETER:
        return max(1, min(m, RMSNORM_BWD_PROGRAMS_CPU))
    return max(1, min(m, sm_facts(device.index)[1] * RMSNORM_BWD_PROGRAMS_PER_SM))


def rmsnorm_backward(dy, x, weight, rstd):
    """``(dx, dweight)`` from the upstream gradient, the saved input and the saved fp32 rstd."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()  # (M, N)
    dy2 = dy.reshape(-1, n).contiguous()  # (M, N)
    m = x2.shape[0]
    dx = torch.empty_like(x2)
    dw = torch.empty(n, dtype=weight.dtype, device=x.device)
    if m == 0:
        return dx.reshape(x.shape), dw.zero_()
    block = triton.next_power_of_2(n)
    g = _bwd_programs(m, x.device)
    partial = torch.empty((g, n), dtype=torch.float32, device=x.device)  # (G, N) fp32 partial dW sums
    _rmsnorm_bwd_kernel[(g,)](
        dy2, x2, weight, rstd, dx, partial, m, n, dy2.stride(0), x2.stride(0), dx.stride(0),
        BLOCK=block, num_warps=rmsnorm_warps(block),
    )  # fmt: skip
    grid = (triton.cdiv(n, RMSNORM_DW_BLOCK_N),)
    _sum_rows_kernel[grid](partial, dw, g, n, BLOCK_G=RMSNORM_DW_BLOCK_G, BLOCK_N=RMSNORM_DW_BLOCK_N)
    return dx.reshape(x.shape), dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_backward(dy, x, weight, rstd)
        return dx, dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension with Triton forward and backward (differentiable)."""
    return RMSNormFunction.apply(x, weight, eps)


class RMSNorm(torch.nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight``, statistics in fp32, input dtype out."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=torch.float32, device=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The fp32 reference: everything widened to fp32 first, the result left in fp32 (not rounded)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf * rstd * weight.float()


# -- LayerNorm: the same pattern with one more statistic -------------------------------------------------


@triton.jit
def _layernorm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, stride_x, stride_y, N, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N  # fp32 statistics, in registers
    xc = tl.where(mask, x - mean, 0.0)  # padding lanes must not enter the variance
    rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(xc * xc, axis=0) / N + eps))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layernorm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    M, N, stride_dy, stride_x, stride_dx, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    dy_row = dy_ptr + pid * stride_dy
    x_row = x_ptr + pid * stride_x
    dx_row = dx_ptr + pid * stride_dx
    for row in range(pid, M, n_programs):
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
        x_hat = tl.where(mask, (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row), 0.0)
        wdy = w * dy
        # dx = rstd * (w*dy - mean(w*dy) - x_hat * mean(w*dy * x_hat)): two fp32 row reductions
        c1 = tl.sum(x_hat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (x_hat * c1 + c2)) * tl.load(rstd_ptr + row)
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * x_hat
        db += dy
        dy_row += n_programs * stride_dy
        x_row += n_programs * stride_x
        dx_row += n_programs * stride_dx
    tl.store(dw_partial_ptr + pid * N + cols, dw, mask=mask)
    tl.store(db_partial_ptr + pid * N + cols, db, mask=mask)


def layernorm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5):
    """``(y, mean, rstd)``: y = (x - mean) * rstd * weight + bias in x's dtype; mean and rstd fp32 per row."""
    _check_norm_inputs(x, weight, eps)
    if not isinstance(bias, torch.Tensor) or bias.shape != weight.shape or bias.dtype not in _NORM_DTYPES:
        raise ValueError(f"bias must be a float tensor shaped like weight {tuple(weight.shape)}")
    check_device(bias, "bias")
    n = x.shape[-1]
    x2 = x.reshape(-1, n)  # (M, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(n)
        _layernorm_fwd_kernel[(m,)](
            x2, weight, bias, y, mean, rstd, x2.stride(0), y.stride(0), n, eps,
            BLOCK=block, num_warps=rmsnorm_warps(block),
        )  # fmt: skip
    return y.reshape(x.shape), mean, rstd


def layernorm_backward(dy, x, weight, mean, rstd):
    """``(dx, dweight, dbias)`` from the upstream gradient, the input and the saved fp32 statistics."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()  # (M, N)
    dy2 = dy.reshape(-1, n).contiguous()  # (M, N)
    m = x2.shape[0]
    dx = torch.empty_like(x2)
    dw = torch.empty(n, dtype=weight.dtype, device=x.device)
    db = torch.empty(n, dtype=weight.dtype, device=x.device)
    if m == 0:
        return dx.reshape(x.shape), dw.zero_(), db.zero_()
    block = triton.next_power_of_2(n)
    g = _bwd_programs(m, x.device)
    partial = torch.empty((2, g, n), dtype=torch.float32, device=x.device)  # (dW | dB, G, N) fp32
    _layernorm_bwd_kernel[(g,)](
        dy2, x2, weight, mean, rstd, dx, partial[0], partial[1], m, n, dy2.stride(0), x2.stride(0), dx.stride(0),
        BLOCK=block, num_warps=rmsnorm_warps(block),
    )  # fmt: skip
    grid = (triton.cdiv(n, RMSNORM_DW_BLOCK_N),)
    for part, out in ((partial[0], dw), (partial[1], db)):
        _sum_rows_kernel[grid](part, out, g, n, BLOCK_G=RMSNORM_DW_BLOCK_G, BLOCK_N=RMSNORM_DW_BLOCK_N)
    return dx.reshape(x.shape), dw, db


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layernorm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_backward(dy, x, weight, mean, rstd)
        return dx, dw, db, None


def layernorm(x, weight, bias, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension with Triton forward and backward (differentiable)."""
    return LayerNormFunction.apply(x, weight, bias, eps)


class LayerNorm(torch.nn.Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias``, statistics in fp32, input dtype out."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=torch.float32, device=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(dim, dtype=dtype, device=device))

    def forward(self, x):
        return layernorm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def layernorm_reference(x, weight, bias, eps: float = 1e-5) -> torch.Tensor:
    """The fp32 reference, not rounded."""
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)


__all__ = [
    "LayerNorm",
    "LayerNormFunction",
    "RMSNorm",
    "RMSNormFunction",
    "layernorm",
    "layernorm_backward",
    "layernorm_forward",
    "layernorm_reference",
    "rmsnorm",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "rmsnorm_reference",
    "rmsnorm_warps",
]
