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

import kernels
from kernels import accumulate, formats, hazards, stochastic
from kernels.checks import ExerciseNotDone, lab03, passes

DEVICE = "cpu" if kernels.INTERPRETER else "cuda"

# -- q1: stochastic rounding, written in torch with the package's random bits ---------------------------


def student_sr(x, fmt, seed, *, noise="right", shared=False, ignore_seed=False, saturate=None, nan_case=True):
    """Stochastic rounding by the integer recipe, with switches for the mistakes students make."""
    spec = formats._SPECS[fmt]
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
    return formats._from_codes(out, int_dtype).view(formats.TORCH_DTYPES[fmt]).to(x.device)


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
    return formats._from_codes(out, torch.int16).view(torch.bfloat16).to(x.device)


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
