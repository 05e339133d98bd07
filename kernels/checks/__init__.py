"""Exercise checks for the labs: one module per lab (``kernels.checks.lab00`` for Lab 0).

A check takes the student's function, runs it on a fixed, device-independent input set and either
prints one line with counts (pass) or raises ``AssertionError`` whose message says what went wrong in
numerical terms ("ties rounded away from zero"), not just "mismatch".  The otter-grader tests of a
lab notebook only call these functions, so what grades a student is ordinary package code with its
own tests (``tests/test_checks_lab*.py``), each diagnosis shown to fire on a deliberately wrong
solution.

The helpers here are shared by every lab's checks: calling a student function so that an unfinished
exercise reads as "not done yet" rather than as a traceback, and asking quietly whether a check passes
so that a notebook can fall back to the package's kernel.

In a notebook the student's objects are the real thing.  In the batch grader they are
:class:`kernels.grade.rpc.Remote` proxies for objects that live in the submission's sandbox: the checks
run in a process that never runs student code, so they ask about a student object only through what a
proxy supports (calls, attributes, items) and the helpers here (:func:`is_class`,
:func:`is_triton_function`), and run any part that needs the student's live objects (a model, an
optimizer, autograd) with :func:`student_side`, which returns plain data.
"""

import contextlib
import io
from dataclasses import dataclass

import numpy as np
import torch

from kernels._bounds import OutOfBounds, install_bounds_check


class ExerciseNotDone(AssertionError):
    """The exercise has not been attempted yet (stub still in place); an ``AssertionError`` so that a
    grader counts it as a failed test, not a crash."""


def call_student(fn, *args, name: str, question: str):
    """Call ``fn(*args)``; turn "not attempted" and crashes into ``AssertionError`` naming ``question``.

    ``name`` is how the notebook calls the function, so the message points at the cell to edit.
    """
    if fn is None or fn is Ellipsis:
        raise ExerciseNotDone(f"{question}: {name} is not defined yet: exercise not done yet")
    if not callable(fn):
        raise AssertionError(f"{question}: {name} must be a function, got {type_name(fn)}")
    import kernels

    if kernels.INTERPRETER:  # the batch grader's bounds check, so that both give the same verdict
        install_bounds_check()
    try:
        out = fn(*args)
    except NotImplementedError as e:
        raise ExerciseNotDone(f"{question}: {name} raised NotImplementedError: exercise not done yet") from e
    except AssertionError:
        raise
    except Exception as e:  # a student's bug of any kind; shown with its type, the traceback chained
        # The interpreter wraps the bounds check's error (in the grader's judge, the sandbox's error
        # rebuilt by kernels.grade.rpc, still an OutOfBounds).
        cause = e
        while cause is not None and not isinstance(cause, OutOfBounds):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise AssertionError(f"{question}: {name}: {cause}") from e
        # A kernel the compiler refuses (compiled mode), or that CPU mode refuses as the compiler would
        # (kernels._jit_rules, possibly wrapped by the interpreter): its str is "at L:C:", the source and
        # a caret; the diagnosis is the last line of the innermost one, in both lanes.
        import ast
        import re

        from triton.compiler.errors import CompilationError

        refusal = e
        while refusal is not None and not isinstance(refusal, CompilationError):
            refusal = refusal.__cause__ or refusal.__context__
        while refusal is not None and isinstance(refusal.__cause__, CompilationError):
            refusal = refusal.__cause__  # a refused @jit helper: the compiler chains the helper's error
        if refusal is not None:
            lines = [line.strip() for line in str(refusal).splitlines() if line.strip()]
            line = lines[-1] if lines else ""
            wrapped = re.fullmatch(r"[A-Za-z_][\w.]*\((?P<text>(?P<q>['\"]).*(?P=q))\)", line)
            if wrapped:  # the compiler shows the underlying error as its repr: NameError("...")
                try:
                    line = ast.literal_eval(wrapped["text"])
                except (ValueError, SyntaxError):
                    pass
            if line == "^" and len(lines) > 1:  # the compiler's assert had no message: show the line it hit
                cause = refusal.__cause__
                line = f"`{lines[-2]}` failed ({type(cause).__name__ if cause else 'refused'}, with no message)"
                if "tl.dot(" in lines[-2] and "out_dtype" not in lines[-2]:
                    line += "; a non-float32 accumulator needs out_dtype= named (Triton 3.6)"
            glob = re.search(r"Cannot access global variable (\w+)", line)
            if glob and "tl.constexpr(" not in line:
                line += f" (declare it `{glob[1]} = tl.constexpr(...)`, or pass it as a `tl.constexpr` argument)"
            raise AssertionError(f"{question}: {name} raised CompilationError: {line}") from e
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AssertionError(f"{question}: {name} raised {type(e).__name__}: {first}") from e
    if out is None:
        raise ExerciseNotDone(f"{question}: {name} returned None: exercise not done yet (or its `return` is missing)")
    return out


