"""Lab 2's checks pass the right answers and catch each wrong one with the right diagnosis.

A "solution" is what a question's check takes (:data:`CHECKS`): one function, a class for q5, and the
pair ``(dequantize, block_scaled_matmul)`` for q6.  The wrong ones are written in plain torch the way
the mistakes happen in a kernel; :data:`WRONG_SOLUTIONS` maps each to the phrase its diagnosis must
contain.  :data:`STUDENT_SOLUTIONS` holds right ones written other ways (Triton kernels for q1-q4, each
of which must also give the package kernel's bits on a larger input), and every one must pass.
"""

import collections
import importlib.util
import math
from pathlib import Path

import nbformat
import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import formats
from kernels import quantize as Q
from kernels.checks import ExerciseNotDone, lab02, passes
from kernels.device import default_device

DEVICE = default_device()

CHECKS = {
    "q1": lab02.check_per_tensor,
    "q2": lab02.check_rowwise,
    "q3": lab02.check_blocks,
    "q4": lab02.check_mxfp8,
    "q5": lab02.check_delayed_scaling,
    "q6": lambda pair: lab02.check_dequantization(*pair),
}

# -- a quantizer in plain torch, with switches for the mistakes -------------------------------------------


def _no_sat_cast(v: torch.Tensor) -> torch.Tensor:
    """The OCP non-saturating conversion (CUDA's __NV_NOSAT): beyond 448 is NaN."""
    return formats.encode(v.float().contiguous(), "e4m3fn", saturate=False)


