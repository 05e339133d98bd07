"""Lab 3's checks pass the right answers and catch each wrong one with the right diagnosis.

``WRONG_SOLUTIONS`` holds, per question, deliberately wrong solutions written the way a student would
get them wrong, each with a phrase its diagnosis must contain.  The stochastic-rounding test is
statistical; with its fixed seeds it passes the package's kernel for every seed set tried here and
fails each biased rounding.
"""

import importlib.util
import math
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import accumulate, formats, hazards, stochastic
from kernels.checks import ExerciseNotDone, lab03, passes
from kernels.device import default_device

DEVICE = default_device()

# -- q1: stochastic rounding, written in torch with the package's random bits ---------------------------


def student_sr(x, fmt, seed, *, noise="right", shared=False, ignore_seed=False, saturate=None, nan_case=True):
    """Stochastic rounding by the integer recipe, with switches for the mistakes students make."""
    spec = formats.ENCODE_SPECS[fmt]
    m = spec.mantissa_bits
    saturate = fmt != "bf16" if saturate is None else saturate  # as the hardware conversion
    b = x.detach().cpu().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    n = b.numel()
    seed = 0 if ignore_seed else seed
    rand = stochastic.random_bits(1 if shared else n, seed).expand(n) if shared else stochastic.random_bits(n, seed)
    rand = rand.reshape(b.shape)
    sign, mag = (b >> 31) & 1, b & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    if saturate:
        mag = mag.clamp(max=spec.max_f32)
    e32 = mag >> 23
    e = e32.clamp(min=1) - (127 - spec.bias)
    e1 = e.clamp(min=1)
    sig = torch.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    v = sig + ((e1 - 1) << 23)
    d = ((23 - m) + (e1 - e)).clamp(max=40)
    width = {"right": d, "narrow": d - 1, "wide": d + 1}[noise]
    code = (v + (rand & ((1 << width.clamp(max=32)) - 1))) >> d
    code = code.clamp(max=spec.max_code) if saturate else torch.where(code > spec.max_code, spec.overflow_code, code)
    out = code | (sign << (spec.width - 1))
    if nan_case:
        out = torch.where(is_nan, spec.sat_nan, out)
    int_dtype = torch.uint8 if spec.width == 8 else torch.int16
    return formats.from_codes(out, int_dtype).view(formats.TORCH_DTYPES[fmt]).to(x.device)


def fresh_seed_each_call():
    calls = iter(range(1000, 2000))
    return lambda x, fmt, seed: stochastic.stochastic_round(x, fmt, next(calls))


# -- q2: dot products in NumPy, right and wrong ----------------------------------------------------------


