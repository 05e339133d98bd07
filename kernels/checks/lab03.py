"""Checks for Lab 3, hazards: stochastic rounding, accumulators, the FP8 accumulator, five bugs.

* q1 :func:`check_stochastic_round`: ``fn(x, fmt, seed)`` (fp32 tensor, "bf16" or "e4m3fn", int) ->
  tensor of that format.  Reproducible for a seed, different for another, every result a neighbour
  of its input, specials as the hardware conversion; and unbiased: a statistical test on the means of
  1024 roundings of each of ~100 values, which a biased rounding fails.
* q2 :func:`check_accumulate`: ``fn(a, b, acc, compensated)`` -> fp32 row dot products; the error
  against float64 must look like the accumulator asked for (fp32 tiny, bf16 and fp16 clearly larger),
  and compensation must cut it down.
* q3 :func:`check_fp8_promotion`: ``fn(a, b, promote_every)`` -> fp32 ``a @ b`` of e4m3fn operands
  with a chunked fp32 promotion; designed inputs whose answer depends on where the promotions are.
* q4-q8, the bugs, fixed: :func:`check_row_mean`, :func:`check_softmax`, :func:`check_quantize`,
  :func:`check_variance`, :func:`check_to_bf16`.  Each runs the inputs on which the broken kernel
  shows its smell, and names the smell if it is still there.

The truth is computed (float64, the package's kernels and references), never typed in; inputs are
fixed, so pass lines print the same on every machine.
"""

import math

import numpy as np
import torch

from kernels import accumulate, formats, stochastic
from kernels.checks import call_student, type_name
from kernels.device import default_device
from kernels.testing import bits


def _tensor(out, question, dtype, shape, what):
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{question}: {what} must return a torch.Tensor, got {type_name(out)}")
    if out.dtype != dtype or tuple(out.shape) != tuple(shape):
        raise AssertionError(
            f"{question}: {what} returned {out.dtype} of shape {tuple(out.shape)}, want {dtype} of shape {tuple(shape)}"
        )
    return out


# -- q1: stochastic rounding --------------------------------------------------------------------------

SR_FORMATS = ("bf16", "e4m3fn")
SR_COPIES = 512  # roundings of each value per call; two seeds make 1024
SR_SEEDS = (11, 12)
Z_LIMIT = 5.0  # |z| of a mean of 1024 correct roundings exceeds 5 with probability 6e-7
_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 3 / 4, 7 / 8, 15 / 16, 0.01, 0.99)


def sr_values(fmt: str) -> np.ndarray:
    """float64 values between neighbours lo and hi of ``fmt`` at fixed fractions ``(x - lo) / (hi - lo)``:
    in several binades, negative, in the subnormal range and just below a power of two; each rounded
    to fp32 (the fraction moves by < 2^-10 of a step, the test uses the exact fp32 value)."""
    f = formats.get(fmt)
    m = f.mantissa_bits
    out = []
    binades = (0, 3, -5) if fmt == "bf16" else (0, 3, -4)
    for e in binades:
        step = 2.0 ** (e - m)
        for k, frac in enumerate(_FRACTIONS):
            lo = 2.0**e + (k % (2**m)) * step
            out.append(lo + frac * step)
    top = 4 if fmt == "bf16" else 2  # just below 2^top: hi is the first value of the next binade
    for frac in (1 / 4, 1 / 2, 3 / 4):
        out.append(2.0**top - 2.0 ** (top - 1 - m) * (1 - frac))
    sub = 2.0 ** (1 - f.bias - m)  # the smallest subnormal step
    for frac in (1 / 4, 1 / 2, 3 / 4):
        out.append((3 + frac) * sub)
    values = np.array(out, dtype=np.float64)
    values = np.concatenate([values, -values[::3]])
    return values.astype(np.float32)


