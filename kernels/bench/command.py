"""The command ``python -m kernels.bench [NAME ...]``: run benchmarks, keep their records.

Every chapter's speed section.  Entry points: :func:`main`, :func:`merge`, :func:`environment`.

It runs the named benchmarks of :data:`kernels.bench.REGISTRY` (all of them by default) on a CUDA
GPU after a warm-up, prints one line per record and merges the records into
``benchmarks/results/<gpu-slug>.json``, one record per (bench, shape, baseline), each with the GPU,
the versions and the commit; chapters plot them from there.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from kernels import ROOT, bench
from kernels.bench import REGISTRY, load_all

RESULTS = ROOT / "benchmarks" / "results"
__all__ = [
    "RESULTS",
    "environment",
    "gpu_slug",
    "main",
    "merge",
    "warm_up",
]


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the results file of that GPU."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def environment() -> dict:
    """What a record depends on: the GPU and stack (:func:`kernels.device.gpu_environment`) and the
    commit of the code that ran: ``KERNELS_COMMIT`` if set (for a copy of the tree without .git), else
    git's HEAD, marked ``+modified`` when tracked files differ from it (a working copy whose .git is
    not the one its files came from would otherwise name a commit that never ran)."""
    commit = os.environ.get("KERNELS_COMMIT", "")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        commit = git.stdout.strip() if git.returncode == 0 else ""
        if commit:
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT
            )
            if status.returncode != 0 or status.stdout.strip():
                commit += "+modified"
    from kernels.device import gpu_environment

    return {**gpu_environment(), "commit": commit or "unknown"}


def warm_up(seconds: float = 2.0) -> None:
    """Keep the GPU busy with copies for ``seconds`` before the first measurement: an idle GPU runs at
    low clocks and takes a while to reach full speed, which would count against the first benchmark."""
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()
    del src, dst
    torch.cuda.empty_cache()


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
    load_all()  # every topic module of kernels/bench/ registers its benchmarks
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {sorted(REGISTRY)})")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/<gpu>.json)")
    parser.add_argument(
        "--quick", action="store_true", help="first case of each benchmark, one short round: does it run? (needs --out)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(REGISTRY))
    if unknown:
        parser.error(f"names: unknown benchmark(s) {unknown}; known: {sorted(REGISTRY)}")
    if args.quick and (args.out is None or args.out.resolve().is_relative_to(RESULTS.resolve())):
        parser.error("--quick: its records are not results; give --out a file outside benchmarks/results/")
    import kernels

    if kernels.INTERPRETER or not torch.cuda.is_available():
        print("kernels.bench: needs a CUDA GPU (speed is not measured in CPU mode)", file=sys.stderr)
        return 2
    env = environment() | ({"quick": True} if args.quick else {})
    warm_up()
    records = []
    bench.QUICK = args.quick
    try:
        for name in args.names or sorted(REGISTRY):
            for rec in REGISTRY[name]():
                rec.update(env)
                records.append(rec)
                print(
                    f"{rec['bench']:<16} {rec['shape']:<14} ours {rec['ours']:>9.1f} {rec['metric']:<7} "
                    f"{rec['baseline_name']:<28} {rec['baseline']:>9.1f}  ratio {rec['ratio']:.3f}",
                    flush=True,
                )
    finally:
        bench.QUICK = False
    out = args.out or RESULTS / f"{gpu_slug(env['device'])}.json"
    merge(out, records)
    print(f"wrote {len(records)} records to {out}")
    return 0
