"""CPU mode refuses what compiled Triton refuses, and only that (kernels._jit_rules).

Every kernel here is launched in whichever lane the machine gives: in CPU mode the refusal comes from
``kernels._jit_rules`` and its message is checked in full (the global, the kernel, the fix); compiled
(on a GPU) the same kernel must be refused by Triton itself, with the phrase given for that lane, so
the table below is also the evidence that each rule is the compiler's.
"""

import inspect
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

import kernels
from kernels import _jit_rules
from kernels.device import default_device

DEVICE = default_device()
COMPILED_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
cpu_only = pytest.mark.skipif(not kernels.INTERPRETER, reason="checks CPU mode's own hooks")

# Module-level values the kernels below read.
MISSES_NAN = True  # a plain global: refused
SCALE = 3.0  # a plain global: refused
HAS_NAN_CHECK = tl.constexpr(True)  # constexpr globals: allowed
FACTOR = tl.constexpr(3.0)
OUT_DTYPE = tl.float32  # a tl.dtype: allowed
NOTHING = None  # None: allowed
consts = types.ModuleType("consts")  # stands for `import consts`: a module's attributes are not checked
consts.PLAIN = 2
consts.WIDE = tl.constexpr(5)


def host_double(x):  # a plain Python function: a kernel may not call it
    return x * 2


def _text(error) -> str:
    """The error's message and its causes' (the interpreter wraps errors raised inside a kernel)."""
    parts = []
    while error is not None:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


def _compilation_error(error):
    while error is not None and not isinstance(error, CompilationError):
        error = error.__cause__ or error.__context__
    return error


def _launch(kernel, *args, n=8):
    x = torch.arange(n, dtype=torch.float32, device=DEVICE) - 2.0
    kernel[(1,)](x, *args)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return x.cpu()


# -- the global rule ----------------------------------------------------------------------------------------


@triton.jit
def find_nonfinite(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    if MISSES_NAN:
        bad = tl.abs(x) == float("inf")
    else:
        bad = x != x
    tl.store(x_ptr + tl.arange(0, 8), bad.to(tl.float32))


@triton.jit
def find_nonfinite_constexpr(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    if HAS_NAN_CHECK:
        bad = (x != x) | (tl.abs(x) == float("inf"))
    else:
        bad = tl.abs(x) == float("inf")
    tl.store(x_ptr + tl.arange(0, 8), bad.to(tl.float32) * FACTOR)


def test_a_plain_global_is_refused_naming_it_the_kernel_and_the_fix():
    with pytest.raises(Exception) as info:
        _launch(find_nonfinite)
    error = _compilation_error(info.value)
    assert error is not None, _text(info.value)
    message = str(error)
    assert "Cannot access global variable MISSES_NAN" in message
    if kernels.INTERPRETER:
        assert isinstance(info.value, _jit_rules.JitRuleError)  # raised before the kernel runs
        assert message.startswith("at 3:7:\ndef find_nonfinite(x_ptr):")  # laid out as the compiler's
        last = message.strip().splitlines()[-1]
        for phrase in ("find_nonfinite", "the bool True", "MISSES_NAN = tl.constexpr(True)", "`tl.constexpr` argument"):
            assert phrase in last, last


def test_the_same_kernel_with_constexpr_globals_runs():
    out = _launch(find_nonfinite_constexpr)
    assert out.tolist() == [0.0] * 8


@triton.jit
def scaled(x_ptr):
    offs = tl.arange(0, 8)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * SCALE)


def test_a_float_global_is_refused_with_its_value_in_the_fix():
    with pytest.raises(Exception) as info:
        _launch(scaled)
    assert "Cannot access global variable SCALE" in _text(info.value)
    if kernels.INTERPRETER:
        assert "SCALE = tl.constexpr(3.0)" in str(info.value)


@triton.jit
def _times_factor(x):
    return x * FACTOR


@triton.jit
def allowed_globals(x_ptr, out_ptr):
    offs = tl.arange(0, 8)
    x = tl.load(x_ptr + offs).to(OUT_DTYPE)
    y = _times_factor(x) + consts.PLAIN + consts.WIDE  # a jit helper; a module's attributes
    y = y + math.pi * 0  # the math module
    y = y + triton.cdiv(7, 2) - 4  # a @triton.constexpr_function from the triton module
    for i in range(2):  # builtins the compiler knows
        y = y + min(i, 0) + len((1, 2)) * 0
    if NOTHING is None:
        y = y + tl.zeros([8], dtype=tl.float32)
    tl.store(out_ptr + offs, y)


def test_globals_the_compiler_allows_still_work():
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    out = torch.empty_like(x)
    allowed_globals[(1,)](x, out)
    assert out.cpu().tolist() == [3.0 * v + 7.0 for v in range(8)]


@triton.jit
def _scale_by_global(x):
    return x * SCALE


@triton.jit
def calls_a_bad_helper(x_ptr):
    offs = tl.arange(0, 8)
    tl.store(x_ptr + offs, _scale_by_global(tl.load(x_ptr + offs)))


def test_a_nested_jit_function_reading_a_plain_global_is_caught():
    with pytest.raises(Exception) as info:
        _launch(calls_a_bad_helper)
    assert "Cannot access global variable SCALE" in _text(info.value)
    if kernels.INTERPRETER:
        assert isinstance(info.value, _jit_rules.JitRuleError)
        assert info.value.src.startswith("def _scale_by_global(x):")  # the excerpt is the helper's
        assert "_scale_by_global (called from kernel calls_a_bad_helper)" in str(info.value)


@triton.jit
def shadows_globals(x_ptr, SCALE):
    MISSES_NAN = 2.0  # a local of the same name as a global: never looked up as a global
    offs = tl.arange(0, 8)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * MISSES_NAN * SCALE)


