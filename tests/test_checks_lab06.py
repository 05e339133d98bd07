"""Lab 6's checks pass the right answers and catch each wrong one with the right diagnosis.

The wrong solutions are written the way a student would write them (plain torch here, for speed; the
checks only see outputs): each differs from a right solution by one switch, and must get the diagnosis
that names that mistake.
"""

import math
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from _student import assert_student_solution_passes

from kernels import fp4, hadamard, w4a16
from kernels.checks import ExerciseNotDone, lab06
from kernels.device import default_device

DEVICE = default_device()
MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # boundaries between E2M1 neighbours


def _codes(mag: torch.Tensor, rounding: str) -> torch.Tensor:
    grid = torch.tensor(fp4.E2M1_VALUES)
    if rounding == "toward zero":
        return sum((mag >= g).to(torch.int32) for g in grid[1:])
    if rounding == "ties away":
        return sum((mag >= b).to(torch.int32) for b in MIDS)
    # nearest, ties to even: the upper code of a boundary is even at 0.75, 1.75, 3.5
    return sum((mag >= b if b in (0.75, 1.75, 3.5) else mag > b).to(torch.int32) for b in MIDS)


def student_quantize(
    x, fmt, *, swap=False, e8m0_shift=0, ts_mode="right", rounding="nearest", keep_sign=True, saturate=True
):
    """An FP4 quantizer written from the lab's recipe, with a switch for each mistake."""
    x = x.detach().cpu().float()
    m, k = x.shape
    bs = fp4.FORMATS[fmt]
    xb = x.reshape(m, k // bs, bs)
    amax = xb.abs().amax(-1)
    ts = None
    if fmt == "nvfp4":
        t_amax = x.abs().max()
        ts = torch.clamp(t_amax / 2688.0, min=2.0**-126) if t_amax > 0 else torch.tensor(1.0)
        ts_used = torch.tensor(1.0) if ts_mode in ("ignored", "returned but unused") else ts
        if ts_mode == "ignored":
            ts = torch.tensor(1.0)
        sb = (amax / (6.0 * ts_used)).clamp(max=448.0).to(torch.float8_e4m3fn)
        denom = sb.float() * ts_used
        inv = torch.where(denom > 0, 1.0 / denom.clamp(min=1e-45), torch.zeros_like(denom))
        s = sb
    else:
        e = torch.floor(torch.log2(amax.clamp(min=2.0**-126))).to(torch.int32) - 2 + e8m0_shift
        e = torch.where(amax == 0, torch.zeros_like(e), e).clamp(-127, 127)
        s = (e + 127).to(torch.uint8)
        inv = 2.0 ** (-e.float())
    v = xb * inv[..., None]
    mag = v.abs().clamp(max=6.0)
    c = _codes(mag, rounding)
    if not saturate:  # an integer encoder without a clamp: 6 rounds up to "8", carrying into the sign bit
        c = torch.where(v.abs() >= 7.0, torch.full_like(c, 8), c)
    if keep_sign:
        c = c | (torch.signbit(xb).to(torch.int32) << 3)
    c = c.reshape(m, k).to(torch.uint8)
    lo, hi = c[:, 0::2], c[:, 1::2]
    q = (hi | (lo << 4)) if swap else (lo | (hi << 4))
    return q.to(x.device), s, (ts.float() if ts is not None else None)


def student_dequantize(q, s, ts, fmt, *, swap=False, use_ts=True, e8m0_bias=127, keep_sign=True):
    q = q.cpu()
    lo, hi = q & 0xF, q >> 4
    if swap:
        lo, hi = hi, lo
    c = torch.stack((lo, hi), -1).reshape(q.shape[0], -1).to(torch.int64)
    v = torch.tensor(fp4.E2M1_VALUES)[c & 7]
    if keep_sign:
        v = torch.where((c & 8) != 0, -v, v)
    bs = fp4.FORMATS[fmt]
    if fmt == "nvfp4":
        scale = s.cpu().float()
    else:
        scale = 2.0 ** (s.cpu().float() - e8m0_bias)
    y = v.reshape(q.shape[0], -1, bs) * scale[..., None]
    if fmt == "nvfp4" and use_ts:
        y = y * ts.cpu().float()
    return y.reshape(q.shape[0], -1)


def student_w4a16(a, q, s, ts, fmt, *, swap=False, use_ts=True, block_scales=True):
    if block_scales:
        w = student_dequantize(q, s, ts, fmt, swap=swap, use_ts=use_ts)
    else:
        w = student_dequantize(q, torch.full_like(s.view(torch.uint8), 127 if fmt == "mxfp4" else 0x38), ts, fmt)
        if fmt == "nvfp4":
            w = w.reshape(q.shape[0], -1)
    return (a.cpu().double() @ w.double().T).to(torch.bfloat16)


def student_hadamard(x, block, signs, *, normalize=True, use_signs=True, signs_after=False, whole_row=False):
    xd = x.detach().cpu().double()
    d = signs.cpu().double() if use_signs else torch.ones(block, dtype=torch.float64)
    b = xd.shape[-1] if whole_row else block
    h = hadamard.hadamard_matrix(b, dtype=torch.float64, normalized=normalize)
    xb = xd.reshape(xd.shape[0], -1, b)
    if whole_row:
        y = (xb @ h).reshape(xd.shape)
        return y.to(x.dtype)
    y = (xb @ h) * d if signs_after else (xb * d) @ h
    return y.reshape(xd.shape).to(x.dtype)


def student_backward(x, dy, seeds, signs, *, sr=True, rotate=("dY^T", "X^T"), features=False, from_codes=False,
                     swap_seeds=False, fp32_rotation=False, as_tensor=False):  # fmt: skip
    """A solution of q5 with the package's quantizer and rotation; the keywords plant one mistake each
    (or, ``fp32_rotation`` and ``as_tensor``, write a right solution another way)."""
    s_dgrad, s_wgrad = (seeds[1], seeds[0]) if swap_seeds else seeds

    def quant(t, seed=None):
        kw = {"stochastic_rounding": sr and seed is not None, "seed": seed if sr and seed is not None else 0}
        out = fp4.quantize_nvfp4(t.contiguous(), **kw)
        return out if as_tensor else (out.q, out.s, out.tensor_scale)

    def rot(t):  # t: (rows, tokens)
        if features:
            return hadamard.hadamard_rotate(t.t().contiguous(), 16, signs).t()
        return hadamard.hadamard_rotate(t.float().contiguous() if fp32_rotation else t.contiguous(), 16, signs)

    dy_in = hadamard.hadamard_rotate(dy.contiguous(), 16, signs) if "dY" in rotate else dy  # along its K
    xt = x.t()
    if from_codes:
        xt = fp4.dequantize_fp4(fp4.quantize_nvfp4(x), torch.bfloat16).t()
    dyt, xt = (rot(t) if role in rotate else t for role, t in (("dY^T", dy.t()), ("X^T", xt)))
    return quant(dy_in, s_dgrad), quant(dyt, s_wgrad), quant(xt)


def right_quantize(x, fmt):
    return student_quantize(x, fmt)


WRONG_SOLUTIONS = {
    "q1": {
        "nibbles swapped": lambda x, fmt: student_quantize(x, fmt, swap=True),
        "E8M0 scale off by one (too high)": lambda x, fmt: student_quantize(x, fmt, e8m0_shift=1),
        "E8M0 scale off by one (too low)": lambda x, fmt: student_quantize(x, fmt, e8m0_shift=-1),
        "NVFP4 tensor scale ignored": lambda x, fmt: student_quantize(x, fmt, ts_mode="ignored"),
        "NVFP4 tensor scale unused": lambda x, fmt: student_quantize(x, fmt, ts_mode="returned but unused"),
        "rounding toward zero": lambda x, fmt: student_quantize(x, fmt, rounding="toward zero"),
        "ties away from zero": lambda x, fmt: student_quantize(x, fmt, rounding="ties away"),
        "sign dropped": lambda x, fmt: student_quantize(x, fmt, keep_sign=False),
        "no saturation": lambda x, fmt: student_quantize(x, fmt, saturate=False),
        "constant output": lambda x, fmt: tuple(
            torch.zeros_like(t) if i == 0 else t for i, t in enumerate(student_quantize(x, fmt))
        ),
    },
    "q2": {
        "nibbles swapped": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt, swap=True),
        "NVFP4 tensor scale ignored": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt, use_ts=False),
        "E8M0 scale off by one": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt, e8m0_bias=126),
        "sign dropped": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt, keep_sign=False),
    },
    "q3": {
        "nibbles swapped": lambda a, q, s, ts, fmt: student_w4a16(a, q, s, ts, fmt, swap=True),
        "NVFP4 tensor scale ignored": lambda a, q, s, ts, fmt: student_w4a16(a, q, s, ts, fmt, use_ts=False),
        "block scales not applied": lambda a, q, s, ts, fmt: student_w4a16(a, q, s, ts, fmt, block_scales=False),
        "constant output": lambda a, q, s, ts, fmt: torch.zeros(a.shape[0], q.shape[0], dtype=torch.bfloat16),
    },
    "q4": {
        "not normalized": lambda x, b, d: student_hadamard(x, b, d, normalize=False),
        "signs ignored": lambda x, b, d: student_hadamard(x, b, d, use_signs=False),
        "signs after H": lambda x, b, d: student_hadamard(x, b, d, signs_after=True),
        "whole row rotated": lambda x, b, d: student_hadamard(x, b, d, whole_row=True),
    },
    "q5": {
        "nearest rounding": lambda *a: student_backward(*a, sr=False),
        "seeds swapped": lambda *a: student_backward(*a, swap_seeds=True),
        "X^T not rotated": lambda *a: student_backward(*a, rotate=("dY^T",)),
        "rotated along the features": lambda *a: student_backward(*a, features=True),
        "X^T from the forward's codes": lambda *a: student_backward(*a, from_codes=True),
        "dY rotated too": lambda *a: student_backward(*a, rotate=("dY", "dY^T", "X^T")),
    },
}

