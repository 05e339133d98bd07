"""fp32 -> bf16 conversion, three ways that must agree bit for bit.

Chapter 1 and Lab 00 (bf16 rounding), which builds :func:`fp32_to_bf16_rne`.  Entry points:
:func:`fp32_to_bf16_rne`, :func:`hardware_bf16`, :func:`fp32_to_bf16_reference`.

* :func:`fp32_to_bf16_rne` rounds to nearest even with integer operations only, the way Lab 0 teaches
  it: a bf16 is the upper half of an fp32, so rounding is "add a bias to the 32-bit pattern, keep the
  top 16 bits".
* :func:`hardware_bf16` is ``x.to(tl.bfloat16)`` in a Triton kernel: what the GPU's conversion
  instruction does (on the CPU, the corrected interpreter reproduces Hopper's bits).
* :func:`fp32_to_bf16_reference` is the same integer recipe in plain PyTorch on the CPU, readable
  without knowing Triton, and a third opinion when the first two disagree.

NaN is the one place where "round the bits" and the hardware part ways: adding the bias to a NaN can
carry through the exponent (0x7FFFFFFF -> 0x8000, a negative zero) or drop a payload that lives only
in the low half (0x7F800001 -> 0x7F80, inf).  Compiled Triton on Hopper returns 0x7FFF for every NaN
of any sign or payload (measured on an H200, see ``tests/data/hopper_numerics.npz``), so all three
send NaN there before rounding could do harm.
"""

import torch
import triton
import triton.language as tl

from kernels import formats
from kernels.device import check_device

# One program handles BLOCK elements.  The work per element is a handful of integer ops, so the
# kernel is bound by memory traffic; 1024 elements (4 KiB in, 2 KiB out) per program keep enough
# loads in flight without making the last, partly masked block expensive.
BLOCK = 1024

# bf16 bit patterns as Python ints, named once so the kernel, the reference and the checks agree.
BF16_CANONICAL_NAN = 0x7FFF
FP32_ABS_MASK = 0x7FFFFFFF
FP32_INF_BITS = 0x7F800000


@triton.jit
def _fp32_to_bf16_rne_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    # int64 offsets: a tensor of more than 2^31 elements would overflow int32 indices silently.
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # Unsigned, so that ">> 16" shifts in zeros and the sign bit travels as an ordinary bit.
    u = x.to(tl.uint32, bitcast=True)
    # Round to nearest, ties to even: 0x7FFF is "just under half" of the 16 dropped bits; adding the
    # lowest kept bit turns an exact half into a carry only when the kept part is odd.  A carry out of
    # the mantissa lands in the exponent, which is exactly the next representable value (and turns
    # the largest finite values into inf).  Finite inputs and inf stay below 0xFF800000 + 0x8000, so
    # the 32-bit sum cannot wrap.
    lsb = (u >> 16) & 1
    rounded = (u + 0x7FFF + lsb) >> 16
    # NaN: exponent all ones, mantissa non-zero.  Decided on the input, before the bias could carry
    # a NaN into inf, zero or a wrapped-around pattern.
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = tl.where(is_nan, 0x7FFF, rounded)
    y = out.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    tl.store(y_ptr + offs, y, mask=mask)


def _check_fp32(x, name: str) -> torch.Tensor:
    """Validate a kernel argument; returns it contiguous (a copy only if it was strided)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of dtype torch.float32, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must have dtype torch.float32, got {x.dtype}")
    check_device(x, name)
    return x.contiguous()


def _launch(kernel, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    if n:
        kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    return y


def fp32_to_bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor of any shape to bf16, nearest even, with integer ops in a Triton kernel.

    Bit for bit what ``x.to(tl.bfloat16)`` gives on Hopper: ties go to the even neighbour, values past
    bf16's largest finite number become inf, inf stays inf and every NaN becomes 0x7FFF.  Returns a
    new bf16 tensor of ``x``'s shape on ``x``'s device.
    """
    return _launch(_fp32_to_bf16_rne_kernel, _check_fp32(x, "x"))


def hardware_bf16(x: torch.Tensor) -> torch.Tensor:
    """The hardware cast: ``x.to(tl.bfloat16)`` in a Triton kernel, the answer the others must match."""
    return formats.hardware_encode(_check_fp32(x, "x"), "bf16")


def round_bf16_bits_reference(bits: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns (int64 values in [0, 2^32)) -> bf16 bit patterns (int64 in [0, 2^16)).

    int64 holds every 32-bit pattern as a non-negative number, so shifts and the carry behave like
    unsigned 32-bit arithmetic without torch needing a uint32 type.
    """
    lsb = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lsb) >> 16
    is_nan = (bits & FP32_ABS_MASK) > FP32_INF_BITS
    return torch.where(is_nan, torch.full_like(bits, BF16_CANONICAL_NAN), rounded)


def fp32_bits(x: torch.Tensor) -> torch.Tensor:
    """The bit patterns of an fp32 tensor as int64 values in [0, 2^32), on the CPU."""
    return x.detach().cpu().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bf16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """bf16 tensor whose bit patterns are the int64 values ``bits`` (each in [0, 2^16))."""
    # Values >= 0x8000 are negative as int16; subtracting 2^16 gives the same 16 bits.
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return signed.to(torch.int16).view(torch.bfloat16)


def fp32_to_bf16_reference(x: torch.Tensor) -> torch.Tensor:
    """The integer recipe in plain PyTorch, computed on the CPU and returned on ``x``'s device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of dtype torch.float32, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x must have dtype torch.float32, got {x.dtype}")
    return bf16_from_bits(round_bf16_bits_reference(fp32_bits(x))).to(x.device)


__all__ = [
    "BLOCK",
    "bf16_from_bits",
    "fp32_bits",
    "fp32_to_bf16_reference",
    "fp32_to_bf16_rne",
    "hardware_bf16",
    "round_bf16_bits_reference",
]
