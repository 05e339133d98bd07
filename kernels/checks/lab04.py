"""Checks for Lab 4, automatic mixed precision: unscale, the loss scaler, RMSNorm, the training step.

* q1 :func:`check_unscale`: ``fn(grads, found_inf, inv_scale)``, the student's fused Triton unscale,
  bit for bit against ``torch._amp_foreach_non_finite_check_and_unscale_`` on a fixed list of
  gradients (mixed sizes and dtypes, adversarial values), with and without inf/NaN.
* q2 :func:`check_scaler`: a loss-scaler class with GradScaler's interface (``scale``, ``unscale_``,
  ``step``, ``update``, ``get_scale``, ``state_dict``, ``load_state_dict``), run side by side with
  ``torch.amp.GradScaler`` on a scripted sequence of clean and overflowing steps.
* q3 :func:`check_rmsnorm`: ``forward(x, w, eps) -> (y, rstd)`` and ``backward(dy, x, w, rstd) ->
  (dx, dw)``, against an fp64 reference, with the output rounded once to the input's dtype.
* q4 :func:`check_train_step`: ``step(model, optimizer, scaler, inputs, targets, autocast_dtype,
  max_norm) -> (loss, skipped)``, against :func:`kernels.charmodel.train_step` on twin models.

The truth is computed by torch or by :mod:`kernels.amp` (itself tested against torch), never typed in;
the inputs are fixed, so pass lines print the same counts on every machine.  A failing check names
the numerical smell it sees: found_inf not set, scale not backed off, growth counter not reset,
statistics kept in bf16, gradients clipped while still scaled, and so on.
"""

import copy
import math

import numpy as np
import torch

from kernels import amp, charmodel
from kernels.checks import call_student, is_class, student_side, type_name
from kernels.device import default_device
from kernels.testing import bits

# -- q1: the fused unscale ------------------------------------------------------------------------------


UNSCALE_SHAPES = ((1,), (7,), (127,), (1000 + 3,), (4096 + 5,), (33, 65), (3, 5, 7), (20_001,))
# (what, value, which gradient, which element): where the check poisons a gradient
UNSCALE_PLACEMENTS = (
    ("inf", math.inf, 7, -1),
    ("NaN", math.nan, 0, -1),
    ("NaN", math.nan, 7, -1),
    ("-inf", -math.inf, 4, -1),
)


def _unscale_inputs(seed=4, shapes=UNSCALE_SHAPES):
    """A list of gradients: awkward sizes, fp32/fp16/bf16, values that stress the multiply."""
    g = torch.Generator().manual_seed(seed)
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    grads = []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=g) * [1.0, 3e3, 1e-5, 2.0**-140][i % 4]
        grads.append(x.to(dtypes[i % 3]).to(default_device()))
    return grads


def _run_unscale(fn, grads, inv_scale, found_start=0.0):
    ours = [t.clone() for t in grads]
    ref = [t.clone() for t in grads]
    found = torch.full((), found_start, device=default_device())
    found_ref = torch.full((), found_start, device=default_device())
    inv = torch.tensor(inv_scale, dtype=torch.float32, device=default_device())
    call_student(lambda: fn(ours, found, inv) or True, name="unscale_", question="q1")
    # torch's CUDA kernel refuses bf16 gradients; its CPU kernel takes all three dtypes and gives the
    # same bits (one fp32 multiply, rounded once), so the reference always runs on the CPU.
    ref_cpu, found_cpu = [t.cpu() for t in ref], found_ref.cpu()
    torch._amp_foreach_non_finite_check_and_unscale_(ref_cpu, found_cpu, inv.cpu())
    ref = [t.to(default_device()) for t in ref_cpu]
    return ours, ref, float(found), float(found_cpu)


