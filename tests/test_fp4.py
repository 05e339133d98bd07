"""kernels.fp4: E2M1 rounding against ml_dtypes, the nibble order against torch's float4_e2m1fn_x2
packing, every kernel bit for bit against its plain-torch reference where the operation is exact (codes,
scales, dequantization), the E2M1 decoders at every code."""

import ast
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels import formats, fp4, hadamard, stochastic
from kernels.device import default_device
from kernels.quantize import e8m0_to_float
from kernels.testing import assert_bits_equal, special_inputs

DEVICE = default_device()


def _cases(shape, dtype, seed=0):
    return special_inputs(shape, dtype, seed, DEVICE)


def _same_fp4(got: fp4.FP4Tensor, want: fp4.FP4Tensor, name: str):
    assert_bits_equal(got.q.cpu(), want.q.cpu(), name=f"{name} codes")
    assert_bits_equal(got.s.view(torch.uint8).cpu(), want.s.view(torch.uint8).cpu(), name=f"{name} scales")
    if want.tensor_scale is not None:
        assert_bits_equal(got.tensor_scale.cpu(), want.tensor_scale.cpu(), name=f"{name} tensor scale")


# -- E2M1 and packing ---------------------------------------------------------------------------------


def test_e2m1_values_are_the_formats_decoder():
    codes = torch.arange(16)
    assert fp4.e2m1_decode(codes).tolist()[:8] == list(fp4.E2M1_VALUES)
    assert_bits_equal(fp4.e2m1_decode(codes), formats.decode(codes, "e2m1"), name="e2m1 decode")


