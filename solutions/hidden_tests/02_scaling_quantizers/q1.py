"""Lab 2 q1, hidden: per-tensor scaling on fresh inputs whose largest value lies in their last row."""

from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: fresh inputs, the outlier in the last row", hidden=True)
def test_q1_fresh_inputs(quantize_tensor):
    import torch

    from kernels.checks import lab02

    x = lab02.fresh_input(seed=5171, shape=(97, 611))
    inputs = {
        "fresh 97x611": torch.where(torch.isfinite(x), x, torch.zeros_like(x)),
        "fresh (3, 5, 333) with NaN and +-inf": lab02.fresh_input(seed=5172, shape=(3, 5, 333)),
    }
    lab02.check_per_tensor(quantize_tensor, inputs=inputs)
