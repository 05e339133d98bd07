"""Checks for Lab 5, FP8 training: scaled FP8 GEMMs and an FP8 linear layer.

* q1 :func:`check_gemm_v1`: ``fn(a, b, a_scale, b_scale)`` -> bf16 ``(M, N)``, tensorwise scales.
* q2 :func:`check_grouped_order`: ``grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)``, a jit function,
  against the grouped launch order on grids with a short last group; and :func:`check_gemm_v2`: the
  pipelined, grouped-order kernel on shapes of many tiles with ragged edges (the GEMM contract of q1).
* q3 :func:`check_gemm_rowwise`: ``a_scale`` ``(M, 1)``, ``b_scale`` ``(N, 1)``.
* q4 :func:`check_gemm_blockwise`: ``a_scale`` ``(M, K/128)`` (1x128), ``b_scale`` ``(N/128, K/128)``
  (128x128), with fp32 promotion of every 128-K partial product.
* q5 :func:`check_fp8_linear`: ``fn(x, w)`` -> ``y = x @ w.T`` through FP8 (rowwise scales, E4M3
  forward, E5M2 gradients), differentiable; forward and both gradients within the stated tolerances of
  bf16.
* q6 :func:`check_fp8_swap`: ``fn(model)`` turns the right layers of a :class:`MarkovLM` into
  :class:`FP8Linear` (the blocks' GEMMs) and leaves the rest (input projection, output head) wide.

GEMM operands are ``(M, K)`` and ``(N, K)`` FP8 codes (both K-major) with reconstruction scales S
(``x ~= S * q``).  The truth is :func:`kernels.fp8_gemm.fp8_gemm_reference` (float64), and for q4 also
:func:`kernels.fp8_gemm.fp8_gemm_blockwise_reference` (the same promotion).  On a mismatch a check
compares the output with what known mistakes produce (scales divided instead of multiplied, one scale
missing, a block scale taken out of the K sum, whole tiles missing) and names the one that fits.  In
CPU mode every ``tl.dot`` is exact, so q4 runs one input under
:func:`kernels.fp8_gemm.emulate_hopper_fp8_accumulator` to see whether K-blocks are promoted; on a GPU
the tensor core itself shows it.

The checks take optional keyword arguments (shapes, seeds, grids, model sizes) with which the hidden
tests run them on operands and at sizes that only those tests state; the defaults are the public ones.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import fp8_gemm as G
from kernels import fp8_linear as L
from kernels import quantize as Q
from kernels.checks import call_student, constant_output, is_triton_function, student_side, type_name
from kernels.device import default_device
from kernels.testing import frobenius_error

CHECK_SHAPES = {
    "q1": ((64, 64, 256), (7, 40, 144)),
    "q2": ((200, 136, 384), (33, 70, 160)),
    "q3": ((96, 80, 256), (7, 40, 144)),
    "q4": ((96, 136, 384), (7, 40, 144)),
}


def _operands(m, n, k, scaling, seed):
    """Fixed data whose scales differ from row to row (and block to block): mistakes in how scales are
    applied show up instead of cancelling."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    x = x * torch.logspace(-1.5, 1.5, k)[None, :]  # K-blocks of different size: block scales differ along K
    w = torch.randn(n, k, generator=g) * 0.05 * torch.logspace(-1, 1, n)[:, None]
    x, w = x.to(default_device()), w.to(default_device())
    if scaling == "tensor":
        return Q.quantize_tensor(x), Q.quantize_tensor(w)
    if scaling == "row":
        return Q.quantize_rowwise(x), Q.quantize_rowwise(w)
    return Q.quantize_1x128(x), Q.quantize_128x128(w)


def _close(got, want, mag) -> bool:
    return G.gemm_tolerance_report(got, want, mag)[0]


def _near(got, cand) -> bool:
    """Within 2% (Frobenius) of a candidate: FP8 noise is far smaller than any mistake's effect."""
    return frobenius_error(got.double().cpu(), cand.double().cpu()) < 0.02


