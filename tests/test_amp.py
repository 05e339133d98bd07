"""kernels.amp: the fused unscale against torch's, the loss scaler against torch.amp.GradScaler decision
for decision."""

import math
import random

import numpy as np
import pytest
import torch

from kernels import amp
from kernels.device import default_device
from kernels.testing import bits

DEVICE = default_device()
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _grads(seed: int, shapes=((1,), (7,), (127,), (1003,), (4096 + 3,), (33, 65), (2, 3, 5))):
    """Gradients of awkward sizes in every supported dtype, with adversarial values sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(shapes * 2):
        dtype = DTYPES[i % len(DTYPES)]
        kind = i % 5
        x = torch.randn(shape, generator=g)
        if kind == 1:
            x = x * 2e4  # near fp16's max (inf in the tails): the scaled values overflow if inv_scale > 1
        elif kind == 2:
            x = x * 1e-6  # fp16 subnormals and below
        elif kind == 3:
            x = x * 1e-40  # fp32 subnormals
        elif kind == 4:
            x = torch.zeros(shape)
        out.append(x.to(dtype).to(DEVICE))
    return out


def _torch_unscale(grads, found, inv):
    """torch's ``_amp_foreach_non_finite_check_and_unscale_`` on CPU copies (its CUDA kernel refuses
    bf16 gradients; the CPU one takes every dtype and does the same fp32/fp64 arithmetic).  Returns the
    unscaled copies; ``found`` (on any device) is set to 1.0 where torch's flag was."""
    ref = [g.detach().cpu().clone() for g in grads]
    found_cpu = found.detach().cpu().clone()
    torch._amp_foreach_non_finite_check_and_unscale_(ref, found_cpu, inv.detach().cpu())
    found.copy_(found_cpu)
    return ref


def _same_bits_or_both_nan(ours, ref, what):
    # NaN payloads follow the device's conversion (torch's CPU path makes every bf16 NaN 0x7FC0,
    # CUDA's 0x7FFF): demand NaN where torch has NaN and identical bits everywhere else.
    nan = torch.isnan(ref).cpu().numpy().ravel()
    assert np.array_equal(torch.isnan(ours).cpu().numpy().ravel(), nan), f"{what}: NaN positions differ"
    got, want = bits(ours).ravel(), bits(ref).ravel()
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, f"{what}: {bad.size} elements differ, first at {bad[:5]}: {got[bad[:5]]} vs {want[bad[:5]]}"


