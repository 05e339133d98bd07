"""Chapter 6's FP4 training runs: the character model in bf16, in FP8 and in FP4 by the NVFP4 recipe, and
the recipe with one ingredient removed at a time, recorded with the machine that ran them.

Chapter 6 (section 10, training in FP4); no lab.  Entry points: :func:`contenders`, :func:`run`,
:func:`record`, :func:`load`, and the command below.

``python -m kernels.fp4_training [--steps N] [--log-every N] [--jobs N] [--out PATH] [NAME ...]`` trains
every contender of :func:`contenders` (or the named ones) for the same steps from the same seed, each in a
process of its own (the model is small; one GPU runs several at once), then times a training step of each,
one after the other in one process (a ratio to bf16 measured in the same run), and writes the record
(:func:`record`) to ``benchmarks/training/<gpu>-fp4.json``.  Chapter 6 reads it with :func:`load` and
judges each run with :func:`kernels.fp4_linear.verdicts`.  A run killed before its end leaves its losses so
far in ``<out>.parts/``; ``--merge`` writes the record from them.  The two halves can run apart, so that
the timing has the GPU to itself while something else shares it with the runs: ``--time-only`` times the
steps and keeps them in ``<out>.parts/`` (and puts them in the record at ``<out>``, if there is one),
``--no-time`` runs the contenders and writes the record with the times kept there.
"""

import argparse
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import torch

from kernels import ROOT

RESULTS = ROOT / "benchmarks" / "training"
SETTINGS = {"batch": 64, "lr": 3e-3, "seed": 0}  # chapter 4's defaults for the character model


def contenders() -> dict:
    """name -> (recipe, keep_sensitive) for :func:`kernels.fp4_linear.train`: the bf16 baseline, chapter 5's
    FP8 layer (tensorwise scales), the NVFP4 recipe, and the recipe without one ingredient each."""
    from kernels.fp4_linear import FP4Recipe
    from kernels.fp8_linear import FP8Recipe

    return {
        "bf16": (None, True),
        "fp8": (FP8Recipe(), True),
        "nvfp4": (FP4Recipe(), True),
        "no SR": (FP4Recipe(stochastic_rounding=False), True),
        "no RHT": (FP4Recipe(rht=False), True),
        "1x16 weights": (FP4Recipe(weight_tiles=False), True),
        "every layer in FP4": (FP4Recipe(), False),
        "mxfp4": (FP4Recipe("mxfp4", weight_tiles=False), True),
    }


def _names(names) -> list:
    known = contenders()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown contenders {unknown}; the contenders are {list(known)}")
    return list(names) or list(known)


def run(name: str, steps: int, log_every: int, part: Path | None = None, device=None, **settings) -> dict:
    """Train contender ``name`` for ``steps`` steps, logging every ``log_every``; with ``part``, the losses
    so far are written there at every logged step.  ``settings`` override :data:`SETTINGS` (and may give
    ``model_args``).  Returns ``{"steps", "loss", "complete"}``."""
    from kernels import fp4_linear

    recipe, keep = contenders()[name]

    def progress(out):
        if part is not None:
            logged = len(out["loss"])
            _write(part, {"steps": list(range(0, steps, log_every))[:logged], "loss": out["loss"], "complete": False})

    kw = {**SETTINGS, **settings}
    out = fp4_linear.train(recipe, keep, steps=steps, log_every=log_every, device=device, progress=progress, **kw)
    result = {"steps": out["steps"], "loss": out["loss"], "complete": True}
    if part is not None:
        _write(part, result)
    return result