def _candidates(qa, qb, scaling) -> dict:
    """What known mistakes would output, as float64 (M, N)."""
    a, b = qa.q.double(), qb.q.double()
    m, k = a.shape
    n = b.shape[0]
    sa, sb = G.expanded_scales(qa.s, qb.s, scaling, m, n, k, torch.float64)
    out = {
        "scales divided instead of multiplied (1/S used where S belongs: x ~= S * q, so the epilogue "
        "multiplies by S)": ((a / sa) @ (b / sb).T),
        "no scales applied at all (the codes' product is not the answer: multiply by S_a and S_b)": a @ b.T,
        "only b's scale applied (a_scale is missing)": a @ (b * sb).T,
        "only a's scale applied (b_scale is missing)": (a * sa) @ b.T,
    }
    if scaling == "block":
        s_first = (qa.s[:, :1].double()) * (qb.s[:, :1].double().repeat_interleave(128, 0)[:n]).T
        out[
            "block scale pulled out of the K sum (one scale for all K-blocks): block scales change along K, so each "
            "K-block's product must be scaled before it is added"
        ] = (a @ b.T) * s_first
        s_mean = qa.s.double().mean(1, keepdim=True) * qb.s.double().mean(1).repeat_interleave(128)[:n][None, :]
        out[
            "block scale pulled out of the K sum (an average scale times the whole K sum): scale each K-block's "
            "product before adding it"
        ] = (a @ b.T) * s_mean
    return out


def _tile_pattern(err_bad: np.ndarray) -> str:
    """If the bad elements fill whole 16x16 tiles and leave others untouched, describe it."""
    m, n = err_bad.shape
    if m < 32 or n < 32:
        return ""
    t = 16
    tm, tn = m // t, n // t
    blocks = err_bad[: tm * t, : tn * t].reshape(tm, t, tn, t).mean(axis=(1, 3))
    full, clean = (blocks > 0.9).sum(), (blocks == 0).sum()
    if full and full + clean == blocks.size and clean:
        i, j = np.argwhere(blocks > 0.9)[0]
        return (
            f"whole output tiles are wrong (e.g. rows {i * t}-{i * t + t - 1}, columns {j * t}-{j * t + t - 1}) "
            f"while the rest is right: the launch order maps two programs to one tile and skips another, or "
            f"the tile's offsets/masks are off"
        )
    return ""


def _diagnose(question, name, got, qa, qb, scaling, want=None):
    """Raise AssertionError naming the mistake that fits ``got``; return quietly if it is right."""
    m, n = qa.q.shape[0], qb.q.shape[0]
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{question}: {name} must return a torch.Tensor, got {type_name(got)}")
    if tuple(got.shape) != (m, n):
        raise AssertionError(f"{question}: {name} returned shape {tuple(got.shape)}, want (M, N) = {(m, n)}")
    if got.dtype != torch.bfloat16:
        raise AssertionError(f"{question}: {name} returned {got.dtype}; the lab's GEMMs write bf16 (cast in the store)")
    ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, scaling)
    mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, scaling)
    truth = want if want is not None else ref
    if _close(got, truth, mag):
        return
    g = got.double().cpu()
    nan = torch.isnan(g)
    if nan.any():
        i, j = (int(v) for v in torch.nonzero(nan)[0])
        raise AssertionError(
            f"{question}: {name} gives NaN at {int(nan.sum())} of {g.numel()} outputs (first at ({i}, {j})) where "
            f"the reference is finite: uninitialised output, or a load past the matrix (masks? other=0.0)"
        )
    smell = constant_output(g.numpy().ravel(), ref.double().cpu().numpy().ravel(), show=lambda v: f"{float(v):.6g}")
    if smell:
        raise AssertionError(f"{question}: {name}: {smell}")
    for what, cand in _candidates(qa, qb, scaling).items():
        if _near(got, cand):
            raise AssertionError(f"{question}: {name}: {what}")
    _, msg = G.gemm_tolerance_report(got, truth, mag)
    bad = ~((g - truth.double().cpu()).abs() <= G.GEMM_REL[torch.bfloat16] * truth.double().cpu().abs() + 1e-30)
    tiles = _tile_pattern(bad.numpy())
    if tiles:
        raise AssertionError(f"{question}: {name}: {tiles} ({msg})")
    raise AssertionError(f"{question}: {name} differs from the float64 reference beyond the bound: {msg}")


