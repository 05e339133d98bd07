"""Lab 2 q2, hidden: per-row scaling on fresh inputs with rows longer than 512 and more of them."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh inputs, rows of 1100 and a 3-D one", hidden=True)
def test_q2_fresh_inputs(quantize_rowwise):
    from kernels.checks import lab02

    inputs = {
        "fresh 24x1100": lab02.fresh_input(seed=6203, shape=(24, 1100)),
        "fresh (2, 7, 600)": lab02.fresh_input(seed=6204, shape=(2, 7, 600)),
    }
    lab02.check_rowwise(quantize_rowwise, inputs=inputs)
