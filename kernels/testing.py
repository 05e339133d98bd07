"""Comparison helpers that every lab, chapter and test uses.

They never answer with a bare ``False``: they print max_abs and max_rel even on success (that is
the regression signal), name the first mismatching indices, and report NaN/inf disagreement apart
from ordinary rounding error.
"""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    why: str


# (operation, output dtype) -> tolerance against a float64 reference.  Exact operations (casts,
# encodings, packing) are compared bit for bit instead, with ``assert_bits_equal``.
TOLERANCES = {
    ("gemm", torch.float32): Tolerance(1e-5, 1e-5, "fp32 inputs, fp32 accumulation: K rounding steps of 2^-24"),
    ("gemm", torch.bfloat16): Tolerance(1e-2, 1e-2, "bf16 output: one rounding of 2^-8 dominates the fp32 sum"),
    ("gemm", torch.float16): Tolerance(1e-3, 1e-3, "fp16 output: one rounding of 2^-11"),
    ("gemm_fp8", torch.bfloat16): Tolerance(
        5e-2, 5e-2, "fp8 inputs carry 2^-4 (e4m3) relative error each; Hopper's fp8 accumulator keeps ~13 bits"
    ),
    ("gemm_chain", torch.bfloat16): Tolerance(5e-3, 5e-3, "two bf16 GEMMs whose errors partly cancel"),
    ("rmsnorm", torch.bfloat16): Tolerance(0.0, 2.0**-7, "fp32 statistics, one bf16 rounding; they can tip a tie"),
    ("softmax", torch.bfloat16): Tolerance(1e-3, 1e-3, "fp32 max/sum, outputs in [0, 1] rounded once"),
    ("elementwise", torch.float32): Tolerance(1e-6, 1e-6, "one or two fp32 roundings"),
    ("elementwise", torch.bfloat16): Tolerance(0.0, 2.0**-8, "at most one bf16 rounding: half a ulp"),
    ("elementwise", torch.float16): Tolerance(0.0, 2.0**-11, "at most one fp16 rounding: half a ulp"),
}


def tolerance(op: str, dtype: torch.dtype) -> Tolerance:
    try:
        return TOLERANCES[(op, dtype)]
    except KeyError:
        known = sorted({f"{o}/{d}".replace("torch.", "") for o, d in TOLERANCES})
        raise KeyError(f"no tolerance for op={op!r} dtype={dtype}; known: {', '.join(known)}") from None


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _fmt_index(flat_index: int, shape) -> str:
    return str(tuple(int(i) for i in np.unravel_index(flat_index, shape))) if len(shape) > 1 else str(flat_index)


def first_mismatches(inputs, got, want, bad, what: str = "", limit: int = 8) -> str:
    """A readable list of the first mismatching positions: index, input, got and wanted values."""
    inputs, got, want = np.asarray(inputs), np.asarray(got), np.asarray(want)
    bad = np.asarray(bad).ravel()
    head = f"{what}: {bad.size} of {got.size} differ" if what else f"{bad.size} of {got.size} differ"
    lines = [head]
    flat_in = inputs.reshape(got.size, -1) if inputs.size >= got.size else None
    for i in bad[:limit]:
        src = ""
        if flat_in is not None:
            src = " input " + ",".join(_show(v) for v in flat_in[i])
        lines.append(f"  [{_fmt_index(i, got.shape)}]{src}: got {_show(got.flat[i])}, want {_show(want.flat[i])}")
    return "\n".join(lines)


def _show(v) -> str:
    if np.issubdtype(np.asarray(v).dtype, np.integer):
        return hex(int(v))
    return f"{float(v):.9g}"


@dataclass
class Comparison:
    name: str
    max_abs: float
    max_rel: float
    mismatches: int
    total: int
    report: str

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def __str__(self) -> str:
        return self.report


