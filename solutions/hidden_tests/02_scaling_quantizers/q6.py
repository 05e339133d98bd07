"""Lab 2 q6, hidden: dequantize on a fresh input and on E8M0 bytes of every value; the GEMM with two block rows of W."""

from otter.test_files import test_case

name = "q6"


@test_case(name="q6 hidden: dequantize on fresh codes, every E8M0 byte", hidden=True)
def test_q6_dequantize_fresh(dequantize):
    from kernels.checks import lab02

    x = lab02.fresh_input(seed=9241, shape=(70, 520))
    lab02.check_dequantize(dequantize, x=x, e8m0=lab02.random_e8m0_case(seed=9242, shape=(40, 330)))


@test_case(name="q6 hidden: block_scaled_matmul with W in two block rows", hidden=True)
def test_q6_matmul_block_rows(block_scaled_matmul):
    from kernels.checks import lab02

    lab02.check_block_scaled_matmul(block_scaled_matmul, lab02.fresh_matmul_inputs(seed=9243, m=48, n=200, k=256))
