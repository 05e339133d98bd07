"""kernels.fp8_gemm's epilogue contract: the fp32 accumulator is dequantized, the bias added, the
activation applied, and the result rounded once to the output dtype.  Checked against the float64
reference of the same contract, on every kernel and scaling; a kernel that breaks the order is caught;
bad arguments are refused by name."""

import pytest
import torch
from _tuning import one_gemm_config  # noqa: F401 (a fixture, used below)

from kernels import fp8_gemm as G
from kernels import quantize as Q
from kernels.device import default_device

DEVICE = default_device()
pytestmark = pytest.mark.usefixtures("one_gemm_config")  # GEMMs tuned over one tile: tests/_tuning.py
QUANTIZERS = {
    "tensor": (Q.quantize_tensor, Q.quantize_tensor),
    "row": (Q.quantize_rowwise, Q.quantize_rowwise),
    "block": (Q.quantize_1x128, Q.quantize_128x128),
}


def _operands(m, n, k, scaling, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g)  # the same size as the products: the order of the epilogue shows
    qa, qb = (f(t.to(DEVICE), "e4m3") for f, t in zip(QUANTIZERS[scaling], (x, w), strict=True))
    return qa, qb, bias.to(DEVICE)


def _report(got, qa, qb, scaling, bias, activation, out_dtype):
    ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, scaling, out_dtype, bias, activation)
    mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, scaling)
    if bias is not None:  # the bias's own fp32 rounding scales with it
        mag = mag + bias.double().abs()[None, :]
    return G.gemm_tolerance_report(got, ref, mag, out_dtype)


CASES = [  # (shape, bias dtype or None, out dtype): a TMA-aligned shape, one that falls back, one row
    ((130, 72, 272), torch.bfloat16, torch.bfloat16),
    ((33, 44, 128), torch.float32, torch.float16),
    ((1, 48, 256), None, torch.bfloat16),
]


@pytest.mark.parametrize("activation", G.ACTIVATIONS)
@pytest.mark.parametrize("scaling", G.SCALINGS)
@pytest.mark.parametrize("kernel", G.KERNELS)
def test_the_epilogue_meets_its_reference(kernel, scaling, activation):
    for (m, n, k), bias_dtype, out_dtype in CASES:
        qa, qb, bias = _operands(m, n, k, scaling)
        bias = None if bias_dtype is None else bias.to(bias_dtype)
        got = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling, out_dtype, kernel, bias=bias, activation=activation)
        assert got.dtype == out_dtype and got.shape == (m, n)
        ok, msg = _report(got, qa, qb, scaling, bias, activation, out_dtype)
        assert ok, f"{kernel} {scaling} {activation} {(m, n, k)}: {msg}"


def test_fp32_output_with_relu_and_a_bias():
    qa, qb, bias = _operands(130, 72, 272, "row")
    got = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", torch.float32, bias=bias, activation="relu")
    ok, msg = _report(got, qa, qb, "row", bias, "relu", torch.float32)
    assert ok, msg
    assert (got >= 0).all()


@pytest.mark.parametrize(
    "wrong",
    ["activation before the bias", "no bias", "bias added twice", "ReLU for SiLU"],
)
def test_the_check_catches_a_broken_epilogue(wrong):
    """Each way of getting the contract wrong, built from the kernel's own unfused pieces, fails the
    same check that the fused kernel passes."""
    qa, qb, bias = _operands(130, 72, 272, "tensor")
    plain = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "tensor", torch.float32)  # dequantized fp32, no epilogue
    if wrong == "activation before the bias":
        got = torch.nn.functional.silu(plain) + bias
    elif wrong == "no bias":
        got = torch.nn.functional.silu(plain)
    elif wrong == "bias added twice":
        got = torch.nn.functional.silu(plain + 2 * bias)
    else:
        got = torch.relu(plain + bias)
    ok, msg = _report(got.to(torch.bfloat16), qa, qb, "tensor", bias, "silu", torch.bfloat16)
    assert not ok, f"{wrong} passed: {msg}"


def test_the_order_of_a_right_unfused_epilogue_passes():
    """The contract done in PyTorch after an fp32-output GEMM, the way a student would write it."""
    qa, qb, bias = _operands(130, 72, 272, "row")
    plain = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", torch.float32)
    got = torch.nn.functional.silu(plain + bias).to(torch.bfloat16)
    ok, msg = _report(got, qa, qb, "row", bias, "silu", torch.bfloat16)
    assert ok, msg


def test_nan_and_inf_in_the_bias_reach_the_output():
    qa, qb, bias = _operands(33, 48, 128, "tensor")
    bias[3], bias[5], bias[7] = float("nan"), float("inf"), -float("inf")
    for activation in G.ACTIVATIONS:
        got = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, bias=bias, activation=activation).float()
        assert got[:, 3].isnan().all(), activation  # ReLU and SiLU keep a NaN a NaN
        want5 = {None: float("inf"), "relu": float("inf"), "silu": float("inf")}[activation]
        assert (got[:, 5] == want5).all(), activation
        col7 = got[:, 7]
        if activation is None:
            assert (col7 == -float("inf")).all()
        elif activation == "relu":
            assert (col7 == 0).all()
        else:  # SiLU(-inf) = -inf * sigmoid(-inf) = -inf * 0: NaN, as torch.nn.functional.silu gives
            assert col7.isnan().all() == torch.nn.functional.silu(torch.tensor(-float("inf"))).isnan().item()


def test_k_zero_still_applies_the_epilogue():
    a = torch.zeros(5, 0, dtype=torch.float8_e4m3fn, device=DEVICE)
    b = torch.zeros(16, 0, dtype=torch.float8_e4m3fn, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    bias = torch.linspace(-2, 2, 16, device=DEVICE)
    got = G.fp8_gemm(a, b, one, one, bias=bias, activation="relu")
    assert torch.equal(got, bias.clamp_min(0).to(torch.bfloat16).expand(5, 16))


def test_bad_epilogue_arguments_are_refused_by_name():
    qa, qb, bias = _operands(8, 32, 128, "tensor")
    args = (qa.q, qb.q, qa.s, qb.s)
    with pytest.raises(ValueError, match="activation must be one of"):
        G.fp8_gemm(*args, activation="gelu")
    with pytest.raises(ValueError, match=r"bias has shape \(31,\).*\(32,\)"):
        G.fp8_gemm(*args, bias=bias[:31])
    with pytest.raises(ValueError, match=r"bias has shape \(1, 32\)"):
        G.fp8_gemm(*args, bias=bias[None, :])
    with pytest.raises(TypeError, match="bias must be bfloat16, float16 or float32"):
        G.fp8_gemm(*args, bias=bias.double())
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        G.fp8_gemm(*args, bias=[0.0] * 32)
    with pytest.raises(ValueError, match="activation must be one of"):
        G.fp8_gemm_reference(*args, activation="tanh")


def test_a_strided_bias_is_read_as_its_values():
    qa, qb, bias = _operands(33, 48, 128, "row")
    wide = torch.stack([bias, -bias], dim=1)  # bias is column 0: stride 2
    got = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", bias=wide[:, 0])
    want = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", bias=bias.clone())
    assert torch.equal(got, want)
