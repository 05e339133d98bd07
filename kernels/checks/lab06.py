"""Checks for Lab 6 (FP4 weight-only): quantizers, dequantizer, the W4A16 GEMM, Hadamard rotation.

Each check runs the student's function on fixed, device-independent inputs, compares with
:mod:`kernels.fp4` (bit for bit where the operation is exact), and on failure says which numerical
mistake the output looks like: nibbles in the wrong order, an E8M0 exponent off by one, the NVFP4
tensor scale left out, rounding toward zero, ties away from zero, a lost sign, a missing 1/sqrt(B).
The hidden tests run the same checks on inputs drawn by the ``fresh_*`` functions below, from a seed
and at sizes that only they state.
"""

import numpy as np
import torch

from kernels import fp4, hadamard
from kernels.checks import call_student, constant_output, type_name
from kernels.device import default_device
from kernels.testing import first_mismatches

GRID = torch.tensor(fp4.E2M1_VALUES, dtype=torch.float64)


# -- the fixed inputs -------------------------------------------------------------------------------------


def quantizer_inputs() -> dict:
    """Named fp32 matrices (rows x K, K a multiple of 32): each exercises one part of the recipe."""
    g = torch.Generator().manual_seed(6)
    random = torch.randn(8, 128, generator=g) * 3
    # A block of exact ties for MXFP4: amax 6 gives e = floor(log2 6) - 2 = 0, S = 1, so the elements
    # are the scaled values themselves: every midpoint between E2M1 neighbours, both signs.
    mids = ((GRID[1:] + GRID[:-1]) / 2).float()  # 0.25 0.75 1.25 1.75 2.5 3.5 5
    tie_row = torch.cat([mids, -mids, torch.tensor([6.0, -6.0]), mids * 0.999, mids * 1.001, torch.zeros(2)])
    ties = torch.stack([tie_row, tie_row.flip(0)])  # (2, 32)
    ties = torch.cat([ties, ties * 4], dim=1)  # a second block at S = 4
    special = torch.randn(4, 64, generator=g)
    special[0, :32] = 0.0  # an all-zero block
    special[1, :16] = -0.0  # negative zeros
    special[2, 5] = 7.9  # OCP's floor rule: S = 1 for amax 7.9, so 7.9 saturates to 6
    special[3, 40] = 300.0  # an outlier that sets its block's scale
    wide = torch.randn(3, 64, generator=g) * torch.logspace(-6, 6, 64)  # blocks across 12 decades
    return {"random": random, "ties": ties, "zero/negative zero/saturation": special, "wide range": wide}


