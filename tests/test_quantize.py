"""kernels.quantize: every kernel bit for bit equal to its plain-torch reference, on random and
adversarial inputs, awkward shapes and every input dtype; the scale rules and policies as stated."""

import math

import numpy as np
import pytest
import torch

from kernels import quantize as Q
from kernels.device import default_device
from kernels.testing import assert_bits_equal, special_inputs

DEVICE = default_device()
ROW_KINDS = ("row", "1x128", "mxfp8")


def _adversarial(shape, dtype, seed=0):
    return special_inputs(shape, dtype, seed, DEVICE)


def _same(got, want, name, x=None):
    if got.dtype.is_floating_point and got.element_size() == 4:  # dequantized: NaN payloads aside
        nan_got, nan_want = torch.isnan(got), torch.isnan(want)
        assert torch.equal(nan_got, nan_want), f"[{name}] NaN positions differ"
        got, want = torch.where(nan_got, 0.0, got), torch.where(nan_want, 0.0, want)
    assert_bits_equal(got.cpu(), want.cpu(), name=name, inputs=x)


# (128, 256) fills every program exactly: the kernels' unmasked path; the others are ragged (masked).
SHAPES = [(1, 1), (7, 33), (130, 257), (2, 3, 40), (128, 256)]
# The interpreter is slow: bf16 (the input of every benchmark) gets every case, shape and format; fp16 and
# fp32 the cases where their conversion to fp32 differs (specials, subnormals, range) on two shapes.
PLAN = {
    torch.bfloat16: (SHAPES, None),
    torch.float16: (SHAPES[1:2], ("random", "nan/inf", "subnormals", "huge")),
    torch.float32: (SHAPES[1:2], ("random", "nan/inf", "subnormals", "huge")),
}


@pytest.mark.parametrize("granularity", Q.GRANULARITIES)
@pytest.mark.parametrize("dtype", list(PLAN), ids=str)
def test_kernel_equals_reference_bit_for_bit(granularity, dtype):
    shapes, cases = PLAN[dtype]
    for shape in shapes:
        if granularity == "128x128" and len(shape) != 2:
            continue
        for case, x in _adversarial(shape, dtype).items():
            if cases and case not in cases:
                continue
            for fmt in ("e4m3", "e5m2") if case in ("random", "nan/inf", "huge") else ("e4m3",):
                name = f"{granularity} {fmt} {tuple(shape)} {dtype} {case}"
                got, want = Q.quantize(x, granularity, fmt), Q.quantize(x, granularity, fmt, reference=True)
                _same(got.q, want.q, name + " codes", x.float().cpu())
                _same(got.s, want.s, name + " scales")
                _same(Q.dequantize(*got, granularity), Q.dequantize_reference(*want, granularity), name + " dequant")


@pytest.mark.parametrize("rounding", ["floor", "up"])
def test_mxfp8_roundings(rounding):
    x = _adversarial((9, 100), torch.bfloat16, seed=3)
    for case, xx in x.items():
        got, want = Q.quantize_mxfp8(xx, rounding=rounding), Q.quantize_mxfp8_reference(xx, rounding=rounding)
        _same(got.q, want.q, f"mx {rounding} {case}")
        _same(got.s, want.s, f"mx {rounding} scales {case}")


def test_long_rows_take_the_two_pass_path():
    x = torch.randn(3, Q.ROW_MAX_ONE_PASS + 77, device=DEVICE).to(torch.bfloat16)
    x[1, -5] = 900.0
    x[2, 3] = float("nan")
    got, want = Q.quantize_rowwise(x), Q.quantize_rowwise_reference(x)
    _same(got.q, want.q, "long rows")
    _same(got.s, want.s, "long rows scales")


