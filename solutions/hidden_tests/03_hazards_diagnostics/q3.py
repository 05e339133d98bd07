"""Lab 3 q3, hidden: the designed and random products on outputs of several tiles, partial ones included."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: 40 x 80 outputs, fresh random K=200", hidden=True)
def test_q3_several_tiles(fp8_matmul):
    from kernels.checks import lab03

    lab03.check_fp8_promotion(fp8_matmul, m=40, n=80, k=200, seed=20268)
