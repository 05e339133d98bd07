"""kernels.fp8_gemm: every kernel against the float64 reference within its stated bound, the block-scaled
kernels bit for bit against the reference with the same promotion (CPU mode), adversarial inputs, bad
arguments, the Hopper accumulator model, and cuBLAS (``torch._scaled_mm``) on a GPU."""

import pytest
import torch
from _tuning import one_gemm_config  # noqa: F401 (a fixture, used below)

import kernels
from kernels import fp8_gemm as G
from kernels import hopper_mma
from kernels import quantize as Q
from kernels.device import default_device

DEVICE = default_device()
pytestmark = pytest.mark.usefixtures("one_gemm_config")  # GEMMs tuned over one tile: tests/_tuning.py
FMT = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def _quant(x, scaling, role, fmt="e4m3"):
    if scaling == "tensor":
        return Q.quantize_tensor(x, fmt)
    if scaling == "row":
        return Q.quantize_rowwise(x, fmt)
    return Q.quantize_1x128(x, fmt) if role == "a" else Q.quantize_128x128(x, fmt)


def _operands(m, n, k, scaling, a_fmt="e4m3", case="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2
    w = torch.randn(n, k, generator=g) * 0.05
    if case == "row magnitudes":  # rows of very different size: per-row scales matter
        x = x * torch.logspace(-4, 4, m)[:, None]
    elif case == "one outlier":
        x[m // 2, k // 3] = 3e4
    elif case == "zeros":
        x = torch.zeros(m, k)
    elif case == "all-equal":
        x = torch.full((m, k), -0.75)
    qa = _quant(x.to(DEVICE), scaling, "a", a_fmt)
    qb = _quant(w.to(DEVICE), scaling, "b")
    return qa, qb


def _check(c, qa, qb, scaling, name, accumulator=None):
    ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, scaling)
    mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, scaling)
    ok, msg = G.gemm_tolerance_report(c, ref, mag, accumulator=accumulator)
    print(f"[{name}] {msg}")
    assert c.dtype == torch.bfloat16 and c.shape == ref.shape
    assert ok, f"[{name}] {msg}"


SHAPES = [(1, 16, 16), (7, 40, 144), (130, 72, 272)]


@pytest.mark.parametrize("scaling", list(G.SCALINGS))
@pytest.mark.parametrize("kernel", G.KERNELS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_against_float64(scaling, kernel, shape):
    m, n, k = shape
    for a_fmt in ("e4m3", "e5m2") if kernel == "persistent" else ("e5m2",):
        qa, qb = _operands(m, n, k, scaling, a_fmt)
        c = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling, kernel=kernel)
        _check(c, qa, qb, scaling, f"{scaling} {kernel} {shape} a={a_fmt}")


@pytest.mark.parametrize("scaling", list(G.SCALINGS))
def test_the_unchecked_path_is_the_same_kernel(scaling):
    """FP8Linear's GEMMs skip the argument checks (their operands come from the quantizers): same bits,
    for a shape the persistent kernel takes and one that falls back to the grouped kernel (N * 2 bytes
    not a multiple of 16), and twice, so that the second call takes the cached launch."""
    for m, n, k in ((130, 72, 272), (33, 44, 128)):
        qa, qb = _operands(m, n, k, scaling)
        want = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling)
        for _ in range(2):
            got = G.fp8_gemm_unchecked(qa.q, qb.q, qa.s, qb.s, scaling)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (scaling, m, n, k)


@pytest.mark.parametrize("case", ["row magnitudes", "one outlier", "zeros", "all-equal"])
@pytest.mark.parametrize("scaling", list(G.SCALINGS))
def test_adversarial(case, scaling):
    qa, qb = _operands(70, 64, 256, scaling, case=case, seed=1)
    c = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling)
    _check(c, qa, qb, scaling, f"{scaling} {case}")
    if case == "zeros":
        assert torch.all(c == 0)


def test_v1_against_float64_and_v2():
    for shape in [(7, 40, 144), (70, 70, 272)]:
        qa, qb = _operands(*shape, "tensor")
        c1 = G.fp8_gemm_v1(qa.q, qb.q, qa.s, qb.s)
        _check(c1, qa, qb, "tensor", f"v1 {shape}")
        if kernels.INTERPRETER:  # exact dots: the launch order and tile size cannot change a bit
            c2 = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s)
            assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))