def test_local_names_shadowing_globals_are_not_flagged():
    out = _launch(shadows_globals, 0.5)
    assert out.tolist() == [v - 2.0 for v in range(8)]


@triton.jit
def global_in_a_branch(x_ptr, USE_SCALE: tl.constexpr):
    offs = tl.arange(0, 8)
    if USE_SCALE:
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * SCALE)
    else:
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2.0)


def test_a_global_in_a_branch_the_launch_does_not_take_is_not_compiled():
    # The compiler compiles only the branch a constexpr condition takes.
    assert _launch(global_in_a_branch, False).tolist() == [2.0 * (v - 2.0) for v in range(8)]
    with pytest.raises(Exception) as info:
        _launch(global_in_a_branch, True)
    assert "Cannot access global variable SCALE" in _text(info.value)


# -- the other refusals: each kernel, what CPU mode says, what the compiler says ------------------------------


@triton.jit
def calls_host_function(x_ptr):
    tl.store(x_ptr, host_double(tl.load(x_ptr)))


@triton.jit
def calls_abs(x_ptr):
    tl.store(x_ptr, abs(tl.load(x_ptr)))


@triton.jit
def uses_numpy_unimported(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * np.float32(2.0))  # noqa: F821 - this module does not import numpy


@triton.jit
def breaks_out(x_ptr):
    for i in range(4):
        if i == 2:
            break
        tl.store(x_ptr + i, 1.0)


@triton.jit
def chained_comparison(x_ptr, n):
    offs = tl.arange(0, 8)
    tl.store(x_ptr + offs, 1.0, mask=0 <= offs < n)


@triton.jit
def membership(x_ptr, MODE: tl.constexpr):
    if MODE in (1, 2):
        tl.store(x_ptr, 1.0)


@triton.jit
def loops_over_a_tuple(x_ptr):
    for i in (0, 1):
        tl.store(x_ptr + i, 1.0)


