"""Lab 4's checks pass the package's solutions and catch each deliberately wrong one, naming the bug.

``WRONG_SOLUTIONS`` holds, per otter question, wrong solutions written the way a student would write
them: a per-tensor Triton unscale with one mistake each, a hand-written scaler with one decision
wrong, an RMSNorm kernel with narrow statistics or a misplaced eps, training steps in the wrong order.
``STUDENT_SOLUTIONS`` holds right ones written the ways students write them (``tl.max`` or a sum of
flags, a module constant declared ``tl.constexpr`` or a constexpr argument, masks with ``other=`` or
``tl.where``...), each of which must pass.  A kernel that reads a module-level constant declares it
``tl.constexpr``: compiled Triton refuses any other global, and so does CPU mode.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernels import amp, charmodel, norms
from kernels.checks import ExerciseNotDone, lab04, passes

# -- q1: a student's unscale, one launch per tensor -------------------------------------------------------

RIGHT, MISSES_NAN, DIVIDES, NARROW_INV, NO_STORE, CLEARS = (tl.constexpr(i) for i in range(6))


@triton.jit
def _student_unscale_kernel(g_ptr, found_ptr, inv_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(g_ptr + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    inv = tl.load(inv_ptr)
    if MODE == MISSES_NAN:
        bad = tl.abs(xf) == float("inf")
    else:
        bad = (xf != xf) | (tl.abs(xf) == float("inf"))
    if MODE == DIVIDES:
        y = xf / inv
    elif MODE == NARROW_INV:
        y = x * inv.to(x.dtype)
    else:
        y = xf * inv
    if MODE != NO_STORE:
        tl.store(g_ptr + offs, y.to(x.dtype), mask=mask)
    flag = tl.max(bad.to(tl.int32), axis=0)
    if MODE == CLEARS:
        tl.store(found_ptr, flag.to(tl.float32))
    else:
        tl.store(found_ptr, 1.0, mask=flag > 0)


def student_unscale(mode):
    def unscale_(grads, found_inf, inv_scale):
        for g in grads:
            n = g.numel()
            _student_unscale_kernel[(triton.cdiv(n, 4096),)](g, found_inf, inv_scale, n, MODE=mode, BLOCK=4096)
        return grads

    return unscale_


# -- q2: a student's scaler ----------------------------------------------------------------------------------


class StudentScaler:
    """GradScaler's decisions in plain Python, with a switch for each classic mistake."""

    backoff, skip, reset_tracker = True, True, True

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.s, self.gf, self.bf, self.interval = init_scale, growth_factor, backoff_factor, growth_interval
        self.tracker, self.found, self.unscaled = 0, None, False

    def scale(self, loss):
        return loss * torch.tensor(self.s, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.found = torch.zeros((), device=grads[0].device)
        inv = torch.tensor(self.s, dtype=torch.float64).reciprocal().float().to(grads[0].device)
        amp.foreach_non_finite_check_and_unscale_(grads, self.found, inv)
        self.unscaled = True

    def step(self, optimizer):
        if not self.unscaled:
            self.unscale_(optimizer)
        if not (self.skip and self.found.item()):
            optimizer.step()

    def update(self):
        if self.found.item():
            if self.backoff:
                self.s = float(torch.tensor(self.s * self.bf, dtype=torch.float32))
            if self.reset_tracker:
                self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker == self.interval:
                self.s, self.tracker = self.s * self.gf, 0
        self.unscaled = False

    def get_scale(self):
        return self.s

    def state_dict(self):
        return {
            "scale": self.s,
            "growth_factor": self.gf,
            "backoff_factor": self.bf,
            "growth_interval": self.interval,
            "_growth_tracker": self.tracker,
        }

    def load_state_dict(self, state):
        self.s, self.gf, self.bf = state["scale"], state["growth_factor"], state["backoff_factor"]
        self.interval, self.tracker = state["growth_interval"], state["_growth_tracker"]


class NoBackoff(StudentScaler):
    backoff = False


class NoSkip(StudentScaler):
    skip = False


class TrackerNotReset(StudentScaler):
    reset_tracker = False


class GrowsOneEarly(StudentScaler):
    def update(self):
        if not self.found.item() and self.tracker + 2 == self.interval:
            self.tracker += 1  # counts the current step twice
        super().update()


class StateDictWithoutTracker(StudentScaler):
    def state_dict(self):
        return {k: v for k, v in super().state_dict().items() if k != "_growth_tracker"}


# -- q3: a student's RMSNorm -----------------------------------------------------------------------------------

STATS_FP32, STATS_BF16, DIVIDE_BY_BLOCK, EPS_OUTSIDE = (tl.constexpr(i) for i in range(4))


@triton.jit
def _student_rms_fwd(x_ptr, w_ptr, y_ptr, rstd_ptr, N, eps, MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    if MODE == STATS_BF16:  # squares, their mean and rstd all kept in bf16
        sq = (x * x).to(tl.bfloat16)
        ms = (tl.sum(sq.to(tl.float32), axis=0) / N).to(tl.bfloat16).to(tl.float32)
        rstd = (1.0 / tl.sqrt(ms + eps)).to(tl.bfloat16).to(tl.float32)
    else:
        xf = x.to(tl.float32)
        if MODE == DIVIDE_BY_BLOCK:
            ms = tl.sum(xf * xf, axis=0) / BLOCK
        else:
            ms = tl.sum(xf * xf, axis=0) / N
        if MODE == EPS_OUTSIDE:
            rstd = 1.0 / (tl.sqrt(ms) + eps)
        else:
            rstd = 1.0 / tl.sqrt(ms + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (x.to(tl.float32) * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


def student_rms_forward(mode):
    def forward(x, w, eps):
        m, n = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        _student_rms_fwd[(m,)](x, w, y, rstd, n, eps, MODE=mode, BLOCK=triton.next_power_of_2(n))
        return y, rstd

    return forward


def rstd_in_bf16(x, w, eps):
    y, rstd = norms.rmsnorm_forward(x, w, eps)
    return y, rstd.to(torch.bfloat16)


def dx_without_projection(dy, x, w, rstd):
    _, dw = norms.rmsnorm_backward(dy, x, w, rstd)
    return (dy.float() * w.float() * rstd[:, None]).to(x.dtype), dw


def dw_accumulated_in_bf16(dy, x, w, rstd):
    dx, _ = norms.rmsnorm_backward(dy, x, w, rstd)
    terms = (dy.float() * x.float() * rstd[:, None]).to(torch.bfloat16)  # (M, N)
    dw = torch.zeros(x.shape[1], dtype=torch.bfloat16, device=x.device)
    for row in terms:
        dw = dw + row  # a bf16 running sum
    return dx, dw


RIGHT_RMS = (norms.rmsnorm_forward, norms.rmsnorm_backward)


# -- q4: a student's training step ------------------------------------------------------------------------------


def _forward_loss(model, inputs, targets, autocast_dtype):
    with torch.autocast(inputs.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(inputs)
    return torch.nn.functional.cross_entropy(logits.float(), targets)


def step_unscale_after_clip(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clips S * g
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss, skipped


def step_not_skipped(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()  # bypasses the scaler's inf check
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss, skipped


def step_without_update(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return loss, scaler.found_inf(optimizer)


def step_without_clipping(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss, skipped


# -- right solutions, written the ways students write them ------------------------------------------------------

UNSCALE_BLOCK = tl.constexpr(1024)  # a module-level constant a kernel reads: declared tl.constexpr


@triton.jit
def _unscale_with_module_block(g_ptr, found_ptr, inv_ptr, n):
    offs = tl.program_id(0) * UNSCALE_BLOCK + tl.arange(0, UNSCALE_BLOCK)
    mask = offs < n
    x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inf_or_nan = (x != x) | (tl.abs(x) == float("inf"))
    tl.store(g_ptr + offs, (x * tl.load(inv_ptr)).to(g_ptr.dtype.element_ty), mask=mask)
    tl.store(found_ptr, 1.0, mask=tl.max(inf_or_nan.to(tl.int32), axis=0) == 1)


def unscale_module_constant(grads, found_inf, inv_scale):
    for g in grads:
        grid = (triton.cdiv(g.numel(), UNSCALE_BLOCK.value),)
        _unscale_with_module_block[grid](g, found_inf, inv_scale, g.numel())


@triton.jit
def _unscale_with_sum_of_flags(g_ptr, found_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(g_ptr + offs, mask=offs < n)
    x = tl.where(offs < n, x, 0).to(tl.float32)  # the masked lanes made zero with tl.where, not other=
    bad = (x - x) != 0  # x - x is NaN for inf and NaN, 0 for every finite x
    y = x * tl.load(inv_ptr)
    tl.store(g_ptr + offs, y.to(g_ptr.dtype.element_ty), mask=offs < n)
    count = tl.sum(tl.where(bad, 1, 0), axis=0)
    tl.atomic_max(found_ptr, (count > 0).to(tl.float32))  # max(found, 0 or 1): set, never cleared


def unscale_sum_of_flags(grads, found_inf, inv_scale):
    for g in grads:
        _unscale_with_sum_of_flags[(triton.cdiv(g.numel(), 512),)](g, found_inf, inv_scale, g.numel(), BLOCK=512)


@triton.jit
def _unscale_looping(g_ptr, found_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    inv = tl.load(inv_ptr)
    offs = tl.arange(0, BLOCK)
    seen = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, n, BLOCK):  # one program walks the whole tensor
        mask = start + offs < n
        x = tl.load(g_ptr + start + offs, mask=mask, other=1.0)
        wide = x.to(tl.float32)
        seen = tl.maximum(seen, (wide != wide).to(tl.int32))
        seen = tl.maximum(seen, (tl.abs(wide) == float("inf")).to(tl.int32))
        tl.store(g_ptr + start + offs, (wide * inv).to(x.dtype), mask=mask)
    if tl.max(seen, axis=0) > 0:
        tl.store(found_ptr, 1.0)


def unscale_one_program_per_tensor(grads, found_inf, inv_scale):
    for g in grads:
        _unscale_looping[(1,)](g, found_inf, inv_scale, g.numel(), BLOCK=2048)


class TensorStateScaler:
    """GradScaler's decisions with the scale and the growth tracker kept as 0-dim device tensors."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.init_scale, self.growth_factor, self.backoff_factor = init_scale, growth_factor, backoff_factor
        self.growth_interval, self.tracker_start = growth_interval, 0
        self.S = self.tracker = self.found = None

    def scale(self, loss):
        if self.S is None:
            self.S = torch.tensor(self.init_scale, dtype=torch.float32, device=loss.device)
            self.tracker = torch.tensor(self.tracker_start, dtype=torch.int32, device=loss.device)
        return loss * self.S

    def unscale_(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.found = torch.zeros((), dtype=torch.float32, device=self.S.device)
        amp.foreach_non_finite_check_and_unscale_(grads, self.found, self.S.double().reciprocal().float())

    def step(self, optimizer):
        if self.found is None:
            self.unscale_(optimizer)
        if self.found.item() == 0:
            optimizer.step()

    def update(self):
        overflow = self.found > 0
        clean = torch.where(overflow, torch.zeros_like(self.tracker), self.tracker + 1)
        grow = clean == self.growth_interval
        self.S = torch.where(
            overflow, self.S * self.backoff_factor, torch.where(grow, self.S * self.growth_factor, self.S)
        )
        self.tracker = torch.where(grow, torch.zeros_like(clean), clean)
        self.found = None

    def get_scale(self):
        return self.init_scale if self.S is None else self.S.item()

    def state_dict(self):
        tracker = self.tracker_start if self.tracker is None else int(self.tracker.item())
        return {
            "scale": self.get_scale(),
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": tracker,
        }

    def load_state_dict(self, state):
        self.init_scale, self.growth_factor = state["scale"], state["growth_factor"]
        self.backoff_factor, self.growth_interval = state["backoff_factor"], state["growth_interval"]
        self.tracker_start, self.S, self.tracker = state["_growth_tracker"], None, None


@triton.jit
def _rms_fwd_rsqrt(x_ptr, w_ptr, y_ptr, rstd_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask)
    x = tl.where(mask, x.to(tl.float32), 0.0)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) * (1.0 / N) + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_bwd_rows(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_rows_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    x_hat = x * rstd
    c = tl.sum(x_hat * w * dy, axis=0) / N
    tl.store(dx_ptr + row * N + cols, (rstd * (w * dy - x_hat * c)).to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_rows_ptr + row * N + cols, dy * x_hat, mask=mask)  # fp32, summed over rows on the host


def rms_forward_rsqrt(x, w, eps):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    _rms_fwd_rsqrt[(m,)](x, w, y, rstd, n, eps, BLOCK=triton.next_power_of_2(n))
    return y, rstd


def rms_backward_rows(dy, x, w, rstd):
    m, n = x.shape
    dx = torch.empty_like(x)
    dw_rows = torch.empty((m, n), dtype=torch.float32, device=x.device)
    _rms_bwd_rows[(m,)](dy, x, w, rstd, dx, dw_rows, n, BLOCK=triton.next_power_of_2(n))
    return dx, dw_rows.sum(0).to(w.dtype)


def step_zero_grad_first(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=autocast_dtype):
        logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.float(), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss, skipped


def step_skip_seen_in_the_scale(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    with torch.autocast(inputs.device.type, dtype=autocast_dtype):
        loss = torch.nn.functional.cross_entropy(model(inputs).float(), targets)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach(), scaler.get_scale() < before  # the scale backs off exactly when the step was skipped


STUDENT_SOLUTIONS = {
    "q1": {
        "module constant declared tl.constexpr, tl.max of the flags": unscale_module_constant,
        "constexpr argument, x - x != 0, tl.where mask, atomic_max": unscale_sum_of_flags,
        "one program looping over the tensor, if on tl.max": unscale_one_program_per_tensor,
    },
    "q2": {
        "Python floats": StudentScaler,
        "0-dim tensors and torch.where": TensorStateScaler,
    },
    "q3": {
        "1/tl.sqrt, other=0.0, package backward": (student_rms_forward(STATS_FP32), norms.rmsnorm_backward),
        "tl.rsqrt, tl.where mask, per-row dw summed on the host": (rms_forward_rsqrt, rms_backward_rows),
    },
    "q4": {
        "zero_grad first, found_inf": step_zero_grad_first,
        "skip read from the scale, clip over the param groups": step_skip_seen_in_the_scale,
    },
}
STUDENT_CASES = [(q, name) for q, rights in STUDENT_SOLUTIONS.items() for name in rights]


# -- a plain global in a student kernel: refused, as the compiler refuses it -----------------------------------

CHECK_NAN = True  # not tl.constexpr


@triton.jit
def _unscale_reading_a_plain_global(g_ptr, found_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    bad = tl.abs(x) == float("inf")
    if CHECK_NAN:
        bad = bad | (x != x)
    tl.store(g_ptr + offs, (x * tl.load(inv_ptr)).to(g_ptr.dtype.element_ty), mask=mask)
    tl.store(found_ptr, 1.0, mask=tl.max(bad.to(tl.int32), axis=0) > 0)


def unscale_reading_a_plain_global(grads, found_inf, inv_scale):
    for g in grads:
        _unscale_reading_a_plain_global[(triton.cdiv(g.numel(), 1024),)](g, found_inf, inv_scale, g.numel(), BLOCK=1024)


WRONG_SOLUTIONS = {
    "q1": {
        "NaN not detected": student_unscale(MISSES_NAN),
        "divides by inv_scale": student_unscale(DIVIDES),
        "inv_scale rounded to the gradient dtype": student_unscale(NARROW_INV),
        "no store (not in place)": student_unscale(NO_STORE),
        "found_inf cleared on clean chunks": student_unscale(CLEARS),
    },
    "q2": {
        "scale not reset after overflow": NoBackoff,
        "step not skipped on inf": NoSkip,
        "growth counter not reset": TrackerNotReset,
        "grows one step early": GrowsOneEarly,
        "state_dict without the growth tracker": StateDictWithoutTracker,
    },
    "q3": {
        "statistics in bf16": (student_rms_forward(STATS_BF16), norms.rmsnorm_backward),
        "mean over the padded block": (student_rms_forward(DIVIDE_BY_BLOCK), norms.rmsnorm_backward),
        "eps outside the square root": (student_rms_forward(EPS_OUTSIDE), norms.rmsnorm_backward),
        "rstd saved in bf16": (rstd_in_bf16, norms.rmsnorm_backward),
        "dx without the projection term": (norms.rmsnorm_forward, dx_without_projection),
        "dw accumulated in bf16": (norms.rmsnorm_forward, dw_accumulated_in_bf16),
    },
    "q4": {
        "unscale after clip": step_unscale_after_clip,
        "step not skipped on inf (optimizer.step called directly)": step_not_skipped,
        "scaler.update never called": step_without_update,
        "no clipping": step_without_clipping,
    },
}

EXPECTED = {
    ("q1", "NaN not detected"): ["after a NaN", "x != x"],
    ("q1", "divides by inv_scale"): ["divided by inv_scale"],
    ("q1", "inv_scale rounded to the gradient dtype"): ["inv_scale was rounded to the gradient's dtype"],
    ("q1", "no store (not in place)"): ["left unchanged", "tl.store"],
    ("q1", "found_inf cleared on clean chunks"): ["never be cleared"],
    ("q2", "scale not reset after overflow"): ["scale not reduced after an overflow"],
    ("q2", "step not skipped on inf"): ["step not skipped on inf/NaN"],
    ("q2", "growth counter not reset"): ["growth counter not reset after an overflow"],
    ("q2", "grows one step early"): ["off by one"],
    ("q2", "state_dict without the growth tracker"): ["state_dict() is", "_growth_tracker"],
    ("q3", "statistics in bf16"): ["statistics in bf16"],
    ("q3", "mean over the padded block"): ["padded block size"],
    ("q3", "eps outside the square root"): ["eps belongs inside the square root"],
    ("q3", "rstd saved in bf16"): ["rstd is saved as torch.bfloat16"],
    ("q3", "dx without the projection term"): ["the term through rstd is missing"],
    ("q3", "dw accumulated in bf16"): ["dw is off", "summed in fp32"],
    ("q4", "unscale after clip"): ["clipped while still multiplied by the loss scale", "before clip_grad_norm_"],
    ("q4", "step not skipped on inf (optimizer.step called directly)"): ["stepped on overflowed gradients"],
    ("q4", "scaler.update never called"): ["scaler.update() is not called"],
    ("q4", "no clipping"): ["not clipped"],
}

CHECKS = {
    "q1": lab04.check_unscale,
    "q2": lab04.check_scaler,
    "q3": lab04.check_rmsnorm,
    "q4": lab04.check_train_step,
}

RIGHT_SOLUTIONS = {
    "q1": amp.foreach_non_finite_check_and_unscale_,
    "q2": amp.DynamicLossScaler,
    "q3": RIGHT_RMS,
    "q4": charmodel.train_step,
}

CASES = [(q, name) for q, wrongs in WRONG_SOLUTIONS.items() for name in wrongs]


def test_every_question_has_wrong_solutions_with_expectations():
    assert set(WRONG_SOLUTIONS) == set(CHECKS) == set(RIGHT_SOLUTIONS) == {"q1", "q2", "q3", "q4"}
    assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_right_solution_passes(question, capsys):
    CHECKS[question](RIGHT_SOLUTIONS[question])
    assert f"{question} passed" in capsys.readouterr().out


def test_the_student_style_right_solutions_pass():
    # The switches' "right" settings pass too: the wrong ones differ by exactly one mistake.
    lab04.check_unscale(student_unscale(RIGHT))
    lab04.check_scaler(StudentScaler)
    lab04.check_rmsnorm((student_rms_forward(STATS_FP32), norms.rmsnorm_backward))


@pytest.mark.parametrize("question, name", STUDENT_CASES)
def test_student_style_right_solution_passes(question, name, capsys):
    CHECKS[question](STUDENT_SOLUTIONS[question][name])
    assert f"{question} passed" in capsys.readouterr().out


def test_every_question_has_two_student_style_right_solutions():
    assert set(STUDENT_SOLUTIONS) == set(CHECKS)
    assert all(len(rights) >= 2 for rights in STUDENT_SOLUTIONS.values())


def test_a_kernel_reading_a_plain_global_is_refused_through_the_check():
    # CPU mode refuses it before it runs, as compiled Triton refuses to compile it; the check reports
    # the compiler's message (the global, and how to declare it) instead of a traceback.
    with pytest.raises(AssertionError) as info:
        lab04.check_unscale(unscale_reading_a_plain_global)
    message = str(info.value)
    assert message.startswith("q1: unscale_ raised CompilationError: Cannot access global variable CHECK_NAN"), message
    assert "tl.constexpr" in message
    assert not isinstance(info.value, ExerciseNotDone)


# The student kernels of this file, with the signature compiled Triton sees (compiled for sm_90 below).
_UNSCALE = {"g_ptr": "*bf16", "found_ptr": "*fp32", "inv_ptr": "*fp32", "n": "i32"}
_RMS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "rstd_ptr": "*fp32", "N": "i32", "eps": "fp32"}
_RMS_BWD = {"dy_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16", "rstd_ptr": "*fp32", "dx_ptr": "*bf16"}
STUDENT_KERNELS = {
    **{
        f"unscale MODE={int(m)}": (_student_unscale_kernel, _UNSCALE, {"MODE": m, "BLOCK": 4096})
        for m in (RIGHT, MISSES_NAN, DIVIDES, NARROW_INV, NO_STORE, CLEARS)
    },
    **{
        f"rms MODE={int(m)}": (_student_rms_fwd, _RMS, {"MODE": m, "BLOCK": 1024})
        for m in (STATS_FP32, STATS_BF16, DIVIDE_BY_BLOCK, EPS_OUTSIDE)
    },
    "unscale, module constant": (_unscale_with_module_block, _UNSCALE, {}),
    "unscale, sum of flags": (_unscale_with_sum_of_flags, _UNSCALE, {"BLOCK": 512}),
    "unscale, looping": (_unscale_looping, _UNSCALE, {"BLOCK": 2048}),
    "rms, rsqrt": (_rms_fwd_rsqrt, _RMS, {"BLOCK": 1024}),
    "rms backward, rows": (_rms_bwd_rows, {**_RMS_BWD, "dw_rows_ptr": "*fp32", "N": "i32"}, {"BLOCK": 1024}),
    "reads a plain global": (_unscale_reading_a_plain_global, _UNSCALE, {"BLOCK": 1024}),
}


def compiled_verdicts() -> dict:
    """Compile every student kernel with the installed compiler (compiled mode); for the refused one,
    what call_student makes of the compiler's error."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.checks import call_student

    verdicts = {}
    for name, (kernel, signature, constexprs) in STUDENT_KERNELS.items():
        signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
        source = ASTSource(kernel, signature, constexprs=constexprs)
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32))
            verdicts[name] = "compiled"
        except Exception as error:

            def refused(error=error):
                raise error

            try:
                call_student(refused, name="unscale_", question="q1")
            except AssertionError as report:
                verdicts[name] = str(report)
    return verdicts


def test_student_kernels_compile_and_the_refusal_reads_the_same_compiled():
    # compiled Triton (in a child process in compiled mode; no GPU needed to compile for sm_90) compiles
    # every student kernel here, and refuses the one reading a plain global with the diagnosis CPU mode gives
    code = "import json, tests.test_checks_lab04 as t; print('VERDICTS', json.dumps(t.compiled_verdicts()))"
    env = {**os.environ, "KERNELS_INTERPRET": "0", "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("VERDICTS ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    verdicts = json.loads(lines[-1].removeprefix("VERDICTS "))
    refused = verdicts.pop("reads a plain global")
    assert refused.startswith("q1: unscale_ raised CompilationError: Cannot access global variable CHECK_NAN"), refused
    assert "declare it `CHECK_NAN = tl.constexpr(...)`, or pass it as a `tl.constexpr` argument" in refused
    assert verdicts == dict.fromkeys(verdicts, "compiled"), verdicts


@pytest.mark.parametrize("question, name", CASES)
def test_wrong_solution_is_caught(question, name):
    with pytest.raises(AssertionError) as info:
        CHECKS[question](WRONG_SOLUTIONS[question][name])
    message = str(info.value)
    print(message)
    assert not isinstance(info.value, ExerciseNotDone)
    assert message.startswith(question)
    for phrase in EXPECTED[(question, name)]:
        assert phrase in message, f"{question} {name!r}: {phrase!r} missing from:\n{message}"


@pytest.mark.parametrize("question", sorted(CHECKS))
def test_stub_is_not_done(question):
    def stub(*args, **kwargs):
        raise NotImplementedError

    with pytest.raises(ExerciseNotDone):
        CHECKS[question](stub)
    assert not passes(CHECKS[question], None)


def test_rmsnorm_check_fails_nan_outputs():
    def nan_forward(x, w, eps):
        y, rstd = norms.rmsnorm_forward(x, w, eps)
        return torch.full_like(y, float("nan")), rstd

    with pytest.raises(AssertionError, match="y has NaN/inf"):
        lab04.check_rmsnorm((nan_forward, norms.rmsnorm_backward))

    def nan_backward(dy, x, w, rstd):
        dx, dw = norms.rmsnorm_backward(dy, x, w, rstd)
        return torch.full_like(dx, float("nan")), dw

    with pytest.raises(AssertionError, match="dx is off"):
        lab04.check_rmsnorm((norms.rmsnorm_forward, nan_backward))


def test_scaler_check_wants_the_class():
    with pytest.raises(AssertionError, match="pass the class itself"):
        lab04.check_scaler(amp.DynamicLossScaler())


# -- wrong solutions the public tests pass and the hidden tests (solutions/hidden_tests/) catch ----------

UNSCALE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _chunk_flags_of_the_last_step(ptr, count, inv_scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(0, count, BLOCK):
        mask = i + offs < count
        x = tl.load(ptr + i + offs, mask=mask, other=0.0)
        wide = x.to(tl.float32)
        bad = ((wide != wide) | (tl.abs(wide) == float("inf"))).to(tl.int32)  # replaces the earlier steps' flags
        tl.store(ptr + i + offs, (wide * inv_scale).to(x.dtype), mask=mask)
    return tl.max(bad, axis=0)


@triton.jit
def _unscale_table_kernel(table_ptr, found_inf_ptr, inv_scale_ptr, BLOCK: tl.constexpr):
    row = table_ptr + tl.program_id(0) * 4
    address = tl.load(row)
    start = tl.load(row + 1)
    count = tl.load(row + 2)
    code = tl.load(row + 3)
    inv_scale = tl.load(inv_scale_ptr)
    if code == 0:
        bad = _chunk_flags_of_the_last_step(address.to(tl.pointer_type(tl.float32)) + start, count, inv_scale, BLOCK)
    elif code == 1:
        bad = _chunk_flags_of_the_last_step(address.to(tl.pointer_type(tl.float16)) + start, count, inv_scale, BLOCK)
    else:
        bad = _chunk_flags_of_the_last_step(address.to(tl.pointer_type(tl.bfloat16)) + start, count, inv_scale, BLOCK)
    tl.store(found_inf_ptr, 1.0, mask=bad > 0)


def unscale_flags_of_the_last_step(grads, found_inf, inv_scale):
    """The lab's table of chunks, each chunk's inf/NaN flags assigned at every step of its loop instead of
    accumulated: only the last step's count, and the public check puts every inf/NaN in a last element."""
    rows = [
        (g.data_ptr(), start, min(16384, g.numel() - start), UNSCALE_CODES[g.dtype])
        for g in grads
        for start in range(0, g.numel(), 16384)
    ]
    if rows:
        table = torch.tensor(rows, dtype=torch.int64, device=grads[0].device)
        _unscale_table_kernel[(len(rows),)](table, found_inf, inv_scale, BLOCK=2048)
    return grads


class DefaultFactorsTypedIn(StudentScaler):
    """Backs off by 0.5 and grows by 2 whatever it was given: GradScaler's defaults, the public check's too."""

    def update(self):
        if self.found.item():
            self.s, self.tracker = float(torch.tensor(self.s * 0.5, dtype=torch.float32)), 0
        else:
            self.tracker += 1
            if self.tracker == self.interval:
                self.s, self.tracker = self.s * 2.0, 0
        self.unscaled = False


class TrackerNotRestored(StudentScaler):
    """load_state_dict restores the scale and the settings, not the count of clean steps: right while a
    checkpoint falls where the count is 0 (the public check's does)."""

    def load_state_dict(self, state):
        self.s, self.gf, self.bf = state["scale"], state["growth_factor"], state["backoff_factor"]
        self.interval = state["growth_interval"]


@triton.jit
def _rms_fwd_bf16_out(x_ptr, w_ptr, y_ptr, rstd_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (x * rstd * w).to(tl.bfloat16), mask=mask)  # bf16 typed in, not y's dtype
    tl.store(rstd_ptr + row, rstd)


def rms_forward_bf16_out(x, w, eps):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    _rms_fwd_bf16_out[(m,)](x, w, y, rstd, n, eps, BLOCK=triton.next_power_of_2(n))
    return y, rstd


def rms_backward_dw_bf16(dy, x, w, rstd):
    """The per-row backward, dw summed in fp32 and rounded to bf16 typed in, not to the weight's dtype."""
    m, n = x.shape
    dx = torch.empty_like(x)
    dw_rows = torch.empty((m, n), dtype=torch.float32, device=x.device)
    _rms_bwd_rows[(m,)](dy, x, w, rstd, dx, dw_rows, n, BLOCK=triton.next_power_of_2(n))
    return dx, dw_rows.sum(0).to(torch.bfloat16)


def step_max_norm_typed_in(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # the public check's max_norm, not the argument
    scaler.step(optimizer)
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss, skipped


def step_skipped_read_after_update(model, optimizer, scaler, inputs, targets, autocast_dtype, max_norm):
    loss = _forward_loss(model, inputs, targets, autocast_dtype)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach(), scaler.found_inf(optimizer)  # update() has forgotten this step's inf checks: False


HIDDEN_CATCHES = {
    "q1": {"inf/NaN flags of a chunk's last step only": unscale_flags_of_the_last_step},
    "q2": {
        "backoff 0.5 and growth 2 typed in": DefaultFactorsTypedIn,
        "growth tracker not restored": TrackerNotRestored,
    },
    "q3": {
        "y rounded to bf16 whatever the dtype": (rms_forward_bf16_out, norms.rmsnorm_backward),
        "dw rounded to bf16 whatever the dtype": (norms.rmsnorm_forward, rms_backward_dw_bf16),
    },
    "q4": {
        "max_norm typed in from the public check": step_max_norm_typed_in,
        "skipped read after scaler.update()": step_skipped_read_after_update,
    },
}