EXPECTED = {
    "q1": {
        "nibbles swapped": "nibbles swapped",
        "E8M0 scale off by one (too high)": "E8M0 scale off by one",
        "E8M0 scale off by one (too low)": "E8M0 scale off by one",
        "NVFP4 tensor scale ignored": "NVFP4 tensor scale ignored",
        "NVFP4 tensor scale unused": "NVFP4 tensor scale ignored",
        "rounding toward zero": "rounded toward zero",
        "ties away from zero": "ties rounded away from zero",
        "sign dropped": "signs lost",
        "no saturation": "no saturation",
        "constant output": "whatever the input",
    },
    "q2": {
        "nibbles swapped": "nibbles swapped",
        "NVFP4 tensor scale ignored": "NVFP4 tensor scale ignored",
        "E8M0 scale off by one": "E8M0 scale off by one",
        "sign dropped": "signs lost",
    },
    "q3": {
        "nibbles swapped": "nibbles swapped",
        "NVFP4 tensor scale ignored": "NVFP4 tensor scale ignored",
        "block scales not applied": "block scales not applied",
        "constant output": "every output is 0",
    },
    "q4": {
        "not normalized": "not normalized",
        "signs ignored": "random signs are ignored",
        "signs after H": "signs applied after H",
        "whole row rotated": "whole row",
    },
    "q5": {
        "nearest rounding": "rounded to nearest",
        "seeds swapped": "other operand's seed",
        "X^T not rotated": "not rotated",
        "rotated along the features": "along the features",
        "X^T from the forward's codes": "FP4 codes transposed",
        "dY rotated too": "wgrad's operands only",
    },
}