def compare(ours, ref, atol: float = 1e-2, rtol: float = 1e-2, name: str = "kernel") -> Comparison:
    """Compare ``ours`` with ``ref`` elementwise: |ours - ref| <= atol + rtol * |ref|.

    NaN must appear exactly where the reference has NaN; inf must match in position and sign.
    """
    a = _as_numpy(ours).astype(np.float64)
    b = _as_numpy(ref).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"{name}: shape {a.shape} does not match the reference's {b.shape}")
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    finite = ~(nan_a | nan_b | inf_a | inf_b)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(a - b), 0.0)
        rel = np.where(finite, diff / (np.abs(b) + 1e-6), 0.0)
        bad_value = finite & (diff > atol + rtol * np.abs(b))
    bad_nan = nan_a != nan_b
    bad_inf = (inf_a | inf_b) & ~(nan_a | nan_b) & (a != b)
    bad = bad_value | bad_nan | bad_inf
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    lines = [
        f"[{name}] max_abs={max_abs:.4e}  max_rel={max_rel:.4e}  "
        f"mismatches={int(bad.sum())}/{a.size} (atol={atol:g}, rtol={rtol:g})"
    ]
    if bad_nan.any():
        extra = int((nan_a & ~nan_b).sum())
        missing = int((nan_b & ~nan_a).sum())
        lines.append(f"  NaN disagreement: {extra} NaN where the reference has none, {missing} missing")
    if bad_inf.any():
        lines.append(f"  inf disagreement at {int(bad_inf.sum())} positions")
    if bad.any():
        idx = np.flatnonzero(bad)
        lines.append(first_mismatches(np.empty(0), a, b, idx, what="first mismatches"))
    return Comparison(name, max_abs, max_rel, int(bad.sum()), a.size, "\n".join(lines))


def verify(ours, ref, atol: float = 1e-2, rtol: float = 1e-2, name: str = "kernel") -> Comparison:
    """``compare``, print the summary (always), and raise ``AssertionError`` on any mismatch."""
    result = compare(ours, ref, atol=atol, rtol=rtol, name=name)
    print(result.report.splitlines()[0])
    if not result.ok:
        raise AssertionError(result.report)
    return result


# -- exact comparisons -------------------------------------------------------------------------

_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def frobenius_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want||_F / ||want||_F`` in float64: one number for a whole matrix, the measure of the
    FP8 layer's tolerances (per-element or per-row errors are :func:`kernels.accumulate.relative_error`)."""
    g, w = got.detach().double(), want.detach().double()
    return float((g - w).norm() / w.norm().clamp_min(1e-300))


def bits(x: torch.Tensor) -> np.ndarray:
    """Raw bit patterns of a tensor as unsigned integers (uint8/16/32/64)."""
    view = x.detach().cpu().contiguous().view(_BITS_VIEW[x.element_size()]).numpy()
    return view.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.element_size()])


