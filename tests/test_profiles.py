"""kernels.bench.profiles: the Nsight Compute raw page is read back into one entry per contender, in launch order."""

import json

import pytest
import torch

import kernels
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
    with pytest.raises(ValueError, match="expected 2 kernels matching"):
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


def _w4a16_doc():
    """A W4A16 profile as save() writes it, with made-up but plausible numbers."""
    weights = 8192 * 8192

    def kern(label, name, us, dram_mb, stalls):
        metrics = {
            "gpu__time_duration.sum": us,
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 50.0,
            "dram__bytes_read.sum": dram_mb,
            "sm__warps_active.avg.pct_of_peak_sustained_active": 12.5,
            "smsp__issue_active.avg.pct_of_peak_sustained_active": 30.0,
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": 10.0,
            "smsp__inst_executed.sum": 0.25 * weights,
            "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 0.1 * weights,
            "launch__block_size": 256.0,
            "launch__shared_mem_per_block_dynamic": 64.0,
            "launch__registers_per_thread": 128.0,
            **{f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": v for r, v in stalls.items()},
        }
        units = {"gpu__time_duration.sum": "us", "dram__bytes_read.sum": "Mbyte"}
        units["launch__shared_mem_per_block_dynamic"] = "Kbyte"
        return {"contender": label, "kernel": name, "metrics": metrics, "units": units}

    return {
        "profile": "fp4_w4a16_gemm",
        "shape": "64x8192x8192",
        "tool": "Version 2025.3.1.0 (build 1) (public-release)",
        "device": "NVIDIA H100 80GB HBM3",
        "commit": "0123456789abcdef",
        "kernels": [
            kern(
                "ours NVFP4, tl.dot",
                "_w4a16_kernel",
                67.5,
                38.8,
                {"selected": 9.0, "long_scoreboard": 3.5, "wait": 1.0},
            ),
            kern(
                "cuBLAS bf16",
                "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
                50.0,
                135.2,
                {"not_selected": 5.0, "math_pipe_throttle": 0.5},
            ),
            kern("read the weight bytes", "_read_words", 15.6, 37.7, {"long_scoreboard": 7.0, "selected": 1.0}),
        ],
    }


def test_w4a16_parse_keeps_ours_cublas_and_the_read_kernel():
    text = _raw(
        ("_w4a16_kernel", "67,500", "128"),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "50,000", "168"),
        ("void at::native::vectorized_elementwise_kernel<4>(...)", "3,000", "16"),  # not a contender
        ("_read_words", "15,600", "32"),
    )
    got = profiles.parse_raw_csv(text, profiles.PROFILES["fp4_w4a16_gemm"]["labels"], profiles.W4A16_KERNEL)
    assert [g["kernel"][:8] for g in got] == ["_w4a16_k", "nvjet_sm", "_read_wo"]
    with pytest.raises(ValueError, match="expected 3 kernels"):
        profiles.parse_raw_csv(text, profiles.PROFILES["fp4_w4a16_gemm"]["labels"])  # GEMMs only: 2


def test_top_stall_skips_warps_that_issued_or_were_passed_over():
    kerns = _w4a16_doc()["kernels"]
    assert profiles.top_stall(kerns[0]) == ("long_scoreboard", 3.5)  # not "selected", which is larger
    assert profiles.top_stall(kerns[1]) == ("math_pipe_throttle", 0.5)
    with pytest.raises(ValueError, match="no stall metrics"):
        profiles.top_stall(
            {"contender": "x", "metrics": {"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": 1.0}}
        )


def test_w4a16_report_is_per_weight_with_units_converted(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "PROFILE_DIR", tmp_path)
    assert profiles.report("fp4_w4a16_gemm", gpu=None).startswith("no profile")
    (tmp_path / "nvidia-h100-80gb-hbm3-fp4_w4a16_gemm.json").write_text(json.dumps(_w4a16_doc()))
    lines = profiles.report("fp4_w4a16_gemm", gpu=None).splitlines()
    assert "NVIDIA H100 80GB HBM3" in lines[0] and "64x8192x8192" in lines[0]

    def row(label):
        return next(line for line in lines if line.startswith(label))[40:].split()

    # 38.8 Mbyte over 8192^2 weights: 0.578 bytes per weight (an FP4 weight and its scales: 0.5625)
    assert row("DRAM bytes read per weight") == ["0.578", "2.015", "0.562"]
    assert row("time under the profiler") == ["67.5", "50.0", "15.6"]
    assert row("warp instructions per weight") == ["0.250", "0.250", "0.250"]
    assert row("most frequent stall") == [
        "long_scoreboard",
        "3.5",
        "math_pipe_throttle",
        "0.5",
        "long_scoreboard",
        "7.0",
    ]
    assert row("shared memory per CTA") == ["64", "64", "64"]


@pytest.mark.skipif(not torch.cuda.is_available() or kernels.INTERPRETER, reason="builds the contenders on a GPU")
def test_w4a16_contenders_run_on_the_gpu():
    fns = profiles.contenders("fp4_w4a16_gemm")
    assert list(fns) == list(profiles.PROFILES["fp4_w4a16_gemm"]["labels"])
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
