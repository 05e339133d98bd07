"""kernels.w4a16 and kernels.w4a16_mma: the tl.dot W4A16 GEMM in each of its variants, the Gluon kernel
(on an sm_90 GPU, and compiled for sm_90 on any machine, its K loop checked in the SASS) and
tl.dot_scaled, each against dequantize-then-matmul in float64."""

from pathlib import Path

import pytest
import torch

import kernels
from kernels import fp4, w4a16, w4a16_mma
from kernels.device import default_device
from kernels.testing import compare

DEVICE = default_device()


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
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
    wq = fp4.quantize_fp4(w, fmt)
    got = w4a16.w4a16_matmul(a, wq, config=config, fast=fast)
    want = w4a16.w4a16_matmul_reference(a, wq)
    # bf16 output: one rounding (2^-8) of an fp32 sum; absolute part scaled by the output's magnitude
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 {fmt}")
    print(c.report.splitlines()[0])
    assert c.ok, c.report
    # MXFP4 weights dequantize exactly to bf16: the same product as dequantize-then-matmul in float64
    if fmt == "mxfp4":
        wd = fp4.dequantize_fp4(wq, torch.bfloat16)
        assert torch.equal(wd.float(), fp4.dequantize_fp4_reference(wq).cpu().to(DEVICE)), "not exact in bf16"


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("m", [127, 128])
def test_w4a16_server_batches_and_odd_tiles(fmt, m):
    # The largest batches the kernel serves, an odd one among them, with N not a multiple of any tile
    # (200) and K not a multiple of the CPU tile's 64 (160): every tail masked.
    g = torch.Generator().manual_seed(m)
    w = torch.randn(200, 160, generator=g).to(DEVICE)
    a = torch.randn(m, 160, generator=g).to(torch.bfloat16).to(DEVICE)
    wq = fp4.quantize_fp4(w, fmt)
    got = w4a16.w4a16_matmul(a, wq)
    want = w4a16.w4a16_matmul_reference(a, wq)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 {fmt}, M = {m}")
    print(c.report.splitlines()[0])
    assert c.ok, c.report


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("m", [1, 7, 31, 64, 65, 97])
@pytest.mark.parametrize("kernel", [None, "dot", "dequant"])
def test_every_path_at_any_batch_size(fmt, m, kernel):
    # M from 1 to past the dispatch point, odd sizes included, N = 72 (no multiple of 128 or 64) and
    # K = 96 (no multiple of 64): the default, the tl.dot kernel forced past its crossover, and
    # dequantize-then-matmul forced below it, each against dequantize-then-matmul in float64.
    g = torch.Generator().manual_seed(100 + m)
    w = _awkward_weight(72, 96, g)
    a = torch.randn(m, 96, generator=g).to(torch.bfloat16).to(DEVICE)
    wq = fp4.quantize_fp4(w.to(DEVICE), fmt)
    got = w4a16.w4a16_matmul(a, wq, kernel=kernel)
    want = w4a16.w4a16_matmul_reference(a, wq)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"{kernel} {fmt} M = {m}")
    assert c.ok, c.report


def test_the_default_path_follows_the_batch_size():
    n, k = 256, 1024
    for m, mma_fits in ((1, True), (16, True), (17, False), (64, False), (65, False), (128, False)):
        a = torch.zeros(m, k, dtype=torch.bfloat16, device=DEVICE)
        want = "dequant" if m > w4a16.DEQUANT_ABOVE_M else ("mma" if mma_fits and not kernels.INTERPRETER else "dot")
        assert w4a16.path(a, n, k) == want, (m, w4a16.path(a, n, k))
    # leading dimensions count as rows: 3 x 40 activations are 120 rows
    assert w4a16.path(torch.zeros(3, 40, k, dtype=torch.bfloat16, device=DEVICE), n, k) == "dequant"
    w = fp4.quantize_nvfp4(torch.randn(n, k, device=DEVICE))
    a = torch.randn(96, k, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="kernel='dequant' takes neither"):
        w4a16.w4a16_matmul(a, w, kernel="dequant", config=(32, 64, False, 4, 1))
    # the default past the crossover is dequantize-then-matmul itself, bit for bit
    assert torch.equal(w4a16.w4a16_matmul(a, w), w4a16.w4a16_matmul(a, w, kernel="dequant"))


@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("m", [3, 16, 33, 100])
def test_w4a16_nan_and_inf_in_activations_propagate(fmt, m):
    # A NaN activation makes its whole output row NaN; an infinite one makes the row +-inf where the
    # weights it meets are nonzero and NaN where a weight is zero (inf * 0), as dequantize-then-matmul does.
    g = torch.Generator().manual_seed(7 + m)
    w = torch.randn(48, 128, generator=g)
    w[5, :] = 0.0  # an all-zero output channel: inf * 0 = NaN in it
    wq = fp4.quantize_fp4(w.to(DEVICE), fmt)
    a = torch.randn(m, 128, generator=g)
    a[0, 3] = float("nan")
    a[m - 1, 10] = float("inf")  # the rows between stay finite
    a = a.to(torch.bfloat16).to(DEVICE)
    got = w4a16.w4a16_matmul(a, wq).float().cpu()
    want = w4a16.w4a16_matmul_reference(a, wq).float().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN in different places than dequantize-then-matmul"
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "inf in different places than dequantize-then-matmul"
    assert torch.isnan(got[0]).all(), "a NaN activation must poison its whole row"
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)]), "an infinity with the wrong sign"
    finite = torch.isfinite(want)
    c = compare(got[finite], want[finite], atol=2e-2 * want[finite].abs().max().item(), rtol=1e-2, name="finite part")
    assert c.ok, c.report


