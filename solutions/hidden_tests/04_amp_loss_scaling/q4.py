"""Lab 4 q4, hidden: fresh batches, another max_norm, and the loss and skipped flag train_step returns."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh batches, max_norm=0.02, the returned loss and skipped", hidden=True)
def test_q4_returns(train_step):
    from kernels.checks import lab04

    lab04.check_train_step(train_step, seed=20284, steps=8, max_norm=0.02, returns=True)
