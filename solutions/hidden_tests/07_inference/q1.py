"""Lab 7 q1, hidden: the INT8 quantizer on fresh matrices, 16 rows and K = 200 (several K tiles)."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh matrices, 16 rows, K = 200, per row and with a static scale", hidden=True)
def test_q1_fresh_matrices(quantize_int8):
    from kernels.checks import lab07

    lab07.check_quantize(quantize_int8, inputs=lab07.fresh_quantizer_inputs(seed=70701, rows=16, k=200))
