"""kernels.fp4_training: the contenders of chapter 6's FP4 training runs and the record they leave."""

import json

import pytest
import torch

from kernels import fp4_linear, fp4_training
from kernels.device import default_device
from kernels.fp8_linear import FP8Recipe

DEVICE = default_device()  # where the package's kernels run: the CPU in CPU mode, the GPU on the GPU lane
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
    out = fp4_training.run("bf16", 3, 1, part, device=DEVICE, **TINY)
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


def _as_if_on_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fp4_training, "step_ms", lambda name, steps=100: {"bf16": 10.0, "nvfp4": 25.0}[name])
    from kernels.bench import command

    monkeypatch.setattr(command, "environment", lambda: {"device": "a GPU", "commit": "abc"})


def test_the_timing_and_the_runs_can_be_done_apart(tmp_path, monkeypatch, capsys):
    _as_if_on_a_gpu(monkeypatch)
    out = tmp_path / "gpu-fp4.json"
    assert fp4_training.main(["--time-only", "--out", str(out), "bf16", "nvfp4"]) == 0
    assert not out.exists(), "timing alone writes no record"
    # the runs, as a --no-time run (or a killed one) leaves them in the parts
    for name in ("bf16", "nvfp4"):
        fp4_training._write(fp4_training._part(out, name), {"steps": [0], "loss": [4.5], "complete": True})
    assert fp4_training.main(["--merge", "--steps", "1", "--out", str(out), "bf16", "nvfp4"]) == 0
    rec = fp4_training.load(out)
    assert rec["step_ms"] == {"bf16": 10.0, "nvfp4": 25.0} and rec["device"] == "a GPU"
    assert rec["timing"] == {"device": "a GPU", "commit": "abc", "steps_timed": 100}, "what timed the steps"
    assert set(rec["runs"]) == {"bf16", "nvfp4"} and rec["settings"]["steps"] == 1
    assert "25.00 ms/step, final loss 4.5000" in capsys.readouterr().out


def test_timing_again_updates_the_record_of_the_runs_and_keeps_them(tmp_path, monkeypatch):
    _as_if_on_a_gpu(monkeypatch)
    out = tmp_path / "gpu-fp4.json"
    runs = {"bf16": {"steps": [0], "loss": [4.5], "complete": True}}
    fp4_training._write(out, {"device": "old", "runs": runs, "step_ms": {"bf16": 99.0, "fp8": 50.0}, "timing": None})
    assert fp4_training.main(["--time-only", "--time-steps", "7", "--out", str(out), "bf16"]) == 0
    rec = fp4_training.load(out)
    assert rec["runs"] == runs and rec["device"] == "old", "the runs and their machine stay"
    assert rec["step_ms"] == {"bf16": 10.0, "fp8": 50.0}, "the contenders timed again, and only they, change"
    assert rec["timing"]["steps_timed"] == 7 and rec["timing"]["commit"] == "abc"


def test_a_merge_without_times_says_so(tmp_path, monkeypatch, capsys):
    _as_if_on_a_gpu(monkeypatch)
    out = tmp_path / "gpu-fp4.json"
    fp4_training._write(fp4_training._part(out, "bf16"), {"steps": [0], "loss": [4.5], "complete": False})
    assert fp4_training.main(["--merge", "--out", str(out), "bf16", "nvfp4"]) == 0
    printed = capsys.readouterr().out
    assert "bf16: not timed, final loss 4.5000" in printed and "nvfp4: not timed, no run" in printed
    rec = fp4_training.load(out)
    assert rec["step_ms"] == {} and rec["timing"] is None


def test_the_halves_exclude_one_another(capsys, monkeypatch):
    _as_if_on_a_gpu(monkeypatch)
    with pytest.raises(SystemExit):
        fp4_training.main(["--time-only", "--no-time"])
    assert "exclude one another" in capsys.readouterr().err


def test_load_finds_the_one_record_and_refuses_to_guess_between_several(tmp_path, monkeypatch):
    monkeypatch.setattr(fp4_training, "RESULTS", tmp_path)
    with pytest.raises(FileNotFoundError, match="no training record"):
        fp4_training.load()
    (tmp_path / "h100-fp4.json").write_text('{"device": "H100"}')
    assert fp4_training.load() == {"device": "H100"}
    (tmp_path / "h200-fp4.json").write_text('{"device": "H200"}')
    with pytest.raises(ValueError, match="several training records"):
        fp4_training.load()


def test_runs_a_kill_left_uneven_are_cut_to_the_steps_they_all_logged():
    def run(n, complete=False):
        return {"steps": list(range(0, 10 * n, 10)), "loss": [1.0] * n, "complete": complete}

    runs, steps = fp4_training._common_steps({"a": run(37), "b": run(25)}, 3000, 10)
    assert steps == 200 and all(r["steps"] == list(range(0, 200, 10)) and not r["complete"] for r in runs.values())
    whole = {"a": run(300, True), "b": run(300, True)}
    assert fp4_training._common_steps(whole, 3000, 10) == (whole, 3000)
    assert fp4_training._common_steps({"a": run(5), "b": run(7)}, 3000, 10)[1] == 50  # fewer than 100: as logged


@pytest.mark.parametrize("name", ["bf16", "nvfp4"])
def test_a_step_is_timed_on_the_model_its_run_trains(name, monkeypatch):
    seen = []
    real = fp4_linear.prepare

    def spy(model, recipe, keep):
        seen.append((recipe, keep))
        real(model, recipe, keep)

    monkeypatch.setattr(fp4_linear, "prepare", spy)
    ms = fp4_training.step_ms(name, steps=2, warmup=1, device=DEVICE, **TINY)
    assert ms > 0 and seen == [fp4_training.contenders()[name]]
