"""Lab 2's checks pass the right answers and catch each wrong one with the right diagnosis.

A "solution" is what a question's check takes (:data:`CHECKS`): one function, a class for q5, and the
pair ``(dequantize, block_scaled_matmul)`` for q6.  The wrong ones are written in plain torch the way
the mistakes happen in a kernel; :data:`WRONG_SOLUTIONS` maps each to the phrase its diagnosis must
contain.
"""

import importlib.util
import math
from pathlib import Path

import nbformat
import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels import formats
from kernels import quantize as Q
from kernels.checks import ExerciseNotDone, lab02, passes

DEVICE = "cpu" if kernels.INTERPRETER else "cuda"

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
        amax = Q._group_amax_ref(xf, gm, gk).clone()
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
    inv_el = Q._expand(inv, gm, gk, m, k)
    if saturate:
        q = Q._encode_ref(xf, inv_el, "e4m3")
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
            amax = Q._group_amax_ref(xf, 1, 32)
            e = torch.floor(torch.log2(amax / 448.0)).clamp(-127, 127)
            e = torch.where(amax == 0, torch.zeros_like(e), e)
            s = (e + 127).to(torch.uint8).reshape(s.shape)
            inv = Q._expand(2.0 ** (-e), 1, 32, *xf.shape)
            q = Q._encode_ref(xf, inv, "e4m3").reshape(x.shape)
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
    s_el = Q._expand(sf.reshape(-(-m // gm), -(-k // gk)), gm, gk, m, k).reshape(q.shape)
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
