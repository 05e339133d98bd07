"""A blockwise (Random) Hadamard rotation: spread a block's outliers over all of its elements before
quantizing, undo it after.

Chapter 6 and Lab 06 (FP4 weight-only, the rotation question).  Entry points: :func:`hadamard_rotate`
and :func:`hadamard_rotate_reference`, :func:`hadamard_matrix`, :func:`random_signs`.

Each block of ``B`` consecutive elements along the last axis (the GEMM's K axis) is multiplied by the
orthonormal ``R = diag(signs) H / sqrt(B)``, ``H`` Sylvester's Hadamard matrix of +-1.  Applied to
both operands of ``a @ w.T``, the product is unchanged, while a block holding one large value comes
out with ``B`` values of similar size, which an FP4 block scale represents far better.  The kernel is a
``tl.dot`` of each row block with ``H`` (exact +-1 products, fp32 sums); the reference is the same in
float64, rounded once.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.device import check_device
from kernels.quantize import INPUT_DTYPES

HADAMARD_BLOCKS = (16, 32, 128)
HADAMARD_ROWS, HADAMARD_WARPS = 64, 4  # rows of a block column per program; its warps


def hadamard_matrix(block: int, dtype=torch.float32, device="cpu", normalized: bool = True) -> torch.Tensor:
    """Sylvester's Hadamard matrix of order ``block`` (a power of two): entries +-1, or +-1/sqrt(block)
    with ``normalized`` (then orthonormal and symmetric: H @ H = I)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if normalized:
        h = h / math.sqrt(block)
    return h.to(dtype=dtype, device=device)


def random_signs(block: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """The random +-1 diagonal of a Random Hadamard Transform (fp32, ``(block,)``), reproducible."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (block,), generator=g) * 2 - 1).to(torch.float32).to(device)


@triton.jit
def _hadamard_kernel(
    x_ptr, h_ptr, d_ptr, y_ptr, M, K, scale, B: tl.constexpr, ROWS: tl.constexpr, INVERSE: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    cols = pid_k * B + tl.arange(0, B)
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    mask = rows[:, None] < M
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    hb = tl.arange(0, B)
    h = tl.load(h_ptr + hb[:, None] * B + hb[None, :])  # (B, B) of +-1, exact in any dtype
    d = tl.load(d_ptr + hb).to(x.dtype)  # the random signs, +-1
    if INVERSE:
        # y = (x H / sqrt(B)) * d: undo the rotation (H is symmetric, so H^T = H)
        if IEEE:
            y = tl.dot(x, h.to(x.dtype), input_precision="ieee")
        else:
            y = tl.dot(x, h.to(x.dtype))
        y = y * scale * d.to(tl.float32)[None, :]
    else:
        # y = (x * d) H / sqrt(B): the sign flips are exact, the +-1 products too; fp32 sums
        xd = x * d[None, :]
        if IEEE:
            y = tl.dot(xd, h.to(x.dtype), input_precision="ieee")
        else:
            y = tl.dot(xd, h.to(x.dtype))
        y = y * scale
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _check_hadamard(x, block, signs):
    if block not in HADAMARD_BLOCKS:
        raise ValueError(f"block must be one of {HADAMARD_BLOCKS}, got {block!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must have dtype bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] % block:
        raise ValueError(f"x's last dimension must be a multiple of block = {block}, got shape {tuple(x.shape)}")
    if signs is None:
        signs = torch.ones(block, dtype=torch.float32, device=x.device)
    if not isinstance(signs, torch.Tensor) or signs.shape != (block,):
        raise ValueError(f"signs must be a ({block},) tensor of +-1, got {getattr(signs, 'shape', signs)}")
    if not bool(((signs == 1) | (signs == -1)).all()):
        raise ValueError("signs must hold only +1 and -1 (a rotation must stay orthogonal)")
    return x.contiguous(), signs.float().to(x.device)


def hadamard_rotate(x: torch.Tensor, block: int, signs: torch.Tensor | None = None, inverse: bool = False):
    """Rotate each block of ``block`` consecutive elements along the last axis by the orthonormal
    ``R = diag(signs) H / sqrt(block)``: ``y = x R`` (``inverse``: ``x = y R^T``).  Applied to both
    operands of ``a @ w.T`` along K, the product is unchanged: ``(a R)(w R)^T = a R R^T w^T = a w^T``.
    Output in ``x``'s dtype; fp32 accumulation (fp32 inputs: IEEE fp32 dot, no TF32)."""
    x, signs = _check_hadamard(x, block, signs)
    check_device(x, "x")
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    y = torch.empty_like(x2)
    if y.numel():
        h = hadamard_matrix(block, dtype=torch.bfloat16 if x.dtype != torch.float32 else torch.float32,
                            device=x.device, normalized=False)  # fmt: skip
        grid = (triton.cdiv(m, HADAMARD_ROWS), k // block)
        _hadamard_kernel[grid](
            x2, h, signs, y, m, k, 1.0 / math.sqrt(block), B=block, ROWS=HADAMARD_ROWS, INVERSE=inverse,
            IEEE=x.dtype == torch.float32, num_warps=HADAMARD_WARPS,
        )  # fmt: skip
    return y.reshape(x.shape)


def hadamard_rotate_reference(x: torch.Tensor, block: int, signs: torch.Tensor | None = None, inverse: bool = False):
    """Plain-torch :func:`hadamard_rotate`, in float64, rounded once to ``x``'s dtype."""
    x, signs = _check_hadamard(x, block, signs)
    h = hadamard_matrix(block, dtype=torch.float64, device=x.device)
    r = signs.double()[:, None] * h  # diag(d) H / sqrt(B)
    xb = x.double().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    y = xb @ (r.T if inverse else r)
    return y.reshape(x.shape).to(x.dtype)


__all__ = [
    "HADAMARD_BLOCKS",
    "hadamard_matrix",
    "hadamard_rotate",
    "hadamard_rotate_reference",
    "random_signs",
]
