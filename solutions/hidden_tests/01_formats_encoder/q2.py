"""Lab 1 q2, hidden: the encoder on fresh values near fp8 ties, at sizes and shapes the public check never uses."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh values, other sizes and shapes", hidden=True)
def test_q2_fresh_sizes(fp32_to_fp8):
    from kernels.checks import lab01

    for n, shape in ((3 * 2731, (3, 2731)), (1, (1,)), (4 * 9 * 37, (4, 9, 37))):
        lab01.check_encode(fp32_to_fp8, lab01.fresh_encode_inputs(seed=4409 + n, n=n), shape=shape)
