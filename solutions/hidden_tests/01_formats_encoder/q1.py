"""Lab 1 q1, hidden: decode on codes shuffled and repeated in a 3-D tensor, and on three more formats."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: codes shuffled and repeated in a 3-D tensor, and three more formats", hidden=True)
def test_q1_shuffled_codes_and_other_formats(decode):
    from kernels import formats
    from kernels.checks import lab01

    lab01.check_decode(decode, seed=61729, shape=(2, 4, -1))
    others = (  # "a decoder for every format": these are read from their fields alone
        formats.Format("e3m4", 3, 4, 3, True, "ieee", note="FP8 E3M4, IEEE-style"),
        formats.Format("e4m3", 4, 3, 7, True, "ieee", note="FP8 E4M3, IEEE-style: inf and NaN at exponent 15"),
        formats.Format("e4m3b11fnuz", 4, 3, 11, False, "fnuz", note="FP8 E4M3 with bias 11, 0x80 the one NaN"),
    )
    lab01.check_decode(decode, fmts=others)
