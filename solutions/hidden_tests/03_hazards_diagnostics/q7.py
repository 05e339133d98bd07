"""Lab 3 q7, hidden: fresh rows, 7 of them, a row shorter than the lanes and a longer one."""

from otter.test_files import test_case

name = "q7"


@test_case(name="q7 hidden: fresh 7-row inputs, N=200 and N=5000", hidden=True)
def test_q7_other_sizes(variance):
    from kernels.checks import lab03

    lab03.check_variance(variance, sizes=(200, 5000), m=7, seed=20272)