@pytest.mark.parametrize(
    "inv_scale, chunk",
    [(s, c) for s in (2.0**-16, 1.0, 3.0, 1 / 3, 2.0**-130) for c in (None, 1024)] + [(2.0**-16, 8)],
)
def test_unscale_bits_match_torch(inv_scale, chunk):
    grads = _grads(0)
    ours, ref = [g.clone() for g in grads], [g.clone() for g in grads]
    found_ours = torch.zeros((), device=DEVICE)
    found_ref = torch.zeros((), device=DEVICE)
    inv = torch.tensor(inv_scale, dtype=torch.float32, device=DEVICE)
    if chunk == 8:  # the tiny chunk makes thousands of programs: keep the interpreter's run short
        ours, ref = ours[:3], ref[:3]
    amp.foreach_non_finite_check_and_unscale_(ours, found_ours, inv, chunk=chunk)
    ref = _torch_unscale(ref, found_ref, inv)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        _same_bits_or_both_nan(a, b, f"grads[{i}] {a.dtype} {tuple(a.shape)}")
    expected = float(any(not torch.isfinite(g.double()).all() for g in grads[: len(ours)]))
    assert found_ours.item() == found_ref.item() == expected


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("where", ["first", "middle chunk", "last element"])
def test_found_inf_is_set_once_and_never_cleared(bad, where):
    grads = _grads(1)
    victim = {"first": 0, "middle chunk": 4, "last element": len(grads) - 1}[where]
    flat = grads[victim].view(-1)
    flat[{"first": 0, "middle chunk": flat.numel() // 2, "last element": -1}[where]] = bad
    ours, ref = [g.clone() for g in grads], [g.clone() for g in grads]
    found_ours = torch.zeros((), device=DEVICE)
    found_ref = torch.zeros((), device=DEVICE)
    inv = torch.tensor(0.5, device=DEVICE)
    amp.foreach_non_finite_check_and_unscale_(ours, found_ours, inv, chunk=1024)
    ref = _torch_unscale(ref, found_ref, inv)
    assert found_ours.item() == found_ref.item() == 1.0
    for a, b in zip(ours, ref, strict=True):  # the other gradients are still unscaled, as torch does
        _same_bits_or_both_nan(a, b, "after an inf")
    # A flag already set stays set after a clean call; a flag holding 7.0 becomes exactly 1.0 on inf.
    clean = [torch.ones(10, device=DEVICE)]
    amp.foreach_non_finite_check_and_unscale_(clean, found_ours, inv)
    assert found_ours.item() == 1.0
    seven = torch.full((), 7.0, device=DEVICE)
    amp.foreach_non_finite_check_and_unscale_([torch.tensor([bad], device=DEVICE)], seven, inv)
    assert seven.item() == 1.0


def test_unscale_strided_views_and_empty_inputs():
    base = torch.randn(10, 6, device=DEVICE)
    views = [base.t(), base[:, :3], torch.empty(0, device=DEVICE)]  # dense transposed, with gaps, empty
    ref = [v.clone() for v in views]
    found = torch.zeros((), device=DEVICE)
    inv = torch.tensor(0.25, device=DEVICE)
    amp.foreach_non_finite_check_and_unscale_(views, found, inv)
    ref = _torch_unscale(ref, torch.zeros((), device=DEVICE), inv)
    for a, b in zip(views, ref, strict=True):
        assert torch.equal(a.cpu(), b)
    amp.foreach_non_finite_check_and_unscale_([], found, inv)  # nothing to do, like torch
    assert found.item() == 0.0


def test_unscale_reference_matches_torch():
    grads = _grads(2)
    grads[3].view(-1)[0] = math.nan
    ours, ref = [g.clone() for g in grads], [g.clone() for g in grads]
    fo, fr = torch.zeros((), device=DEVICE), torch.zeros((), device=DEVICE)
    inv = torch.tensor(2.0**-7, device=DEVICE)
    amp.foreach_non_finite_check_and_unscale_reference(ours, fo, inv)
    ref = _torch_unscale(ref, fr, inv)
    for a, b in zip(ours, ref, strict=True):
        _same_bits_or_both_nan(a, b, "reference")
    assert fo.item() == fr.item() == 1.0


def test_block_table_is_cached():
    grads = [torch.randn(100, device=DEVICE), torch.randn(3000, device=DEVICE).half()]
    found, inv = torch.zeros((), device=DEVICE), torch.tensor(1.0, device=DEVICE)
    amp._TABLES.clear()
    amp.foreach_non_finite_check_and_unscale_(grads, found, inv, chunk=1024)
    amp.foreach_non_finite_check_and_unscale_(grads, found, inv, chunk=1024)
    assert len(amp._TABLES) == 1
    (table,) = amp._TABLES.values()
    assert table.shape == (1 + 3, 4)  # 100 elements: one chunk; 3000: three chunks of 1024
    assert table[:, 2].tolist() == [100, 1024, 1024, 952]


def test_unscale_bad_input():
    good = [torch.ones(4, device=DEVICE)]
    found, inv = torch.zeros((), device=DEVICE), torch.tensor(1.0, device=DEVICE)
    with pytest.raises(TypeError, match="grads must be a list"):
        amp.foreach_non_finite_check_and_unscale_(good[0], found, inv)
    with pytest.raises(TypeError, match="found_inf must be a 1-element float32"):
        amp.foreach_non_finite_check_and_unscale_(good, torch.zeros(2, device=DEVICE), inv)
    with pytest.raises(TypeError, match="inv_scale must be a 1-element float32"):
        amp.foreach_non_finite_check_and_unscale_(good, found, inv.double())
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype torch.int32"):
        amp.foreach_non_finite_check_and_unscale_([torch.ones(4, dtype=torch.int32, device=DEVICE)], found, inv)
    with pytest.raises(ValueError, match="chunk must be a positive multiple of 8"):
        amp.foreach_non_finite_check_and_unscale_(good, found, inv, chunk=12)


# -- the controller and the scaler ---------------------------------------------------------------


def test_update_scale_matches_torch():
    rng = random.Random(0)
    cases = [(3e38, 0.0, 4, 5), (1.0, math.nan, 0, 5), (1.0, 2.0, 0, 5), (1.0, 0.0, 0, 1), (1.0, 0.0, 7, 5)]
    for _ in range(300):
        cases.append((rng.uniform(1e-3, 1e6), rng.choice([0.0, 1.0]), rng.randrange(0, 6), rng.randrange(1, 6)))
    for s, found, tracker, interval in cases:
        gf, bf = rng.uniform(1.0001, 4.0), rng.uniform(0.01, 0.999)
        ours_s, ref_s = (torch.tensor(s, dtype=torch.float32, device=DEVICE) for _ in range(2))
        ours_t, ref_t = (torch.tensor(tracker, dtype=torch.int32, device=DEVICE) for _ in range(2))
        f = torch.tensor(found, device=DEVICE)
        amp.update_scale_(ours_s, ours_t, f, gf, bf, interval)
        torch._amp_update_scale_(ref_s, ref_t, f, gf, bf, interval)
        assert bits(ours_s) == bits(ref_s), (s, found, tracker, interval, gf, bf)
        assert ours_t.item() == ref_t.item()


class _Pair:
    """The same tiny model twice, one trained with torch.amp.GradScaler, one with DynamicLossScaler."""

    def __init__(self, seed=0, lr=0.1, dtype=torch.float32, **scaler_args):
        torch.manual_seed(seed)
        self.models = [torch.nn.Linear(8, 4).to(DEVICE, dtype) for _ in range(2)]
        self.models[1].load_state_dict(self.models[0].state_dict())
        self.opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in self.models]
        self.ref = torch.amp.GradScaler(DEVICE, **scaler_args)
        self.ours = amp.DynamicLossScaler(**scaler_args)
        self.x = torch.randn(16, 8, device=DEVICE, dtype=dtype)

    def step(self, poison=None, clip=None):
        """One iteration in both; ``poison`` (inf or NaN) is written into one gradient after backward.
        Returns (skipped by torch, skipped by ours)."""
        skipped = []
        for model, opt, scaler in zip(self.models, self.opts, (self.ref, self.ours), strict=True):
            opt.zero_grad()
            before = [p.detach().clone() for p in model.parameters()]
            loss = model(self.x).pow(2).mean()
            scaler.scale(loss).backward()
            if poison is not None:
                model.weight.grad[1, 2] = poison
            scaler.unscale_(opt)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(opt)
            scaler.update()
            skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)))
        return tuple(skipped)

    def assert_same(self, where):
        assert self.ref.get_scale() == self.ours.get_scale(), f"{where}: scale differs"
        assert self.ref._get_growth_tracker() == self.ours.get_growth_tracker(), f"{where}: growth tracker differs"
        for a, b in zip(self.models[0].parameters(), self.models[1].parameters(), strict=True):
            assert torch.equal(a, b), f"{where}: parameters differ"
        assert self.ref.state_dict() == self.ours.state_dict(), f"{where}: state_dict differs"