def student_dot(a, b, acc, compensated, *, force_acc=None, kahan_sign=1, apply_kahan=True, other=0.0, lanes=16):
    import ml_dtypes

    acc = force_acc or acc
    t = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}[acc]
    p = a.cpu().float().numpy() * b.cpu().float().numpy()
    M, K = p.shape
    padded = np.full((M, -(-K // lanes) * lanes), other, np.float32)
    padded[:, :K] = p
    s = np.zeros((M, lanes), t)
    c = np.zeros((M, lanes), t)
    f = np.float32
    for i in range(0, padded.shape[1], lanes):
        x = padded[:, i : i + lanes].astype(t)
        if compensated and apply_kahan:
            y = (x.astype(f) - c.astype(f)).astype(t)
            tt = (s.astype(f) + y.astype(f)).astype(t)
            lost = ((tt.astype(f) - s.astype(f)).astype(t).astype(f) - y.astype(f)).astype(t)
            c = lost if kahan_sign > 0 else (-lost.astype(f)).astype(t)
            s = tt
        else:
            s = (s.astype(f) + x.astype(f)).astype(t)
    total = s.astype(f).sum(axis=1) - (c.astype(f).sum(axis=1) if compensated else 0)
    return torch.from_numpy(total.astype(np.float32)).to(a.device)


# -- q3: FP8 matmuls, right and wrong ------------------------------------------------------------------


def drops_k_tail(a, b, pe):
    k = a.shape[1] // 32 * 32
    return accumulate.fp8_matmul(a[:, :k].contiguous(), b[:k].contiguous(), pe)


# -- q8: bf16 conversions --------------------------------------------------------------------------------


def ties_away(x):
    b = x.detach().cpu().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = torch.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FFF, (b + 0x8000) >> 16)
    return formats.from_codes(out, torch.int16).view(torch.bfloat16).to(x.device)


WRONG_SOLUTIONS = {
    "q1": {
        "round to nearest even (deterministic)": lambda x, fmt, seed: formats.hardware_encode(x, fmt),
        "noise one bit too narrow": lambda x, fmt, seed: student_sr(x, fmt, seed, noise="narrow"),
        "noise one bit too wide": lambda x, fmt, seed: student_sr(x, fmt, seed, noise="wide"),
        "one random number for all elements": lambda x, fmt, seed: student_sr(x, fmt, seed, shared=True),
        "seed ignored": lambda x, fmt, seed: student_sr(x, fmt, seed, ignore_seed=True),
        "no saturation": lambda x, fmt, seed: student_sr(x, fmt, seed, saturate=False),
        "NaN not handled": lambda x, fmt, seed: student_sr(x, fmt, seed, nan_case=False),
        "a new seed every call": fresh_seed_each_call(),
    },
    "q2": {
        "accumulator always fp32": lambda a, b, acc, c: student_dot(a, b, acc, c, force_acc="fp32"),
        "Kahan correction with the wrong sign": lambda a, b, acc, c: student_dot(a, b, acc, c, kahan_sign=-1),
        "compensation never applied": lambda a, b, acc, c: student_dot(a, b, acc, c, apply_kahan=False),
        "masked loads read 1.0 beyond K": lambda a, b, acc, c: student_dot(a, b, acc, c, other=1.0),
        "bf16 accumulator for fp16": lambda a, b, acc, c: student_dot(
            a, b, acc, c, force_acc="bf16" if acc == "fp16" else None
        ),
    },
    "q3": {
        "never promotes": lambda a, b, pe: accumulate.fp8_matmul(a, b, None),
        "always promotes every 128": lambda a, b, pe: accumulate.fp8_matmul(a, b, 128),
        "promotes after every tl.dot": lambda a, b, pe: accumulate.fp8_matmul(a, b, 32 if pe else None),
        "K tail dropped": drops_k_tail,
    },
    "q4": {"bf16 accumulator": lambda x: hazards.row_mean(x, "bf16")},
    "q5": {"mask value 0 instead of -inf": lambda x: hazards.softmax(x, other=0.0)},
    "q6": {"scale applied after the cast": lambda x: hazards.quantize_fp8(x, scale_first=False)},
    "q7": {"missing fp32 promotion": lambda x: hazards.variance(x, promote=False)},
    "q8": {"truncation instead of rounding": lambda x: hazards.to_bf16(x, truncate=True), "ties away": ties_away},
}

EXPECTED = {
    ("q1", "round to nearest even (deterministic)"): ["deterministic", "rounds to nearest"],
    ("q1", "noise one bit too narrow"): ["biased toward zero", "uniform over exactly the dropped bits"],
    ("q1", "noise one bit too wide"): ["an exactly representable value must come back unchanged"],
    ("q1", "one random number for all elements"): ["one random number for all elements"],
    ("q1", "seed ignored"): ["the seed changes nothing"],
    ("q1", "no saturation"): ["500: 500 -> nan, want 448", "clip |x| to 448"],
    ("q1", "NaN not handled"): ["NaN: nan -> inf", "a NaN must stay NaN"],
    ("q1", "a new seed every call"): ["not reproducible"],
    ("q2", "accumulator always fp32"): ["what a wider accumulator gives"],
    ("q2", "Kahan correction with the wrong sign"): ["worse than without it"],
    ("q2", "compensation never applied"): ["Kahan should cut it"],
    ("q2", "masked loads read 1.0 beyond K"): ["far beyond fp32 rounding"],
    ("q2", "bf16 accumulator for fp16"): ["more than a fp16 accumulator loses"],
    ("q3", "never promotes"): ["small partial sums were lost"],
    ("q3", "always promotes every 128"): ["promote_every=None", "promoted anyway"],
    ("q3", "promotes after every tl.dot"): ["small partial sums were lost"],
    ("q3", "K tail dropped"): ["K=300"],
    ("q4", "bf16 accumulator"): ["error grows with N", "accumulate in fp32"],
    ("q5", "mask value 0 instead of -inf"): ["all zeros", "wrong only when N is not a power of two", "-inf"],
    ("q6", "scale applied after the cast"): ["came back as zero", "clipped", "before the cast"],
    ("q7", "missing fp32 promotion"): ["NaN only at large N", "Promote x to fp32"],
    ("q8", "truncation instead of rounding"): ["biased toward zero"],
    ("q8", "ties away"): ["differ"],
}

CHECKS = {
    "q1": lab03.check_stochastic_round,
    "q2": lab03.check_accumulate,
    "q3": lab03.check_fp8_promotion,
    "q4": lab03.check_row_mean,
    "q5": lab03.check_softmax,
    "q6": lab03.check_quantize,
    "q7": lab03.check_variance,
    "q8": lab03.check_to_bf16,
}

RIGHT = {
    "q1": lambda x, fmt, seed: stochastic.stochastic_round(x, fmt, seed),
    "q2": lambda a, b, acc, c: accumulate.dot(a, b, acc, c),
    "q3": lambda a, b, pe: accumulate.fp8_matmul(a, b, pe),
    "q4": hazards.row_mean,
    "q5": hazards.softmax,
    "q6": hazards.quantize_fp8,
    "q7": hazards.variance,
    "q8": hazards.to_bf16,
}

CASES = [(q, name) for q, wrongs in WRONG_SOLUTIONS.items() for name in wrongs]


def test_every_question_has_wrong_solutions_with_expectations():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == {f"q{i}" for i in range(1, 9)}
    assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_right_solution_passes(question, capsys):
    CHECKS[question](RIGHT[question])
    assert f"{question} passed" in capsys.readouterr().out


@pytest.mark.parametrize("question, name", CASES)
def test_wrong_solution_is_caught(question, name):
    with pytest.raises(AssertionError) as info:
        CHECKS[question](WRONG_SOLUTIONS[question][name])
    message = str(info.value)
    print(message)
    assert not isinstance(info.value, ExerciseNotDone)
    for phrase in EXPECTED[(question, name)]:
        assert phrase in message, f"{question} {name!r}: {phrase!r} missing from:\n{message}"


@pytest.mark.parametrize("seeds", [(1, 2), (101, 202), (7, 8)])
def test_statistical_test_passes_the_right_rounding_for_other_seeds(seeds):
    lab03.check_stochastic_round(RIGHT["q1"], seeds=seeds)


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_stub_is_not_done(question):
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(ExerciseNotDone):
        CHECKS[question](stub)
    assert not passes(CHECKS[question], None)


def test_wrong_return_type_is_named():
    with pytest.raises(AssertionError, match="must return a torch.Tensor"):
        lab03.check_row_mean(lambda x: x.float().mean(dim=1).tolist())
    with pytest.raises(AssertionError, match="must return \\(q, scale\\)"):
        lab03.check_quantize(lambda x: x.to(torch.float8_e4m3fn))


def test_sr_values_lie_strictly_between_neighbours():
    for fmt in lab03.SR_FORMATS:
        v = torch.from_numpy(lab03.sr_values(fmt))
        lo, hi = stochastic.neighbours(v, fmt)
        assert bool(((lo < v.double()) & (v.double() < hi)).all()), fmt
        assert not math.isnan(float(v.sum()))


# -- the lab as handed out: each starting kernel gets the diagnosis its prose promises -------------------

LAB = Path(__file__).resolve().parents[1] / "labs" / "03_hazards_diagnostics.ipynb"
STARTING_POINTS = {
    # question: (the function the check receives, the phrases its diagnosis must contain)
    "q1": ("stochastic_round", ["deterministic", "always rounds the same way"]),
    "q2": ("dot", ["what a wider accumulator gives"]),
    "q3": ("fp8_matmul", ["small partial sums were lost"]),
    "q4": ("row_mean", ["error grows with N"]),
    "q5": ("softmax", ["all zeros", "-inf"]),
    "q6": ("quantize_fp8", ["came back as zero", "clipped"]),
    "q7": ("variance", ["NaN only at large N"]),
    "q8": ("to_bf16", ["biased toward zero"]),
}


def _lab_namespace(tmp_dir) -> dict:
    """The lab's setup cell and every cell that defines a kernel or a host function (the starting
    points, as a student first sees them), imported from a file: Triton reads a kernel's source."""
    nb = nbformat.read(LAB, as_version=4)
    starts = ("import math", "@triton.jit", "SR_TARGETS", "ACC_TYPES", "def fp8_matmul")
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(starts)]
    header = "from kernels import device\n\ncaps = device.capabilities()\n"
    path = tmp_dir / "lab03_starting_points.py"
    path.write_text(header + "\n\n".join(cells) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


@pytest.fixture(scope="module")
def lab_namespace(tmp_path_factory):
    return _lab_namespace(tmp_path_factory.mktemp("lab03"))


@pytest.mark.parametrize("question", sorted(STARTING_POINTS))
def test_lab_starting_point_gets_its_diagnosis(lab_namespace, question):
    fn_name, phrases = STARTING_POINTS[question]
    with pytest.raises(AssertionError) as info:
        CHECKS[question](lab_namespace[fn_name])
    message = str(info.value)
    print(message)
    assert not isinstance(info.value, ExerciseNotDone)
    for phrase in phrases:
        assert phrase in message, f"{question}: {phrase!r} missing from:\n{message}"


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, kernels that are right by the
# lab's contract but not the lab's own, each differing from it (and from the others) where compiled
# Triton and the interpreter could disagree: other random bits, float instead of integer arithmetic,
# other reductions, masks, tiles and loops.  Every one must pass its check here and get full marks from
# the lab's otter test (``tests/test_wrong_solutions.py``).

SR_TARGETS = {  # what the q1 kernels need to know about each target, as the lab's host function has it
    "bf16": dict(M=7, BIAS=127, MAX_F32=0x7F7F0000, NAN_CODE=0x7FFF, SIGN_SHIFT=15, SATURATE=False),
    "e4m3fn": dict(M=3, BIAS=7, MAX_F32=0x43E00000, NAN_CODE=0x7F, SIGN_SHIFT=7, SATURATE=True),
}
SR_BITS = {"bf16": torch.int16, "e4m3fn": torch.uint8}


@triton.jit
def _sr_wide_noise_kernel(
    x_ptr, y_ptr, n, seed, M: tl.constexpr, BIAS: tl.constexpr, MAX_F32: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, SATURATE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # int32: the Philox counters
    offs = idx.to(tl.int64)  # int64 addresses
    mask = offs < n
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    r0, r1, _, _ = tl.randint4x(seed, idx)  # two 32-bit words make 64 random bits
    noise = (r0.to(tl.uint32, bitcast=True).to(tl.uint64) << 32) | r1.to(tl.uint32, bitcast=True).to(tl.uint64)
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    nan = mag > 0x7F800000
    if SATURATE:
        mag = tl.minimum(mag, MAX_F32)
    e32 = (mag >> 23).to(tl.int32)
    e = tl.maximum(e32, 1) - (127 - BIAS)  # the target's exponent field, if it is normal there
    normal = e >= 1
    sig = tl.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    v = tl.where(normal, mag - ((127 - BIAS) << 23), sig).to(tl.uint64)  # normal: the pattern rebased
    d = tl.where(normal, 23 - M, 24 - M - e)  # bits dropped
    # The TOP d bits of the 64 as the noise; past 56 dropped bits the chance of a carry is below 2^-32:
    # truncate there.
    keep = d <= 56
    dd = tl.where(keep, d, 56).to(tl.uint64)
    code = tl.where(keep, (v + (noise >> (64 - dd))) >> dd, 0)
    out = tl.where(nan, NAN_CODE, code.to(tl.uint32) | (sign << SIGN_SHIFT))
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sr_uniform_kernel(
    x_ptr, y_ptr, n, seed, M: tl.constexpr, BIAS: tl.constexpr, MAX_F32: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, SATURATE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = x.to(tl.uint32, bitcast=True)
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    if SATURATE:
        mag = tl.where(mag > MAX_F32, MAX_F32, mag)  # inf too; NaN is decided on x below
    e32 = (mag >> 23).to(tl.int32)
    e = tl.maximum(e32, 1) - (127 - BIAS)
    normal = e >= 1
    v = tl.where(normal, mag - ((127 - BIAS) << 23), tl.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000))
    d = tl.where(normal, 23 - M, 24 - M - e)
    dc = tl.minimum(d, 31)  # from 24 on every bit of v is dropped anyway
    kept = v >> dc
    low = v - (kept << dc)  # the dropped part, an integer below 2^24
    two_to_minus_d = ((127 - tl.minimum(d, 126)) << 23).to(tl.float32, bitcast=True)
    frac = low.to(tl.float32) * two_to_minus_d  # (x - lo) / (hi - lo), exactly
    up = tl.rand(seed, offs) < frac  # a uniform float in [0, 1) against the fraction
    code = kept + up.to(tl.uint32)
    out = tl.where(x != x, NAN_CODE, code | (sign << SIGN_SHIFT))
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


def _sr_launcher(kernel, block):
    def stochastic_round(x, fmt, seed):
        x = x.contiguous()
        y = torch.empty(x.shape, dtype=formats.TORCH_DTYPES[fmt], device=x.device)
        n = x.numel()
        if n:
            kernel[(triton.cdiv(n, block),)](x, y.view(SR_BITS[fmt]), n, seed, **SR_TARGETS[fmt], BLOCK=block)
        return y

    return stochastic_round


ACC_TYPES = {"fp16": tl.float16, "bf16": tl.bfloat16, "fp32": tl.float32}


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _dot_neumaier_kernel(a_ptr, b_ptr, out_ptr, K, ACC: tl.constexpr, COMPENSATED: tl.constexpr, LANES: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, LANES)
    s = tl.zeros((LANES,), dtype=ACC)
    c = tl.zeros((LANES,), dtype=ACC)
    pa = a_ptr + row * K + lanes
    pb = b_ptr + row * K + lanes
    for k0 in range(0, K, LANES):
        inside = k0 + lanes < K
        x = tl.load(pa, mask=inside)
        y = tl.load(pb, mask=inside)
        p = tl.where(inside, x.to(tl.float32) * y.to(tl.float32), 0.0).to(ACC)
        if COMPENSATED:  # Neumaier: what the addition lost, from whichever operand is the larger
            t = s + p
            c += tl.where(tl.abs(s) >= tl.abs(p), (s - t) + p, (p - t) + s)
            s = t
        else:
            s += p
        pa += LANES
        pb += LANES
    total = s.to(tl.float32)
    if COMPENSATED:
        total += c.to(tl.float32)
    tl.store(out_ptr + row, tl.reduce(total, 0, _add))


def dot_neumaier(a, b, acc="fp32", compensated=False):
    """q2 one row per program, 16 lanes as a vector, pointers advanced each step, masked lanes zeroed
    with tl.where; compensation by Neumaier's variant of Kahan (the lost part summed apart, added at the
    end); the lanes summed by tl.reduce with a combine function; FP fusion left on."""
    a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    out = torch.empty(M, dtype=torch.float32, device=a.device)
    _dot_neumaier_kernel[(M,)](a, b, out, K, ACC=ACC_TYPES[acc], COMPENSATED=compensated, LANES=16)
    return out


@triton.jit
def _dot_kahan_tree_kernel(
    a_ptr, b_ptr, out_ptr, M, K, ACC: tl.constexpr, COMPENSATED: tl.constexpr, ROWS: tl.constexpr,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    base = rows.to(tl.int64)[:, None] * K  # int64 row offsets
    lanes = tl.arange(0, LANES)
    s = tl.zeros((ROWS, LANES), dtype=ACC)
    lost = tl.zeros((ROWS, LANES), dtype=ACC)  # what the running sums lost so far, to be added back
    for k0 in range(0, K, LANES):
        cols = k0 + lanes[None, :]
        mask = (rows[:, None] < M) & (cols < K)
        a = tl.load(a_ptr + base + cols, mask=mask, other=0.0)
        b = tl.load(b_ptr + base + cols, mask=mask, other=0.0)
        p = (a.to(tl.float32) * b.to(tl.float32)).to(ACC)
        if COMPENSATED:
            y = p + lost
            t = s + y
            lost = y - (t - s)
            s = t
        else:
            s = s + p
    total = s.to(tl.float32)
    if COMPENSATED:
        total = total + lost.to(tl.float32)
    for i in tl.static_range(LOG2_LANES):  # the lanes folded pairwise
        lo, hi = tl.split(tl.reshape(total, (ROWS, LANES >> (i + 1), 2)))
        total = lo + hi
    tl.store(out_ptr + rows, tl.reshape(total, (ROWS,)), mask=rows < M)


def dot_kahan_tree(a, b, acc="fp32", compensated=False):
    """q2 on tiles of 4 rows, int64 row offsets, Kahan with the compensation kept as what was lost
    (added to the next product, lost = y - (t - s)), the lanes folded by a tree of tl.split."""
    a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    out = torch.empty(M, dtype=torch.float32, device=a.device)
    _dot_kahan_tree_kernel[(triton.cdiv(M, 4),)](
        a, b, out, M, K, ACC=ACC_TYPES[acc], COMPENSATED=compensated, ROWS=4, LANES=16, LOG2_LANES=4,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


@triton.jit
def _fp8_flat_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, scale, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # one loop over K; a promotion wherever a chunk ends
        ks = k + rk
        a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        part = tl.dot(a, b, part)
        flush = (k + BLOCK_K) % CHUNK == 0
        acc = tl.where(flush, acc + part * scale, acc)
        part = tl.where(flush, 0.0, part)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _fp8_pointer_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, scale, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # the grid's first axis runs along N
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, CHUNK):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in tl.static_range(0, CHUNK, BLOCK_K):  # the chunk's dots, unrolled
            a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptrs, mask=rn[None, :] < N, other=0.0)
            part = tl.dot(a, b, part)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * N
        acc += scale * part
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _fp8_launcher(kernel, block_m, block_n, n_first):
    def fp8_matmul(a, b, promote_every=None, scale=1.0):
        M, K = a.shape
        N = b.shape[1]
        chunk = promote_every or -(-K // 32) * 32
        kp = -(-K // chunk) * chunk
        if kp != K:  # zero products to a whole number of chunks
            a = torch.nn.functional.pad(a.view(torch.uint8), (0, kp - K)).view(torch.float8_e4m3fn)
            b = torch.nn.functional.pad(b.view(torch.uint8), (0, 0, 0, kp - K)).view(torch.float8_e4m3fn)
        c = torch.empty((M, N), dtype=torch.float32, device=a.device)
        tiles = (
            (triton.cdiv(N, block_n), triton.cdiv(M, block_m))
            if n_first
            else (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
        )
        kernel[tiles](
            a.contiguous(),
            b.contiguous(),
            c,
            M,
            N,
            kp,
            scale,
            CHUNK=chunk,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=32,
        )
        return c

    return fp8_matmul


@triton.jit
def _row_mean_scalar_kernel(x_ptr, out_ptr, N, LANES: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, LANES)
    total = 0.0  # one fp32 running sum of the chunk sums
    for k in range(0, N, LANES):
        x = tl.load(x_ptr + row * N + k + lanes, mask=k + lanes < N, other=0.0)
        total += tl.sum(x.to(tl.float32), axis=0)
    tl.store(out_ptr + row, total / N)


def row_mean_scalar(x):
    """q4 one row per program, 512 lanes, each chunk summed by tl.sum into one fp32 scalar."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    _row_mean_scalar_kernel[(M,)](x.contiguous(), out, N, LANES=512)
    return out


@triton.jit
def _row_mean_where_kernel(x_ptr, out_ptr, M, N, ROWS: tl.constexpr, LANES: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    acc = tl.zeros((ROWS, LANES), dtype=tl.float32)
    for k in range(0, N, LANES):
        inside = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * N + k + lanes[None, :], mask=inside)  # no other=
        acc += tl.where(inside, x.to(tl.float32), 0.0)
    tl.store(out_ptr + rows, tl.reduce(acc, 1, _add) * (1.0 / N), mask=rows < M)


def row_mean_where(x):
    """q4 with an fp32 tile of 4 rows x 256 lanes, masked lanes zeroed by tl.where on the loaded values,
    rows summed by tl.reduce with a combine function, times 1/N."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    _row_mean_where_kernel[(triton.cdiv(M, 4),)](x.contiguous(), out, M, N, ROWS=4, LANES=256)
    return out


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _softmax_where_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=inside, other=0.0)
    x = tl.where(inside, x, -float("inf"))  # padded lanes out of the max and the sum
    m = tl.reduce(x, 0, _max)
    e = tl.exp2((x - m) * 1.4426950408889634)  # e^t = 2^(t log2 e)
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=inside)


def softmax_where(x):
    """q5 loading padded lanes as 0 and sending them to -inf with tl.where; the max by tl.reduce with a
    combine function; exp2 of a scaled argument instead of exp."""
    M, N = x.shape
    out = torch.empty_like(x)
    _softmax_where_kernel[(M,)](x.contiguous(), out, N, BLOCK=triton.next_power_of_2(N))
    return out


@triton.jit
def _softmax_online_kernel(x_ptr, out_ptr, N, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, CHUNK)
    m = -float("inf")
    d = 0.0
    for k in range(0, N, CHUNK):  # running max and sum, the sum rescaled whenever the max grows
        x = tl.load(x_ptr + row * N + k + cols, mask=k + cols < N, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for k in range(0, N, CHUNK):
        x = tl.load(x_ptr + row * N + k + cols, mask=k + cols < N, other=-float("inf"))
        tl.store(out_ptr + row * N + k + cols, tl.exp(x - m) / d, mask=k + cols < N)


def softmax_online(x):
    """q5 in chunks of 32 columns, two passes: an online max and sum, then the outputs."""
    M, N = x.shape
    out = torch.empty_like(x)
    _softmax_online_kernel[(M,)](x.contiguous(), out, N, CHUNK=32)
    return out


@triton.jit
def _quantize_div_kernel(x_ptr, q_ptr, scale, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(q_ptr + offs, tl.math.div_rn(x, scale).to(tl.float8e4nv), mask=offs < n)


def quantize_by_division(x):
    """q6 dividing by the reconstruction scale S = amax / 448 in the kernel (correctly rounded), then casting."""
    amax = x.abs().max().item()
    s = amax / 448.0 if amax > 0 else 1.0
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    _quantize_div_kernel[(triton.cdiv(x.numel(), 512),)](x.contiguous(), q, s, x.numel(), BLOCK=512)
    return q, s


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        m = tl.maximum(m, tl.abs(tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=0.0)))
    tl.store(amax_ptr, tl.max(m, axis=0))


@triton.jit
def _quantize_device_scale_kernel(x_ptr, amax_ptr, q_ptr, n, BLOCK: tl.constexpr):
    amax = tl.load(amax_ptr)
    inv = tl.math.div_rn(448.0, tl.where(amax > 0.0, amax, 1.0))
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(q_ptr + offs, (x * inv).to(tl.float8e4nv), mask=offs < n)


def quantize_device_scale(x):
    """q6 with the amax found on the device (one program, a loop of tl.maximum) and read by the cast
    kernel from memory; the scale comes back as a 0-d tensor."""
    x = x.contiguous()
    amax = torch.empty((), dtype=torch.float32, device=x.device)
    _amax_kernel[(1,)](x, amax, x.numel(), BLOCK=256)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    _quantize_device_scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, amax, q, x.numel(), BLOCK=1024)
    return q, torch.where(amax > 0, amax, torch.ones_like(amax)) / 448.0


@triton.jit
def _variance_two_pass_kernel(x_ptr, out_ptr, M, N, ROWS: tl.constexpr, LANES: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    s = tl.zeros((ROWS, LANES), dtype=tl.float32)
    for k in range(0, N, LANES):
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        s += tl.load(x_ptr + rows[:, None] * N + k + lanes[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(s, axis=1) / N
    q = tl.zeros((ROWS, LANES), dtype=tl.float32)
    for k in range(0, N, LANES):  # second pass: squared deviations from the mean
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * N + k + lanes[None, :], mask=mask, other=0.0).to(tl.float32)
        dev = tl.where(mask, x - mean[:, None], 0.0)  # a padded lane is not 0 away from the mean
        q += dev * dev
    tl.store(out_ptr + rows, tl.sum(q, axis=1) / N, mask=rows < M)


def variance_two_pass(x):
    """q7 in two passes, the mean first and then the mean of squared deviations, in fp32."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    _variance_two_pass_kernel[(triton.cdiv(M, 2),)](x.contiguous(), out, M, N, ROWS=2, LANES=512)
    return out


@triton.jit
def _variance_fp64_kernel(x_ptr, out_ptr, M, N, ROWS: tl.constexpr, LANES: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    s1 = tl.zeros((ROWS, LANES), dtype=tl.float64)
    s2 = tl.zeros((ROWS, LANES), dtype=tl.float64)
    for k in range(0, N, LANES):
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * N + k + lanes[None, :], mask=mask, other=0.0).to(tl.float64)
        s1 += x
        s2 += x * x
    mean = tl.sum(s1, axis=1) / N
    var = tl.sum(s2, axis=1) / N - mean * mean
    tl.store(out_ptr + rows, var.to(tl.float32), mask=rows < M)


def variance_fp64(x):
    """q7 promoted further than needed: float64 sums of x and x^2, E[x^2] - E[x]^2 in float64."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    _variance_fp64_kernel[(M,)](x.contiguous(), out, M, N, ROWS=1, LANES=1024)
    return out


@triton.jit
def _to_bf16_bits_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    u = x.to(tl.uint32, bitcast=True)
    r = tl.where(x != x, 0x7FFF, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)  # Lab 0's rounding, NaN first
    tl.store(y_ptr + offs, r.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=offs < n)


def to_bf16_bits(x):
    """q8 by Lab 0's integer rounding instead of the conversion instruction, NaN tested as x != x."""
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    _to_bf16_bits_kernel[(triton.cdiv(x.numel(), 1024),)](x.contiguous(), y, x.numel(), BLOCK=1024)
    return y


@triton.jit
def _to_bf16_rtne_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=offs < n)


def to_bf16_rtne(x):
    """q8 naming the rounding mode (fp_downcast_rounding="rtne"), on a 2-D grid of 128-element programs."""
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    programs = triton.cdiv(x.numel(), 128)
    _to_bf16_rtne_kernel[(triton.cdiv(programs, 4), 4)](x.contiguous(), y, x.numel(), BLOCK=128)
    return y


STUDENT_SOLUTIONS = {
    "q1": {
        "64 random bits, the top d of them; int64 addresses": _sr_launcher(_sr_wide_noise_kernel, 512),
        "tl.rand against the dropped fraction": _sr_launcher(_sr_uniform_kernel, 1024),
    },
    "q2": {
        "Neumaier, one row per program, tl.reduce": dot_neumaier,
        "Kahan as what was lost, 4-row tiles, a tl.split tree": dot_kahan_tree,
    },
    "q3": {
        "one K loop, promotion by tl.where at each chunk's end": _fp8_launcher(_fp8_flat_kernel, 64, 64, False),
        "advanced pointers, unrolled chunk, N-major grid, 64x32 tiles": _fp8_launcher(
            _fp8_pointer_kernel, 64, 32, True
        ),
    },
    "q4": {"a scalar fp32 sum of tl.sum per chunk": row_mean_scalar, "tl.where mask, tl.reduce": row_mean_where},
    "q5": {"-inf by tl.where, tl.reduce max, exp2": softmax_where, "online, in chunks of 32": softmax_online},
    "q6": {
        "divides by S with div_rn": quantize_by_division,
        "amax on the device, read from memory": quantize_device_scale,
    },
    "q7": {"two passes, deviations from the mean": variance_two_pass, "float64 sums": variance_fp64},
    "q8": {"Lab 0's integer rounding": to_bf16_bits, "fp_downcast_rounding='rtne', 2-D grid": to_bf16_rtne},
}


@pytest.mark.parametrize(
    "question, name", [(q, name) for q, right in STUDENT_SOLUTIONS.items() for name in right], ids=str
)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


@triton.jit
def _sr_block_offsets_kernel(
    x_ptr, y_ptr, n, seed, M: tl.constexpr, BIAS: tl.constexpr, MAX_F32: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, SATURATE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    r = tl.randint(seed, tl.arange(0, BLOCK)).to(tl.uint32, bitcast=True)  # the lane, not the element
    sign = u >> 31
    mag = u & 0x7FFFFFFF
    nan = mag > 0x7F800000
    if SATURATE:
        mag = tl.minimum(mag, MAX_F32)
    e32 = mag >> 23
    e = tl.maximum(e32, 1).to(tl.int32) - (127 - BIAS)
    e1 = tl.maximum(e, 1)
    sig = tl.where(e32 == 0, mag, (mag & 0x7FFFFF) | 0x800000)
    v = sig + ((e1 - 1) << 23).to(tl.uint32)
    d = (23 - M) + (e1 - e)
    extra = tl.minimum(tl.maximum(d - 31, 0), 31)
    v = v >> extra.to(tl.uint32)
    d = tl.minimum(d - extra, 31).to(tl.uint32)
    noise = r & ((tl.full(r.shape, 1, tl.uint32) << d) - 1)
    out = tl.where(nan, NAN_CODE, ((v + noise) >> d) | (sign << SIGN_SHIFT))
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dot_rows_kernel(
    a_ptr, b_ptr, out_ptr, M, K, ACC: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_M: tl.constexpr,
    LANES: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) + tl.arange(0, BLOCK_M)  # the program id as the first row, not times BLOCK_M
    lanes = tl.arange(0, LANES)
    s = tl.zeros((BLOCK_M, LANES), dtype=ACC)
    c = tl.zeros((BLOCK_M, LANES), dtype=ACC)
    for k0 in range(0, K, LANES):
        cols = k0 + lanes
        mask = (rows < M)[:, None] & (cols < K)[None, :]
        a = tl.load(a_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        p = (a * b).to(ACC)
        if COMPENSATED:
            y = p - c
            t = s + y
            c = (t - s) - y
            s = t
        else:
            s = s + p
    total = s.to(tl.float32)
    if COMPENSATED:
        total = total - c.to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(total, axis=1), mask=rows < M)


def dot_rows_from_the_program_id(a, b, acc="fp32", compensated=False):
    """q2 rewritten whole, its rows starting at the program id instead of program id * BLOCK_M: right
    while every row fits in the first program's block (13 rows in blocks of 16)."""
    a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    out = torch.zeros(M, dtype=torch.float32, device=a.device)
    _dot_rows_kernel[(triton.cdiv(M, 16),)](
        a, b, out, M, K, ACC=ACC_TYPES[acc], COMPENSATED=compensated, BLOCK_M=16, LANES=16, enable_fp_fusion=False
    )
    return out


@triton.jit
def _fp8_b_stride_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, scale, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, CHUNK):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k1 in range(0, CHUNK, BLOCK_K):
            ks = k0 + k1 + rk
            a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptr + ks[:, None] * BLOCK_N + rn[None, :], mask=rn[None, :] < N, other=0.0)  # not N apart
            part = tl.dot(a, b, part)
        acc = acc + part * scale
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _row_mean_whole_row_kernel(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * N + tl.arange(0, N))  # the whole row as one block
    tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0) / N)


def row_mean_whole_row(x):
    """q4 one program per row holding the whole row in one tl.arange(0, N): N = 256 and 32768 are powers
    of two, so no mask and no loop seemed needed."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    _row_mean_whole_row_kernel[(M,)](x.contiguous(), out, N)
    return out


def softmax_minus_ten_thousand(x):
    """q5 with the padded lanes loading -10000.0 instead of -inf, as in attention masks of old: below
    every logit the public check uses, not below every logit."""
    return hazards.softmax(x, other=-1e4)


@triton.jit
def _quantize_block_amax_kernel(x_ptr, q_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    amax = tl.max(tl.abs(x), axis=0)  # this program's block, not the tensor
    amax = tl.where(amax > 0, amax, 1.0)
    tl.store(q_ptr + offs, (x * (448.0 / amax)).to(tl.float8e4nv), mask=offs < n)
    if pid == 0:
        tl.store(scale_ptr, amax / 448.0)


def quantize_block_amax(x):
    """q6 with the amax found in the cast kernel itself, by each program over its own block: the
    tensor's amax while the tensor is one block (1000 elements), a different scale per block beyond."""
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    _quantize_block_amax_kernel[(triton.cdiv(x.numel(), 1024),)](x, q, scale, x.numel(), BLOCK=1024)
    return q, scale


@triton.jit
def _variance_one_program_kernel(x_ptr, out_ptr, M, N, ROWS: tl.constexpr, LANES: tl.constexpr):
    rows = tl.arange(0, ROWS)  # one program holds every row
    lanes = tl.arange(0, LANES)
    s1 = tl.zeros((ROWS, LANES), dtype=tl.float32)
    s2 = tl.zeros((ROWS, LANES), dtype=tl.float32)
    for k in range(0, N, LANES):
        mask = (rows < M)[:, None] & (k + lanes < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * N + k + lanes[None, :], mask=mask, other=0.0).to(tl.float32)
        s1 += x
        s2 += x * x
    mean = tl.sum(s1, axis=1) / N
    tl.store(out_ptr + rows, tl.sum(s2, axis=1) / N - mean * mean, mask=rows < M)


def variance_one_program(x):
    """q7 promoted to fp32, launched as one program of ROWS = 4 rows: the public check's row count."""
    M, N = x.shape
    out = torch.zeros(M, dtype=torch.float32, device=x.device)
    _variance_one_program_kernel[(1,)](x.contiguous(), out, M, N, ROWS=4, LANES=256)
    return out


def _public_variances():
    table = {}
    for n in (1000, 32768):
        x = lab03.variance_inputs(n)
        table[x.numpy().tobytes()] = x.double().var(dim=1, unbiased=False).float()
    return table


PUBLIC_VARIANCES = _public_variances()


def variances_from_a_table(x):
    """q7 answered from a table of the public inputs' variances, the broken fp16 kernel elsewhere."""
    known = PUBLIC_VARIANCES.get(x.detach().cpu().numpy().tobytes())
    return known.to(x.device) if known is not None else hazards.variance(x, promote=False)


@triton.jit
def _to_bf16_top_half_nan_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.uint32, bitcast=True)
    top = u >> 16
    nan = (top & 0x7FFF) > 0x7F80  # NaN judged on the kept half: a payload in the low half is missed
    r = tl.where(nan, 0x7FFF, (u + 0x7FFF + (top & 1)) >> 16)
    tl.store(y_ptr + offs, r.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=offs < n)


def to_bf16_top_half_nan(x):
    """q8 by Lab 0's integer rounding, NaN decided on the top 16 bits: the public inputs' one NaN is the
    quiet NaN 0x7FC00000, whose top half shows it."""
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    _to_bf16_top_half_nan_kernel[(triton.cdiv(x.numel(), 1024),)](x.contiguous(), y, x.numel(), BLOCK=1024)
    return y


HIDDEN_CATCHES = {
    "q1": {"random bits drawn at the lane, not the element": _sr_launcher(_sr_block_offsets_kernel, 1024)},
    "q2": {"rows start at the program id, not program id * BLOCK_M": dot_rows_from_the_program_id},
    "q3": {"b's rows taken BLOCK_N apart instead of N": _fp8_launcher(_fp8_b_stride_kernel, 64, 64, False)},
    "q4": {"the whole row in one power-of-two block": row_mean_whole_row},
    "q5": {"padded lanes load -10000 instead of -inf": softmax_minus_ten_thousand},
    "q6": {"the amax of each program's block": quantize_block_amax},
    "q7": {"one program for ROWS = 4 rows": variance_one_program, "answers from a table": variances_from_a_table},
    "q8": {"NaN decided on the top 16 bits": to_bf16_top_half_nan},
}
