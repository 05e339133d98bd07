"""kernels.fp4: E2M1 rounding against ml_dtypes, the nibble order against torch's float4_e2m1fn_x2
packing, every kernel bit for bit against its plain-torch reference where the operation is exact (codes,
scales, dequantization), the W4A16 GEMM and the Hadamard rotation against float64 references."""

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
from kernels import formats, stochastic
from kernels import fp4 as F
from kernels.device import default_device
from kernels.quantize import e8m0_to_float
from kernels.testing import assert_bits_equal, compare, special_inputs

DEVICE = default_device()


def _cases(shape, dtype, seed=0):
    return special_inputs(shape, dtype, seed, DEVICE)


def _same_fp4(got: F.FP4Tensor, want: F.FP4Tensor, name: str):
    assert_bits_equal(got.q.cpu(), want.q.cpu(), name=f"{name} codes")
    assert_bits_equal(got.s.view(torch.uint8).cpu(), want.s.view(torch.uint8).cpu(), name=f"{name} scales")
    if want.tensor_scale is not None:
        assert_bits_equal(got.tensor_scale.cpu(), want.tensor_scale.cpu(), name=f"{name} tensor scale")


# -- E2M1 and packing ---------------------------------------------------------------------------------


def test_e2m1_values_are_the_formats_decoder():
    codes = torch.arange(16)
    assert F.e2m1_decode(codes).tolist()[:8] == list(F.E2M1_VALUES)
    assert_bits_equal(F.e2m1_decode(codes), formats.decode(codes, "e2m1"), name="e2m1 decode")


def test_rne_against_ml_dtypes_at_every_tie_and_neighbour():
    grid = torch.tensor(F.E2M1_VALUES, dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    pts = torch.cat([grid, mids, torch.tensor([6.5, 7.0, 100.0, 1e30])]).float()
    near = torch.cat([pts, torch.nextafter(pts, torch.tensor(0.0)), torch.nextafter(pts, torch.tensor(1e38))])
    mag = near.abs()
    want = mag.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).astype(np.int32)
    got = F.e2m1_rne_reference(mag).numpy()
    assert np.array_equal(got, want), f"ties or saturation differ from ml_dtypes at {mag[got != want].tolist()}"


@triton.jit
def _code_probe_kernel(v_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs, mask=offs < n, other=0.0)
    tl.store(c_ptr + offs, F._e2m1_code(v), mask=offs < n)


