"""The FP8 kernels that :class:`kernels.fp8_linear.FP8Linear` launches, as PyTorch operators, so that
``torch.compile`` traces a model with FP8 layers in one graph.

Chapter 5 and Lab 05 (FP8 GEMM), wherever their FP8Linear is compiled.  Entry points: the functions
below, each with the signature of the kernel it stands for (:func:`kernels.quantize.quantize_tensor` and
the others, :func:`kernels.fp8_gemm.fp8_gemm`), on 2-D operands.

Dynamo cannot follow a Triton launch made the way the package makes them: the launcher asks the device
for its properties, tests pointers' alignment and hands Triton an allocator, and each of those breaks
the graph.  Each kernel is therefore registered with ``torch.library.custom_op`` under the
``kernels::`` namespace, together with a *fake* implementation that only says what comes out (shapes
and dtypes, no kernel): the compiler treats the operator as one opaque node, calls the real kernel
when the graph runs, and fuses the PyTorch code around it (the bias, the reshapes, whatever the model
does between layers).

Outside ``torch.compile`` the functions here call the kernels directly: the dispatcher's few
microseconds per call would be paid on every launch of an eager step for nothing.
"""

import torch
import triton

from kernels import fp8_gemm as G
from kernels import quantize as Q

NAMESPACE = "kernels"


def _fp8(fmt: str) -> torch.dtype:
    """The codes' dtype; an unknown ``fmt`` is named by the kernel's own check when the graph runs."""
    return Q.FP8_FORMATS.get("e4m3" if fmt == "e4m3fn" else fmt, torch.float8_e4m3fn)


# -- the operators: real implementations (the kernels) and fake ones (shapes only) ---------------------


def _current(x: torch.Tensor, fmt: str, transpose: bool = False) -> tuple:
    """Per-tensor current scaling, a matrix in one launch (amax, S and codes; with ``transpose`` the
    codes of ``x.T`` too): ``(Quantized(q, S), qt or None)``."""
    if x.dim() == 2:
        return Q.quantize_tensor_fused(x, fmt, transpose)
    if transpose:
        return Q.quantize_tensor_and_transpose(x, fmt)  # names what is wrong with x
    return Q.quantize_tensor(x, fmt), None


