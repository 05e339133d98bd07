"""Lab 0 q2, hidden: the kernel on fresh values, at sizes and shapes the public check never uses."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh values, odd sizes and shapes", hidden=True)
def test_q2_fresh_sizes(fp32_to_bf16):
    from kernels.checks import lab00
    from kernels.checks.fresh import fresh_fp32

    for n, shape in ((3 * 701, (3, 1, 701)), (1, (1,)), (1024, (32, 32)), (1025, (1025,))):
        lab00.check_round_bf16(fp32_to_bf16, fresh_fp32(seed=n, n=n), shape=shape)