def _unscale_value_smells(before, got, want, inv_scale) -> list:
    """Which wrong recipe reproduces ``got`` where it differs from ``want``."""
    smells = []
    wide = before.double()
    with np.errstate(all="ignore"):
        candidates = {
            "the gradient was left unchanged (not unscaled in place: write back with tl.store to the same address)": (
                wide
            ),
            "the gradient was divided by inv_scale (multiplied by the scale) instead of multiplied by it": (
                wide / inv_scale
            ),
            "the gradient was unscaled twice": wide * inv_scale * inv_scale,
            "inv_scale was rounded to the gradient's dtype before the multiply (widen to fp32 first)": (
                wide * torch.tensor(inv_scale).to(before.dtype).double()
            ),
        }
    diff = ~(torch.isclose(got.double(), want.double(), rtol=0, atol=0, equal_nan=True))
    for smell, candidate in candidates.items():
        hit = candidate.to(before.dtype).double()
        if diff.any() and bool((torch.isclose(got.double()[diff], hit[diff], rtol=0, atol=0, equal_nan=True)).all()):
            smells.append(smell)
    return smells


def _fail_if(problems):
    if problems:
        unique = list(dict.fromkeys(problems))
        raise AssertionError("q1: unscale_ disagrees with torch:\n  " + "\n  ".join(unique[:8]))


def check_unscale(fn, seed=4, shapes=UNSCALE_SHAPES, scales=(2.0**-16, 1 / 3), placements=UNSCALE_PLACEMENTS) -> None:
    """q1: ``fn(grads, found_inf, inv_scale)`` unscales every gradient in place, bit for bit as torch,
    and sets (never clears) ``found_inf`` when any element is inf or NaN.

    The gradients have ``shapes``, drawn from ``seed``; they are unscaled by each of ``scales``, then
    poisoned one at a time as ``placements`` say."""
    grads = _unscale_inputs(seed, shapes)
    problems, compared = [], 0
    for inv_scale in scales:
        ours, ref, found, found_ref = _run_unscale(fn, grads, inv_scale)
        if found != found_ref:
            problems.append(f"found_inf is {found} on finite gradients: it must stay 0.0 when nothing overflowed")
        for i, (before, a, b) in enumerate(zip(grads, ours, ref, strict=True)):
            compared += a.numel()
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(f"grads[{i}] changed dtype or shape: {a.dtype} {tuple(a.shape)}")
                continue
            nan = torch.isnan(b)
            same = (bits(a) == bits(b)) | nan.cpu().numpy()
            if not same.all():
                bad = np.flatnonzero(~same.ravel())
                j = bad[0]
                smells = _unscale_value_smells(before.cpu(), a.cpu(), b.cpu(), inv_scale)
                problems.append(
                    f"grads[{i}] ({b.dtype}, {b.numel()} elements, inv_scale={inv_scale:.6g}): {bad.size} elements "
                    f"differ, e.g. [{j}] {before.reshape(-1)[j].item():.9g} -> {a.reshape(-1)[j].item():.9g}, "
                    f"want {b.reshape(-1)[j].item():.9g}" + (f"; looks like: {smells[0]}" if smells else "")
                )
        _fail_if(problems)
    _, _, found, _ = _run_unscale(fn, grads, 0.5, found_start=1.0)
    if found != 1.0:
        problems.append(
            f"found_inf was 1.0 before a clean call and {found} after: it must never be cleared (store 1.0 where"
            " an inf/NaN was seen, and nothing elsewhere)"
        )
    _fail_if(problems)
    poisonings = 0
    for kind, value, where, element in placements:
        poisoned = [t.clone() for t in grads]
        poisoned[where].view(-1)[element] = value
        ours, ref, found, _ = _run_unscale(fn, poisoned, 0.5)
        poisonings += 1
        spot = "its last element" if element == -1 else f"element {element} of {poisoned[where].numel()}"
        article = "a" if kind == "NaN" else "an"
        if found != 1.0:
            problems.append(
                f"found_inf is {found} after {article} {kind} in grads[{where}] ({spot}): it must be set to 1.0"
                + (" (NaN != NaN: test x != x, or use an isfinite-style check)" if kind == "NaN" else "")
            )
        for a, b in zip(ours, ref, strict=True):
            if not torch.equal(torch.isnan(a), torch.isnan(b)) or not torch.equal(
                torch.nan_to_num(a), torch.nan_to_num(b)
            ):
                problems.append(
                    f"with a {kind} in grads[{where}] the gradients differ from torch's: torch still unscales "
                    f"every gradient (the step is skipped later, by the scaler)"
                )
                break
        _fail_if(problems)
    print(f"q1 passed: {compared} gradient elements bit-identical to torch's unscale ({len(scales)} scales, 3 "
          f"dtypes), found_inf right on {poisonings} inf/NaN placements and never cleared")  # fmt: skip


