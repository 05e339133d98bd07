"""kernels.int8: the INT8 quantizers bit for bit against their PyTorch references, calibration, SmoothQuant,
and the W8A8 GEMM against an exact integer reference and a float64 one."""

import pytest
import torch
from _tuning import one_gemm_config  # noqa: F401 (a fixture, used below)

from kernels import int8 as I
from kernels.device import default_device

DEVICE = default_device()
pytestmark = pytest.mark.usefixtures("one_gemm_config")  # GEMMs tuned over one tile: tests/_tuning.py


def _x(m, k, seed=0, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * scale).to(dtype).to(DEVICE)


def _same(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.equal(got.cpu(), want.cpu()), f"{what}: {int((got.cpu() != want.cpu()).sum())} elements differ"


@pytest.mark.parametrize("granularity", I.GRANULARITIES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 300), (130, 1030), (3, 2049)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_quantizer_equals_its_reference(granularity, shape, dtype):
    x = _x(*shape, seed=sum(shape), dtype=dtype)
    x[0, 0] = 40.0  # an outlier in the first row
    q, s = I.quantize_int8(x, granularity)
    q_ref, s_ref = I.quantize_int8_reference(x, granularity)
    _same(q, q_ref, "codes")
    _same(s, s_ref, "scales")
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert s.shape == (() if granularity == "tensor" else (shape[0], 1))
    assert int(q.min()) >= -127, "-128 is never produced: the range is symmetric"


def test_rounding_is_to_nearest_even_and_every_error_within_half_a_step():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 3.49, 126.5, 127.0]], device=DEVICE)  # S = 1 exactly
    q, s = I.quantize_int8(x)
    assert float(s) == 1.0
    assert q.cpu().tolist() == [[0, 2, 2, 0, -2, 3, 126, 127]]
    y = _x(64, 500, seed=5)
    q, s = I.quantize_int8(y, "token")
    err = (I.dequantize_int8(q, s) - y.float()).abs()
    assert bool((err <= s / 2 * (1 + 1e-6)).all())


def test_zero_rows_and_constant_rows():
    x = torch.zeros(3, 40, device=DEVICE)
    x[1] = -0.75
    q, s = I.quantize_int8(x, "token")
    want = torch.tensor([1.0, 0.75, 1.0]) / torch.tensor([1.0, 127.0, 1.0])  # fp32 division
    assert torch.equal(s.cpu().reshape(-1), want), "an all-zero row gets S = 1"
    assert q[0].eq(0).all() and q[2].eq(0).all() and q[1].eq(-127).all()


