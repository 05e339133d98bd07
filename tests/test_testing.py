"""The comparison helpers must catch what they claim to catch, and say what they saw."""

import math

import numpy as np
import pytest
import torch

from kernels import testing


def test_verify_prints_errors_even_on_success(capsys):
    ref = torch.linspace(-3, 3, 101, dtype=torch.float64)
    result = testing.verify(ref + 1e-4, ref, atol=1e-3, rtol=0, name="shifted")
    out = capsys.readouterr().out
    assert "max_abs=1.0000e-04" in out and "max_rel=" in out and "mismatches=0/101" in out
    assert result.ok and math.isclose(result.max_abs, 1e-4, rel_tol=1e-3)


def test_verify_names_first_mismatches():
    ref = torch.zeros(4, 5)
    ours = ref.clone()
    ours[2, 3] = 0.5
    with pytest.raises(AssertionError, match=r"\[\(2, 3\)\]: got 0.5, want 0"):
        testing.verify(ours, ref, atol=1e-3, rtol=0)


def test_nan_where_reference_has_none_is_reported_apart():
    ref = torch.ones(8)
    ours = ref.clone()
    ours[5] = float("nan")
    result = testing.compare(ours, ref, atol=10.0, rtol=10.0)
    assert not result.ok
    assert "1 NaN where the reference has none" in result.report


def test_missing_nan_and_wrong_inf_sign_are_caught():
    ref = torch.tensor([float("nan"), float("inf"), 1.0])
    assert (
        "0 NaN where the reference has none, 1 missing"
        in testing.compare(torch.tensor([0.0, float("inf"), 1.0]), ref).report
    )
    bad_inf = testing.compare(torch.tensor([float("nan"), -float("inf"), 1.0]), ref)
    assert not bad_inf.ok and "inf disagreement at 1" in bad_inf.report
    assert testing.compare(ref.clone(), ref).ok


def test_shape_mismatch_is_an_error_not_a_broadcast():
    with pytest.raises(ValueError, match="shape"):
        testing.compare(torch.zeros(3, 1), torch.zeros(3))


@pytest.mark.parametrize(
    "a,b,dist",
    [
        (1.0, 1.0, 0),
        (1.0, 1.0078125, 1),  # one bf16 step above 1
        (0.0, -0.0, 1),
        (-1.0, 1.0, 2 * 0x3F80 + 1),
        (3.3895313892515355e38, float("inf"), 1),  # bf16 max -> inf
    ],
)
def test_code_distance_bf16(a, b, dist):
    ta = torch.tensor([a], dtype=torch.bfloat16)
    tb = torch.tensor([b], dtype=torch.bfloat16)
    assert testing.code_distance(ta, tb)[0] == dist


def test_code_distance_marks_nan_and_refuses_mixed_dtypes():
    a = torch.tensor([float("nan"), 1.0])
    assert testing.code_distance(a, torch.ones(2)).tolist() == [-1, 0]
    with pytest.raises(TypeError, match="one dtype"):
        testing.code_distance(a, a.half())


def test_assert_bits_equal_sees_signed_zero_and_nan_payload(capsys):
    x = torch.tensor([0.0, 1.0])
    testing.assert_bits_equal(x, x.clone(), name="same")
    assert "2/2 bit-identical" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="1 of 2 differ"):
        testing.assert_bits_equal(torch.tensor([-0.0, 1.0]), x)
    q = torch.tensor([0x7FC00000, 0x7FC00001], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError, match="0x7fc00001"):
        testing.assert_bits_equal(q, q[:1].expand(2).contiguous())


def test_check_kernel_catches_a_kernel_wrong_only_on_large_values():
    def wrong(x):  # saturates at 1e3: invisible on randn, caught by the 1e4 case
        return x.clamp(-1e3, 1e3)

    assert testing.check_kernel(lambda x: x * 1.0, lambda x: x, exact=True) > 0
    with pytest.raises(AssertionError, match="large"):
        testing.check_kernel(wrong, lambda x: x, exact=True)


def test_check_kernel_catches_nan_on_zeros():
    def normalise(x):  # divides by the max: NaN on the all-zeros input
        return x / x.abs().max()

    def ref(x):
        m = x.abs().max()
        return x / m if m > 0 else x

    with pytest.raises(AssertionError, match="zeros"):
        testing.check_kernel(normalise, ref, atol=1e-6, rtol=1e-6)


def test_every_tolerance_says_why():
    for key, tol in testing.TOLERANCES.items():
        assert tol.why and tol.atol >= 0 and tol.rtol >= 0, key
    assert testing.tolerance("gemm", torch.bfloat16).rtol == 1e-2
    with pytest.raises(KeyError, match="known"):
        testing.tolerance("gemm", torch.int8)


def test_first_mismatches_shows_inputs_in_hex():
    msg = testing.first_mismatches(
        np.array([0x3F808000], dtype=np.uint32), np.array([0x3F81], np.uint16), np.array([0x3F80], np.uint16), [0]
    )
    assert "input 0x3f808000: got 0x3f81, want 0x3f80" in msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_special_inputs_hold_what_their_names_say(dtype):
    cases = testing.special_inputs((7, 33), dtype)
    assert all(x.shape == (7, 33) and x.dtype == dtype for x in cases.values())
    specials = cases["nan/inf"].float()
    assert specials.isnan().any() and (specials == float("inf")).any() and (specials == -float("inf")).any()
    sub = cases["subnormals"].float().abs()
    assert ((sub > 0) & (sub < torch.finfo(dtype).tiny)).any(), "no subnormal of the dtype"
    assert torch.signbit(cases["negative zeros"]).all() and (cases["negative zeros"] == 0).all()
    assert cases["huge"].float().abs().max() > torch.finfo(dtype).max / 8
