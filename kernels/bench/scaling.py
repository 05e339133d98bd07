"""Chapter 2's quantization kernels (bf16 -> fp8 codes + scales) against a device copy of the same bytes.

Bytes counted per call: the bf16 input read once (twice for per-tensor current scaling, whose amax
pass and cast pass each read it), the codes written (1 byte per element) and the scales written
(4 bytes per fp32 scale, 1 per E8M0 byte).  The copy baseline moves the same number of bytes.
"""

import torch

from kernels.bench import benchmark, cases, copy_baseline, measure

SHAPES = ((16384, 8192), (32768, 16384))  # 256 MiB and 1 GiB of bf16: far beyond the 60 MB L2


def _check(name, got, want):
    for g, w, what in ((got.q, want.q, "codes"), (got.s, want.s, "scales")):
        same = torch.equal(g.view(torch.uint8), w.view(torch.uint8)) if g.element_size() == 1 else torch.equal(g, w)
        if not same:
            raise AssertionError(f"{name}: the kernel's {what} differ from the reference; not timing a wrong kernel")


def _run(name, granularity, reads, **kw):
    from kernels import quantize

    records = []
    for m, k in cases(SHAPES):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 4
        x[torch.randint(0, m, (64,)), torch.randint(0, k, (64,))] = 300.0  # outliers: scales differ per group
        got = quantize.quantize(x, granularity, **kw)
        _check(name, got, quantize.quantize(x, granularity, reference=True, **kw))
        nbytes = reads * x.numel() * x.element_size() + got.q.numel() * got.q.element_size()
        nbytes += got.s.numel() * got.s.element_size()
        del got
        records += measure(
            name,
            f"{m}x{k}",
            "GB/s",
            nbytes,
            lambda x=x: quantize.quantize(x, granularity, **kw),
            {"device copy": copy_baseline(nbytes)},
        )
        del x
        torch.cuda.empty_cache()
    return records


@benchmark("scaling_per_tensor")
def _bench_per_tensor():
    """Per-tensor current scaling: amax pass + finalize + scale-and-cast pass (the input read twice)."""
    return _run("scaling_per_tensor", "tensor", reads=2)


@benchmark("scaling_rowwise")
def _bench_rowwise():
    """One fp32 scale per row, one read of each row."""
    return _run("scaling_rowwise", "row", reads=1)


@benchmark("scaling_1x128")
def _bench_1x128():
    """One fp32 scale per 128 elements of a row (DeepSeek-V3 activations)."""
    return _run("scaling_1x128", "1x128", reads=1)


@benchmark("scaling_128x128")
def _bench_128x128():
    """One fp32 scale per 128x128 block (DeepSeek-V3 weights)."""
    return _run("scaling_128x128", "128x128", reads=1)


@benchmark("scaling_mxfp8")
def _bench_mxfp8():
    """MXFP8: one E8M0 byte per 32 elements of a row, OCP's floor rule."""
    return _run("scaling_mxfp8", "mxfp8", reads=1)


__all__ = [
    "SHAPES",
]
