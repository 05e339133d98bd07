"""kernels.fp4_training: the contenders of chapter 6's FP4 training runs and the record they leave."""

import json

import pytest
import torch

from kernels import fp4_linear, fp4_training
from kernels.fp8_linear import FP8Recipe

TINY = {"batch": 2, "model_args": {"dim": 32, "layers": 2, "heads": 2, "context": 32}}


def test_each_ablation_removes_exactly_one_ingredient_of_the_recipe():
    c = fp4_training.contenders()
    assert c["bf16"] == (None, True) and c["fp8"] == (FP8Recipe(), True)
    recipe, keep = c["nvfp4"]
    assert recipe == fp4_linear.FP4Recipe() and keep
    removed = {
        "no SR": {"stochastic_rounding"},
        "no RHT": {"rht"},
        "1x16 weights": {"weight_tiles"},
        "mxfp4": {"fmt", "weight_tiles"},  # MXFP4 has no 16x16 tiles
        "every layer in FP4": set(),
    }
    for name, fields in removed.items():
        r, k = c[name]
        fields_of = ("fmt", "weight_tiles", "stochastic_rounding", "rht", "seed")
        changed = {f for f in fields_of if getattr(r, f) != getattr(recipe, f)}
        assert changed == fields, name
        assert k is (name != "every layer in FP4"), name


def test_unknown_contenders_are_refused_by_name():
    with pytest.raises(ValueError, match="no such"):
        fp4_training._names(["no such"])
    assert fp4_training._names([]) == list(fp4_training.contenders())


def test_a_run_writes_its_losses_as_it_goes(tmp_path, monkeypatch):
    part = tmp_path / "bf16.json"
    seen = []
    real = fp4_training._write

    def spy(path, data):
        seen.append(len(data["loss"]))
        real(path, data)

    monkeypatch.setattr(fp4_training, "_write", spy)
    out = fp4_training.run("bf16", 3, 1, part, device="cpu", **TINY)
    assert seen == [1, 2, 3, 3], "after every logged step, then the complete run"
    assert json.loads(part.read_text()) == out
    assert out["complete"] and out["steps"] == [0, 1, 2] and len(out["loss"]) == 3
    assert all(loss > 0 for loss in out["loss"])


def test_the_command_refuses_to_run_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        fp4_training.main(["--steps", "2"])
    assert "CUDA GPU" in capsys.readouterr().err


def test_the_limit_is_a_uniform_guess():
    assert fp4_training.limit(100) == pytest.approx(4.60517, abs=1e-5)
