"""Probe kernels that expose how Triton rounds: casts, bf16/fp16 arithmetic and ``tl.dot``.

The same kernels run in two places:

* on a Hopper GPU, compiled, by ``tests/data/record_hopper_numerics.py``, which stores the bits
  they produce in ``tests/data/hopper_numerics.npz``;
* on the CPU, in Triton's interpreter as corrected by :mod:`kernels._interpreter`, by
  ``tests/test_interpreter.py``, which demands the same bits.

Inputs are built here, on the CPU, deterministically, and stored beside the outputs, so the test
replays exactly the recorded inputs.
"""

import ml_dtypes
import numpy as np
import torch
import triton
import triton.language as tl

# Name used in the .npz -> (torch dtype, numpy dtype that decodes it exactly, unsigned bits dtype)
FORMATS = {
    "fp32": (torch.float32, np.float32, np.uint32),
    "bf16": (torch.bfloat16, ml_dtypes.bfloat16, np.uint16),
    "fp16": (torch.float16, np.float16, np.uint16),
    "e4m3": (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, np.uint8),
    "e5m2": (torch.float8_e5m2, ml_dtypes.float8_e5m2, np.uint8),
}

# Which conversions the table covers: every format to every other, except fp8 -> fp8, which
# Triton does not lower directly.
CASTS = [
    (src, dst)
    for src in FORMATS
    for dst in FORMATS
    if src != dst and not (src in ("e4m3", "e5m2") and dst in ("e4m3", "e5m2"))
]

BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "lt")

# (operand format, input_precision) for tl.dot; "default" leaves Triton's default.
DOTS = [
    ("bf16", "default"),
    ("fp16", "default"),
    ("e4m3", "default"),
    ("e5m2", "default"),
    ("fp32", "ieee"),
    ("fp32", "tf32"),
]
DOT_M, DOT_N, DOT_K, DOT_BLOCK_K = 64, 64, 512, 64

BLOCK = 1024


def to_bits(t: torch.Tensor) -> np.ndarray:
    """The raw bit patterns of a tensor, as unsigned integers of the same width."""
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()]
    return t.detach().cpu().contiguous().view(bits).numpy().view(unsigned)


def from_bits(bits: np.ndarray, fmt: str, device) -> torch.Tensor:
    """A tensor of format ``fmt`` holding exactly the bit patterns ``bits``."""
    torch_dtype, _, unsigned = FORMATS[fmt]
    signed = {1: np.int8, 2: np.int16, 4: np.int32}[np.dtype(unsigned).itemsize]
    raw = torch.from_numpy(np.ascontiguousarray(bits.astype(unsigned)).view(signed))
    return raw.view(torch_dtype).to(device)


# ----------------------------------------------------------------------------------------------
# Inputs


def all_patterns(fmt: str) -> np.ndarray:
    """Every bit pattern of an 8- or 16-bit format."""
    _, _, unsigned = FORMATS[fmt]
    return np.arange(np.iinfo(unsigned).max + 1, dtype=np.uint64).astype(unsigned)


def _grid_and_midpoints(fmt: str) -> np.ndarray:
    """Every finite value of ``fmt``, every midpoint between neighbours (the ties), the midpoint
    above the largest finite value, and the float32 neighbours of each midpoint, as float32 bits."""
    _, np_dtype, _ = FORMATS[fmt]
    vals = all_patterns(fmt).view(np_dtype).astype(np.float64)
    vals = np.unique(np.abs(vals[np.isfinite(vals)]))  # sorted, 0 first
    step_top = vals[-1] - vals[-2]
    mids = np.concatenate([(vals[:-1] + vals[1:]) / 2, [vals[-1] + step_top / 2, vals[-1] + step_top]])
    mids32 = mids.astype(np.float32)  # exact: every format here has < 24 significand bits
    pts = np.concatenate(
        [vals.astype(np.float32), mids32, np.nextafter(mids32, np.float32(np.inf)), np.nextafter(mids32, np.float32(0))]
    )
    pts = np.concatenate([pts, -pts])
    return pts.view(np.uint32)


