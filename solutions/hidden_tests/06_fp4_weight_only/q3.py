"""Lab 6 q3, hidden: the W4A16 GEMM on fresh operands at other M, N, K, and on weights over twelve decades."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: fresh operands, M = 1 and 33, weights over twelve decades", hidden=True)
def test_q3_fresh_operands(w4a16_matmul):
    from kernels.checks import lab06

    for seed, (m, n, k), decades in ((60603, (1, 72, 192), 6.0), (60604, (33, 40, 256), 0.0)):
        lab06.check_w4a16(w4a16_matmul, inputs=lab06.fresh_gemm_inputs(seed, m, n, k, decades=decades))
