"""kernels.bench and its command: the registry and the runner's bookkeeping (timing itself needs a GPU
and runs there)."""

import importlib.util
import json

import pytest
import torch

import kernels
from kernels import bench
from kernels.bench import command


def test_refuses_in_cpu_mode_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "INTERPRETER", True)
    assert command.main(["bf16_cast"]) == 2
    err = capsys.readouterr().err
    assert err == "kernels.bench: needs a CUDA GPU (speed is not measured in CPU mode)\n"


def test_unknown_benchmark_is_named(capsys):
    with pytest.raises(SystemExit):
        command.main(["no_such_bench"])
    assert "unknown benchmark(s) ['no_such_bench']" in capsys.readouterr().err


def test_gpu_slug():
    assert command.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert command.gpu_slug("NVIDIA GeForce RTX 4090 ") == "nvidia-geforce-rtx-4090"


def _rec(bench_name, shape, baseline, ours):
    return {"bench": bench_name, "shape": shape, "baseline_name": baseline, "ours": ours}


def test_merge_replaces_same_key_and_keeps_the_rest(tmp_path):
    path = tmp_path / "results" / "gpu.json"
    command.merge(path, [_rec("a", "1", "x", 1.0), _rec("a", "1", "y", 2.0), _rec("b", "2", "x", 3.0)])
    merged = command.merge(path, [_rec("a", "1", "x", 10.0)])
    assert json.loads(path.read_text()) == merged
    assert {(r["bench"], r["baseline_name"], r["ours"]) for r in merged} == {
        ("a", "x", 10.0),
        ("a", "y", 2.0),
        ("b", "x", 3.0),
    }
    assert not list(path.parent.glob("*.tmp"))


def test_measure_ratio_and_metric(monkeypatch):
    times = iter([2.0, 1.0, 4.0] * bench.ROUNDS)  # ours, fast baseline, slow baseline, per round
    monkeypatch.setattr(bench, "median_ms", lambda fn: next(times))
    recs = bench.measure("k", "8", "GB/s", 4e9, None, {"fast": None, "slow": None})
    assert [(r["baseline_name"], r["ours"], r["baseline"], r["ratio"]) for r in recs] == [
        ("fast", 2000.0, 4000.0, 0.5),
        ("slow", 2000.0, 1000.0, 2.0),
    ]
    with pytest.raises(ValueError, match="metric"):
        bench.measure("k", "8", "ms", 1.0, None, {})


def test_quick_mode_takes_the_first_case_and_one_short_round(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "median_ms", lambda fn, *ms: calls.append(ms) or 1.0)
    monkeypatch.setattr(bench, "QUICK", True)
    assert bench.cases([(1, 2), (3, 4)]) == [(1, 2)]
    bench.measure("k", "8", "GB/s", 1e9, None, {"base": None})
    assert calls == [bench.QUICK_MS, bench.QUICK_MS], "one round of ours and the baseline, short"
    monkeypatch.setattr(bench, "QUICK", False)
    assert bench.cases(iter([(1, 2), (3, 4)])) == [(1, 2), (3, 4)]


def test_quick_records_never_go_into_the_results(capsys):
    for argv in (["bf16_cast", "--quick"], ["bf16_cast", "--quick", "--out", str(command.RESULTS / "x.json")]):
        with pytest.raises(SystemExit):
            command.main(argv)
        assert "--quick: its records are not results" in capsys.readouterr().err


def test_registry_rejects_duplicates():
    with pytest.raises(ValueError, match="registered twice"):
        bench.benchmark("bf16_cast")(lambda: [])


