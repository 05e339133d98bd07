"""Nsight Compute profiles that explain a benchmark's gap, kept as JSON beside the benchmark results.

On a GPU machine with Nsight Compute (``ncu``)::

    ncu --set full --clock-control none --profile-from-start off -o /tmp/blockwise \\
        python -m kernels.bench.profiles run fp8_gemm_blockwise
    python -m kernels.bench.profiles save fp8_gemm_blockwise /tmp/blockwise.ncu-rep

``run`` builds the profile's contenders, calls each twice outside the profiled window (autotuning,
warming), then once each between ``cudaProfilerStart`` and ``cudaProfilerStop``, in the order of
:data:`PROFILES`.  ``save`` reads the report back (``ncu --import --csv --page raw``), keeps the
contenders' kernels (the profile's ``kernels`` pattern: an argument copy that a call launches before its
GEMM is dropped), checks that there is one per contender, keeps the metrics that match :data:`KEEP`, and
writes ``benchmarks/profiles/<gpu-slug>-<name>.json`` with the GPU, versions and commit, which chapters read.

Two kinds of profile: ``fp8`` explains a scaled FP8 GEMM's gap to cuBLAS (per output element: FMAs,
instructions, tensor-pipe time); ``w4a16`` explains where a weight-only FP4 GEMM at a batch size spends
its time against bf16 cuBLAS and a kernel that only reads the FP4 weight's bytes (per weight: DRAM
bytes and bandwidth, warps resident, issue slots, instructions, shared-memory traffic, the main stall).
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

from kernels import ROOT

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
    "gpu__dram_throughput.avg.pct",
    "dram__bytes_read.sum",
)
# Kernels that count as a contender's GEMM (ours, or cuBLAS's nvjet / cutlass / xmma kernels).
GEMM_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma", re.IGNORECASE)
# The W4A16 profile's kernels: ours (tl.dot), cuBLAS's bf16 GEMM and the read-only baseline.
W4A16_KERNEL = re.compile(r"_w4a16_kernel|_read_words|nvjet|cutlass|xmma|gemm", re.IGNORECASE)


def _fp8_contenders(scaling: str, shape, labels) -> dict:
    """Our GEMM and cuBLAS's with ``scaling``, and the tensorwise ones, at ``shape``, for ``labels``."""
    from kernels import fp8_gemm as G
    from kernels.bench.fp8 import WISE, operands

    m, n, k = shape
    _, _, qa, qb = operands(m, n, k, scaling)
    _, _, ta, tb = operands(m, n, k, "tensor")
    fns = {
        f"ours {WISE[scaling]}": lambda: G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling),
        f"torch._scaled_mm {WISE[scaling]}": lambda: G.scaled_mm(qa.q, qb.q, qa.s, qb.s, scaling),
        "torch._scaled_mm tensorwise": lambda: G.scaled_mm(ta.q, tb.q, ta.s, tb.s, "tensor"),
        "ours tensorwise": lambda: G.fp8_gemm(ta.q, tb.q, ta.s, tb.s, "tensor"),
    }
    return {label: fns[label] for label in labels}


def _w4a16_contenders(shape, labels) -> dict:
    """At ``shape`` = (M, N, K): our NVFP4 W4A16 GEMM forced onto its ``tl.dot`` kernel, bf16
    ``torch.matmul`` on the same weight, and the kernel that only reads the FP4 weight's bytes."""
    from kernels import fp4, w4a16
    from kernels.bench import read_baseline

    m, n, k = shape
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq = fp4.quantize_fp4(w, "nvfp4")
    fns = {
        "ours NVFP4, tl.dot": lambda: w4a16.w4a16_matmul(a, wq, kernel="dot"),
        "cuBLAS bf16": lambda: torch.matmul(a, w.T),
        "read the weight bytes": read_baseline(wq.q.numel() + wq.s.numel()),
    }
    return {label: fns[label] for label in labels}


# name -> the kind, the shape (M, N, K), the scaling of the GEMMs it explains (fp8), the pattern of the
# kernels kept, and the contenders in launch order.
PROFILES = {
    "fp8_gemm_blockwise": {
        "kind": "fp8",
        "shape": (8192, 8192, 4096),
        "scaling": "block",
        "kernels": GEMM_KERNEL,
        "labels": ("ours blockwise", "torch._scaled_mm blockwise", "torch._scaled_mm tensorwise", "ours tensorwise"),
    },
    "fp8_gemm_rowwise": {
        "kind": "fp8",
        "shape": (8192, 8192, 4096),
        "scaling": "row",
        "kernels": GEMM_KERNEL,
        "labels": ("ours rowwise", "torch._scaled_mm rowwise", "torch._scaled_mm tensorwise"),
    },
    "fp4_w4a16_gemm": {
        "kind": "w4a16",
        "shape": (64, 8192, 8192),
        "kernels": W4A16_KERNEL,
        "labels": ("ours NVFP4, tl.dot", "cuBLAS bf16", "read the weight bytes"),
    },
}


