"""Lab 6 q4, hidden: the rotation of fresh activations, 37 rows, K = 384, under signs the public check never uses."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh activations and signs, 37 rows, K = 384", hidden=True)
def test_q4_fresh_activations(hadamard_rotate):
    from kernels.checks import lab06

    lab06.check_hadamard(hadamard_rotate, x=lab06.fresh_activations(seed=60605, rows=37, k=384), seed=60606)
