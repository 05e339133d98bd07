"""Lab 6's checks pass the right answers and catch each wrong one with the right diagnosis.

The wrong solutions are written the way a student would write them (plain torch here, for speed; the
checks only see outputs): each differs from a right solution by one switch, and must get the diagnosis
that names that mistake.
"""

import math
from pathlib import Path

import pytest
import torch

import kernels
from kernels import fp4
from kernels.checks import ExerciseNotDone, lab06

DEVICE = "cpu" if kernels.INTERPRETER else "cuda"
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
    h = fp4.hadamard_matrix(b, dtype=torch.float64, normalized=normalize)
    xb = xd.reshape(xd.shape[0], -1, b)
    if whole_row:
        y = (xb @ h).reshape(xd.shape)
        return y.to(x.dtype)
    y = (xb @ h) * d if signs_after else (xb * d) @ h
    return y.reshape(xd.shape).to(x.dtype)


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
}

CHECKS = {
    "q1": lab06.check_quantize,
    "q2": lab06.check_dequantize,
    "q3": lab06.check_w4a16,
    "q4": lab06.check_hadamard,
}

RIGHT = {
    "q1": right_quantize,
    "q2": lambda q, s, ts, fmt: student_dequantize(q, s, ts, fmt),
    "q3": lambda a, q, s, ts, fmt: student_w4a16(a, q, s, ts, fmt),
    "q4": lambda x, b, d: student_hadamard(x, b, d),
}

PACKAGE = {
    "q1": lambda x, fmt: tuple(fp4.quantize_fp4(x, fmt))[:3],
    "q2": lambda q, s, ts, fmt: fp4.dequantize_fp4(fp4.FP4Tensor(q, s, ts, fmt)),
    "q3": lambda a, q, s, ts, fmt: fp4.w4a16_matmul(a, fp4.FP4Tensor(q, s, ts, fmt)),
    "q4": lambda x, b, d: fp4.hadamard_rotate(x, b, d),
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
    sources = ["from kernels import device\ncaps = device.capabilities()"]
    for cell in lab.cells:
        if cell.cell_type == "code" and cell.source.startswith(keep) and "dot_scaled" not in cell.source:
            sources.append(cell.source)
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
    assert capsys.readouterr().out.count("passed") == 4