def sr_fresh_values(fmt: str, seed: int, n: int) -> np.ndarray:
    """``n`` fp32 values drawn from ``seed``, each strictly between neighbours lo < hi of ``fmt`` at a
    fraction ``(x - lo) / (hi - lo)`` in [1/16, 15/16], exact in fp32: lo uniform over the format's
    non-negative values below its largest (a quarter of them among zero and the subnormals), either sign."""
    grid = formats.decode(formats.all_codes(formats.get(fmt)), formats.get(fmt)).double()
    grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)]).numpy()
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 2 ** formats.get(fmt).mantissa_bits, size=n)
    i = np.where(rng.random(n) < 0.25, low, rng.integers(0, grid.size - 1, size=n))
    frac = rng.integers(1 << 12, 15 << 12, size=n, endpoint=True) / 2.0**16
    x = grid[i] + frac * (grid[i + 1] - grid[i])
    return (np.where(rng.random(n) < 0.5, -x, x)).astype(np.float32)


def _sr_specials(fmt: str) -> dict:
    specials = {
        "zero": 0.0,
        "negative zero": -0.0,
        "exact 1.0": 1.0,
        "exact -3.0": -3.0,
        "largest finite": formats.properties_from_fields(fmt).max_finite,
        "inf": math.inf,
        "-inf": -math.inf,
        "NaN": math.nan,
    }
    if fmt == "e4m3fn":
        specials["500"] = 500.0  # beyond the largest finite value: saturates to 448
    return specials


def _v(x) -> str:
    return f"{float(x):.9g}"


