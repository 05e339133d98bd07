"""kernels.bench.profiles: the Nsight Compute raw page is read back into one entry per contender, in launch order."""

import json

import pytest

from kernels.bench import profiles

STALL = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
HEADER = f'"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread","dram__bytes.sum","{STALL}"'
UNITS = '"","","ns","register/thread","byte",""'


def _raw(*kernels):
    rows = [f'"{i}","{name}","{t}","{regs}","1,024","0.5"' for i, (name, t, regs) in enumerate(kernels)]
    return "\n".join(["==PROF== Disconnected", HEADER, UNITS, *rows]) + "\n"


def test_parse_keeps_gemms_in_order_and_the_listed_metrics():
    text = _raw(
        ("void at::native::elementwise_kernel<128, 4>(...)", "5,000", "16"),  # a scale copy before our GEMM
        ("_fp8_gemm_persistent_kernel", "800,000", "168"),
        ("nvjet_sm90_qqtst_128x256_64x4_1x2_h_bz_coopA_NNT", "700,000", "168"),
    )
    got = profiles.parse_raw_csv(text, ["ours", "cuBLAS"])
    assert [g["contender"] for g in got] == ["ours", "cuBLAS"]
    assert got[0]["kernel"] == "_fp8_gemm_persistent_kernel" and got[1]["kernel"].startswith("nvjet")
    assert got[0]["metrics"] == {
        "gpu__time_duration.sum": 800000.0,
        "launch__registers_per_thread": 168.0,
        STALL: 0.5,
    }  # dram__bytes is not in KEEP; thousands separators are read as numbers
    assert got[0]["units"]["gpu__time_duration.sum"] == "ns"


def test_parse_refuses_a_kernel_count_that_does_not_match():
    text = _raw(("_fp8_gemm_persistent_kernel", "1", "1"))
    with pytest.raises(ValueError, match="expected 2 GEMM kernels"):
        profiles.parse_raw_csv(text, ["ours", "cuBLAS"])
    with pytest.raises(ValueError, match="Kernel Name"):
        profiles.parse_raw_csv("a,b\n1,2\n", ["ours"])


def test_committed_profiles_name_their_contenders_and_provenance():
    for path in sorted(profiles.PROFILE_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        spec = profiles.PROFILES[doc["profile"]]
        assert doc["shape"] == "x".join(map(str, spec["shape"])), path
        assert [k["contender"] for k in doc["kernels"]] == list(spec["labels"]), path
        assert all(k["metrics"]["gpu__time_duration.sum"] > 0 for k in doc["kernels"]), path
        assert doc["commit"] != "unknown" and doc["device"] and doc["tool"].startswith("Version"), path


def test_report_reads_the_committed_profile_or_says_how_to_make_it():
    text = profiles.report("fp8_gemm_blockwise")
    if not (profiles.PROFILE_DIR / "nvidia-h200-fp8_gemm_blockwise.json").exists():
        assert text.startswith("no profile")
        return
    lines = text.splitlines()
    assert lines[0].startswith("Nsight Compute") and "8192x8192x4096" in lines[0]
    assert "cuBLAS blockwise" in lines[5] and "ours blockwise" in lines[5]
    busy = next(line for line in lines if line.startswith("tensor pipe busy"))
    values = [float(v) for v in busy.split(")")[1].split()]
    assert len(values) == 4 and all(0 < v <= 100 for v in values)
    # One promotion FMA per output element and 128-wide K-block: 4096 / 128 for both blockwise kernels.
    ffma = next(line for line in lines if line.startswith("fp32 FMAs per output element")).split()[-4:]
    assert [float(v) for v in ffma[:2]] == [32.0, 32.0]
    assert profiles.report("fp8_gemm_rowwise", gpu="no-such-gpu").startswith("no profile")