def test_e8m0_rules_exactly():
    amax = torch.tensor([0.0, 1.0, 448.0, 448.5, 500.0, 2.0**-130, 3.0e38, 0.75])
    floor = Q.e8m0_from_amax(amax, "e4m3", "floor").to(torch.int32) - 127
    up = Q.e8m0_from_amax(amax, "e4m3", "up").to(torch.int32) - 127
    for a, f, u in zip(amax.tolist(), floor.tolist(), up.tolist(), strict=True):
        if a == 0:
            assert f == u == 0  # all-zero block: S = 1
            continue
        want_f = max(math.floor(math.log2(a)) - 8, -127)
        want_u = max(math.ceil(math.log2(a / 448.0)), -127)
        assert (f, u) == (want_f, want_u), a
    assert Q.e8m0_to_float(torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8))[:4].tolist() == [
        2.0**-127,
        2.0**-126,
        1.0,
        2.0**127,
    ]
    assert math.isnan(Q.e8m0_to_float(torch.tensor([255], dtype=torch.uint8)).item())


def test_policies_zero_group_nan_inf_saturation():
    x = torch.zeros(2, 256, device=DEVICE, dtype=torch.bfloat16)
    x[1, :128] = torch.linspace(-3, 3, 128)
    x[1, 5] = float("nan")
    x[1, 6] = float("inf")
    q, s = Q.quantize_1x128(x)
    assert s.cpu().tolist() == [[1.0, 1.0], [pytest.approx(3 / 448, rel=1e-2), 1.0]]  # zero groups: S = 1
    codes = q.view(torch.uint8).cpu()
    assert codes[1, 5] == codes[1, 6] == Q.NAN_CODE  # non-finite -> NaN code, scale from the finite rest
    assert (codes[0] == 0).all()
    y = Q.dequantize(q, s, "1x128").cpu()
    assert torch.isnan(y[1, 5]) and torch.isnan(y[1, 6]) and torch.isfinite(y[1, 7:]).all()
    # A stale scale saturates instead of overflowing: 500 with S from amax 10 comes back as 10.
    stale = torch.tensor(10.0 / 448, device=DEVICE)
    q = Q.quantize_tensor_with_scale(torch.tensor([500.0, -1e30], device=DEVICE), stale)
    assert q.float().cpu().tolist() == [448.0, -448.0]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [0.0, 1e-40, 2.0**-149])
def test_a_scale_whose_reciprocal_overflows_keeps_zeros_zero(scale, fmt):
    """1/S = inf would make 0 x inf = NaN codes out of zeros: the reciprocal is held at FLT_MAX, so
    zeros stay zero and the rest saturates (kernel and reference alike)."""
    x = torch.tensor([0.0, -0.0, 1e-30, -3.0, 1e30], device=DEVICE)
    s = torch.tensor(scale, device=DEVICE)
    top = 448.0 if fmt == "e4m3" else 57344.0
    for q in (Q.quantize_tensor_with_scale(x, s, fmt), Q.quantize_tensor_with_scale_reference(x, s, fmt)):
        got = q.float().cpu()
        assert not torch.isnan(got).any(), got
        assert got[:2].tolist() == [0.0, 0.0] and got[3:].tolist() == [-top, top]


def test_scales_are_reconstruction_scales():
    x = torch.randn(64, 256, device=DEVICE) * 7
    for g in ("tensor", "row", "1x128", "128x128"):
        q, s = Q.quantize(x, g)
        y = Q.dequantize(q, s, g)
        rel = ((y - x).abs() / x.abs().clamp_min(1e-3)).max().item()
        print(f"{g}: max relative reconstruction error {rel:.3g}")
        assert rel < 2.0**-3, g  # e4m3 rounds to 3 mantissa bits: relative error <= 2^-4 for normals
        assert float(q.float().abs().max()) == 448.0  # amax maps to the top code
    q, s = Q.quantize_mxfp8(x, rounding="up")
    assert float(q.float().abs().max()) <= 448.0
    s_elem = Q.e8m0_to_float(s).repeat_interleave(32, 1)
    # half a step of e4m3: 2^-4 relative for normals, S * 2^-10 absolute in the subnormal range
    assert ((Q.dequantize(q, s, "mxfp8") - x).abs() <= torch.maximum(x.abs() * 2.0**-4, s_elem * 2.0**-10)).all()