# -- q2: the loss scaler ----------------------------------------------------------------------------------

# 0 = clean step, or the value poisoned into one gradient after backward
SCRIPT = (0, 0, 0, math.inf, 0, math.nan, 0, 0, 0, 0, -math.inf, 0, 0, 0, 0, 0, 0)
SCALER_ARGS = {"init_scale": 2.0**10, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}


class _Twin:
    def __init__(self, scaler):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(6, 3).to(default_device())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scaler = scaler
        self.x = torch.linspace(-1, 1, 24, device=default_device()).reshape(4, 6)

    def step(self, poison, who):
        self.opt.zero_grad()
        before = [p.detach().clone() for p in self.model.parameters()]
        loss = self.model(self.x).pow(2).mean()
        scaled = call_student(lambda: self.scaler.scale(loss), name=f"{who}.scale", question="q2")
        scaled.backward()
        if poison:
            self.model.weight.grad[0, 1] = poison
        call_student(lambda: self.scaler.unscale_(self.opt) or True, name=f"{who}.unscale_", question="q2")
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        call_student(lambda: self.scaler.step(self.opt) or True, name=f"{who}.step", question="q2")
        call_student(lambda: self.scaler.update() or True, name=f"{who}.update", question="q2")
        after = list(self.model.parameters())
        stepped = not all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
        finite = all(bool(torch.isfinite(a).all()) for a in after)
        return stepped, finite

    def params(self) -> list:
        return [p.detach().clone() for p in self.model.parameters()]


def _scale_of(scaler, who):
    return float(call_student(lambda: scaler.get_scale(), name=f"{who}.get_scale", question="q2"))


