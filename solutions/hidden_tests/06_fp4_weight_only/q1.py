"""Lab 6 q1, hidden: both quantizers on fresh matrices of several row tiles, K not a multiple of 64."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh matrices, 37 rows, K = 96", hidden=True)
def test_q1_fresh_matrices(quantize_fp4):
    from kernels.checks import lab06

    lab06.check_quantize(quantize_fp4, inputs=lab06.fresh_quantizer_inputs(seed=60601, rows=37, k=96))
