"""Lab 6 q5, hidden: the backward's operands of fresh tensors, 48 tokens, 80 inputs, 32 outputs, other seeds."""

from otter.test_files import test_case

name = "q5"


@test_case(name="q5 hidden: fresh tensors, seeds and signs, 48 tokens x 80 -> 32", hidden=True)
def test_q5_fresh_tensors(fp4_backward_operands):
    from kernels.checks import lab06

    inputs = lab06.backward_inputs(seed=60607, tokens=48, d_in=80, d_out=32)
    lab06.check_fp4_backward(fp4_backward_operands, inputs=inputs)
