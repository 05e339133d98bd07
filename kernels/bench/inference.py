"""Chapter 7's inference kernels against the peers a user would pick: the INT8 quantizer against a device
copy of its bytes, the W8A8 GEMM against ``torch._int_mm`` (cuBLAS int8) with the same dequantization,
and the attention forwards against PyTorch's ``scaled_dot_product_attention`` (its flash kernel) and our
own bf16 kernel.

Bytes counted for the quantizer: the bf16 input read twice (amax, then codes; the second read mostly from
L2), the int8 codes written and the fp32 scales.  FLOPs for a GEMM ``2 M N K``; for attention the two
products, ``4 B H N_q N_k D``, halved with a causal mask.  Every result is checked before it is timed.
"""

import torch

from kernels.bench import benchmark, cases, copy_baseline, measure

QUANT_SHAPE = (16384, 8192)  # 256 MiB of bf16 activations, per-token scales
GEMM_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
ATTN_SHAPES = ((4, 16, 4096, 128), (1, 16, 16384, 128))  # batch, heads, sequence, head_dim


@benchmark("int8_quantize")
def _bench_quantize():
    """Per-token INT8 codes and scales of a bf16 activation, against a copy of the same bytes."""
    from kernels import int8 as I

    m, k = QUANT_SHAPE
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    q, s = I.quantize_int8(x, "token", check_finite=False)
    q_ref, s_ref = I.quantize_int8_reference(x[:64], "token")
    if not (torch.equal(q[:64], q_ref) and torch.equal(s[:64], s_ref)):
        raise AssertionError("int8_quantize: codes differ from the reference; not timing a wrong kernel")
    nbytes = 2 * x.numel() * 2 + q.numel() + s.numel() * 4
    return measure(
        "int8_quantize",
        f"{m}x{k}",
        "GB/s",
        nbytes,
        lambda: I.quantize_int8(x, "token", check_finite=False),
        {"device copy": copy_baseline(nbytes)},
    )


@benchmark("int8_w8a8_gemm")
def _bench_w8a8():
    """W8A8 with per-token and per-channel scales and a bf16 result, against ``torch._int_mm`` followed by
    the same scaling in PyTorch, and bf16 ``torch.matmul`` of the same shape."""
    from kernels import int8 as I

    records = []
    for m, n, k in cases(GEMM_SHAPES):
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
        sa = torch.rand(m, 1, device="cuda", generator=g) * 1e-3
        sb = torch.rand(n, 1, device="cuda", generator=g) * 1e-3
        got = I.w8a8_matmul(a[:256], b, sa[:256], sb)
        if not torch.equal(got, I.w8a8_matmul_reference(a[:256], b, sa[:256], sb)):
            raise AssertionError("int8_w8a8_gemm: result differs from the exact reference; not timing it")
        bt = b.t()  # (K, N): torch._int_mm multiplies (M, K) @ (K, N)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        records += measure(
            "int8_w8a8_gemm",
            f"{m}x{n}x{k}",
            "TFLOP/s",
            2.0 * m * n * k,
            lambda a=a, b=b, sa=sa, sb=sb: I.w8a8_matmul(a, b, sa, sb),
            {
                "torch._int_mm + scales": lambda a=a, bt=bt, sa=sa, sb=sb: (
                    torch._int_mm(a, bt).float() * sa * sb.reshape(1, -1)
                ).bfloat16(),
                "torch.matmul bf16": lambda x=x, w=w: x @ w.T,
            },
        )
        del a, b, x, w
        torch.cuda.empty_cache()
    return records


def _attention_records(name, ours_fn, baselines_fn, check):
    records = []
    for bsz, heads, n, d in cases(ATTN_SHAPES):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(bsz, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        for causal in (False, True):
            check(q[:1, :1, :512], k[:1, :1, :512], v[:1, :1, :512], causal)
            flops = 4.0 * bsz * heads * n * n * d / (2 if causal else 1)
            records += measure(
                name,
                f"{bsz}x{heads}x{n}x{d}{' causal' if causal else ''}",
                "TFLOP/s",
                flops,
                lambda q=q, k=k, v=v, c=causal: ours_fn(q, k, v, c),
                baselines_fn(q, k, v, causal),
            )
        del q, k, v
        torch.cuda.empty_cache()
    return records


def _sdpa(q, k, v, causal):
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


@benchmark("attention_bf16")
def _bench_attention():
    """Our bf16 attention forward against PyTorch's ``scaled_dot_product_attention`` (its flash kernel)."""
    from kernels import attention as A

    def check(q, k, v, causal):
        err = (A.flash_attention(q, k, v, causal).double() - A.attention_reference(q, k, v, causal)[0]).abs().max()
        if err > 1e-2:
            raise AssertionError(f"attention_bf16: {err:.3g} from float64; not timing a wrong kernel")

    return _attention_records(
        "attention_bf16", A.flash_attention, lambda q, k, v, c: {"torch SDPA (flash)": _sdpa(q, k, v, c)}, check
    )


@benchmark("attention_fp8")
def _bench_attention_fp8():
    """Our FP8 attention forward (quantization of Q, K and V included) against our bf16 kernel and SDPA."""
    from kernels import attention as A

    def check(q, k, v, causal):
        ref = A.attention_reference(q, k, v, causal)[0]
        err = float((A.flash_attention_fp8(q, k, v, causal).double() - ref).norm() / ref.norm())
        if err > 0.08:
            raise AssertionError(f"attention_fp8: relative error {err:.3g}; not timing a wrong kernel")

    def baselines(q, k, v, causal):
        return {
            "our bf16 attention": lambda: A.flash_attention(q, k, v, causal),
            "torch SDPA (flash)": _sdpa(q, k, v, causal),
        }

    return _attention_records("attention_fp8", A.flash_attention_fp8, baselines, check)


__all__ = ["ATTN_SHAPES", "GEMM_SHAPES", "QUANT_SHAPE"]
