"""Choose compiled Triton or its (corrected) interpreter, before any kernel is decorated."""

import importlib.util
import os
import sys
import warnings

_ANNOUNCED = False


def _want_interpreter() -> bool:
    forced = os.environ.get("KERNELS_INTERPRET")
    if forced in ("0", "1"):
        return forced == "1"
    if forced is not None:
        raise ValueError(f"KERNELS_INTERPRET must be '0' or '1', got {forced!r}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return not torch.cuda.is_available()


def _reinterpret_early_kernels() -> int:
    """Make ``@triton.jit`` functions decorated before ``TRITON_INTERPRET`` was set interpretable.

    ``import triton`` (or a kernel defined) before ``import kernels`` leaves compiled-mode
    ``JITFunction`` objects behind: triton's own library functions (``tl.zeros``, ``tl.sum``, ...)
    and any user kernel; the interpreter cannot call them ("Cannot call @triton.jit'd outside of
    the scope of a kernel").  Import order should not decide whether CPU mode works, so every such
    function reachable from a loaded module, from ``tl.tensor``'s methods or from an autotuner
    wrapper is rebuilt as the ``InterpretedFunction`` that ``triton.jit`` would have made.
    """
    if "triton.runtime.jit" not in sys.modules:
        return 0
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, KernelInterface

    rebuilt = {}

    def interpreted(fn):
        if id(fn) not in rebuilt:
            rebuilt[id(fn)] = InterpretedFunction(fn.fn)
        return rebuilt[id(fn)]

    def fix(owner, namespace):
        for name, obj in list(namespace.items()):
            if isinstance(obj, JITFunction):
                setattr(owner, name, interpreted(obj))
            elif isinstance(obj, KernelInterface) and isinstance(getattr(obj, "fn", None), JITFunction):
                obj.fn = interpreted(obj.fn)  # @triton.autotune / @triton.heuristics wrappers

    with warnings.catch_warnings():  # looking at deprecated module attributes must not warn
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            try:
                namespace = vars(module)
            except TypeError:
                continue
            fix(module, namespace)
        fix(tl.tensor, dict(vars(tl.tensor)))
    return len(rebuilt)


def select() -> bool:
    """Set ``TRITON_INTERPRET`` for this process and correct the interpreter if it is used.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function, so this must run before
    any ``@triton.jit`` in the package (or in a notebook that imports the package first).
    """
    global _ANNOUNCED
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return False  # no kernel can run here; what needs none (python -m kernels.gpu_lane --check) still can
    use = _want_interpreter()
    if not use:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    _reinterpret_early_kernels()
    from kernels import _interpreter, _jit_rules

    _interpreter.install()
    _jit_rules.install()
    if not _ANNOUNCED:
        _ANNOUNCED = True
        print(
            "kernels: no CUDA GPU in use; Triton runs in its CPU interpreter, with casts and dots "
            "corrected to match compiled Triton on Hopper.",
            file=sys.stderr,
        )
    return True


__all__ = [
    "select",
]
