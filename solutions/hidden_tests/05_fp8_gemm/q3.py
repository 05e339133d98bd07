"""Lab 5 q3, hidden: the rowwise GEMM on fresh operands, M = 1 and M, N past one 128 tile: every tile's scales."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: fresh operands, M = 1, M and N past one 128 tile", hidden=True)
def test_q3_fresh_shapes(fp8_gemm_rowwise):
    from kernels.checks import lab05

    lab05.check_gemm_rowwise(fp8_gemm_rowwise, shapes=((1, 136, 80), (144, 40, 400)), seed=50503)