def adversarial_fp32(seed: int = 0) -> np.ndarray:
    """float32 inputs chosen to break a wrong conversion: every bf16 value with its ties and their
    neighbours, the grids and ties of fp16/e4m3/e5m2, subnormals, overflow, inf, NaNs, random bits."""
    rng = np.random.default_rng(seed)
    hi = all_patterns("bf16").astype(np.uint32) << 16
    parts = [hi, hi | 0x8000, hi | 0x7FFF, hi | 0x8001]
    parts += [_grid_and_midpoints(f) for f in ("fp16", "e4m3", "e5m2")]
    subnormal = rng.integers(1, 1 << 23, 1 << 14, dtype=np.uint32)
    parts += [subnormal, subnormal | 0x80000000]
    overflow = np.geomspace(400.0, 3.0e38, 4096).astype(np.float32)
    parts += [overflow.view(np.uint32), (-overflow).view(np.uint32)]
    specials = np.array(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,  # +-0, +-inf
            0x7FC00000,
            0xFFC00000,
            0x7F800001,
            0xFF800001,  # quiet / signalling NaN
            0x7FFFFFFF,
            0xFFFFFFFF,
            0x7FA00000,
            0x7FC00001,  # NaN payloads
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x00800000,
            0x00000001,
        ],
        dtype=np.uint32,
    )
    parts += [specials, rng.integers(0, 1 << 32, 1 << 17, dtype=np.uint64).astype(np.uint32)]
    return np.concatenate(parts)


def cast_inputs(src: str) -> np.ndarray:
    """The bit patterns fed to every conversion from ``src``."""
    return adversarial_fp32() if src == "fp32" else all_patterns(src)


def binary_inputs(seed: int = 1):
    """Pairs of bf16 bit patterns: random, plus all-pairs of the special and boundary values."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32).astype(np.uint16)
    b = rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32).astype(np.uint16)
    # 0, -0, 1, -1, min subnormal, min normal, max, inf, -inf, qNaN, NaN with payload, 3, 1/3-ish
    special = np.array(
        [0x0000, 0x8000, 0x3F80, 0xBF80, 0x0001, 0x0080, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x7FA1, 0x4040, 0x3EAB],
        dtype=np.uint16,
    )
    sa, sb = np.meshgrid(special, special)
    # close values (catastrophic cancellation), and values 2^8 apart (alignment shifts)
    close_a = rng.integers(0x3F80, 0x4000, 4096, dtype=np.uint32).astype(np.uint16)
    close_b = close_a + rng.integers(-3, 4, 4096).astype(np.int32).astype(np.uint16)
    far_b = close_a - np.uint16(8 << 7)
    a = np.concatenate([a, sa.ravel(), close_a, close_a])
    b = np.concatenate([b, sb.ravel(), close_b, far_b])
    return a, b


def dot_inputs(fmt: str, seed: int = 2):
    """Random (M, K) and (K, N) operands in ``fmt``, some entries scaled by powers of two so that
    products of different magnitudes meet in the accumulator."""
    rng = np.random.default_rng(seed + len(fmt))
    limit = {"e4m3": 1.0, "e5m2": 1.0}.get(fmt, 4.0)
    a = rng.standard_normal((DOT_M, DOT_K)) * np.exp2(rng.integers(-6, 3, (DOT_M, DOT_K))) * limit
    b = rng.standard_normal((DOT_K, DOT_N)) * np.exp2(rng.integers(-6, 3, (DOT_K, DOT_N))) * limit
    _, np_dtype, _ = FORMATS[fmt]
    # numpy/ml_dtypes round to nearest even; all values are far below every format's maximum
    a = a.astype(np.float32).astype(np_dtype)
    b = b.astype(np.float32).astype(np_dtype)
    _, _, unsigned = FORMATS[fmt]
    return a.view(unsigned), b.view(unsigned)


# ----------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _binary_kernel(a_ptr, b_ptr, add_ptr, sub_ptr, mul_ptr, div_ptr, max_ptr, min_ptr, lt_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(add_ptr + offs, a + b, mask=mask)
    tl.store(sub_ptr + offs, a - b, mask=mask)
    tl.store(mul_ptr + offs, a * b, mask=mask)
    tl.store(div_ptr + offs, a / b, mask=mask)
    tl.store(max_ptr + offs, tl.maximum(a, b), mask=mask)
    tl.store(min_ptr + offs, tl.minimum(a, b), mask=mask)
    tl.store(lt_ptr + offs, (a < b).to(tl.int8), mask=mask)


@triton.jit
def _dot_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((M, N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])  # (M, BLOCK_K)
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])  # (BLOCK_K, N)
        if INPUT_PRECISION == "default":
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def cast(bits: np.ndarray, src: str, dst: str, device) -> np.ndarray:
    """Convert with Triton's ``x.to(dst)``; returns the output bit patterns."""
    x = from_bits(bits, src, device)
    y = torch.empty(x.shape, dtype=FORMATS[dst][0], device=device)
    cast_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return to_bits(y)


