"""kernels.int4: group-wise INT4 weights (asymmetric 0..15 with zero points, symmetric -8..7): exact codes,
the half-step bound, zero groups, refusals, packing in both nibble orders, and PyTorch's int4 GEMM (tinygemm)
reading the same weights."""

import pytest
import torch

import kernels
from kernels import int4

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _w(n, k, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * scale


def _half_step_excess(w, t) -> float:
    """max |w - dequantized| in units of each group's S, minus 1/2: <= 15 u when the quantizer is right."""
    s = t.scale.float().repeat_interleave(t.group, dim=1)  # (N, K)
    return float(((int4.dequantize_int4(t) - w.float()).abs() / s).max()) - 0.5


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
@pytest.mark.parametrize("scale_dtype", int4.SCALE_DTYPES, ids=str)
@pytest.mark.parametrize(("n", "k", "group"), [(1, 2, 2), (7, 256, 128), (130, 384, 128), (3, 1000, 8), (5, 96, 96)])
def test_every_weight_is_within_half_a_step_of_its_reconstruction(symmetric, scale_dtype, n, k, group):
    w = _w(n, k, seed=n + k)
    w[0, 0] = 0.9  # an outlier in the first group
    t = int4.quantize_int4(w, group, symmetric=symmetric, scale_dtype=scale_dtype)
    codes = int4.int4_codes(t)
    lo, hi = (-8, 7) if symmetric else (0, 15)
    assert int(codes.min()) >= lo and int(codes.max()) <= hi
    assert t.q.shape == (n, k // 2) and t.scale.shape == (n, k // group) and t.scale.dtype == scale_dtype
    assert (t.zero is None) == symmetric
    excess = _half_step_excess(w, t)
    # the stored scale's rounding can shrink the range by a factor (1 - u): the top element then
    # clamps up to 15 u S further away (module docstring); fp32 has u = 2^-24
    print(f"max error / S - 1/2 = {excess:.3g} (allowed {15 * UNIT_ROUNDOFF[scale_dtype]:.3g})")
    assert excess <= 15 * UNIT_ROUNDOFF[scale_dtype] + 1e-6


def test_the_bound_catches_wrong_quantizers():
    """The half-step check of the test above fails for the mistakes it is there to find."""
    w = _w(16, 256, seed=3)
    t = int4.quantize_int4(w)
    assert _half_step_excess(w, t) <= 1e-6
    swapped = t._replace(q=(t.q << 4) | (t.q >> 4))  # nibbles in the wrong order
    twice = t._replace(scale=t.scale * t.scale)  # the scale applied twice
    truncated = t._replace(  # rounding toward zero instead of to nearest
        q=int4.pack_int4(
            torch.clamp(
                torch.trunc(w / t.scale.repeat_interleave(128, 1)) + t.zero.repeat_interleave(128, 1), 0, 15
            ).to(torch.uint8)
        )
    )
    no_zero = t._replace(zero=torch.zeros_like(t.zero))  # the zero point forgotten
    for name, wrong in (("swapped", swapped), ("twice", twice), ("truncated", truncated), ("no zero", no_zero)):
        assert _half_step_excess(w, wrong) > 0.1, name


def test_exact_codes_asymmetric_with_ties_to_even():
    # lo = -4, hi = 3.5: S = 7.5 / 15 = 0.5 exactly, z = 8; x / S lands on ties at +-0.5 and 1.5
    x = torch.tensor([[-4.0, 3.5, 0.25, 0.75, -0.25, -0.75, 0.0, 1.0]])
    t = int4.quantize_int4(x, group=8)
    assert t.scale.tolist() == [[0.5]] and t.zero.tolist() == [[8]]
    assert int4.int4_codes(t).tolist() == [[0, 15, 8, 10, 8, 6, 8, 10]]
    assert int4.dequantize_int4(t).tolist() == [[-4.0, 3.5, 0.0, 1.0, 0.0, -1.0, 0.0, 1.0]]


def test_exact_codes_symmetric_use_all_sixteen():
    # amax 7.5: S = 1; +7.5 rounds to 8 and clamps to 7, -7.5 rounds to -8, which exists
    x = torch.tensor([[7.5, -7.5, 2.5, 3.5, -0.5, 0.5, 1.5, -6.0]])
    t = int4.quantize_int4(x, group=8, symmetric=True)
    assert t.scale.tolist() == [[1.0]] and t.zero is None
    assert int4.int4_codes(t).tolist() == [[7, -8, 2, 4, 0, 0, 2, -6]]
    assert t.q.tolist() == [[0x87, 0x42, 0x00, 0xA2]], "two's complement nibbles, element 2i low"


def test_zero_groups_constant_groups_and_exact_zeros():
    w = _w(4, 256, seed=1)
    w[1] = 0.0  # two all-zero groups
    w[2, :128] = -0.3  # a constant negative group
    w[3, 128:] = 0.7  # a constant positive group
    w[0, ::5] = 0.0  # scattered exact zeros
    for symmetric in (False, True):
        t = int4.quantize_int4(w, symmetric=symmetric)
        d = int4.dequantize_int4(t)
        assert t.scale[1].tolist() == [1.0, 1.0], "an all-zero group gets S = 1"
        assert d[1].eq(0).all() and d[0, ::5].eq(0).all(), "zeros stay exact"
        if symmetric:  # a constant group is +-7.5 S: a tie, S / 2 away from the code it rounds to
            assert torch.allclose(d[2, :128], torch.tensor(-0.32)) and torch.allclose(
                d[3, 128:], torch.tensor(0.7 * 14 / 15)
            )
        else:  # asymmetric: the range [lo, hi] is the constant and 0, so the constant is code 0 or 15
            assert torch.allclose(d[2, :128], w[2, :128], rtol=1e-6) and torch.allclose(
                d[3, 128:], w[3, 128:], rtol=1e-6
            )
            assert t.zero[1].tolist() == [0, 0]
            assert int4.int4_codes(t)[1].eq(0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_naming_their_rows(bad):
    w = _w(12, 256)
    w[3, 7] = bad
    w[10, 200] = bad
    with pytest.raises(ValueError, match=r"rows \[3, 10\]"):
        int4.quantize_int4(w)


@pytest.mark.parametrize(
    ("w", "kw", "error", "match"),
    [
        (torch.zeros(256), {}, ValueError, "2-D weight"),
        (torch.zeros(2, 2, 256), {}, ValueError, "2-D weight"),
        (torch.zeros(4, 200), {}, ValueError, "multiple of group"),
        (torch.zeros(4, 9), {"group": 3}, ValueError, "even"),
        (torch.zeros(4, 256), {"group": 0}, ValueError, "group must be a positive int"),
        (torch.zeros(4, 256), {"group": True}, ValueError, "group must be a positive int"),
        (torch.zeros(4, 256), {"group": 128.0}, ValueError, "group must be a positive int"),
        (torch.zeros(4, 256, dtype=torch.float64), {}, TypeError, "bfloat16, float16 or float32"),
        (torch.zeros(4, 256, dtype=torch.int32), {}, TypeError, "bfloat16, float16 or float32"),
        ([[0.0] * 256], {}, TypeError, "torch.Tensor"),
        (torch.zeros(4, 256), {"scale_dtype": torch.int8}, ValueError, "scale_dtype"),
        (torch.full((4, 256), 1e6), {"scale_dtype": torch.float16}, ValueError, r"rows \[0, 1, 2, 3\] .*overflow"),
        (torch.full((4, 256), 1e-9), {"scale_dtype": torch.float16}, ValueError, "underflow"),
    ],
)
def test_bad_arguments_are_refused_with_clear_errors(w, kw, error, match):
    with pytest.raises(error, match=match):
        int4.quantize_int4(w, **kw)


def test_parts_that_do_not_fit_together_are_refused():
    t = int4.quantize_int4(_w(8, 256))
    with pytest.raises(ValueError, match="scale must be"):
        int4.dequantize_int4(t._replace(scale=t.scale[:, :1]))
    with pytest.raises(ValueError, match="zero must be"):
        int4.dequantize_int4(t._replace(zero=t.zero.to(torch.int32)))
    with pytest.raises(ValueError, match="group must be an int that divides"):
        int4.dequantize_int4(t._replace(group=100))
    with pytest.raises(TypeError, match="uint8 packed codes"):
        int4.dequantize_int4(t._replace(q=t.q.to(torch.int8)))
    with pytest.raises(TypeError, match="Int4Tensor"):
        int4.dequantize_int4((t.q, t.scale, t.zero, t.group))


def test_packing_orders_bit_for_bit():
    codes = torch.tensor([[1, 2, 15, 0, 7, 8]])
    assert int4.pack_int4(codes).tolist() == [[0x21, 0x0F, 0x87]], "element 2i in the low nibble"
    assert int4.pack_int4(codes, order="high").tolist() == [[0x12, 0xF0, 0x78]], "element 2i in the high nibble"
    for order in int4.ORDERS:
        assert int4.unpack_int4(int4.pack_int4(codes, order=order), order=order).tolist() == codes.tolist()
    signed = torch.tensor([[-8, 7, -1, 0, 3, -4]])
    assert int4.pack_int4(signed).tolist() == [[0x78, 0x0F, 0xC3]]
    assert int4.unpack_int4(int4.pack_int4(signed), signed=True).tolist() == signed.tolist()


@pytest.mark.parametrize("signed", [False, True])
def test_pack_unpack_round_trip_on_random_codes(signed):
    g = torch.Generator().manual_seed(7)
    lo, hi = (-8, 8) if signed else (0, 16)
    codes = torch.randint(lo, hi, (33, 130), generator=g)
    for order in int4.ORDERS:
        back = int4.unpack_int4(int4.pack_int4(codes, order=order), signed=signed, order=order)
        assert torch.equal(back, codes.to(torch.int16)), order


@pytest.mark.parametrize(
    ("codes", "kw", "error", "match"),
    [
        (torch.tensor([[16, 0]]), {}, ValueError, r"\[0, 15\]"),
        (torch.tensor([[-9, 0]]), {}, ValueError, r"\[0, 15\]"),
        (torch.tensor([[1, 2, 3]]), {}, ValueError, "even K"),
        (torch.tensor([1, 2]), {}, ValueError, "2-D"),
        (torch.tensor([[1.0, 2.0]]), {}, TypeError, "integer tensor"),
        (torch.tensor([[1, 2]]), {"order": "middle"}, ValueError, "order must be one of"),
    ],
)
def test_pack_refuses_bad_codes(codes, kw, error, match):
    with pytest.raises(error, match=match):
        int4.pack_int4(codes, **kw)


def test_unpack_refuses_bad_bytes():
    with pytest.raises(TypeError, match="2-D uint8"):
        int4.unpack_int4(torch.zeros(2, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="order must be one of"):
        int4.unpack_int4(torch.zeros(2, 2, dtype=torch.uint8), order="big")


def test_bits_per_weight():
    assert int4.bits_per_weight() == 4 + 20 / 128  # GPTQ and AWQ: an fp16 scale and a 4-bit zero per 128
    assert int4.bits_per_weight(128, 16, 16) == 4.25  # tinygemm: bf16 scale and bf16 zero
    assert int4.bits_per_weight(32, 16, 0) == 4.5
    with pytest.raises(ValueError, match="group must be a positive int"):
        int4.bits_per_weight(0)
    with pytest.raises(ValueError, match=">= 0"):
        int4.bits_per_weight(128, -1)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
def test_tinygemm_on_the_cpu_reads_the_same_weights(symmetric):
    """PyTorch's CPU int4 GEMM, given our codes and scales_and_zeros, computes x @ dequantize(t)^T."""
    w = _w(64, 512, seed=2)
    t = int4.quantize_int4(w, symmetric=symmetric)
    codes, sz = int4.tinygemm_operands(t, torch.float32)
    assert codes.dtype == torch.int32 and int(codes.min()) >= 0 and int(codes.max()) <= 15
    assert sz.shape == (512 // 128, 64, 2)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(3))
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, t.group, sz).double()
    want = x.double() @ int4.dequantize_int4(t).double().T
    rel = float((got - want).abs().max() / want.abs().max())
    print(f"tinygemm (CPU, fp32) vs float64: max error {rel:.3g} of the largest output")
    assert rel < 1e-5  # fp32 sums of 512 products in another order


def test_tinygemm_zero_in_bf16_carries_a_rounding_error():
    """The float zero S * (8 - z) is rounded to bf16 (the integer zero point was exact)."""
    t = int4.quantize_int4(_w(32, 256, seed=4))
    _, sz32 = int4.tinygemm_operands(t, torch.float32)
    _, sz16 = int4.tinygemm_operands(t, torch.bfloat16)
    zero_err = (sz16[..., 1].float() - sz32[..., 1]).abs()
    assert float(zero_err.max()) > 0
    assert bool((zero_err <= 2.0**-8 * sz32[..., 1].abs()).all()), "round to nearest: half a bf16 step at most"


@pytest.mark.skipif(kernels.INTERPRETER, reason="tinygemm's CUDA kernel needs a GPU; the CPU twin is tested above")
@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
def test_tinygemm_on_the_gpu_reads_high_nibble_first_bytes(symmetric):
    w = _w(256, 1024, seed=5)
    t = int4.quantize_int4(w, symmetric=symmetric, scale_dtype=torch.bfloat16)
    codes, sz = int4.tinygemm_operands(t, torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack(int4.pack_int4(codes, order="high").cuda(), 8)
    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = torch.ops.aten._weight_int4pack_mm(x.cuda(), packed, t.group, sz.cuda()).double().cpu()
    want = x.double() @ int4.dequantize_int4(t).double().T
    rel = float((got - want).norm() / want.norm())
    print(f"tinygemm (CUDA, bf16) vs float64: relative error {rel:.3g}")
    # bf16 roundings of the output and of the float zeros stay far below 1e-2; swapped nibbles give O(1)
    assert rel < 1e-2


@pytest.mark.skipif(kernels.INTERPRETER, reason="tinygemm's CUDA kernel needs a GPU")
def test_tinygemm_weight_builds_the_layout_from_a_weight():
    w = _w(96, 512, seed=7).to(torch.bfloat16).cuda()
    t, packed, sz = int4.tinygemm_weight(w, inner_k_tiles=4)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16).cuda()
    got = torch.ops.aten._weight_int4pack_mm(x, packed, t.group, sz).double()
    want = x.double() @ int4.dequantize_int4(t).double().T
    assert float((got - want).norm() / want.norm()) < 1e-2


def test_tinygemm_weight_refuses_what_tinygemm_cannot_take():
    with pytest.raises(ValueError, match="CUDA GPU"):
        int4.tinygemm_weight(torch.randn(8, 256))
    if not kernels.INTERPRETER:
        with pytest.raises(ValueError, match="multiple of 32 \\* inner_k_tiles"):
            int4.tinygemm_weight(torch.randn(8, 384, device="cuda"), inner_k_tiles=8)
