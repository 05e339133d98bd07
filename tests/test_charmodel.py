"""kernels.charmodel: the corpus comes back as its text, a run logs every series at every logged step,
a step whose scaled gradients overflow is skipped without touching the weights, and a narrow optimizer
state is stored in its dtype without changing the optimizer's arithmetic."""

import math

import pytest
import torch

from kernels import ROOT, amp, charmodel
from kernels.device import default_device

DEVICE = default_device()
TINY = {"dim": 32, "layers": 1, "heads": 2, "context": 16}


def test_corpus_ids_spell_the_text():
    ids, vocab = charmodel.load_corpus()
    text = (ROOT / charmodel.CORPUS).read_text(encoding="ascii")
    assert vocab == "".join(sorted(set(text)))
    assert ids.dtype == torch.int64 and ids.numel() == len(text)
    assert "".join(vocab[i] for i in ids[:500].tolist()) == text[:500]


def test_unknown_recipe_is_named():
    with pytest.raises(ValueError, match="recipe must be one of"):
        charmodel.train("fp8", steps=1)


@pytest.mark.parametrize("recipe", ["fp32", "fp16 + loss scaling"])
def test_a_run_logs_every_series_at_every_logged_step(recipe):
    out = charmodel.train(recipe, steps=5, batch=4, model_args=TINY, device=DEVICE, log_every=2)
    assert out["steps"] == [0, 2, 4]
    for key in ("loss", "zero_grad_fraction", "underflow_fraction", "unmoved_fraction", "scale", "zero_v_fraction"):
        assert len(out[key]) == 3, key
    assert all(math.isfinite(v) for v in out["loss"]) and out["nonfinite_step"] is None
    assert out["loss"][-1] < math.log(len(charmodel.load_corpus()[1])) + 0.5  # near or below uniform guessing
    if recipe == "fp32":
        assert out["scale"] == [1.0, 1.0, 1.0]
    else:  # no growth within 2000 clean steps: the last scale is the first halved once per skipped step
        assert out["scale"][-1] == amp.DynamicLossScaler().get_scale() * 0.5 ** out["skipped"]


def test_an_overflowing_step_is_skipped_and_leaves_the_weights():
    torch.manual_seed(0)
    ids, vocab = charmodel.load_corpus()
    model = charmodel.CharTransformer(len(vocab), **TINY).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = amp.DynamicLossScaler(init_scale=2.0**16)
    x = ids[: 4 * 16].reshape(4, 16).to(DEVICE)
    y = ids[1 : 4 * 16 + 1].reshape(4, 16).to(DEVICE)
    before = [p.detach().clone() for p in model.parameters()]
    # Whether scaling alone overflows depends on the device's summation order, so one element of
    # the head's gradient is made inf: the overflow every scaled backward can meet, on either lane.
    overflow = model.head.weight.register_hook(lambda g: g.index_fill(0, torch.tensor([0], device=g.device), math.inf))
    loss, skipped = charmodel.train_step(model, opt, scaler, x, y)
    overflow.remove()
    assert skipped and math.isfinite(float(loss))
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15  # backed off once
    loss, skipped = charmodel.train_step(model, opt, None, x, y)  # no scaler: a plain step moves the weights
    assert not skipped and not all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_keep_state_in_stores_the_moments_narrow_and_steps_like_adamw():
    torch.manual_seed(0)
    plain = torch.nn.Linear(8, 4).to(DEVICE)
    narrow = torch.nn.Linear(8, 4).to(DEVICE)
    narrow.load_state_dict(plain.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (plain, narrow)]
    charmodel.keep_state_in(opts[1], torch.float16)
    x = torch.randn(16, 8, device=DEVICE)
    for model, opt in zip((plain, narrow), opts, strict=True):
        model(x).pow(2).mean().backward()
        opt.step()
    # The first step starts from zero moments either way, so its arithmetic is AdamW's to the bit;
    # what is stored afterwards is AdamW's fp32 state rounded once to fp16.
    for p, q in zip(plain.parameters(), narrow.parameters(), strict=True):
        assert torch.equal(p, q) and q.dtype == torch.float32
        for key in charmodel.MOMENTS:
            assert opts[1].state[q][key].dtype == torch.float16, key
            assert torch.equal(opts[1].state[q][key], opts[0].state[p][key].half()), key
    narrow(x).pow(2).mean().backward()
    opts[1].step()  # widened for the step, stored narrow again after it
    assert all(s[key].dtype == torch.float16 for s in opts[1].state.values() for key in charmodel.MOMENTS)


def test_a_run_with_fp16_state_trains_and_logs_its_lost_second_moments():
    kwargs = {"steps": 3, "batch": 4, "model_args": TINY, "device": DEVICE}
    wide = charmodel.train("fp32", **kwargs)
    narrow = charmodel.train("fp32", optimizer_state_dtype=torch.float16, **kwargs)
    assert wide["loss"][0] == narrow["loss"][0]  # same seed, same model, same first batch
    assert wide["zero_v_fraction"] == [0.0, 0.0, 0.0]
    assert len(narrow["zero_v_fraction"]) == 3 and narrow["zero_v_fraction"][0] > 0  # g^2 of small gradients


@pytest.mark.parametrize("bad", [torch.int8, "fp16", torch.float64])
def test_a_bad_state_dtype_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"optimizer_state_dtype must be None or one of \(torch.float32"):
        charmodel.train("fp32", steps=1, optimizer_state_dtype=bad)
