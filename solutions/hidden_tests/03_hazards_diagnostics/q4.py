"""Lab 3 q4, hidden: fresh rows, 13 of them, of lengths that are neither powers of two nor multiples of 128."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh 13-row inputs, N=1000 and N=5000", hidden=True)
def test_q4_other_sizes(row_mean):
    from kernels.checks import lab03

    lab03.check_row_mean(row_mean, sizes=(1000, 5000), m=13, seed=20269)