def test_w4a16_leading_dims_and_errors():
    w = fp4.quantize_mxfp4(torch.randn(32, 64, device=DEVICE))
    a = torch.randn(2, 3, 64, device=DEVICE).to(torch.bfloat16)
    assert w4a16.w4a16_matmul(a, w).shape == (2, 3, 32)
    with pytest.raises(TypeError, match="a must be a bfloat16"):
        w4a16.w4a16_matmul(a.float(), w)
    with pytest.raises(ValueError, match="K = 64"):
        w4a16.w4a16_matmul(a[..., :32], w)
    with pytest.raises(ValueError, match="config must be"):
        w4a16.w4a16_matmul(a, w, config=(32, 48, False, 4, 1))


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
@pytest.mark.parametrize("fmt", list(fp4.FORMATS))
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(40, 1024), (24, 1536), (96, 3072)])  # 1536: an odd number of K steps
def test_w4a16_mma_matches_dequantize_then_matmul(fmt, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    wq = fp4.quantize_fp4(_awkward_weight(n, k, g).to(DEVICE), fmt)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(DEVICE)
    if not w4a16_mma.supported(a, n, k):
        pytest.skip(f"not an sm_90 GPU: {torch.cuda.get_device_name()}")
    got = w4a16.w4a16_matmul(a, wq, kernel="mma")
    want = w4a16.w4a16_matmul_reference(a, wq)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 mma {fmt}")
    assert c.ok, c.report
    assert torch.equal(w4a16.w4a16_matmul(a, wq), got), "the default is the mma kernel here"
    # a NaN block scale (a non-finite input) reaches the outputs that use it, not the others
    bad = fp4.quantize_fp4(
        _awkward_weight(n, k, g)
        .to(DEVICE)
        .index_put_((torch.tensor([7]), torch.tensor([3])), torch.tensor(float("nan"), device=DEVICE)),
        fmt,
    )
    out = w4a16.w4a16_matmul(a, bad, kernel="mma").float()
    assert out[:, 7].isnan().all() and not out[:, :7].isnan().any()


def test_w4a16_kernel_argument():
    w = fp4.quantize_nvfp4(torch.randn(32, 1024, device=DEVICE))
    a = torch.randn(1, 1024, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="kernel must be"):
        w4a16.w4a16_matmul(a, w, kernel="fast")
    with pytest.raises(ValueError, match="takes neither"):
        w4a16.w4a16_matmul(a, w, kernel="mma", fast=True)
    if kernels.INTERPRETER:
        with pytest.raises(ValueError, match="kernel='mma' needs an sm_90 GPU"):
            w4a16.w4a16_matmul(a, w, kernel="mma")
    with pytest.raises(ValueError, match="K a multiple of 512"):
        w4a16.w4a16_matmul(a[:, :256], fp4.quantize_nvfp4(torch.randn(32, 256, device=DEVICE)), kernel="mma")
    want = w4a16.w4a16_matmul_reference(a, w)
    got = w4a16.w4a16_matmul(a, w, kernel="dot")
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
    path = Path(w4a16_mma.__file__)
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
    w = fp4.quantize_mxfp4(torch.randn(40, 128, generator=g).to(DEVICE))
    a = torch.randn(5, 128, generator=g).to(torch.bfloat16).to(DEVICE)
    got = w4a16.w4a16_dot_scaled(a, w)
    want = w4a16.w4a16_matmul_reference(a, w)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name="dot_scaled")
    assert c.ok, c.report
    with pytest.raises(ValueError, match="MXFP4"):
        w4a16.w4a16_dot_scaled(a, fp4.quantize_nvfp4(torch.randn(40, 128, device=DEVICE)))


def test_the_tuning_set_follows_the_row_block():
    decode = w4a16.configs_for_rows([], {}, BLOCK_M=16)
    assert [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in decode] == [(c[0], c[1]) for c in w4a16.W4A16_CONFIGS]
    both = w4a16.W4A16_CONFIGS + w4a16.W4A16_BATCH_CONFIGS
    for block_m in (32, 64):
        for k, want in ((4096, both), (768, [c for c in both if c[1] <= 256])):  # 768: no 512-wide K step
            batch = w4a16.configs_for_rows([], {"K": k}, BLOCK_M=block_m)
            got = [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["GATHER"], c.num_warps, c.num_stages)
                   for c in batch]  # fmt: skip
            assert got == want, (block_m, k)
    # every tile of either set splits into whole scale blocks of both formats, and the two sets differ
    for bn, bk, _, _, _ in w4a16.W4A16_CONFIGS + w4a16.W4A16_BATCH_CONFIGS:
        assert bn >= 16 and bk % 32 == 0
    assert set(w4a16.W4A16_CONFIGS).isdisjoint(w4a16.W4A16_BATCH_CONFIGS)


@pytest.mark.parametrize(
    "config,fmt",
    [(cfg, list(fp4.FORMATS)[i % 2]) for i, cfg in enumerate([None, *w4a16.W4A16_BATCH_CONFIGS])],
    ids=str,
)
def test_each_batch_config_matches_dequantize_then_matmul(config, fmt):
    # 40 rows (a 64-row block), N off every tile, K a multiple of 256 but not of 512: on a GPU the
    # default (None) takes the batch set's tuned path; the formats alternate over the launches
    g = torch.Generator().manual_seed(7)
    w = torch.randn(72, 256, generator=g).to(DEVICE)
    a = torch.randn(40, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    wq = fp4.quantize_fp4(w, fmt)
    want = w4a16.w4a16_matmul_reference(a, wq)
    got = w4a16.w4a16_matmul(a, wq, config=config)
    c = compare(got, want, atol=2e-2 * want.float().abs().max().item(), rtol=1e-2, name=f"w4a16 {fmt} {config}")
    assert c.ok, c.report
