"""Chapter 6's FP4 kernels: the W4A16 GEMM against bf16 ``torch.matmul`` from decode to server batches,
and the FP4 quantizers against a device copy of the same bytes.

W4A16 (``fp4_w4a16_gemm``): ``M`` in :data:`GEMM_ROWS` (1 and 16 for decode, 32 to 128 for batches) on
the weight shapes :data:`GEMM_SHAPES` (``N x K``: a square layer, and the MLP projections of an 8B
and a 70B decoder), NVFP4 and MXFP4 weights.  Work is 2*M*N*K FLOPs for every contender, so the ratio
is a ratio of times.  Ours is :func:`kernels.w4a16.w4a16_matmul` as a user calls it: the Gluon kernel
of :mod:`kernels.w4a16_mma` at M <= 16, the ``tl.dot`` kernel up to 64 rows, dequantize-then-matmul
above (:func:`kernels.w4a16.path`).  The baselines:

* bf16 ``torch.matmul`` (cuBLAS) with the same activations and a bf16 weight: the speed to beat;
* dequantize + ``torch.matmul`` (the package's dequantizer to bf16, then cuBLAS);
* the ``tl.dot`` kernel that the lab builds (``kernel="dot"``), where it is not ours already;
* PyTorch's int4 GEMM (``torch.ops.aten._weight_int4pack_mm``, "tinygemm", what torchao's int4
  weight-only layout runs) on the same weights quantized to INT4 with groups of 128
  (:func:`kernels.int4.tinygemm_weight`): the peer a user would pick instead;
* "read the weight bytes", a kernel that reads as many bytes as the FP4 weight and its scales and does
  nothing else (:func:`kernels.bench.read_baseline`): no W4A16 kernel can beat it, so its ratio says how
  close to the memory ceiling ours runs, and its time against bf16's what that ceiling is worth at
  this size (launch, ramp-up and tail included, not just bytes over peak bandwidth).

An FP4 weight of 8192 x 8192 is 36 MB (NVFP4) or 34 MB (MXFP4), less than the H200's 60 MB L2, so
every contender cycles through ``WEIGHT_SETS`` weights per call sequence: each call reads its weight
from HBM, as a decode step does.  A call takes tens of microseconds, about what Python needs to launch
a Triton kernel, so every contender is timed as the replay of a CUDA graph of ``GRAPH_CALLS`` calls
(:func:`kernels.bench.graphed`), as a decode step is run.

Quantizers: bytes counted are every read of the bf16 input (NVFP4 with its tensor scale computed reads it
twice: an amax pass, then the quantize pass), the packed codes (half a byte per element) and the scales
(one byte per block, four for the tensor scale) written.  The copy baseline moves the same number of bytes.
"""

import itertools

import torch

from kernels.bench import benchmark, cases, copy_baseline, graphed, measure, read_baseline

GEMM_SHAPES = ((8192, 8192), (14336, 4096), (4096, 14336), (28672, 8192))  # N x K
GEMM_ROWS = (1, 16, 32, 64, 128)  # M
WEIGHT_SETS = 4  # 4 x 36 MB of FP4 weights (4 x 128 MB of bf16) at 8192 x 8192: beyond L2
GRAPH_CALLS = 2 * WEIGHT_SETS  # calls per graph replay: each weight set twice
QUANT_SHAPE = (16384, 8192)  # 256 MiB of bf16
LINEAR_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336))  # tokens x in x out


def _rotating(fns):
    cycle = itertools.cycle(fns)
    return lambda: next(cycle)()


def _check(got, want, name):
    from kernels.testing import compare

    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=2e-2, name=name)
    if not c.ok:
        raise AssertionError(f"fp4_w4a16_gemm {name}: differs from its reference; not timing it\n{c}")


@benchmark("fp4_w4a16_gemm")
def _bench_w4a16():
    """Weight-only FP4 GEMM from decode (M = 1) to server batches (M = 128), four weight shapes."""
    from kernels import fp4, int4, w4a16

    records = []
    for n, k in cases(GEMM_SHAPES):
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(WEIGHT_SETS)]
        tiny = [int4.tinygemm_weight(w) for w in ws]
        for fmt in fp4.FORMATS:
            wq = [fp4.quantize_fp4(w, fmt) for w in ws]
            read = read_baseline(wq[0].q.numel() + wq[0].s.numel() * wq[0].s.element_size(), WEIGHT_SETS)
            for m in cases(GEMM_ROWS):
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                _check(w4a16.w4a16_matmul(a, wq[0]), a @ fp4.dequantize_fp4(wq[0], torch.bfloat16).T, fmt)
                if fmt == "nvfp4":  # once per weight shape and M: the peer's result against its own weights
                    t, packed, sz = tiny[0]
                    got = torch.ops.aten._weight_int4pack_mm(a, packed, t.group, sz)
                    _check(got, a @ int4.dequantize_int4(t, torch.bfloat16).T, "int4 tinygemm")
                baselines = {
                    "torch.matmul bf16": _rotating([lambda w=w, a=a: torch.matmul(a, w.T) for w in ws]),
                    "dequantize + torch.matmul": _rotating(
                        [lambda w=w, a=a: torch.matmul(a, fp4.dequantize_fp4(w, torch.bfloat16).T) for w in wq]
                    ),
                    "int4 tinygemm g128": _rotating(
                        [lambda p=p, a=a: torch.ops.aten._weight_int4pack_mm(a, p[1], p[0].group, p[2]) for p in tiny]
                    ),
                    "read the weight bytes": read,
                }
                if w4a16.path(a, n, k) != "dot":
                    baselines["tl.dot kernel"] = _rotating(
                        [lambda w=w, a=a: w4a16.w4a16_matmul(a, w, kernel="dot") for w in wq]
                    )
                records += measure(
                    "fp4_w4a16_gemm",
                    f"{m}x{n}x{k} {fmt}",
                    "TFLOP/s",
                    2 * m * n * k * GRAPH_CALLS,
                    graphed(_rotating([lambda w=w, a=a: w4a16.w4a16_matmul(a, w) for w in wq]), GRAPH_CALLS),
                    {name: graphed(fn, GRAPH_CALLS) for name, fn in baselines.items()},
                )
            del wq, read
        del ws, tiny
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


