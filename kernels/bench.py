"""Speed, measured honestly: ``python -m kernels.bench [NAME ...]``.

Every benchmark checks its result against the reference once, then times our kernel and its
baselines in the same process, interleaved, with CUDA events (``triton.testing.do_bench``, median),
on random inputs larger than the GPU's L2 cache.  Work is counted explicitly (bytes for memory-bound
kernels, 2*M*N*K FLOPs for GEMMs), and speed is reported as a ratio to a baseline from the same run:
times from different runs on a shared machine are not comparable.

Results are merged into ``benchmarks/results/<gpu-slug>.json``, one record per (bench, shape,
baseline); chapters plot them from there.  Add a benchmark with the :func:`benchmark` decorator: a
function that takes no argument and returns a list of records made by :func:`measure`.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REGISTRY = {}

# Interleaving rounds: each round times every contender once; the median over rounds is reported.
ROUNDS = 3


def benchmark(name: str):
    """Register ``fn`` as the benchmark ``name`` (``python -m kernels.bench name``)."""

    def register(fn):
        if name in REGISTRY:
            raise ValueError(f"benchmark {name!r} is registered twice")
        REGISTRY[name] = fn
        return fn

    return register


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the results file of that GPU."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def median_ms(fn, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


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
    for _ in range(ROUNDS):
        for k, fn in contenders.items():
            times[k].append(median_ms(fn))
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


def copy_baseline(nbytes: int, device="cuda"):
    """A device-to-device copy that moves ``nbytes`` in all (half read, half written): the
    bandwidth ceiling for a kernel that moves the same bytes."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _environment() -> dict:

    commit = os.environ.get("KERNELS_COMMIT", "")  # for a copy of the tree without .git
    if not commit:
        git = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        commit = git.stdout.strip() if git.returncode == 0 else ""
    from kernels.device import gpu_environment

    return {**gpu_environment(), "commit": commit or "unknown"}


def merge(path: Path, records: list) -> list:
    """Merge ``records`` into the JSON list at ``path``: a new record replaces the one with the same
    (bench, shape, baseline_name); everything else already there is kept."""
    old = json.loads(path.read_text()) if path.exists() else []

    def key(r):
        return (r["bench"], r["shape"], r["baseline_name"])

    fresh = {key(r) for r in records}
    merged = [r for r in old if key(r) not in fresh] + list(records)
    merged.sort(key=key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=1) + "\n")
    tmp.replace(path)  # atomic: an interrupted run never leaves half a file
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {sorted(REGISTRY)})")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/<gpu>.json)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(REGISTRY))
    if unknown:
        parser.error(f"names: unknown benchmark(s) {unknown}; known: {sorted(REGISTRY)}")
    import kernels

    if kernels.INTERPRETER or not torch.cuda.is_available():
        print("kernels.bench: needs a CUDA GPU (speed is not measured in CPU mode)", file=sys.stderr)
        return 2
    env = _environment()
    records = []
    for name in args.names or sorted(REGISTRY):
        for rec in REGISTRY[name]():
            rec.update(env)
            records.append(rec)
            print(
                f"{rec['bench']:<16} {rec['shape']:<14} ours {rec['ours']:>9.1f} {rec['metric']:<7} "
                f"{rec['baseline_name']:<28} {rec['baseline']:>9.1f}  ratio {rec['ratio']:.3f}",
                flush=True,
            )
    out = args.out or RESULTS / f"{gpu_slug(env['device'])}.json"
    merge(out, records)
    print(f"wrote {len(records)} records to {out}")
    return 0


# -- the benchmarks ------------------------------------------------------------------------------


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


if __name__ == "__main__":
    sys.exit(main())