def contenders(name: str) -> dict:
    """The callables of profile ``name``, by label, in launch order (on a CUDA GPU)."""
    spec = PROFILES[name]
    if spec["kind"] == "w4a16":
        return _w4a16_contenders(spec["shape"], spec["labels"])
    return _fp8_contenders(spec["scaling"], spec["shape"], spec["labels"])


def run(name: str) -> None:
    """Call each contender of profile ``name`` once inside the profiler's window (see the module docstring)."""
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench.profiles run needs a CUDA GPU (and is meant to run under ncu)")
    fns = contenders(name)
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


def parse_raw_csv(text: str, labels, pattern=GEMM_KERNEL) -> list:
    """``ncu --csv --page raw`` output -> one entry per label: kernel name, kept metrics and their units.

    Rows are kernels in launch order; kernels whose names do not match ``pattern`` (GEMMs by default) are
    dropped; those kept must be exactly one per label."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        raise ValueError("no 'Kernel Name' column: not the raw page of an Nsight Compute report")
    header, units = rows[start], rows[start + 1]
    kname = header.index("Kernel Name")
    gemms = [r for r in rows[start + 2 :] if len(r) == len(header) and pattern.search(r[kname])]
    labels = list(labels)
    if len(gemms) != len(labels):
        names = [r[kname][:60] for r in gemms]
        raise ValueError(
            f"expected {len(labels)} kernels matching {pattern.pattern!r} ({labels}), found {len(gemms)}: {names}"
        )
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
    from kernels.bench.command import environment, gpu_slug

    ncu = shutil.which(ncu) or shutil.which("/usr/local/cuda/bin/ncu") or ncu
    raw = subprocess.run(
        [ncu, "--import", report, "--csv", "--page", "raw"], capture_output=True, text=True, check=True
    )
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    env = environment()
    doc = {
        "profile": name,
        "shape": "x".join(map(str, PROFILES[name]["shape"])),
        "tool": version.splitlines()[-1],
        **env,
        "kernels": parse_raw_csv(raw.stdout, PROFILES[name]["labels"], PROFILES[name]["kernels"]),
    }
    if PROFILES[name]["kind"] == "w4a16":  # every quantity the report prints must have been kept
        m, n, k = PROFILES[name]["shape"]
        for kern in doc["kernels"]:
            for _, get, _ in _w4a16_rows(n * k):
                get(kern)
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    out = PROFILE_DIR / f"{gpu_slug(env['device'])}-{name}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


_TO = {
    "us": {"ns": 1e-3, "us": 1.0, "ms": 1e3},
    "KB": {"byte": 1e-3, "Kbyte": 1.0, "Mbyte": 1e3},
    "B": {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9},
}
_DRAM_PCT = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
)
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed"


def _metric(kern: dict, name, unit=None) -> float:
    """A kept metric, converted to ``unit`` ("us", "KB" or "B") from the unit Nsight Compute gave it.
    ``name`` may be a tuple of the names one quantity goes by in different Nsight Compute versions and
    GPUs (the first one present is read)."""
    names = (name,) if isinstance(name, str) else tuple(name)
    found = next((n for n in names if n in kern["metrics"]), None)
    if found is None:
        raise KeyError(f"none of {names} was kept for {kern.get('contender', 'this kernel')}")
    value = kern["metrics"][found]
    if unit is not None:
        value *= _TO[unit][kern["units"][found].split("/")[0]]
    return value


def _rows(m: int, n: int) -> list:
    """(label, value of a kernel's entry, format) for the table of :func:`report`; ``m * n`` outputs."""

    def cycles(kn):
        return _metric(kn, "sm__cycles_elapsed.avg")

    return [
        ("time under the profiler (us)", lambda kn: _metric(kn, "gpu__time_duration.sum", "us"), "{:.0f}"),
        ("SM clock (GHz)", lambda kn: _metric(kn, "sm__cycles_elapsed.avg.per_second"), "{:.2f}"),
        ("SM cycles (thousands)", lambda kn: cycles(kn) / 1e3, "{:.0f}"),
        ("threads per CTA", lambda kn: _metric(kn, "launch__block_size"), "{:.0f}"),
        ("CTAs per cluster", lambda kn: max(1.0, _metric(kn, "launch__cluster_size")), "{:.0f}"),
        ("shared memory per CTA (KB)", lambda kn: _metric(kn, "launch__shared_mem_per_block_dynamic", "KB"), "{:.0f}"),
        ("registers per thread", lambda kn: _metric(kn, "launch__registers_per_thread"), "{:.0f}"),
        (
            "tensor pipe busy (% of cycles)",
            lambda kn: _metric(kn, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"),
            "{:.1f}",
        ),
        ("fp32 FMAs per output element", lambda kn: _metric(kn, _FFMA) * cycles(kn) / (m * n), "{:.1f}"),
        ("warp instructions per output element", lambda kn: _metric(kn, "smsp__inst_executed.sum") / (m * n), "{:.2f}"),
    ]


def top_stall(kern: dict) -> tuple:
    """The reason a kernel's warps were most often stalled, with its count per issued instruction:
    the largest ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``, leaving out
    ``selected`` and ``not_selected`` (a warp that issued, or was ready and passed over: not stalls)."""
    stalls = {}
    for metric, value in kern["metrics"].items():
        found = _STALL.match(metric)
        if found and found.group(1) not in ("selected", "not_selected") and isinstance(value, float):
            stalls[found.group(1)] = value
    if not stalls:
        raise ValueError(f"no stall metrics kept for {kern.get('contender', 'this kernel')}")
    reason = max(stalls, key=stalls.get)
    return reason, stalls[reason]


def _w4a16_rows(weights: int) -> list:
    """(label, value of a kernel's entry, format) for the W4A16 table of :func:`report`, per weight of
    the ``weights`` (N * K) that every contender reads once."""

    def pct(metric):
        return lambda kn: _metric(kn, metric)

    return [
        ("time under the profiler (us)", lambda kn: _metric(kn, "gpu__time_duration.sum", "us"), "{:.1f}"),
        ("DRAM bandwidth (% of peak)", pct(_DRAM_PCT), "{:.1f}"),
        ("DRAM bytes read per weight", lambda kn: _metric(kn, "dram__bytes_read.sum", "B") / weights, "{:.3f}"),
        ("warps resident (% of the SM's slots)", pct("sm__warps_active.avg.pct_of_peak_sustained_active"), "{:.1f}"),
        ("issue slots used (%)", pct("smsp__issue_active.avg.pct_of_peak_sustained_active"), "{:.1f}"),
        (
            "tensor pipe busy (% of cycles)",
            pct("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"),
            "{:.1f}",
        ),
        ("warp instructions per weight", lambda kn: _metric(kn, "smsp__inst_executed.sum") / weights, "{:.3f}"),
        (
            "shared-memory wavefronts per weight",
            lambda kn: _metric(kn, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum") / weights,
            "{:.3f}",
        ),
        ("threads per CTA", lambda kn: _metric(kn, "launch__block_size"), "{:.0f}"),
        ("shared memory per CTA (KB)", lambda kn: _metric(kn, "launch__shared_mem_per_block_dynamic", "KB"), "{:.0f}"),
        ("registers per thread", lambda kn: _metric(kn, "launch__registers_per_thread"), "{:.0f}"),
        ("most frequent stall", lambda kn: "{} {:.1f}".format(*top_stall(kn)), "{}"),
    ]


def report(name: str, gpu: str | None = "nvidia-h200") -> str:
    """The committed profile ``name`` of ``gpu`` as a table: one column per contender (cuBLAS for
    ``torch._scaled_mm``), one row per quantity; or one line saying how to make it.  ``gpu=None``: the
    first committed profile of that name, whichever GPU it was made on."""
    if gpu is None:
        found = sorted(PROFILE_DIR.glob(f"*-{name}.json"))
        path = found[0] if found else PROFILE_DIR / f"<gpu>-{name}.json"
    else:
        path = PROFILE_DIR / f"{gpu}-{name}.json"
    if not path.exists():
        return f"no profile {path.name} yet: the docstring of kernels/bench/profiles.py gives the two commands"
    doc = json.loads(path.read_text())
    m, n, k = (int(v) for v in doc["shape"].split("x"))
    kerns = doc["kernels"]
    lines = [f"Nsight Compute {doc['tool'].split()[1]} on {doc['device']}, {doc['shape']}, commit {doc['commit'][:7]}"]
    lines += [f"  {kn['contender']:<28} {kn['kernel'][:72]}" for kn in kerns]
    fp8 = PROFILES[name]["kind"] == "fp8"
    width, col = (38, 18) if fp8 else (40, 24)
    heads = [kn["contender"].replace("torch._scaled_mm", "cuBLAS") for kn in kerns]
    lines.append(f"{'':<{width}}" + "".join(f"{h:>{col}}" for h in heads))
    for label, get, fmt in _rows(m, n) if fp8 else _w4a16_rows(n * k):
        lines.append(f"{label:<{width}}" + "".join(f"{fmt.format(get(kn)):>{col}}" for kn in kerns))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.bench.profiles", description=__doc__.splitlines()[0])
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


__all__ = [
    "GEMM_KERNEL",
    "KEEP",
    "PROFILES",
    "PROFILE_DIR",
    "W4A16_KERNEL",
    "contenders",
    "main",
    "parse_raw_csv",
    "report",
    "run",
    "save",
    "top_stall",
]


if __name__ == "__main__":
    sys.exit(main())
