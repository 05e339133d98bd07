"""Lab 6 q2, hidden: the dequantizer on fresh codes and scales, 37 rows and K = 160 (not a multiple of 64)."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh codes, 37 rows, K = 160", hidden=True)
def test_q2_fresh_codes(dequantize_fp4):
    from kernels.checks import lab06

    lab06.check_dequantize(dequantize_fp4, inputs=lab06.fresh_quantizer_inputs(seed=60602, rows=37, k=160))
