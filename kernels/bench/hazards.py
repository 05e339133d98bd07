"""Chapter 3's kernels: stochastic rounding against the hardware conversion and a device copy, and the
FP8 matmul with fp32 promotion every 128 K-elements against the same kernel without it and cuBLAS."""

import torch

from kernels.bench import benchmark, copy_baseline, measure


@benchmark("hazards_stochastic_round")
def _bench_stochastic_round():
    """fp32 -> e4m3fn and -> bf16 with Philox bits: 4 bytes read + 1 or 2 written per element."""
    from kernels import formats, stochastic
    from kernels.testing import bits

    n = 1 << 28  # 1 GiB of fp32 in: far beyond the 60 MB L2
    x = torch.randn(n, device="cuda") * 100
    records = []
    for fmt, out_bytes in (("e4m3fn", 1), ("bf16", 2)):
        head = x[: 1 << 20]
        if not (
            bits(stochastic.stochastic_round(head, fmt, 7)) == bits(stochastic.stochastic_round_reference(head, fmt, 7))
        ).all():
            raise AssertionError(
                f"hazards_stochastic_round: the {fmt} kernel disagrees with its reference; not timing it"
            )
        nbytes = n * (4 + out_bytes)
        baselines = {
            f"triton x.to({fmt}) (round to nearest)": lambda fmt=fmt: formats.hardware_encode(x, fmt),
            "device copy": copy_baseline(nbytes),
        }
        records += measure(
            f"hazards_stochastic_round_{fmt}",
            str(n),
            "GB/s",
            nbytes,
            lambda fmt=fmt: stochastic.stochastic_round(x, fmt, 7),
            baselines,
        )
    return records


@benchmark("hazards_fp8_promotion")
def _bench_fp8_promotion():
    """The cost of promoting FP8 partial sums to fp32 every 128 K-elements: the same tl.dot kernel with
    and without promotion, and cuBLAS (torch._scaled_mm) with and without fast accumulation.
    FLOPs = 2 M N K; operands of 64 MB each, beyond the L2."""
    from kernels import accumulate

    m = n = k = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((m, k), device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = torch.randn((k, n), device="cuda", generator=g).to(torch.float8_e4m3fn)
    small_a, small_b = a[:256].contiguous(), b[:, :256].contiguous()
    got = accumulate.fp8_matmul(small_a, small_b, 128)
    err = accumulate.matmul_error(got, small_a, small_b)
    if err > 2.0**-12:  # promoted every 128: only one chunk's worth of accumulator loss
        raise AssertionError(f"hazards_fp8_promotion: error {err:.2e} of sum|ab| is too large; not timing it")
    baselines = {
        "same kernel, no promotion": lambda: accumulate.fp8_matmul(a, b, None),
        "torch._scaled_mm use_fast_accum=False": lambda: accumulate.scaled_mm(a, b, False),
        "torch._scaled_mm use_fast_accum=True": lambda: accumulate.scaled_mm(a, b, True),
    }
    return measure(
        "hazards_fp8_promotion",
        f"{m}x{n}x{k}",
        "TFLOP/s",
        2 * m * n * k,
        lambda: accumulate.fp8_matmul(a, b, 128),
        baselines,
    )


__all__ = []