def check_stochastic_round(fn, seeds=SR_SEEDS, values=None, interleave=False) -> None:
    """q1: ``fn(x, fmt, seed)`` rounds fp32 ``x`` stochastically to bf16 / e4m3fn.

    ``values`` ({format: fp32 values strictly between neighbours}, default :func:`sr_values`) are each
    rounded ``SR_COPIES`` times per seed: each value's copies one after another, or with ``interleave``
    the whole set repeated ``SR_COPIES`` times, so that every block of a launch holds copies of each."""
    question, name = "q1", "stochastic_round"
    dev = default_device()
    lines = []
    total_values = 0
    given = values
    for fmt in SR_FORMATS:
        dtype = formats.TORCH_DTYPES[fmt]
        values = sr_values(fmt) if given is None else given[fmt]
        specials = _sr_specials(fmt)
        special_x = np.array(list(specials.values()), dtype=np.float32)
        copies = np.tile(values, SR_COPIES) if interleave else np.repeat(values, SR_COPIES)
        x_np = np.concatenate([copies, special_x])
        x = torch.from_numpy(x_np).to(dev)
        outs = []
        for seed in seeds:
            out = _tensor(call_student(fn, x, fmt, seed, name=name, question=question), question, dtype, x.shape, name)
            outs.append(out.detach().cpu().float().double())
        few = x[: 4 * SR_COPIES]
        first = call_student(fn, few, fmt, seeds[0], name=name, question=question)
        again = call_student(fn, few, fmt, seeds[0], name=name, question=question)
        if not np.array_equal(bits(again), bits(first)):
            raise AssertionError(
                f"{question} ({fmt}): two calls with the same seed gave different results: not reproducible "
                f"(draw the random bits with tl.randint(seed, offsets) inside the kernel)"
            )
        n = values.size * SR_COPIES
        # specials, checked against what the hardware conversion does with them
        want_sp = formats.hardware_encode(torch.from_numpy(special_x).to(dev), fmt).cpu().double()
        got_sp = outs[0][n:]
        for i, label in enumerate(specials):
            g, w = got_sp[i].item(), want_sp[i].item()
            same = (math.isnan(g) and math.isnan(w)) or (g == w and math.copysign(1, g) == math.copysign(1, w))
            if not same:
                hint = {
                    "NaN": "a NaN must stay NaN: test for it on the input (|bits| > 0x7F800000) and store the NaN code",
                    "500": "e4m3fn has no inf: clip |x| to 448 before rounding, as the hardware conversion does",
                    "inf": "inf saturates to 448 in e4m3fn; in bf16 it stays inf",
                    "-inf": "-inf saturates to -448 in e4m3fn; in bf16 it stays -inf",
                }.get(
                    label,
                    "an exactly representable value must come back unchanged: the random bits go below "
                    "the kept bits only",
                )
                lines.append(f"{question} ({fmt}): {label}: {_v(specials[label])} -> {_v(g)}, want {_v(w)}: {hint}")
        if lines:
            break
        s = torch.stack([o[:n] for o in outs])
        if interleave:
            s = s.reshape(len(seeds), SR_COPIES, values.size).transpose(1, 2)
        else:
            s = s.reshape(len(seeds), values.size, SR_COPIES)
        xv = torch.from_numpy(values.astype(np.float64))
        lo, hi = stochastic.neighbours(torch.from_numpy(values), fmt)
        up = (s == hi[None, :, None]).double()
        constant = (s == s[:, :, :1]).all(dim=2)  # (seeds, values): every copy rounded alike
        if bool(constant.all()) and not torch.equal(s[0], s[-1]):
            lines.append(
                f"{question} ({fmt}): every copy of a value rounds the same way within one call, but the seed changes "
                f"it: one random number for all elements; pass the element offsets to tl.randint(seed, offsets)"
            )
            break
        if torch.equal(s[0], s[-1]):
            if bool(constant.all()):
                near = torch.where((xv - lo) < (hi - xv), lo, hi)
                tie = (xv - lo) == (hi - xv)
                rne = bool(((s[0, :, 0] == near) | tie).all())
                what = "rounds to nearest" if rne else "always rounds the same way"
                lines.append(
                    f"{question} ({fmt}): deterministic: every copy of every value gives the same result, whatever "
                    f"the seed; it {what}, which is biased (e.g. {_v(values[0])} -> {_v(s[0, 0, 0])} every time)"
                )
            else:
                lines.append(
                    f"{question} ({fmt}): the seed changes nothing: two seeds gave identical results "
                    f"(use the seed argument in tl.randint)"
                )
            break
        is_neighbour = (s == lo[None, :, None]) | (s == hi[None, :, None])
        if not bool(is_neighbour.all()):
            idx = torch.nonzero(~is_neighbour)[0].tolist()
            v, got = values[idx[1]], s[tuple(idx)].item()
            lines.append(
                f"{question} ({fmt}): results that are not a neighbour of their input: {_v(v)} -> {_v(got)}, want "
                f"{_v(lo[idx[1]])} or {_v(hi[idx[1]])}: add random bits only below the bits the format keeps "
                f"(as many as it drops), then truncate"
            )
            break
        samples = s.permute(0, 2, 1).reshape(-1, values.size)  # (seeds * copies, values)
        z = stochastic.unbiasedness_z(samples, torch.from_numpy(values), fmt)
        total_values += values.size
        bad = z.abs() > Z_LIMIT
        if bool(bad.any()):
            sign = torch.sign(z) * torch.sign(xv)
            worst = int(torch.argmax(z.abs()))
            p_want = ((xv - lo) / (hi - lo))[worst].item()
            p_got = up.mean(dim=(0, 2))[worst].item()
            if bool((sign[bad] < 0).all()):
                bias = "biased toward zero"
            elif bool((sign[bad] > 0).all()):
                bias = "biased away from zero"
            else:
                bias = "biased"
            lines.append(
                f"{question} ({fmt}): {bias}: the means of 1024 roundings miss the input by more than {Z_LIMIT:g} "
                f"standard errors for {int(bad.sum())} of {values.size} values; worst {_v(values[worst])}: rounded up "
                f"{p_got:.4f} of the time, want (x - lo) / (hi - lo) = {p_want:.4f} (z = {z[worst].item():+.1f}). "
                f"The noise must be uniform over exactly the dropped bits"
            )
            break
    if lines:
        raise AssertionError("\n".join(lines))
    print(
        f"{question} passed: reproducible, every result a neighbour, specials as the hardware conversion; unbiased: "
        f"{total_values} values x {SR_COPIES * len(seeds)} roundings, every mean within {Z_LIMIT:g} standard errors "
        f"(bf16 and e4m3fn)"
    )


# -- q2: accumulators -----------------------------------------------------------------------------

ACC_M, ACC_KS = 13, (100, 2051)
# Errors relative to sum|a_k b_k| that each accumulator must stay within, or exceed, at K = 2051 with
# products in [0, 1), 16 lanes: kernels.accumulate.dot gives, over three seeds, fp32 0.9-1.3e-7,
# bf16 1.1-1.6e-2, fp16 4.3-11e-4; compensated 0.9-1.0e-7, 1.8-2.4e-4, 1.5-1.8e-5.  Margins of 4x or
# more either way.
TL_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
ACC_BOUNDS = {
    # acc: (plain at least, plain at most, compensated at most)
    "fp32": (0.0, 1e-6, 1e-6),
    "bf16": (1e-3, 0.1, 2e-3),
    "fp16": (1e-4, 8e-3, 1e-4),
}


