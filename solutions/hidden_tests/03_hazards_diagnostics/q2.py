"""Lab 3 q2, hidden: fresh rows, more of them than one program's block, and a K the public check never uses."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh inputs, 37 rows", hidden=True)
def test_q2_more_rows(dot):
    from kernels.checks import lab03

    lab03.check_accumulate(dot, m=37, ks=(77,), seed=20267, accs=("fp32",))
