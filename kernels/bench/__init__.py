"""Speed, measured honestly: the benchmark registry and the timing every benchmark shares.

Every chapter's speed section and ``benchmarks/results/``.  Entry points: ``python -m kernels.bench
[NAME ...]`` (:mod:`kernels.bench.command`), :func:`benchmark`, :func:`measure`, :func:`copy_baseline`,
:func:`read_baseline`, :func:`graphed`; ``python -m kernels.bench.profiles`` for Nsight Compute.

Every benchmark checks its result against the reference once, then times our kernel and its
baselines in the same process, interleaved (:data:`ROUNDS` rounds, median of each), with CUDA events
(``triton.testing.do_bench``), on random inputs larger than the GPU's L2 cache.  Work is counted
explicitly (bytes for memory-bound kernels, 2*M*N*K FLOPs for GEMMs), and speed is reported as a ratio
to a baseline from the same run: times from different runs on a shared machine are not comparable.

One module per topic lives in this package (``formats.py``, ``scaling.py``, ``amp.py``, ``fp8.py``,
``fp4.py``, ``hazards.py``); each registers its benchmarks with :func:`benchmark`: a function that
takes no argument and returns a list of records made by :func:`measure`.  :func:`load_all` imports
every module here except the tools (:data:`TOOLS`), so a new file is all a new benchmark needs.
"""

import importlib
import itertools
import pkgutil

import torch
import triton
import triton.language as tl

REGISTRY = {}
TOOLS = ("command", "profiles")  # modules of this package that register no benchmark

# Interleaving rounds: each round times every contender once; the median over rounds is reported.
ROUNDS = 3
# ``python -m kernels.bench --quick`` (the GPU lane's test of every benchmark): each benchmark's first case
# only, one short round.  Its records show that the benchmark runs and checks its result; they are not
# results (the command marks them and keeps them out of benchmarks/results/).
QUICK = False
QUICK_MS = (10, 40)  # warm-up and timed milliseconds of each contender in quick mode


def benchmark(name: str):
    """Register ``fn`` as the benchmark ``name`` (``python -m kernels.bench name``)."""

    def register(fn):
        if name in REGISTRY:
            raise ValueError(f"benchmark {name!r} is registered twice")
        REGISTRY[name] = fn
        return fn

    return register


def load_all() -> dict:
    """Import every benchmark module of this package; returns the registry."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name not in TOOLS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return REGISTRY


def median_ms(fn, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def cases(seq) -> list:
    """What a benchmark loops over (shapes, widths): all of ``seq``, or only its first item in quick mode."""
    seq = list(seq)
    return seq[:1] if QUICK else seq


def measure(bench: str, shape: str, metric: str, work: float, ours, baselines: dict) -> list:
    """Time ``ours`` against each baseline, interleaved over ``ROUNDS`` rounds.

    ``work`` is bytes (metric "GB/s") or FLOPs (metric "TFLOP/s") per call, the same for every
    contender.  Returns one record per baseline, in the format of ../BENCHMARKS.md.
    """
    if metric not in ("GB/s", "TFLOP/s"):
        raise ValueError(f"metric must be 'GB/s' or 'TFLOP/s', got {metric!r}")
    scale = 1e9 if metric == "GB/s" else 1e12
    contenders = {"ours": ours, **baselines}
    times = {k: [] for k in contenders}
    for _ in range(1 if QUICK else ROUNDS):
        for k, fn in contenders.items():
            times[k].append(median_ms(fn, *QUICK_MS) if QUICK else median_ms(fn))
    rate = {k: work / (sorted(v)[len(v) // 2] * 1e-3) / scale for k, v in times.items()}
    return [
        {
            "bench": bench,
            "shape": shape,
            "metric": metric,
            "ours": round(rate["ours"], 2),
            "baseline_name": name,
            "baseline": round(rate[name], 2),
            "ratio": round(rate["ours"] / rate[name], 3),
        }
        for name in baselines
    ]


def linear_step(x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor):
    """``step(layer)``: one forward and backward of ``layer`` on ``x`` with output gradient ``dy``, the
    gradients of ``x`` and of the shared ``weight`` cleared first (what the linear-layer benches time)."""

    def step(layer):
        x.grad = None
        weight.grad = None
        layer(x).backward(dy)

    return step


def check_linear(name: str, step, layer, ref, x: torch.Tensor, bounds: dict) -> None:
    """Refuse to time ``layer`` if its ``dx`` or ``dw`` (from ``step``, a :func:`linear_step`) is farther
    from bf16 ``ref``'s than ``bounds[what]`` (relative Frobenius error): a wrong layer is not timed."""
    from kernels.testing import frobenius_error

    step(layer)
    got = (x.grad.clone(), ref.weight.grad.clone())
    step(ref)
    for what, g, r in zip(("dx", "dw"), got, (x.grad, ref.weight.grad), strict=True):
        err = frobenius_error(g, r)
        if err > bounds[what]:
            raise AssertionError(f"{name}: {what} is {err:.3f} from bf16; not timing a wrong layer")


def host_us(fn, calls: int = 20) -> float:
    """Microseconds of host time per call of ``fn``: ``calls`` calls enqueued back to back, timed before
    the GPU is waited for.  What a user who does not capture a CUDA graph pays on the CPU per call; when
    it exceeds the GPU time, the GPU waits for the host (the call is host-bound)."""
    import time

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graphed(fn, calls: int = 8):
    """``fn`` called ``calls`` times, captured once in a CUDA graph; returns the replay.

    For kernels of a few microseconds, timing back-to-back Python calls measures the host's launch path
    rather than the GPU (a Triton launch costs tens of microseconds of Python); a decode step runs under a
    graph for that reason.  Every contender of such a benchmark is graphed the same way and its work counted
    ``calls`` times.  ``fn`` runs once first, outside the capture, so autotuning and compilation are done."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # a warm call on the capture stream, as torch's graph docs ask
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph.replay


def copy_baseline(nbytes: int, device="cuda"):
    """A device-to-device copy that moves ``nbytes`` in all (half read, half written): the
    bandwidth ceiling for a kernel that moves the same bytes."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": b, "ITERS": i}, num_warps=4) for b, i in ((512, 2), (1024, 1), (1024, 2), (2048, 1))
    ],
    key=["n_words"],
)
@triton.jit
def _read_words(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    # every word read once, XOR-folded so that the loads cannot be dropped; one word written per program
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(ITERS):
        offs = pid.to(tl.int64) * BLOCK * ITERS + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def read_baseline(nbytes: int, sets: int = 1, device="cuda"):
    """A kernel that only reads ``nbytes`` (from one of ``sets`` buffers in turn, like a benchmark that
    cycles through weight sets to defeat L2) and does no arithmetic on them: the ceiling for a
    memory-bound kernel that must read the same bytes once, launch and ramp-up included."""
    words = -(-nbytes // 4)
    bufs = [torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device=device) for _ in range(sets)]
    out = torch.empty(words // 512 + 1, dtype=torch.int32, device=device)
    cycle = itertools.cycle(bufs)

    def run():
        _read_words[lambda meta: (triton.cdiv(words, meta["BLOCK"] * meta["ITERS"]),)](next(cycle), out, words)

    return run


__all__ = [
    "QUICK",
    "QUICK_MS",
    "REGISTRY",
    "ROUNDS",
    "TOOLS",
    "benchmark",
    "cases",
    "check_linear",
    "copy_baseline",
    "graphed",
    "host_us",
    "linear_step",
    "load_all",
    "measure",
    "median_ms",
    "read_baseline",
]
