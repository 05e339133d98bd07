"""Lab 1 q4, hidden: a format against itself differs nowhere, NaN and -0 included (no public pair has NaN in both)."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: a format against itself", hidden=True)
def test_q4_format_against_itself(fnuz_vs_ocp):
    from kernels import formats
    from kernels.checks import lab01

    lab01.check_fnuz_vs_ocp(fnuz_vs_ocp, pairs=((formats.E4M3FN, formats.E4M3FN), (formats.E5M2FNUZ, formats.E5M2FNUZ)))