def accumulate_inputs(k: int, seed: int = 3, m: int = ACC_M) -> tuple:
    """bf16 (m, k) operands in [0, 1): positive products, so partial sums only grow (the hard case)."""
    g = torch.Generator().manual_seed(seed + k)
    a = torch.rand((m, k), generator=g).to(torch.bfloat16)
    b = torch.rand((m, k), generator=g).to(torch.bfloat16)
    return a, b


def check_accumulate(fn, m=ACC_M, ks=ACC_KS, seed=3, accs=tuple(ACC_BOUNDS)) -> None:
    """q2: ``fn(a, b, acc, compensated)`` -> fp32 (M,) row dot products with the asked accumulator.

    ``m`` rows, each ``k`` of ``ks`` long, drawn from ``seed``; every accumulator of ``accs``, plain and
    compensated.  The fp32 error is bounded at every K, the others' at the last K (``ACC_BOUNDS``)."""
    question, name = "q2", "dot"
    dev = default_device()
    errors = {}
    for k in ks:
        a, b = accumulate_inputs(k, seed, m)
        for acc in accs:
            for comp in (False, True):
                out = _tensor(
                    call_student(fn, a.to(dev), b.to(dev), acc, comp, name=name, question=question),
                    question,
                    torch.float32,
                    (m,),
                    name,
                )
                if not bool(torch.isfinite(out).all()):
                    raise AssertionError(f"{question}: acc={acc} compensated={comp} K={k}: non-finite results")
                errors[(k, acc, comp)] = accumulate.relative_error(out, a, b).max().item()
    lines = []
    for k in ks if "fp32" in accs else ():
        e = errors[(k, "fp32", False)]
        if e > ACC_BOUNDS["fp32"][1]:
            lines.append(
                f"{question}: fp32 accumulator, K={k}: error {e:.2e} of sum|ab|, far beyond fp32 rounding: a wrong sum "
                f"(do masked loads beyond K give 0? is every row and every element counted once?)"
            )
    if not lines:
        k = ks[-1]
        for acc in [other for other in accs if other != "fp32"]:
            low, high, comp_high = ACC_BOUNDS[acc]
            plain, comp = errors[(k, acc, False)], errors[(k, acc, True)]
            if plain < low:
                lines.append(
                    f"{question}: acc='{acc}', K={k}: error {plain:.2e} is what a wider accumulator gives (want at "
                    f"least {low:.0e}): the running sum must be stored in {acc} "
                    f"(tl.zeros(..., dtype=tl.{TL_NAMES[acc]}) and the products cast to it before adding)"
                )
            elif plain > high:
                lines.append(
                    f"{question}: acc='{acc}', K={k}: error {plain:.2e} is more than a {acc} accumulator loses "
                    f"(at most {high:.0e}): is the accumulator narrower than asked (bf16 for fp16?)"
                )
            if low <= plain <= high and (comp > comp_high or comp > plain / 8):
                worse = " (worse than without it: is the correction's sign right? c = (t - s) - y, y = p - c)"
                lines.append(
                    f"{question}: acc='{acc}', compensated, K={k}: error {comp:.2e} against {plain:.2e} without "
                    f"compensation: Kahan should cut it by far more{worse if comp > plain else ''}"
                )
    if lines:
        raise AssertionError("\n".join(lines))
    k = ks[-1]
    summary = ", ".join(f"{acc} {errors[(k, acc, False)]:.1e} -> {errors[(k, acc, True)]:.1e}" for acc in accs)
    print(f"{question} passed: error / sum|ab| at K={k}, plain -> compensated: {summary}")


# -- q3: the FP8 accumulator's promotion ------------------------------------------------------------

PROMOTION_CASES = (128, None, 64, 256)


