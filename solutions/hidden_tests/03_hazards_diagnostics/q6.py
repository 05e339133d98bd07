"""Lab 3 q6, hidden: fresh tensors of several blocks (a partial last one) and amaxes the public check never uses."""

from otter.test_files import test_case

name = "q6"


@test_case(name="q6 hidden: fresh 4099-element tensors, other amaxes", hidden=True)
def test_q6_several_blocks(quantize_fp8):
    from kernels.checks import lab03

    lab03.check_quantize(quantize_fp8, amaxes=(2.5e-5, 3.0, 6e3), n=4099, seed=20271)