# torchao's Float8Linear is a peer wherever torchao is importable (it is not a dependency of the book).
TORCHAO = {
    g: {f"torchao Float8Linear {name}, compiled"} if importlib.util.find_spec("torchao") else set()
    for g, name in (("tensor", "tensorwise"), ("row", "rowwise"))
}
BASELINES = {
    "bf16_cast": {"torch .to(torch.bfloat16)", "device copy"},
    "fp8_encode": {"triton x.to(tl.float8e4nv)", "device copy"},
    "scaling_per_tensor": {"device copy"},
    "scaling_rowwise": {"device copy"},
    "scaling_1x128": {"device copy"},
    "scaling_128x128": {"device copy"},
    "scaling_mxfp8": {"device copy"},
    "hazards_stochastic_round": {
        "triton x.to(e4m3fn) (round to nearest)",
        "triton x.to(bf16) (round to nearest)",
        "device copy",
    },
    "hazards_fp8_promotion": {
        "same kernel, no promotion",
        "torch._scaled_mm use_fast_accum=False",
        "torch._scaled_mm use_fast_accum=True",
    },
    "amp_unscale": {"torch._amp_foreach_non_finite_check_and_unscale_", "device copy"},
    "amp_rmsnorm_fwd": {"torch rms_norm", "device copy"},
    "amp_rmsnorm_bwd": {"torch rms_norm backward", "device copy"},
    "fp8_gemm_tensorwise": {"torch._scaled_mm tensorwise", "torch.matmul bf16"},
    "fp8_gemm_rowwise": {"torch._scaled_mm rowwise", "torch.matmul bf16"},
    "fp8_gemm_blockwise": {"torch._scaled_mm tensorwise", "torch._scaled_mm blockwise", "torch.matmul bf16"},
    "fp8_gemm_blockwise_small_m": {"torch._scaled_mm blockwise"},
    "fp8_linear": {"nn.Linear bf16", *TORCHAO["tensor"]},
    "fp8_linear_rowwise": {"nn.Linear bf16", *TORCHAO["row"]},
    "fp8_linear_compiled": {"nn.Linear bf16, compiled", *TORCHAO["tensor"]},
    "fp8_linear_rowwise_compiled": {"nn.Linear bf16, compiled", *TORCHAO["row"]},
    "int8_quantize": {"device copy"},
    "int8_w8a8_gemm": {"torch._int_mm + scales", "torch.matmul bf16"},
    "attention_bf16": {"torch SDPA (flash)"},
    "attention_fp8": {"our bf16 attention", "torch SDPA (flash)"},
    "fp4_w4a16_gemm": {
        "torch.matmul bf16",
        "dequantize + torch.matmul",
        "tl.dot kernel",
        "int4 tinygemm g128",
        "read the weight bytes",
    },
    "fp4_quantize": {"device copy"},
    "fp4_quantize_given_scale": {"device copy"},
    "fp4_quantize_mxfp4": {"device copy"},
    "fp4_quantize_t": {
        "device copy",
        "transpose, rotate, quantize",
        "fused, nearest rounding",
        "fused, nearest rounding, no rotation",
    },
    "fp4_linear": {"nn.Linear bf16", "FP8Linear tensorwise"},
}


def test_every_benchmark_has_its_baselines_listed_here():
    assert set(BASELINES) == set(bench.load_all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times kernels on a GPU")
@pytest.mark.parametrize("name", sorted(BASELINES))
def test_benchmark_runs_on_a_gpu(tmp_path, name):
    assert command.main([name, "--quick", "--out", str(tmp_path / "r.json")]) == 0
    recs = json.loads((tmp_path / "r.json").read_text())
    assert {r["baseline_name"] for r in recs} == BASELINES[name]
    assert all(r["ours"] > 0 and r["device"] == torch.cuda.get_device_name() for r in recs)
    assert all(r["quick"] for r in recs) and not bench.QUICK
    if name.startswith("fp8_linear"):
        assert all(r["host_us"] > 0 for r in recs), "the layer's records give its host time per step"
    if name == "fp4_linear":
        # Both are timed, each on its own; the lane runs many tests at once on one GPU, so which of two
        # separately timed medians is larger is not something a test there can rely on.
        assert all(r["quantize_ms"] > 0 and r["step_ms"] > 0 for r in recs), "the quantizations and the step are timed"
    if name.startswith("fp8_linear") and not importlib.util.find_spec("torchao"):
        assert all("torchao is not importable" in r["absent"] for r in recs), "the record says the peer was absent"


def test_torchao_is_imported_without_the_syntax_warning_of_its_sources(tmp_path):
    # Python 3.12 and later warn about torchao's invalid escape '\.' whenever they compile its quant_api.py.
    import pathlib
    import subprocess
    import sys

    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed here (it is not a dependency of the book)")
    code = (
        "import sys, warnings\n"
        "from kernels.bench import fp8\n"
        f"sys.pycache_prefix = {str(tmp_path)!r}  # no cached bytecode: torchao's sources are compiled again\n"
        "warnings.simplefilter('error', SyntaxWarning)\n"
        "assert fp8.torchao_float8_module().__name__ == 'torchao.float8'\n"
    )
    root = pathlib.Path(kernels.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "SyntaxWarning" not in done.stderr, done.stderr


def test_a_record_names_the_commit_that_ran_or_says_the_files_differ(monkeypatch):
    import subprocess

    import kernels.device

    monkeypatch.setattr(kernels.device, "gpu_environment", lambda: {})
    monkeypatch.delenv("KERNELS_COMMIT", raising=False)
    answers = {"rev-parse": "abc123\n", "status": ""}

    def fake_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, stdout=answers[cmd[1]], stderr="")

    monkeypatch.setattr(command.subprocess, "run", fake_run)
    assert command.environment()["commit"] == "abc123"
    answers["status"] = " M kernels/quantize.py\n"
    assert command.environment()["commit"] == "abc123+modified"
    monkeypatch.setenv("KERNELS_COMMIT", "def456")
    assert command.environment()["commit"] == "def456"