@pytest.mark.parametrize("fmt, e, top", [("e4m3", 120, 240.0), ("e5m2", 113, 28672.0)])
def test_mxfp8_rounding_up_keeps_the_top_of_fp32_finite(fmt, e, top):
    """Near fp32's maximum, rounding up gives S = 2^120 (e4m3): 256 x S would be inf, so the codes stop
    at the largest whose product with S is finite; the floor rule's S = 2^119 never gets there."""
    flt_max = torch.finfo(torch.float32).max
    x = torch.tensor([3.3e38, flt_max, 3.2e38, -3.39e38] * 8, device=DEVICE).reshape(1, 32)
    for rounding in ("floor", "up"):
        q, s = Q.quantize_mxfp8(x, fmt, rounding=rounding)
        qr, sr = Q.quantize_mxfp8_reference(x, fmt, rounding=rounding)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
        y = Q.dequantize(q, s, "mxfp8")
        assert torch.isfinite(y).all(), (rounding, y)
        assert ((y.abs() <= x.abs()) & (y.abs() >= 0.87 * x.abs())).all(), (rounding, y)
    assert int(s[0, 0]) - 127 == e and float(q.float().abs().max()) == top
    assert float(q[0, 2]) == top  # 3.2e38 / 2^120 = 240.7 rounds to 240 even before the bound


def test_delayed_scaling_lags_and_state_round_trips():
    ds = Q.DelayedScaling(history_len=4, device=DEVICE)
    assert ds.scale().item() == 1.0  # empty history: S = 1
    ds.update(torch.tensor(10.0, device=DEVICE))
    q, s = ds.quantize(torch.tensor([[500.0, 5.0]], device=DEVICE))
    y = Q.dequantize(q, s, "tensor").cpu()
    assert y[0, 0].item() == pytest.approx(10.0) and torch.isfinite(y).all()
    assert ds.amax_history[0].item() == 500.0  # the next call's scale sees the spike
    assert ds.scale().item() == pytest.approx(500.0 / 448)
    other = Q.DelayedScaling(history_len=4, device=DEVICE)
    other.load_state_dict(ds.state_dict())
    assert torch.equal(other.amax_history, ds.amax_history)
    for _ in range(4):
        ds.update(torch.tensor(1.0, device=DEVICE))
    assert ds.scale().item() == pytest.approx(1.0 / 448)  # the spike has left the window
    x = torch.randn(5, 40, device=DEVICE)
    a, b = Q.DelayedScaling(device=DEVICE), Q.DelayedScaling(device=DEVICE)
    for _ in range(2):
        qa, qb = a.quantize(x), b.quantize(x, reference=True)
        _same(qa.q, qb.q, "delayed")
        _same(qa.s, qb.s, "delayed scale")