def promotion_inputs(m: int = 64, n: int = 64) -> tuple:
    """e4m3fn (m, 512) and (512, n) operands whose fp32 answer depends on where partial sums are
    promoted: K 0..127 sum to 2^23; every 32-block after it holds one product of 0.25.  Promoted every
    128, each later chunk adds 1.0 (exact) to 2^23; any chain that adds 0.25 or 0.5 at a time to 2^23
    loses it (half a step or less at 2^23 rounds to 2^23, on the CPU and on Hopper alike)."""
    a = torch.zeros((m, 512))
    b = torch.zeros((512, n))
    a[:, :128] = 2.0**8
    b[:128, :] = 2.0**8  # 128 products of 2^16: 2^23
    small = torch.arange(128, 512, 32)
    a[:, small] = 0.5
    b[small, :] = 0.5  # one product of 0.25 per 32-block
    return a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)


def check_fp8_promotion(fn, m=64, n=64, k=300, seed=5) -> None:
    """q3: ``fn(a, b, promote_every)`` -> fp32 ``a @ b`` (BLOCK_K = 32), promoted every ``promote_every``.

    The products are (m, 512) @ (512, n) on the designed inputs and (m, k) @ (k, n) random ones from ``seed``."""
    question, name = "q3", "fp8_matmul"
    dev = default_device()
    a, b = promotion_inputs(m, n)
    lines = []
    for pe in PROMOTION_CASES:
        out = _tensor(
            call_student(fn, a.to(dev), b.to(dev), pe, name=name, question=question),
            question,
            torch.float32,
            (m, n),
            name,
        )
        want = accumulate.fp8_matmul_reference(a, b, pe, block_k=32)
        got = out.detach().cpu()
        if not torch.equal(got, want):
            g, w = got[0, 0].item(), want[0, 0].item()
            extra, expected = g - 2.0**23, w - 2.0**23
            if g == w:
                i, j = torch.nonzero(got != want)[0].tolist()
                hint = (
                    f"right at [0, 0] but {got[i, j].item():.9g} at [{i}, {j}], want {want[i, j].item():.9g}: is every "
                    f"tile of the output computed, with its own rows and columns (program ids, strides, masks)?"
                )
            elif pe is None:
                hint = (
                    "with promote_every=None the whole K must be one tl.dot chain (acc = tl.dot(a, b, acc)): "
                    f"here the 0.25s survived ({extra:+g}): are partial sums promoted anyway?"
                    if extra > 0
                    else "with promote_every=None the whole K is one tl.dot chain"
                )
            elif extra == 0:
                hint = (
                    f"the small partial sums were lost (2^23 {extra:+g}, want 2^23 {expected:+g}): no promotion "
                    f"every {pe}: start a fresh partial (tl.zeros) for each run of {pe} K-elements, accumulate it "
                    f"with tl.dot, then add it into the fp32 accumulator"
                )
            else:
                hint = (
                    f"2^23 {extra:+g}, want 2^23 {expected:+g}: the promotions are not every {pe} K-elements "
                    f"(BLOCK_K must be 32, the chunk promote_every)"
                )
            lines.append(f"{question}: promote_every={pe}: {hint}")
    if not lines:
        ar, br = accumulate.random_fp8(m, k, n, seed=seed)  # K = 300 (or k): not a multiple of the chunk
        for pe in (None, 128):
            out = _tensor(
                call_student(fn, ar.to(dev), br.to(dev), pe, name=name, question=question),
                question,
                torch.float32,
                (m, n),
                name,
            )
            err = accumulate.matmul_error(out, ar, br)
            # Unpromoted, Hopper's FP8 accumulator alone costs ~4e-3 of sum|ab| at K = 300 (measured on an
            # H200, and what CPU mode's model of it gives); a K masked or padded wrongly costs O(1).
            limit, shown = (2.0**-8, "2^-8") if pe else (2.0**-6, "2^-6")
            if err > limit:
                lines.append(
                    f"{question}: promote_every={pe}, random K={k}: error {err:.2e} of sum|ab| (> {shown}): is K "
                    f"padded with zeros (or masked) to a multiple of the chunk?"
                )
    if lines:
        raise AssertionError("\n".join(lines))
    print(
        f"{question} passed: promotions where asked (every 128, 64, 256, never) on the designed inputs; "
        f"random K={k} right"
    )