def test_kernel_rounding_is_the_boundary_count():
    """The kernels round with one fp32 addition (:func:`kernels.fp4._e2m1_code`); the reference counts
    boundaries.  Every tie, its fp32 neighbours, grid points, saturation, signs and a sweep of [0, 8]."""
    grid = torch.tensor(F.E2M1_VALUES, dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    pts = torch.cat([grid, mids, torch.tensor([6.5, 7.0, 7.99, 8.0, 100.0, 1e30, 1e-30, 1e-40])]).float()
    pts = torch.cat([pts, torch.nextafter(pts, torch.tensor(0.0)), torch.nextafter(pts, torch.tensor(1e38))])
    sweep = torch.rand(20000, generator=torch.Generator().manual_seed(0)) * 8
    v = torch.cat([pts, -pts, sweep, -sweep])
    out = torch.empty(v.shape, dtype=torch.int32, device=DEVICE)
    _code_probe_kernel[(triton.cdiv(v.numel(), 1024),)](v.to(DEVICE), out, v.numel(), BLOCK=1024)
    want = F.e2m1_rne_reference(v.abs().clamp(max=F.E2M1_MAX))
    assert_bits_equal(out.cpu(), want, name="E2M1 codes: one addition vs counting boundaries")


def test_quantize_tiling_and_input_paths():
    """Several tiles per program with a ragged last one, row counts that do not fill a tile, and bf16 read
    as int32 pairs vs element by element (a view at an odd offset): the same bits as the reference."""
    for fmt, bs in F.FORMATS.items():
        for shape in [(3, bs * 41), (5, bs * 19), (1, bs * 70), (4, 512)]:
            for case, x in special_inputs(shape, torch.bfloat16, 4, DEVICE).items():
                if case in ("random", "one outlier", "nan/inf"):
                    _same_fp4(F.quantize_fp4(x, fmt), F.quantize_fp4_reference(x, fmt), f"{fmt} {shape} {case}")
        # (4, 512) is whole tiles only: the unmasked path
        rows, g, tiles = F._quantize_launch(4, 512, bs, False)
        assert 4 % rows == 0 and (512 // bs) % (g * tiles) == 0 and tiles > 1
        base = torch.randn(4 * bs * 9 + 1, generator=torch.Generator().manual_seed(5)).to(DEVICE, torch.bfloat16)
        odd = base[1:].reshape(4, bs * 9)  # contiguous, but starts 2 bytes into the storage
        assert odd.data_ptr() % 4 == 2
        _same_fp4(F.quantize_fp4(odd, fmt), F.quantize_fp4(odd.clone(), fmt), f"{fmt} odd offset vs aligned")
        _same_fp4(F.quantize_fp4(odd, fmt), F.quantize_fp4_reference(odd, fmt), f"{fmt} odd offset")


def test_pack_order_is_torchs_float4_e2m1fn_x2():
    codes = torch.tensor([[2, 1, 7, 15]])  # 1.0, 0.5, 6.0, -6.0
    packed = F.pack(codes)
    assert packed.tolist() == [[0x12, 0xF7]], "element 2i in the low nibble, 2i+1 in the high nibble"
    assert torch.equal(F.unpack(packed), codes.to(torch.uint8))
    view = packed.view(torch.float4_e2m1fn_x2)  # torch's packed FP4 dtype: one byte holds two elements
    assert view.shape == (1, 2) and view.element_size() == 1
    assert torch.equal(F.unpack(view), codes.to(torch.uint8))


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
    assert torch.equal(F.pack(codes), _torch_pack_uint4()(codes))


def test_pack_rejects_bad_codes():
    with pytest.raises(ValueError, match="even last dimension"):
        F.pack(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        F.pack(torch.tensor([3, 16]))
    with pytest.raises(TypeError, match="integer tensor"):
        F.pack(torch.zeros(2))


# -- quantizers: kernel == reference, bit for bit ------------------------------------------------------

SHAPES = {"nvfp4": [(1, 16), (7, 48), (40, 288), (2, 3, 32)], "mxfp4": [(1, 32), (7, 64), (40, 288), (2, 3, 32)]}


@pytest.mark.parametrize("fmt", list(F.FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_quantize_matches_reference(fmt, dtype):
    shapes = SHAPES[fmt] if dtype == torch.bfloat16 else SHAPES[fmt][1:3]  # the interpreter is slow
    for shape in shapes:
        for case, x in _cases(shape, dtype).items():
            name = f"{fmt} {dtype} {shape} {case}"
            _same_fp4(F.quantize_fp4(x, fmt), F.quantize_fp4_reference(x, fmt), name)


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
            _same_fp4(F.quantize_fp4(x, fmt, **kw), F.quantize_fp4_reference(x, fmt, **kw), f"{fmt} {kw} {case}")


@pytest.mark.parametrize("fmt", list(F.FORMATS))
def test_codes_are_ml_dtypes_rounding_of_the_scaled_values(fmt):
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(3)) * 5
    t = F.quantize_fp4(x.to(DEVICE), fmt)
    bs = F.FORMATS[fmt]
    if fmt == "mxfp4":
        s = e8m0_to_float(t.s.cpu())
    else:
        s = t.s.cpu().float() * t.tensor_scale.cpu()
    inv = 1.0 / s  # the quantizer's per-block reciprocal, correctly rounded
    scaled = x.reshape(16, -1, bs) * inv[..., None]
    want = scaled.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(16, 64)
    assert np.array_equal(F.unpack(t.q.cpu()).numpy(), want)


def test_scale_rules():
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-5.0, 5.0, 32)  # amax 5: e = floor(log2 5) - 2 = 0, byte 127
    x[0, 32:] = 0.0  # all-zero block: S = 1
    x[1, :32] = 1000.0  # e = 9 - 2 = 7: byte 134, 1000 / 128 = 7.8 saturates to 6
    x[1, 32:] = 0.1  # e = -4 - 2 = -6: byte 121
    mx = F.quantize_mxfp4(x.to(DEVICE))
    assert mx.s.cpu().tolist() == [[127, 127], [134, 121]]
    assert F.unpack(mx.q.cpu())[1, 0].item() == 7, "1000 / 2^7 = 7.8 must saturate to 6 (code 7)"
    nv = F.quantize_nvfp4(x.to(DEVICE))
    assert nv.tensor_scale.item() == np.float32(1000.0) / np.float32(2688.0)
    blocks = nv.s.cpu().float()
    assert blocks[1, 0].item() == 448.0, "the block holding the tensor's amax uses E4M3's top value"
    assert blocks[0, 2].item() == 0.0 and F.unpack(nv.q.cpu())[0, 32:48].eq(0).all()
    # the whole tensor is reconstructed within half an E2M1 step of each block's scale
    deq = F.dequantize_fp4(nv).cpu()
    assert (deq - x).abs().max() <= 1000.0 / 6 * 0.5 * 2


def test_nonfinite_poisons_its_block_only():
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    for fmt, bs in F.FORMATS.items():
        y = F.dequantize_fp4(F.quantize_fp4(x.to(DEVICE), fmt)).cpu()
        nan = torch.isnan(y)
        want = torch.zeros_like(nan)
        want[0, :bs] = True
        want[1, 40 // bs * bs : 40 // bs * bs + bs] = True
        assert torch.equal(nan, want), f"{fmt}: NaN must cover exactly the blocks that held NaN/inf"


def test_stochastic_rounding_is_unbiased():
    x = torch.linspace(-5.9, 5.9, 64).reshape(1, 64)  # amax 5.9: e = floor(log2 5.9) - 2 = 0, S = 1
    samples = []
    for seed in range(48):
        t = F.quantize_fp4_reference(x, "mxfp4", stochastic_rounding=True, seed=seed)
        samples.append(F.dequantize_fp4_reference(t))
    s = torch.stack(samples)  # (48, 1, 64)
    lo, hi = _neighbours(x)
    sd = torch.sqrt((x - lo) * (hi - x)).clamp(min=1e-6) / math.sqrt(s.shape[0])
    z = ((s.mean(0) - x) / sd).abs()
    assert z.max() < 5, f"stochastic rounding looks biased: max |z| = {z.max():.2f}"
    assert set(torch.unique(s).tolist()) <= {v * sg for v in F.E2M1_VALUES for sg in (1, -1)}
    # the rounding is to a neighbour, never further
    assert ((s >= lo - 1e-6) & (s <= hi + 1e-6)).all()


def _neighbours(x):
    grid = torch.tensor(sorted({v * s for v in F.E2M1_VALUES for s in (1, -1)}))
    idx = torch.searchsorted(grid, x.contiguous(), right=True).clamp(1, len(grid) - 1)
    lo = grid[idx - 1]
    hi = torch.where(grid[idx - 1] == x, x, grid[idx])
    return lo, hi


def test_stochastic_bits_are_philox_words():
    x = torch.randn(2, 32)
    r = stochastic.random_bits(64, 5, device=DEVICE).reshape(2, 1, 32)
    t = F.quantize_fp4_reference(x, "mxfp4", stochastic_rounding=True, seed=5)
    inv = 2.0 ** -(t.s.to(torch.int32) - 127).float()
    mag = (x.reshape(2, 1, 32) * inv[..., None]).abs().clamp(max=6)
    want = F.e2m1_stochastic_reference(mag, r).reshape(2, 32)
    assert torch.equal(F.unpack(t.q).to(torch.int32) & 7, want)


def test_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        F.quantize_nvfp4(torch.zeros(2, 24, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        F.quantize_mxfp4(torch.zeros(2, 32, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="fmt must be one of"):
        F.quantize_fp4(torch.zeros(2, 32, device=DEVICE), "nvfp8")
    with pytest.raises(ValueError, match="block_2d"):
        F.quantize_fp4_reference(torch.zeros(2, 32), "mxfp4", block_2d=True)
    with pytest.raises(ValueError, match="seed"):
        F.quantize_mxfp4(torch.zeros(2, 32, device=DEVICE), stochastic_rounding=True, seed=-1)
    with pytest.raises(TypeError, match="FP4Tensor"):
        F.dequantize_fp4(torch.zeros(2, 16, dtype=torch.uint8))


# -- dequantization -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(F.FORMATS))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize_matches_reference(fmt, out_dtype):
    for case, x in _cases((33, 96), torch.bfloat16, seed=2).items():
        t = F.quantize_fp4(x, fmt)
        got, want = F.dequantize_fp4(t, out_dtype).cpu(), F.dequantize_fp4_reference(t, out_dtype).cpu()
        assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{fmt} {case}: NaN positions differ"
        assert_bits_equal(got.nan_to_num(0.0), want.nan_to_num(0.0), name=f"{fmt} {out_dtype} {case}")


def test_bits_per_element():
    assert F.bits_per_element("mxfp4") == 4.25
    assert F.bits_per_element("nvfp4", (8192, 8192)) == 4.5 + 32 / 8192**2


# -- W4A16 GEMM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(F.FORMATS))
@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (16, 96, 64), (5, 33, 320), (70, 32, 96)])
@pytest.mark.parametrize(
    "config,fast",
    [(None, None), ((16, 64, True, 4, 2), True), ((32, 128, False, 4, 2), False)],
    ids=["join-fast", "gather-fast", "join-select"],
)
def test_w4a16_matches_dequantize_then_matmul(fmt, m, n, k, config, fast):
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEVICE)
    wq = F.quantize_fp4(w, fmt)
    got = F.w4a16_matmul(a, wq, config=config, fast=fast)
    want = F.w4a16_matmul_reference(a, wq)
    # bf16 output: one rounding (2^-8) of an fp32 sum; absolute part scaled by the output's magnitude
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 {fmt}")
    print(c.report.splitlines()[0])
    assert c.ok, c.report
    # MXFP4 weights dequantize exactly to bf16: the same product as dequantize-then-matmul in float64
    if fmt == "mxfp4":
        wd = F.dequantize_fp4(wq, torch.bfloat16)
        assert torch.equal(wd.float(), F.dequantize_fp4_reference(wq).cpu().to(DEVICE)), "not exact in bf16"


@pytest.mark.parametrize("fast", [False, True])
def test_decoders_give_every_e2m1_value(fast):
    out = torch.empty(16, dtype=torch.bfloat16, device=DEVICE)
    F._decode_probe_kernel[(1,)](out, FAST=fast)
    assert torch.equal(out.cpu().float(), F.e2m1_decode(torch.arange(16)))
    if kernels.INTERPRETER:  # on a GPU, whether bf16 subnormals survive is the hardware's answer
        assert F.fast_decode_ok(DEVICE) is True


def test_w4a16_leading_dims_and_errors():
    w = F.quantize_mxfp4(torch.randn(32, 64, device=DEVICE))
    a = torch.randn(2, 3, 64, device=DEVICE).to(torch.bfloat16)
    assert F.w4a16_matmul(a, w).shape == (2, 3, 32)
    with pytest.raises(TypeError, match="a must be a bfloat16"):
        F.w4a16_matmul(a.float(), w)
    with pytest.raises(ValueError, match="K = 64"):
        F.w4a16_matmul(a[..., :32], w)
    with pytest.raises(ValueError, match="config must be"):
        F.w4a16_matmul(a, w, config=(32, 48, False, 4, 1))


def _awkward_weight(n, k, g):
    """Gaussian rows plus the blocks a scale path can get wrong: huge (MXFP4 exponents above 128), tiny,
    all-zero, a lone outlier, and NVFP4 block scales that land on E4M3 subnormals."""
    w = torch.randn(n, k, generator=g)
    w[0, :64] *= 1e3
    w[1, 32:96] *= 1e-30
    w[2, :128] = 0
    w[3, 5] = 3e4
    w[4, 16:32] *= 1e-5
    return w


@pytest.mark.skipif(kernels.INTERPRETER, reason="the Gluon kernel needs an sm_90 GPU; CPU runs the compile test below")
@pytest.mark.parametrize("fmt", list(F.FORMATS))
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(40, 1024), (24, 1536), (96, 3072)])  # 1536: an odd number of K steps
def test_w4a16_mma_matches_dequantize_then_matmul(fmt, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    wq = F.quantize_fp4(_awkward_weight(n, k, g).to(DEVICE), fmt)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEVICE)
    if not F.w4a16_mma.supported(a, n, k):
        pytest.skip(f"not an sm_90 GPU: {torch.cuda.get_device_name()}")
    got = F.w4a16_matmul(a, wq, kernel="mma")
    want = F.w4a16_matmul_reference(a, wq)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 mma {fmt}")
    assert c.ok, c.report
    assert torch.equal(F.w4a16_matmul(a, wq), got), "the default is the mma kernel here"
    # a NaN block scale (a non-finite input) reaches the outputs that use it, not the others
    bad = F.quantize_fp4(
        _awkward_weight(n, k, g)
        .to(DEVICE)
        .index_put_((torch.tensor([7]), torch.tensor([3])), torch.tensor(float("nan"), device=DEVICE)),
        fmt,
    )
    out = F.w4a16_matmul(a, bad, kernel="mma").float()
    assert out[:, 7].isnan().all() and not out[:, :7].isnan().any()


def test_w4a16_kernel_argument():
    w = F.quantize_nvfp4(torch.randn(32, 1024, device=DEVICE))
    a = torch.randn(1, 1024, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="kernel must be"):
        F.w4a16_matmul(a, w, kernel="fast")
    with pytest.raises(ValueError, match="takes neither"):
        F.w4a16_matmul(a, w, kernel="mma", fast=True)
    if kernels.INTERPRETER:
        with pytest.raises(ValueError, match="kernel='mma' needs an sm_90 GPU"):
            F.w4a16_matmul(a, w, kernel="mma")
    with pytest.raises(ValueError, match="K a multiple of 512"):
        F.w4a16_matmul(a[:, :256], F.quantize_nvfp4(torch.randn(32, 256, device=DEVICE)), kernel="mma")
    want = F.w4a16_matmul_reference(a, w)
    got = F.w4a16_matmul(a, w, kernel="dot")
    assert compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name="dot").ok


_COMPILE_MMA = r"""
import importlib.util, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
spec = importlib.util.spec_from_file_location("w4a16_mma", sys.argv[1])
W = importlib.util.module_from_spec(spec)
spec.loader.exec_module(W)
sig = {name: "*bf16" for name in ("a_ptr", "c_ptr")}
sig.update(q_ptr="*u8", s_ptr="*u8", ts_ptr="*fp32")
sig.update({name: "i32" for name in ("M", "N", "stride_am", "stride_cm", "K8", "KW", "KW8", "KS", "KWS")})
names = ["a_ptr", "q_ptr", "s_ptr", "ts_ptr", "c_ptr", "M", "N", "stride_am", "stride_cm"]
names += ["K8", "KW", "KW8", "KS", "KWS"]
sig = {name: sig[name] for name in names}
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for nv, m in ((True, 1), (False, 16)):
    bn = W.block_n(m)
    ce = dict(NV=nv, BN=bn, WK=W.WK, WPL=W.WPL, MT=W.tokens_per_tile(m), PF=2)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if name not in ("M", "N")}
    src = GluonASTSource(W._w4a16_mma_kernel, {**sig, **{c: "constexpr" for c in ce}}, constexprs=ce, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": W.WK})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    code = [(int(a, 16), ins) for a, ins in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    branch = r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?BRA 0x([0-9a-f]+)"
    loops = [(int(t, 16), a) for a, _, t in re.findall(branch, sass)]
    start, end = [(t, int(a, 16)) for t, a in loops if t < int(a, 16)][0]  # the K loop: the backward branch
    body = [ins for a, ins in code if start <= a <= end]
    smem = sum(1 for ins in body if re.search(r"\b(STS|LDS|LDSM)\b", ins))
    print(bn, ce["MT"], W.WPL, "STACK:0" in res, "LOCAL:0" in res, sum("HMMA.16816.F32.BF16" in ins for ins in body),
          sum("LDG.E.128" in ins for ins in body), smem)
"""


def test_w4a16_mma_compiles_for_hopper_without_shared_memory_shuffles():
    """On any machine: the Gluon kernel compiles for sm_90 with the installed Triton, the decoded weights
    reach the tensor cores without a layout conversion (``assert_trivial``), nothing spills to local
    memory, the weights arrive in 16-byte loads, and the K loop has no shared-memory instruction at all
    (only the final sum of the warps' tiles uses it)."""
    import os
    import subprocess
    import sys

    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    path = Path(F.__file__).with_name("w4a16_mma.py")
    out = subprocess.run([sys.executable, "-c", _COMPILE_MMA, str(path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")[:2]
    for line in lines:
        bn, mt, wpl, no_stack, no_local, hmma, ldg128, smem = line.split()
        assert no_stack == "True" and no_local == "True", line
        # per loop trip, two K steps of (32 WPL / 16) k-slices x (BN / 16) weight-row tiles x (MT / 8) token
        # tiles of m16n8k16 each: at M <= 8 no tensor-core work goes to padding
        assert int(hmma) == 2 * (32 * int(wpl) // 16) * (int(bn) // 16) * (int(mt) // 8), line
        assert int(ldg128) >= 2 * int(bn) // 8, line  # each lane's words of its columns, 16 bytes at a time
        assert int(smem) == 0, line  # no shared memory in the K loop: the operands never leave registers


def test_dot_scaled_matches_dequantize_then_matmul():
    g = torch.Generator().manual_seed(9)
    w = F.quantize_mxfp4(torch.randn(40, 128, generator=g).to(DEVICE))
    a = torch.randn(5, 128, generator=g).to(torch.bfloat16).to(DEVICE)
    got = F.w4a16_dot_scaled(a, w)
    want = F.w4a16_matmul_reference(a, w)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name="dot_scaled")
    assert c.ok, c.report
    with pytest.raises(ValueError, match="MXFP4"):
        F.w4a16_dot_scaled(a, F.quantize_nvfp4(torch.randn(40, 128, device=DEVICE)))


# -- Hadamard rotation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block", F.HADAMARD_BLOCKS)
def test_hadamard_is_orthonormal(block):
    h = F.hadamard_matrix(block, dtype=torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(block, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError, match="power of two"):
        F.hadamard_matrix(block + 1)


@pytest.mark.parametrize("block", F.HADAMARD_BLOCKS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_hadamard_kernel_matches_reference_and_preserves_products(block, dtype):
    g = torch.Generator().manual_seed(block)
    a = torch.randn(9, 256, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(70, 256, generator=g).to(dtype).to(DEVICE)
    d = F.random_signs(block, seed=1, device=DEVICE)
    ra, rw = F.hadamard_rotate(a, block, d), F.hadamard_rotate(w, block, d)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8  # bf16 output: one rounding of the fp32 sum
    c = compare(ra, F.hadamard_rotate_reference(a, block, d), atol=tol, rtol=tol, name=f"rotate {block}")
    assert c.ok, c.report
    back = F.hadamard_rotate(ra, block, d, inverse=True)
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
        xq = F.fake_quantize(x.to(DEVICE), fmt, rotate_block=block).cpu()
        wq = F.fake_quantize(w.to(DEVICE), fmt, rotate_block=block).cpu()
        return ((xq @ wq.T - ref).pow(2).mean() / ref.pow(2).mean()).item()

    mx_plain, mx_rot, nv_plain = err("mxfp4", None), err("mxfp4", 32), err("nvfp4", None)
    print(f"relative MSE: mxfp4 {mx_plain:.4f}, mxfp4 rotated {mx_rot:.4f}, nvfp4 {nv_plain:.4f}")
    assert mx_rot < 0.9 * mx_plain
    assert nv_plain < mx_plain


def test_hadamard_errors():
    with pytest.raises(ValueError, match="block must be one of"):
        F.hadamard_rotate(torch.zeros(2, 64, device=DEVICE), 64)
    with pytest.raises(ValueError, match="multiple of block"):
        F.hadamard_rotate(torch.zeros(2, 40, device=DEVICE), 32)
    with pytest.raises(ValueError, match="only \\+1 and -1"):
        F.hadamard_rotate(torch.zeros(2, 32, device=DEVICE), 32, torch.full((32,), 0.5))


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
        t = F.quantize_nvfp4(row[None])
        r = F.quantize_fp4_reference(row[None], "nvfp4")
        assert torch.equal(t.q, r.q) and torch.equal(t.s.view(torch.uint8), r.s.view(torch.uint8))
        y = F.dequantize_fp4(t)
        rel = ((y - row) / row).abs().max().item()
        assert rel <= bound, (row[0].item(), y[0, 0].item())
