"""Nsight Compute profiles that explain a benchmark's gap, kept as JSON beside the benchmark results.

On a GPU machine with Nsight Compute (``ncu``)::

    ncu --set full --clock-control none --profile-from-start off -o /tmp/blockwise \\
        python -m kernels.profiles run fp8_gemm_blockwise
    python -m kernels.profiles save fp8_gemm_blockwise /tmp/blockwise.ncu-rep

``run`` builds the profile's contenders, calls each twice outside the profiled window (autotuning,
warming), then once each between ``cudaProfilerStart`` and ``cudaProfilerStop``, in the order of
:data:`PROFILES`.  ``save`` reads the report back (``ncu --import --csv --page raw``), keeps the GEMM
kernels (an argument copy that a call launches before its GEMM is dropped), checks that there is one
per contender, keeps the metrics that match :data:`KEEP`, and writes
``benchmarks/profiles/<gpu-slug>-<name>.json`` with the GPU, versions and commit, which chapters read.
"""

import argparse
import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PROFILE_DIR = ROOT / "benchmarks" / "profiles"

# Metric-name prefixes worth keeping from a full Nsight Compute set (a few hundred of its ~2000).
KEEP = (
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg",
    "launch__",
    "sm__throughput.avg.pct",
    "sm__pipe_tensor",
    "sm__inst_executed_pipe_tensor",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared",
    "smsp__sass_thread_inst_executed_op_ffma",
    "smsp__inst_executed.sum",
    "sm__warps_active.avg.pct",
    "smsp__average_warps_issue_stalled",
    "smsp__issue_active.avg.pct",
    "dram__throughput.avg.pct",
)
# Kernels that count as a contender's GEMM (ours, or cuBLAS's nvjet / cutlass / xmma kernels).
GEMM_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma", re.IGNORECASE)


def _fp8_blockwise_contenders() -> dict:
    """Block-scaled GEMMs (ours and cuBLAS's) and the tensorwise GEMMs that set the target, one shape."""
    from kernels import fp8_gemm as G
    from kernels.benchmarks.fp8 import _operands

    m, n, k = PROFILES["fp8_gemm_blockwise"]["shape"]
    _, _, qa, qb = _operands(m, n, k, "block")
    _, _, ta, tb = _operands(m, n, k, "tensor")
    return {
        "ours blockwise": lambda: G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "block"),
        "torch._scaled_mm blockwise": lambda: G.scaled_mm(qa.q, qb.q, qa.s, qb.s, "block"),
        "torch._scaled_mm tensorwise": lambda: G.scaled_mm(ta.q, tb.q, ta.s, tb.s, "tensor"),
        "ours tensorwise": lambda: G.fp8_gemm(ta.q, tb.q, ta.s, tb.s, "tensor"),
    }


# name -> the shape (M, N, K), the contenders' labels in launch order, and what builds them.
PROFILES = {
    "fp8_gemm_blockwise": {
        "shape": (8192, 8192, 4096),
        "labels": ("ours blockwise", "torch._scaled_mm blockwise", "torch._scaled_mm tensorwise", "ours tensorwise"),
        "contenders": _fp8_blockwise_contenders,
    },
}


def run(name: str) -> None:
    """Call each contender of profile ``name`` once inside the profiler's window (see the module docstring)."""
    if not torch.cuda.is_available():
        raise SystemExit("kernels.profiles run needs a CUDA GPU (and is meant to run under ncu)")
    fns = PROFILES[name]["contenders"]()
    if tuple(fns) != PROFILES[name]["labels"]:
        raise AssertionError(f"{name}: contenders {list(fns)} do not match the labels {PROFILES[name]['labels']}")
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_raw_csv(text: str, labels) -> list:
    """``ncu --csv --page raw`` output -> one entry per label: kernel name, kept metrics and their units.

    Rows are kernels in launch order; non-GEMM kernels are dropped; the GEMMs must be exactly one per label."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        raise ValueError("no 'Kernel Name' column: not the raw page of an Nsight Compute report")
    header, units = rows[start], rows[start + 1]
    kname = header.index("Kernel Name")
    gemms = [r for r in rows[start + 2 :] if len(r) == len(header) and GEMM_KERNEL.search(r[kname])]
    labels = list(labels)
    if len(gemms) != len(labels):
        names = [r[kname][:60] for r in gemms]
        raise ValueError(f"expected {len(labels)} GEMM kernels ({labels}), found {len(gemms)}: {names}")
    keep = [i for i, h in enumerate(header) if h.startswith(KEEP)]
    return [
        {
            "contender": label,
            "kernel": row[kname],
            "metrics": {header[i]: _number(row[i]) for i in keep},
            "units": {header[i]: units[i] for i in keep if units[i]},
        }
        for label, row in zip(labels, gemms, strict=True)
    ]


def save(name: str, report: str, ncu: str = "ncu") -> Path:
    """Write ``benchmarks/profiles/<gpu-slug>-<name>.json`` from the Nsight Compute report ``report``."""
    from kernels.bench import _environment, gpu_slug

    ncu = shutil.which(ncu) or shutil.which("/usr/local/cuda/bin/ncu") or ncu
    raw = subprocess.run(
        [ncu, "--import", report, "--csv", "--page", "raw"], capture_output=True, text=True, check=True
    )
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    env = _environment()
    doc = {
        "profile": name,
        "shape": "x".join(map(str, PROFILES[name]["shape"])),
        "tool": version.splitlines()[-1],
        **env,
        "kernels": parse_raw_csv(raw.stdout, PROFILES[name]["labels"]),
    }
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    out = PROFILE_DIR / f"{gpu_slug(env['device'])}-{name}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.profiles", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch the contenders inside the profiler's window")
    r.add_argument("name", choices=sorted(PROFILES))
    s = sub.add_parser("save", help="keep a report's GEMM metrics as JSON")
    s.add_argument("name", choices=sorted(PROFILES))
    s.add_argument("report")
    args = p.parse_args(argv)
    if args.cmd == "run":
        run(args.name)
    else:
        print(save(args.name, args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
