"""Lab 5 q5, hidden: the FP8 layer on fresh data, tokens over eight decades, every token's row of Y within bound."""

from otter.test_files import test_case

name = "q5"


@test_case(name="q5 hidden: fresh data, tokens over eight decades, every token within the bound", hidden=True)
def test_q5_fresh_data(fp8_linear_fn):
    from kernels.checks import lab05

    for shape, seed in (((96, 64, 48), 50505), ((48, 96, 80), 50506)):
        lab05.check_fp8_linear(fp8_linear_fn, shape=shape, seed=seed, decades=4.0, every_token=True)
