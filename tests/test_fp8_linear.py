"""kernels.fp8_linear: the layer's forward and gradients equal the same recipe computed by references,
stay within stated tolerances of a bf16 nn.Linear, requantize transposed operands, keep delayed-scaling
state, and train a small model like bf16 does."""

import pytest
import torch
from _tuning import one_gemm_config  # noqa: F401 (a fixture, used below)

from kernels import fp8_gemm as G
from kernels import fp8_linear as L
from kernels import quantize as Q
from kernels.device import default_device
from kernels.testing import frobenius_error

DEVICE = default_device()
pytestmark = pytest.mark.usefixtures("one_gemm_config")  # GEMMs tuned over one tile: tests/_tuning.py


def _data(t=96, i=64, o=48, dy_scale=1e-6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, i, generator=g).to(torch.bfloat16)
    w = (torch.randn(o, i, generator=g) * i**-0.5).to(torch.bfloat16)
    dy = (torch.randn(t, o, generator=g) * dy_scale).to(torch.bfloat16)  # gradients are small
    return x.to(DEVICE), w.to(DEVICE), dy.to(DEVICE)


def _run(fn, x, w, dy, bias=None):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = fn(x, w, bias)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("granularity", L.GRANULARITIES)
def test_matches_reference_and_bf16(granularity):
    recipe = L.FP8Recipe(granularity=granularity)
    x, w, dy = _data()
    got = _run(lambda x, w, b: L.fp8_linear(x, w, b, recipe), x, w, dy)
    ref = L.fp8_linear_reference(x, w, dy, recipe)
    bf16 = _run(lambda x, w, b: x @ w.T, x, w, dy)
    for name, g, r, b in zip(("y", "dx", "dw"), got, ref, bf16, strict=True):
        vs_ref, vs_bf16 = frobenius_error(g, r), frobenius_error(g, b)
        print(f"[{granularity} {name}] vs same-recipe reference {vs_ref:.2e}, vs bf16 {vs_bf16:.4f}")
        # The reference's dots are exact; Hopper's FP8 accumulator (compiled, and in CPU mode) is not.
        assert vs_ref <= 1e-2
        assert vs_bf16 <= L.BF16_TOLERANCE[name]


@pytest.mark.parametrize("granularity", L.GRANULARITIES)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)], ids=str)
def test_matches_reference_with_fp32_weights(granularity, dtypes):
    """fp32 master weights, with fp32 activations or with bf16 ones (what autocast hands the layer):
    W^T's codes are made from an fp32 matrix, which the compiled transposing quantizers must get right."""
    recipe = L.FP8Recipe(granularity=granularity)
    x, w, dy = _data(t=256, i=128, o=384)
    x, w, dy = x.to(dtypes[0]), w.to(dtypes[1]), dy.to(dtypes[0])
    got = _run(lambda x, w, b: L.fp8_linear(x, w, b, recipe), x, w, dy)
    ref = L.fp8_linear_reference(x, w, dy, recipe)
    for name, g, r in zip(("y", "dx", "dw"), got, ref, strict=True):
        assert torch.isfinite(g).all(), name
        assert frobenius_error(g, r) <= 1e-2, name