def check_scaler(cls, args=SCALER_ARGS, script=SCRIPT, checkpoint=8) -> None:
    """q2: ``cls(**args)`` makes the decisions of ``torch.amp.GradScaler``: same scale after every step
    of ``script``, same skipped steps, same growth after ``growth_interval`` clean steps, same
    parameters, same ``state_dict``; and the state saved after step ``checkpoint`` restores into a
    fresh instance."""
    if not is_class(cls):
        if cls is None or callable(cls):
            call_student(cls, name="the scaler class", question="q2")  # None / stubs: "not done yet"
        raise AssertionError(f"q2: pass the class itself, got {type_name(cls)}")
    shown = "**SCALER_ARGS" if args is SCALER_ARGS else ", ".join(f"{k}={v!r}" for k, v in args.items())
    scaler = call_student(lambda: cls(**args), name=f"{cls.__name__}({shown})", question="q2")
    # the student's twin lives with the student's scaler (in the grader: the submission's sandbox)
    ours, ref = student_side(_Twin, scaler), _Twin(torch.amp.GradScaler(default_device(), **args))
    interval = args["growth_interval"]
    last_overflow = None
    for i, poison in enumerate(script):
        scale_before = _scale_of(ours.scaler, "scaler")
        stepped, finite = ours.step(poison, "scaler")
        ref_stepped, _ = ref.step(poison, "GradScaler")
        got, want = _scale_of(ours.scaler, "scaler"), ref.scaler.get_scale()
        what = "an overflow step (a gradient is inf/NaN)" if poison else "a clean step"
        if poison and stepped:
            kind = "NaN" if math.isnan(poison) else "inf"
            raise AssertionError(
                f"q2: step {i} was {what}, with a {kind}, but optimizer.step() ran"
                + ("" if finite else " and the parameters are now non-finite")
                + ": step not skipped on inf/NaN (step() must check found_inf and skip the optimizer)"
            )
        if not poison and stepped != ref_stepped:
            raise AssertionError(f"q2: step {i} was {what} but the optimizer step was skipped")
        if got != want:
            if poison and got >= scale_before:
                raise AssertionError(
                    f"q2: after the overflow at step {i} the scale is {got:g} (it was {scale_before:g}); GradScaler "
                    f"backs off to {want:g}: scale not reduced after an overflow (multiply by backoff_factor)"
                )
            if not poison and last_overflow is not None and got > scale_before and i - last_overflow < interval:
                raise AssertionError(
                    f"q2: the scale grew to {got:g} at step {i}, only {i - last_overflow} clean step(s) after the "
                    f"overflow at step {last_overflow}; GradScaler keeps {want:g}: growth counter not reset after an "
                    f"overflow (an overflow must restart the count of clean steps at 0)"
                )
            if not poison and got > scale_before and want > scale_before:
                raise AssertionError(
                    f"q2: at step {i} the scale grew from {scale_before:g} to {got:g}, GradScaler's to {want:g}: grow "
                    f"by the growth_factor the constructor was given ({args['growth_factor']:g})"
                )
            if poison and want < got < scale_before:
                raise AssertionError(
                    f"q2: after the overflow at step {i} the scale backed off from {scale_before:g} to {got:g}, "
                    f"GradScaler's to {want:g}: back off by the backoff_factor the constructor was given "
                    f"({args['backoff_factor']:g})"
                )
            hint = " (growth comes after growth_interval consecutive clean steps: off by one?)" if not poison else ""
            if i > checkpoint:
                hint = (
                    f" (with the state saved after step {checkpoint} loaded into a fresh instance: does "
                    f"load_state_dict restore every entry, _growth_tracker included?)"
                )
            raise AssertionError(f"q2: after step {i} ({what}) the scale is {got:g}, GradScaler's is {want:g}" + hint)
        for a, b in zip(ours.params(), ref.params(), strict=True):
            if not torch.equal(a, b):
                rel = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                raise AssertionError(
                    f"q2: after step {i} the parameters differ from GradScaler's run (max relative difference "
                    f"{rel:.3g}): the gradients reached the optimizer not unscaled exactly once by 1/scale"
                )
        if poison:
            last_overflow = i
        if i == checkpoint:  # mid-run, restore into a fresh instance, carry on with it
            saved = call_student(lambda: ours.scaler.state_dict(), name="scaler.state_dict", question="q2")
            want_state = ref.scaler.state_dict()
            if dict(saved) != want_state:
                raise AssertionError(f"q2: state_dict() is {dict(saved)}, GradScaler's is {want_state}")
            fresh = cls()
            restored = copy.deepcopy(saved)
            call_student(
                lambda f=fresh, r=restored: f.load_state_dict(r) or True, name="scaler.load_state_dict", question="q2"
            )
            ours.scaler = fresh
    print(f"q2 passed: {len(script)} steps ({sum(1 for p in script if p)} overflows) with GradScaler's scale, "
          f"skips, growth and parameters; state_dict saved and restored mid-run")  # fmt: skip


# -- q3: RMSNorm --------------------------------------------------------------------------------------------

RMS_SHAPES = ((1, 1), (3, 7), (4, 127), (2, 1000 + 3), (2, 4096))


def _rms_inputs(seed=3, shapes=RMS_SHAPES):
    g = torch.Generator().manual_seed(seed)
    cases = []
    for m, n in shapes:
        x = torch.randn(m, n, generator=g) * 3 + 1  # a mean far from zero: squares add up large
        cases.append((f"{m}x{n}", x))
    cases.append(("rows of 1e4 and 1e-3", torch.cat([torch.randn(1, 256, generator=g) * 1e4,
                                                       torch.randn(1, 256, generator=g) * 1e-3])))  # fmt: skip
    return [(name, x, (1 + 0.25 * torch.randn(x.shape[1], generator=g))) for name, x in cases]


def _reference(x, w, dy, eps):
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    rstd = torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps)
    y = xr * rstd * wr
    y.backward(dy.double())
    return y.detach(), rstd.detach().squeeze(-1), xr.grad, wr.grad


