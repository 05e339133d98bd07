"""Chapter 6's FP4 kernels: the W4A16 GEMM at decode shapes against bf16 ``torch.matmul``, and the FP4
quantizers against a device copy of the same bytes.

W4A16 (``fp4_w4a16_gemm``): ``M`` in {1, 16}, ``N = K = 8192``, NVFP4 and MXFP4 weights.  Work is
2*M*N*K FLOPs for every contender, so the ratio is a ratio of times.  The baselines are bf16
``torch.matmul`` (cuBLAS) with the same activations and a bf16 weight, and dequantize-then-matmul (the
package's dequantizer to bf16, then ``torch.matmul``); the ``tl.dot`` kernel that the lab builds
(``kernel="dot"``) is timed beside the default (the Gluon kernel of :mod:`kernels.w4a16_mma`).  The last
baseline, "read the weight bytes", is a kernel that reads as many bytes as the FP4 weight and its scales
and does nothing else (:func:`kernels.bench.read_baseline`): no W4A16 kernel can beat it, so its
ratio says how close to the memory ceiling ours runs, and its time against bf16's says what that
ceiling is worth at this size (launch, ramp-up and tail included, not just bytes over peak bandwidth).  One FP4
weight is 36 MB (NVFP4) or 34 MB (MXFP4), less than the H200's 60 MB L2, so every contender cycles
through ``WEIGHT_SETS`` weights per call sequence: each call reads its weight from HBM, as a decode step
does.  A call takes tens of microseconds, about what Python needs to launch a Triton kernel, so every
contender is timed as the replay of a CUDA graph of ``GRAPH_CALLS`` calls
(:func:`kernels.bench.graphed`), as a decode step is run.

Quantizers: bytes counted are every read of the bf16 input (NVFP4 with its tensor scale computed reads it
twice: an amax pass, then the quantize pass), the packed codes (half a byte per element) and the scales
(one byte per block, four for the tensor scale) written.  The copy baseline moves the same number of bytes.
"""

import itertools

import torch

from kernels.bench import benchmark, cases, copy_baseline, graphed, measure, read_baseline

GEMM_SHAPES = ((1, 8192, 8192), (16, 8192, 8192))
WEIGHT_SETS = 4  # 4 x 36 MB of FP4 weights (4 x 128 MB of bf16): beyond L2
GRAPH_CALLS = 2 * WEIGHT_SETS  # calls per graph replay: each weight set twice
QUANT_SHAPE = (16384, 8192)  # 256 MiB of bf16


def _rotating(fns):
    cycle = itertools.cycle(fns)
    return lambda: next(cycle)()


@benchmark("fp4_w4a16_gemm")
def _bench_w4a16():
    """Weight-only FP4 GEMM (weights dequantized in registers, bf16 tensor cores) at decode shapes."""
    from kernels import fp4, w4a16
    from kernels.testing import compare

    records = []
    for m, n, k in cases(GEMM_SHAPES):
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(WEIGHT_SETS)]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for fmt in fp4.FORMATS:
            wq = [fp4.quantize_fp4(w, fmt) for w in ws]
            got = w4a16.w4a16_matmul(a, wq[0])
            want = a @ fp4.dequantize_fp4(wq[0], torch.bfloat16).T
            c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=2e-2, name=f"w4a16 {fmt}")
            if not c.ok:
                raise AssertionError(f"fp4_w4a16_gemm {fmt}: differs from dequantize-then-matmul; not timing it\n{c}")
            ours = _rotating([lambda w=w, a=a: w4a16.w4a16_matmul(a, w) for w in wq])
            bf16 = _rotating([lambda w=w, a=a: torch.matmul(a, w.T) for w in ws])
            deq = _rotating([lambda w=w, a=a: torch.matmul(a, fp4.dequantize_fp4(w, torch.bfloat16).T) for w in wq])
            dot = _rotating([lambda w=w, a=a: w4a16.w4a16_matmul(a, w, kernel="dot") for w in wq])
            read = read_baseline(wq[0].q.numel() + wq[0].s.numel() * wq[0].s.element_size(), WEIGHT_SETS)
            records += measure(
                "fp4_w4a16_gemm",
                f"{m}x{n}x{k} {fmt}",
                "TFLOP/s",
                2 * m * n * k * GRAPH_CALLS,
                graphed(ours, GRAPH_CALLS),
                {
                    "torch.matmul bf16": graphed(bf16, GRAPH_CALLS),
                    "dequantize + torch.matmul": graphed(deq, GRAPH_CALLS),
                    "tl.dot kernel": graphed(dot, GRAPH_CALLS),
                    "read the weight bytes": graphed(read, GRAPH_CALLS),
                },
            )
            del wq
        del ws
        torch.cuda.empty_cache()
    return records


def _quant_records(name, fmt, reads, **kw):
    from kernels import fp4

    m, k = QUANT_SHAPE
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 4
    x[torch.randint(0, m, (64,)), torch.randint(0, k, (64,))] = 300.0  # outliers: scales differ per block
    kw = {key: v.cuda() if isinstance(v, torch.Tensor) else v for key, v in kw.items()}
    got = fp4.quantize_fp4(x, fmt, **kw)
    want = fp4.quantize_fp4_reference(x, fmt, **kw)
    for g, w, what in ((got.q, want.q, "codes"), (got.s.view(torch.uint8), want.s.view(torch.uint8), "scales")):
        if not torch.equal(g, w):
            raise AssertionError(f"{name}: the kernel's {what} differ from the reference; not timing a wrong kernel")
    nbytes = reads * x.numel() * x.element_size() + got.q.numel() + got.s.numel() + (4 if fmt == "nvfp4" else 0)
    del got, want
    return measure(
        name, f"{m}x{k}", "GB/s", nbytes, lambda: fp4.quantize_fp4(x, fmt, **kw), {"device copy": copy_baseline(nbytes)}
    )


@benchmark("fp4_quantize")
def _bench_quantize_nvfp4():
    """NVFP4 with its tensor scale computed from the tensor (amax pass + quantize pass: two reads)."""
    return _quant_records("fp4_quantize", "nvfp4", reads=2)


@benchmark("fp4_quantize_given_scale")
def _bench_quantize_nvfp4_given():
    """NVFP4 with a given tensor scale (calibrated or delayed): one pass, one read."""
    return _quant_records("fp4_quantize_given_scale", "nvfp4", reads=1, tensor_scale=torch.tensor(4.0 / 2688.0))


@benchmark("fp4_quantize_mxfp4")
def _bench_quantize_mxfp4():
    """MXFP4: one pass, one read, E8M0 scales."""
    return _quant_records("fp4_quantize_mxfp4", "mxfp4", reads=1)


__all__ = [
    "GEMM_SHAPES",
    "GRAPH_CALLS",
    "QUANT_SHAPE",
    "WEIGHT_SETS",
]
