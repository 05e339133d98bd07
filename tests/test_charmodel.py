"""kernels.charmodel: the corpus comes back as its text, a run logs every series at every logged step,
and a step whose scaled gradients overflow is skipped without touching the weights."""

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
    for key in ("loss", "zero_grad_fraction", "underflow_fraction", "unmoved_fraction", "scale"):
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
