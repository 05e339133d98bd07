"""Lab 5 q6, hidden: the swap on a model of another width and depth, from another seed."""

from otter.test_files import test_case

name = "q6"


@test_case(name="q6 hidden: a model of width 32 and depth 3", hidden=True)
def test_q6_other_model(fp8_swap):
    from kernels.checks import lab05

    lab05.check_fp8_swap(fp8_swap, dim=32, depth=3, seed=50506)
