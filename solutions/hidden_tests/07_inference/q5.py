"""Lab 7 q5, hidden: FP8 attention on fresh inputs, two sequences per batch, 150 query rows and 90 keys in
both orders, outlier channels at other places."""

from otter.test_files import test_case

name = "q5"


@test_case(name="q5 hidden: fresh inputs, batch 2, N_q = 150 and N_k = 90 in both orders, D = 64", hidden=True)
def test_q5_fresh_inputs(flash_attention_fp8):
    from kernels.checks import lab07

    inputs = lab07.fresh_fp8_attention_inputs(seed=70706, batch=2, n_q=150, n_k=90, d=64)
    lab07.check_flash_attention_fp8(flash_attention_fp8, inputs=inputs)