def test_rne_against_ml_dtypes_at_every_tie_and_neighbour():
    grid = torch.tensor(fp4.E2M1_VALUES, dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    pts = torch.cat([grid, mids, torch.tensor([6.5, 7.0, 100.0, 1e30])]).float()
    near = torch.cat([pts, torch.nextafter(pts, torch.tensor(0.0)), torch.nextafter(pts, torch.tensor(1e38))])
    mag = near.abs()
    want = mag.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(np.int32)
    got = fp4.e2m1_rne_reference(mag).numpy()
    assert np.array_equal(got, want), f"ties or saturation differ from ml_dtypes at {mag[got != want].tolist()}"


@triton.jit
def _code_probe_kernel(v_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs, mask=offs < n, other=0.0)
    tl.store(c_ptr + offs, fp4._e2m1_code(v), mask=offs < n)


def test_kernel_rounding_is_the_boundary_count():
    """The kernels round with one fp32 addition (:func:`kernels.fp4._e2m1_code`); the reference counts
    boundaries.  Every tie, its fp32 neighbours, grid points, saturation, signs and a sweep of [0, 8]."""
    grid = torch.tensor(fp4.E2M1_VALUES, dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    pts = torch.cat([grid, mids, torch.tensor([6.5, 7.0, 7.99, 8.0, 100.0, 1e30, 1e-30, 1e-40])]).float()
    pts = torch.cat([pts, torch.nextafter(pts, torch.tensor(0.0)), torch.nextafter(pts, torch.tensor(1e38))])
    sweep = torch.rand(20000, generator=torch.Generator().manual_seed(0)) * 8
    v = torch.cat([pts, -pts, sweep, -sweep])
    out = torch.empty(v.shape, dtype=torch.int32, device=DEVICE)
    _code_probe_kernel[(triton.cdiv(v.numel(), 1024),)](v.to(DEVICE), out, v.numel(), BLOCK=1024)
    want = fp4.e2m1_rne_reference(v.abs().clamp(max=fp4.E2M1_MAX))
    assert_bits_equal(out.cpu(), want, name="E2M1 codes: one addition vs counting boundaries")


def test_quantize_tiling_and_input_paths():
    """Several tiles per program with a ragged last one, row counts that do not fill a tile, and bf16 read
    as int32 pairs vs element by element (a view at an odd offset): the same bits as the reference."""
    for fmt, bs in fp4.FORMATS.items():
        for shape in [(3, bs * 41), (5, bs * 19), (1, bs * 70), (4, 512)]:
            for case, x in special_inputs(shape, torch.bfloat16, 4, DEVICE).items():
                if case in ("random", "one outlier", "nan/inf"):
                    _same_fp4(fp4.quantize_fp4(x, fmt), fp4.quantize_fp4_reference(x, fmt), f"{fmt} {shape} {case}")
        # (4, 512) is whole tiles only: the unmasked path
        rows, g, tiles = fp4._quantize_launch(4, 512, bs, False)
        assert 4 % rows == 0 and (512 // bs) % (g * tiles) == 0 and tiles > 1
        base = torch.randn(4 * bs * 9 + 1, generator=torch.Generator().manual_seed(5)).to(DEVICE, torch.bfloat16)
        odd = base[1:].reshape(4, bs * 9)  # contiguous, but starts 2 bytes into the storage
        assert odd.data_ptr() % 4 == 2
        _same_fp4(fp4.quantize_fp4(odd, fmt), fp4.quantize_fp4(odd.clone(), fmt), f"{fmt} odd offset vs aligned")
        _same_fp4(fp4.quantize_fp4(odd, fmt), fp4.quantize_fp4_reference(odd, fmt), f"{fmt} odd offset")


def test_pack_order_is_torchs_float4_e2m1fn_x2():
    codes = torch.tensor([[2, 1, 7, 15]])  # 1.0, 0.5, 6.0, -6.0
    packed = fp4.pack(codes)
    assert packed.tolist() == [[0x12, 0xF7]], "element 2i in the low nibble, 2i+1 in the high nibble"
    assert torch.equal(fp4.unpack(packed), codes.to(torch.uint8))
    view = packed.view(torch.float4_e2m1fn_x2)  # torch's packed FP4 dtype: one byte holds two elements
    assert view.shape == (1, 2) and view.element_size() == 1
    assert torch.equal(fp4.unpack(view), codes.to(torch.uint8))


def _torch_pack_uint4():
    """torch's own reference packer for float4_e2m1fn_x2 (torch/testing/_internal/common_quantized.py),
    read from its source: the module itself imports test-only dependencies."""
    path = Path(torch.__file__).parent / "testing" / "_internal" / "common_quantized.py"
    if not path.exists():
        pytest.skip("this torch build has no common_quantized.py to compare with")
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("pack_uint4", "down_size")]
    if len(wanted) != 2:
        pytest.skip("torch's pack_uint4 / down_size not found in common_quantized.py")
    namespace = {"torch": torch}
    exec(compile(ast.Module(wanted, []), str(path), "exec"), namespace)
    return namespace["pack_uint4"]


def test_pack_matches_torchs_reference_packer():
    codes = torch.randint(0, 16, (9, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    assert torch.equal(fp4.pack(codes), _torch_pack_uint4()(codes))


def test_pack_rejects_bad_codes():
    with pytest.raises(ValueError, match="even last dimension"):
        fp4.pack(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        fp4.pack(torch.tensor([3, 16]))
    with pytest.raises(TypeError, match="integer tensor"):
        fp4.pack(torch.zeros(2))


# -- quantizers: kernel == reference, bit for bit ------------------------------------------------------

SHAPES = {"nvfp4": [(1, 16), (7, 48), (40, 288), (2, 3, 32)], "mxfp4": [(1, 32), (7, 64), (40, 288), (2, 3, 32)]}


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_quantize_matches_reference(fmt, dtype):
    shapes = SHAPES[fmt] if dtype == torch.bfloat16 else SHAPES[fmt][1:3]  # the interpreter is slow
    for shape in shapes:
        for case, x in _cases(shape, dtype).items():
            name = f"{fmt} {dtype} {shape} {case}"
            _same_fp4(fp4.quantize_fp4(x, fmt), fp4.quantize_fp4_reference(x, fmt), name)


@pytest.mark.parametrize(
    "fmt,kw",
    [
        ("nvfp4", {"block_2d": True}),
        ("nvfp4", {"stochastic_rounding": True, "seed": 7}),
        ("mxfp4", {"stochastic_rounding": True, "seed": 7}),
        ("nvfp4", {"tensor_scale": torch.tensor(0.01)}),
    ],
    ids=["2d", "nv-sr", "mx-sr", "given-ts"],
)
def test_quantize_options_match_reference(fmt, kw):
    kw = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    for shape in [(7, 64), (37, 96), (32, 512)]:  # (32, 512): whole tiles, the unmasked path
        for case, x in _cases(shape, torch.bfloat16, seed=1).items():
            if case in ("subnormals", "huge"):
                continue
            _same_fp4(fp4.quantize_fp4(x, fmt, **kw), fp4.quantize_fp4_reference(x, fmt, **kw), f"{fmt} {kw} {case}")


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
def test_codes_are_ml_dtypes_rounding_of_the_scaled_values(fmt):
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(3)) * 5
    t = fp4.quantize_fp4(x.to(DEVICE), fmt)
    bs = fp4.FORMATS[fmt]
    if fmt == "mxfp4":
        s = e8m0_to_float(t.s.cpu())
    else:
        s = t.s.cpu().float() * t.tensor_scale.cpu()
    inv = 1.0 / s  # the quantizer's per-block reciprocal, correctly rounded
    scaled = x.reshape(16, -1, bs) * inv[..., None]
    want = scaled.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(16, 64)
    assert np.array_equal(fp4.unpack(t.q.cpu()).numpy(), want)


def test_scale_rules():
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-5.0, 5.0, 32)  # amax 5: e = floor(log2 5) - 2 = 0, byte 127
    x[0, 32:] = 0.0  # all-zero block: S = 1
    x[1, :32] = 1000.0  # e = 9 - 2 = 7: byte 134, 1000 / 128 = 7.8 saturates to 6
    x[1, 32:] = 0.1  # e = -4 - 2 = -6: byte 121
    mx = fp4.quantize_mxfp4(x.to(DEVICE))
    assert mx.s.cpu().tolist() == [[127, 127], [134, 121]]
    assert fp4.unpack(mx.q.cpu())[1, 0].item() == 7, "1000 / 2^7 = 7.8 must saturate to 6 (code 7)"
    nv = fp4.quantize_nvfp4(x.to(DEVICE))
    assert nv.tensor_scale.item() == np.float32(1000.0) / np.float32(2688.0)
    blocks = nv.s.cpu().float()
    assert blocks[1, 0].item() == 448.0, "the block holding the tensor's amax uses E4M3's top value"
    assert blocks[0, 2].item() == 0.0 and fp4.unpack(nv.q.cpu())[0, 32:48].eq(0).all()
    # the whole tensor is reconstructed within half an E2M1 step of each block's scale
    deq = fp4.dequantize_fp4(nv).cpu()
    assert (deq - x).abs().max() <= 1000.0 / 6 * 0.5 * 2


def test_nonfinite_poisons_its_block_only():
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    for fmt, bs in fp4.FORMATS.items():
        y = fp4.dequantize_fp4(fp4.quantize_fp4(x.to(DEVICE), fmt)).cpu()
        nan = torch.isnan(y)
        want = torch.zeros_like(nan)
        want[0, :bs] = True
        want[1, 40 // bs * bs : 40 // bs * bs + bs] = True
        assert torch.equal(nan, want), f"{fmt}: NaN must cover exactly the blocks that held NaN/inf"


def test_stochastic_rounding_is_unbiased():
    x = torch.linspace(-5.9, 5.9, 64).reshape(1, 64)  # amax 5.9: e = floor(log2 5.9) - 2 = 0, S = 1
    samples = []
    for seed in range(48):
        t = fp4.quantize_fp4_reference(x, "mxfp4", stochastic_rounding=True, seed=seed)
        samples.append(fp4.dequantize_fp4_reference(t))
    s = torch.stack(samples)  # (48, 1, 64)
    lo, hi = _neighbours(x)
    sd = torch.sqrt((x - lo) * (hi - x)).clamp(min=1e-6) / math.sqrt(s.shape[0])
    z = ((s.mean(0) - x) / sd).abs()
    assert z.max() < 5, f"stochastic rounding looks biased: max |z| = {z.max():.2f}"
    assert set(torch.unique(s).tolist()) <= {v * sg for v in fp4.E2M1_VALUES for sg in (1, -1)}
    # the rounding is to a neighbour, never further
    assert ((s >= lo - 1e-6) & (s <= hi + 1e-6)).all()


def _neighbours(x):
    grid = torch.tensor(sorted({v * s for v in fp4.E2M1_VALUES for s in (1, -1)}))
    idx = torch.searchsorted(grid, x.contiguous(), right=True).clamp(1, len(grid) - 1)
    lo = grid[idx - 1]
    hi = torch.where(grid[idx - 1] == x, x, grid[idx])
    return lo, hi


def test_stochastic_bits_are_philox_words():
    x = torch.randn(2, 32)
    r = stochastic.random_bits(64, 5, device=DEVICE).reshape(2, 1, 32)
    t = fp4.quantize_fp4_reference(x, "mxfp4", stochastic_rounding=True, seed=5)
    inv = 2.0 ** -(t.s.to(torch.int32) - 127).float()
    mag = (x.reshape(2, 1, 32) * inv[..., None]).abs().clamp(max=6)
    want = fp4.e2m1_stochastic_reference(mag, r).reshape(2, 32)
    assert torch.equal(fp4.unpack(t.q).to(torch.int32) & 7, want)


def test_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        fp4.quantize_nvfp4(torch.zeros(2, 24, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        fp4.quantize_mxfp4(torch.zeros(2, 32, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="fmt must be one of"):
        fp4.quantize_fp4(torch.zeros(2, 32, device=DEVICE), "nvfp8")
    with pytest.raises(ValueError, match="block_2d"):
        fp4.quantize_fp4_reference(torch.zeros(2, 32), "mxfp4", block_2d=True)
    with pytest.raises(ValueError, match="seed"):
        fp4.quantize_mxfp4(torch.zeros(2, 32, device=DEVICE), stochastic_rounding=True, seed=-1)
    with pytest.raises(TypeError, match="FP4Tensor"):
        fp4.dequantize_fp4(torch.zeros(2, 16, dtype=torch.uint8))


# -- the wgrad operands: transpose, rotation and quantization in one kernel ------------------------------


def _unfused_t(x, fmt, signs, **kw):
    xt = x.t().contiguous()
    if signs is not None:
        xt = hadamard.hadamard_rotate(xt, fp4.RHT_BLOCK, signs)
    return fp4.quantize_fp4(xt, fmt, **kw)


@pytest.mark.parametrize("layout", ["transpose", "pairs"])
@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_quantize_t_is_the_unfused_passes_bit_for_bit(fmt, dtype, layout, monkeypatch):
    """quantize_fp4_t(x) = quantize(hadamard_rotate(x^T)): rotated or not, nearest or stochastic, on
    shapes that fill its tiles and shapes that do not, with outliers and every special value; by either
    of its kernels."""
    monkeypatch.setattr(fp4, "QUANT_T_LAYOUT", layout)
    signs = hadamard.random_signs(fp4.RHT_BLOCK, 3, DEVICE)
    special = special_inputs((64, 64), dtype, seed=1, device=DEVICE)
    if dtype != torch.bfloat16:  # the training recipe's dtype gets every case; the others the loads' paths
        special = {case: special[case] for case in ("random", "nan/inf")}
    inputs = [(f"{case} (64, 64)", x) for case, x in special.items()]
    for shape in ((128, 128), (96, 80), (64, 16)):  # tiles filled; ragged in both directions; one narrow tile
        x = special_inputs(shape, dtype, seed=shape[1], device=DEVICE)["one outlier"]
        inputs.append((f"one outlier {shape}", x))
    for case, x in inputs:
        for rotate in (True, False):
            for sr in ({}, {"stochastic_rounding": True, "seed": 9}):
                s = signs if rotate else None
                got, want = fp4.quantize_fp4_t(x, fmt, s, **sr), _unfused_t(x, fmt, s, **sr)
                _same_fp4(got, want, f"{fmt} {dtype} {case} rotate={rotate} {sr}")


def test_quantize_t_rotates_along_the_tokens_and_against_the_reference():
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(64, 48, generator=g) * 1e-2).to(torch.bfloat16)
    x[17, 5] = 30.0  # one outlier token element: its block of 16 tokens is spread
    signs = hadamard.random_signs(16, 1)
    got = fp4.quantize_fp4_t(x.to(DEVICE), "nvfp4", signs.to(DEVICE))
    rotated = hadamard.hadamard_rotate_reference(x.t().contiguous(), 16, signs)
    _same_fp4(got, fp4.quantize_fp4_reference(rotated.to(DEVICE), "nvfp4"), "rotated x^T")
    plain = fp4.quantize_fp4_t(x.to(DEVICE), "nvfp4")
    assert plain.shape == got.shape == (48, 64)
    codes = {name: fp4.unpack(t.q)[5, 16:32].cpu() & 7 for name, t in (("plain", plain), ("rotated", got))}
    assert int((codes["plain"] != 0).sum()) == 1, "unrotated, the outlier's 15 neighbours round to 0"
    assert bool((codes["rotated"] != 0).all()), "rotated, all 16 tokens of its block share its size"


def test_quantize_t_refuses_bad_input_by_name():
    x = torch.zeros(32, 16, device=DEVICE)
    cases = [
        (lambda: fp4.quantize_fp4_t(x[0], "nvfp4"), ValueError, "2-D"),
        (lambda: fp4.quantize_fp4_t(x.long(), "nvfp4"), TypeError, "bfloat16"),
        (lambda: fp4.quantize_fp4_t(x[:24], "nvfp4"), ValueError, "multiple of 16"),
        (lambda: fp4.quantize_fp4_t(x[:16], "mxfp4"), ValueError, "multiple of 32"),
        (lambda: fp4.quantize_fp4_t(x, "nvfp4", torch.ones(8, device=DEVICE)), ValueError, "signs"),
        (lambda: fp4.quantize_fp4_t(x, "nvfp4", torch.full((16,), 2.0, device=DEVICE)), ValueError, "signs"),
        (lambda: fp4.quantize_fp4_t(x, "fp4"), ValueError, "fmt"),
        (lambda: fp4.quantize_fp4_t(x, "nvfp4", stochastic_rounding=True, seed=-1), ValueError, "seed"),
    ]
    for call, error, word in cases:
        with pytest.raises(error, match=word):
            call()
    empty = fp4.quantize_fp4_t(torch.zeros(0, 16, device=DEVICE), "nvfp4")
    assert empty.q.shape == (16, 0) and empty.tensor_scale.item() == fp4.tensor_scale_reference(torch.zeros(())).item()


# -- dequantization -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize_matches_reference(fmt, out_dtype):
    for case, x in _cases((33, 96), torch.bfloat16, seed=2).items():
        t = fp4.quantize_fp4(x, fmt)
        got, want = fp4.dequantize_fp4(t, out_dtype).cpu(), fp4.dequantize_fp4_reference(t, out_dtype).cpu()
        assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{fmt} {case}: NaN positions differ"
        assert_bits_equal(got.nan_to_num(0.0), want.nan_to_num(0.0), name=f"{fmt} {out_dtype} {case}")


def test_bits_per_element():
    assert fp4.bits_per_element("mxfp4") == 4.25
    assert fp4.bits_per_element("nvfp4", (8192, 8192)) == 4.5 + 32 / 8192**2


@pytest.mark.parametrize("fast", [False, True])
def test_decoders_give_every_e2m1_value(fast):
    out = torch.empty(16, dtype=torch.bfloat16, device=DEVICE)
    fp4._decode_probe_kernel[(1,)](out, FAST=fast)
    assert torch.equal(out.cpu().float(), fp4.e2m1_decode(torch.arange(16)))
    if kernels.INTERPRETER:  # on a GPU, whether bf16 subnormals survive is the hardware's answer
        assert fp4.fast_decode_ok(DEVICE) is True


@pytest.mark.parametrize("low, high, bound", [(7e-41, 1.2e-39, 1 / 3), (1.2e-39, 1e-30, 1 / 16)])
def test_nvfp4_of_a_tiny_tensor_comes_back(low, high, bound):
    """Below amax 3.2e-35 the tensor scale sits at its floor 2^-126, and below 7e-38 the product S of
    block and tensor scale is an fp32 subnormal, whose reciprocal overflows: the elements must still
    come back, within E4M3's rounding of the block scale (1/16 for a normal one, less precise for
    E4M3's subnormals below 1.2e-39); below 6.9e-41 the block scale itself rounds to zero."""
    values = np.geomspace(low, high, 48)
    x = torch.tensor(values, dtype=torch.float32, device=DEVICE)[:, None].repeat(1, 16)
    x[::2] *= -1
    for row in x:  # one tensor per value: each its own tensor scale
        t = fp4.quantize_nvfp4(row[None])
        r = fp4.quantize_fp4_reference(row[None], "nvfp4")
        assert torch.equal(t.q, r.q) and torch.equal(t.s.view(torch.uint8), r.s.view(torch.uint8))
        y = fp4.dequantize_fp4(t)
        rel = ((y - row) / row).abs().max().item()
        assert rel <= bound, (row[0].item(), y[0, 0].item())