def torch_quantizer(
    x,
    gm,
    gk,
    *,
    s_given=None,
    swap=False,
    twice=False,
    zero_policy=True,
    saturate=True,
    finite_amax=True,
    one_scale=False,
    unmasked_tail=False,
    reciprocal=False,
):
    """(q, S) for groups of gm x gk (gm, gk = 0 means the whole extent) with optional mistakes."""
    shape = x.shape
    per_tensor = gm == -1
    xf = x.float().reshape(1, -1) if per_tensor else x.float().reshape(-1, shape[-1])
    m, k = xf.shape
    gm, gk = (1, k) if per_tensor else (gm, gk or k)
    a = xf.abs()
    if finite_amax:
        a = torch.where(a < math.inf, a, torch.zeros_like(a))
    if one_scale:
        amax = a.amax().reshape(1, 1).expand(-(-m // gm), -(-k // gk))
    elif unmasked_tail and k % gk:
        amax = Q.group_amax_reference(xf, gm, gk).clone()
        flat = torch.cat([a.reshape(-1), torch.zeros(gk, device=a.device)])
        for r in range(m):  # the tail group reads on past K, into the next row
            start = r * k + k - k % gk
            amax[r, -1] = flat[start : start + gk].amax()
    else:
        amax = torch.nn.functional.pad(a, (0, (-k) % gk, 0, (-m) % gm))
        amax = amax.reshape(-(-m // gm), gm, -(-k // gk), gk).amax(dim=(1, 3))
    if s_given is not None:
        s = s_given.float().reshape(1, 1).expand_as(amax)
    else:
        # A tensor divisor: torch on CUDA divides by a Python number by multiplying with its reciprocal,
        # which is not the correctly rounded amax / 448 the lab's contract asks for.
        s = amax / torch.full_like(amax, 448.0)
        if reciprocal:
            s = amax * (1.0 / 448.0)
        if zero_policy:
            s = torch.where(amax == 0, torch.ones_like(s), s.clamp(min=Q.MIN_SCALE))
    inv = 1.0 / s
    if twice:
        inv = inv * inv
    inv_el = Q.expand_scales(inv, gm, gk, m, k)
    if saturate:
        q = Q.encode_reference(xf, inv_el, "e4m3")
    else:
        q = _no_sat_cast(xf * inv_el)
        q.view(torch.uint8)[~torch.isfinite(xf)] = 0x7F
    s_out = 1.0 / s if swap else s * s if twice else s
    return q.reshape(shape), s_out


def per_tensor(**mistakes):
    def fn(x, s=None):
        q, sc = torch_quantizer(x, -1, 0, s_given=s, **mistakes)
        return q, sc.reshape(()) if s is None else s

    return fn


def rowwise(**mistakes):
    def fn(x):
        q, s = torch_quantizer(x, 1, 0, **mistakes)
        return q, s.reshape(*x.shape[:-1], 1)

    return fn


def blocks(**mistakes):
    def fn(x, block):
        q, s = torch_quantizer(x, *block, **mistakes)
        return q, s.reshape(*x.shape[:-1], s.shape[-1]) if block[0] == 1 else s

    return fn


# -- group quantizers in Triton, as students write them, with `/` where the lab asks for tl.math.div_rn ----


@triton.jit
def _slash_group_kernel(
    x_ptr, q_ptr, s_ptr, M, K, n_gk, GM: tl.constexpr, GK: tl.constexpr, SLASH_S: tl.constexpr, SLASH_INV: tl.constexpr
):  # fmt: skip
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_m * GM + tl.arange(0, GM)
    cols = pid_k * GK + tl.arange(0, GK)
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.abs(x)
    amax = tl.max(tl.max(tl.where(a < float("inf"), a, 0.0), axis=1), axis=0)
    if SLASH_S:
        s = amax / 448.0  # approximate on the GPU: the mistake
    else:
        s = tl.math.div_rn(amax, 448.0)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(s, 1.1754943508222875e-38))
    if SLASH_INV:
        inv = 1.0 / s
    else:
        inv = tl.math.div_rn(1.0, s)
    y = tl.minimum(tl.maximum(x * inv, -448.0), 448.0)
    c = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    c = tl.where(tl.abs(x) < float("inf"), c, 0x7F)
    tl.store(q_ptr + offs, c, mask=mask)
    tl.store(s_ptr + pid_m * n_gk + pid_k, s)


def triton_groups(row=False, slash_s=False, slash_inv=False):
    """q2 (``row=True``: one group per row) or q3, one group per program, with `/` where asked."""

    def fn(x, block=None):
        k = x.shape[-1]
        x2 = x.contiguous().reshape(-1, k)
        m = x2.shape[0]
        gm, gk = (1, triton.next_power_of_2(k)) if row else block
        n_gm, n_gk = triton.cdiv(m, gm), triton.cdiv(k, gk)
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((n_gm, n_gk), dtype=torch.float32, device=x.device)
        _slash_group_kernel[(n_gm, n_gk)](
            x2, q.view(torch.uint8), s, m, k, n_gk, GM=gm, GK=gk, SLASH_S=slash_s, SLASH_INV=slash_inv
        )
        if row:
            return q, s.reshape(*x.shape[:-1], 1)
        return q, s.reshape(*x.shape[:-1], n_gk) if gm == 1 else s

    return fn


def mxfp8(*, no_bias=False, always="", floor_of_ratio=False, transposed=False, swap=False):
    def fn(x, rounding):
        q, s = Q.quantize_mxfp8_reference(x, "e4m3", always or rounding)
        if floor_of_ratio:  # e = floor(log2(amax / 448)): one binade short, the top saturates
            xf = x.float().reshape(-1, x.shape[-1])
            amax = Q.group_amax_reference(xf, 1, 32)
            e = torch.floor(torch.log2(amax / 448.0)).clamp(-127, 127)
            e = torch.where(amax == 0, torch.zeros_like(e), e)
            s = (e + 127).to(torch.uint8).reshape(s.shape)
            inv = Q.expand_scales(2.0 ** (-e), 1, 32, *xf.shape)
            q = Q.encode_reference(xf, inv, "e4m3").reshape(x.shape)
        if swap:
            s = (254 - s.to(torch.int32)).clamp(0, 254).to(torch.uint8)
        if no_bias:
            s = (s.to(torch.int32) - 127).remainder(256).to(torch.uint8)
        if transposed:
            s = s.reshape(-1, s.shape[-1]).T.contiguous()
        return q, s

    return fn


# -- q5: delayed scaling, right and wrong ---------------------------------------------------------


class History:
    """A correct amax history, written from the spec, with switches for the mistakes."""

    def __init__(self, history_len=16, margin=0, *, lag=True, swap=False, saturate=True, newest_only=False,
                 unbounded=False, margin_sign=1, zero_policy=True):  # fmt: skip
        self.len, self.margin = history_len, margin
        self.hist = []
        self.lag, self.swap, self.saturate = lag, swap, saturate
        self.newest_only, self.unbounded, self.margin_sign, self.zero_policy = (
            newest_only,
            unbounded,
            margin_sign,
            zero_policy,
        )

    def _s(self, amax):
        amax = amax * 2.0 ** (self.margin_sign * self.margin)
        s = amax / 448.0
        if self.zero_policy and amax == 0:
            s = 1.0
        return torch.tensor(1.0 / s if self.swap and s else s, device=DEVICE)

    def scale(self):
        if not self.hist:
            return self._s(0.0)
        return self._s(self.hist[0] if self.newest_only else max(self.hist))

    def update(self, amax):
        self.hist.insert(0, float(amax))
        if not self.unbounded:
            self.hist = self.hist[: self.len]

    def quantize(self, x):
        amax = Q._finite_abs_ref(x.float()).amax()
        s = self._s(float(amax)) if not self.lag else self.scale()
        q, _ = torch_quantizer(x, -1, 0, s_given=s, saturate=self.saturate)
        self.update(amax)
        return q, s


def history(**mistakes):
    def make(history_len=16, margin=0):
        return History(history_len, margin, **mistakes)

    make.__name__ = "History"
    return make


# -- q6: dequantize and the block-scaled GEMM ------------------------------------------------------


def dequantize(q, s, granularity, *, twice=False, swap=False, byte_as_value=False):
    m, k, gm, gk = lab02._groups_of(granularity, tuple(q.shape))
    if granularity == "mxfp8":
        sf = s.float() if byte_as_value else Q.e8m0_to_float(s)
    else:
        sf = s.float()
    s_el = Q.expand_scales(sf.reshape(-(-m // gm), -(-k // gk)), gm, gk, m, k).reshape(q.shape)
    qf = q.float()
    if swap:
        return qf / s_el
    return qf * s_el * s_el if twice else qf * s_el


def block_scaled_matmul(aq, a_s, wq, w_s, *, pulled_out=False, twice=False):
    """y = sum over K blocks of a_s * w_s * (partial dot product), in fp32."""
    m, k = aq.shape
    n = wq.shape[0]
    y = torch.zeros(m, n, device=aq.device)
    if pulled_out:  # the tempting shortcut: one dot product over all of K, then the first block's scales
        return (aq.float() @ wq.float().T) * a_s[:, :1] * w_s[:, 0].repeat_interleave(128)[:n][None, :]
    for b in range(-(-k // 128)):
        cols = slice(b * 128, (b + 1) * 128)
        partial = aq[:, cols].float() @ wq[:, cols].float().T  # (M, N), exact in fp32 for 128 e4m3 products
        sa, sw = a_s[:, b : b + 1], w_s[:, b].repeat_interleave(128)[:n][None, :]
        y += partial * (sa * sa * sw * sw if twice else sa * sw)
    return y


def _dq(**kw):
    return lambda q, s, g: dequantize(q, s, g, **kw)


def _mm(**kw):
    return lambda aq, a_s, wq, w_s: block_scaled_matmul(aq, a_s, wq, w_s, **kw)


RIGHT = {
    "q1": per_tensor(),
    "q2": rowwise(),
    "q3": blocks(),
    "q4": mxfp8(),
    "q5": history(),
    "q6": (_dq(), _mm()),
}

PACKAGE = {
    "q1": lambda x, s=None: Q.quantize_tensor(x) if s is None else (Q.quantize_tensor_with_scale(x, s), s),
    "q2": Q.quantize_rowwise,
    "q3": lambda x, block: Q.quantize_1x128(x) if block[0] == 1 else Q.quantize_128x128(x),
    "q4": lambda x, rounding: Q.quantize_mxfp8(x, rounding=rounding),
    "q5": lambda history_len=16, margin=0: Q.DelayedScaling(history_len, margin, device=DEVICE),
    "q6": (Q.dequantize, lab02.block_scaled_matmul_reference),
}

WRONG_SOLUTIONS = {
    "q1": {
        "scale applied twice": per_tensor(twice=True),
        "S and alpha swapped": per_tensor(swap=True),
        "zero group divides by zero": per_tensor(zero_policy=False),
        "no saturation": per_tensor(saturate=False),
        "NaN and inf enter amax": per_tensor(finite_amax=False),
    },
    "q2": {
        "S with `/`": triton_groups(row=True, slash_s=True),
        "S from torch's amax / 448.0 on a GPU": rowwise(reciprocal=True),
        "one scale for the whole tensor": rowwise(one_scale=True),
        "zero row divides by zero": rowwise(zero_policy=False),
        "S and alpha swapped": rowwise(swap=True),
    },
    "q3": {
        "S with `/`": triton_groups(slash_s=True),
        "partial last group read past K": blocks(unmasked_tail=True),
        "scale applied twice": blocks(twice=True),
        "zero block divides by zero": blocks(zero_policy=False),
    },
    "q4": {
        "E8M0 bias missing": mxfp8(no_bias=True),
        "always rounds up": mxfp8(always="up"),
        "floor(log2(amax / 448))": mxfp8(floor_of_ratio=True),
        "scales transposed": mxfp8(transposed=True),
        "S and alpha swapped": mxfp8(swap=True),
    },
    "q5": {
        "no lag (current scaling)": history(lag=False),
        "S and alpha swapped": history(swap=True),
        "no saturation": history(saturate=False),
        "newest amax only": history(newest_only=True),
        "history never forgets": history(unbounded=True),
        "margin the wrong way": history(margin_sign=-1),
        "empty history divides by zero": history(zero_policy=False),
    },
    "q6": {
        "scale applied twice": (_dq(twice=True), _mm()),
        "S and alpha swapped": (_dq(swap=True), _mm()),
        "E8M0 byte used as a value": (_dq(byte_as_value=True), _mm()),
        "block scale pulled out of the K sum": (_dq(), _mm(pulled_out=True)),
        "block scales applied twice in the GEMM": (_dq(), _mm(twice=True)),
    },
}

DIAGNOSES = {
    "S with `/`": "S is not correctly rounded",
    "S from torch's amax / 448.0 on a GPU": "S is not correctly rounded",
    "scale applied twice": "scale applied twice",
    "S and alpha swapped": "S and alpha swapped",
    "zero group divides by zero": "divides by zero",
    "no saturation": "no saturation",
    "NaN and inf enter amax": "leave non-finite values out of amax",
    "one scale for the whole tensor": "one scale for every group",
    "zero row divides by zero": "divides by zero",
    "partial last group read past K": "last, partial group",
    "zero block divides by zero": "divides by zero",
    "E8M0 bias missing": "E8M0 bias missing",
    "always rounds up": "round-up rule",
    "floor(log2(amax / 448))": "one too small",
    "scales transposed": "transposed",
    "no lag (current scaling)": "that is current scaling",
    "newest amax only": "take the max over the whole history",
    "history never forgets": "never leaves the history",
    "margin the wrong way": "margin applied the wrong way",
    "empty history divides by zero": "empty (all-zero) history must give S = 1",
    "E8M0 byte used as a value": "E8M0 byte used as the scale's value",
    "block scale pulled out of the K sum": "block scale pulled out of the K sum",
    "block scales applied twice in the GEMM": "scale applied twice",
}


def test_every_question_has_wrong_solutions_and_every_wrong_solution_a_diagnosis():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == {f"q{i}" for i in range(1, 7)}
    for q, wrongs in WRONG_SOLUTIONS.items():
        assert wrongs, q
        for name in wrongs:
            assert name in DIAGNOSES, name


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_the_right_solutions_pass(question, capsys):
    CHECKS[question](RIGHT[question])
    CHECKS[question](PACKAGE[question])
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "question,name", [(q, n) for q, wrongs in WRONG_SOLUTIONS.items() for n in wrongs], ids=lambda v: str(v)
)
def test_each_wrong_solution_is_caught_with_its_diagnosis(question, name):
    with pytest.raises(AssertionError) as err:
        CHECKS[question](WRONG_SOLUTIONS[question][name])
    print(err.value)
    assert DIAGNOSES[name] in str(err.value), str(err.value)
    if name in FIRST_IS_OWN:  # the first diagnosis listed is the mistake's own
        assert DIAGNOSES[name] in str(err.value).splitlines()[1], str(err.value)


# Wrong solutions whose own diagnosis must come first: a spurious one before it sent students astray.
FIRST_IS_OWN = ("always rounds up",)


def test_unfinished_exercises_say_so_and_passes_is_quiet(capsys):
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(ExerciseNotDone, match="not done yet"):
        lab02.check_rowwise(stub)
    assert not passes(lab02.check_rowwise, stub)
    assert passes(lab02.check_rowwise, Q.quantize_rowwise)
    assert capsys.readouterr().out == ""


def test_same_as_package_passes_the_package_and_catches_a_wrong_kernel(capsys):
    fns = {"tensor": Q.quantize_tensor, "row": Q.quantize_rowwise, "mxfp8": Q.quantize_mxfp8}
    lab02.check_same_as_package(fns)
    assert "same bits" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="row quantizer's scales differ"):
        lab02.check_same_as_package({"row": rowwise(swap=True)})


def test_lab_input_is_adversarial():
    x = lab02.lab_input().float().cpu()
    assert torch.isnan(x).any() and torch.isinf(x).any() and (x == 0).all(dim=1).any()
    assert x.shape[1] % 128 and x.shape[1] % 32 and x.shape[0] % 128


# -- the notebook's own kernels: the lab's starting versions get the diagnoses its prose promises ----------

ROOT = Path(__file__).resolve().parents[1]
HEADER = """
import math

import torch
import triton
import triton.language as tl

from kernels import quantize as Q

DEV = {dev!r}


def tensor_quantizer(x, s=None):
    return Q.quantize_tensor(x) if s is None else (Q.quantize_tensor_with_scale(x, s), s)
"""
# question -> (what defines it in the notebook, what the check is given, the lab's promised diagnosis)
NOTEBOOK_QUESTIONS = {
    "q1": ("def quantize_tensor", lambda m: m.quantize_tensor, "leave non-finite values out of amax"),
    "q2": ("def quantize_rowwise", lambda m: m.quantize_rowwise, "taken over more than one row group"),
    "q3": ("def quantize_blocks", lambda m: m.quantize_blocks, "divides by zero"),
    "q4": ("def quantize_mxfp8", lambda m: m.quantize_mxfp8, "all-zero block got E8M0 byte"),
    "q5": ("class AmaxHistory", lambda m: m.AmaxHistory, "not done yet"),
    "q6": ("def dequantize(", lambda m: (m.dequantize, m.block_scaled_matmul), "E8M0 byte used as the scale's value"),
}


def _notebook_module(path: Path, marker: str, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and marker in c.source)
    name = f"{path.parent.name}_{marker.split()[-1].strip('(')}"
    module_path = tmp_path / f"{name}.py"  # Triton reads a kernel's source from its file
    module_path.write_text(HEADER.format(dev=DEVICE) + "\n\n" + source + "\n")
    spec = importlib.util.spec_from_file_location(name, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("question", sorted(NOTEBOOK_QUESTIONS))
def test_the_solution_notebook_passes_and_the_lab_gets_its_diagnosis(question, tmp_path, capsys):
    marker, given, promised = NOTEBOOK_QUESTIONS[question]
    solution = _notebook_module(ROOT / "solutions" / "02_scaling_quantizers.ipynb", marker, tmp_path)
    CHECKS[question](given(solution))
    assert "passed" in capsys.readouterr().out
    lab = _notebook_module(ROOT / "labs" / "02_scaling_quantizers.ipynb", marker, tmp_path)
    with pytest.raises(AssertionError) as err:
        CHECKS[question](given(lab))
    assert promised in str(err.value), str(err.value)


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, solutions that are right by the
# lab's contract but not the lab's own, each differing from it (and from the others) where compiled
# Triton and the interpreter could disagree: atomics, reductions written with a combine function or
# taken in bf16, masks with ``other=`` or ``tl.where``, int32 or int64 offsets, one group per program or a
# tile of them, NaN and inf found from the bits, E8M0 bytes from masked fields.  Every one must pass its
# check here and get full marks from the lab's otter test (``tests/test_wrong_solutions.py``).

E4M3_MAX = tl.constexpr(448.0)  # module constants read inside kernels: declared tl.constexpr
SMALLEST_NORMAL = tl.constexpr(1.1754943508222875e-38)  # 2^-126
EXPONENT_BITS = tl.constexpr(0x7F800000)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _amax_bits_atomic_kernel(x_ptr, amax_bits_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # int32 offsets: the lab's tensors are small
    a = tl.abs(tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32))
    bits = tl.where(a < float("inf"), a, 0.0).to(tl.int32, bitcast=True)  # |x| >= 0 orders like its bits
    tl.atomic_max(amax_bits_ptr, tl.max(bits, axis=0))  # an integer maximum


@triton.jit
def _cast_scale_in_program_kernel(x_ptr, amax_bits_ptr, s_ptr, q_ptr, n, GIVEN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if GIVEN:  # delayed scaling: S comes from the caller
        s = tl.load(s_ptr)
    else:  # every program derives S from the amax itself (the same bits in each); program 0 writes it
        amax = tl.load(amax_bits_ptr).to(tl.float32, bitcast=True)
        s = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SMALLEST_NORMAL)
        s = tl.where(amax > 0.0, s, 1.0)
        tl.store(s_ptr, s, mask=pid == 0)
    inv = tl.math.div_rn(1.0, s)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.minimum(tl.maximum(x * inv, -E4M3_MAX), E4M3_MAX)
    c = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    nonfinite = (x.to(tl.int32, bitcast=True) & EXPONENT_BITS) == EXPONENT_BITS  # exponent all ones
    tl.store(q_ptr + offs, tl.where(nonfinite, 0x7F, c).to(tl.uint8), mask=mask)


def quantize_tensor_atomic(x, s=None):
    """q1 with the amax as an atomic_max on fp32 bits (non-negative floats order like their bit patterns),
    each block reduced as integers, S recomputed in every cast program with div_rn, int32 offsets."""
    x = x.contiguous()
    n = x.numel()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    grid = (max(triton.cdiv(n, 2048), 1),)
    amax_bits = torch.zeros(1, dtype=torch.int32, device=x.device)  # the bits of +0.0
    if s is None:
        s_out = torch.ones((), dtype=torch.float32, device=x.device)
        _amax_bits_atomic_kernel[grid](x, amax_bits, n, BLOCK=2048)
        _cast_scale_in_program_kernel[grid](x, amax_bits, s_out, q.view(torch.uint8), n, GIVEN=False, BLOCK=2048)
        return q, s_out
    _cast_scale_in_program_kernel[grid](x, amax_bits, s.float().contiguous(), q.view(torch.uint8), n, GIVEN=True,
                                        BLOCK=2048)  # fmt: skip
    return q, s


@triton.jit
def _amax_one_program_kernel(x_ptr, s_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK).to(tl.int64)  # int64 offsets
    run = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):  # one program walks the whole tensor
        offs = start + lanes
        inside = offs < n
        a = tl.abs(tl.load(x_ptr + offs, mask=inside).to(tl.float32))  # no other=: masked lanes dropped below
        run = tl.maximum(run, tl.where(inside & (a < float("inf")), a, 0.0))
    amax = tl.max(run, axis=0)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SMALLEST_NORMAL))
    tl.store(s_ptr, s)
    tl.store(inv_ptr, tl.math.div_rn(1.0, s))


@triton.jit
def _cast_alpha_kernel(x_ptr, inv_ptr, q_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.clamp(x * tl.load(inv_ptr), -E4M3_MAX, E4M3_MAX)
    c = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    c = tl.where((x != x) | (x == float("inf")) | (x == -float("inf")), 0x7F, c)  # NaN, +inf, -inf
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=mask)


def quantize_tensor_one_program(x, s=None):
    """q1 with the amax pass as one program looping over the tensor (int64 offsets, a masked load without
    other=), S and alpha written by it; tl.clamp; NaN as x != x; a given S inverted by torch.reciprocal."""
    x = x.contiguous()
    n = x.numel()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if s is None:
        s_out = torch.empty((), dtype=torch.float32, device=x.device)
        inv = torch.empty(1, dtype=torch.float32, device=x.device)
        _amax_one_program_kernel[(1,)](x, s_out, inv, n, BLOCK=1024)
    else:
        s_out = s
        inv = torch.reciprocal(s.float()).reshape(1)  # 1 / S, correctly rounded in fp32
    if n:
        _cast_alpha_kernel[(triton.cdiv(n, 1024),)](x, inv, q.view(torch.uint8), n, BLOCK=1024)
    return q, s_out


@triton.jit
def _row_two_loops_kernel(x_ptr, q_ptr, s_ptr, K, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * K
    lanes = tl.arange(0, CHUNK)
    run = tl.zeros([CHUNK], dtype=tl.float32)
    for k0 in range(0, K, CHUNK):  # amax loop
        cols = k0 + lanes
        x = tl.load(x_ptr + base + cols, mask=cols < K, other=0.0).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # |x| as bits
        run = tl.maximum(run, tl.where(bits < EXPONENT_BITS, bits, 0).to(tl.float32, bitcast=True))
    # The chunk's maxima folded by tl.reduce with a combine function, as a (8, CHUNK // 8) tile: two levels.
    amax = tl.reduce(tl.reduce(tl.reshape(run, [8, CHUNK // 8]), 1, _max_combine), 0, _max_combine)
    s = tl.math.div_rn(amax, E4M3_MAX)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(s, SMALLEST_NORMAL))
    inv = tl.math.div_rn(1.0, s)
    for k0 in range(0, K, CHUNK):  # cast loop: the row is read again
        cols = k0 + lanes
        x = tl.load(x_ptr + base + cols, mask=cols < K, other=0.0).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        y = tl.minimum(tl.maximum(x * inv, -E4M3_MAX), E4M3_MAX)
        c = tl.where(bits < EXPONENT_BITS, y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
        tl.store(q_ptr + base + cols, c.to(tl.uint8), mask=cols < K)
    tl.store(s_ptr + row, s)


def quantize_rowwise_two_loops(x):
    """q2 one row per program in chunks of 128: an amax loop, then a cast loop; the chunk maxima folded by
    tl.reduce with a combine function; non-finite values found from the bits (|x| >= 0x7F800000)."""
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if x.numel():
        _row_two_loops_kernel[(x2.shape[0],)](x2, q.view(torch.uint8), s, k, CHUNK=128)
    return q, s


@triton.jit
def _row_tile_native_amax_kernel(x_ptr, q_ptr, s_ptr, M, K, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_K)
    offs = rows[:, None] * K + cols[None, :]  # int32
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=inside)  # no other=: masked lanes are zeroed by tl.where
    a = tl.abs(x)  # in the input's own dtype: a maximum is exact in any format
    a = tl.where(inside & (a < float("inf")), a, 0.0)
    amax = tl.max(a, axis=1).to(tl.float32)  # (ROWS,)
    s = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), SMALLEST_NORMAL)
    s = tl.where(amax > 0.0, s, 1.0)
    inv = tl.math.div_rn(1.0, s)
    xf = x.to(tl.float32)
    c = tl.clamp(xf * inv[:, None], -E4M3_MAX, E4M3_MAX).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    c = tl.where(xf - xf != 0.0, 0x7F, c)  # x - x is NaN exactly for NaN and +-inf
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=inside)
    tl.store(s_ptr + rows, s, mask=rows < M)


def quantize_rowwise_native_amax(x):
    """q2 on tiles of 4 whole rows, the amax taken in the input's dtype (bf16) and widened after, masked
    loads without other= zeroed by tl.where, non-finite values as x - x != 0."""
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if x.numel():
        _row_tile_native_amax_kernel[(triton.cdiv(m, 4),)](
            x2, q.view(torch.uint8), s, m, k, ROWS=4, BLOCK_K=triton.next_power_of_2(k)
        )
    return q, s


@triton.jit
def _rows_of_groups_kernel(x_ptr, q_ptr, s_ptr, M, K, n_gk, ROWS: tl.constexpr, GK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # ROWS 1x128 groups per program, one per row
    cols = tl.program_id(1) * GK + tl.arange(0, GK)
    offs = rows[:, None] * K + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.abs(x)
    amax = tl.max(tl.where(a < float("inf"), a, 0.0), axis=1)  # (ROWS,)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(tl.math.div_rn(amax, 448.0), 1.1754943508222875e-38))
    inv = tl.math.div_rn(1.0, s)
    y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    c = tl.where(a < float("inf"), y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=mask)
    tl.store(s_ptr + rows * n_gk + tl.program_id(1), s, mask=rows < M)


@triton.jit
def _block_in_row_chunks_kernel(x_ptr, q_ptr, s_ptr, M, K, n_gk, B: tl.constexpr, CHUNK: tl.constexpr):
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    cols = pid_k * B + tl.arange(0, B)
    run = tl.zeros([CHUNK, B], dtype=tl.float32)
    for r0 in range(0, B, CHUNK):  # the block's amax, CHUNK rows at a time
        rows = pid_m * B + r0 + tl.arange(0, CHUNK)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.abs(x)
        run = tl.maximum(run, tl.where(a < float("inf"), a, 0.0))
    amax = tl.max(tl.max(run, axis=0), axis=0)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(tl.math.div_rn(amax, 448.0), 1.1754943508222875e-38))
    inv = tl.math.div_rn(1.0, s)
    for r0 in range(0, B, CHUNK):  # then the codes, the same chunks read again
        rows = pid_m * B + r0 + tl.arange(0, CHUNK)
        offs = rows[:, None] * K + cols[None, :]
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(x * inv, -448.0), 448.0)
        c = tl.where(tl.abs(x) < float("inf"), y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
        tl.store(q_ptr + offs, c.to(tl.uint8), mask=mask)
    tl.store(s_ptr + pid_m * n_gk + pid_k, s)


def quantize_blocks_tiles_and_chunks(x, block=(1, 128)):
    """q3 with 8 rows of 1x128 groups per program (one amax per row of the tile), and each 128x128 block
    in four chunks of 32 rows: an amax loop and a cast loop; literals instead of constants; int32."""
    gm, gk = block
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    n_gm, n_gk = triton.cdiv(m, gm), triton.cdiv(k, gk)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((n_gm, n_gk), dtype=torch.float32, device=x.device)
    if gm == 1:
        _rows_of_groups_kernel[(triton.cdiv(m, 8), n_gk)](x2, q.view(torch.uint8), s, m, k, n_gk, ROWS=8, GK=gk)
        return q, s.reshape(*x.shape[:-1], n_gk)
    _block_in_row_chunks_kernel[(n_gm, n_gk)](x2, q.view(torch.uint8), s, m, k, n_gk, B=gm, CHUNK=32)
    return q, s


@triton.jit
def _group_flat_grid_kernel(x_ptr, q_ptr, s_ptr, M, K, n_gk, GM: tl.constexpr, GK: tl.constexpr):
    pid = tl.program_id(0)  # a 1-D grid over the groups, row-major: pid is the scale's index
    rows = (pid // n_gk) * GM + tl.arange(0, GM)
    cols = (pid % n_gk) * GK + tl.arange(0, GK)
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=inside).to(tl.float32)  # no other=
    a = tl.abs(x)
    a = tl.where(inside & (a < float("inf")), a, 0.0)
    amax = tl.max(tl.reshape(a, [GM * GK]), axis=0)  # the whole group, flattened
    s = tl.math.div_rn(amax, E4M3_MAX)
    s = tl.maximum(s, SMALLEST_NORMAL)
    s = tl.where(amax > 0.0, s, 1.0)
    inv = tl.math.div_rn(1.0, s)
    c = tl.clamp(x * inv, -E4M3_MAX, E4M3_MAX).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    c = tl.where((x != x) | (tl.abs(x) == float("inf")), 0x7F, c)
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=inside)
    tl.store(s_ptr + pid, s)


def quantize_blocks_flat_grid(x, block=(1, 128)):
    """q3 one group per program on a 1-D grid (the program id is the scale's index), int64 offsets, masks
    by tl.where, the amax over the group reshaped flat, NaN as x != x and inf by |x| == inf."""
    gm, gk = block
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    n_gm, n_gk = triton.cdiv(m, gm), triton.cdiv(k, gk)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(n_gm * n_gk, dtype=torch.float32, device=x.device)
    _group_flat_grid_kernel[(n_gm * n_gk,)](x2, q.view(torch.uint8), s, m, k, n_gk, GM=gm, GK=gk)
    return q, (s.reshape(*x.shape[:-1], n_gk) if gm == 1 else s.reshape(n_gm, n_gk))


@triton.jit
def _mx_whole_row_kernel(x_ptr, q_ptr, s_ptr, K, n_blocks, NB: tl.constexpr, ROUND_UP: tl.constexpr):
    row = tl.program_id(0)  # one row per program: its MX blocks as a (NB, 32) tile
    blk = tl.arange(0, NB)
    cols = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    offs = row.to(tl.int64) * K + cols
    mask = cols < K
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.abs(x)
    amax = tl.max(tl.where(a < float("inf"), a, 0.0), axis=1)  # (NB,)
    bits = amax.to(tl.int32, bitcast=True)
    byte = ((bits & EXPONENT_BITS) >> 23) - 8  # e + 127 straight from the exponent field: floor rule
    if ROUND_UP:
        byte += tl.where((bits & 0x7FFFFF) > 0x600000, 1, 0)
    byte = tl.minimum(tl.maximum(byte, 0), 254)
    byte = tl.where(amax == 0.0, 127, byte)
    inv = ((254 - byte) << 23).to(tl.float32, bitcast=True)  # 2^(127 - byte) = 1/S
    y = tl.minimum(tl.maximum(x * inv[:, None], -E4M3_MAX), E4M3_MAX)
    c = tl.where(a < float("inf"), y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=mask)
    tl.store(s_ptr + row * n_blocks + blk, byte.to(tl.uint8), mask=blk < n_blocks)


def quantize_mxfp8_whole_rows(x, rounding="floor"):
    """q4 one row per program, all its blocks in one (blocks, 32) tile, the E8M0 byte computed directly
    from the masked exponent field (e + 127 = field - 8), clamped to [0, 254]."""
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    n_blocks = triton.cdiv(k, 32)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((*x.shape[:-1], n_blocks), dtype=torch.uint8, device=x.device)
    if x.numel():
        _mx_whole_row_kernel[(x2.shape[0],)](
            x2, q.view(torch.uint8), s, k, n_blocks, NB=triton.next_power_of_2(n_blocks), ROUND_UP=rounding == "up"
        )
    return q, s


@triton.jit
def _mx_tile_runtime_rounding_kernel(x_ptr, q_ptr, s_ptr, M, K, n_blocks, round_up, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * 32 + tl.arange(0, 32)
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    finite = tl.abs(x) < float("inf")
    amax = tl.max(tl.where(finite, tl.abs(x), 0.0), axis=1)  # (ROWS,)
    e = tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) - 135, -127)  # floor(log2(amax)) - 8, clamped
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    # Round up where amax * 2^-e, exact (a power of two) and in [256, 512), exceeds 448.
    e += ((amax * inv > 448.0) & (round_up != 0)).to(tl.int32)
    e = tl.where(amax == 0.0, 0, tl.minimum(e, 127))
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    y = tl.clamp(x * inv[:, None], -448.0, 448.0)
    c = tl.where(finite, y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=inside)
    tl.store(s_ptr + rows * n_blocks + tl.program_id(1), (e + 127).to(tl.uint8), mask=rows < M)


def quantize_mxfp8_runtime_rounding(x, rounding="floor"):
    """q4 on tiles of 16 rows x one block, the rounding a run-time flag chosen with tl.where, round-up
    decided by comparing the exactly scaled amax with 448 instead of reading the mantissa field."""
    if rounding not in ("floor", "up"):
        raise ValueError(rounding)
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    n_blocks = triton.cdiv(k, 32)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((*x.shape[:-1], n_blocks), dtype=torch.uint8, device=x.device)
    if x.numel():
        _mx_tile_runtime_rounding_kernel[(triton.cdiv(m, 16), n_blocks)](
            x2, q.view(torch.uint8), s, m, k, n_blocks, int(rounding == "up"), ROWS=16
        )
    return q, s


class RingBufferHistory:
    """q5 with a fixed ring buffer on the device and a Python write position (no .item()); the margin by
    torch.ldexp; S = amax / 448.0; the cast by the atomic q1 above; x's amax by nan_to_num."""

    def __init__(self, history_len=16, margin=0):
        self.amaxes = torch.zeros(history_len, dtype=torch.float32, device=DEVICE)
        self.next = 0
        self.margin = torch.tensor(margin, dtype=torch.int32, device=DEVICE)

    def scale(self):
        amax = torch.ldexp(self.amaxes.max(), self.margin)
        return torch.where(amax > 0, torch.clamp(amax / 448.0, min=2.0**-126), torch.ones_like(amax))

    def update(self, amax):
        self.amaxes[self.next] = amax.detach().float().reshape(())  # overwrites the oldest
        self.next = (self.next + 1) % self.amaxes.numel()

    def quantize(self, x):
        s = self.scale()
        q, _ = quantize_tensor_atomic(x, s)
        self.update(x.float().abs().nan_to_num(nan=0.0, posinf=0.0).amax())
        return q, s


class DequeHistory:
    """q5 with a deque(maxlen=history_len) of 0-d device tensors, newest on the left; the empty history
    told by the deque's length (a Python fact, not a device value); the cast by the one-program q1."""

    def __init__(self, history_len=16, margin=0):
        self.recent = collections.deque(maxlen=history_len)
        self.headroom = 2.0**margin

    def scale(self):
        if not self.recent:
            return torch.ones((), dtype=torch.float32, device=DEVICE)
        amax = torch.stack(list(self.recent)).amax() * self.headroom
        s = torch.clamp(amax / torch.full_like(amax, 448.0), min=2.0**-126)
        return torch.where(amax == 0, torch.ones_like(s), s)

    def update(self, amax):
        self.recent.appendleft(amax.detach().float().reshape(()).to(DEVICE))

    def quantize(self, x):
        s = self.scale()
        q, _ = quantize_tensor_one_program(x, s)
        xf = x.float()
        self.update(torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf)).amax())
        return q, s


def _group_shape(granularity, m, k):
    if granularity == "tensor":
        return m, k
    return {"row": (1, k), "1x128": (1, 128), "128x128": (128, 128), "mxfp8": (1, 32)}[granularity]


def e8m0_table(device):
    """The 256 E8M0 values, exact in float64 and in fp32 (2^-127 is an fp32 subnormal), 255 NaN."""
    values = [2.0 ** (c - 127) for c in range(255)] + [math.nan]
    return torch.tensor(values, dtype=torch.float64).float().to(device)


def dequantize_by_gather(q, s, granularity):
    """q6 (a) in torch: E8M0 decoded by a 256-entry table, each element's scale gathered by index."""
    k = q.shape[-1] if q.dim() else 1
    q2 = q.reshape(-1, k)
    m = q2.shape[0]
    gm, gk = _group_shape(granularity, m, k)
    sv = e8m0_table(q.device)[s.long()] if granularity == "mxfp8" else s.float()
    sv = sv.reshape(-(-m // gm), -(-k // gk))
    rows = torch.arange(m, device=q.device) // gm
    cols = torch.arange(k, device=q.device) // gk
    return (q2.float() * sv[rows[:, None], cols[None, :]]).reshape(q.shape)


def matmul_by_einsum(aq, a_s, wq, w_s):
    """q6 (b) all K blocks at once: the codes as (rows, blocks, 128), one einsum for every block's partial
    product, each scaled by its block's scales, then summed over the blocks."""
    m, k = aq.shape
    n = wq.shape[0]
    nb = -(-k // 128)
    a = torch.nn.functional.pad(aq.float(), (0, nb * 128 - k)).reshape(m, nb, 128)
    w = torch.nn.functional.pad(wq.float(), (0, nb * 128 - k)).reshape(n, nb, 128)
    partial = torch.einsum("mbk,nbk->bmn", a, w)  # (blocks, M, N)
    sw = w_s.float().repeat_interleave(128, dim=0)[:n]  # (N, blocks)
    return (partial * a_s.float().T[:, :, None] * sw.T[:, None, :]).sum(0)


@triton.jit
def _dequant_flat_kernel(q_ptr, s_ptr, y_ptr, n, K, GM, GK, n_gk, E8M0: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # flat, int64
    inside = offs < n
    row, col = offs // K, offs % K
    q = tl.load(q_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    s_idx = (row // GM) * n_gk + col // GK
    if E8M0:
        c = tl.load(s_ptr + s_idx, mask=inside, other=127).to(tl.int32)
        s = tl.where(c > 0, c << 23, 0x00400000).to(tl.float32, bitcast=True)  # c = 0: 2^-127, subnormal
        s = tl.where(c == 255, float("nan"), s)
    else:
        s = tl.load(s_ptr + s_idx, mask=inside, other=1.0)
    tl.store(y_ptr + offs, q * s, mask=inside)


def dequantize_flat_kernel(q, s, granularity):
    """q6 (a) as a Triton kernel over the flattened codes, each element's row and column from its offset."""
    k = q.shape[-1] if q.dim() else 1
    q2 = q.contiguous().reshape(-1, k)
    m = q2.shape[0]
    gm, gk = _group_shape(granularity, m, k)
    y = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    n = q2.numel()
    _dequant_flat_kernel[(triton.cdiv(n, 1024),)](
        q2, s.contiguous(), y, n, k, gm, gk, -(-k // gk), E8M0=granularity == "mxfp8", BLOCK=1024
    )
    return y


def matmul_scaled_operands_fp64(aq, a_s, wq, w_s):
    """q6 (b) one K block at a time, its scales applied to the block's operands, in float64."""
    m, k = aq.shape
    n = wq.shape[0]
    y = torch.zeros(m, n, dtype=torch.float64, device=aq.device)
    block_row = torch.arange(n, device=aq.device) // 128
    for b, k0 in enumerate(range(0, k, 128)):
        a = aq[:, k0 : k0 + 128].double() * a_s[:, b : b + 1].double()
        w = wq[:, k0 : k0 + 128].double() * w_s[block_row, b].double()[:, None]
        y += a @ w.T
    return y.float()


STUDENT_SOLUTIONS = {
    "q1": {
        "atomic_max on the bits, S recomputed per program, int32": quantize_tensor_atomic,
        "one looping amax program, int64, tl.clamp, torch.reciprocal": quantize_tensor_one_program,
    },
    "q2": {
        "one row per program, two loops of 128, tl.reduce, bit tests": quantize_rowwise_two_loops,
        "4-row tiles, amax in bf16, tl.where masks, x - x": quantize_rowwise_native_amax,
    },
    "q3": {
        "8-row tiles of groups; blocks in 32-row chunks": quantize_blocks_tiles_and_chunks,
        "one group per program on a 1-D grid, int64, flat amax": quantize_blocks_flat_grid,
    },
    "q4": {
        "whole rows, the E8M0 byte from the masked field": quantize_mxfp8_whole_rows,
        "16-row tiles, run-time rounding flag, scaled amax vs 448": quantize_mxfp8_runtime_rounding,
    },
    "q5": {
        "ring buffer, ldexp margin, atomic q1 cast": RingBufferHistory,
        "deque of device scalars, one-program q1 cast": DequeHistory,
    },
    "q6": {
        "gather and a lookup table; one einsum over the blocks": (dequantize_by_gather, matmul_by_einsum),
        "flat Triton dequantize; scaled operands in float64": (dequantize_flat_kernel, matmul_scaled_operands_fp64),
    },
}

STUDENT_CASES = [(q, name) for q, rights in STUDENT_SOLUTIONS.items() for name in rights]


@pytest.mark.parametrize("question, name", STUDENT_CASES, ids=str)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


def _as_granularities(question, fn):
    if question == "q3":
        return {"1x128": lambda x: fn(x, (1, 128)), "128x128": lambda x: fn(x, (128, 128))}
    return {{"q1": "tensor", "q2": "row", "q4": "mxfp8"}[question]: fn}


@pytest.mark.parametrize("question, name", [c for c in STUDENT_CASES if c[0] in ("q1", "q2", "q3", "q4")], ids=str)
def test_student_quantizers_give_the_package_kernels_bits(question, name, capsys):
    lab02.check_same_as_package(_as_granularities(question, STUDENT_SOLUTIONS[question][name]))
    assert capsys.readouterr().out.startswith("same bits as kernels.quantize")


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


def quantize_tensor_amax_of_one_block(x, s=None):
    """q1 with the amax pass launched on one program, as the finalize pass is: only the first 2048 elements
    are reduced, and they hold the public check's outlier (row 5 of 300 columns)."""
    x = x.contiguous()
    n = x.numel()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    grid = (max(triton.cdiv(n, 2048), 1),)
    amax_bits = torch.zeros(1, dtype=torch.int32, device=x.device)
    if s is None:
        s_out = torch.ones((), dtype=torch.float32, device=x.device)
        _amax_bits_atomic_kernel[(1,)](x, amax_bits, n, BLOCK=2048)
        _cast_scale_in_program_kernel[grid](x, amax_bits, s_out, q.view(torch.uint8), n, GIVEN=False, BLOCK=2048)
        return q, s_out
    _cast_scale_in_program_kernel[grid](x, amax_bits, s.float().contiguous(), q.view(torch.uint8), n, GIVEN=True,
                                        BLOCK=2048)  # fmt: skip
    return q, s


def quantize_rowwise_block_k_512(x):
    """q2 with BLOCK_K fixed at 512, room for the public check's rows of 300 and 40: a longer row is cut there,
    its scale from its first 512 elements and its other codes never written."""
    k = x.shape[-1]
    x2 = x.contiguous().reshape(-1, k)
    m = x2.shape[0]
    q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.zeros((m, 1), dtype=torch.float32, device=x.device)
    _slash_group_kernel[(m, 1)](x2, q.view(torch.uint8), s, m, k, 1, GM=1, GK=512, SLASH_S=False, SLASH_INV=False)
    return q, s.reshape(*x.shape[:-1], 1)


@triton.jit
def _groups_of_one_row_tile_kernel(x_ptr, q_ptr, s_ptr, M, K, n_gk, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, 512)  # four groups of 128 per row, as in the package's tile; no grid along K
    offs = rows[:, None] * K + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.abs(x)
    a = tl.where(a < float("inf"), a, 0.0)
    amax = tl.max(tl.reshape(a, [ROWS, 4, 128]), axis=2)  # (ROWS, 4)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(tl.math.div_rn(amax, 448.0), 1.1754943508222875e-38))
    inv = tl.math.div_rn(1.0, s)
    y = tl.reshape(tl.reshape(x, [ROWS, 4, 128]) * inv[:, :, None], [ROWS, 512])
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    c = tl.where(tl.abs(x) < float("inf"), y.to(tl.float8e4nv).to(tl.uint8, bitcast=True), 0x7F)
    tl.store(q_ptr + offs, c.to(tl.uint8), mask=mask)
    groups = tl.arange(0, 4)
    tl.store(s_ptr + rows[:, None] * n_gk + groups[None, :], s, mask=(rows[:, None] < M) & (groups[None, :] < n_gk))


def quantize_blocks_one_row_tile(x, block=(1, 128)):
    """q3 with the 1x128 groups of 8 rows per program in one 8 x 512 tile, four groups a row and no grid along K:
    enough for the public check's K of 300 and 40, not for a longer row; 128x128 blocks one per program."""
    if block != (1, 128):
        return triton_groups()(x, block)
    k = x.shape[-1]
    x2 = x.contiguous().reshape(-1, k)
    m = x2.shape[0]
    n_gk = triton.cdiv(k, 128)
    q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.zeros((m, n_gk), dtype=torch.float32, device=x.device)
    _groups_of_one_row_tile_kernel[(triton.cdiv(m, 8),)](x2, q.view(torch.uint8), s, m, k, n_gk, ROWS=8)
    return q, s.reshape(*x.shape[:-1], n_gk)


def quantize_mxfp8_sixteen_blocks(x, rounding="floor"):
    """q4 as whole rows in one (16, 32) tile: 16 blocks of 32, room for the public check's K of 300 and 40; the
    blocks of a longer row past 512 are never computed."""
    x = x.contiguous()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    n_blocks = triton.cdiv(k, 32)
    q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.zeros((*x.shape[:-1], n_blocks), dtype=torch.uint8, device=x.device)
    _mx_whole_row_kernel[(x2.shape[0],)](x2, q.view(torch.uint8), s, k, n_blocks, NB=16, ROUND_UP=rounding == "up")
    return q, s


class HistoryOfFour(History):
    """q5 with a window of 4 steps, the public check's history_len, whatever history_len says."""

    def __init__(self, history_len=16, margin=0):
        super().__init__(4, margin)


class MarginAsFactor(History):
    """q5 with the margin as a factor of 1 + margin, not 2^margin: the same for the public check's margins 0 and 1."""

    def _s(self, amax):
        amax = amax * (1 + self.margin)
        return torch.tensor(amax / 448.0 if amax else 1.0, device=DEVICE)


def dequantize_by_a_table_of_powers(q, s, granularity):
    """q6 (a) as :func:`dequantize_by_gather`, its table 2^(c - 127) for all 256 bytes: 255 gives 2^128, inf in
    fp32, not NaN; no quantizer writes byte 255, so the public check never shows one."""
    k = q.shape[-1] if q.dim() else 1
    q2 = q.reshape(-1, k)
    m = q2.shape[0]
    gm, gk = _group_shape(granularity, m, k)
    table = torch.tensor([2.0 ** (c - 127) for c in range(256)], dtype=torch.float64).float().to(q.device)
    sv = table[s.long()] if granularity == "mxfp8" else s.float()
    sv = sv.reshape(-(-m // gm), -(-k // gk))
    rows = torch.arange(m, device=q.device) // gm
    cols = torch.arange(k, device=q.device) // gk
    return (q2.float() * sv[rows[:, None], cols[None, :]]).reshape(q.shape)


def matmul_first_block_row(aq, a_s, wq, w_s):
    """q6 (b) one K block at a time, W's scale read as w_s[0, b], as the lab's comparison cell does: right for
    the public check's 96 columns, one block row, and for no column past 128."""
    m, k = aq.shape
    y = torch.zeros(m, wq.shape[0], dtype=torch.float32, device=aq.device)
    for b in range(triton.cdiv(k, 128)):
        ks = slice(b * 128, (b + 1) * 128)
        y += (aq[:, ks].float() @ wq[:, ks].float().T) * a_s[:, b : b + 1] * w_s[0, b]
    return y


HIDDEN_CATCHES = {
    "q1": {"amax of the first block only": quantize_tensor_amax_of_one_block},
    "q2": {"BLOCK_K fixed at 512": quantize_rowwise_block_k_512},
    "q3": {"1x128 groups of one 512-wide tile": quantize_blocks_one_row_tile},
    "q4": {"16 MX blocks per row": quantize_mxfp8_sixteen_blocks},
    "q5": {"a window of 4 whatever history_len": HistoryOfFour, "margin as a factor 1 + margin": MarginAsFactor},
    "q6": {
        "E8M0 byte 255 as 2^128 (inf), not NaN": (dequantize_by_a_table_of_powers, matmul_by_einsum),
        "W's first block row of scales for every column": (dequantize_by_gather, matmul_first_block_row),
    },
}