def _check_gemm(fn, question, name, scaling, promoted=False, shapes=None, seed=0):
    """Run ``fn`` on operands drawn from ``seed + i`` at the i-th of ``shapes`` (the question's public ones
    unless given) and diagnose each output."""
    worst = 0.0
    for i, (m, n, k) in enumerate(CHECK_SHAPES[question] if shapes is None else shapes):
        qa, qb = _operands(m, n, k, scaling, seed + i)
        got = call_student(fn, qa.q, qb.q, qa.s, qb.s, name=name, question=question)
        want = G.fp8_gemm_blockwise_reference(qa.q, qb.q, qa.s, qb.s) if promoted else None
        _diagnose(question, f"{name} on {m}x{n}x{k}", got, qa, qb, scaling, want)
        ref = G.fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, scaling).double().cpu()
        mag = G.magnitudes(qa.q, qb.q, qa.s, qb.s, scaling).cpu()
        worst = max(worst, float(((got.double().cpu() - ref).abs() / mag.clamp_min(1e-300)).max()))
    return worst


def check_gemm_v1(fn, shapes=None, seed=0):
    """q1: tensorwise FP8 GEMM, version 1; ``shapes`` [(M, N, K)] and ``seed`` in place of the public ones."""
    shapes = CHECK_SHAPES["q1"] if shapes is None else shapes
    _check_gemm(fn, "q1", "fp8_gemm_v1", "tensor", shapes=shapes, seed=seed)
    print(f"q1 passed: {len(shapes)} shapes within the bound of the float64 reference")


def check_gemm_v2(fn, shapes=None, seed=0):
    """q2: the pipelined, grouped kernel: same results as v1 on shapes of many tiles with ragged edges."""
    shapes = CHECK_SHAPES["q2"] if shapes is None else shapes
    _check_gemm(fn, "q2", "fp8_gemm_v2", "tensor", shapes=shapes, seed=seed)
    print(f"q2 passed: {len(shapes)} shapes of many tiles, every tile within the bound")