def check_rmsnorm(forward, backward=None, dtype=torch.bfloat16, eps=1e-6, shapes=RMS_SHAPES, seed=3) -> None:
    """q3: ``forward(x, w, eps) -> (y, rstd)`` and ``backward(dy, x, w, rstd) -> (dx, dw)`` in
    ``dtype`` (y, dx, dw in dtype; rstd in fp32), against an fp64 reference: y within half an ulp of
    ``dtype``, dx and dw within half an ulp plus the error of fp32 sums.  The pair may come as one
    argument, ``check_rmsnorm((forward, backward))``.  The inputs have ``shapes`` (and two rows of
    1e4 and 1e-3), drawn from ``seed``."""
    if isinstance(forward, tuple | list):
        forward, backward = forward
    half_ulp = torch.finfo(dtype).eps / 2  # relative: 2^-8 for bf16, 2^-11 for fp16
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2
    dev = default_device()
    checked = 0
    for name, x32, w32 in _rms_inputs(seed, shapes):
        x, w = x32.to(dtype), w32.to(dtype)
        dy = torch.linspace(-1, 1, x.numel()).reshape(x.shape).to(dtype)
        y_ref, rstd_ref, dx_ref, dw_ref = _reference(x, w, dy, eps)
        out = call_student(lambda x=x, w=w: forward(x.to(dev), w.to(dev), eps), name="rmsnorm_forward", question="q3")
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise AssertionError("q3: rmsnorm_forward must return (y, rstd)")
        y, rstd = (t.detach().cpu() for t in out)
        if y.dtype != dtype:
            raise AssertionError(f"q3: y is {y.dtype} for {dtype} input: store narrow (y in the input's dtype)")
        if rstd.dtype != torch.float32:
            raise AssertionError(
                f"q3: rstd is saved as {rstd.dtype}: keep it fp32 (4 bytes a row; a bf16 rstd is off by up to "
                f"2^-9 and every gradient inherits it)"
            )
        if rstd.shape != rstd_ref.shape:
            raise AssertionError(
                f"q3: rstd has shape {tuple(rstd.shape)}, want one value per row {tuple(rstd_ref.shape)}"
            )
        if not bool(torch.isfinite(y).all()):
            raise AssertionError(
                f"q3: forward {name}: y has NaN/inf where the reference is finite (is every element of the row "
                f"computed and stored, with other=0.0 on the masked loads?)"
            )
        err = (y.double() - y_ref).abs()
        bound = half_ulp * y_ref.abs() + tiny
        if not bool((err <= bound * 1.001).all()):
            raise AssertionError(f"q3: forward {name}: " + _rms_forward_smell(x, w, y, y_ref, rstd, rstd_ref, eps))
        rel_rstd = ((rstd.double() - rstd_ref).abs() / rstd_ref).max().item()
        if not rel_rstd <= 2.0**-20:  # written so that NaN fails too
            raise AssertionError(
                f"q3: forward {name}: rstd is off by up to {rel_rstd:.2g} relative: statistics in bf16 (or another "
                f"narrow type): widen x to fp32 before squaring and summing, and keep rstd in fp32"
            )
        grads = call_student(
            backward and (lambda x=x, w=w, dy=dy, rstd=rstd: backward(dy.to(dev), x.to(dev), w.to(dev), rstd.to(dev))),
            name="rmsnorm_backward",
            question="q3",
        )
        dx, dw = (t.detach().cpu() for t in grads)
        if dx.dtype != dtype or dw.dtype != dtype:
            raise AssertionError(f"q3: dx is {dx.dtype} and dw {dw.dtype}: both must come back in {dtype}")
        with torch.no_grad():
            xr = x.double()
            terms_dx = (w.double() * dy.double() * rstd_ref[:, None]).abs().amax()
            terms_dw = (dy.double() * xr * rstd_ref[:, None]).abs().sum(0).amax()
        for got, want, terms, what in ((dx, dx_ref, terms_dx, "dx"), (dw, dw_ref, terms_dw, "dw")):
            err = (got.double() - want).abs()
            bound = half_ulp * want.abs() + float(terms) * 2.0**-16 + tiny
            if not bool((err <= bound).all()):  # NaN fails
                raise AssertionError(f"q3: backward {name}: " + _rms_backward_smell(what, got, want, x, w, dy, eps))
        checked += x.numel()
    print(f"q3 passed: RMSNorm forward and backward on {checked} {str(dtype).replace('torch.', '')} elements "
          f"({len(shapes) + 1} shapes) within half an ulp of fp64, rstd fp32")  # fmt: skip