CHECKS = {
    "q1": lab06.check_quantize,
    "q2": lab06.check_dequantize,
    "q3": lab06.check_w4a16,
    "q4": lab06.check_hadamard,
    "q5": lab06.check_fp4_backward,
}

RIGHT = {
    "q1": right_quantize,
    "q2": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt),
    "q3": lambda a, q, s, ts, fmt: student_w4a16(a, q, s, ts, fmt),
    "q4": lambda x, b, d: student_hadamard(x, b, d),
    "q5": student_backward,
}

PACKAGE = {
    "q1": lambda x, fmt: tuple(fp4.quantize_fp4(x, fmt))[:3],
    "q2": lambda q, s, ts, fmt: fp4.dequantize_fp4(fp4.FP4Tensor(q, s, ts, fmt)),
    "q3": lambda a, q, s, ts, fmt: w4a16.w4a16_matmul(a, fp4.FP4Tensor(q, s, ts, fmt)),
    "q4": lambda x, b, d: hadamard.hadamard_rotate(x, b, d),
    "q5": lambda x, dy, seeds, signs: student_backward(x, dy, seeds, signs, as_tensor=True),  # all the package's
}


def test_every_question_has_wrong_solutions_with_expectations():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == set(EXPECTED)
    for q, wrong in WRONG_SOLUTIONS.items():
        assert wrong and set(wrong) == set(EXPECTED[q])
    named = {"nibbles swapped", "E8M0 scale off by one (too high)", "NVFP4 tensor scale ignored"}
    named.add("rounding toward zero")
    assert named <= set(WRONG_SOLUTIONS["q1"])


@pytest.mark.parametrize("q", list(CHECKS))
def test_right_solutions_pass(q, capsys):
    CHECKS[q](RIGHT[q])
    assert f"{q} passed" in capsys.readouterr().out


@pytest.mark.parametrize("q", list(CHECKS))
def test_package_kernels_pass(q, capsys):
    CHECKS[q](PACKAGE[q])
    assert f"{q} passed" in capsys.readouterr().out


@pytest.mark.parametrize("q,name", [(q, n) for q, wrong in WRONG_SOLUTIONS.items() for n in wrong])
def test_wrong_solution_is_caught_with_its_diagnosis(q, name):
    with pytest.raises(AssertionError) as info:
        CHECKS[q](WRONG_SOLUTIONS[q][name])
    message = str(info.value)
    assert EXPECTED[q][name] in message, f"{q} / {name}: got\n{message}"
    others = {e for n, e in EXPECTED[q].items() if e != EXPECTED[q][name]}
    assert not any(o in message for o in others), f"{q} / {name}: a diagnosis of another mistake too:\n{message}"


@pytest.mark.parametrize("q", list(CHECKS))
def test_unfinished_exercise_reads_as_not_done(q):
    def stub(*args):
        raise NotImplementedError

    with pytest.raises(ExerciseNotDone, match="not done yet"):
        CHECKS[q](stub)
    with pytest.raises(ExerciseNotDone):
        CHECKS[q](lambda *args: None)


def test_q5_refuses_what_is_not_three_operands():
    with pytest.raises(ExerciseNotDone):
        lab06.check_fp4_backward(None)
    with pytest.raises(AssertionError, match="three quantized operands"):
        lab06.check_fp4_backward(lambda *args: (1, 2))


def test_inputs_are_fixed():
    a, b = lab06.quantizer_inputs(), lab06.quantizer_inputs()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ties = a["ties"]
    assert ties.shape[1] % 32 == 0 and math.isclose(ties[0, :32].abs().max().item(), 6.0)


# -- the lab notebook's starting kernels get the diagnoses its prose promises ------------------------------