@pytest.mark.parametrize("granularity", I.GRANULARITIES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_are_refused_naming_their_rows(granularity, bad):
    x = _x(5, 64, seed=1)
    x[3, 10] = bad
    where = "the tensor" if granularity == "tensor" else r"rows \[3\]"
    with pytest.raises(ValueError, match=f"x has NaN or infinite values in {where}"):
        I.quantize_int8(x, granularity)
    q, s = I.quantize_int8(x, granularity, check_finite=False)  # the caller's choice: no sync, no check
    if granularity != "tensor":
        _same(q[:3], I.quantize_int8_reference(x[:3], granularity)[0], "the finite rows")


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="granularity"):
        I.quantize_int8(_x(2, 4), "group")
    with pytest.raises(TypeError, match="x must be bfloat16, float16 or float32"):
        I.quantize_int8(torch.ones(2, 4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="x must be a 2-D matrix"):
        I.quantize_int8(torch.ones(2, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="s must be positive and finite"):
        I.quantize_int8_with_scale(_x(2, 4), torch.zeros((), device=DEVICE))
    with pytest.raises(ValueError, match="one-element float32"):
        I.quantize_int8_with_scale(_x(2, 4), torch.ones(2, device=DEVICE))


def test_a_static_scale_saturates_what_it_does_not_cover():
    x = _x(9, 333, seed=2)
    s = torch.tensor(1.0 / 127, device=DEVICE)  # covers |x| <= 1 only
    q = I.quantize_int8_with_scale(x, s)
    _same(q, I.quantize_int8_reference(x, s=s)[0], "static codes")
    assert bool((q[x > 1.0] == 127).all()) and bool((q[x < -1.0] == -127).all())


def test_asymmetric_codes_keep_zero_exact_and_use_the_whole_range_on_one_sided_data():
    relu = torch.relu(_x(32, 64, seed=3))
    q, s, z = I.quantize_int8_asymmetric_reference(relu)
    assert int(q.min()) == -128 and int(q.max()) == 127
    assert bool((I.dequantize_int8(q, s, z)[relu == 0] == 0).all()), "0.0 maps to the zero point exactly"
    q_sym, s_sym = I.quantize_int8_reference(relu, "tensor")
    err_asym = (I.dequantize_int8(q, s, z) - relu).pow(2).mean()
    err_sym = (I.dequantize_int8(q_sym, s_sym) - relu).pow(2).mean()
    assert err_asym < err_sym / 3, "twice the codes on a one-sided range: about a quarter of the squared error"


def test_calibration_methods():
    g = torch.Generator().manual_seed(4)
    acts = [torch.randn(256, 64, generator=g) for _ in range(4)]
    acts[2][5, 7] = 60.0  # one rare outlier among 65536 values
    top = I.calibrate_amax(acts, "max")
    assert float(top) == 60.0
    p = I.calibrate_amax(acts, "percentile", percentile=99.9)
    assert 2.0 < float(p) < 6.0
    mse = I.calibrate_amax(acts, "mse")
    assert float(mse) < float(top)

    def err(amax):
        x = torch.cat([a.reshape(-1) for a in acts])
        return (I.dequantize_int8(I.quantize_int8_reference(x[None], s=amax / 127)[0], amax / 127) - x).pow(2).mean()

    # The MSE choice is never worse than the max (the max is one of its candidates) and here clips a
    # little; the 99.9th percentile clips the outlier to a few units, and its squared error, (60 - p)^2
    # in one value, costs more than the precision it buys for the others.
    assert err(mse) < err(top) < err(p)
    with pytest.raises(ValueError, match="method"):
        I.calibrate_amax(acts, "kl")
    with pytest.raises(ValueError, match="NaN or infinite"):
        I.calibrate_amax(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="no values"):
        I.calibrate_amax([torch.empty(0)])


def _outlier_channel_problem(seed=6):
    """Activations with a few input channels 50x larger than the rest (what LLM activations look like),
    and an ordinary weight."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 256, generator=g)
    x[:, [3, 100, 200]] *= 50.0
    w = torch.randn(128, 256, generator=g) * 0.05
    return x.to(DEVICE), w.to(DEVICE)


def _w8a8_error(x, w):
    qx, sx = I.quantize_int8(x, "token")
    qw, sw = I.quantize_int8(w, "channel")
    got = I.w8a8_matmul(qx, qw, sx, sw, out_dtype=torch.float32).double()
    want = x.double() @ w.double().T
    return float((got - want).norm() / want.norm())


def test_smoothquant_keeps_the_product_and_removes_most_of_the_error():
    x, w = _outlier_channel_problem()
    s = I.smoothquant_scales(x.abs().amax(0), w, alpha=0.5)
    xs, ws = I.smooth(x, w, s)
    assert torch.allclose(xs.double() @ ws.double().T, x.double() @ w.double().T, rtol=1e-5, atol=1e-4)
    plain, smoothed = _w8a8_error(x, w), _w8a8_error(xs, ws)
    print(f"W8A8 relative error: {plain:.4f} plain, {smoothed:.4f} with SmoothQuant")
    assert smoothed < plain / 3
    with pytest.raises(ValueError, match="alpha"):
        I.smoothquant_scales(x.abs().amax(0), w, alpha=1.5)
    with pytest.raises(ValueError, match="act_amax must have shape"):
        I.smoothquant_scales(x.abs().amax(1), w)


def _codes(m, n, k, seed=7):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    sa = torch.rand(m, 1, generator=g) * 1e-2 + 1e-3
    sb = torch.rand(n, 1, generator=g) * 1e-2 + 1e-3
    bias = torch.randn(n, generator=g)
    return a.to(DEVICE), b.to(DEVICE), sa.to(DEVICE), sb.to(DEVICE), bias.to(DEVICE)


@pytest.mark.parametrize("shape", [(1, 16, 64), (37, 45, 200), (130, 72, 300), (64, 64, 129)], ids=str)
@pytest.mark.parametrize("scales", ["row-col", "tensor-tensor", "row-tensor"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_w8a8_gemm_equals_the_exact_reference(shape, scales, out_dtype):
    a, b, sa, sb, bias = _codes(*shape, seed=sum(shape))
    if scales != "row-col":
        sb = sb[:1, 0].reshape(())
    if scales == "tensor-tensor":
        sa = sa[:1, 0].reshape(())
    for bb in (None, bias):
        got = I.w8a8_matmul(a, b, sa, sb, bb, out_dtype)
        want = I.w8a8_matmul_reference(a, b, sa, sb, bb, out_dtype)
        assert got.dtype == out_dtype
        _same(got.view(torch.int16) if out_dtype == torch.bfloat16 else got, want.view(torch.int16)
              if out_dtype == torch.bfloat16 else want, f"{shape} {scales} bias={bb is not None}")  # fmt: skip
        f64 = I.w8a8_matmul_reference(a, b, sa, sb, bb, exact=False)
        # |sum| of the terms, the scale of every rounding on the way (the int32 -> fp32 conversion, the
        # two scale products, the bias) and of the last one to the output dtype
        mag = I.w8a8_matmul_reference(a.abs(), b.abs(), sa.abs(), sb.abs(), None, exact=False)
        if bb is not None:
            mag = mag + bb.double().abs()
        bound = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-21
        assert bool(((got.double() - f64).abs() <= bound * mag).all()), "a few roundings, each relative to |terms|"


def test_quantize_then_multiply_approximates_the_wide_product():
    x, w = _x(33, 512, seed=8), _x(48, 512, seed=9, scale=0.05)
    err = _w8a8_error(x, w)
    assert err < 0.02, err


def test_w8a8_refuses_what_it_cannot_multiply():
    a, b, sa, sb, _ = _codes(4, 8, 32)
    with pytest.raises(TypeError, match="a must have dtype int8"):
        I.w8a8_matmul(a.float(), b, sa, sb)
    with pytest.raises(ValueError, match="same K"):
        I.w8a8_matmul(a, b[:, :16], sa, sb)
    with pytest.raises(ValueError, match="b_scale must hold one scale or one per row"):
        I.w8a8_matmul(a, b, sa, sb[:3])
    with pytest.raises(TypeError, match="a_scale must be a float32"):
        I.w8a8_matmul(a, b, sa.double(), sb)
    with pytest.raises(ValueError, match="bias must be a tensor of shape"):
        I.w8a8_matmul(a, b, sa, sb, bias=torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match="out_dtype"):
        I.w8a8_matmul(a, b, sa, sb, out_dtype=torch.int32)
    long_k = torch.zeros(1, I.MAX_K + 1, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="int32 sum of int8 products could overflow"):
        I.w8a8_matmul(long_k, long_k, sa[:1], sa[:1])