def test_scripted_overflow_sequence_matches_gradscaler():
    pair = _Pair(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    script = [None, None, None, math.inf, None, math.nan, math.nan, None, None, None, None, -math.inf] + [None] * 7
    scales = []
    for i, poison in enumerate(script):
        skipped = pair.step(poison, clip=1.0)
        assert skipped[0] == skipped[1] == (poison is not None), f"step {i}: skip decision"
        pair.assert_same(f"step {i}")
        scales.append(pair.ours.get_scale())
    # 3 clean steps grow, each overflow halves and restarts the count.
    assert scales[:8] == [2.0**10, 2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**9, 2.0**8, 2.0**8]


@pytest.mark.parametrize("seed", range(2))
def test_random_overflow_sequences_match_gradscaler(seed):
    rng = random.Random(seed)
    args = {
        "init_scale": rng.choice([2.0**16, 2.0**3, 1000.0]),
        "growth_factor": rng.choice([2.0, 1.5, 3.0]),
        "backoff_factor": rng.choice([0.5, 0.25, 0.7]),
        "growth_interval": rng.choice([1, 2, 5]),
    }
    pair = _Pair(seed=seed, **args)
    for i in range(25):
        poison = rng.choice([math.inf, -math.inf, math.nan]) if rng.random() < 0.3 else None
        skipped = pair.step(poison, clip=rng.choice([None, 0.5]))
        assert skipped[0] == skipped[1], f"step {i}"
        pair.assert_same(f"seed {seed} step {i}")


def test_real_overflow_from_large_scale_matches_gradscaler():
    # No poison: the scale itself is too large for fp16 activations' gradients... here the loss is
    # multiplied past fp32's range, so the overflow is genuine, and both back off until it fits.
    pair = _Pair(init_scale=2.0**120, growth_interval=2)
    pair.x = pair.x * 1e4
    for i in range(12):
        skipped = pair.step()
        assert skipped[0] == skipped[1], f"step {i}"
        pair.assert_same(f"step {i}")
    assert pair.ours.get_scale() < 2.0**120


def test_state_dict_round_trip_between_scalers():
    pair = _Pair(init_scale=2.0**12, growth_interval=4)
    for poison in (None, math.inf, None, None):
        pair.step(poison)
    saved = pair.ours.state_dict()
    assert set(saved) == set(pair.ref.state_dict())
    fresh_ours, fresh_ref = amp.DynamicLossScaler(), torch.amp.GradScaler(DEVICE)
    fresh_ours.load_state_dict(pair.ref.state_dict())  # torch's checkpoint into ours
    fresh_ref.load_state_dict(saved)  # and ours into torch's
    assert fresh_ours.state_dict() == fresh_ref.state_dict() == saved
    pair.ours, pair.ref = fresh_ours, fresh_ref
    for poison in (None, None, None, math.nan, None):
        pair.step(poison)
        pair.assert_same("after restore")
    with pytest.raises(RuntimeError, match="empty"):
        amp.DynamicLossScaler().load_state_dict({})


def test_sparse_gradients_are_unscaled_like_gradscaler():
    """An nn.Embedding(sparse=True) trains with the scaler as with GradScaler: same skips, same bits."""
    torch.manual_seed(0)
    models = [torch.nn.Embedding(10, 4, sparse=True).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    scalers = (torch.amp.GradScaler(DEVICE, init_scale=2.0**10), amp.DynamicLossScaler(init_scale=2.0**10))
    ids = torch.tensor([1, 3, 3, 7], device=DEVICE)  # a repeated index: an uncoalesced sparse gradient
    for step, poison in enumerate((None, math.inf, None)):
        for model, opt, scaler in zip(models, opts, scalers, strict=True):
            opt.zero_grad()
            loss = model(ids).pow(2).sum() * (poison if poison else 1.0)
            scaler.scale(loss).backward()
            assert model.weight.grad.is_sparse
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        assert scalers[0].get_scale() == scalers[1].get_scale(), f"step {step}"
        assert torch.equal(models[0].weight, models[1].weight), f"step {step}"
    assert scalers[1].get_scale() == 2.0**9  # the inf step was skipped and backed off


def test_scaler_refuses_what_gradscaler_refuses():
    model = torch.nn.Linear(4, 2).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.DynamicLossScaler()
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.unscale_(opt)
    scaler.scale(model(torch.ones(1, 4, device=DEVICE)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    half = torch.nn.Linear(4, 2).to(DEVICE, torch.float16)
    opt16 = torch.optim.SGD(half.parameters(), lr=0.1)
    scaler.scale(half(torch.ones(1, 4, device=DEVICE, dtype=torch.float16)).float().sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(opt16)
    for bad in ({"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"growth_interval": 0}, {"init_scale": -1.0}):
        with pytest.raises(ValueError):
            amp.DynamicLossScaler(**bad)
    disabled = amp.DynamicLossScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert disabled.scale(loss) is loss and disabled.get_scale() == 1.0 and disabled.state_dict() == {}


@pytest.mark.parametrize("unscale_first", [False, True], ids=["step only", "unscale_ then step"])
def test_fused_optimizers_get_the_scale_as_gradscaler_hands_it(unscale_first):
    """Adam(fused=True) unscales inside its own kernel: GradScaler hands it S (it divides) and found_inf
    (it skips); the scaler must do the same, or a scale that is not a power of two (1000) gives other
    bits from the first step.  With unscale_() first, both multiply by fp32(1/S) and hand only found_inf."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 4).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2, fused=True) for m in models]
    scalers = (
        torch.amp.GradScaler(DEVICE, init_scale=1000.0, growth_interval=2),
        amp.DynamicLossScaler(1000.0, growth_interval=2),
    )
    x = torch.randn(16, 8, device=DEVICE)
    for step, poison in enumerate((None, None, math.inf, None, None, math.nan, None)):
        grads = []
        for model, opt, scaler in zip(models, opts, scalers, strict=True):
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            if poison is not None:
                model.weight.grad[0, 0] = poison
            if unscale_first:
                scaler.unscale_(opt)
            scaler.step(opt)
            grads.append(model.weight.grad.clone())
            scaler.update()
            assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        assert scalers[0].get_scale() == scalers[1].get_scale(), f"step {step}"
        assert torch.equal(grads[0], grads[1]) or poison is not None, f"step {step}: gradients differ"
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: parameters differ"
        assert opts[0].state_dict()["state"][0]["step"] == opts[1].state_dict()["state"][0]["step"]
