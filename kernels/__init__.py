"""Low-precision GPU kernels in Triton, with plain-PyTorch references beside them.

Importing this package picks how Triton runs.  With a CUDA GPU, kernels compile as usual.  Without
one, Triton switches to its CPU interpreter, which :mod:`kernels._interpreter` corrects so that casts,
low-precision arithmetic and ``tl.dot`` give what compiled Triton gives on a Hopper GPU.  Set
``KERNELS_INTERPRET=1`` to force the interpreter on a GPU machine (``0`` to forbid it).
"""

from kernels import _mode

INTERPRETER = _mode.select()

__all__ = ["INTERPRETER"]