# -- q4-q8: the bugs ----------------------------------------------------------------------------------


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    with np.errstate(invalid="ignore"):
        r = (g - w).abs() / w.abs().clamp(min=1e-30)
    return math.inf if bool(torch.isnan(r).any()) else float(r.max())


def row_mean_inputs(n: int, m: int = 8, seed: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(n if seed is None else seed + n)
    return (torch.rand((m, n), generator=g) + 1).to(torch.bfloat16)  # values in [1, 2): sums grow


def check_row_mean(fn, sizes=(256, 32768), m=8, seed=None) -> None:
    """q4: ``fn(x)``: bf16 (M, N) -> fp32 row means, to 1e-5 at N = 256 and N = 32768 (``sizes``, a
    short N and a long one; ``m`` rows drawn from ``seed``, by default from N)."""
    question, name = "q4", "row_mean"
    dev, errs = default_device(), {}
    short, long = sizes
    for n in sizes:
        x = row_mean_inputs(n, m, seed)
        out = _tensor(call_student(fn, x.to(dev), name=name, question=question), question, torch.float32, (m,), name)
        errs[n] = _rel(out, x.double().mean(dim=1))
    if errs[long] > 1e-5:
        grows = errs[long] > 10 * max(errs[short], 1e-7)
        smell = (
            f"error grows with N (N={short}: {errs[short]:.1e}, N={long}: {errs[long]:.1e}): right at 1e-1, not "
            f"at 1e-2: the running sum is narrower than fp32 and stops growing once it dwarfs the terms; accumulate "
            f"in fp32"
            if grows
            else f"relative error {errs[long]:.1e} at N={long} and {errs[short]:.1e} at N={short}"
        )
        raise AssertionError(f"{question}: {smell}")
    if errs[short] > 1e-5:
        raise AssertionError(f"{question}: relative error {errs[short]:.1e} at N={short} (want 1e-5)")
    print(f"{question} passed: row means within {max(errs.values()):.1e} of float64 at N={short} and N={long}")


def softmax_inputs(n: int, shift: float, m: int = 4, seed: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(n if seed is None else seed + n)
    return torch.randn((m, n), generator=g) + shift


def check_softmax(fn, sizes=(128, 100), shifts=(0.0, -200.0), m=4, seed=None) -> None:
    """q5: ``fn(x)``: fp32 (M, N) -> row softmax, to 1e-6 for N = 128 and N = 100, logits near 0 or -200
    (``sizes``, ``shifts``; ``m`` rows drawn from ``seed``, by default from N)."""
    question, name = "q5", "softmax"
    from kernels import hazards

    dev = default_device()
    bad = {}
    for n in sizes:
        for shift in shifts:
            x = softmax_inputs(n, shift, m, seed)
            out = _tensor(
                call_student(fn, x.to(dev), name=name, question=question), question, torch.float32, x.shape, name
            )
            got = out.detach().cpu().double()
            err = (got - hazards.softmax_reference(x).double()).abs().max().item()
            if not err <= 1e-6:
                bad[(n, shift)] = (err, got)
    if bad:
        lines = []
        padded_only = all(n & (n - 1) for n, _ in bad) and any(not n & (n - 1) for n in sizes)
        for (n, shift), (err, got) in bad.items():
            sums = got.sum(dim=1)
            if bool((got == 0).all()):
                smell = "all zeros"
            elif bool(torch.isnan(got).any()):
                smell = "NaN"
            else:
                smell = f"rows sum to {sums.min().item():.4g}..{sums.max().item():.4g}"
            lines.append(f"N={n}, logits around {shift:g}: {smell} (max error {err:.2e})")
        hint = (
            "wrong only when N is not a power of two, i.e. when padded lanes exist: they join the max and the sum. "
            "Padded lanes must load -inf (other=-float('inf')), which exp() turns into 0"
            if padded_only
            else "wrong even without padded lanes: compare with softmax_reference"
        )
        raise AssertionError(f"{question}: " + "; ".join(lines) + f". {hint}")
    print(
        f"{question} passed: softmax within 1e-6 of float64 for {' and '.join(f'N={n}' for n in sizes)}, "
        f"logits {' and '.join(f'near {shift:g}' for shift in shifts)}"
    )


def quantize_inputs(amax: float, n: int = 1000, seed: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(-math.log10(amax) * 7) + 50 + (0 if seed is None else seed))
    x = torch.randn(n, generator=g)
    return x / x.abs().max() * amax


def _amount(v: float) -> str:
    """1e-3, 1, 1e4, 2.5e-5: a magnitude as the lab writes it."""
    mantissa, exponent = f"{v:e}".split("e")
    return f"{float(mantissa):g}" + (f"e{int(exponent)}" if int(exponent) else "")


def check_quantize(fn, amaxes=(1e-3, 1.0, 1e4), n=1000, seed=None) -> None:
    """q6: ``fn(x)`` -> (q e4m3fn, scale) with ``x ~= q * scale``, for tensors of amax 1e-3, 1 and 1e4
    (``amaxes``; ``n`` values drawn from ``seed``, by default from the amax)."""
    question, name = "q6", "quantize_fp8"
    dev = default_device()
    lines = []
    for amax in amaxes:
        x = quantize_inputs(amax, n, seed)
        out = call_student(fn, x.to(dev), name=name, question=question)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{question}: {name} must return (q, scale), got {type_name(out)}")
        q, scale = out
        _tensor(q, question, torch.float8_e4m3fn, x.shape, f"{name}'s q")
        s = float(scale)
        back = q.detach().cpu().double() * s
        x64 = x.double()
        # half a step of e4m3 (2^-4 relative) plus half its subnormal step at this scale
        ok = (back - x64).abs() <= 2.0**-4 * x64.abs() + 2.0**-10 * s * 1.0001
        if bool(ok.all()):
            continue
        if not math.isfinite(s) or s <= 0:
            smell = f"scale {s:g}: want amax / 448 = {amax / 448:.4g}"
        elif int((back == 0).sum()) > x.numel() // 2:
            smell = f"{int((back == 0).sum())} of {x.numel()} values came back as zero"
        elif back.abs().max().item() < 0.9 * amax:
            smell = f"clipped: the largest value came back as {back.abs().max().item():.4g}, want about {amax:g}"
        else:
            smell = f"{int((~ok).sum())} values off by more than half an e4m3 step"
        lines.append(f"amax {amax:g}: {smell}")
    if lines:
        scale_hint = (
            " The scale must be applied before the cast: q = (x * (448 / amax)).to(e4m3); cast first and small "
            "values flush to zero, large ones clip at 448, before any scale can help."
        )
        raise AssertionError(f"{question}: " + "; ".join(lines) + "." + scale_hint)
    shown = ", ".join(map(_amount, amaxes[:-1])) + f" and {_amount(amaxes[-1])}"
    print(f"{question} passed: q * scale within half an e4m3 step of x for amax {shown}")


def variance_inputs(n: int, m: int = 4, seed: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(n + (9 if seed is None else seed))
    return (torch.randn((m, n), generator=g) + 3).to(torch.float16)


def check_variance(fn, sizes=(1000, 32768), m=4, seed=None) -> None:
    """q7: ``fn(x)``: fp16 (M, N) -> fp32 row variances, to 1e-4 at N = 1000 and N = 32768 (``sizes``, a
    short N and a long one; ``m`` rows drawn from ``seed``, by default from N)."""
    question, name = "q7", "variance"
    dev, errs, outs = default_device(), {}, {}
    short, long = sizes
    for n in sizes:
        x = variance_inputs(n, m, seed)
        out = _tensor(call_student(fn, x.to(dev), name=name, question=question), question, torch.float32, (m,), name)
        outs[n] = out.detach().cpu()
        errs[n] = _rel(out, x.double().var(dim=1, unbiased=False))
    if not errs[long] <= 1e-4:
        if bool(torch.isnan(outs[long]).any()) and not bool(torch.isnan(outs[short]).any()):
            smell = (
                f"NaN only at large N (N={long}; fine at N={short}): the sums overflowed fp16's 65504 to inf, and "
                "inf - inf is NaN. Promote x to fp32 before summing"
            )
        elif bool(torch.isinf(outs[long]).any()):
            smell = f"inf at N={long}: a sum overflowed; promote x to fp32 before summing"
        else:
            smell = f"relative error {errs[long]:.1e} at N={long} (fp16 sums lose digits: promote before summing)"
        raise AssertionError(f"{question}: {smell}")
    if not errs[short] <= 1e-4:
        raise AssertionError(
            f"{question}: relative error {errs[short]:.1e} at N={short}: E[x^2] - E[x]^2 cancels; fp16 sums keep "
            f"too few digits for it. Promote x to fp32 before summing"
        )
    print(f"{question} passed: variances within {max(errs.values()):.1e} of float64 at N={short} and N={long}")


def to_bf16_inputs() -> torch.Tensor:
    """Random values, exact ties between bf16 neighbours (both parities), NaN, +-inf, overflow."""
    g = torch.Generator().manual_seed(8)
    r = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-20, 20, (4096,), generator=g)).float()
    hi = (torch.randint(0x3F80, 0x4100, (512,), generator=g) << 16) | 0x8000  # exact ties
    ties = hi.to(torch.int32).view(torch.float32)
    special = torch.tensor([math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 0.0, -0.0, 1e-40])
    return torch.cat([r, ties, -ties, special])


def to_bf16_fresh_inputs(seed: int, n: int) -> torch.Tensor:
    """Lab 0's hand-picked fp32 patterns (NaN payloads in either half, ties at the overflow threshold and
    among subnormals, ...), then ``n`` fresh ones drawn from ``seed``
    (:func:`kernels.checks.fresh.fresh_fp32`)."""
    from kernels.checks import lab00
    from kernels.checks.fresh import fresh_fp32

    patterns = np.concatenate([np.array(list(lab00.SPECIALS), dtype=np.uint32), fresh_fp32(seed, n).bits])
    return torch.from_numpy(patterns.view(np.float32).copy())


def check_to_bf16(fn, x: torch.Tensor | None = None, shape: tuple | None = None) -> None:
    """q8: ``fn(x)``: fp32 -> bf16, bit for bit as the hardware conversion (nearest even, NaN 0x7FFF).

    ``x`` (default :func:`to_bf16_inputs`) is passed as one tensor of ``shape`` (default 1-D)."""
    question, name = "q8", "to_bf16"
    dev = default_device()
    x = (to_bf16_inputs() if x is None else x).reshape(-1)
    arg = x.reshape(shape if shape is not None else -1).to(dev)
    out = _tensor(call_student(fn, arg, name=name, question=question), question, torch.bfloat16, arg.shape, name)
    got = bits(out).astype(np.int64).reshape(-1)
    want = bits(formats.hardware_encode(x.to(dev), "bf16")).astype(np.int64)
    bad = got != want
    if not bad.any():
        print(f"{question} passed: {x.numel()}/{x.numel()} bit-identical to the hardware conversion")
        return
    xb = bits(x).astype(np.int64)
    trunc = xb >> 16
    finite = np.isfinite(x.numpy())
    g64, x64 = out.detach().cpu().double().numpy().reshape(-1), x.double().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        toward_zero = np.abs(g64) <= np.abs(x64)
    if np.array_equal(got[bad & finite], trunc[bad & finite]) and toward_zero[finite].all():
        with np.errstate(invalid="ignore", divide="ignore"):
            ulp_err = np.mean((np.abs(g64) - np.abs(x64))[finite & (x64 != 0)] / np.abs(x64[finite & (x64 != 0)]))
        smell = (
            f"biased toward zero: |result| <= |x| for every input (mean relative error {ulp_err:.1e}, always "
            f"negative): the top 16 bits were kept, which truncates. Use x.to(tl.bfloat16), which rounds to "
            f"nearest even"
        )
    else:
        i = int(np.flatnonzero(bad)[0])
        smell = f"{int(bad.sum())} of {x.numel()} differ, e.g. {_v(x[i])} -> 0x{got[i]:04X}, want 0x{want[i]:04X}"
    raise AssertionError(f"{question}: {smell}")


__all__ = [
    "ACC_BOUNDS",
    "SR_FORMATS",
    "Z_LIMIT",
    "accumulate_inputs",
    "check_accumulate",
    "check_fp8_promotion",
    "check_quantize",
    "check_row_mean",
    "check_softmax",
    "check_stochastic_round",
    "check_to_bf16",
    "check_variance",
    "promotion_inputs",
    "sr_fresh_values",
    "sr_values",
    "to_bf16_fresh_inputs",
]
