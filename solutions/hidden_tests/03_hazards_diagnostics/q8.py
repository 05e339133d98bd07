"""Lab 3 q8, hidden: Lab 0's hand-picked patterns and fresh ones the public check never shows, in a 2-D tensor."""

from otter.test_files import test_case

name = "q8"


@test_case(name="q8 hidden: fresh patterns and NaN payloads in a 2-D tensor", hidden=True)
def test_q8_fresh_patterns_2d(to_bf16):
    from kernels.checks import lab03

    lab03.check_to_bf16(to_bf16, lab03.to_bf16_fresh_inputs(seed=20273, n=3 * 1031 - 33), shape=(3, 1031))
