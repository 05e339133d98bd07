"""kernels.hadamard: the rotation is orthonormal, the kernel matches its float64 reference and leaves
products unchanged, and on outlier channels it buys MXFP4 accuracy."""

import pytest
import torch

from kernels import fp4, hadamard
from kernels.device import default_device
from kernels.testing import compare

DEVICE = default_device()


@pytest.mark.parametrize("block", hadamard.HADAMARD_BLOCKS)
def test_hadamard_is_orthonormal(block):
    h = hadamard.hadamard_matrix(block, dtype=torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(block, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError, match="power of two"):
        hadamard.hadamard_matrix(block + 1)


@pytest.mark.parametrize("block", hadamard.HADAMARD_BLOCKS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_hadamard_kernel_matches_reference_and_preserves_products(block, dtype):
    g = torch.Generator().manual_seed(block)
    a = torch.randn(9, 256, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(70, 256, generator=g).to(dtype).to(DEVICE)
    d = hadamard.random_signs(block, seed=1, device=DEVICE)
    ra, rw = hadamard.hadamard_rotate(a, block, d), hadamard.hadamard_rotate(w, block, d)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8  # bf16 output: one rounding of the fp32 sum
    c = compare(ra, hadamard.hadamard_rotate_reference(a, block, d), atol=tol, rtol=tol, name=f"rotate {block}")
    assert c.ok, c.report
    back = hadamard.hadamard_rotate(ra, block, d, inverse=True)
    c = compare(back, a, atol=4 * tol, rtol=4 * tol, name="inverse")
    assert c.ok, c.report
    prod = ra.double() @ rw.double().T
    assert torch.allclose(prod, a.double() @ w.double().T, atol=2e-1 if dtype == torch.bfloat16 else 1e-3)


def test_rotation_on_outlier_channels():
    # Activations with three outlier channels (x40), both operands quantized: the relative error of the
    # product.  The rotation spreads the outliers over each block, which pays where the scale is coarse
    # (MXFP4: blocks of 32, power-of-two scales) and not where it is fine (NVFP4: 16 elements, E4M3).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g)
    x[:, [7, 100, 200]] *= 40.0
    w = torch.randn(64, 256, generator=g) * 0.05
    ref = x @ w.T

    def err(fmt, block):
        xq = fp4.fake_quantize(x.to(DEVICE), fmt, rotate_block=block).cpu()
        wq = fp4.fake_quantize(w.to(DEVICE), fmt, rotate_block=block).cpu()
        return ((xq @ wq.T - ref).pow(2).mean() / ref.pow(2).mean()).item()

    mx_plain, mx_rot, nv_plain = err("mxfp4", None), err("mxfp4", 32), err("nvfp4", None)
    print(f"relative MSE: mxfp4 {mx_plain:.4f}, mxfp4 rotated {mx_rot:.4f}, nvfp4 {nv_plain:.4f}")
    assert mx_rot < 0.9 * mx_plain
    assert nv_plain < mx_plain


def test_hadamard_errors():
    with pytest.raises(ValueError, match="block must be one of"):
        hadamard.hadamard_rotate(torch.zeros(2, 64, device=DEVICE), 64)
    with pytest.raises(ValueError, match="multiple of block"):
        hadamard.hadamard_rotate(torch.zeros(2, 40, device=DEVICE), 32)
    with pytest.raises(ValueError, match="only \\+1 and -1"):
        hadamard.hadamard_rotate(torch.zeros(2, 32, device=DEVICE), 32, torch.full((32,), 0.5))