def test_bias_and_leading_dims():
    x, w, dy = _data()
    bias = torch.randn(48, device=DEVICE, dtype=torch.bfloat16)
    layer = L.FP8Linear(64, 48, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(bias)
    x3 = x.reshape(4, 24, 64).clone().requires_grad_(True)
    y = layer(x3)
    assert y.shape == (4, 24, 48) and y.dtype == torch.bfloat16
    y.backward(dy.reshape(4, 24, 48))
    ref = L.fp8_linear_reference(x, w, dy, bias=bias)
    assert frobenius_error(y.reshape(96, 48), ref[0]) <= 1e-2  # Hopper's FP8 accumulator, on both lanes
    assert x3.grad.shape == x3.shape
    assert torch.allclose(layer.bias.grad.float(), dy.float().sum(0), rtol=1e-2, atol=1e-9)


def test_gradients_are_scaled_not_flushed():
    """Gradients of 1e-7 are far below e5m2's smallest subnormal (2^-16): only the scale saves them."""
    x, w, dy = _data(dy_scale=1e-7)
    _, dx, dw = _run(lambda x, w, b: L.fp8_linear(x, w), x, w, dy)
    assert (dx != 0).float().mean() > 0.99 and (dw != 0).float().mean() > 0.99
    unscaled = dy.to(torch.float8_e5m2)
    assert torch.all(unscaled.float() == 0)  # what an unscaled cast would have used


def test_transposed_operands_are_requantized():
    """Per-row scales: dW needs X^T quantized along T; the layer matches the reference that does so,
    and differs from one that transposes X's codes (scales along the wrong axis)."""
    x, w, dy = _data()
    x = x * torch.logspace(-3, 3, x.shape[0], device=DEVICE)[:, None].to(x.dtype)  # tokens of very different size
    recipe = L.FP8Recipe(granularity="row")
    _, _, dw = _run(lambda x, w, b: L.fp8_linear(x, w, None, recipe), x, w, dy)
    bf16 = _run(lambda x, w, b: x @ w.T, x, w, dy)[2]
    err = frobenius_error(dw, bf16)
    # The shortcut: X's codes transposed, with one scale per row of X^T that cannot vary along T (the
    # largest token scale): small tokens lose their bits.
    qx = Q.quantize_rowwise(x)
    xt_codes = qx.q.t().contiguous()  # (in, T)
    xt_scale = qx.s.max().expand(x.shape[1], 1).contiguous()
    qdyt = Q.quantize_rowwise(dy.t().contiguous(), "e5m2")
    wrong = G.fp8_gemm_rowwise(qdyt.q, xt_codes, qdyt.s, xt_scale)
    wrong_err = frobenius_error(wrong, bf16)
    print(f"dW vs bf16: requantized {err:.4f}, transposed codes {wrong_err:.4f}")
    assert err <= L.BF16_TOLERANCE["dw"] < wrong_err


def test_per_tensor_transposed_codes_equal_requantized_transposes():
    """One scale per tensor: the backward's shortcut (the forward's codes transposed) is bit for bit the
    requantized wide transpose with the same S, and the layer's gradients are those of requantizing."""
    x, w, dy = _data()
    x[3, 5], w[7, 1] = 40.0, -0.003  # values that saturate nothing but use the ends of the range
    for t, fmt in ((x, "e4m3"), (w, "e4m3"), (dy, "e5m2")):
        q = Q.quantize_tensor(t, fmt)
        requantized = Q.quantize_tensor_with_scale(t.t().contiguous(), q.s, fmt)
        assert torch.equal(q.q.t().contiguous().view(torch.uint8), requantized.view(torch.uint8))
    _, dx, dw = _run(lambda x, w, b: L.fp8_linear(x, w), x, w, dy)
    qx, qw, qdy = Q.quantize_tensor(x), Q.quantize_tensor(w), Q.quantize_tensor(dy, "e5m2")

    def requant(t, q, fmt):
        return Q.quantize_tensor_with_scale(t.t().contiguous(), q.s, fmt)

    want_dx = G.fp8_gemm(qdy.q, requant(w, qw, "e4m3"), qdy.s, qw.s)
    want_dw = G.fp8_gemm(requant(dy, qdy, "e5m2"), requant(x, qx, "e4m3"), qdy.s, qx.s)
    assert torch.equal(dx, want_dx.to(dx.dtype)) and torch.equal(dw, want_dw.to(dw.dtype))


def test_delayed_scaling_history_and_state_dict():
    recipe = L.FP8Recipe(scaling="delayed", history_len=4)
    layer = L.FP8Linear(64, 32, device=DEVICE, recipe=recipe)
    current = L.FP8Linear(64, 32, device=DEVICE)
    current.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("amax_history")})
    x, _, _ = _data(t=16, i=64, o=32)
    x = x.float()
    # Step 1 (empty history) uses the current scale: the same output as current scaling.
    assert torch.equal(layer(x), current(x))
    h = layer.amax_histories()["x"]
    assert h[0].item() == x.abs().max().item() and h[1].item() == 0
    # Step 2: a spike 100x larger saturates, because the scale still comes from step 1's amax.
    spike = x * 100
    y_delayed, y_current = layer(spike), current(spike)
    assert frobenius_error(y_delayed, y_current) > 0.5
    assert layer.amax_histories()["x"][0].item() == spike.abs().max().item()
    # The histories are checkpointed.
    state = layer.state_dict()
    assert {"amax_history_x", "amax_history_w", "amax_history_dy"} <= set(state)
    fresh = L.FP8Linear(64, 32, device=DEVICE, recipe=recipe)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.amax_histories()["x"], layer.amax_histories()["x"])
    assert set(current.state_dict()) == set(torch.nn.Linear(64, 32).state_dict())


