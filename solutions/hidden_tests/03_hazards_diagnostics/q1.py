"""Lab 3 q1, hidden: fresh values in every binade, each value's copies spread over every block, other seeds."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh values, copies spread over every block", hidden=True)
def test_q1_fresh_values_interleaved(stochastic_round):
    from kernels.checks import lab03

    values = {fmt: lab03.sr_fresh_values(fmt, seed=20263 + i, n=32) for i, fmt in enumerate(lab03.SR_FORMATS)}
    lab03.check_stochastic_round(stochastic_round, seeds=(20265, 20266), values=values, interleave=True)
