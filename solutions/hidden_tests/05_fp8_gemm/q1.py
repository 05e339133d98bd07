"""Lab 5 q1, hidden: the GEMM on fresh operands, M = 1 and M, N past one 128 tile, K of one and of four blocks."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh operands, M = 1, M and N past one 128 tile", hidden=True)
def test_q1_fresh_shapes(fp8_gemm_v1):
    from kernels.checks import lab05

    lab05.check_gemm_v1(fp8_gemm_v1, shapes=((1, 136, 80), (144, 40, 400)), seed=50501)