def test_bad_arguments_name_themselves():
    x = torch.randn(4, 64, device=DEVICE)
    with pytest.raises(ValueError, match="fmt"):
        Q.quantize_rowwise(x, "e3m4")
    with pytest.raises(TypeError, match="x must have dtype"):
        Q.quantize_1x128(x.to(torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        Q.quantize_tensor(np.ones(3))
    with pytest.raises(ValueError, match="x must be a 2-D matrix"):
        Q.quantize_128x128(x.reshape(2, 2, 64))
    with pytest.raises(ValueError, match="rounding"):
        Q.quantize_mxfp8(x, rounding="nearest")
    with pytest.raises(ValueError, match="granularity"):
        Q.quantize(x, "2x2")
    q, s = Q.quantize_1x128(x)
    with pytest.raises(ValueError, match="s has shape"):
        Q.dequantize(q, s[:, :0], "1x128")
    with pytest.raises(TypeError, match="s must have dtype"):
        Q.dequantize(q, s, "mxfp8")
    with pytest.raises(ValueError, match="history_len"):
        Q.DelayedScaling(history_len=0)


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (130, 257), (64, 128), (1, 200)], ids=str)
def test_codes_and_their_transpose_in_one_pass_equal_the_reference(shape):
    for case, x in _adversarial(shape, torch.bfloat16).items():
        for fmt in ("e4m3", "e5m2"):
            for s in (None, torch.tensor(0.02, device=DEVICE)):  # current scaling, a given scale
                name = f"{fmt} {shape} {case} {'given S' if s is not None else 'own S'}"
                (q, sq), qt = Q.quantize_tensor_and_transpose(x, fmt, s)
                (want, s_want), want_t = Q.quantize_tensor_and_transpose_reference(x, fmt, s)
                _same(q, want, name + " codes", x.float().cpu())
                _same(qt, want_t, name + " transposed codes")
                _same(sq, s_want, name + " scale")
                assert qt.shape == (shape[1], shape[0]) and qt.is_contiguous()


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (130, 257), (64, 128), (1, 200)], ids=str)
def test_the_one_launch_quantizers_equal_the_reference(shape):
    """quantize_tensor_fused (amax, S, codes and their transpose behind a grid barrier) and
    quantize_columns_transposed (per-row scaling of x.T read from x) against the references; several
    calls in a row, so the barrier's words are found reset by the launch before."""
    for case, x in _adversarial(shape, torch.bfloat16).items():
        for fmt in ("e4m3", "e5m2"):
            name = f"{fmt} {shape} {case}"
            (want, s_want), want_t = Q.quantize_tensor_and_transpose_reference(x, fmt)
            for transpose in (True, False):
                (q, sq), qt = Q.quantize_tensor_fused(x, fmt, transpose)
                _same(q, want, name + " fused codes", x.float().cpu())
                _same(sq, s_want, name + " fused scale")
                if transpose:
                    _same(qt, want_t, name + " fused transposed codes")
                else:
                    assert qt is None
            qc, sc = Q.quantize_columns_transposed(x, fmt)
            want_c = Q.quantize_rowwise_reference(x.t().contiguous(), fmt)
            _same(qc, want_c.q, name + " column codes")
            _same(sc, want_c.s, name + " column scales")
            assert qc.shape == (shape[1], shape[0]) and sc.shape == (shape[1], 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_transposed_codes_of_fp16_and_fp32_inputs_equal_the_reference(dtype):
    """Every transposing quantizer on the other input dtypes (fp32: what master weights are), on a
    ragged shape and on one that fills every tile."""
    for shape in ((130, 257), (384, 128)):
        for case, x in _adversarial(shape, dtype).items():
            if case not in ("random", "nan/inf", "subnormals", "huge"):
                continue
            for fmt in ("e4m3", "e5m2"):
                name = f"{dtype} {fmt} {shape} {case}"
                (want, s_want), want_t = Q.quantize_tensor_and_transpose_reference(x, fmt)
                for (q, sq), qt in (Q.quantize_tensor_and_transpose(x, fmt), Q.quantize_tensor_fused(x, fmt, True)):
                    _same(q, want, name + " codes", x.float().cpu())
                    _same(sq, s_want, name + " scale")
                    _same(qt, want_t, name + " transposed codes")
                    assert qt.shape == (shape[1], shape[0]) and qt.is_contiguous()
                s = torch.tensor(0.02, device=DEVICE)
                (_, given_t) = Q.quantize_tensor_and_transpose(x, fmt, s)
                _same(given_t, Q.quantize_tensor_and_transpose_reference(x, fmt, s)[1], name + " given S, transposed")
                qc, sc = Q.quantize_columns_transposed(x, fmt)
                want_c = Q.quantize_rowwise_reference(x.t().contiguous(), fmt)
                _same(qc, want_c.q, name + " column codes")
                _same(sc, want_c.s, name + " column scales")


@pytest.mark.skipif(DEVICE == "cpu", reason="the grid barrier and the direct launches are compiled-only paths")
def test_the_one_launch_quantizers_on_many_programs_and_unaligned_views():
    """Large enough for every resident program to take part in the barrier; then an input whose
    address is not 16-byte aligned (a view one element in), which must get its own compiled kernel."""
    g = torch.Generator(device=DEVICE).manual_seed(3)
    big = torch.randn(1537, 4099, device=DEVICE, dtype=torch.bfloat16, generator=g) * 5
    for x in (big[:, :4096], big.reshape(-1)[1 : 1 + 1536 * 4096].reshape(1536, 4096), big[:1536, :4096] * 1e-30):
        x = x.contiguous()
        for _ in range(2):
            (q, s), qt = Q.quantize_tensor_fused(x, "e4m3", True)
            (want, s_want), want_t = Q.quantize_tensor_and_transpose_reference(x, "e4m3")
            _same(q, want, "fused codes")
            _same(s, s_want, "fused scale")
            _same(qt, want_t, "fused transposed codes")
            qc, sc = Q.quantize_columns_transposed(x, "e5m2")
            want_c = Q.quantize_rowwise_reference(x.t().contiguous(), "e5m2")
            _same(qc, want_c.q, "column codes")
            _same(sc, want_c.s, "column scales")


def test_the_transposing_quantizer_refuses_what_it_cannot_transpose():
    with pytest.raises(ValueError, match="x must be a 2-D matrix"):
        Q.quantize_tensor_and_transpose(torch.randn(2, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="s must be a one-element tensor"):
        Q.quantize_tensor_and_transpose(torch.randn(4, 4, device=DEVICE), s=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="fmt"):
        Q.quantize_tensor_and_transpose(torch.randn(4, 4, device=DEVICE), "e3m4")
    for one_launch in (Q.quantize_tensor_fused, Q.quantize_columns_transposed):
        with pytest.raises(ValueError, match="x must be a 2-D matrix"):
            one_launch(torch.randn(2, 3, 4, device=DEVICE))
        with pytest.raises(ValueError, match="fmt"):
            one_launch(torch.randn(4, 4, device=DEVICE), "e3m4")


def test_swizzled_mx_scales_follow_the_128x4_tiles():
    s = torch.arange(130 * 5, dtype=torch.int32).reshape(130, 5).to(torch.uint8)
    flat = Q.swizzle_mx_scales(s)
    assert flat.numel() == 256 * 8
    tiles = flat.reshape(2, 2, 32, 4, 4)  # (tile row, tile col, r % 32, r // 32, c)
    for r, c in [(0, 0), (33, 2), (127, 3), (129, 4), (100, 1)]:
        tr, tc = divmod(r, 128)[0], divmod(c, 4)[0]
        rr, cc = r % 128, c % 4
        assert tiles[tr, tc, rr % 32, rr // 32, cc] == s[r, c]
    assert tiles[1, 1, 5, 0, 1] == 0  # padding is zero


def test_payload_overhead():
    assert Q.scale_bytes_per_element("mxfp8", (32, 32)) == 1 / 32
    assert Q.scale_bytes_per_element("1x128", (128, 128)) == 4 / 128
    assert Q.scale_bytes_per_element("128x128", (128, 128)) == 4 / 128**2


def test_the_references_take_host_tensors_on_either_lane():
    """The plain-PyTorch references run wherever their input is, also on a GPU machine, where the kernels
    insist on CUDA tensors: a notebook computes its device-independent numbers on the host."""
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    references = (
        Q.quantize_tensor_reference,
        Q.quantize_tensor_and_transpose_reference,
        Q.quantize_rowwise_reference,
        Q.quantize_1x128_reference,
        Q.quantize_mxfp8_reference,
        Q.quantize_128x128_reference,
        lambda x: Q.quantize_tensor_with_scale_reference(x, torch.tensor(0.5)),
    )
    for reference in references:
        out = reference(x)
        tensors = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
        assert tensors and all(t.device.type == "cpu" for t in tensors), reference
