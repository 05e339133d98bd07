"""Lab 6 q5's check (``kernels.checks.lab06.check_fp4_backward``), the FP4 training layer's backward
operands: right solutions written several ways pass, each mistake of the recipe is caught with its own
diagnosis, and the check's answer is the layer's (``kernels.fp4_linear``).  ``tests/test_checks_lab06.py``
puts these solutions in the lab's tables, which the grader's tests read."""

import pytest
import torch

from kernels import fp4, hadamard
from kernels import fp4_linear as F
from kernels.checks import ExerciseNotDone, lab06
from kernels.device import default_device

DEVICE = default_device()


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


RIGHT = {
    "the recipe": student_backward,
    "FP4Tensors returned": lambda *a: student_backward(*a, as_tensor=True),
    "rotations in fp32": lambda *a: student_backward(*a, fp32_rotation=True),
}
WRONG = {
    "nearest rounding": (lambda *a: student_backward(*a, sr=False), "rounded to nearest"),
    "seeds swapped": (lambda *a: student_backward(*a, swap_seeds=True), "other operand's seed"),
    "X^T not rotated": (lambda *a: student_backward(*a, rotate=("dY^T",)), "not rotated"),
    "rotated along the features": (lambda *a: student_backward(*a, features=True), "along the features"),
    "X^T from the forward's codes": (lambda *a: student_backward(*a, from_codes=True), "FP4 codes transposed"),
    "dY rotated too": (lambda *a: student_backward(*a, rotate=("dY", "dY^T", "X^T")), "wgrad's operands only"),
}


@pytest.mark.parametrize("name", list(RIGHT))
def test_right_solutions_pass(name, capsys):
    lab06.check_fp4_backward(RIGHT[name])
    assert "q5 passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(WRONG))
def test_each_mistake_is_caught_with_its_diagnosis(name):
    fn, diagnosis = WRONG[name]
    with pytest.raises(AssertionError) as info:
        lab06.check_fp4_backward(fn)
    message = str(info.value)
    assert diagnosis in message, f"{name}: got\n{message}"
    others = {d for n, (_, d) in WRONG.items() if d != diagnosis}
    assert not any(o in message for o in others), f"{name}: another mistake's diagnosis too:\n{message}"


def test_an_unfinished_exercise_reads_as_not_done():
    def stub(*args):
        raise NotImplementedError

    for fn in (stub, lambda *args: None, None):
        with pytest.raises(ExerciseNotDone):
            lab06.check_fp4_backward(fn)
    with pytest.raises(AssertionError, match="three quantized operands"):
        lab06.check_fp4_backward(lambda *args: (1, 2))


def test_the_checks_answer_is_the_layers():
    recipe, step = F.FP4Recipe(seed=3), 4
    x, dy, _, _ = lab06.backward_inputs()
    x, dy = x.to(DEVICE), dy.to(DEVICE)
    signs = hadamard.random_signs(16, recipe.seed)
    want = lab06.backward_reference(x, dy, recipe.step_seeds(step), signs.to(DEVICE))
    layer = F.operands(x, torch.zeros(32, x.shape[1], device=DEVICE), dy, recipe, step)
    for role, key in (("dY", "dy"), ("dY^T", "dyt"), ("X^T", "xt")):
        assert torch.equal(want[role].q.cpu(), layer[key].q.cpu()), role
        assert torch.equal(want[role].s.view(torch.uint8).cpu(), layer[key].s.view(torch.uint8).cpu()), role