def _rms_forward_smell(x, w, y, y_ref, rstd, rstd_ref, eps) -> str:
    n = x.shape[-1]
    ratio = (rstd.double() / rstd_ref).numpy()
    block = 1 << max(0, (n - 1).bit_length())
    if block != n and np.allclose(ratio, math.sqrt(block / n), rtol=1e-3):
        return (
            f"every row is off by sqrt({block}/{n}): the mean of squares was divided by the padded block size "
            f"{block}, not by N = {n}"
        )
    ms = x.double().pow(2).mean(-1)
    outside = 1 / (ms.sqrt() + eps)
    if not np.allclose(ratio, 1, rtol=1e-5) and np.allclose(rstd.double().numpy(), outside.numpy(), rtol=1e-4):
        return "rstd = 1/(sqrt(mean(x^2)) + eps): eps belongs inside the square root"
    row_rel = np.abs(ratio - 1).max()
    if row_rel > 2.0**-20:
        return (
            f"rows are scaled by a wrong factor (rstd off by up to {row_rel:.2g} relative): statistics in bf16 "
            f"(or another narrow type): widen x to fp32 before squaring and summing"
        )
    bad = ((y.double() - y_ref).abs() > torch.finfo(y.dtype).eps / 2 * y_ref.abs()).sum().item()
    return (
        f"{bad} outputs are more than half an ulp from the fp64 reference although rstd is right: compute "
        f"x * rstd * w in fp32 and round once when storing"
    )


def _rms_backward_smell(what, got, want, x, w, dy, eps) -> str:
    rel = float(((got.double() - want).abs() / want.abs().clamp_min(1e-12)).median())
    if what == "dx":
        xr = x.double()
        rstd = torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps)
        naive = (dy.double() * w.double() * rstd).to(got.dtype).double()
        if torch.allclose(got.double(), naive, rtol=2.0**-7, atol=1e-6):
            return "dx = w * dy * rstd: the term through rstd is missing; dx = rstd * (w*dy - x_hat * mean(w*dy*x_hat))"
        return f"dx is off (median relative error {rel:.2g}); check rstd * (w*dy - x_hat * c), c = mean(w*dy*x_hat)"
    return (
        f"dw is off (median relative error {rel:.2g}): dw = sum over rows of dy * x_hat, summed in fp32 and "
        f"rounded once to the weight's dtype"
    )


# -- q4: the training step ---------------------------------------------------------------------------------


def _step_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(default_device())


def _step_twin():
    model = _step_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return model, opt, amp.DynamicLossScaler(init_scale=2.0**20, growth_interval=2)


class _StepTwin:
    """The student's side of q4's check: a model, its optimizer and scaler, stepped by ``step_fn``."""

    def __init__(self, step_fn):
        self.step_fn = step_fn
        self.model, self.opt, self.scaler = _step_twin()

    def step(self, x, y, autocast_dtype, max_norm, returns=False):
        """(parameters before, parameters after, loss scale after) one call of ``step_fn``; with
        ``returns``, then what it returned, as (float loss, bool skipped)."""
        before = [p.detach().clone() for p in self.model.parameters()]
        out = call_student(
            lambda: self.step_fn(self.model, self.opt, self.scaler, x, y, autocast_dtype, max_norm),
            name="train_step",
            question="q4",
        )
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise AssertionError("q4: train_step must return (loss, skipped)")
        seen = before, [p.detach().clone() for p in self.model.parameters()], float(self.scaler.get_scale())
        if not returns:
            return seen
        loss, skipped = out
        try:
            return *seen, float(loss.detach() if isinstance(loss, torch.Tensor) else loss), bool(skipped)
        except (TypeError, ValueError, RuntimeError) as e:
            raise AssertionError(
                f"q4: train_step returned ({type_name(loss)}, {type_name(skipped)}): want (loss, skipped), the loss a "
                f"number or a one-element tensor and skipped a bool"
            ) from e


