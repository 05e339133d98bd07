"""Lab 7 q2, hidden: the W8A8 GEMM on fresh codes and scales, M = 40 and M = 1, K not a multiple of 64."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh GEMMs, 40 x 24 with K = 700 and 1 x 48 with K = 333", hidden=True)
def test_q2_fresh_gemms(w8a8_matmul):
    from kernels.checks import lab07

    for seed, (m, n, k) in ((70702, (40, 24, 700)), (70703, (1, 48, 333))):
        lab07.check_w8a8(w8a8_matmul, inputs=lab07.fresh_gemm_inputs(seed, m, n, k))
