"""kernels.finetune: recipes are checked, every run logs what it promises, and at the first step after the
data shift a delayed-scaling history carried from pretraining saturates where current scaling does not."""

import pytest
import torch

from kernels import finetune as F

MODEL = dict(dim=16, layers=1, heads=2, context=8)


@pytest.fixture(scope="module")
def checkpoint():
    return F.pretrain(steps=20, batch=4, model_args=MODEL)[0]


def test_bad_recipe_is_refused(checkpoint):
    with pytest.raises(ValueError, match="recipe must be one of") as e:
        F.finetune(checkpoint, "fp8 rowwise", steps=1, model_args=MODEL)
    for name in F.RECIPES:
        assert repr(name) in str(e.value)


@pytest.mark.parametrize("recipe", F.RECIPES)
def test_measurements_have_keys_and_lengths(checkpoint, recipe):
    run = F.finetune(checkpoint, recipe, steps=2, batch=4, model_args=MODEL, history_len=4)
    keys = {"loss"}
    if recipe != "bf16":
        keys |= {f"{k}_{role}" for k in ("saturated", "flushed", "amax_ratio") for role in F.ROLES}
    assert set(run) == keys
    assert all(len(v) == 2 for v in run.values())
    if recipe == "fp8 current":  # its own amax: the scale always covers the tensor
        assert all(run[f"saturated_{role}"] == [0.0, 0.0] for role in F.ROLES)


def test_delayed_saturates_at_the_shift(checkpoint):
    kw = dict(steps=1, batch=4, model_args=MODEL, history_len=4)
    current, delayed = (F.finetune(checkpoint, r, **kw) for r in ("fp8 current", "fp8 delayed"))

    def saturated(run):
        return sum(run[f"saturated_{role}"][0] for role in F.ROLES)

    assert saturated(current) == 0
    assert saturated(delayed) > saturated(current)
    assert max(delayed[f"amax_ratio_{role}"][0] for role in F.ROLES) > 1


def test_cipher_is_a_permutation():
    ids = torch.arange(10).repeat(3)
    new = F.cipher(ids, 10, seed=1)
    assert sorted(new[:10].tolist()) == list(range(10))
    assert torch.equal(new[10:20], new[:10])