def check_train_step(step_fn, autocast_dtype=torch.float16, seed=2, steps=10, max_norm=0.05, returns=False) -> None:
    """q4: ``step_fn(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm) -> (loss, skipped)``
    trains twin models exactly like :func:`kernels.charmodel.train_step`: same skipped steps, same loss
    scale, same parameters after every step (SGD, so the size of an update shows).  ``steps`` batches
    drawn from ``seed``; ``max_norm`` small, so that clipping is active on every step; with
    ``returns``, the loss and skipped it returns must be the reference's too."""
    g = torch.Generator().manual_seed(seed)
    dev = default_device()
    data = [
        (torch.randn(32, 8, generator=g).to(dev), torch.randint(0, 4, (32,), generator=g).to(dev)) for _ in range(steps)
    ]
    # the student's twin lives with the student's function (in the grader: the submission's sandbox)
    ours, (ref_model, ref_opt, ref_scaler) = student_side(_StepTwin, step_fn), _step_twin()
    skips = 0

    for i, (x, y) in enumerate(data):
        before, params, scale, *returned = ours.step(x, y, autocast_dtype, max_norm, returns)
        ref_before = [p.detach().clone() for p in ref_model.parameters()]
        ref_loss, ref_skipped = charmodel.train_step(ref_model, ref_opt, ref_scaler, x, y, autocast_dtype, max_norm)
        skips += int(ref_skipped)
        if returns:
            loss, skipped = returned
            if skipped != ref_skipped:
                raise AssertionError(
                    f"q4: step {i}: train_step returned skipped={skipped}, but the scaler found "
                    f"{'an' if ref_skipped else 'no'} inf/NaN: skipped must say whether the step was skipped "
                    f"(scaler.found_inf(optimizer) after scaler.step, before scaler.update)"
                )
            if not math.isclose(loss, float(ref_loss), rel_tol=1e-3):
                raise AssertionError(
                    f"q4: step {i}: train_step returned the loss {loss:.6g}, this step's cross-entropy is "
                    f"{float(ref_loss):.6g} (the loss of the forward, not scaled)"
                )
        if not all(bool(torch.isfinite(p).all()) for p in params):
            raise AssertionError(
                f"q4: after step {i} the parameters are inf/NaN: the optimizer stepped on overflowed gradients "
                f"(call scaler.step(optimizer), which skips the step, not optimizer.step())"
            )
        if scale != ref_scaler.get_scale():
            raise AssertionError(
                f"q4: after step {i} the loss scale is {scale:g}, want {ref_scaler.get_scale():g}"
                + (": it never changed: scaler.update() is not called" if scale == 2.0**20 else "")
            )
        with torch.no_grad():
            delta = torch.cat([(p - b).reshape(-1) for p, b in zip(params, before, strict=True)])
            ref_params = ref_model.parameters()
            ref_delta = torch.cat([(p - b).reshape(-1) for p, b in zip(ref_params, ref_before, strict=True)])
        if ref_skipped:
            if delta.abs().max() > 0:
                raise AssertionError(f"q4: step {i} overflowed (the scaler found inf) but the parameters moved")
            continue
        got, want = float(delta.norm()), float(ref_delta.norm())
        if not math.isclose(got, want, rel_tol=1e-3):
            ratio = got / want if want else math.inf
            if ratio < 1e-2:
                raise AssertionError(
                    f"q4: step {i}: the update is {ratio:.3g} times the right one: the gradients were clipped while "
                    f"still multiplied by the loss scale (call scaler.unscale_(optimizer) before clip_grad_norm_)"
                )
            if ratio > 1.5:
                raise AssertionError(
                    f"q4: step {i}: the update is {ratio:.3g} times the right one: the gradients were not clipped "
                    f"to max_norm (clip_grad_norm_ after unscale_, before step)"
                )
            raise AssertionError(f"q4: step {i}: the update differs from the reference's (ratio {ratio:.4g})")
    if skips == 0:
        raise AssertionError("q4: internal: the scripted run never overflowed")  # the check's own guard
    print(f"q4 passed: {len(data)} steps ({skips} skipped on overflow) with the reference's scale, skips and "
          f"clipped updates")  # fmt: skip


__all__ = ["check_rmsnorm", "check_scaler", "check_train_step", "check_unscale"]
