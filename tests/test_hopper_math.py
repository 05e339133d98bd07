"""CPU mode's approximate fp32 math gives compiled Triton's bits (tests/data/hopper_approx.npz).

The recording holds fp32 ``x / y``, ``tl.sqrt``, ``tl.rsqrt``, ``tl.exp``, ``tl.exp2``, ``tl.log`` and
``tl.log2`` as compiled Triton computed them on an H200 (tests/data/record_hopper_approx.py), on
adversarial inputs of every magnitude; CPU mode must reproduce every bit.  The same recording run
writes the special-function tables that :mod:`kernels._hopper_math` looks results up in.
"""

import pathlib

import numpy as np
import pytest

import kernels
from kernels import _hopper_math as H
from kernels import numerics_probe as probe
from kernels.testing import first_mismatches

RECORDING = pathlib.Path(__file__).parent / "data" / "hopper_approx.npz"


@pytest.fixture(scope="module")
def recorded():
    return np.load(RECORDING)


def test_recording_and_tables_come_from_hopper(recorded):
    for meta in (dict(recorded), {f"meta_{k}": v for k, v in H.provenance().items()}):
        assert str(meta["meta_capability"]) == "9.0", "must be recorded on a Hopper GPU"
        assert "H200" in str(meta["meta_device"]) or "H100" in str(meta["meta_device"])
    assert str(recorded["meta_commit"]) == H.provenance()["commit"], "tables and samples from one recording run"


@pytest.mark.parametrize("op", probe.APPROX_OPS)
def test_numpy_model_matches_hopper(recorded, op):
    x, y = recorded["approx_x"], recorded["approx_y"]
    xf = x.view(np.float32)
    got = (H.div(xf, y.view(np.float32)) if op == "div" else H.UNARY[op](xf)).view(np.uint32)
    want = recorded[f"approx_{op}"]
    bad = np.flatnonzero(got != want)
    inputs = np.stack([x, y], axis=1) if op == "div" else x
    assert bad.size == 0, first_mismatches(inputs, got, want, bad, what=f"fp32 {op}")
    print(f"{op}: {x.size} inputs, 0 mismatches")


@pytest.mark.skipif(not kernels.INTERPRETER, reason="needs CPU mode (the interpreter)")
@pytest.mark.parametrize("op", probe.APPROX_OPS)
def test_cpu_mode_kernels_match_hopper(recorded, op):
    """The recorded kernels themselves, run in CPU mode."""
    x, y = recorded["approx_x"], recorded["approx_y"]
    got = probe.approx(x, y, op, "cpu")
    want = recorded[f"approx_{op}"]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, first_mismatches(x, got, want, bad, what=f"CPU-mode {op}")


def test_compiled_math_is_not_ieee(recorded):
    """What the recording shows: ``/`` and the special functions are not correctly rounded on Hopper,
    so a model that computed them exactly (as numpy does) would print other numbers."""
    x = recorded["approx_x"].view(np.float32)
    y = recorded["approx_y"].view(np.float32)
    with np.errstate(all="ignore"):
        exact = {
            "div": x.astype(np.float64) / y.astype(np.float64),
            "sqrt": np.sqrt(x.astype(np.float64)),
            "exp2": np.exp2(x.astype(np.float64)),
        }
    for op, ref in exact.items():
        want = recorded[f"approx_{op}"].view(np.float32)
        with np.errstate(all="ignore"):
            ref32 = ref.astype(np.float32)
        finite = np.isfinite(ref32) & np.isfinite(want) & (np.abs(ref32) >= np.float32(2.0**-126))
        assert (want[finite] != ref32[finite]).mean() > 0.05, f"{op} looks correctly rounded"


@pytest.mark.parametrize(
    "a,b,c",
    [
        (1.0 + 2.0**-23, 1.0 - 2.0**-23, -1.0),  # the product's low bits survive only in a fused op
        (3.0, 2.0**-30, 1.0),
        (1e30, 1e10, -np.inf),
        (-0.0, 1.0, 0.0),
    ],
)
def test_fma_rounds_once(a, b, c):
    from fractions import Fraction

    got = H.fma(np.float32(a), np.float32(b), np.float32(c))
    if np.isfinite(c):
        exact = Fraction(float(np.float32(a))) * Fraction(float(np.float32(b))) + Fraction(float(np.float32(c)))
        # float64 of the exact value, then fp32: exact in float64 for these inputs
        assert float(got) == float(np.float32(float(exact)))
    else:
        assert got == np.float32(c)
