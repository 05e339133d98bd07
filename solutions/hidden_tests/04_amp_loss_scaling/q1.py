"""Lab 4 q1, hidden: fresh gradients of other sizes, other scales, an inf or NaN early in a long gradient."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh gradients, an inf or NaN early in a chunk", hidden=True)
def test_q1_fresh_gradients(unscale_):
    import math

    from kernels.checks import lab04

    lab04.check_unscale(
        unscale_,
        seed=20281,
        shapes=((20_000,), (5,), (2, 2049), (16_385,), (1,)),
        scales=(2.0**-11, 1 / 7),
        placements=(("inf", math.inf, 0, 0), ("NaN", math.nan, 2, 100), ("-inf", -math.inf, 3, 16_384)),
    )
