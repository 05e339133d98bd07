"""Lab 0 q1, hidden: round_bf16_bits on bit patterns the public check never shows, in a 2-D tensor."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh patterns in a 2-D tensor", hidden=True)
def test_q1_fresh_patterns_2d(round_bf16_bits):
    from kernels.checks import lab00
    from kernels.checks.fresh import fresh_fp32

    lab00.check_round_bf16_bits(round_bf16_bits, fresh_fp32(seed=20261, n=96 * 37), shape=(96, 37))
