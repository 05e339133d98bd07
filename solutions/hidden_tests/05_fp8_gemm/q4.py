"""Lab 5 q4, hidden: the blockwise GEMM on fresh operands, M = 1, three weight blocks, partial last blocks."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh operands, M = 1, three weight blocks, partial last blocks", hidden=True)
def test_q4_fresh_shapes(fp8_gemm_blockwise):
    from kernels.checks import lab05

    lab05.check_gemm_blockwise(fp8_gemm_blockwise, shapes=((1, 264, 272), (144, 40, 400)), seed=50504, promotion=False)