@torch.library.custom_op(f"{NAMESPACE}::quantize_tensor", mutates_args=())
def _quantize_tensor_op(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(_current(x, fmt)[0])


@_quantize_tensor_op.register_fake
def _(x, fmt):
    return x.new_empty(x.shape, dtype=_fp8(fmt)), x.new_empty((), dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::quantize_tensor_with_scale", mutates_args=())
def _quantize_tensor_with_scale_op(x: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    return Q.quantize_tensor_with_scale(x, s, fmt)


@_quantize_tensor_with_scale_op.register_fake
def _(x, s, fmt):
    return x.new_empty(x.shape, dtype=_fp8(fmt))


@torch.library.custom_op(f"{NAMESPACE}::quantize_tensor_and_transpose", mutates_args=())
def _quantize_tensor_and_transpose_op(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    (q, s), qt = _current(x, fmt, transpose=True)
    return q, s, qt


@_quantize_tensor_and_transpose_op.register_fake
def _(x, fmt):
    m, k = x.shape
    return (
        x.new_empty((m, k), dtype=_fp8(fmt)),
        x.new_empty((), dtype=torch.float32),
        x.new_empty((k, m), dtype=_fp8(fmt)),
    )


@torch.library.custom_op(f"{NAMESPACE}::cast_and_transpose", mutates_args=())
def _cast_and_transpose_op(x: torch.Tensor, s: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    (q, _), qt = Q.quantize_tensor_and_transpose(x, fmt, s)
    return q, qt


@_cast_and_transpose_op.register_fake
def _(x, s, fmt):
    m, k = x.shape
    return x.new_empty((m, k), dtype=_fp8(fmt)), x.new_empty((k, m), dtype=_fp8(fmt))


@torch.library.custom_op(f"{NAMESPACE}::tensor_amax", mutates_args=())
def _tensor_amax_op(x: torch.Tensor) -> torch.Tensor:
    return Q.tensor_amax(x)


@_tensor_amax_op.register_fake
def _(x):
    return x.new_empty((), dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::scale_from_amax", mutates_args=())
def _scale_from_amax_op(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    return Q.scale_from_amax(amax, fmt)


@_scale_from_amax_op.register_fake
def _(amax, fmt):
    return amax.new_empty(amax.shape, dtype=torch.float32)


GROUPED = ("row", "1x128", "128x128")  # the granularities of kernels.quantize.quantize that quantize_groups takes


@torch.library.custom_op(f"{NAMESPACE}::quantize_groups", mutates_args=())
def _quantize_groups_op(x: torch.Tensor, granularity: str, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(Q.quantize(x, granularity, fmt))


@_quantize_groups_op.register_fake
def _(x, granularity, fmt):
    m, k = x.shape
    if granularity == "row":
        shape = (m, 1)
    elif granularity == "1x128":
        shape = (m, triton.cdiv(k, Q.GROUP_1X128))
    else:
        shape = (triton.cdiv(m, Q.BLOCK_128X128), triton.cdiv(k, Q.BLOCK_128X128))
    return x.new_empty((m, k), dtype=_fp8(fmt)), x.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::quantize_columns_transposed", mutates_args=())
def _quantize_columns_transposed_op(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(Q.quantize_columns_transposed(x, fmt))


@_quantize_columns_transposed_op.register_fake
def _(x, fmt):
    m, k = x.shape
    return x.new_empty((k, m), dtype=_fp8(fmt)), x.new_empty((k, 1), dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::fp8_gemm", mutates_args=())
def _fp8_gemm_op(
    a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor, scaling: str, out_dtype: torch.dtype
) -> torch.Tensor:
    return G.fp8_gemm(a, b, a_scale, b_scale, scaling, out_dtype)


@_fp8_gemm_op.register_fake
def _(a, b, a_scale, b_scale, scaling, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


# -- what callers use: the operator while compiling, the kernel otherwise --------------------------------


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def quantize_tensor(x: torch.Tensor, fmt: str = "e4m3") -> Q.Quantized:
    """:func:`kernels.quantize.quantize_tensor`."""
    if _compiling():
        return Q.Quantized(*_quantize_tensor_op(x, fmt))
    return _current(x, fmt)[0]


def quantize_tensor_with_scale(x: torch.Tensor, s: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """:func:`kernels.quantize.quantize_tensor_with_scale`."""
    if _compiling():
        return _quantize_tensor_with_scale_op(x, s, fmt)
    return Q.quantize_tensor_with_scale(x, s, fmt)


def quantize_tensor_and_transpose(x: torch.Tensor, fmt: str = "e4m3", s: torch.Tensor | None = None) -> tuple:
    """:func:`kernels.quantize.quantize_tensor_and_transpose` (``x`` 2-D)."""
    if not _compiling():
        return _current(x, fmt, transpose=True) if s is None else Q.quantize_tensor_and_transpose(x, fmt, s)
    if s is None:
        q, s, qt = _quantize_tensor_and_transpose_op(x, fmt)
    else:
        q, qt = _cast_and_transpose_op(x, s, fmt)
    return Q.Quantized(q, s), qt


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """:func:`kernels.quantize.tensor_amax`."""
    return _tensor_amax_op(x) if _compiling() else Q.tensor_amax(x)


def scale_from_amax(amax: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """:func:`kernels.quantize.scale_from_amax`.  An operator while compiling, although it is plain
    PyTorch: the compiler would fuse its division into generated code, which need not round it
    correctly, and S must come out the same bits as in eager mode."""
    return _scale_from_amax_op(amax, fmt) if _compiling() else Q.scale_from_amax(amax, fmt)


def quantize_groups(x: torch.Tensor, granularity: str, fmt: str = "e4m3") -> Q.Quantized:
    """:func:`kernels.quantize.quantize_rowwise`, ``quantize_1x128`` or ``quantize_128x128`` by
    ``granularity`` ("row", "1x128", "128x128"), on a 2-D ``x``."""
    if granularity not in GROUPED:
        raise ValueError(f"granularity must be one of {list(GROUPED)}, got {granularity!r}")
    if _compiling():
        return Q.Quantized(*_quantize_groups_op(x, granularity, fmt))
    return Q.quantize(x, granularity, fmt)


def quantize_columns_transposed(x: torch.Tensor, fmt: str = "e4m3") -> Q.Quantized:
    """:func:`kernels.quantize.quantize_columns_transposed`."""
    if _compiling():
        return Q.Quantized(*_quantize_columns_transposed_op(x, fmt))
    return Q.quantize_columns_transposed(x, fmt)


def fp8_gemm(a, b, a_scale, b_scale, scaling: str = "tensor", out_dtype=torch.bfloat16) -> torch.Tensor:
    """:func:`kernels.fp8_gemm.fp8_gemm` (the default kernel)."""
    if _compiling():
        return _fp8_gemm_op(a, b, a_scale, b_scale, scaling, out_dtype)
    return G.fp8_gemm(a, b, a_scale, b_scale, scaling, out_dtype)


def fp8_gemm_quantized(qa: Q.Quantized, qb: Q.Quantized, scaling: str = "tensor", out_dtype=torch.bfloat16):
    """:func:`fp8_gemm` of two operands that this package's quantizers made (an FP8 layer's GEMMs): in
    eager mode without the argument checks, which such operands pass by construction
    (:func:`kernels.fp8_gemm.fp8_gemm_unchecked`)."""
    if _compiling():
        return _fp8_gemm_op(qa.q, qb.q, qa.s, qb.s, scaling, out_dtype)
    return G.fp8_gemm_unchecked(qa.q, qb.q, qa.s, qb.s, scaling, out_dtype)


__all__ = [
    "GROUPED",
    "NAMESPACE",
    "fp8_gemm",
    "fp8_gemm_quantized",
    "quantize_columns_transposed",
    "quantize_groups",
    "quantize_tensor",
    "quantize_tensor_and_transpose",
    "quantize_tensor_with_scale",
    "scale_from_amax",
    "tensor_amax",
]