@triton.jit
def _tile_probe(out_ptr, num_pid_m, num_pid_n, FN: tl.constexpr, GROUP_M: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = pid < num_pid_m * num_pid_n
    pid_m, pid_n = FN(tl.where(mask, pid, 0), num_pid_m, num_pid_n, GROUP_M)  # lanes past the grid: pid 0
    tl.store(out_ptr + 2 * pid, pid_m, mask=mask)
    tl.store(out_ptr + 2 * pid + 1, pid_n, mask=mask)


def _probe_tiles(fn, m: int, n: int, gm: int) -> list:
    """[(pid_m, pid_n)] that ``fn`` gives programs 0 .. m*n-1 (the student's part of q2's check)."""
    out = torch.full((2 * m * n,), -1, dtype=torch.int32, device=default_device())
    try:
        _tile_probe[(1,)](out, m, n, FN=fn, GROUP_M=gm, BLOCK=64)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AssertionError(f"q2: grouped_tile raised {type(e).__name__}: {first}") from e
    return out.reshape(-1, 2).tolist()


TILE_GRIDS = ((5, 7, 2), (8, 3, 4), (9, 4, 8), (1, 6, 8), (6, 1, 2))  # (num_pid_m, num_pid_n, GROUP_M)


def grouped_order(num_pid_m: int, num_pid_n: int, group_m: int) -> list:
    """The grouped launch order of Triton's matmul tutorial, in Python: pid -> (pid_m, pid_n)."""
    order = []
    for pid in range(num_pid_m * num_pid_n):
        group, r = divmod(pid, group_m * num_pid_n)
        first = group * group_m
        size = min(num_pid_m - first, group_m)
        order.append((first + r % size, r // size))
    return order


def check_grouped_order(fn, grids=TILE_GRIDS):
    """q2 (order): ``fn(pid, num_pid_m, num_pid_n, GROUP_M)``, a ``@triton.jit`` function, gives every
    tile exactly once, in grouped order, on ``grids`` [(num_pid_m, num_pid_n, GROUP_M)] of at most 64
    tiles (by default ones whose last group is short)."""
    if not is_triton_function(fn):  # JITFunction, or InterpretedFunction in CPU mode
        raise AssertionError("q2: grouped_tile must be a @triton.jit function (it is called inside the kernel)")
    for m, n, gm in grids:
        got = [tuple(p) for p in student_side(_probe_tiles, fn, m, n, gm)]
        want = grouped_order(m, n, gm)
        if got == want:
            continue
        where = f"on a grid of {m}x{n} tiles with GROUP_M={gm}"
        outside = [p for p in got if not (0 <= p[0] < m and 0 <= p[1] < n)]
        if outside:
            raise AssertionError(
                f"q2: grouped_tile sends a program outside the grid {where} (e.g. tile {outside[0]}): the last "
                f"group has only num_pid_m - first_pid_m rows (tl.minimum)"
            )
        if len(set(got)) < len(got):
            dup = next(p for p in got if got.count(p) > 1)
            raise AssertionError(
                f"q2: grouped_tile gives tile {dup} to {got.count(dup)} programs {where}, so others are never "
                f"computed: every pid must map to a different tile"
            )
        if got == [(p // n, p % n) for p in range(m * n)]:
            raise AssertionError(
                f"q2: grouped_tile gives row-major order {where}: consecutive programs walk along a row of tiles "
                f"(v1's order); inside a group of GROUP_M tile rows they should walk down a column"
            )
        i = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise AssertionError(f"q2: grouped_tile: program {i} gets tile {got[i]}, want {want[i]} {where}")
    print(f"q2 passed: grouped order on {len(grids)} grids, every tile exactly once")


def check_gemm_rowwise(fn, shapes=None, seed=0):
    """q3: per-row scales of both operands."""
    shapes = CHECK_SHAPES["q3"] if shapes is None else shapes
    _check_gemm(fn, "q3", "fp8_gemm_rowwise", "row", shapes=shapes, seed=seed)
    print(f"q3 passed: {len(shapes)} shapes, rows of different scales, within the bound")


def _big_then_small():
    """K = 128 + 16384: block 0 sums 128 products of 1 (B = 128); the 16384 later products are 2^-13 =
    2^-20 B each (even 32 of them, one MMA step, are 2^-15 B).  Promoted, they add up to 2, visible in
    bf16 (130 vs 128); carried in an FP8 accumulator that keeps ~13-14 bits below B, they vanish."""
    m = n = 32
    k = 128 + 16384
    a = torch.ones(m, k)
    b = torch.ones(n, k)
    a[:, 128:] = 2.0**-4
    b[:, 128:] = 2.0**-9  # e4m3's smallest subnormal: exact
    dev = default_device()
    qa = Q.Quantized(a.to(torch.float8_e4m3fn).to(dev), torch.ones(m, k // 128, device=dev))
    qb = Q.Quantized(b.to(torch.float8_e4m3fn).to(dev), torch.ones(1, k // 128, device=dev))
    return qa, qb


def _check_promotion(fn):
    """q4's first part: the big-then-small input keeps its small K-blocks."""
    qa, qb = _big_then_small()
    got = call_student(fn, qa.q, qb.q, qa.s, qb.s, name="fp8_gemm_blockwise", question="q4")
    want = G.fp8_gemm_blockwise_reference(qa.q, qb.q, qa.s, qb.s)
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    lost = torch.full_like(got.double().cpu(), 128.0)  # block 0 alone: every small block swallowed
    if not err <= 2.0**-7 * want.double().abs().max().item() and torch.allclose(got.double().cpu(), lost):
        raise AssertionError(
            f"q4: fp8_gemm_blockwise: no promotion: small K-blocks are lost (got {got[0, 0].item():.6g}, want "
            f"{want[0, 0].item():.6g}) once they are added to a large sum inside tl.dot's accumulator, which keeps "
            f"13 bits on Hopper.  Start each K-block's tl.dot from zeros and add it, scaled, into an fp32 sum"
        )


def check_gemm_blockwise(fn, shapes=None, seed=0, promotion=True):
    """q4: 1x128 x 128x128 block scales, each 128-K partial product promoted to fp32.

    The promotion is looked for first, on an input whose small K-blocks vanish in Hopper's FP8
    accumulator without it (unit scales, so no scale mistake changes that output); then the contract of
    q1 on shapes whose block scales differ along K.  ``promotion=False`` leaves out the first part."""
    shapes = CHECK_SHAPES["q4"] if shapes is None else shapes
    if promotion:
        _check_promotion(fn)
    _check_gemm(fn, "q4", "fp8_gemm_blockwise", "block", promoted=True, shapes=shapes, seed=seed)
    print(
        f"q4 passed: {len(shapes)} shapes bit-close to the promoted reference"
        + ("; small K-blocks kept next to a large one" if promotion else "")
    )


# -- q5: the FP8 linear layer -------------------------------------------------------------------------

LINEAR_SHAPE = (96, 64, 48)  # tokens, in_features, out_features
GRAD_SIZE = 1e-6  # gradients of this size: far below e4m3's smallest subnormal (2^-9)
MIN_FP8_ERROR = 0.005  # a product through e4m3 differs from bf16 by ~0.04; below this it was not quantized


def _linear_data(shape=LINEAR_SHAPE, seed=5, decades=2.0):
    """(x, w, dy) in bf16 from ``seed``: tokens of sizes 10^-decades .. 10^decades, gradients of GRAD_SIZE."""
    t, i, o = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, i, generator=g) * torch.logspace(-decades, decades, t)[:, None]  # tokens of very different size
    w = torch.randn(o, i, generator=g) * i**-0.5
    dy = torch.randn(t, o, generator=g) * GRAD_SIZE
    dev = default_device()
    return x.to(torch.bfloat16).to(dev), w.to(torch.bfloat16).to(dev), dy.to(torch.bfloat16).to(dev)


def _linear_forward_backward(fn, x, w, dy):
    """(y, dx, dw) of ``fn`` through autograd (the student's part of q5's check)."""
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = call_student(fn, xs, ws, name="fp8_linear_fn", question="q5")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (x.shape[0], w.shape[0]):
        raise AssertionError(f"q5: fp8_linear_fn must return (tokens, out) = {(x.shape[0], w.shape[0])}")
    if not y.requires_grad:
        raise AssertionError("q5: the output does not require grad: return the result of FP8LinearFn.apply(x, w)")
    try:
        y.backward(dy)
    except Exception as e:  # the student's backward
        raise AssertionError(
            f"q5: backward raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    if xs.grad is None or ws.grad is None:
        raise AssertionError("q5: backward must return gradients for both x and w (dX and dW), not None")
    return y.detach(), xs.grad, ws.grad


def check_fp8_linear(fn, shape=LINEAR_SHAPE, seed=5, decades=2.0, every_token=False):
    """q5: ``fn(x, w)`` -> ``x @ w.T`` through FP8, with gradients for both.  ``shape`` (tokens, in, out),
    ``seed`` and ``decades`` (of token sizes, each way) draw other data; ``every_token`` also holds each
    token's row of Y, not only the whole Y, to Y's bound (which per-row scales keep)."""
    x, w, dy = _linear_data(shape, seed, decades)
    y, dx, dw = student_side(_linear_forward_backward, fn, x, w, dy)
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    yb = xb @ wb.T
    yb.backward(dy)
    errs = {name: frobenius_error(g, b) for name, g, b in (("y", y, yb), ("dx", dx, xb.grad), ("dw", dw, wb.grad))}
    shown = ", ".join(f"{k} {v:.4f}" for k, v in errs.items())
    if errs["y"] > L.BF16_TOLERANCE["y"]:
        ratio = (y.detach().double().abs().median() / yb.detach().double().abs().median()).item()
        if not 0.25 < ratio < 4:
            raise AssertionError(
                f"q5: Y is off by a factor of ~{ratio:.3g} from x @ w.T: scales multiplied instead of divided "
                f"(quantize with q = x / S, dequantize with S * q, S = amax / 448)"
            )
        raise AssertionError(f"q5: Y differs from bf16 beyond {L.BF16_TOLERANCE['y']} ({shown})")
    if errs["y"] < MIN_FP8_ERROR:
        raise AssertionError(
            f"q5: Y equals the bf16 product to {errs['y']:.1e}: the forward GEMM did not go through FP8 "
            f"(quantize x and w to e4m3 and call the FP8 GEMM)"
        )
    if every_token:
        want = yb.detach().double().cpu()
        rows = (y.double().cpu() - want).norm(dim=1) / want.norm(dim=1)
        t = int(rows.argmax())
        if rows[t] > L.BF16_TOLERANCE["y"]:
            raise AssertionError(
                f"q5: token {t}'s row of Y differs from bf16 by {rows[t].item():.3g} (relative), beyond "
                f"{L.BF16_TOLERANCE['y']}, while Y as a whole is within it ({shown}): the small tokens lost their "
                f"precision, as with one scale for the whole tensor; quantize x per row (Q.quantize_rowwise)"
            )
    for name, g in (("dX", dx), ("dW", dw)):
        zeros = (g == 0).double().mean().item()
        if zeros > 0.5:
            raise AssertionError(
                f"q5: {zeros:.0%} of {name} is zero: gradients (~{GRAD_SIZE:g}) were cast to FP8 without a scale "
                f"(E4M3's smallest subnormal is 2^-9, E5M2's 2^-16): quantize dY with its own scale, in E5M2"
            )
    if errs["dx"] > L.BF16_TOLERANCE["dx"]:
        raise AssertionError(
            f"q5: dX differs from bf16 beyond {L.BF16_TOLERANCE['dx']} ({shown}): dX = dY @ W, so the B operand "
            f"is W^T (in, out), quantized from W along out"
        )
    if errs["dw"] > L.BF16_TOLERANCE["dw"]:
        raise AssertionError(
            f"q5: dW is wrong while Y and dX are right ({shown}): the transposed operands (X^T, dY^T) were made by "
            f"transposing FP8 codes, whose row scales then vary along dW's K (tokens).  Quantize x.t() and "
            f"dy.t() again from the wide originals"
        )
    print(f"q5 passed: relative errors against bf16 {shown} (bounds {L.BF16_TOLERANCE})")


# -- q6: which layers become FP8 -------------------------------------------------------------------------


def _swap_and_inspect(fn, dim=64, depth=2, seed=0) -> dict:
    """The student's part of q6's check: convert a fresh MarkovLM with ``fn``, then report which class
    each layer has ("FP8Linear", or its class name) and the model's state_dict."""
    torch.manual_seed(seed)
    model = L.MarkovLM(dim=dim, depth=depth, device=default_device())
    out = call_student(fn, model, name="fp8_swap", question="q6")
    model = out if isinstance(out, torch.nn.Module) else model

    def kind(layer):
        return "FP8Linear" if isinstance(layer, L.FP8Linear) else type_name(layer)

    return {
        "blocks": [kind(m) for m in [*model.ups, *model.downs]],
        "head": kind(model.head),
        "proj": kind(model.proj),
        "state": {k: v.detach() for k, v in model.state_dict().items()},
    }


def check_fp8_swap(fn, dim=64, depth=2, seed=0):
    """q6: ``fn(model)`` converts a MarkovLM's block GEMMs (ups, downs) to FP8Linear, in place, sharing the
    weights, and leaves ``proj`` and ``head`` as nn.Linear; on a model of ``dim``, ``depth``, from ``seed``."""
    seen = student_side(_swap_and_inspect, fn, dim, depth, seed)
    blocks = seen["blocks"]
    not_fp8 = [i for i, kind in enumerate(blocks) if kind != "FP8Linear"]
    if len(not_fp8) == len(blocks):
        raise AssertionError("q6: no block layer became an FP8Linear: replace model.ups[i] and model.downs[i]")
    if not_fp8:
        raise AssertionError(f"q6: {len(not_fp8)} of {len(blocks)} block layers are still nn.Linear")
    for name in ("head", "proj"):
        if seen[name] == "FP8Linear":
            why = (
                "the output head stays wide: it is small, and its logits feed the softmax and the loss"
                if name == "head"
                else "the input projection (from embeddings) stays wide here, like the embeddings"
            )
            raise AssertionError(f"q6: model.{name} was converted to FP8: {why}")
    torch.manual_seed(seed)
    before = L.MarkovLM(dim=dim, depth=depth, device=default_device()).state_dict()
    after = seen["state"]
    changed = [k for k, v in before.items() if k in after and not torch.equal(after[k].to(v.device), v)]
    if changed:
        raise AssertionError(
            f"q6: the weights changed ({changed[0]}, ...): the FP8 layers were re-initialised; build them with "
            f"FP8Linear.from_linear(layer) so that they share the trained parameters"
        )
    print(f"q6 passed: {len(blocks)} block GEMMs in FP8; proj, head, embeddings and norms wide; weights shared")


__all__ = [
    "check_fp8_linear",
    "check_fp8_swap",
    "check_gemm_blockwise",
    "check_gemm_rowwise",
    "check_gemm_v1",
    "check_gemm_v2",
    "check_grouped_order",
    "grouped_order",
]
