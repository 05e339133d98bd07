"""Lab 5 q2, hidden: the grouped order on grids whose short last group starts elsewhere; the kernel at other shapes."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: grouped order on other grids, the kernel on fresh operands", hidden=True)
def test_q2_other_grids_and_shapes(grouped_tile, fp8_gemm_v2):
    from kernels.checks import lab05

    grids = ((7, 5, 4), (11, 5, 4), (13, 4, 5), (2, 9, 4), (10, 3, 4), (4, 4, 1))
    lab05.check_grouped_order(grouped_tile, grids=grids)
    lab05.check_gemm_v2(fp8_gemm_v2, shapes=((1, 264, 272), (144, 72, 400)), seed=50502)
