"""kernels.attention: the FlashAttention-style forward against float64 attention and PyTorch's own, with
the hazards of attention's numerics (fully masked rows, large scores, long rows) made to happen."""

import pytest
import torch

from kernels import attention as A
from kernels.device import default_device

DEVICE = default_device()
ATOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}  # the output's own rounding, for O(1) values


def _qkv(b, h, n_q, n_k, d, dtype=torch.bfloat16, seed=0, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g) * q_scale
    k = torch.randn(b, h, n_k, d, generator=g)
    v = torch.randn(b, h, n_k, d, generator=g)
    return (t.to(dtype).to(DEVICE) for t in (q, k, v))


def _check(o, lse, ref_o, ref_lse, dtype):
    err = (o.double() - ref_o).abs().max().item()
    assert not torch.isnan(o).any()
    assert err <= ATOL[dtype], err
    visible = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), visible), "a row is -inf in one and finite in the other"
    assert (lse.double()[visible] - ref_lse[visible]).abs().max().item() <= 1e-5 * (1 + ref_lse[visible].abs().max())


SHAPES = [(1, 2, 70, 70, 64), (2, 1, 33, 100, 32), (1, 1, 100, 40, 16), (1, 1, 5, 129, 128), (1, 1, 70, 150, 256)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_against_float64(shape, causal, dtype):
    q, k, v = _qkv(*shape, dtype=dtype, seed=sum(shape))
    o, lse = A.flash_attention(q, k, v, causal, return_lse=True)
    ref_o, ref_lse = A.attention_reference(q, k, v, causal)
    assert o.dtype == dtype and o.shape == q.shape
    _check(o, lse, ref_o, ref_lse, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_the_mask_is_pytorchs(causal):
    q, k, v = _qkv(1, 2, 48, 48, 32, dtype=torch.float16, seed=3)
    ours = A.flash_attention(q, k, v, causal).double()
    torch_sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert (ours - torch_sdpa.double()).abs().max().item() <= ATOL[torch.float16]


def test_a_fully_masked_row_gives_zeros_where_a_naive_softmax_gives_nan():
    q, k, v = _qkv(1, 1, 50, 20, 16, seed=4)
    o, lse = A.flash_attention(q, k, v, "bottom_right", return_lse=True)
    visible = A.causal_mask(50, 20, "bottom_right", DEVICE)
    hidden = ~visible.any(dim=1)  # key j <= i - 30: the first 30 queries see nothing
    assert int(hidden.sum()) == 30
    assert bool((o[0, 0, hidden] == 0).all()) and bool(torch.isneginf(lse[0, 0, hidden]).all())
    scores = (q.float() @ k.float().transpose(-1, -2)).masked_fill(~visible, -torch.inf)
    naive = torch.softmax(scores, dim=-1) @ v.float()
    assert bool(torch.isnan(naive[0, 0, hidden]).all()), "the smell: NaN in the first rows"


def test_large_scores_do_not_overflow():
    q, k, v = _qkv(1, 1, 64, 64, 64, seed=5, q_scale=30.0)  # scores in the hundreds: exp overflows fp32
    o, lse = A.flash_attention(q, k, v, True, return_lse=True)
    ref_o, ref_lse = A.attention_reference(q, k, v, True)
    _check(o, lse, ref_o, ref_lse, torch.bfloat16)


def test_a_long_row_keeps_its_sum():
    """4096 keys of nearly equal score: l sums 4096 terms near 1.  In fp32 the kernel's sum is exact
    enough; the same sum kept in bf16 stops at 256 (the spacing there, 2, swallows each 1)."""
    g = torch.Generator().manual_seed(6)
    q = torch.zeros(1, 1, 16, 16).bfloat16().to(DEVICE)
    k = (torch.randn(1, 1, 4096, 16, generator=g) * 1e-3).bfloat16().to(DEVICE)
    v = torch.randn(1, 1, 4096, 16, generator=g).bfloat16().to(DEVICE)
    o, lse = A.flash_attention(q, k, v, return_lse=True)
    ref_o, ref_lse = A.attention_reference(q, k, v)
    _check(o, lse, ref_o, ref_lse, torch.bfloat16)
    stalled = torch.tensor(0.0, dtype=torch.bfloat16)
    for _ in range(4096):
        stalled = stalled + torch.tensor(1.0, dtype=torch.bfloat16)
    assert float(stalled) == 256.0


def test_bad_arguments():
    q, k, v = _qkv(1, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="causal must be"):
        A.flash_attention(q, k, v, causal="upper")
    with pytest.raises(TypeError, match="q must be bfloat16 or float16"):
        A.flash_attention(q.float(), k, v)
    with pytest.raises(TypeError, match="share a dtype"):
        A.flash_attention(q, k.half(), v.half())
    with pytest.raises(ValueError, match="head_dim must be one of"):
        A.flash_attention(q[..., :12], k[..., :12], v[..., :12])
    with pytest.raises(ValueError, match=r"must be \(batch, heads, sequence, head_dim\)"):
        A.flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="k and v must match"):
        A.flash_attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="head_dim must be at least 32 for FP8 attention"):
        A.flash_attention_fp8(q, k, v)