@triton.jit
def if_on_a_block(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    if x > 0:
        tl.store(x_ptr, 7.0)


@triton.jit
def if_on_a_float(x_ptr, F: tl.constexpr):
    if F:
        tl.store(x_ptr, 7.0)


@triton.jit
def prints_without_prefix(x_ptr):
    x = tl.load(x_ptr)
    print(x)


@triton.jit
def formats_a_tensor(x_ptr):
    x = tl.load(x_ptr)
    print(f"x = {x}")


@triton.jit
def accumulates_into_a_scalar(x_ptr):
    acc = 0.0
    for _ in range(2):
        acc += tl.load(x_ptr + tl.arange(0, 8))
    tl.store(x_ptr + tl.arange(0, 8), acc)


@triton.jit
def reassigns_a_constexpr(x_ptr, B: tl.constexpr):
    for _ in range(2):
        B = B + 1
    tl.store(x_ptr, B)


@triton.jit
def narrow_dot(x_ptr):
    m = tl.arange(0, 16)
    k = tl.arange(0, 8)
    a = tl.load(x_ptr + m[:, None] * 8 + k[None, :]).to(tl.float16)
    b = tl.load(x_ptr + k[:, None] * 16 + m[None, :]).to(tl.float16)
    tl.store(x_ptr + m[:, None] * 16 + m[None, :], tl.dot(a, b))


@triton.jit
def assigns_into_a_tuple(x_ptr):
    t = (tl.load(x_ptr), tl.load(x_ptr + 1))
    t[0] += 1.0
    tl.store(x_ptr, t[0])


@triton.jit
def returns_inside_a_loop(x_ptr):
    for i in range(4):
        if tl.load(x_ptr + i) > 0:
            return
        tl.store(x_ptr + i, 1.0)


@triton.jit
def float_of_a_tensor(x_ptr):
    tl.store(x_ptr, float(tl.load(x_ptr)))


@triton.jit
def if_changes_a_type(x_ptr):
    x = tl.load(x_ptr + 3)  # 1.0: the branch is taken
    y = x
    if x > 0:
        y = x.to(tl.float16)
    tl.store(x_ptr, y)


@triton.jit
def conditional_expression_on_a_block(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    tl.store(x_ptr + tl.arange(0, 8), x if x > 0 else -x)


@triton.jit
def while_on_a_block(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    while x < 3:
        x = x + 1
    tl.store(x_ptr + tl.arange(0, 8), x)


@triton.jit
def walrus(x_ptr):
    if (y := tl.load(x_ptr)) > 0:
        tl.store(x_ptr, y)


@triton.jit
def int_dot_without_out_dtype(x_ptr):
    r = tl.arange(0, 16)
    c = tl.arange(0, 32)  # K = 32, the least an 8-bit dot takes
    a = tl.load(x_ptr + r[:, None] * 32 + c[None, :]).to(tl.int8)  # the first 512 elements
    acc = tl.zeros((16, 16), dtype=tl.int32)
    acc = tl.dot(a, tl.trans(a), acc)  # Triton 3.6 assumes a float32 accumulator here
    tl.store(x_ptr + r[:, None] * 16 + r[None, :], acc.to(tl.float32))


@triton.jit
def int_dot_with_out_dtype(x_ptr):
    r = tl.arange(0, 32)
    a = (tl.load(x_ptr + r[:, None] * 32 + r[None, :]) % 7).to(tl.int8)
    acc = tl.zeros((32, 32), dtype=tl.int32)
    acc = tl.dot(a, a, acc, out_dtype=tl.int32)
    tl.store(x_ptr + r[:, None] * 32 + r[None, :], acc.to(tl.float32))


REFUSALS = {  # name: (kernel, args, phrase in CPU mode's message, phrase in the compiler's)
    "host function": (calls_host_function, (), "Unsupported function referenced: host_double", "Unsupported function"),
    "abs": (calls_abs, (), "abs is not defined", "abs is not defined"),
    "numpy not imported": (uses_numpy_unimported, (), "np is not defined", "np is not defined"),
    "break": (breaks_out, (), "unsupported AST node type: Break", "unsupported AST node type: Break"),
    "chained comparison": (chained_comparison, (5,), "simultaneous multiple comparison", "simultaneous multiple"),
    "in": (membership, (1,), "comparison operator 'In' is not", "'In'"),
    "for over a tuple": (loops_over_a_tuple, (), "Only `range` and `static_range` iterators", "has no attribute"),
    "if on a block": (if_on_a_block, (), "Boolean value of Tensor with more than one value", "Boolean value of Tensor"),
    "if on a float": (if_on_a_float, (1.5,), "not objects of type float", "not objects of type float"),
    "print without prefix": (prints_without_prefix, (), "must be a string", "is not string"),
    "f-string of a tensor": (formats_a_tensor, (), "non-constexpr conversion values", "non-constexpr conversion"),
    "loop-carried type": (accumulates_into_a_scalar, (), "Loop-carried variable acc has initial type fp32", "acc"),
    "constexpr reassigned in a loop": (reassigns_a_constexpr, (4,), "B changed type", "B changed type"),
    "dot with K < 16": (narrow_dot, (), "K >= 16", "K >= 16"),
    "assignment into a tuple": (assigns_into_a_tuple, (), "__setitem__ is not supported", "__setitem__ is not"),
    "return inside a loop": (returns_inside_a_loop, (), "Cannot have `return` statements inside", "`return`"),
    "float of a tensor": (float_of_a_tensor, (), "float() argument must be", "float() argument must be"),
    "if changes a type": (if_changes_a_type, (), "initial value for `y` is of type fp32", "initial value for `y`"),
    "a if c else b on a block": (conditional_expression_on_a_block, (), "Boolean value of Tensor", "parsing"),
    "while on a block": (while_on_a_block, (), "Boolean value of Tensor", "error encountered during parsing"),
    "walrus (Triton 3.6)": (walrus, (), "unsupported AST node type: NamedExpr", "NamedExpr"),
    "int32 accumulator, no out_dtype (Triton 3.6)": (
        int_dot_without_out_dtype,
        (),
        "needs out_dtype=tl.int32",
        "AssertionError",
    ),
}
NEWER_TRITON_COMPILES = ("walrus", "int32 accumulator")  # Triton 3.8 compiles these; CPU mode refuses them
OWN_ASSERTS = ("dot with K < 16", "int32 accumulator, no out_dtype (Triton 3.6)")  # raised without a location


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refused_as_the_compiler_refuses(name):
    kernel, args, cpu_phrase, compiled_phrase = REFUSALS[name]
    if name.startswith(NEWER_TRITON_COMPILES) and not kernels.INTERPRETER and COMPILED_VERSION >= (3, 8):
        pytest.skip("Triton 3.8 compiles it; CPU mode refuses it for Triton 3.6's sake")
    with pytest.raises(Exception) as info:
        _launch(kernel, *args, n=512)
    text = _text(info.value)
    assert (cpu_phrase if kernels.INTERPRETER else compiled_phrase) in text, text
    if kernels.INTERPRETER and name not in OWN_ASSERTS:  # those come from tl.dot's front end, not a scan
        error = _compilation_error(info.value)
        assert isinstance(error, _jit_rules.JitRuleError), text
        assert str(error).startswith("at "), text


@triton.jit
def legitimate(x_ptr, n, USE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = (offs >= 0) & (offs < n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    total = 0.0
    for _ in range(2):
        acc += tl.load(x_ptr + offs, mask=mask, other=0.0)
        total += tl.sum(acc, axis=0)
    for j in tl.static_range(2):  # unrolled: its values may change type
        step = j * 1.5
    if tl.max(acc, axis=0) > 0:  # a scalar condition
        acc = acc + step
    y = acc if USE else -acc
    print("y", tl.sum(y, axis=0) * 0)
    if n > 3 and USE:
        tl.store(x_ptr + offs, y + total * 0, mask=mask)


def test_legitimate_kernel_is_not_refused(capsys):
    out = _launch(legitimate, 8, True, 8)
    assert out.tolist() == [2.0 * (v - 2.0) + 1.5 for v in range(8)]


@pytest.mark.skipif(not kernels.INTERPRETER and COMPILED_VERSION >= (3, 8), reason="Triton 3.8 compiles it")
def test_an_exercise_check_names_the_missing_out_dtype_on_both_lanes():
    from kernels.checks import call_student

    with pytest.raises(AssertionError, match=r"q2: gemm raised CompilationError: .*out_dtype=") as raised:
        call_student(lambda: _launch(int_dot_without_out_dtype, n=512), name="gemm", question="q2")
    assert "tl.dot(a, tl.trans(a), acc)" in str(raised.value) or "needs out_dtype=tl.int32" in str(raised.value)


def test_an_int8_dot_naming_its_int32_out_dtype_runs_exactly():
    out = _launch(int_dot_with_out_dtype, n=1024)
    a = ((torch.arange(1024, dtype=torch.float32) - 2.0).fmod(7)).to(torch.int8).reshape(32, 32).long()
    assert torch.equal(out.reshape(32, 32).long(), a @ a)


# -- the installed compiler's own verdicts (no GPU needed: it compiles for sm_90) ------------------------------

ALLOWED = {  # name: (kernel, args) that compiled Triton compiles
    "constexpr globals": (find_nonfinite_constexpr, ()),
    "allowed globals": (allowed_globals, (None,)),
    "shadowing locals": (shadows_globals, (0.5,)),
    "global in a branch not taken": (global_in_a_branch, (False,)),
    "legitimate": (legitimate, (8, True, 8)),
    "int32 accumulator with out_dtype": (int_dot_with_out_dtype, ()),
}


def _signature(kernel, args):
    params = list(inspect.signature(kernel.fn).parameters.values())
    signature, constexprs = {}, {}
    for param, value in zip(params, (None, *args), strict=True):
        if "constexpr" in str(param.annotation):
            signature[param.name], constexprs[param.name] = "constexpr", value
        else:
            signature[param.name] = {type(None): "*fp32", bool: "i1", int: "i32", float: "fp32"}[type(value)]
    return signature, constexprs


def compiler_verdicts() -> dict:
    """What the installed compiler says of every kernel above (run in a process in compiled mode)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    verdicts = {}
    for name, (kernel, args, *_) in {**REFUSALS, **ALLOWED}.items():
        try:
            _ = kernel.cache_key  # what a launch computes first (DependenciesFinder)
            triton.compile(ASTSource(kernel, *_signature(kernel, args)), target=GPUTarget("cuda", 90, 32))
            verdicts[name] = "compiled"
        except Exception as error:
            verdicts[name] = _text(error)
    return verdicts


def test_the_compiler_refuses_every_kernel_cpu_mode_refuses_and_compiles_the_others():
    # The table above, judged by the installed Triton compiler itself (compiled mode, in a child process:
    # this one may be in CPU mode, where @triton.jit makes interpreter functions).
    code = "import json, tests.test_jit_rules as t; print('VERDICTS', json.dumps(t.compiler_verdicts()))"
    env = {**os.environ, "KERNELS_INTERPRET": "0", "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("VERDICTS ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    verdicts = json.loads(lines[-1].removeprefix("VERDICTS "))
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    for name, (_kernel, _args, _cpu_phrase, compiled_phrase) in REFUSALS.items():
        if name.startswith(NEWER_TRITON_COMPILES) and version >= (3, 8):
            assert verdicts[name] == "compiled"  # 3.8 has := and infers out_dtype from acc, 3.6 does neither
            continue
        assert verdicts[name] != "compiled" and compiled_phrase in verdicts[name], (name, verdicts[name])
    for name in ALLOWED:
        assert verdicts[name] == "compiled", (name, verdicts[name])


# -- CPU mode's own machinery ----------------------------------------------------------------------------------


@cpu_only
def test_install_is_idempotent_and_uninstall_restores_the_interpreter():
    from triton.runtime.interpreter import InterpretedFunction

    assert _jit_rules.installed()
    patched = InterpretedFunction.run
    _jit_rules.install()
    assert InterpretedFunction.run is patched
    try:
        _jit_rules.uninstall()
        _jit_rules.uninstall()
        assert not _jit_rules.installed()
        assert InterpretedFunction.run is not patched
        _launch(find_nonfinite)  # the interpreter on its own runs it
    finally:
        _jit_rules.install()
    with pytest.raises(_jit_rules.JitRuleError):
        _launch(find_nonfinite)


@cpu_only
def test_the_scan_is_made_once_per_function():
    first = _jit_rules._info(find_nonfinite.fn)
    _launch(find_nonfinite_constexpr)
    assert _jit_rules._info(find_nonfinite.fn) is first


@cpu_only
def test_the_error_reads_like_the_compilers_and_pickles():
    import pickle

    with pytest.raises(_jit_rules.JitRuleError) as info:
        _launch(find_nonfinite)
    assert isinstance(info.value, CompilationError)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value)


@cpu_only
def test_triton_allow_non_constexpr_globals_is_honoured():
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.allow_non_constexpr_globals = True
        _launch(find_nonfinite)
    with pytest.raises(_jit_rules.JitRuleError):
        _launch(find_nonfinite)
