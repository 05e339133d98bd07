"""Choose compiled Triton or its (corrected) interpreter, before any kernel is decorated."""

import os
import sys

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


def select() -> bool:
    """Set ``TRITON_INTERPRET`` for this process and correct the interpreter if it is used.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function, so this must run before
    any ``@triton.jit`` in the package (or in a notebook that imports the package first).
    """
    global _ANNOUNCED
    use = _want_interpreter()
    if not use:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    from kernels import _interpreter

    _interpreter.install()
    if not _ANNOUNCED:
        _ANNOUNCED = True
        print(
            "kernels: no CUDA GPU in use; Triton runs in its CPU interpreter, with casts and dots "
            "corrected to match compiled Triton on Hopper.",
            file=sys.stderr,
        )
    return True
