"""In CPU mode the exercise checks refuse out-of-bounds kernels, as the batch grader does."""

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels._bounds import OutOfBounds
from kernels.checks import call_student


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask if MASKED else None)
    tl.store(y_ptr + offs, x, mask=mask)


def _copy(x, masked):
    y = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, MASKED=masked)
    return y


@pytest.mark.skipif(not kernels.INTERPRETER, reason="compiled kernels are not bounds-checked")
def test_an_unmasked_load_past_the_end_fails_the_check():
    x = torch.randn(1000)
    assert torch.equal(call_student(lambda: _copy(x, True), name="copy", question="q1"), x)
    with pytest.raises(AssertionError, match=r"q1: copy: out-of-bounds tl.load: \d+ of 1024 active lanes"):
        call_student(lambda: _copy(x, False), name="copy", question="q1")


@pytest.mark.skipif(not kernels.INTERPRETER, reason="compiled kernels are not bounds-checked")
def test_the_refusal_is_the_bounds_checks_own_exception():
    """What the check's message comes from is a kernels._bounds.OutOfBounds, found by its class."""
    x = torch.randn(1000)
    with pytest.raises(AssertionError) as raised:
        call_student(lambda: _copy(x, False), name="copy", question="q1")
    chain, causes = raised.value, []
    while chain is not None:
        causes.append(chain)
        chain = chain.__cause__ or chain.__context__
    assert any(isinstance(c, OutOfBounds) and str(raised.value).endswith(str(c)) for c in causes)
