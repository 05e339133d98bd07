"""Lab 4 q3, hidden: RMSNorm in fp16, on fresh inputs of other shapes (more rows than the backward's programs)."""

from otter.test_files import test_case

name = "q3"


@test_case(name="q3 hidden: fp16, fresh shapes", hidden=True)
def test_q3_fp16(rmsnorm_forward, rmsnorm_backward):
    import torch

    from kernels.checks import lab04

    shapes = ((5, 1), (11, 300), (6, 2049))
    lab04.check_rmsnorm(rmsnorm_forward, rmsnorm_backward, dtype=torch.float16, shapes=shapes, seed=20283)