def test_module_interface_and_swap():
    lin = torch.nn.Linear(64, 32, device=DEVICE)
    fp8 = L.FP8Linear.from_linear(lin)
    assert fp8.weight is lin.weight and isinstance(fp8, torch.nn.Linear)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
    L.swap_linears(model, min_features=0)
    assert isinstance(model[0], L.FP8Linear) and type(model[2]) is torch.nn.Linear  # 10 is not a multiple of 16
    print(model)


def test_swap_keeps_narrow_layers_in_bf16_unless_forced():
    model = torch.nn.Sequential(
        torch.nn.Linear(L.MIN_FEATURES, L.MIN_FEATURES, device="meta"),
        torch.nn.Linear(L.MIN_FEATURES, L.MIN_FEATURES - 16, device="meta"),
        torch.nn.Linear(64, 64, device="meta"),
    )
    L.swap_linears(model)
    assert [type(m).__name__ for m in model] == ["FP8Linear", "Linear", "Linear"]
    L.swap_linears(model, min_features=0)
    assert all(isinstance(m, L.FP8Linear) for m in model)
    with pytest.raises(ValueError, match="min_features"):
        L.swap_linears(model, min_features=-1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 16"):
        L.FP8Linear(60, 32)
    with pytest.raises(ValueError, match="granularity"):
        L.FP8Recipe(granularity="mxfp8")
    with pytest.raises(ValueError, match="delayed"):
        L.FP8Recipe(granularity="row", scaling="delayed")
    with pytest.raises(ValueError, match=r"fwd_fmt must be 'e4m3'.*two e5m2 operands"):
        L.FP8Recipe(fwd_fmt="e5m2")
    with pytest.raises(TypeError, match="recipe"):
        L.FP8Linear(64, 32, recipe="tensor")
    with pytest.raises(ValueError, match="in_features"):
        L.fp8_linear(torch.randn(4, 32, device=DEVICE), torch.randn(16, 64, device=DEVICE))
    with pytest.raises(TypeError, match="x must be"):
        L.fp8_linear(torch.randn(4, 64, device=DEVICE).double(), torch.randn(16, 64, device=DEVICE))


def test_markov_source_entropy():
    probs, h = L.markov_source(vocab=8, order=1, seed=0)
    assert probs.shape == (8, 8) and torch.allclose(probs.sum(-1), torch.ones(8))
    assert 0 < h < torch.log(torch.tensor(8.0)).item()


def test_training_fp8_tracks_bf16():
    kw = dict(steps=2, batch=16, dim=16, depth=1, lr=3e-3)
    fp8, h = L.train_markov(L.FP8Recipe(), **kw)
    bf16, _ = L.train_markov(None, **kw)
    print("fp8 ", [round(v, 4) for v in fp8], "\nbf16", [round(v, 4) for v in bf16], "\nentropy", h)
    assert all(abs(a - b) < 0.05 for a, b in zip(fp8, bf16, strict=True))