def binary(a_bits: np.ndarray, b_bits: np.ndarray, fmt: str, device) -> dict:
    """Elementwise arithmetic and comparisons in ``fmt``; returns output bits per op."""
    a, b = from_bits(a_bits, fmt, device), from_bits(b_bits, fmt, device)
    outs = {op: torch.empty_like(a) for op in BINARY_OPS if op != "lt"}
    outs["lt"] = torch.empty(a.shape, dtype=torch.int8, device=device)
    _binary_kernel[(triton.cdiv(a.numel(), BLOCK),)](a, b, *(outs[op] for op in BINARY_OPS), a.numel(), BLOCK=BLOCK)
    return {op: to_bits(t) for op, t in outs.items()}


def dot(a_bits: np.ndarray, b_bits: np.ndarray, fmt: str, precision, device) -> np.ndarray:
    """fp32-accumulated ``tl.dot`` of (M, K) x (K, N) operands in ``fmt``; returns fp32 bits."""
    a, b = from_bits(a_bits, fmt, device), from_bits(b_bits, fmt, device)
    c = torch.empty((DOT_M, DOT_N), dtype=torch.float32, device=device)
    _dot_kernel[(1,)](a, b, c, DOT_M, DOT_N, DOT_K, DOT_BLOCK_K, precision)
    return to_bits(c)


def run_all(device, on_error=None) -> dict:
    """Every probe, as {name: array}: the inputs and the bits that ``device`` produced.

    ``on_error(name, exc)``, if given, is called for a probe that raises, and the rest still run."""
    out = {}

    def attempt(name, fn, *args):
        if on_error is None:
            return fn(*args)
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - recorded and reported by the caller
            on_error(name, exc)
            return None

    for src in FORMATS:
        out[f"in_{src}"] = cast_inputs(src)
    for src, dst in CASTS:
        res = attempt(f"cast_{src}_{dst}", cast, out[f"in_{src}"], src, dst, device)
        if res is not None:
            out[f"cast_{src}_{dst}"] = res
    a, b = binary_inputs()
    out["binary_a"], out["binary_b"] = a, b
    for fmt in ("bf16", "fp16"):
        res = attempt(f"binary_{fmt}", binary, a, b, fmt, device)
        for op, bits in (res or {}).items():
            out[f"binary_{fmt}_{op}"] = bits
    for fmt, precision in DOTS:
        a, b = dot_inputs(fmt)
        key = f"dot_{fmt}_{precision}"
        out[f"{key}_a"], out[f"{key}_b"] = a, b
        res = attempt(key, dot, a, b, fmt, precision, device)
        if res is not None:
            out[key] = res
    return out


# ----------------------------------------------------------------------------------------------
# Approximate fp32 math: what `/`, tl.sqrt, tl.rsqrt, tl.exp, tl.exp2, tl.log and tl.log2 give compiled

# On sm_90, Triton 3.6 lowers fp32 `x / y` to div.full.f32, tl.sqrt / tl.rsqrt / tl.exp2 to the
# sqrt / rsqrt / ex2 .approx.ftz instructions, tl.exp to an fp32 multiply by log2(e) and ex2.approx.f32,
# and tl.log / tl.log2 to libdevice's logf / log2f (an fp32 polynomial).
APPROX_OPS = ("div", "sqrt", "rsqrt", "exp", "exp2", "log", "log2")

# The special-function unit's instructions, each read directly through inline PTX, over the domain
# that determines all of its results: a mantissa (rcp), a mantissa and the exponent's parity (sqrt,
# rsqrt), a 23-bit fixed-point fraction of either sign (ex2).
MUFU = {
    "rcp": "rcp.approx.ftz.f32 $0, $1;",
    "sqrt": "sqrt.approx.ftz.f32 $0, $1;",
    "rsqrt": "rsqrt.approx.ftz.f32 $0, $1;",
    "ex2": "ex2.approx.ftz.f32 $0, $1;",
}