def fresh_quantizer_inputs(seed: int, rows: int = 37, k: int = 96) -> dict:
    """Named fp32 ``(rows, k)`` matrices drawn from ``seed`` (``k`` a multiple of 32), the groups of
    :func:`quantizer_inputs` on other values and at another size: rows over six decades; blocks of exact
    E2M1 values and ties, each under its own power of two (MXFP4 ties, exactly); zero blocks, negative
    zeros and elements in (6, 8) times their block's power of two (saturated by MXFP4)."""
    if k % 32 or k < 32 or rows < 1:
        raise ValueError(f"want rows >= 1 and k a positive multiple of 32, got {rows} x {k}")
    g = torch.Generator().manual_seed(seed)
    random = torch.randn(rows, k, generator=g) * 10.0 ** (torch.rand(rows, 1, generator=g) * 6 - 3)
    points = torch.cat([GRID, (GRID[1:] + GRID[:-1]) / 2]).float()  # the values and their midpoints
    ties = points[torch.randint(0, len(points), (rows, k), generator=g)]
    ties = torch.where(torch.rand(rows, k, generator=g) < 0.5, -ties, ties).reshape(rows, k // 32, 32)
    ties.scatter_(2, torch.randint(0, 32, (rows, k // 32, 1), generator=g), 6.0)  # each block's amax: S = 2^p
    ties = (ties * 2.0 ** torch.randint(-20, 21, (rows, k // 32, 1), generator=g).float()).reshape(rows, k)
    special = torch.randn(rows, k, generator=g)
    blocks = special.view(rows, k // 32, 32)
    blocks[torch.rand(rows, k // 32, generator=g) < 0.2] = 0.0
    special[torch.rand(rows, k, generator=g) < 0.1] = -0.0
    picks = torch.randint(0, k, (rows,), generator=g)
    special[torch.arange(rows), picks] = 6.0 + 2.0 * torch.rand(rows, generator=g)  # amax in (6, 8): S = 1
    return {"random rows": random, "ties under powers of two": ties, "zeros and saturation": special}


# -- q1: the quantizers ---------------------------------------------------------------------------------------


def _as_fp4(out, fmt: str, question: str, name: str) -> fp4.FP4Tensor:
    if isinstance(out, fp4.FP4Tensor):
        q, s, ts = out.q, out.s, out.tensor_scale
    elif isinstance(out, tuple | list) and len(out) == 4 and out[3] == fmt:  # an FP4Tensor as plain data
        q, s, ts = out[:3]
    elif isinstance(out, tuple | list) and len(out) == 3:
        q, s, ts = out
    else:
        raise AssertionError(f"{question}: {name} must return (q, s, tensor_scale), got {type_name(out)}")
    for what, t in (("q", q), ("s", s)):
        if not isinstance(t, torch.Tensor):
            raise AssertionError(f"{question}: {what} must be a torch.Tensor, got {type_name(t)}")
    if q.dtype != torch.uint8:
        raise AssertionError(f"{question}: q must be uint8 (two codes per byte), got {q.dtype}")
    if s.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise AssertionError(f"{question}: s must hold scale bytes (uint8 or float8_e4m3fn), got {s.dtype}")
    s = s.view(torch.uint8).view(torch.float8_e4m3fn) if fmt == "nvfp4" else s.view(torch.uint8)
    if fmt == "nvfp4":
        if not isinstance(ts, torch.Tensor) or ts.numel() != 1:
            raise AssertionError(f"{question}: NVFP4 needs its tensor scale: a one-element fp32 tensor, got {ts!r}")
        ts = ts.float().reshape(())
    return fp4.FP4Tensor(q.cpu(), s.cpu(), ts.cpu() if isinstance(ts, torch.Tensor) else None, fmt)


def _scaled_magnitudes(x: torch.Tensor, ref: fp4.FP4Tensor) -> torch.Tensor:
    """|x| / S per element, with the reference's S and its reciprocal taken as the kernel takes it."""
    bs = fp4.FORMATS[ref.fmt]
    m, k = x.shape
    if ref.fmt == "nvfp4":
        denom = ref.s.float() * ref.tensor_scale
        inv = torch.where(denom > 0, 1.0 / denom.clamp(min=1e-45), torch.zeros_like(denom))
    else:
        inv = 2.0 ** -(ref.s.to(torch.float32) - 127)
    return (x.reshape(m, k // bs, bs) * inv[..., None]).abs().reshape(m, k)


def _codes_toward_zero(mag):
    return sum((mag >= g).to(torch.int32) for g in GRID[1:].float())


def _codes_ties_away(mag):
    return sum((mag >= g).to(torch.int32) for g in ((GRID[1:] + GRID[:-1]) / 2).float())


def _swap_nibbles(b: torch.Tensor) -> torch.Tensor:
    return ((b & 0xF) << 4) | (b >> 4)


def diagnose_quantizer(x: torch.Tensor, got: fp4.FP4Tensor, want: fp4.FP4Tensor) -> list:
    """What is wrong with ``got`` (codes, scales) for input ``x``, most basic first; [] if it is right."""
    fmt = want.fmt
    if got.q.shape != want.q.shape:
        return [f"q has shape {tuple(got.q.shape)}, want {tuple(want.q.shape)}: (rows, K // 2), two codes per byte"]
    if got.s.shape != want.s.shape:
        return [f"s has shape {tuple(got.s.shape)}, want {tuple(want.s.shape)}: one scale per block of the row"]
    smell = constant_output(got.q.numpy().ravel(), want.q.numpy().ravel())
    if smell:
        return [f"the packed codes: {smell}"]
    gs, ws = got.s.view(torch.uint8).to(torch.int32), want.s.view(torch.uint8).to(torch.int32)
    if fmt == "nvfp4":
        ts_ok = torch.equal(got.tensor_scale, want.tensor_scale)
        no_ts = fp4.quantize_fp4_reference(x, "nvfp4", tensor_scale=torch.tensor(1.0))
        if (not ts_ok and got.tensor_scale.item() == 1.0) or (
            torch.equal(gs, no_ts.s.view(torch.uint8).to(torch.int32)) and not torch.equal(gs, ws)
        ):
            return [
                "NVFP4 tensor scale ignored: the tensor scale must be amax / (448 * 6) = "
                f"{want.tensor_scale.item():.6g} and each block scale e4m3(block_amax / (6 * tensor_scale)), "
                "so the E4M3 block scales use their whole range; without it small blocks underflow E4M3"
            ]
        if not ts_ok:
            return [
                f"tensor scale is {got.tensor_scale.item():.9g}, want amax / (448 * 6) = "
                f"{want.tensor_scale.item():.9g} (amax over the finite elements, fp32 division)"
            ]
    if not torch.equal(gs, ws):
        d = (gs - ws)[gs != ws]
        if fmt == "mxfp4" and d.numel() and bool((d == d[0]).all()) and abs(int(d[0])) == 1:
            way = "too high" if int(d[0]) > 0 else "too low"
            return [
                f"E8M0 scale off by one: every differing exponent is one {way} (byte {int(gs[gs != ws][0])} "
                f"for {int(ws[gs != ws][0])}); OCP's rule is e = floor(log2(block_amax)) - 2, since E2M1's "
                "largest value 6 = 1.5 * 2^2, stored as e + 127"
            ]
        bad = np.flatnonzero((gs != ws).numpy().ravel())
        what = "E4M3 block scales" if fmt == "nvfp4" else "E8M0 block scales"
        return [first_mismatches(np.empty(0), gs.numpy(), ws.numpy(), bad, what=f"{what} (as bytes)")]
    if torch.equal(got.q, want.q):
        return []
    # The codes: a known smell as stored, or one once the nibbles are swapped back.
    found = _code_smell(x, got.q, want)
    if found is not None:
        return [found]
    found = _code_smell(x, _swap_nibbles(got.q), want)
    swapped = (
        "nibbles swapped: element 2i belongs in the LOW nibble (bits 0-3) and element 2i+1 in the high "
        "nibble, the order of torch.float4_e2m1fn_x2"
    )
    if found is not None:
        return [swapped + (f"; and once swapped back, {found}" if found else "")]
    gc, wc = fp4.unpack(got.q).to(torch.int32), fp4.unpack(want.q).to(torch.int32)
    bad = np.flatnonzero((gc != wc).numpy().ravel())
    return [first_mismatches(x.numpy(), gc.numpy(), wc.numpy(), bad, what="E2M1 codes")]


def _code_smell(x, q, want) -> str | None:
    """ "" if ``q`` is right, the name of the mistake it shows, or None if it is none of the known ones."""
    if torch.equal(q, want.q):
        return ""
    gc, wc = fp4.unpack(q).to(torch.int32), fp4.unpack(want.q).to(torch.int32)
    bad_mask = gc != wc
    if torch.equal(gc & 7, wc & 7):
        return "signs lost: a negative value's code has bit 3 set (code | 8), -0.0 included"
    scaled = _scaled_magnitudes(x, want)
    mag = scaled.clamp(max=6.0)
    sign = wc & 8
    rtz, away = _codes_toward_zero(mag) | sign, _codes_ties_away(mag) | sign
    if torch.equal(gc[bad_mask], rtz[bad_mask]):
        return (
            f"rounded toward zero: {int(bad_mask.sum())} codes are the E2M1 value just below |x| / S instead of "
            "the nearest one (round to nearest, ties to even: 1.2 -> 1.0 but 1.3 -> 1.5)"
        )
    if torch.equal(gc[bad_mask], away[bad_mask]):
        return "ties rounded away from zero: a tie between two E2M1 values goes to the even code (0.25 -> 0, 5 -> 4)"
    over = (scaled > 6.0) & bad_mask
    if over.any() and not (bad_mask & ~over).any():
        return "no saturation: values beyond 6 * S must become code 7 (6.0), the largest E2M1 value"
    return None


def check_quantize(fn, inputs: dict | None = None) -> None:
    """q1: ``fn(x, fmt)`` -> ``(q, s, tensor_scale)`` for fmt "nvfp4" and "mxfp4", bit for bit, on
    ``inputs`` ({label: fp32 matrix}; :func:`quantizer_inputs` unless given)."""
    question, name = "q1", "quantize_fp4"
    dev = default_device()
    inputs = quantizer_inputs() if inputs is None else inputs
    problems, cases = [], 0
    for fmt in fp4.FORMATS:
        for label, x in inputs.items():
            out = call_student(fn, x.to(dev), fmt, name=name, question=question)
            got = _as_fp4(out, fmt, question, name)
            want = fp4.quantize_fp4_reference(x, fmt)
            found = diagnose_quantizer(x, got, want)
            cases += 1
            if found:
                problems.append(f"{fmt}, input '{label}': {found[0]}")
                break  # one diagnosis per format: the first input that shows it
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: {cases} inputs, NVFP4 and MXFP4 codes, scales and tensor scale bit for bit")


# -- q2: the dequantizer --------------------------------------------------------------------------------------


def check_dequantize(fn, inputs: dict | None = None) -> None:
    """q2: ``fn(q, s, tensor_scale, fmt)`` -> fp32 ``(rows, K)``: exact for MXFP4, one rounding for NVFP4;
    on ``inputs`` quantized by the reference (:func:`quantizer_inputs` unless given)."""
    question, name = "q2", "dequantize_fp4"
    dev = default_device()
    inputs = quantizer_inputs() if inputs is None else inputs
    problems = []
    for fmt in fp4.FORMATS:
        for label, x in inputs.items():
            t = fp4.quantize_fp4_reference(x, fmt)
            ts = t.tensor_scale.to(dev) if t.tensor_scale is not None else None
            out = call_student(fn, t.q.to(dev), t.s.to(dev), ts, fmt, name=name, question=question)
            if not isinstance(out, torch.Tensor):
                raise AssertionError(f"{question}: {name} must return a torch.Tensor, got {type_name(out)}")
            got = out.detach().cpu().float()
            want = fp4.dequantize_fp4_reference(t)
            if got.shape != want.shape:
                raise AssertionError(f"{question}: {name} returned shape {tuple(got.shape)}, want {tuple(want.shape)}")
            found = _diagnose_dequant(got, want, t)
            if found:
                problems.append(f"{fmt}, input '{label}': {found}")
                break
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: MXFP4 exact, NVFP4 within one fp32 rounding, on {len(inputs)} inputs each")


def _close(a, b, rel=2.0**-22) -> bool:
    return bool(((a - b).abs() <= rel * b.abs()).all())


def _diagnose_dequant(got, want, t) -> str:
    if _close(got, want):
        return ""
    smell = constant_output(got.numpy().ravel(), want.numpy().ravel(), show=lambda v: f"{v:g}")
    if smell:
        return smell
    swapped = fp4.dequantize_fp4_reference(t._replace(q=_swap_nibbles(t.q)))
    if _close(got, swapped) and not _close(want, swapped):
        return "nibbles swapped: element 2i is the LOW nibble of byte i, element 2i+1 the high nibble"
    if t.fmt == "nvfp4" and _close(got * t.tensor_scale, want):
        return "NVFP4 tensor scale ignored: x = q * block_scale * tensor_scale"
    if t.fmt == "mxfp4":
        for f in (2.0, 0.5):
            if _close(got, want * f):
                return f"E8M0 scale off by one: every value is {f:g}x what it should be; S = 2^(byte - 127)"
    if _close(got, want.abs()):
        return "signs lost: code bit 3 is the sign"
    bad = np.flatnonzero(((got - want).abs() > 2.0**-22 * want.abs()).numpy().ravel())
    return first_mismatches(np.empty(0), got.numpy(), want.numpy(), bad, what="dequantized values")


# -- q3: the W4A16 GEMM ---------------------------------------------------------------------------------------


def gemm_inputs() -> dict:
    g = torch.Generator().manual_seed(16)
    a = torch.randn(5, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(48, 128, generator=g) * 0.5
    w[:, 3] *= 20.0  # an outlier column: blocks with different scales
    return {"a": a, "w": w}


def fresh_gemm_inputs(seed: int, m: int, n: int, k: int, decades: float = 0.0) -> dict:
    """Activations ``a`` (m, k) bf16 and a weight ``w`` (n, k) drawn from ``seed``, like :func:`gemm_inputs`
    (an outlier column, at a place of the draw's choosing); with ``decades``, the weight's rows span
    10^-decades .. 10^decades, as the quantizers' "wide range" input does."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * 0.5
    w[:, int(torch.randint(0, k, (1,), generator=g))] *= 20.0
    return {"a": a, "w": w * torch.logspace(-decades, decades, n)[:, None]}


def check_w4a16(fn, inputs: dict | None = None) -> None:
    """q3: ``fn(a, q, s, tensor_scale, fmt)`` -> bf16 ``a @ W^T`` within bf16 GEMM tolerance of float64, on
    ``inputs`` ({"a", "w"}; :func:`gemm_inputs` unless given)."""
    question, name = "q3", "w4a16_matmul"
    dev = default_device()
    inp = gemm_inputs() if inputs is None else inputs
    a = inp["a"]
    problems, report = [], []
    for fmt in fp4.FORMATS:
        t = fp4.quantize_fp4_reference(inp["w"], fmt)
        ts = t.tensor_scale.to(dev) if t.tensor_scale is not None else None
        out = call_student(fn, a.to(dev), t.q.to(dev), t.s.to(dev), ts, fmt, name=name, question=question)
        if not isinstance(out, torch.Tensor):
            raise AssertionError(f"{question}: {name} must return a torch.Tensor, got {type_name(out)}")
        want_shape = (a.shape[0], t.q.shape[0])
        if tuple(out.shape) != want_shape:
            raise AssertionError(f"{question}: {name} returned shape {tuple(out.shape)}, want (M, N) = {want_shape}")
        if out.dtype != torch.bfloat16:
            raise AssertionError(
                f"{question}: {name} must return bf16 (the fp32 accumulator rounded once), got {out.dtype}"
            )
        got = out.detach().cpu().double()

        def product(tt):
            return a.double() @ fp4.dequantize_fp4_reference(tt).double().T

        want = product(t)
        tol = 1e-2 * want.abs().max().item()  # bf16 output: 2^-8 of the largest output, plus sum order

        def near(ref, got=got, tol=tol):
            return bool(((got - ref).abs() <= tol + 1e-2 * ref.abs()).all())

        err = (got - want).abs().max().item()
        report.append(f"{fmt} max_abs {err:.3g}")
        if near(want):
            continue
        unscaled = a.double() @ fp4.e2m1_decode(fp4.unpack(t.q)).double().T
        if t.tensor_scale is not None:
            unscaled = unscaled * t.tensor_scale.double()
        if torch.unique(got).numel() == 1:
            problems.append(
                f"{fmt}: every output is {got.flatten()[0].item():g}: is the accumulator stored, with its mask?"
            )
        elif near(product(t._replace(q=_swap_nibbles(t.q)))):
            problems.append(f"{fmt}: nibbles swapped: element 2i of a row is the LOW nibble of byte i")
        elif fmt == "nvfp4" and near(want / t.tensor_scale.double()):
            problems.append(f"{fmt}: NVFP4 tensor scale ignored: multiply the accumulator by tensor_scale")
        elif near(unscaled):
            problems.append(f"{fmt}: block scales not applied: each code is multiplied by its block's scale")
        else:
            bad = np.flatnonzero(((got - want).abs() > tol + 1e-2 * want.abs()).numpy().ravel())
            problems.append(first_mismatches(np.empty(0), got.numpy(), want.numpy(), bad, what=f"{fmt} outputs"))
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: NVFP4 and MXFP4 weights, within bf16 tolerance of float64 ({', '.join(report)})")


# -- q4: the Hadamard rotation --------------------------------------------------------------------------------


def fresh_activations(seed: int, rows: int, k: int) -> torch.Tensor:
    """bf16 ``(rows, k)`` drawn from ``seed``, with three outlier channels (the rotation's use case)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:3]] *= 40.0
    return x.to(torch.bfloat16)


def check_hadamard(fn, x: torch.Tensor | None = None, seed: int | None = None) -> None:
    """q4: ``fn(x, block, signs)`` -> ``x R`` per block, R = diag(signs) H / sqrt(block), in x's dtype.
    ``x``: a bf16 (rows, K) in place of the fixed one; ``seed``: signs from ``seed + block``, not ``block``."""
    question, name = "q4", "hadamard_rotate"
    dev = default_device()
    if x is None:
        g = torch.Generator().manual_seed(4)
        x = torch.randn(8, 256, generator=g).to(torch.bfloat16)
    rows, k = x.shape
    problems = []
    for block in hadamard.HADAMARD_BLOCKS:
        d = hadamard.random_signs(block, seed=block if seed is None else seed + block)
        out = call_student(fn, x.to(dev), block, d.to(dev), name=name, question=question)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
            raise AssertionError(f"{question}: {name} must return a tensor of x's shape {tuple(x.shape)}")
        got = out.detach().cpu().double()
        want = hadamard.hadamard_rotate_reference(x.float(), block, d).double()

        def near(ref, got=got):
            return bool(((got - ref).abs() <= 1e-2 + 1e-2 * ref.abs()).all())  # bf16 output: 2^-8

        if near(want):
            continue
        h = hadamard.hadamard_matrix(block, dtype=torch.float64)
        xb = x.double().reshape(rows, -1, block)
        if near(want * block**0.5):
            problems.append(f"block {block}: not normalized: divide by sqrt({block}) so that R is orthonormal")
        elif near(hadamard.hadamard_rotate_reference(x.float(), block).double()):
            problems.append(f"block {block}: the random signs are ignored: multiply x by signs before H")
        elif near(((xb @ h) * d.double()).reshape(rows, -1)):
            problems.append(f"block {block}: signs applied after H (that is the inverse's order): x * signs, then H")
        elif k & (k - 1) == 0 and near(x.double() @ hadamard.hadamard_matrix(k, dtype=torch.float64)):
            problems.append(f"block {block}: rotated the whole row at once: each block of {block} on its own")
        else:
            bad = np.flatnonzero(((got - want).abs() > 1e-2 + 1e-2 * want.abs()).numpy().ravel())
            problems.append(first_mismatches(np.empty(0), got.numpy(), want.numpy(), bad, what=f"block {block}"))
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: blocks {hadamard.HADAMARD_BLOCKS}, within bf16 tolerance of the float64 rotation")


# -- q5: the backward's operands of the FP4 training layer ------------------------------------------------


def backward_inputs(seed: int = 5, tokens: int = 64, d_in: int = 64, d_out: int = 96) -> tuple:
    """``(x, dy, seeds, signs)`` for q5: bf16 activations ``(tokens, d_in)`` with one outlier token,
    a bf16 output gradient ``(tokens, d_out)``, the two stochastic-rounding seeds and the RHT's signs."""
    if tokens % 16 or d_in % 16 or d_out % 16:
        raise ValueError(f"tokens, d_in and d_out must be multiples of 16, got {tokens}, {d_in}, {d_out}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d_in, generator=g)
    x[int(torch.randint(0, tokens, (1,), generator=g))] *= 30.0  # one outlier token: what the rotation is for
    dy = torch.randn(tokens, d_out, generator=g) * 1e-3
    seeds = tuple(int(v) for v in torch.randint(0, 2**30, (2,), generator=g))
    return x.to(torch.bfloat16), dy.to(torch.bfloat16), seeds, hadamard.random_signs(16, seed)


def backward_reference(x, dy, seeds, signs) -> dict:
    """q5's answer: dY for the dgrad (stochastic rounding, seed 0), and the wgrad's dY^T (stochastic,
    seed 1) and X^T, both rotated along the tokens by the same RHT, each from the wide bf16 tensor."""
    sr = {"stochastic_rounding": True}

    def rotated(t):
        return hadamard.hadamard_rotate(t.t().contiguous(), 16, signs.to(t.device))

    return {
        "dY": fp4.quantize_fp4_reference(dy, "nvfp4", **sr, seed=seeds[0]),
        "dY^T": fp4.quantize_fp4_reference(rotated(dy), "nvfp4", **sr, seed=seeds[1]),
        "X^T": fp4.quantize_fp4_reference(rotated(x), "nvfp4"),
    }


# q5 accepts an operand whose codes and block scales agree with the recipe's on 90% of its elements: a
# rotation computed in fp32 rather than bf16 moves up to 4% of them on the fixed inputs, every mistake of
# the recipe a quarter or more.
AGREE = 0.10


def _differ(got, want) -> float:
    """The share of elements whose code or block-scale byte differs (1.0 where the tensor scales differ by
    more than bf16's rounding: a rotation computed in fp32 moves the tensor's amax by that much)."""
    if abs(float(got.tensor_scale) / float(want.tensor_scale) - 1) > 2.0**-7:
        return 1.0
    codes = fp4.unpack(got.q.cpu()) != fp4.unpack(want.q.cpu())
    scales = got.s.view(torch.uint8).cpu() != want.s.view(torch.uint8).cpu()
    return float((codes | scales.repeat_interleave(fp4.NVFP4_BLOCK, -1)).double().mean())


def check_fp4_backward(fn, inputs: tuple | None = None) -> None:
    """q5: ``fn(x, dy, seeds, signs)`` -> the three FP4 operands ``(dY, dY^T, X^T)`` of the layer's backward
    (each ``(codes, scales, tensor scale)``, or an FP4Tensor), NVFP4.  Each must agree with the recipe on
    all but :data:`AGREE` of its elements: quantizing a rotation computed in fp32 instead of bf16 moves a
    few codes, a recipe's mistake a large share of them."""
    question, name = "q5", "fp4_backward_operands"
    dev = default_device()
    x, dy, seeds, signs = backward_inputs() if inputs is None else inputs
    out = call_student(fn, x.to(dev), dy.to(dev), seeds, signs.to(dev), name=name, question=question)
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise AssertionError(f"{question}: {name} must return three quantized operands (dY, dY^T, X^T), "
                             f"got {type_name(out)}")  # fmt: skip
    got = {}
    for role, o, shape in zip(("dY", "dY^T", "X^T"), out, (dy.shape, dy.t().shape, x.t().shape), strict=True):
        t = _as_fp4(o, "nvfp4", question, f"{name}'s {role}")
        if tuple(t.q.shape) != (shape[0], shape[1] // 2):
            raise AssertionError(f"{question}: {role} must be quantized along its own K: packed codes of shape "
                                 f"{(shape[0], shape[1] // 2)}, got {tuple(t.q.shape)}")  # fmt: skip
        got[role] = t
    x, dy, signs = x.to(dev), dy.to(dev), signs.to(dev)
    want = backward_reference(x, dy, seeds, signs)
    problems = []
    for role in want:
        if _differ(got[role], want[role]) <= AGREE:
            continue
        problems.append(f"{role}: {_diagnose_backward(role, got[role], x, dy, seeds, signs)}")
    if problems:
        raise AssertionError(f"{question}: {name} is wrong\n" + "\n".join(f"  - {p}" for p in problems))
    print(f"{question} passed: dY, dY^T and X^T as the recipe quantizes them")


def _diagnose_backward(role, got, x, dy, seeds, signs) -> str:
    """Which mistake ``got`` (operand ``role`` of q5) looks like."""

    def quant(t, seed=None):
        kw = {"stochastic_rounding": seed is not None, "seed": seed or 0}
        return fp4.quantize_fp4_reference(t.contiguous(), "nvfp4", **kw)

    def rot(t):
        return hadamard.hadamard_rotate(t.contiguous(), 16, signs)

    wide = {"dY": dy, "dY^T": dy.t(), "X^T": x.t()}[role]
    seed = {"dY": seeds[0], "dY^T": seeds[1], "X^T": None}[role]
    rotate = role != "dY"
    want_in = rot(wide) if rotate else wide
    smells = []
    if seed is not None:
        smells.append((quant(want_in), "rounded to nearest: the recipe rounds gradients stochastically "
                       "(stochastic_rounding=True, with the seed given for this operand)"))  # fmt: skip
        other = seeds[1] if role == "dY" else seeds[0]
        smells.append((quant(want_in, other), "quantized with the other operand's seed: dY takes seeds[0], "
                       "dY^T seeds[1]"))  # fmt: skip
    if rotate:
        smells.append((quant(wide, seed), "not rotated: the RHT applies to both wgrad operands, dY^T and X^T, "
                       "with the same signs (rotating one changes the product)"))  # fmt: skip
        across = rot(wide.t().contiguous()).t()  # rotated along the features, then transposed
        smells.append((quant(across, seed), "rotated along the features: the RHT runs along the wgrad's K, "
                       "the tokens (rotate the transposed tensor)"))  # fmt: skip
        codes = fp4.dequantize_fp4_reference(quant(wide.t())).to(wide.dtype).t()  # from the forward's codes
        smells.append((quant(rot(codes), seed), "made from FP4 codes transposed: quantize the wide (bf16) "
                       "transposed tensor, whose blocks run along the tokens"))  # fmt: skip
    else:
        smells.append((quant(rot(wide), seed), "rotated: the RHT belongs to the wgrad's operands only; dgrad's "
                       "dY keeps its values"))  # fmt: skip
    for candidate, message in smells:
        if _differ(got, candidate) <= AGREE:
            return message
    return f"{100 * _differ(got, quant(want_in, seed)):.0f}% of its elements differ from the recipe's"


__all__ = [
    "backward_inputs",
    "backward_reference",
    "check_dequantize",
    "check_fp4_backward",
    "check_hadamard",
    "check_quantize",
    "check_w4a16",
    "diagnose_quantizer",
    "fresh_activations",
    "fresh_gemm_inputs",
    "fresh_quantizer_inputs",
    "gemm_inputs",
    "quantizer_inputs",
]
