"""Lab 3 q2, hidden: fresh rows, more of them than one program's block, at a K the public check never uses."""

from otter.test_files import test_case

name = "q2"


@test_case(name="q2 hidden: fresh inputs, 17 and 33 rows, K = 77 and 2051", hidden=True)
def test_q2_more_rows(dot):
    from kernels.checks import lab03

    lab03.check_accumulate(dot, m=33, ks=(77,), seed=20267, accs=("fp32",))
    # bf16's bounds hold at K = 2051, where they were measured
    lab03.check_accumulate(dot, m=17, ks=(2051,), seed=20268, accs=("fp32", "bf16"))
