"""Every launch configuration of every autotuned GEMM meets its kernel's contract, on a GPU.

The other GEMM tests run one configuration (``tests/_tuning.py`` says why); here each configuration of
``kernels.fp8_gemm.CONFIGS`` (the grouped kernel), ``PERSISTENT_CONFIGS`` (the persistent kernel, with and
without the split epilogue store) and ``kernels.int8.W8A8_CONFIGS`` runs alone, with every scaling and the
whole epilogue (bias, activation, a 16-bit output), on shapes where every tile size leaves ragged edges in
M, N and K and where the persistent kernel's programs take more than one tile each.  A configuration that
the compiler refuses for lack of shared memory or registers is one that autotuning skips: that is checked
too, not assumed.  In CPU mode the kernels run one interpreter configuration, so there is nothing to run.
"""

import pytest
import torch
from _tuning import TUNED, one_config, smallest
from triton.runtime.errors import OutOfResources

import kernels
from kernels import fp8_gemm as G
from kernels import int8 as I
from kernels import quantize as Q
from kernels.device import default_device

DEVICE = default_device()
pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="CPU mode runs one interpreter configuration, never tunes")

QUANTIZERS = {
    "tensor": (Q.quantize_tensor, Q.quantize_tensor),
    "row": (Q.quantize_rowwise, Q.quantize_rowwise),
    "block": (Q.quantize_1x128, Q.quantize_128x128),
}
# 2100 rows and columns: 17 x 9 tiles of 128 x 256 (more than the 132 SMs of an H100 or H200, so the
# persistent kernel's programs loop), ragged in every tile size; K = 400 is three 128-blocks and a rest,
# and 16-byte aligned rows (TMA).
SHAPE = (2100, 2104, 400)


def _label(config) -> str:
    kw = config.kwargs
    sub = "-subtiled" if kw.get("EPILOGUE_SUBTILE") else ""
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}-s{config.num_stages}-w{config.num_warps}{sub}"


def _run_or_refused(name, config, fn):
    """``fn()`` under ``config`` alone, or None where the compiler refuses the configuration for lack of
    resources (autotuning skips such a configuration); the smallest tile, which the other tests run, must
    never be refused."""
    least = smallest(TUNED[name][0].configs)  # the whole list: within one_config it is this config alone
    with one_config({name: config}):
        try:
            return fn()
        except OutOfResources as exc:
            assert config is not least, f"the smallest tile was refused: {exc}"
            print(f"{name} {_label(config)}: refused by the compiler ({exc}); autotuning skips it")
            return None


FP8_CASES = [("fp8 grouped", "grouped", c) for c in G.CONFIGS] + [
    ("fp8 persistent", "persistent", c) for c in G.PERSISTENT_CONFIGS
]


@pytest.mark.parametrize("scaling", list(G.SCALINGS))
@pytest.mark.parametrize("name,kernel,config", FP8_CASES, ids=[f"{k}-{_label(c)}" for _, k, c in FP8_CASES])
def test_every_fp8_configuration_meets_the_contract(name, kernel, config, scaling):
    m, n, k = SHAPE
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g).to(DEVICE)
    qa, qb = (f(t.to(DEVICE), "e4m3") for f, t in zip(QUANTIZERS[scaling], (x, w), strict=True))
    assert kernel == "grouped" or G.tma_ok(qa.q, qb.q, torch.empty(m, n, dtype=torch.float16, device=DEVICE))
    got = _run_or_refused(
        name, config,
        lambda: G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, scaling, torch.float16, kernel, bias=bias, activation="silu"),
    )  # fmt: skip
    if got is None:
        return
    ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, scaling, torch.float16, bias, "silu")
    mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, scaling) + bias.double().abs()[None, :]
    ok, msg = G.gemm_tolerance_report(got, ref, mag, torch.float16)
    print(f"[{kernel} {_label(config)} {scaling}] {msg}")
    assert ok, f"{kernel} {_label(config)} {scaling}: {msg}"


@pytest.mark.parametrize("config", I.W8A8_CONFIGS, ids=_label)
def test_every_w8a8_configuration_is_exact(config):
    m, n, k = SHAPE
    g = torch.Generator().manual_seed(12)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g).to(DEVICE)
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g).to(DEVICE)
    sa = (torch.rand(m, 1, generator=g) * 1e-2 + 1e-3).to(DEVICE)
    sb = (torch.rand(n, 1, generator=g) * 1e-2 + 1e-3).to(DEVICE)
    bias = torch.randn(n, generator=g).to(DEVICE)
    got = _run_or_refused("int8 w8a8", config, lambda: I.w8a8_matmul(a, b, sa, sb, bias, torch.bfloat16))
    if got is None:
        return
    want = I.w8a8_matmul_reference(a, b, sa, sb, bias, torch.bfloat16)
    mismatches = int((got.view(torch.int16) != want.view(torch.int16)).sum())
    assert mismatches == 0, f"{_label(config)}: {mismatches} outputs differ from the exact reference's bits"


def test_the_pinned_configuration_is_the_one_that_runs():
    """``one_config`` really narrows the tuner to one configuration, and gives the list back after."""
    tuner = TUNED["fp8 grouped"][0]
    before = list(tuner.configs)
    pinned = smallest(before)
    with one_config():
        assert tuner.configs == [pinned]
        qa, qb = (Q.quantize_rowwise(torch.randn(70, 256, device=DEVICE), "e4m3") for _ in range(2))
        G.fp8_gemm(qa.q, qb.q, qa.s, qb.s, "row", kernel="grouped")
        assert tuner.best_config is pinned
    assert tuner.configs == before and not kernels.INTERPRETER
