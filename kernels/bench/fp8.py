"""Chapter 5's FP8 GEMMs and FP8 linear layer against cuBLAS (``torch._scaled_mm``) and bf16.

FLOPs counted per call: ``2 * M * N * K`` for a GEMM (scales and quantization are not counted: the
operands arrive quantized, as in a layer whose quantization is fused upstream); ``3 * 2 * T * in * out``
for a linear layer's forward + backward (Y, dX, dW), whose timed call *includes* every quantization and
the host's launches.  torchao's Float8Linear is timed beside ours whenever torchao is importable; where it
is not, the records say so (``absent``).  The linear layer's records also give our step's host time
(``host_us``, :func:`kernels.bench.host_us`): where it exceeds the step's time on the GPU, the layer is
bound by its launches.
Operands are random bf16 data quantized once before timing; every result is checked against the float64
reference (on a slice of rows) before it is timed.
"""

import importlib
import itertools
import warnings
from functools import partial

import torch

from kernels.bench import benchmark, cases, check_linear, graphed, host_us, linear_step, measure

# (M, N, K): square sizes, a wide-N / short-K case, and an LLM projection (16384 tokens, K = 1024).
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 4096), (16384, 8192, 1024))
# tokens x in_features x out_features: square sizes from where the host path dominates to where the GEMMs
# do, and an LLM MLP's up and down projections (16384 tokens, 4096 <-> 14336).
# Blockwise with few tokens: M tokens against DeepSeek-V3's 7168 x 7168 and an LLM projection (N = 4096,
# K = 14336).
SMALL_M = (16, 32, 64, 128)
SMALL_M_NK = ((7168, 7168), (4096, 14336))
SMALL_M_CALLS = 8
LINEAR_SHAPES = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096))
TORCHAO = {"tensor": "tensorwise", "row": "rowwise"}  # torchao's recipe names
CHECK_ROWS = 256
WISE = {"tensor": "tensorwise", "row": "rowwise", "block": "blockwise"}


def operands(m, n, k, scaling, seed=0):
    from kernels import quantize as Q

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    if scaling == "tensor":
        qa, qb = Q.quantize_tensor(x), Q.quantize_tensor(w)
    elif scaling == "row":
        qa, qb = Q.quantize_rowwise(x), Q.quantize_rowwise(w)
    else:
        qa, qb = Q.quantize_1x128(x), Q.quantize_128x128(w)
    return x, w, qa, qb


def _check(name, c, qa, qb, scaling):
    from kernels import fp8_gemm as G

    r = CHECK_ROWS
    sa = qa.s if scaling == "tensor" else qa.s[:r]
    ref = G.fp8_gemm_reference(qa.q[:r], qb.q, sa, qb.s, scaling)
    mag = G.magnitudes(qa.q[:r], qb.q, sa, qb.s, scaling)
    ok, msg = G.gemm_tolerance_report(c[:r], ref, mag)
    if not ok:
        raise AssertionError(f"{name}: {msg}; not timing a wrong kernel")


def _gemm_bench(name, scaling, cublas_scaling):
    from kernels import fp8_gemm as G

    records = []
    for m, n, k in cases(SHAPES):
        x, w, qa, qb = operands(m, n, k, scaling)
        ours = lambda qa=qa, qb=qb: G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling)  # noqa: E731
        _check(name, ours(), qa, qb, scaling)
        if cublas_scaling == scaling:
            ca, cb = qa, qb
        else:  # blockwise is compared with cuBLAS's tensorwise GEMM on the same data
            _, _, ca, cb = operands(m, n, k, cublas_scaling)
        baselines = {
            f"torch._scaled_mm {WISE[cublas_scaling]}": (
                lambda ca=ca, cb=cb: G.scaled_mm(ca.q, cb.q, ca.s, cb.s, cublas_scaling)
            ),
            "torch.matmul bf16": lambda x=x, w=w: torch.matmul(x, w.T),
        }
        if scaling == "block":  # cuBLAS's own blockwise GEMM (CUDA 12.9+), same operands and promotion
            _check("torch._scaled_mm blockwise", G.scaled_mm(qa.q, qb.q, qa.s, qb.s, "block"), qa, qb, scaling)
            baselines["torch._scaled_mm blockwise"] = lambda qa=qa, qb=qb: G.scaled_mm(qa.q, qb.q, qa.s, qb.s, "block")
        records += measure(name, f"{m}x{n}x{k}", "TFLOP/s", 2.0 * m * n * k, ours, baselines)
        del x, w, qa, qb
        torch.cuda.empty_cache()
    return records


@benchmark("fp8_gemm_tensorwise")
def _bench_tensorwise():
    """Persistent TMA kernel, one scale per operand in the epilogue, vs cuBLAS with the same scaling."""
    return _gemm_bench("fp8_gemm_tensorwise", "tensor", "tensor")


@benchmark("fp8_gemm_rowwise")
def _bench_rowwise():
    """Per-row scales of both operands in the epilogue, vs cuBLAS rowwise."""
    return _gemm_bench("fp8_gemm_rowwise", "row", "row")


@benchmark("fp8_gemm_blockwise")
def _bench_blockwise():
    """1x128 x 128x128 block scales with fp32 promotion every 128 K, vs cuBLAS tensorwise (the target's
    baseline) and vs cuBLAS's own blockwise GEMM on the same operands."""
    return _gemm_bench("fp8_gemm_blockwise", "block", "tensor")


