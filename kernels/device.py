"""Where kernels run on this machine, and what it runs natively, in one place.

Every chapter and lab uses it.  :func:`default_device` is the device for tensors (the package, the
tests and the notebooks ask it rather than writing the expression themselves) and :func:`check_device`
the one argument check for it.  Notebooks call :func:`report` first (numerics depend on device, torch
and triton) and use :func:`capabilities` to pick a path, or :func:`gpu_only` to skip a GPU-only cell
with a one-line reason instead of an error; :func:`gpu_environment` is what a recorded GPU result
depends on.
"""

import datetime
import functools
import platform
from dataclasses import dataclass

import torch
import triton

import kernels


def default_device() -> str:
    """Where the package's kernels run, and where callers should put their tensors: ``"cpu"`` in CPU
    mode (Triton's interpreter), ``"cuda"`` when Triton compiles for the GPU."""
    return "cpu" if kernels.INTERPRETER else "cuda"


def check_device(t: torch.Tensor, name: str) -> None:
    """Refuse a tensor argument that is not on :func:`default_device`, naming ``name`` and the fix.

    The same rule in both modes: compiled Triton cannot read a CPU tensor, and CPU mode's corrections
    are written for tensors in host memory.
    """
    want = default_device()
    if t.device.type != want:
        if want == "cuda":
            raise ValueError(f"{name} is on {t.device}, but Triton compiles for the GPU here: pass {name}.cuda()")
        raise ValueError(f"{name} is on {t.device}, but Triton runs in its CPU interpreter here: pass {name}.cpu()")


@dataclass(frozen=True)
class Capabilities:
    mode: str  # "cpu-interpreter" or "cuda"
    device: str  # "CPU (x86_64)" or the GPU's name
    capability: tuple  # (major, minor); (0, 0) on the CPU
    fp8: str  # "native", "emulated" (upcast to fp16/bf16 before the MMA) or "interpreter"
    mx_fp4: str  # "native" (sm_100+), "emulated" or "interpreter"

    @property
    def interpreter(self) -> bool:
        return self.mode == "cpu-interpreter"

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if not self.interpreter else "none"


def capabilities() -> Capabilities:
    """Classify the current device: CPU interpreter; CUDA below sm_89 (FP8 emulated by upcasting);
    sm_89/sm_90 (native FP8 tensor cores); sm_100+ (native MX and FP4 as well)."""
    if kernels.INTERPRETER or not torch.cuda.is_available():
        return Capabilities("cpu-interpreter", f"CPU ({platform.machine()})", (0, 0), "interpreter", "interpreter")
    return cuda_capabilities(torch.cuda.current_device())


@functools.cache
def cuda_capabilities(index: int) -> Capabilities:
    # Once per device and process: kernels ask on every launch, and each device query costs microseconds.
    cap = torch.cuda.get_device_capability(index)
    fp8 = "native" if cap >= (8, 9) else "emulated"
    mx = "native" if cap >= (10, 0) else "emulated"
    return Capabilities("cuda", torch.cuda.get_device_name(index), cap, fp8, mx)


@functools.cache
def sm_facts(index: int) -> tuple:
    """(major compute capability, SM count) of CUDA device ``index``: asked once per process, since each
    ``torch.cuda.get_device_properties`` call costs microseconds of a kernel's host path."""
    props = torch.cuda.get_device_properties(index)
    return props.major, props.multi_processor_count


def report() -> Capabilities:
    """Print the environment that the numbers below depend on; returns the capabilities."""
    caps = capabilities()
    where = "CPU mode (Triton interpreter, Hopper numerics)" if caps.interpreter else f"GPU mode ({caps.sm})"
    print(
        f"device: {caps.device} | {where} | torch {torch.__version__} | triton {triton.__version__} | "
        f"fp8: {caps.fp8} | mx/fp4: {caps.mx_fp4}"
    )
    return caps


def gpu_only(what: str, need: str = "cuda") -> bool:
    """True if a cell that needs a GPU (``need``: "cuda", "fp8" or "mx") can run here.

    Otherwise prints one line saying what is skipped and why, and returns False:

        if device.gpu_only("timing against cuBLAS"):
            ...
    """
    caps = capabilities()
    if need not in ("cuda", "fp8", "mx"):
        raise ValueError(f"need must be 'cuda', 'fp8' or 'mx', got {need!r}")
    if caps.interpreter:
        print(f"skipped on CPU: {what} needs a CUDA GPU")
        return False
    if need == "fp8" and caps.fp8 != "native":
        print(f"skipped on {caps.device} ({caps.sm}): {what} needs FP8 tensor cores (sm_89 or newer)")
        return False
    if need == "mx" and caps.mx_fp4 != "native":
        print(f"skipped on {caps.device} ({caps.sm}): {what} needs MX/FP4 tensor cores (sm_100 or newer)")
        return False
    return True


def gpu_environment() -> dict:
    """What a recorded GPU result depends on: device name, capability, torch, triton, date."""
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_environment() needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    return {
        "device": torch.cuda.get_device_name(),
        "capability": f"{major}.{minor}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }


__all__ = [
    "Capabilities",
    "capabilities",
    "check_device",
    "cuda_capabilities",
    "default_device",
    "gpu_environment",
    "gpu_only",
    "report",
    "sm_facts",
]
