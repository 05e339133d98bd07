"""Lab 2 q4, hidden: MXFP8, both roundings, on fresh inputs with rows longer than 512."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh inputs, rows of 1100 and a 3-D one", hidden=True)
def test_q4_fresh_inputs(quantize_mxfp8):
    from kernels.checks import lab02

    inputs = {
        "fresh 24x1100": lab02.fresh_input(seed=8117, shape=(24, 1100)),
        "fresh (2, 7, 600)": lab02.fresh_input(seed=8118, shape=(2, 7, 600)),
    }
    lab02.check_mxfp8(quantize_mxfp8, inputs=inputs)