@benchmark("fp8_gemm_blockwise_small_m")
def _bench_blockwise_small_m():
    """Blockwise with a few tokens (M = 16 to 128: decoding, a small batch, a MoE expert's share) against
    cuBLAS's blockwise GEMM on the same operands.  A call takes tens of microseconds, so both are timed
    as the replay of a CUDA graph of :data:`SMALL_M_CALLS` calls."""
    from kernels import fp8_gemm as G

    records = []
    for (n, k), m in cases(itertools.product(SMALL_M_NK, SMALL_M)):
        _, _, qa, qb = operands(m, n, k, "block")
        ours = lambda qa=qa, qb=qb: G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "block")  # noqa: E731
        cublas = lambda qa=qa, qb=qb: G.scaled_mm(qa.q, qb.q, qa.s, qb.s, "block")  # noqa: E731
        _check("fp8_gemm_blockwise_small_m", ours(), qa, qb, "block")
        _check("torch._scaled_mm blockwise", cublas(), qa, qb, "block")
        records += measure(
            "fp8_gemm_blockwise_small_m",
            f"{m}x{n}x{k}",
            "TFLOP/s",
            2.0 * m * n * k * SMALL_M_CALLS,
            graphed(ours, SMALL_M_CALLS),
            {"torch._scaled_mm blockwise": graphed(cublas, SMALL_M_CALLS)},
        )
        del qa, qb
        torch.cuda.empty_cache()
    return records


def torchao_float8_module():
    """The module ``torchao.float8``, or None where torchao is not importable (it is not a dependency of
    the book)."""
    with warnings.catch_warnings():
        # torchao's quant_api.py has an invalid escape '\.' that Python warns about as it compiles the file
        warnings.simplefilter("ignore", SyntaxWarning)
        try:
            return importlib.import_module("torchao.float8")
        except ImportError:
            return None


def torchao_float8(weight: torch.nn.Parameter, granularity: str):
    """torchao's Float8Linear over ``weight`` (shared, not copied), with its recipe of the same scaling
    granularity (tensorwise; rowwise, whose gradients are e4m3 with power-of-two scales), compiled as
    torchao asks; None where torchao is not importable (it is not a dependency of the book)."""
    float8 = torchao_float8_module()
    if float8 is None:
        return None
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = weight
    config = float8.Float8LinearConfig.from_recipe_name(TORCHAO[granularity])
    return torch.compile(float8.convert_to_float8_training(torch.nn.Sequential(linear), config=config))


def _linear_bench(name: str, granularity: str, compiled: bool) -> list:
    from kernels.fp8_linear import BF16_TOLERANCE, FP8Linear, FP8Recipe

    records = []
    for t, i, o in cases(LINEAR_SHAPES):
        torch._dynamo.reset()  # a fresh compilation per shape (no dynamic-shape recompiles)
        ref = torch.nn.Linear(i, o, bias=False, device="cuda", dtype=torch.bfloat16)
        fp8 = FP8Linear.from_linear(ref, FP8Recipe(granularity=granularity))
        ours, bf16 = (torch.compile(fp8), torch.compile(ref)) if compiled else (fp8, ref)
        x = torch.randn(t, i, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(t, o, device="cuda", dtype=torch.bfloat16) * 1e-3

        step = linear_step(x, dy, ref.weight)
        check_linear(name, step, ours, ref, x, BF16_TOLERANCE)
        baselines = {"nn.Linear bf16" + (", compiled" if compiled else ""): partial(step, bf16)}
        peer = f"torchao Float8Linear {TORCHAO[granularity]}, compiled"
        ao = torchao_float8(ref.weight, granularity)
        if ao is not None:
            baselines[peer] = partial(step, ao)
        recs = measure(name, f"{t}x{i}x{o}", "TFLOP/s", 3 * 2.0 * t * i * o, partial(step, ours), baselines)
        host = round(host_us(partial(step, ours)), 1)  # the step's launches, on the CPU
        for r in recs:
            r["host_us"] = host
            if ao is None:
                r["absent"] = f"{peer}: torchao is not importable here"
        records += recs
        del ref, fp8, ours, bf16, x, dy, ao
        torch.cuda.empty_cache()
    return records


@benchmark("fp8_linear")
def _bench_linear():
    """FP8Linear forward + backward (quantizations included), tensorwise, eager, vs bf16 nn.Linear and
    torchao's compiled Float8Linear, same weights and data, from 2048^3 (the host path's share is
    largest) to an LLM MLP's projections."""
    return _linear_bench("fp8_linear", "tensor", compiled=False)


@benchmark("fp8_linear_rowwise")
def _bench_linear_rowwise():
    """:func:`_bench_linear` with per-row scales."""
    return _linear_bench("fp8_linear_rowwise", "row", compiled=False)


@benchmark("fp8_linear_compiled")
def _bench_linear_compiled():
    """``torch.compile(FP8Linear)`` (tensorwise; its kernels are operators, :mod:`kernels.fp8_ops`) vs
    ``torch.compile(nn.Linear)`` in bf16 and torchao's compiled Float8Linear."""
    return _linear_bench("fp8_linear_compiled", "tensor", compiled=True)


@benchmark("fp8_linear_rowwise_compiled")
def _bench_linear_rowwise_compiled():
    """:func:`_bench_linear_compiled` with per-row scales."""
    return _linear_bench("fp8_linear_rowwise_compiled", "row", compiled=True)


__all__ = [
    "CHECK_ROWS",
    "LINEAR_SHAPES",
    "SHAPES",
    "TORCHAO",
    "WISE",
    "operands",
    "torchao_float8",
    "torchao_float8_module",
]