def _lab_module(tmp_path, folder="labs"):
    """The lab's imports, starting kernels and host functions (not its checks), as an importable module:
    ``@triton.jit`` reads its function's source from a file."""
    import importlib.util

    import nbformat

    lab = nbformat.read(Path(__file__).resolve().parents[1] / folder / "06_fp4_weight_only.ipynb", as_version=4)
    keep = ("@triton.jit", "ROWS, COLS", "import math", "def dequantize_fp4", "def w4a16", "def hadamard_rotate")
    keep += ("def fp4_backward_operands",)
    sources = ["from kernels import device\ncaps = device.capabilities()"]
    for cell in lab.cells:
        if cell.cell_type == "code" and cell.source.startswith(keep) and "dot_scaled" not in cell.source:
            sources.append(cell.source)
    sources.append("rotate = hadamard_rotate  # what the notebook's q5 uses once q4 passes")
    path = tmp_path / f"lab06_{folder}.py"
    path.write_text("\n\n".join(sources) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lab_starting_kernels_get_the_promised_diagnoses(tmp_path):
    lab = _lab_module(tmp_path)
    ns = {name: getattr(lab, name) for name in ("quantize_fp4", "dequantize_fp4", "w4a16_matmul", "hadamard_rotate")}
    with pytest.raises(AssertionError) as info:
        lab06.check_quantize(ns["quantize_fp4"])
    message = str(info.value)
    assert "nvfp4" in message and "NVFP4 tensor scale ignored" in message
    assert "mxfp4" in message and "E8M0 scale off by one" in message
    with pytest.raises(AssertionError, match="whatever the input"):
        lab06.check_dequantize(ns["dequantize_fp4"])
    with pytest.raises(AssertionError, match="every output is 0"):
        lab06.check_w4a16(ns["w4a16_matmul"])
    with pytest.raises(AssertionError, match="block 16"):
        lab06.check_hadamard(ns["hadamard_rotate"])


def test_swapped_and_truncating_quantizer_gets_both_diagnoses():
    with pytest.raises(AssertionError) as info:
        lab06.check_quantize(lambda x, fmt: student_quantize(x, fmt, swap=True, rounding="toward zero"))
    message = str(info.value)
    assert "nibbles swapped" in message and "rounded toward zero" in message


def test_the_solution_kernels_pass(tmp_path, capsys):
    sol = _lab_module(tmp_path, "solutions")
    lab06.check_quantize(sol.quantize_fp4)
    lab06.check_dequantize(sol.dequantize_fp4)
    lab06.check_w4a16(sol.w4a16_matmul)
    lab06.check_hadamard(sol.hadamard_rotate)
    lab06.check_fp4_backward(sol.fp4_backward_operands)
    assert capsys.readouterr().out.count("passed") == 5


# -- right solutions, written the ways different students write them ---------------------------------------
# ``STUDENT_SOLUTIONS`` mirrors ``WRONG_SOLUTIONS``: per otter question, kernels that are right by the
# lab's contract but not the lab's own (nor the plain-torch ones above), each differing from it and from
# the others where compiled Triton and the interpreter could disagree: scales on the host or on the
# device, integer or float rounding, other packing, loads, tiles and dot precisions.  Every one must
# pass its check here and get full marks from the lab's otter test (``tests/test_wrong_solutions.py``).


FP32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _e2m1_by_integer_rounding(mag):
    """|v| in [0, 6] (fp32) -> E2M1 magnitude code, by Lab 1's integer recipe with M = 1, bias 1."""
    mb = mag.to(tl.uint32, bitcast=True)
    e = (mb >> 23).to(tl.int32) - 126  # E2M1's exponent field (bias 1), if |v| is normal there
    normal = e >= 1
    sig = (mb & 0x7FFFFF) | 0x800000
    shift = tl.where(normal, 22, 23 - e)
    gone = shift > 24  # below 0.25: rounds to 0
    s = tl.where(gone, 24, shift)
    kept = sig >> s
    rest = sig - (kept << s)
    half = (1 << (s - 1)).to(tl.uint32)
    kept = kept + ((rest > half) | ((rest == half) & ((kept & 1) == 1))).to(tl.uint32)
    kept = tl.where(gone, 0, kept).to(tl.int32)
    return tl.where(normal, ((e - 1) << 1) + kept, kept)  # a normal's kept bits hold the implicit 1


@triton.jit
def _quantize_host_scales_kernel(
    x_ptr, inv_ptr, q_ptr, M, K, BS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr
):  # fmt: skip
    G: tl.constexpr = COLS // BS
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=mask, other=0.0)
    gcols = tl.program_id(1) * G + tl.arange(0, G)
    inv = tl.load(inv_ptr + rows[:, None] * (K // BS) + gcols[None, :], mask=rows[:, None] < M, other=0.0)
    xg = tl.reshape(x, (ROWS, G, BS))
    code = _e2m1_by_integer_rounding(tl.minimum(tl.abs(xg * inv[:, :, None]), 6.0))
    code = code | ((xg.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 3)  # -0.0 has its sign bit too
    pairs = tl.reshape(code, (ROWS, COLS // 2, 2))
    byte = tl.sum(pairs << (tl.arange(0, 2) * 4)[None, None, :], axis=2)  # low nibble + high nibble << 4
    cols2 = tl.program_id(1) * (COLS // 2) + tl.arange(0, COLS // 2)
    tl.store(q_ptr + rows[:, None] * (K // 2) + cols2[None, :], byte.to(tl.uint8), mask=rows[:, None] < M)


def quantize_host_scales(x, fmt):
    """q1 with the scales in torch on the host (tensor divisions, correctly rounded on CPU and GPU
    alike) and only the codes in the kernel: Lab 1's integer rounding for E2M1 (M = 1, bias 1), the
    pair packed by a tl.sum of shifted nibbles, int64 row offsets, tiles of 8 x 32."""
    bs = fp4.FORMATS[fmt]
    x = x.contiguous().float()
    m, k = x.shape
    amax = x.reshape(m, k // bs, bs).abs().amax(-1)
    if fmt == "nvfp4":
        t_amax = x.abs().max()
        ts = torch.clamp(t_amax / torch.full_like(t_amax, 2688.0), min=2.0**-126)
        ts = torch.where(t_amax == 0, torch.ones_like(ts), ts)
        sb = (amax / (6.0 * ts)).clamp(max=448.0).to(torch.float8_e4m3fn)
        denom = sb.float() * ts
        inv = torch.where(denom > 0, (torch.ones_like(denom) / denom).clamp(max=3.4028234663852886e38), 0.0)
        s = sb.view(torch.uint8)
    else:
        e = ((amax.view(torch.int32) >> 23) - 129).clamp(-127, 127)  # floor(log2 amax) - 2
        e = torch.where(amax == 0, torch.zeros_like(e), e)
        s = (e + 127).to(torch.uint8)
        inv = ((127 - e) << 23).view(torch.float32)  # 2^-e
        ts = None
    q = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device)
    _quantize_host_scales_kernel[(triton.cdiv(m, 8), triton.cdiv(k, 32))](
        x, inv.contiguous(), q, m, k, BS=bs, ROWS=8, COLS=32
    )
    return q, s, ts


@triton.jit
def _e2m1_by_float_rounding(mag):
    """|v| in [0, 6] -> E2M1 magnitude code with float operations: the grid's step is 0.5 below 2, 1
    below 4, 2 above; adding 2^23 to |v| / step rounds it to an integer, ties to even."""
    inv_step = tl.where(mag < 2.0, 2.0, tl.where(mag < 4.0, 1.0, 0.5))
    r = (mag * inv_step + 8388608.0) - 8388608.0
    return r.to(tl.int32) + tl.where(mag < 2.0, 0, tl.where(mag < 4.0, 2, 4))


@triton.jit
def _quantize_strided_kernel(
    x_ptr, amax_ptr, q_ptr, s_ptr, ts_ptr, M, K, BS: tl.constexpr, NV: tl.constexpr, ROWS: tl.constexpr,
    PAIRS: tl.constexpr,
):  # fmt: skip
    G: tl.constexpr = 2 * PAIRS // BS
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    j = tl.program_id(1) * PAIRS + tl.arange(0, PAIRS)  # pair j holds elements 2j and 2j + 1
    mask = (rows[:, None] < M) & (j[None, :] < K // 2)
    base = x_ptr + rows[:, None] * K + 2 * j[None, :]
    even = tl.reshape(tl.load(base, mask=mask, other=0.0), (ROWS, G, BS // 2))  # strided loads
    odd = tl.reshape(tl.load(base + 1, mask=mask, other=0.0), (ROWS, G, BS // 2))
    amax = tl.maximum(tl.max(tl.abs(even), axis=2), tl.max(tl.abs(odd), axis=2))  # (ROWS, G)
    if NV:
        t_amax = tl.load(amax_ptr)
        ts = tl.where(t_amax == 0.0, 1.0, tl.maximum(tl.math.div_rn(t_amax, 2688.0), 1.1754943508222875e-38))
        sb = tl.minimum(tl.math.div_rn(amax, 6.0 * ts), 448.0).to(tl.float8e4nv)
        s_byte = sb.to(tl.uint8, bitcast=True)
        denom = sb.to(tl.float32) * ts
        inv = tl.where(
            denom > 0.0, tl.minimum(tl.math.div_rn(1.0, tl.maximum(denom, 1.1754943508222875e-38)), FP32_MAX), 0.0
        )
    else:
        e = (amax.to(tl.int32, bitcast=True) >> 23) - 129
        e = tl.where(amax == 0.0, 0, tl.minimum(tl.maximum(e, -127), 127))
        s_byte = (e + 127).to(tl.uint8)
        inv = ((254 - s_byte.to(tl.int32)) << 23).to(tl.float32, bitcast=True)  # 2^(127 - byte)
    lo = _e2m1_by_float_rounding(tl.minimum(tl.abs(even * inv[:, :, None]), 6.0))
    hi = _e2m1_by_float_rounding(tl.minimum(tl.abs(odd * inv[:, :, None]), 6.0))
    lo = lo | ((even.to(tl.uint32, bitcast=True) >> 31) << 3).to(tl.int32)
    hi = hi | ((odd.to(tl.uint32, bitcast=True) >> 31) << 3).to(tl.int32)
    byte = tl.reshape(lo | (hi << 4), (ROWS, PAIRS))
    tl.store(q_ptr + rows[:, None] * (K // 2) + j[None, :], byte.to(tl.uint8), mask=mask)
    gcols = tl.program_id(1) * G + tl.arange(0, G)
    tl.store(
        s_ptr + rows[:, None] * (K // BS) + gcols[None, :],
        s_byte,
        mask=(rows[:, None] < M) & (gcols[None, :] < K // BS),
    )
    if NV:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(ts_ptr, ts)


def quantize_strided(x, fmt):
    """q1 all on the device, from even and odd elements loaded with stride 2 (so packing needs no
    reshape or split: byte = code(2j) | code(2j + 1) << 4); E2M1 by fp32 float rounding (an addition of
    2^23); 1 / S clamped to fp32's max like the reference; 8 rows x 64 elements per program."""
    from kernels import quantize

    bs = fp4.FORMATS[fmt]
    x = x.contiguous().float()
    m, k = x.shape
    q = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((m, k // bs), dtype=torch.uint8, device=x.device)
    ts = torch.empty((), dtype=torch.float32, device=x.device)
    t_amax = quantize.tensor_amax(x)
    grid = (triton.cdiv(m, 8), triton.cdiv(k, 64))
    _quantize_strided_kernel[grid](x, t_amax, q, s, ts, m, k, BS=bs, NV=fmt == "nvfp4", ROWS=8, PAIRS=32)
    return q, s, (ts if fmt == "nvfp4" else None)


@triton.jit
def _e2m1_to_fp32_by_bf16_bits(c):
    mag = c & 7
    bits = tl.where(mag >= 2, (mag << 6) + 0x3F00, tl.where(mag == 1, 0x3F00, 0)) | ((c & 8) << 12)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)


@triton.jit
def _dequantize_strided_kernel(
    q_ptr, s_ptr, ts_ptr, y_ptr, M, K, BS: tl.constexpr, NV: tl.constexpr, ROWS: tl.constexpr,
    PAIRS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    j = tl.program_id(1) * PAIRS + tl.arange(0, PAIRS)
    mask = (rows[:, None] < M) & (j[None, :] < K // 2)
    b = tl.load(q_ptr + rows[:, None] * (K // 2) + j[None, :], mask=mask, other=0).to(tl.int32)
    s = tl.load(s_ptr + rows[:, None] * (K // BS) + (2 * j // BS)[None, :], mask=mask, other=0)  # per pair
    if NV:
        sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        sc = s.to(tl.int32)
        sf = tl.where(sc == 0, 0x00400000, sc << 23).to(tl.float32, bitcast=True)  # 2^(c - 127), 0: 2^-127
    y_even = _e2m1_to_fp32_by_bf16_bits(b & 0xF) * sf
    y_odd = _e2m1_to_fp32_by_bf16_bits(b >> 4) * sf
    if NV:
        ts = tl.load(ts_ptr)
        y_even = y_even * ts
        y_odd = y_odd * ts
    out = y_ptr + rows[:, None] * K + 2 * j[None, :]
    tl.store(out, y_even, mask=mask)  # strided stores: even elements, then odd ones
    tl.store(out + 1, y_odd, mask=mask)


def dequantize_strided(q, s, ts, fmt):
    """q2 decoding each nibble by building bf16 bits, one scale load per pair, the even and the odd
    elements stored with stride 2; E8M0 byte 0 decoded as 2^-127 too."""
    bs = fp4.FORMATS[fmt]
    m, k = q.shape[0], q.shape[1] * 2
    y = torch.empty((m, k), dtype=torch.float32, device=q.device)
    s = s.contiguous().view(torch.uint8)
    ts = ts.reshape(1) if ts is not None else s
    _dequantize_strided_kernel[(triton.cdiv(m, 4), triton.cdiv(k // 2, 64))](
        q.contiguous(), s, ts, y, m, k, BS=bs, NV=fmt == "nvfp4", ROWS=4, PAIRS=64
    )
    return y


@triton.jit
def _e2m1_to_fp32_by_arithmetic(c):
    """Twice the magnitude is an integer: m for e = 0, (2 + m) << (e - 1) above."""
    mag = c & 7
    e, m = mag >> 1, mag & 1
    v = tl.where(e == 0, m, (2 + m) << tl.maximum(e - 1, 0)).to(tl.float32) * 0.5
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def _dequantize_per_block_kernel(
    q_ptr, s_ptr, ts_ptr, y_ptr, M, K, BS: tl.constexpr, NV: tl.constexpr, ROWS: tl.constexpr
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)  # one block of BS elements, one scale per row
    rmask = rows < M
    pairs = g * (BS // 2) + tl.arange(0, BS // 2)
    b = tl.load(q_ptr + rows[:, None] * (K // 2) + pairs[None, :], mask=rmask[:, None], other=0).to(tl.int32)
    s = tl.load(s_ptr + rows * (K // BS) + g, mask=rmask, other=127)
    if NV:
        sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        sf = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    v = tl.reshape(tl.join(_e2m1_to_fp32_by_arithmetic(b & 0xF), _e2m1_to_fp32_by_arithmetic(b >> 4)), (ROWS, BS))
    y = v * sf[:, None]
    if NV:
        y = y * tl.load(ts_ptr)
    cols = g * BS + tl.arange(0, BS)
    tl.store(y_ptr + rows[:, None] * K + cols[None, :], y, mask=rmask[:, None])


def dequantize_per_block(q, s, ts, fmt):
    """q2 with one program per (8 rows, one scale block): codes decoded by integer arithmetic
    (2|v| = m or (2 + m) << (e - 1)), the two nibbles joined back in order."""
    bs = fp4.FORMATS[fmt]
    m, k = q.shape[0], q.shape[1] * 2
    y = torch.empty((m, k), dtype=torch.float32, device=q.device)
    s = s.contiguous().view(torch.uint8)
    ts = ts.reshape(1) if ts is not None else s
    _dequantize_per_block_kernel[(triton.cdiv(m, 8), k // bs)](
        q.contiguous(), s, ts, y, m, k, BS=bs, NV=fmt == "nvfp4", ROWS=8
    )
    return y


@triton.jit
def _w4a16_fp32_dot_kernel(
    a_ptr, q_ptr, s_ptr, ts_ptr, c_ptr, M, N, K, BS: tl.constexpr, NV: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=rm[:, None] < M, other=0.0).to(tl.float32)
        k2 = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b = tl.load(q_ptr + rn[:, None] * (K // 2) + k2[None, :], mask=rn[:, None] < N, other=0).to(tl.int32)
        kg = k0 // BS + tl.arange(0, BLOCK_K // BS)
        s = tl.load(s_ptr + rn[:, None] * (K // BS) + kg[None, :], mask=rn[:, None] < N, other=0)
        if NV:
            sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            sf = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        v = tl.join(_e2m1_to_fp32_by_arithmetic(b & 0xF), _e2m1_to_fp32_by_arithmetic(b >> 4))
        w = tl.reshape(tl.reshape(v, (BLOCK_N, BLOCK_K // BS, BS)) * sf[:, :, None], (BLOCK_N, BLOCK_K))
        acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")  # fp32 operands, no tf32
    if NV:
        acc = acc * tl.load(ts_ptr)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def w4a16_fp32_dot(a, q, s, ts, fmt):
    """q3 dequantizing to fp32 (arithmetic decode times the block scale) and multiplying fp32 operands
    with input_precision="ieee"; 16 x 32 tiles, K in steps of 64."""
    bs = fp4.FORMATS[fmt]
    m, k = a.shape
    n = q.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    s = s.contiguous().view(torch.uint8)
    ts = ts.reshape(1) if ts is not None else s
    _w4a16_fp32_dot_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 32))](
        a.contiguous(), q.contiguous(), s, ts, c, m, n, k, BS=bs, NV=fmt == "nvfp4", BLOCK_M=16, BLOCK_N=32,
        BLOCK_K=64,
    )  # fmt: skip
    return c


@triton.jit
def _w4a16_bf16_kernel(
    a_ptr, q_ptr, s_ptr, ts_ptr, c_ptr, M, N, K, BS: tl.constexpr, NV: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    a_ptrs = a_ptr + rm[:, None] * K + tl.arange(0, BLOCK_K)[None, :]
    q_ptrs = q_ptr + rn[:, None] * (K // 2) + tl.arange(0, BLOCK_K // 2)[None, :]
    s_ptrs = s_ptr + rn[:, None] * (K // BS) + tl.arange(0, BLOCK_K // BS)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
        b = tl.load(q_ptrs, mask=rn[:, None] < N, other=0).to(tl.int32)
        s = tl.load(s_ptrs, mask=rn[:, None] < N, other=0)
        if NV:
            sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            sf = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        v = tl.join(_e2m1_to_fp32_by_bf16_bits(b & 0xF), _e2m1_to_fp32_by_bf16_bits(b >> 4))
        w = tl.reshape(v, (BLOCK_N, BLOCK_K // BS, BS)) * sf[:, :, None]  # exact in fp32
        w = tl.reshape(w, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)  # and in bf16: at most 6 significant bits
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BLOCK_K
        q_ptrs += BLOCK_K // 2
        s_ptrs += BLOCK_K // BS
    if NV:
        acc = acc * tl.load(ts_ptr)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def w4a16_bf16_pointers(a, q, s, ts, fmt):
    """q3 scaling the weights in fp32 and casting them to bf16 (exact), pointers advanced each step,
    16 x 16 tiles with K in steps of 32, the grid's first axis along N."""
    bs = fp4.FORMATS[fmt]
    m, k = a.shape
    n = q.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    s = s.contiguous().view(torch.uint8)
    ts = ts.reshape(1) if ts is not None else s
    _w4a16_bf16_kernel[(triton.cdiv(n, 16), triton.cdiv(m, 16))](
        a.contiguous(), q.contiguous(), s, ts, c, m, n, k, BS=bs, NV=fmt == "nvfp4", BLOCK_M=16, BLOCK_N=16,
        BLOCK_K=32,
    )  # fmt: skip
    return c


@triton.jit
def _fwht_kernel(x_ptr, d_ptr, y_ptr, M, K, scale, B: tl.constexpr, LOG2B: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * B + tl.arange(0, B)
    offs = rows[:, None] * K + cols[None, :]
    mask = rows[:, None] < M
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(d_ptr + tl.arange(0, B))[None, :]
    for i in tl.static_range(LOG2B):  # one butterfly stage per bit of the column index
        # (no `h: tl.constexpr = 1 << i` here: compiled Triton refuses to reassign a constexpr in the
        # unrolled loop, which the interpreter allows)
        t = tl.permute(tl.reshape(x, (ROWS, B >> (i + 1), 2, 1 << i)), (0, 1, 3, 2))
        lo, hi = tl.split(t)  # the partners 2^i apart
        x = tl.reshape(tl.permute(tl.join(lo + hi, lo - hi), (0, 1, 3, 2)), (ROWS, B))
    tl.store(y_ptr + offs, (x * scale).to(tl.bfloat16), mask=mask)


def hadamard_butterflies(x, block, signs):
    """q4 with no Hadamard matrix at all: the fast Walsh-Hadamard transform, log2(B) butterfly stages
    (a + b, a - b) on the tile, in fp32, after the sign flips."""
    m, k = x.shape
    y = torch.empty_like(x)
    _fwht_kernel[(triton.cdiv(m, 8), k // block)](
        x.contiguous(), signs.float().contiguous(), y, m, k, 1.0 / math.sqrt(block), B=block,
        LOG2B=block.bit_length() - 1, ROWS=8,
    )  # fmt: skip
    return y


@triton.jit
def _hadamard_signed_rows_kernel(x_ptr, h_ptr, d_ptr, y_ptr, M, K, B: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * B + tl.arange(0, B)
    offs = rows[:, None] * K + cols[None, :]
    mask = rows[:, None] < M
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    hb = tl.arange(0, B)
    dh = tl.load(h_ptr + hb[:, None] * B + hb[None, :]).to(tl.float32) * tl.load(d_ptr + hb)[:, None]  # diag(d) H
    y = tl.dot(x, dh, input_precision="ieee")
    root = tl.sqrt_rn(tl.full((ROWS, B), B, tl.float32))
    tl.store(y_ptr + offs, tl.math.div_rn(y, root).to(tl.bfloat16), mask=mask)


def hadamard_signed_rows(x, block, signs):
    """q4 with the signs folded into H's rows (x diag(d) H = x (diag(d) H)), fp32 operands with
    input_precision="ieee", and the 1/sqrt(B) done in the kernel as a correctly rounded division by
    sqrt_rn(B); 32 rows per program."""
    m, k = x.shape
    h = hadamard.hadamard_matrix(block, dtype=torch.float32, device=x.device, normalized=False)
    y = torch.empty_like(x)
    _hadamard_signed_rows_kernel[(triton.cdiv(m, 32), k // block)](
        x.contiguous(), h, signs.float().contiguous(), y, m, k, B=block, ROWS=32
    )
    return y


STUDENT_SOLUTIONS = {
    "q1": {
        "scales in torch on the host, Lab 1's integer rounding, tl.sum packing": quantize_host_scales,
        "stride-2 loads, float rounding by 2^23, all on the device": quantize_strided,
    },
    "q2": {
        "bf16 bits, a scale per pair, stride-2 stores": dequantize_strided,
        "one program per scale block, arithmetic decode, tl.join": dequantize_per_block,
    },
    "q3": {
        "fp32 weights and activations, ieee dot, 16 x 32 tiles": w4a16_fp32_dot,
        "bf16 weights, advanced pointers, 16 x 16 tiles, N-major grid": w4a16_bf16_pointers,
    },
    "q4": {
        "fast Walsh-Hadamard butterflies, no matrix": hadamard_butterflies,
        "signs folded into H's rows, ieee dot, sqrt_rn": hadamard_signed_rows,
    },
    "q5": {
        "FP4Tensors returned": lambda *a: student_backward(*a, as_tensor=True),
        "rotations in fp32": lambda *a: student_backward(*a, fp32_rotation=True),
    },
}


@pytest.mark.parametrize(
    "question, name", [(q, name) for q, right in STUDENT_SOLUTIONS.items() for name in right], ids=str
)
def test_student_solution_passes(question, name, capsys):
    assert_student_solution_passes(CHECKS, STUDENT_SOLUTIONS, question, name, capsys)


@pytest.mark.parametrize("name", list(STUDENT_SOLUTIONS["q1"]))
def test_student_quantizers_agree_with_the_package(name):
    """The lab's final cell: the same bits as kernels.fp4 on a larger input with outliers."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(48, 256, generator=g) * 2
    x[3, 17], x[40, 200] = 250.0, -90.0
    x = x.to(DEVICE)
    for fmt in fp4.FORMATS:
        q, s, _ = STUDENT_SOLUTIONS["q1"][name](x, fmt)
        ref = fp4.quantize_fp4(x, fmt)
        assert torch.equal(q.cpu(), ref.q.cpu()), fmt
        assert torch.equal(s.view(torch.uint8).cpu(), ref.s.view(torch.uint8).cpu()), fmt


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------


def quantize_whole_tiles_only(x, fmt):
    """A launch of K // 64 column tiles (floor division, not cdiv): right on the public inputs, whose K is
    64 or 128; the columns of a last, partial tile keep the zeros their codes and scales were given."""
    q, s, ts = student_quantize(x, fmt)
    k = x.shape[1] // 64 * 64
    q[:, k // 2 :] = 0
    s.view(torch.uint8)[:, k // fp4.FORMATS[fmt] :] = 0
    return q, s, ts


def dequantize_one_row_tile(q, s, ts, fmt):
    """One program of 16 rows per column tile (the public inputs have at most 8 rows): rows past 16 stay
    as allocated, zero."""
    y = student_dequantize(q, s, ts, fmt)
    y[16:] = 0.0
    return y


def w4a16_fp16_weights(a, q, s, ts, fmt):
    """The weights decoded in fp16 (code times block scale), then cast to bf16 for the dot: fp16's range,
    2^-24 to 65504, holds the public weights' scales but not every E8M0 scale."""
    c = torch.stack((q.cpu() & 0xF, q.cpu() >> 4), -1).reshape(q.shape[0], -1).to(torch.int64)
    v = torch.tensor(fp4.E2M1_VALUES)[c & 7]
    v = torch.where((c & 8) != 0, -v, v).half()
    bs = fp4.FORMATS[fmt]
    scale = s.cpu().float() if fmt == "nvfp4" else 2.0 ** (s.cpu().float() - 127)
    w = (v.reshape(q.shape[0], -1, bs) * scale.half()[..., None]).reshape(q.shape[0], -1).to(torch.bfloat16)
    out = a.cpu().double() @ w.double().T
    return (out * ts.cpu().double() if fmt == "nvfp4" else out).to(torch.bfloat16)


def w4a16_one_row_tile(a, q, s, ts, fmt):
    """One tile of 16 activation rows (M assumed at most 16, as at decode; the public M is 5): the rows
    past it are never computed."""
    c = torch.zeros(a.shape[0], q.shape[0], dtype=torch.bfloat16)
    c[:16] = student_w4a16(a[:16], q, s, ts, fmt)
    return c


def hadamard_one_row_tile(x, block, signs):
    """One program of 16 rows per block (the public x has 8 rows): the rows past 16 stay zero."""
    y = torch.zeros_like(x.cpu())
    y[:16] = student_hadamard(x[:16], block, signs)
    return y


def hadamard_signs_of_the_public_check(x, block, signs):
    """The public check's signs, random_signs(block, seed=block), drawn again instead of the ones passed."""
    return student_hadamard(x, block, hadamard.random_signs(block, seed=block))


def backward_public_seeds(x, dy, seeds, signs):
    """q5 with the public check's stochastic-rounding seeds written in: right there, wrong on fresh seeds."""
    return student_backward(x, dy, lab06.backward_inputs()[2], signs)


HIDDEN_CATCHES = {
    "q1": {"K // 64 column tiles (floor): a partial last tile is left out": quantize_whole_tiles_only},
    "q2": {"one tile of 16 rows": dequantize_one_row_tile},
    "q3": {
        "weights decoded in fp16, whose range E8M0 scales exceed": w4a16_fp16_weights,
        "one tile of 16 activation rows": w4a16_one_row_tile,
    },
    "q4": {
        "one tile of 16 rows": hadamard_one_row_tile,
        "the public check's signs instead of the ones passed": hadamard_signs_of_the_public_check,
    },
    "q5": {"the public check's seeds instead of the ones passed": backward_public_seeds},
}
