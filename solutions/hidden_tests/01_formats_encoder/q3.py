"""Lab 1 q3, hidden: the format table of three more FP8 formats (ml_dtypes' e3m4, e4m3 and e4m3b11fnuz)."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: three formats beyond the lab's ten", hidden=True)
def test_q3_other_formats(format_properties):
    from kernels import formats
    from kernels.checks import lab01

    others = (
        formats.Format("e3m4", 3, 4, 3, True, "ieee", note="FP8 E3M4, IEEE-style"),
        formats.Format("e4m3", 4, 3, 7, True, "ieee", note="FP8 E4M3, IEEE-style: inf and NaN at exponent 15"),
        formats.Format("e4m3b11fnuz", 4, 3, 11, False, "fnuz", note="FP8 E4M3 with bias 11, 0x80 the one NaN"),
    )
    lab01.check_format_table(format_properties, fmts=others)
