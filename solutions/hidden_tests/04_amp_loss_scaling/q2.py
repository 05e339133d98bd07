"""Lab 4 q2, hidden: other growth and backoff factors and interval, overflows in a row, a checkpoint mid-count."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: other factors and interval, a checkpoint mid-count", hidden=True)
def test_q2_other_settings(LossScaler):
    import math

    from kernels.checks import lab04

    args = {"init_scale": 2.0**6, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 2}
    script = (0, 0, 0, math.inf, math.nan, 0, 0, 0, 0, -math.inf, 0, 0, 0)
    lab04.check_scaler(LossScaler, args=args, script=script, checkpoint=7)
