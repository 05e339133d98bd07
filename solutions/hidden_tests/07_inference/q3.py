"""Lab 7 q3, hidden: SmoothQuant on fresh activations and weights, with act_amax from a calibration batch
of its own rather than from x."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: fresh T = 50, K = 96, N = 40, act_amax calibrated apart from x", hidden=True)
def test_q3_fresh_calibration(smooth_quant):
    from kernels.checks import lab07

    lab07.check_smooth_quant(smooth_quant, inputs=lab07.fresh_smooth_inputs(seed=70704, t=50, k=96, n=40))