def step_ms(name: str, steps: int = 100, warmup: int = 10, device=None, **settings) -> float:
    """Milliseconds per training step of contender ``name``: forward, backward and AdamW on the model and
    batch of the runs (:func:`kernels.charmodel.train_step`, bf16 autocast), without the runs' logging,
    timed over ``steps`` steps after ``warmup`` (the first compiles).  ``settings`` override
    :data:`SETTINGS` (and may give ``model_args``)."""
    from kernels import charmodel, fp4_linear
    from kernels.device import default_device

    recipe, keep = contenders()[name]
    kw = {**SETTINGS, **settings}
    device = device or default_device()
    ids, vocab = charmodel.load_corpus()
    torch.manual_seed(kw["seed"])
    model = charmodel.CharTransformer(len(vocab), **kw.get("model_args", {})).to(device)
    fp4_linear.prepare(model, recipe, keep)
    optimizer = torch.optim.AdamW(model.parameters(), lr=kw["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(kw["seed"] + 1)
    batches = [charmodel.windows(ids, kw["batch"], model.context, gen, device) for _ in range(8)]

    autocast_dtype = charmodel.RECIPES["bf16"][0]

    def run(n):
        for i in range(n):
            charmodel.train_step(model, optimizer, None, *batches[i % len(batches)], autocast_dtype)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    run(warmup)
    start = time.perf_counter()
    run(steps)
    return (time.perf_counter() - start) / steps * 1e3


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _part(out: Path, name: str) -> Path:
    return out.with_suffix(".parts") / (name.replace(" ", "_") + ".json")


def _worker(args):
    name, steps, log_every, part = args
    return name, run(name, steps, log_every, Path(part))


def _common_steps(runs: dict, steps: int, log_every: int, round_to: int = 100) -> tuple:
    """Runs a kill left at different steps, cut to the steps all of them logged (a multiple of
    ``round_to`` steps, when there are that many), so that they compare at the same step: ``(runs,
    steps)``.  Complete runs of ``steps`` steps are returned as they are."""
    if not runs or all(r["complete"] and len(r["loss"]) == len(range(0, steps, log_every)) for r in runs.values()):
        return runs, steps
    logged = min(len(r["loss"]) for r in runs.values())
    cut = logged * log_every
    if cut >= round_to:
        cut -= cut % round_to
    n = len(range(0, cut, log_every))
    return {k: {"steps": r["steps"][:n], "loss": r["loss"][:n], "complete": False} for k, r in runs.items()}, cut


def timing(names, steps: int = 100) -> dict:
    """``{"step_ms": {name: ms}, "timing": the machine, stack and commit that timed them}``: a step of each
    contender of ``names`` timed by :func:`step_ms`, one after the other in this process."""
    from kernels.bench.command import environment

    ms = {}
    for n in names:
        ms[n] = step_ms(n, steps)
        print(f"{n:>20}: {ms[n]:.2f} ms/step", flush=True)
    return {"step_ms": ms, "timing": {**environment(), "steps_timed": steps}}


def record(runs: dict, timed: dict, steps: int, log_every: int) -> dict:
    """The record of a set of runs: the machine and stack that ran them
    (:func:`kernels.bench.command.environment`), the settings, each run's losses, and each contender's
    milliseconds per step with what timed them (``timed``, from :func:`timing`)."""
    from kernels.bench.command import environment

    settings = {**SETTINGS, "steps": steps, "log_every": log_every, "model": "CharTransformer defaults"}
    return {**environment(), "settings": settings, "runs": runs, "step_ms": {}, "timing": None, **timed}


def load(path=None) -> dict:
    """A record written by this module (default: the one under :data:`RESULTS`, which chapter 6 reads)."""
    if path is None:
        found = sorted(RESULTS.glob("*-fp4.json"))
        if len(found) > 1:
            raise ValueError(f"several training records under {RESULTS}: {[f.name for f in found]}; pass path=")
        path = found[0] if found else RESULTS / "<gpu>-fp4.json"
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no training record at {path}; run python -m kernels.fp4_training on a GPU")
    return json.loads(path.read_text())


def limit(vocab: int) -> float:
    """The loss of a uniform guess over ``vocab`` characters: a run above it has diverged."""
    return math.log(vocab)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.fp4_training", description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"contenders (default: all of {list(contenders())})")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--jobs", type=int, default=8, help="runs at once (processes)")
    p.add_argument("--time-steps", type=int, default=100, help="steps timed per contender")
    p.add_argument("--out", type=Path, default=None, help="the record (default benchmarks/training/<gpu>-fp4.json)")
    p.add_argument("--merge", action="store_true", help="write the record from the parts a killed run left")
    p.add_argument("--time-only", action="store_true", help="time the steps, keep them in the parts, train nothing")
    p.add_argument("--no-time", action="store_true", help="train, and take the step times a --time-only run kept")
    a = p.parse_args(argv)
    if a.steps < 1 or a.log_every < 1 or a.jobs < 1 or a.time_steps < 1:
        p.error("--steps, --log-every, --jobs and --time-steps must be positive")
    if a.merge + a.time_only + a.no_time > 1:
        p.error("--merge, --time-only and --no-time exclude one another")
    names = _names(a.names)
    if not torch.cuda.is_available():
        p.error("the training runs need a CUDA GPU (in CPU mode, call kernels.fp4_linear.train with a few steps)")
    from kernels.bench.command import gpu_slug

    out = a.out or RESULTS / f"{gpu_slug(torch.cuda.get_device_name())}-fp4.json"
    times = out.with_suffix(".parts") / "_step_ms.json"
    if a.time_only:
        timed = timing(names, a.time_steps)
        _write(times, timed)
        print(f"kept the step times in {times}")
        if out.exists():  # a record of runs already made: its step times are these
            rec = json.loads(out.read_text())
            rec["step_ms"], rec["timing"] = {**rec.get("step_ms", {}), **timed["step_ms"]}, timed["timing"]
            _write(out, rec)
            print(f"and in {out}")
        return 0
    if not a.merge:
        jobs = [(n, a.steps, a.log_every, str(_part(out, n))) for n in names]
        started = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(min(a.jobs, len(jobs))) as pool:
            runs = dict(pool.map(_worker, jobs, chunksize=1))
        print(f"{len(runs)} runs of {a.steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
    else:
        runs = {n: json.loads(_part(out, n).read_text()) for n in names if _part(out, n).exists()}
        runs, a.steps = _common_steps(runs, a.steps, a.log_every)
        print(f"merged {len(runs)} runs of {a.steps} steps")
    if a.merge or a.no_time:
        timed = json.loads(times.read_text()) if times.exists() else {}
    else:
        timed = timing(names, a.time_steps)
    ms = timed.get("step_ms", {})
    for n in names:
        shown = f"{ms[n]:.2f} ms/step" if n in ms else "not timed"
        final = f"final loss {runs[n]['loss'][-1]:.4f}" if n in runs else "no run"
        print(f"{n:>20}: {shown}, {final}", flush=True)
    _write(out, record(runs, timed, a.steps, a.log_every))
    print(f"wrote {out}")
    return 0


__all__ = ["RESULTS", "SETTINGS", "contenders", "limit", "load", "main", "record", "run", "step_ms", "timing"]

if __name__ == "__main__":
    sys.exit(main())
