"""kernels.accumulate: dot products bit for bit against the NumPy recipe for every accumulator, the
errors ordered as the formats promise, and the FP8 kernel against its model (exact on the CPU)."""

import math

import numpy as np
import pytest
import torch

from kernels import accumulate
from kernels.device import default_device
from kernels.testing import bits

DEVICE = default_device()


@pytest.mark.parametrize("k", [1, 7, 127, 1003])
@pytest.mark.parametrize("acc", list(accumulate.ACCUMULATORS))
@pytest.mark.parametrize("compensated", [False, True])
def test_dot_equals_reference(k, acc, compensated):
    g = torch.Generator().manual_seed(k)
    a = torch.randn((19, k), generator=g).to(torch.bfloat16)
    b = torch.randn((19, k), generator=g).to(torch.bfloat16)
    got = accumulate.dot(a.to(DEVICE), b.to(DEVICE), acc, compensated)
    want = accumulate.dot_reference(a, b, acc, compensated)
    assert np.array_equal(bits(got), bits(want))


def test_fp32_inputs_and_row_sums():
    g = torch.Generator().manual_seed(1)
    a = torch.randn((5, 300), generator=g)
    b = torch.randn((5, 300), generator=g)
    for bb in (b, None):
        got = accumulate.dot(a.to(DEVICE), None if bb is None else bb.to(DEVICE), "fp32")
        want = accumulate.dot_reference(a, bb, "fp32")
        assert np.array_equal(bits(got), bits(want))
        assert accumulate.relative_error(got, a, bb).max() < 1e-6
    one = accumulate.dot(a[0].to(DEVICE), b[0].to(DEVICE))
    assert one.shape == () and math.isclose(one.item(), float(a[0].double() @ b[0].double()), rel_tol=1e-5)


def test_error_order_and_kahan():
    g = torch.Generator().manual_seed(2)
    a = torch.rand((16, 1024), generator=g).to(torch.bfloat16)
    b = torch.rand((16, 1024), generator=g).to(torch.bfloat16)
    err = {
        (acc, c): accumulate.relative_error(accumulate.dot(a.to(DEVICE), b.to(DEVICE), acc, c), a, b).max().item()
        for acc in accumulate.ACCUMULATORS
        for c in (False, True)
    }
    print(err)
    assert err[("fp32", False)] < 1e-6 < err[("fp16", False)] < err[("bf16", False)]
    assert err[("bf16", True)] < err[("bf16", False)] / 20
    assert err[("fp16", True)] < err[("fp16", False)] / 10


def test_nonfinite_propagate():
    a = torch.ones((2, 40))
    a[0, 3] = math.inf
    a[1, 5] = math.nan
    out = accumulate.dot(a.to(DEVICE), None, "fp32").cpu()
    assert math.isinf(out[0].item()) and math.isnan(out[1].item())


@pytest.mark.parametrize("promote_every", [None, 32, 128])
@pytest.mark.parametrize("k", [32, 300])
def test_fp8_matmul_against_model(promote_every, k):
    a, b = accumulate.random_fp8(70, k, 65, seed=k)
    got = accumulate.fp8_matmul(a.to(DEVICE), b.to(DEVICE), promote_every).cpu()
    # Compiled on Hopper and in CPU mode alike, each tl.dot is the tensor core's: bit for bit the model
    want = accumulate.fp8_matmul_reference(a, b, promote_every, tensor_core="hopper")
    assert torch.equal(got, want), f"max error {(got - want).abs().max().item():.3g}"
    lossless = accumulate.fp8_matmul_reference(a, b, promote_every)
    print(f"K={k}, promote every {promote_every}: {accumulate.matmul_error(got, a, b):.2e} of sum|ab| "
          f"(a lossless accumulator: {accumulate.matmul_error(lossless, a, b):.2e})")  # fmt: skip


# What Chapter 3's probe measured on an H200: 10 bits inside the large product's own instruction, 13 after.
H200_PROBE = {1: 10, 16: 10, 31: 10, 32: 13, 64: 13, 96: 13, 127: 13, 128: 13, 200: 13, 255: 13}


def test_probe_inputs_are_exact_and_both_lanes_read_hoppers_bits():
    a, b, exact = accumulate.probe_inputs()
    assert torch.equal(a.double() @ b.double(), exact)  # every value survived the cast to e4m3fn
    kept = accumulate.accumulator_probe(lambda x, y: accumulate.fp8_matmul(x.to(DEVICE), y.to(DEVICE)))
    assert kept == H200_PROBE
    lossless = accumulate.accumulator_probe(lambda x, y: accumulate.fp8_matmul_reference(x.cpu(), y.cpu(), None))
    assert set(lossless.values()) == {23}  # exact dots, one fp32 rounding: 24 significant bits


def test_promotion_inputs_distinguish_chunkings():
    from kernels.checks import lab03

    a, b = lab03.promotion_inputs()
    results = {
        pe: accumulate.fp8_matmul_reference(a, b, pe, block_k=32)[0, 0].item() - 2**23 for pe in (None, 64, 128, 256)
    }
    assert results == {None: 0.0, 64: 0.0, 128: 3.0, 256: 2.0}


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: accumulate.dot(torch.zeros(3, dtype=torch.int32)), TypeError),
        (lambda: accumulate.dot(torch.zeros((2, 2, 2))), ValueError),
        (lambda: accumulate.dot(torch.zeros(3), torch.zeros(4)), ValueError),
        (lambda: accumulate.dot(torch.zeros(3), acc="fp64"), ValueError),
        (lambda: accumulate.dot(torch.zeros(3), compensated=1), TypeError),
        (lambda: accumulate.dot(torch.zeros(3), lanes=12), ValueError),
        (lambda: accumulate.fp8_matmul(torch.zeros((2, 2)), torch.zeros((2, 2))), TypeError),
        (
            lambda: accumulate.fp8_matmul(
                torch.zeros((2, 3)).to(torch.float8_e4m3fn), torch.zeros((2, 2)).to(torch.float8_e4m3fn)
            ),
            ValueError,
        ),
        (
            lambda: accumulate.fp8_matmul(
                torch.zeros((2, 2)).to(torch.float8_e4m3fn), torch.zeros((2, 2)).to(torch.float8_e4m3fn), 48
            ),
            ValueError,
        ),
    ],
)
def test_bad_arguments(call, error):
    with pytest.raises(error):
        call()