def code_distance(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Distance in representable values ("ULPs") between two tensors of the same float dtype.

    Sign-magnitude bit patterns are mapped onto a monotone integer line, so +0 and -0 are one step
    apart and the largest finite value is one step from inf.  NaN positions give -1.
    """
    if a.dtype != b.dtype:
        raise TypeError(f"code_distance needs one dtype, got {a.dtype} and {b.dtype}")
    width = a.element_size() * 8
    ia, ib = (bits(t).astype(np.int64) for t in (a, b))
    sign = np.int64(1) << (width - 1)

    def ordered(i):
        return np.where(i & sign, -(i & (sign - 1)) - 1, i)

    dist = np.abs(ordered(ia) - ordered(ib))
    nan = torch.isnan(a.float()).cpu().numpy() | torch.isnan(b.float()).cpu().numpy()
    return np.where(nan, -1, dist)


def assert_bits_equal(ours: torch.Tensor, ref: torch.Tensor, name: str = "kernel", inputs=None) -> None:
    """Exact operations are compared bit for bit; prints the count even on success."""
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        raise AssertionError(f"[{name}] got {tuple(ours.shape)} {ours.dtype}, want {tuple(ref.shape)} {ref.dtype}")
    got, want = bits(ours), bits(ref)
    bad = np.flatnonzero(got != want)
    print(f"[{name}] {got.size - bad.size}/{got.size} bit-identical")
    if bad.size:
        shown = inputs if inputs is not None else np.empty(0)
        if isinstance(shown, torch.Tensor):
            shown = _as_numpy(shown)
        raise AssertionError(first_mismatches(shown, got.reshape(ours.shape), want.reshape(ours.shape), bad, what=name))


# -- the standard kernel test --------------------------------------------------------------------

STANDARD_SHAPES = ((1,), (7,), (127,), (1003,), (4096 + 3,))


def adversarial_inputs(shape, dtype=torch.float32, seed: int = 0, device="cpu") -> dict:
    """Named input tensors every kernel must survive."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    randn = torch.randn(n, generator=g)
    outlier = randn.clone()
    outlier[n // 2] = 1e4
    cases = {
        "random": randn,
        "zeros": torch.zeros(n),
        "all-equal": torch.full((n,), 0.75),
        "large (1e4)": randn * 1e4,
        "tiny (1e-30)": randn * 1e-30,
        "one outlier": outlier,
    }
    return {k: v.reshape(shape).to(dtype).to(device) for k, v in cases.items()}


def special_inputs(shape, dtype=torch.float32, seed: int = 0, device="cpu") -> dict:
    """Named inputs for kernels that must also handle what a format cannot hold: random (spread over
    several binades), zeros, negative zeros, all-equal, one outlier, NaN and +-inf scattered through,
    ``dtype``'s subnormals and values near its largest finite."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    randn = torch.randn(n, generator=g) * 3
    outlier = randn.clone()
    outlier[n // 2] = 1e4
    special = randn.clone()
    special[:: max(n // 5, 1)] = float("nan")
    special[1 :: max(n // 4, 1)] = float("inf")
    special[2 :: max(n // 3, 1)] = -float("inf")
    info = torch.finfo(dtype)
    cases = {
        "random": randn,
        "zeros": torch.zeros(n),
        "negative zeros": -torch.zeros(n),
        "all-equal": torch.full((n,), -0.75),
        "one outlier": outlier,
        "nan/inf": special,
        "subnormals": randn * info.tiny * 2.0**-3,
        "huge": randn.clamp(-3, 3) * (info.max / 4),
    }
    return {k: v.reshape(shape).to(dtype).to(device) for k, v in cases.items()}


def check_kernel(
    fn,
    ref,
    *,
    dtype=torch.float32,
    shapes=STANDARD_SHAPES,
    seeds=(0, 1, 2),
    atol: float = 0.0,
    rtol: float = 0.0,
    exact: bool = False,
    device="cpu",
    name=None,
):
    """Run ``fn`` and ``ref`` over several shapes, seeds and adversarial inputs.

    ``exact=True`` compares bits; otherwise values within (atol, rtol).  NaN must never appear
    where the reference has none.  Returns the number of cases checked; raises on the first failure
    with the case named.
    """
    name = name or getattr(fn, "__name__", "kernel")
    checked = 0
    for shape in shapes:
        for seed in seeds:
            for case, x in adversarial_inputs(shape, dtype, seed, device).items():
                label = f"{name} shape={shape} seed={seed} input={case}"
                got, want = fn(x), ref(x)
                if exact:
                    got_b, want_b = bits(got), bits(want)
                    bad = np.flatnonzero(got_b != want_b)
                    if bad.size:
                        raise AssertionError(
                            first_mismatches(bits(x).reshape(-1, 1), got_b.ravel(), want_b.ravel(), bad, what=label)
                        )
                else:
                    result = compare(got, want, atol=atol, rtol=rtol, name=label)
                    if not result.ok:
                        raise AssertionError(result.report)
                checked += 1
    return checked


__all__ = [
    "Comparison",
    "STANDARD_SHAPES",
    "TOLERANCES",
    "Tolerance",
    "adversarial_inputs",
    "assert_bits_equal",
    "bits",
    "check_kernel",
    "code_distance",
    "compare",
    "first_mismatches",
    "frobenius_error",
    "special_inputs",
    "tolerance",
    "verify",
]