@triton.jit
def _approx_kernel(x_ptr, y_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if OP == "div":
        out = x / tl.load(y_ptr + offs, mask=mask)
    elif OP == "sqrt":
        out = tl.sqrt(x)
    elif OP == "rsqrt":
        out = tl.rsqrt(x)
    elif OP == "exp":
        out = tl.exp(x)
    elif OP == "exp2":
        out = tl.exp2(x)
    elif OP == "log":
        out = tl.log(x)
    else:
        out = tl.log2(x)
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def _mufu_kernel(x_ptr, out_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    out = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(out_ptr + offs, out, mask=mask)


def approx_inputs(seed: int = 3, n: int = 1 << 15):
    """(x, y) fp32 bit patterns: random bits, values of every magnitude, [-150, 150] (the range where
    exp2 leaves and re-enters fp32), subnormals, specials, and ``y = 448`` for the FP8 scale ``amax / 448``."""
    rng = np.random.default_rng(seed)

    def random_bits():
        return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)

    def wide():
        return (rng.standard_normal(n) * np.exp2(rng.integers(-126, 127, n))).astype(np.float32).view(np.uint32)

    small = rng.uniform(-150, 150, n).astype(np.float32).view(np.uint32)
    tiny = (rng.standard_normal(n) * np.exp2(rng.integers(-149, -120, n))).astype(np.float32).view(np.uint32)
    amax = rng.uniform(0, 5e4, n).astype(np.float32).view(np.uint32)
    specials = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000, 0xBF800000, 0x00800000,
         0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7E800000, 0x7F000000, 0x42FE0000, 0xC2FC0000, 0x43000000],
        dtype=np.uint32,
    )  # fmt: skip
    sx, sy = np.meshgrid(specials, specials)
    x = np.concatenate([random_bits(), wide(), small, tiny, amax, sx.ravel()])
    y = np.concatenate([random_bits(), wide(), wide(), random_bits(), np.full(n, 448.0, np.float32).view(np.uint32)])
    y = np.concatenate([y, sy.ravel()])
    return x, y


def approx(x_bits: np.ndarray, y_bits: np.ndarray, op: str, device) -> np.ndarray:
    """``op`` (one of :data:`APPROX_OPS`) on fp32 inputs, compiled or in CPU mode; returns output bits."""
    x, y = from_bits(x_bits, "fp32", device), from_bits(y_bits, "fp32", device)
    out = torch.empty_like(x)
    _approx_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), OP=op, BLOCK=BLOCK)
    return to_bits(out)


def mufu_domain(name: str) -> np.ndarray:
    """The fp32 inputs whose results fix every result of a special-function instruction."""
    m = np.arange(1 << 23, dtype=np.uint32)
    if name == "rcp":
        return (127 << 23) | m  # [1, 2)
    if name in ("sqrt", "rsqrt"):
        return np.concatenate([(127 << 23) | m, (128 << 23) | m])  # [1, 4)
    fractions = (m.astype(np.float64) / (1 << 23)).astype(np.float32)  # exact: k / 2^23, k < 2^23
    return (fractions if name == "ex2_pos" else -fractions).view(np.uint32)  # ex2 of either sign


MUFU_TABLES = ("rcp", "sqrt", "rsqrt", "ex2_pos", "ex2_neg")


def mufu(x_bits: np.ndarray, name: str, device) -> np.ndarray:
    """One special-function instruction (``MUFU`` key) on fp32 inputs, on a CUDA GPU only."""
    x = from_bits(x_bits, "fp32", device)
    out = torch.empty_like(x)
    asm = MUFU[name.split("_")[0]]
    _mufu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), ASM=asm, BLOCK=BLOCK)
    return to_bits(out)


def diff_encode(bits: np.ndarray) -> np.ndarray:
    """Bit patterns of a monotone table as int64 first value + small steps (compresses ~100x)."""
    return np.diff(bits.astype(np.int64), prepend=np.int64(0))


def diff_decode(steps: np.ndarray) -> np.ndarray:
    return np.cumsum(steps.astype(np.int64)).astype(np.uint32)


def run_approx(device) -> dict:
    """The approximate-math recording: inputs, each op's output bits, and each instruction's table."""
    x, y = approx_inputs()
    out = {"approx_x": x, "approx_y": y}
    for op in APPROX_OPS:
        out[f"approx_{op}"] = approx(x, y, op, device)
    return out


def run_mufu_tables(device) -> dict:
    out = {}
    for name in MUFU_TABLES:
        steps = diff_encode(mufu(mufu_domain(name), name, device))
        small = np.abs(steps[1:]).max() < 127
        out[f"{name}_first"] = steps[:1]
        out[f"{name}_steps"] = steps[1:].astype(np.int8 if small else np.int32)
    return out


__all__ = [
    "APPROX_OPS",
    "BINARY_OPS",
    "BLOCK",
    "CASTS",
    "DOTS",
    "FORMATS",
    "MUFU",
    "MUFU_TABLES",
    "adversarial_fp32",
    "all_patterns",
    "approx",
    "approx_inputs",
    "binary",
    "binary_inputs",
    "cast",
    "cast_inputs",
    "cast_kernel",
    "diff_decode",
    "diff_encode",
    "dot",
    "dot_inputs",
    "from_bits",
    "mufu",
    "mufu_domain",
    "run_all",
    "run_approx",
    "run_mufu_tables",
    "to_bits",
]
