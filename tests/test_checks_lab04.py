"""Lab 4's checks pass the package's solutions and catch each deliberately wrong one, naming the bug.

``WRONG_SOLUTIONS`` holds, per otter question, wrong solutions written the way a student would write
them: a per-tensor Triton unscale with one mistake each, a hand-written scaler with one decision
wrong, an RMSNorm kernel with narrow statistics or a misplaced eps, training steps in the wrong order.
"""

import pytest
import torch
import triton
import triton.language as tl

from kernels import amp
from kernels.checks import ExerciseNotDone, lab04, passes

# -- q1: a student's unscale, one launch per tensor -------------------------------------------------------

RIGHT, MISSES_NAN, DIVIDES, NARROW_INV, NO_STORE, CLEARS = range(6)


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

STATS_FP32, STATS_BF16, DIVIDE_BY_BLOCK, EPS_OUTSIDE = range(4)


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
    y, rstd = amp.rmsnorm_forward(x, w, eps)
    return y, rstd.to(torch.bfloat16)


def dx_without_projection(dy, x, w, rstd):
    _, dw = amp.rmsnorm_backward(dy, x, w, rstd)
    return (dy.float() * w.float() * rstd[:, None]).to(x.dtype), dw


def dw_accumulated_in_bf16(dy, x, w, rstd):
    dx, _ = amp.rmsnorm_backward(dy, x, w, rstd)
    terms = (dy.float() * x.float() * rstd[:, None]).to(torch.bfloat16)  # (M, N)
    dw = torch.zeros(x.shape[1], dtype=torch.bfloat16, device=x.device)
    for row in terms:
        dw = dw + row  # a bf16 running sum
    return dx, dw


RIGHT_RMS = (amp.rmsnorm_forward, amp.rmsnorm_backward)


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
        "statistics in bf16": (student_rms_forward(STATS_BF16), amp.rmsnorm_backward),
        "mean over the padded block": (student_rms_forward(DIVIDE_BY_BLOCK), amp.rmsnorm_backward),
        "eps outside the square root": (student_rms_forward(EPS_OUTSIDE), amp.rmsnorm_backward),
        "rstd saved in bf16": (rstd_in_bf16, amp.rmsnorm_backward),
        "dx without the projection term": (amp.rmsnorm_forward, dx_without_projection),
        "dw accumulated in bf16": (amp.rmsnorm_forward, dw_accumulated_in_bf16),
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
    "q4": amp.train_step,
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
    lab04.check_rmsnorm((student_rms_forward(STATS_FP32), amp.rmsnorm_backward))


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
        y, rstd = amp.rmsnorm_forward(x, w, eps)
        return torch.full_like(y, float("nan")), rstd

    with pytest.raises(AssertionError, match="y has NaN/inf"):
        lab04.check_rmsnorm((nan_forward, amp.rmsnorm_backward))

    def nan_backward(dy, x, w, rstd):
        dx, dw = amp.rmsnorm_backward(dy, x, w, rstd)
        return torch.full_like(dx, float("nan")), dw

    with pytest.raises(AssertionError, match="dx is off"):
        lab04.check_rmsnorm((amp.rmsnorm_forward, nan_backward))


def test_scaler_check_wants_the_class():
    with pytest.raises(AssertionError, match="pass the class itself"):
        lab04.check_scaler(amp.DynamicLossScaler())
