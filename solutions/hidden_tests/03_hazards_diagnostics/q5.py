"""Lab 3 q5, hidden: fresh rows of other lengths, with logits near 0 and near -30000."""

from otter.test_files import test_case

name = "q5"


@test_case(name="q5 hidden: fresh inputs, N=64 and N=300, logits near -30000", hidden=True)
def test_q5_far_logits(softmax):
    from kernels.checks import lab03

    lab03.check_softmax(softmax, sizes=(64, 300), shifts=(0.0, -3e4), m=5, seed=20270)
