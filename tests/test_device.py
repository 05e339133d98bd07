"""Device classification, the environment report and CPU-mode selection."""

import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import device


def test_report_names_device_versions_and_mode(capsys):
    caps = device.report()
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0
    assert f"torch {torch.__version__}" in line and "triton " in line
    assert ("CPU mode" in line) == caps.interpreter == kernels.INTERPRETER


@pytest.fixture
def fake_gpu(monkeypatch):
    """make(cap, name): pretend to be CUDA device 0 with compute capability ``cap``.  capabilities() keeps
    one answer per device and process, so kept answers are dropped before and after."""

    def make(cap, name):
        monkeypatch.setattr(kernels, "INTERPRETER", False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
        device.cuda_capabilities.cache_clear()

    yield make
    device.cuda_capabilities.cache_clear()


@pytest.mark.parametrize(
    "cap,fp8,mx",
    [
        ((7, 5), "emulated", "emulated"),
        ((8, 0), "emulated", "emulated"),
        ((8, 9), "native", "emulated"),
        ((9, 0), "native", "emulated"),
        ((10, 0), "native", "native"),
        ((12, 0), "native", "native"),
    ],
)
def test_capability_classes(fake_gpu, cap, fp8, mx):
    fake_gpu(cap, "Some GPU")
    caps = device.capabilities()
    assert (caps.mode, caps.fp8, caps.mx_fp4, caps.sm) == ("cuda", fp8, mx, f"sm_{cap[0]}{cap[1]}")


def test_gpu_only_skips_with_one_line_reason(monkeypatch, fake_gpu, capsys):
    monkeypatch.setattr(kernels, "INTERPRETER", True)
    assert device.gpu_only("timing against cuBLAS") is False
    assert capsys.readouterr().out == "skipped on CPU: timing against cuBLAS needs a CUDA GPU\n"
    fake_gpu((8, 0), "NVIDIA A100")
    assert device.gpu_only("an FP8 GEMM", need="fp8") is False
    assert "needs FP8 tensor cores" in capsys.readouterr().out
    assert device.gpu_only("a bf16 GEMM") is True
    with pytest.raises(ValueError, match="need must be"):
        device.gpu_only("x", need="fp4")


def _fresh_import(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KERNELS_INTERPRET")}
    env.update(env_extra)
    code = "import os, kernels; print(kernels.INTERPRETER, os.environ.get('TRITON_INTERPRET'))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks automatic CPU mode on a machine without a GPU")
def test_cpu_mode_is_automatic_and_announced_once():
    run = _fresh_import({})
    assert run.stdout.split() == ["True", "1"]
    assert run.stderr.count("CPU interpreter") == 1 and len(run.stderr.strip().splitlines()) == 1


def test_bad_override_is_a_clear_error():
    run = _fresh_import({"KERNELS_INTERPRET": "yes"})
    assert run.returncode != 0 and "KERNELS_INTERPRET must be '0' or '1', got 'yes'" in run.stderr


EARLY_KERNEL = """
import torch
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)  # a triton library function, decorated before CPU mode
    tl.store(y_ptr + offs, (_twice(x) + acc + tl.sum(x, axis=0)).to(tl.bfloat16))


import kernels  # after triton and after the kernel: import order must not matter

x = torch.tensor([1.0, 2.0, 3.0, 4.0])
y = torch.empty(4, dtype=torch.bfloat16)
kernel[(1,)](x, y, BLOCK=4)
print(y.float().tolist())
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks CPU mode on a machine without a GPU")
def test_cpu_mode_works_when_triton_was_imported_first(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(EARLY_KERNEL)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KERNELS_INTERPRET")}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[12.0, 14.0, 16.0, 18.0]"


def test_gpu_environment_names_what_results_depend_on(monkeypatch):
    from kernels.authoring import record
    from kernels.bench import command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        device.gpu_environment()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    env = device.gpu_environment()
    assert (env["device"], env["capability"], env["torch"]) == ("NVIDIA H200", "9.0", torch.__version__)
    assert set(env) == {"device", "capability", "torch", "triton", "date"}
    assert record.environment()["gpu"] == "NVIDIA H200" and set(record.KEYS) - {"code_sha256"} <= set(
        record.environment()
    )
    monkeypatch.setenv("KERNELS_COMMIT", "abc123")
    assert command.environment()["commit"] == "abc123"


@pytest.mark.parametrize(("interpreter", "want"), [(True, "cpu"), (False, "cuda")])
def test_default_device_follows_the_mode(monkeypatch, interpreter, want):
    monkeypatch.setattr(kernels, "INTERPRETER", interpreter)
    assert device.default_device() == want


@pytest.mark.parametrize(
    ("interpreter", "message"),
    [
        (False, r"^w is on cpu, but Triton compiles for the GPU here: pass w\.cuda\(\)$"),
        (True, r"^w is on cuda, but Triton runs in its CPU interpreter here: pass w\.cpu\(\)$"),
    ],
)
def test_check_device_names_the_argument_and_the_fix(monkeypatch, interpreter, message):
    from types import SimpleNamespace

    monkeypatch.setattr(kernels, "INTERPRETER", interpreter)
    on = {kind: SimpleNamespace(device=torch.device(kind)) for kind in ("cpu", "cuda")}  # no GPU needed
    right, wrong = (on["cpu"], on["cuda"]) if interpreter else (on["cuda"], on["cpu"])
    device.check_device(right, "w")
    with pytest.raises(ValueError, match=message):
        device.check_device(wrong, "w")


def test_the_device_expression_is_written_once():
    """Everything asks :func:`kernels.device.default_device`; nothing spells the rule out again."""
    import re
    from pathlib import Path

    root = Path(kernels.__file__).resolve().parents[1]
    rule = re.compile(r"""["']cpu["']\s+if\s+[\w.]*(INTERPRETER|interpreter)\s+else\s+["']cuda["']""")
    where = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("kernels", "tests")
        for path in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if rule.search(line)
    ]
    assert [w.split(":")[0] for w in where] == ["kernels/device.py"], where