def student_side(func, *args, **kwargs):
    """``func(*args, **kwargs)``, run where the student's objects among ``args`` live.

    ``func`` is a module-level function (or class) of the package.  In a notebook that is this process;
    in the batch grader it is the submission's sandbox, and the result comes back as plain data (an
    object that is not plain data comes back as a proxy).  Use it for the part of a check that drives
    student objects through live state (training steps, autograd), and keep the comparison with the
    reference out of ``func``."""
    from kernels.grade.rpc import run_student_side

    return run_student_side(func, args, kwargs)


def type_name(obj) -> str:
    """``type(obj).__name__``; for the grader's proxy of a student object, the student object's type."""
    from kernels.grade.rpc import Remote, remote_info

    if isinstance(obj, Remote):
        return remote_info(obj).get("type") or "object"
    return type(obj).__name__


def is_class(obj) -> bool:
    """True for a class, and for the grader's proxy of a student's class."""
    from kernels.grade.rpc import remote_kind

    return isinstance(obj, type) or remote_kind(obj) == "class"


def is_triton_function(obj) -> bool:
    """True for a ``@triton.jit`` function (an ``InterpretedFunction`` in CPU mode), and for the grader's
    proxy of one."""
    import triton

    from kernels.grade.rpc import remote_is_triton_function

    return isinstance(obj, triton.runtime.KernelInterface) or remote_is_triton_function(obj)


@dataclass(frozen=True)
class InputSet:
    """A check's fixed inputs: fp32 bit patterns, each labelled with the group it belongs to."""

    bits: np.ndarray  # uint32 fp32 patterns
    group: np.ndarray  # label of each element's group (for listings)
    counts: dict  # group -> number of elements, in order

    def fp32(self, device="cpu") -> torch.Tensor:
        return torch.from_numpy(self.bits.view(np.float32).copy()).to(device)


def constant_output(got: np.ndarray, want: np.ndarray, show=hex) -> str:
    """The "nothing was computed" smell: one output for every input where the answers differ.

    Returns the diagnosis, or "" when the outputs vary; checked before any finer smell, which a
    constant output would otherwise trigger many times over."""
    if np.unique(got).size == 1 and np.unique(want).size > 1:
        return (
            f"every output is {show(got[0])}, whatever the input: the result does not depend on it "
            f"(in a kernel: is there a tl.store of the result, with the right mask?)"
        )
    return ""


def passes(check, fn) -> bool:
    """True if ``check(fn)`` passes; prints nothing either way.

    For notebooks that use a student's function when it works and the package's otherwise.
    """
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            check(fn)
        except AssertionError:
            return False
    return True


__all__ = [
    "ExerciseNotDone",
    "InputSet",
    "call_student",
    "constant_output",
    "is_class",
    "is_triton_function",
    "passes",
    "student_side",
    "type_name",
]
