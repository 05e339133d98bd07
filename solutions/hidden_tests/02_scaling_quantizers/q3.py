"""Lab 2 q3, hidden: 1x128 groups and 128x128 blocks on fresh inputs wider than 512, with partial edges."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: fresh inputs, K of 650 and 1000", hidden=True)
def test_q3_fresh_inputs(quantize_blocks):
    from kernels.checks import lab02

    groups = {
        "fresh 20x1000": lab02.fresh_input(seed=7331, shape=(20, 1000)),
        "fresh (3, 4, 650)": lab02.fresh_input(seed=7332, shape=(3, 4, 650)),
    }
    blocks = {"fresh 260x650": lab02.fresh_input(seed=7333, shape=(260, 650))}
    lab02.check_blocks(quantize_blocks, inputs=groups, block_inputs=blocks)