@pytest.mark.parametrize("kernel", G.KERNELS)
def test_blockwise_matches_promoted_reference(kernel):
    for shape in [(7, 40, 144), (130, 136, 384)]:
        qa, qb = _operands(*shape, "block", seed=2)
        # scales that differ a lot from block to block along K and N
        qa = Q.Quantized(qa.q, qa.s * torch.logspace(-3, 3, qa.s.shape[1], device=DEVICE)[None, :])
        c = G.fp8_gemm_blockwise(qa.q, qb.q, qa.s, qb.s, kernel=kernel)
        want = G.fp8_gemm_blockwise_reference(qa.q, qb.q, qa.s, qb.s)
        # The reference computes each 128-wide block's dot exactly; Hopper's tensor cores (and CPU mode,
        # which models them) add its four k32 slices in a 13-bit accumulator, so a block's partial product
        # may be off by a few 2^-13 of its magnitude (with these scales an output of 0.24 can come from
        # terms summing to 655), plus one bf16 rounding.  A scale on the wrong block is off by the magnitude.
        diff = (c.double() - want.double()).abs().cpu()
        mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, "block").cpu()
        bound = 2.0**-7 * want.double().abs().cpu() + 2.0 ** (2 - hopper_mma.ALIGN_FRACTION_BITS) * mag
        assert torch.all(diff <= bound), float((diff / mag.clamp_min(1e-300)).max())
        _check(c, qa, qb, "block", f"block {kernel} {shape}")


def test_nan_codes_propagate():
    qa, qb = _operands(64, 32, 128, "row")
    codes = qa.q.view(torch.uint8).clone()
    codes[5, 7] = Q.NAN_CODE
    a = codes.view(torch.float8_e4m3fn)
    c = G.fp8_gemm_rowwise(a, qb.q, qa.s, qb.s)
    assert torch.isnan(c[5]).all() and not torch.isnan(c[torch.arange(64) != 5]).any()


def test_out_dtypes():
    qa, qb = _operands(40, 48, 160, "row")
    ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, "row", torch.float64)
    mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, "row")
    c32 = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", out_dtype=torch.float32)
    ok, msg = G.gemm_tolerance_report(c32, ref, mag, out_dtype=torch.float32)
    print(f"[out float32] {msg}")
    assert c32.dtype == torch.float32 and ok, msg
    # The same fp32 result, rounded once to the narrower format: bit for bit on any device (the
    # accumulator's own error, CPU-exact or Hopper's ~13 bits, is common to all three outputs).
    for dt in (torch.bfloat16, torch.float16):
        c = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", out_dtype=dt)
        assert c.dtype == dt and torch.equal(c, c32.to(dt)), dt
    assert not torch.equal(c32, c32.to(torch.bfloat16).float()), "fp32 output carries no more bits than bf16"


def test_empty_and_k_zero():
    qa, qb = _operands(4, 16, 16, "tensor")
    c = G.fp8_gemm(qa.q[:0], qb.q, qa.s, qb.s)
    assert c.shape == (0, 16)
    z = torch.empty(4, 0, dtype=torch.float8_e4m3fn, device=DEVICE)
    w = torch.empty(16, 0, dtype=torch.float8_e4m3fn, device=DEVICE)
    assert torch.all(G.fp8_gemm(z, w, qa.s, qb.s) == 0)


def test_bad_arguments():
    qa, qb = _operands(32, 16, 128, "row")
    one = torch.ones((), device=DEVICE)
    with pytest.raises(TypeError, match="a must have dtype float8"):
        G.fp8_gemm(qa.q.float(), qb.q, qa.s, qb.s, "row")
    with pytest.raises(ValueError, match="K-major"):
        G.fp8_gemm(qa.q, qb.q.t(), qa.s, qb.s, "row")  # transposed codes are refused, not silently used
    with pytest.raises(ValueError, match="same K"):
        G.fp8_gemm(qa.q, qb.q[:, :64], qa.s, qb.s, "row")
    with pytest.raises(ValueError, match="a_scale has shape"):
        G.fp8_gemm(qa.q, qb.q, one, qb.s, "row")
    with pytest.raises(TypeError, match="float32"):
        G.fp8_gemm(qa.q, qb.q, qa.s.double(), qb.s, "row")
    with pytest.raises(ValueError, match="scaling must be"):
        G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "column")
    with pytest.raises(ValueError, match="kernel must be"):
        G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", kernel="fast")
    with pytest.raises(TypeError, match="both float8_e5m2"):
        G.fp8_gemm(qa.q.float().to(torch.float8_e5m2), qb.q.float().to(torch.float8_e5m2), qa.s, qb.s, "row")
    with pytest.raises(ValueError, match="b_scale has shape"):
        G.fp8_gemm_blockwise(qa.q, qb.q, torch.ones(32, 1, device=DEVICE), torch.ones(2, 1, device=DEVICE))
    with pytest.raises(ValueError, match="use_fast_accum must be False"):  # cuBLAS's block scaling always promotes
        G.scaled_mm(qa.q, qb.q, torch.ones(32, 1), torch.ones(1, 1), "block", use_fast_accum=True)
    with pytest.raises(ValueError, match="scaling must be"):
        G.scaled_mm(qa.q, qb.q, qa.s, qb.s, "column")