@benchmark("fp4_quantize_t")
def _bench_quantize_t():
    """The training recipe's wgrad operand dY^T: transposed, rotated (RHT, blocks of 16) and quantized to
    NVFP4 with stochastic rounding by one kernel that reads dY twice (the amax pass, then the quantize
    pass); against a device copy of its bytes, the three passes it replaces, and itself without stochastic
    rounding and without the rotation."""
    from kernels import fp4, hadamard

    t, f = QUANT_SHAPE  # tokens x features
    x = torch.randn(t, f, device="cuda", dtype=torch.bfloat16)
    x[torch.randint(0, t, (64,)), torch.randint(0, f, (64,))] = 300.0  # outlier tokens
    signs = hadamard.random_signs(fp4.RHT_BLOCK, 0, "cuda")
    kw = {"stochastic_rounding": True, "seed": 1}

    def fused():
        return fp4.quantize_fp4_t(x, "nvfp4", signs, **kw)

    def unfused():
        return fp4.quantize_fp4(hadamard.hadamard_rotate(x.t().contiguous(), fp4.RHT_BLOCK, signs), "nvfp4", **kw)

    got, want = fused(), unfused()
    for g, w, what in ((got.q, want.q, "codes"), (got.s.view(torch.uint8), want.s.view(torch.uint8), "scales")):
        if not torch.equal(g, w):
            raise AssertionError(f"fp4_quantize_t: the fused kernel's {what} differ from the three passes'")
    nbytes = 2 * x.numel() * x.element_size() + got.q.numel() + got.s.numel() + 4
    del got, want
    baselines = {
        "device copy": copy_baseline(nbytes),
        "transpose, rotate, quantize": unfused,
        # the same kernel with an ingredient left out: what the rounding and the rotation cost (same bytes)
        "fused, nearest rounding": lambda: fp4.quantize_fp4_t(x, "nvfp4", signs),
        "fused, nearest rounding, no rotation": lambda: fp4.quantize_fp4_t(x, "nvfp4", None),
    }
    return measure("fp4_quantize_t", f"{t}x{f}", "GB/s", nbytes, fused, baselines)


@benchmark("fp4_linear")
def _bench_linear():
    """FP4Linear (the NVFP4 training recipe) forward + backward, eager: six quantizations (two with the
    rotation and stochastic rounding) and three GEMMs on bf16 tensor cores from dequantized operands, vs
    bf16 nn.Linear and chapter 5's FP8Linear (tensorwise), same weights and data.  Each record also gives
    the time of the six quantizations alone (``quantize_ms``) and of the step (``step_ms``)."""
    from functools import partial

    from kernels import fp4_linear as F
    from kernels.bench import check_linear, linear_step, median_ms
    from kernels.fp8_linear import FP8Linear, FP8Recipe

    records = []
    for t, i, o in cases(LINEAR_SHAPES):
        ref = torch.nn.Linear(i, o, bias=False, device="cuda", dtype=torch.bfloat16)
        ours, fp8 = F.FP4Linear.from_linear(ref, F.FP4Recipe()), FP8Linear.from_linear(ref, FP8Recipe())
        x = torch.randn(t, i, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(t, o, device="cuda", dtype=torch.bfloat16) * 1e-3

        step = linear_step(x, dy, ref.weight)
        check_linear("fp4_linear", step, ours, ref, x, {"dx": 0.5, "dw": 0.5})  # FP4's errors are near 0.2
        baselines = {"nn.Linear bf16": partial(step, ref), "FP8Linear tensorwise": partial(step, fp8)}
        recs = measure("fp4_linear", f"{t}x{i}x{o}", "TFLOP/s", 3 * 2.0 * t * i * o, partial(step, ours), baselines)
        xd, w = x.detach(), ref.weight.detach()
        quant = median_ms(partial(F.operands, xd, w, dy, ours.recipe, step=1))
        whole = median_ms(partial(step, ours))
        for r in recs:
            r["quantize_ms"], r["step_ms"] = round(quant, 3), round(whole, 3)
        records += recs
        del ref, ours, fp8, x, dy, xd, w
        torch.cuda.empty_cache()
    return records


__all__ = [
    "GEMM_ROWS",
    "GEMM_SHAPES",
    "GRAPH_CALLS",
    "LINEAR_SHAPES",
    "QUANT_SHAPE",
    "WEIGHT_SETS",
]
