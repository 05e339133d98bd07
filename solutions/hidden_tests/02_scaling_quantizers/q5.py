"""Lab 2 q5, hidden: delayed scaling with a 16-step window, a margin of 3 and other amaxes than the public check's."""

from otter.test_files import test_case

name = "q5"


@test_case(name="q5 hidden: a 16-step window, margin 3", hidden=True)
def test_q5_other_window_and_margin(AmaxHistory):
    from kernels.checks import lab02

    lab02.check_delayed_scaling(AmaxHistory, history_len=16, margin=3, steady=3.0, spike=96.0)
