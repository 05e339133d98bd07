"""Lab 7 q4, hidden: attention on fresh inputs, 150 query rows (more than one tile of 128) and 97 keys in
both orders, three heads, and a nearly-equal-scores row of 1061 keys."""

from otter.test_files import test_case

name = "q4"


@test_case(name="q4 hidden: fresh inputs, N_q = 150 and N_k = 97 in both orders, 3 heads, D = 64", hidden=True)
def test_q4_fresh_inputs(flash_attention):
    from kernels.checks import lab07

    inputs = lab07.fresh_attention_inputs(seed=70705, n_q=150, n_k=97, heads=3, d=64)
    lab07.check_flash_attention(flash_attention, inputs=inputs)