def test_fp8_path_says_how_operands_reach_the_mma():
    path = G.fp8_path()
    print(path)
    assert ("upcast to bf16" in path) == (kernels.device.capabilities().fp8 == "emulated")


# -- the accumulator: promotion is what keeps small K-blocks --------------------------------------------


def big_then_small(m=16, n=16, k=128 + 16384):
    """Block 0 of K sums 128 products of 1 (B = 128); the 16384 later products are 2^-13 = 2^-20 B each
    (32 of them, one MMA step, 2^-15 B).  Their sum, 2, is visible in bf16 (130 vs 128), but an
    accumulator of ~13-14 bits below B drops every one of them when they are added to B."""
    a = torch.ones(m, k)
    b = torch.ones(n, k)
    a[:, 128:] = 2.0**-4
    b[:, 128:] = 2.0**-9
    qa = Q.Quantized(a.to(torch.float8_e4m3fn).to(DEVICE), torch.ones(m, k // 128, device=DEVICE))
    qb = Q.Quantized(b.to(torch.float8_e4m3fn).to(DEVICE), torch.ones(triton_cdiv(n, 128), k // 128, device=DEVICE))
    return qa, qb


def triton_cdiv(a, b):
    return -(-a // b)


def _no_promotion(qa, qb):
    """One tl.dot chain over all of K (the tensorwise kernel), block scales all 1."""
    return G.fp8_gemm(qa.q, qb.q, torch.ones((), device=DEVICE), torch.ones((), device=DEVICE), "tensor")


def test_promotion_keeps_small_blocks():
    qa, qb = big_then_small()
    exact = G.fp8_gemm_blockwise_reference(qa.q, qb.q, qa.s, qb.s).float()
    if not kernels.INTERPRETER and kernels.device.capabilities().fp8 != "native":
        pytest.skip("the FP8 accumulator is a property of FP8 tensor cores (CPU mode models Hopper's)")
    promoted = G.fp8_gemm_blockwise(qa.q, qb.q, qa.s, qb.s).float()
    chained = _no_promotion(qa, qb).float()
    print(f"exact {exact[0, 0].item()}, promoted {promoted[0, 0].item()}, one chain {chained[0, 0].item()}")
    assert torch.equal(promoted, exact)
    assert (exact - chained).abs().min() > 2.0**-7 * exact.abs().max()


def test_hopper_accumulator_is_exact_for_small_sums():
    """Hopper's FP8 accumulator (on the GPU, and modelled in CPU mode) errs within the Hopper bound and only
    drops bits below 2^-13 of the largest addend: a short dot of small integers is exact."""
    if not kernels.INTERPRETER and kernels.device.capabilities().fp8 != "native":
        pytest.skip("the FP8 accumulator is a property of FP8 tensor cores (CPU mode models Hopper's)")
    qa, qb = _operands(64, 64, 128, "tensor")
    _check(G.fp8_gemm(qa.q, qb.q, qa.s, qb.s), qa, qb, "tensor", "Hopper accumulator", accumulator="hopper")
    a = torch.randint(-4, 5, (64, 64)).float().to(torch.float8_e4m3fn).to(DEVICE)
    one = torch.ones((), device=DEVICE)
    c = G.fp8_gemm(a, a, one, one, out_dtype=torch.float32).cpu()
    assert torch.equal(c, (a.cpu().double() @ a.cpu().double().T).float())


# -- cuBLAS ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(DEVICE != "cuda", reason="torch._scaled_mm runs cuBLASLt on a GPU")
@pytest.mark.parametrize("scaling", list(G.SCALINGS))
def test_against_scaled_mm(scaling):
    if kernels.device.capabilities().fp8 != "native":
        pytest.skip("torch._scaled_mm needs FP8 tensor cores")
    qa, qb = _operands(512, 768, 1024, scaling)
    ours = G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling)
    cublas = G.scaled_mm(qa.q, qb.q, qa.s, qb.s, scaling)
    _check(cublas, qa, qb, scaling, f"torch._scaled_mm {scaling}")
    _check(ours, qa, qb, scaling, f"ours {scaling}")
    diff = (ours.float() - cublas.float()).abs().max().item()
    print(f"[ours vs cuBLAS {scaling}] max |diff| {diff:.3e}")