def test_a_view_that_starts_mid_allocation_is_read_as_its_values():
    """TMA descriptors need 16-byte-aligned bases: an unaligned view is copied, not misread."""
    q, k, v = _qkv(1, 2, 70, 70, 64, seed=9)
    flat = torch.cat([torch.zeros(1, dtype=q.dtype, device=q.device), q.flatten()])
    shifted = flat[1:].view(q.shape)  # the same values, 2 bytes past an aligned address
    assert shifted.data_ptr() % 16 != 0
    assert torch.equal(A.flash_attention(shifted, k, v, True), A.flash_attention(q, k, v, True))
    assert torch.equal(A.flash_attention_fp8(shifted, k, v, True), A.flash_attention_fp8(q, k, v, True))


def _rel(got, want):
    return float((got.double() - want).norm() / want.norm())


def _dequantized(x, block=A.FP8_BLOCK):
    codes, s = A._blocks_fp8(x, block)
    d = x.shape[-1]
    return (codes.float().reshape(-1, block * d) * s[:, None]).reshape(codes.shape)[:, :, : x.shape[2]]


@pytest.mark.parametrize("shape", [(1, 2, 70, 70, 64), (1, 1, 200, 200, 128), (1, 1, 40, 300, 32)], ids=str)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_fp8_attention_error_is_the_encodings(shape, causal):
    """Against float64 attention of the bf16 inputs the FP8 kernel is off by what E4M3 costs (about 5%
    here); against float64 attention of its own dequantized operands, only by P's E4M3 rounding (about
    2%): the rest of the kernel adds nothing measurable."""
    q, k, v = _qkv(*shape, seed=sum(shape) + 1)
    o = A.flash_attention_fp8(q, k, v, causal)
    assert o.dtype == q.dtype and not torch.isnan(o).any()
    exact, _ = A.attention_reference(q, k, v, causal)
    same_operands, _ = A.attention_reference(_dequantized(q), _dequantized(k), _dequantized(v), causal)
    hidden = ~torch.isfinite(A.attention_reference(q, k, v, causal)[1])
    assert bool((o[hidden] == 0).all()), "fully masked rows: zeros"
    assert _rel(o, exact) < 0.08
    assert _rel(o, same_operands) < 0.03


def test_a_hadamard_rotation_tames_an_outlier_channel():
    q, k, v = _qkv(1, 1, 200, 200, 128, seed=11)
    q[..., 5] *= 20  # one channel of Q and K twenty times the others, as trained models have
    k[..., 5] *= 20
    exact, _ = A.attention_reference(q, k, v, True)
    plain = _rel(A.flash_attention_fp8(q, k, v, True), exact)
    rotated = _rel(A.flash_attention_fp8(q, k, v, True, hadamard=True), exact)
    print(f"FP8 attention, outlier channel: relative error {plain:.3f} plain, {rotated:.3f} rotated")
    assert rotated < plain / 2
