"""Chapter 1's and Lab 0's conversion kernels against the hardware conversion and a device copy."""

import torch

from kernels.bench import benchmark, copy_baseline, measure


@benchmark("bf16_cast")
def _bench_bf16_cast():
    """Lab 0's integer-ops fp32 -> bf16 kernel: 4 bytes read + 2 written per element."""
    from kernels import bf16

    n = 1 << 28  # 1 GiB of fp32 in: far beyond the 60 MB L2
    x = torch.randn(n, device="cuda")
    if not torch.equal(bf16.fp32_to_bf16_rne(x).view(torch.int16), x.to(torch.bfloat16).view(torch.int16)):
        raise AssertionError("bf16_cast: the kernel disagrees with torch's cast; not timing a wrong kernel")
    nbytes = n * (4 + 2)
    baselines = {"torch .to(torch.bfloat16)": lambda: x.to(torch.bfloat16), "device copy": copy_baseline(nbytes)}
    return measure("bf16_cast", str(n), "GB/s", nbytes, lambda: bf16.fp32_to_bf16_rne(x), baselines)


@benchmark("fp8_encode")
def _bench_fp8_encode():
    """Chapter 1's integer-ops fp32 -> e4m3fn encoder (saturating) against the hardware conversion,
    ``x.to(tl.float8e4nv)`` in the same kind of Triton kernel: 4 bytes read + 1 written per element."""
    from kernels import formats

    n = 1 << 28  # 1 GiB of fp32 in: far beyond the 60 MB L2
    x = torch.randn(n, device="cuda") * 100  # most of e4m3's range, and a tail past 448 that saturates
    ours = formats.encode(x, "e4m3fn", saturate=True).view(torch.uint8)
    if not torch.equal(ours, formats.hardware_encode(x, "e4m3fn").view(torch.uint8)):
        raise AssertionError("fp8_encode: the encoder disagrees with x.to(tl.float8e4nv); not timing a wrong kernel")
    del ours
    nbytes = n * (4 + 1)
    baselines = {
        "triton x.to(tl.float8e4nv)": lambda: formats.hardware_encode(x, "e4m3fn"),
        "device copy": copy_baseline(nbytes),
    }
    return measure("fp8_encode", str(n), "GB/s", nbytes, lambda: formats.encode(x, "e4m3fn", saturate=True), baselines)


__all__ = []
