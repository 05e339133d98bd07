"""Make CPU mode refuse the kernels that compiled Triton refuses.

Appendix A (CPU mode), no lab.  Entry points: :func:`install`, :func:`check_launch`,
:class:`JitRuleError`.

Triton's CPU interpreter runs a ``@triton.jit`` function as ordinary Python, so it accepts code that
the compiler rejects: a kernel finished on a laptop then fails on the GPU.  The most common case is a
module-level constant read inside a kernel (``MISSES_NAN = True``, then ``if MISSES_NAN:``): the
compiler (``CodeGenerator._define_name_lookup`` in ``triton/compiler/code_generator.py``, the same in
Triton 3.6 and 3.8) lets a kernel read a global only if its value is

* a ``tl.constexpr`` (or ``None``), a ``tl.dtype``, a module (``type(v) is ModuleType``), a
  ``@triton.jit`` or ``@triton.constexpr_function`` function, a named-tuple class, a Triton builtin
  or aggregate, or anything defined in ``triton.language`` (``v.__module__``);
* or one of the Python builtins ``len list range float int isinstance getattr hasattr print min
  max`` (any other builtin, ``abs`` say, is "not defined");

unless ``TRITON_ALLOW_NON_CONSTEXPR_GLOBALS=1``.  A name that a kernel has assigned (or takes as an
argument) is local and never looked up there.  Attribute access is not checked (``mod.NAME`` is
allowed), except that ``DependenciesFinder`` in ``triton/runtime/jit.py`` refuses, at launch, any
plain Python function a kernel names (``helper(x)``, ``mymodule.helper(x)``) that is not
``@triton.jit``, outside ``triton.language``, ``math`` and ``copy``.

This module checks the same rules before an interpreted kernel runs, for the kernel and every
``@triton.jit`` function it reaches, and raises :class:`JitRuleError` (a ``CompilationError``, with the
compiler's source excerpt and message, naming the kernel and the fix).  The compiler only compiles
the branch of an ``if`` on a ``tl.constexpr`` that the launch takes, so a finding inside an ``if``
whose condition is known at launch (constexpr arguments, constexpr globals) counts only when that
branch is taken; an ``if`` on a tensor compiles both branches.  It also refuses, as the compiler does:

* syntax the compiler has no rule for: ``break``, ``continue``, ``lambda``, ``try``/``raise``,
  nested ``def``, dict/set literals and comprehensions, ``import``, ``:=`` (absent from Triton 3.6),
  chained comparisons ``a < b < c``, ``in``/``not in``, ``@``, assignment into ``x[i]`` or ``x.a``,
  ``for`` over anything but ``range``/``tl.range``/``tl.static_range``, and ``return`` under an
  ``if`` on a run-time value inside a ``for``/``while`` loop;
* at run time: ``if``/``while``/``a if c else b`` on a tensor of more than one element (the
  interpreter takes any block as true), an ``if`` on a float, string or tuple, ``print(x)`` without
  a string prefix, an f-string of a tensor, ``float(x)``/``int(x)`` of a tensor, a loop-carried
  variable whose type changes in the loop (or a constexpr reassigned in one), a variable whose type
  an ``if`` on a run-time value changes, ``tl.dot`` with K below the minimum of Triton 3.6 on
  NVIDIA GPUs (16, or 32 for 8-bit operands; 3.8 allows 8 for fp32), and ``tl.dot`` into an accumulator
  other than float32 without ``out_dtype`` (3.6 refuses it; 3.8 infers the type from ``acc``).

The run-time checks see only what runs: a branch the launch does not take is not checked, where the
compiler compiles both sides of an ``if`` on a run-time value.

The checks of a function's source are made once per function object; a launch then only looks its
global names up again (a notebook may have redefined them).  :func:`install` is called by
:func:`kernels._mode.select` with the interpreter's numerics correction.
"""

import ast
import builtins
import inspect
import operator
import re
import textwrap
import types
import weakref
from dataclasses import dataclass, field

import triton
import triton.language as tl
from triton.compiler.code_generator import CodeGenerator
from triton.compiler.errors import CompilationError
from triton.language.semantic import TritonSemantic
from triton.runtime import interpreter as _interp
from triton.runtime.jit import JITCallable, JITFunction, _normalize_ty

try:
    from triton._utils import is_namedtuple as _is_namedtuple
except ImportError:  # pragma: no cover - older layouts

    def _is_namedtuple(val):
        return isinstance(val, type) and issubclass(val, tuple) and hasattr(val, "_fields")


# The Python builtins a kernel may name (CodeGenerator.builtin_namespace: the same in 3.6 and 3.8).
BUILTINS = frozenset(CodeGenerator.builtin_namespace)
# Modules whose attributes DependenciesFinder does not look into (TRITON_MODULE, GLUON_MODULE, ...).
_SUPPORTED_MODULES = frozenset({"triton.language", "triton.experimental.gluon.language", "copy", "math"})
_LANGUAGE_PREFIXES = ("triton.language", "triton.experimental.gluon.language")
_HELPER = "_kernels_jit_rules_"  # the name rewritten kernels call this module's run-time checks by

# Statement and expression nodes the code generator has no visit_ method for ("unsupported AST node
# type"), and the ones Triton 3.6's lacks while 3.8's has them.
_NOT_IN_3_6 = frozenset({"NamedExpr"})
_UNSUPPORTED = (
    frozenset(
        cls.__name__
        for base in (ast.stmt, ast.expr)
        for cls in base.__subclasses__()
        if not hasattr(CodeGenerator, "visit_" + cls.__name__)
    )
    | _NOT_IN_3_6
)
_NODE_HINTS = {
    "Break": "a Triton loop runs all its iterations: fold the exit condition into a mask, or loop with while",
    "Continue": "a Triton loop runs all its iterations: skip the work with a mask or an if instead",
    "Lambda": "define the function at module level with @triton.jit",
    "Try": "a kernel cannot catch exceptions: check with tl.static_assert or tl.device_assert",
    "TryStar": "a kernel cannot catch exceptions: check with tl.static_assert or tl.device_assert",
    "Raise": "a kernel cannot raise: use tl.static_assert (at compile time) or tl.device_assert",
    "Import": "import at module level",
    "ImportFrom": "import at module level",
    "Dict": "kernels have no dicts: use tuples or separate variables",
    "Set": "kernels have no sets: use tuples",
    "DictComp": "kernels have no dicts: use tuples or separate variables",
    "SetComp": "kernels have no sets: use tuples",
    "GeneratorExp": "write a loop over range(...), or a list comprehension over a tuple",
    "Global": "a kernel cannot assign globals: store the result through a pointer",
    "Nonlocal": "a kernel cannot assign outer variables: return the value",
    "NamedExpr": "Triton 3.6 has no `:=` (3.8 has): assign on a line of its own",
    "Starred": "unpack with * only in a call's arguments",
    "ClassDef": "define classes at module level",
    "Delete": "kernels cannot delete names",
}
_BUILTIN_HINTS = {
    "abs": "use tl.abs(x)",
    "sum": "use tl.sum(x, axis=0)",
    "round": "use tl.extra.libdevice.rint(x)",
    "any": "use tl.max(mask.to(tl.int32), axis=0) > 0",
    "all": "use tl.min(mask.to(tl.int32), axis=0) > 0",
    "pow": "use tl.extra.libdevice.pow(x, y)",
    "bool": "compare instead: x != 0",
    "enumerate": "loop over range(...) and index",
    "zip": "loop over range(...) and index",
    "tuple": "write the tuple literally: (a, b)",
}


class JitRuleError(CompilationError):
    """What compiled Triton would have refused in this kernel, raised by CPU mode.

    Its ``str`` is laid out as the compiler's ``CompilationError``: ``at L:C:``, the function's source
    up to the offending line with a caret under it, then the message on the last line.
    """

    def __repr__(self):  # the interpreter wraps errors raised inside a kernel as InterpreterError(repr(e))
        return self.message


class UnsupportedFunctionError(JitRuleError, RuntimeError):
    """A kernel names a Python function that is not ``@triton.jit`` (compiled Triton: RuntimeError)."""


# -- values: what the compiler lets a kernel name -------------------------------------------------------


def _module_name(val) -> str:
    try:
        name = getattr(val, "__module__", "")
    except Exception:
        return ""
    return name if isinstance(name, str) else ""


def _is_jit(val) -> bool:
    return isinstance(val, (JITFunction, _interp.InterpretedFunction))


def _allow_all() -> bool:
    knobs = getattr(triton, "knobs", None)
    try:
        return bool(knobs.compilation.allow_non_constexpr_globals)
    except AttributeError:  # pragma: no cover - before knobs existed
        import os

        return os.environ.get("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "0") == "1"


def global_allowed(name: str, val) -> bool:
    """``CodeGenerator``'s global lookup: may a kernel read global ``name`` holding ``val``?"""
    if (
        name in BUILTINS
        or type(val) is types.ModuleType
        or val is None
        or isinstance(val, (tl.constexpr, tl.dtype, JITCallable, _interp.InterpretedFunction))
        or _is_namedtuple(val)
        or _module_name(val).startswith(_LANGUAGE_PREFIXES)
    ):
        return True
    try:
        if getattr(val, "__triton_builtin__", False) or getattr(val, "__triton_aggregate__", False):
            return True
    except Exception:
        return False
    return _allow_all()


def unsupported_function(val) -> bool:
    """``DependenciesFinder.record_reference``: is ``val`` a callable a kernel may not name?"""
    if val is None or type(val) is types.ModuleType or _is_jit(val) or isinstance(val, JITCallable):
        return False
    try:
        if getattr(val, "__triton_aggregate__", False) or getattr(val, "__triton_builtin__", False):
            return False
    except Exception:
        return False
    if _module_name(val).startswith("triton."):  # libdevice stubs, and the interpreter's stand-ins
        return False
    return callable(val) and not isinstance(val, type) and not isinstance(val, tl.constexpr)


def _unwrap(val):
    return val.value if isinstance(val, tl.constexpr) else val


# -- the scan of a function's source --------------------------------------------------------------------


@dataclass
class _Record:
    # "name": a global read; "attr": mod.attr...; "iter": a for loop's iterator; "return_in_loop": an if
    # with a return, inside a loop; "syntax": a construct the compiler refuses wherever it compiles it
    kind: str
    key: object  # the name; (root, attrs); the iterator's func node; (the if's test, locals); the message
    node: ast.AST
    guards: tuple  # ((test, branch taken, names local there), ...): the ifs this record sits in


@dataclass
class _Info:
    """What one scan of a function's source found; cached per function object."""

    name: str
    src: str
    params: tuple
    constexpr_params: frozenset
    records: list = field(default_factory=list)

    @property
    def guarded(self) -> bool:
        """Does a finding depend on a condition (which may depend on the arguments)?"""
        return any(record.guards or record.kind == "return_in_loop" for record in self.records)


class _Scanner:
    """Walk a function's body in the compiler's order, tracking which names are local there."""

    def __init__(self):
        self.records = []
        self.guards = ()
        self.locals = set()
        self.loops = 0  # how many for/while loops (not tl.static_range) enclose the statement
        self._seen = set()

    def add(self, kind, key, node):
        dedup = (
            kind,
            key if kind not in ("iter", "return_in_loop") else id(node),
            tuple((id(t), b) for t, b, _ in self.guards),
        )
        if kind != "syntax" and dedup in self._seen:
            return
        self._seen.add(dedup)
        self.records.append(_Record(kind, key, node, self.guards))

    def flag(self, node, message):
        self.add("syntax", message, node)

    # statements

    def block(self, stmts):
        for stmt in stmts:
            self.stmt(stmt)
            if isinstance(stmt, ast.Return):  # the compiler stops at a return: the rest is dead code
                break

    def guarded(self, test, taken, body):
        saved_guards, saved_locals = self.guards, self.locals
        self.guards = saved_guards + ((test, taken, frozenset(saved_locals)),)
        self.locals = set(saved_locals)
        try:
            body()
            return self.locals
        finally:
            self.guards, self.locals = saved_guards, saved_locals

    def stmt(self, node):
        kind = type(node).__name__
        if isinstance(node, ast.FunctionDef):
            self.flag(
                node,
                "nested function definitions are not allowed inside a @triton.jit kernel. Move the helper "
                "function to module level and decorate it with @triton.jit.",
            )
        elif kind in _UNSUPPORTED:
            self.unsupported(node)
        elif isinstance(node, ast.Assign):
            self.expr(node.value)
            for target in node.targets:
                self.target(target)
        elif isinstance(node, ast.AnnAssign):
            self.expr(node.annotation)
            if node.value is not None:
                self.expr(node.value)
            self.target(node.target)
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name):
                self.name(node.target.id, node.target)
            self.expr(node.value)
            self.target(node.target)
        elif isinstance(node, ast.If):
            self.expr(node.test)
            if self.loops and any(isinstance(n, ast.Return) for n in ast.walk(node)):
                self.add("return_in_loop", (node.test, frozenset(self.locals)), node)
            then = self.guarded(node.test, True, lambda: self.block(node.body))
            other = self.guarded(node.test, False, lambda: self.block(node.orelse))
            self.locals |= then | other
        elif isinstance(node, ast.For):
            self.for_iter(node)
            self.expr(node.iter)
            self.target(node.target)
            unrolled = _is_static_range(node)  # the compiler unrolls it: no loop around its body
            self.loops += not unrolled
            self.block(node.body)
            self.loops -= not unrolled
            self.block(node.orelse)
        elif isinstance(node, ast.While):
            self.expr(node.test)
            self.loops += 1
            self.block(node.body)
            self.loops -= 1
            self.block(node.orelse)
        elif isinstance(node, ast.With):
            for item in node.items:
                self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.target(item.optional_vars)
            self.block(node.body)
        elif isinstance(node, (ast.Return, ast.Expr)):
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.Assert):
            self.expr(node.test)
            if node.msg is not None:
                self.expr(node.msg)
        elif isinstance(node, ast.Pass):
            pass
        else:  # anything else the compiler has a visitor for: look inside
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.stmt(child)
                elif isinstance(child, ast.expr):
                    self.expr(child)

    def unsupported(self, node):
        kind = type(node).__name__
        hint = _NODE_HINTS.get(kind)
        message = f"unsupported AST node type: {kind}"
        if kind in _NOT_IN_3_6:
            message += " (Triton 3.6)"
        self.flag(node, message + (f": {hint}" if hint else ""))

    def for_iter(self, node):
        if not isinstance(node.iter, ast.Call):
            self.flag(
                node,
                "Only `range` and `static_range` iterators are currently supported: loop over "
                "range(...), tl.range(...) or tl.static_range(...) and index",
            )
        else:
            self.add("iter", node.iter.func, node)

    def target(self, node):
        if isinstance(node, ast.Name):
            self.locals.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                self.target(elt)
        elif isinstance(node, ast.Starred):
            self.unsupported(node)
        elif isinstance(node, ast.Subscript):
            self.flag(
                node,
                f"__setitem__ is not supported in triton: `{ast.unparse(node)} = ...` cannot assign into a tensor or "
                f"tuple; build the new value with tl.where, or store it through a pointer",
            )
        elif isinstance(node, ast.Attribute):
            self.flag(node, f"Attribute assignment is not supported in triton: `{ast.unparse(node)} = ...`")

    # expressions

    def name(self, name, node):
        if name not in self.locals:
            self.add("name", name, node)

    def expr(self, node):
        kind = type(node).__name__
        if isinstance(node, ast.Name):
            self.name(node.id, node)
        elif isinstance(node, ast.Attribute):
            chain, root = [], node
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name):
                self.name(root.id, root)
                if root.id not in self.locals:
                    self.add("attr", (root.id, tuple(reversed(chain))), node)
            else:
                self.expr(root)
        elif isinstance(node, ast.Call):
            self.expr(node.func)
            for arg in node.args:
                self.expr(arg.value if isinstance(arg, ast.Starred) else arg)
            for keyword in node.keywords:
                self.expr(keyword.value)
        elif kind in _UNSUPPORTED:
            self.unsupported(node)
        elif isinstance(node, ast.IfExp):
            self.expr(node.test)
            self.guarded(node.test, True, lambda: self.expr(node.body))
            self.guarded(node.test, False, lambda: self.expr(node.orelse))
        elif isinstance(node, ast.BoolOp):  # a constexpr operand decides without looking at the rest
            self.expr(node.values[0])
            saved = self.guards
            for before, value in zip(node.values, node.values[1:], strict=False):
                self.guards = self.guards + ((before, isinstance(node.op, ast.And), frozenset(self.locals)),)
                self.expr(value)
            self.guards = saved
        elif isinstance(node, ast.Compare):
            if len(node.ops) > 1:
                self.flag(
                    node,
                    "simultaneous multiple comparison is not supported: write (a < b) & (b < c) for tensors, "
                    "or `and` for constexprs",
                )
                return
            op = type(node.ops[0]).__name__
            if op in ("In", "NotIn"):
                self.flag(node, f"AST comparison operator '{op}' is not (currently) implemented: compare with == and |")
                return
            self.expr(node.left)
            self.expr(node.comparators[0])
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.MatMult):
                self.flag(node, "AST binary operator 'MatMult' is not (currently) implemented: use tl.dot(a, b)")
                return
            self.expr(node.left)
            self.expr(node.right)
        elif isinstance(node, ast.ListComp):
            if len(node.generators) != 1:
                self.flag(node, "nested comprehensions are not supported")
                return
            comp = node.generators[0]
            self.expr(comp.iter)
            saved = set(self.locals)
            self.target(comp.target)
            for cond in comp.ifs:
                self.expr(cond)
            self.expr(node.elt)
            self.locals = saved
        elif isinstance(node, ast.JoinedStr):
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    self.expr(value.value)
        elif isinstance(node, ast.NamedExpr):  # 3.8 only; flagged above for 3.6
            self.expr(node.value)
            self.target(node.target)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)


def _is_static_range(node) -> bool:
    func = node.iter.func if isinstance(node.iter, ast.Call) else None
    return isinstance(func, (ast.Name, ast.Attribute)) and getattr(func, "attr", getattr(func, "id", "")) == (
        "static_range"
    )


def _source(fn):
    """The function's source from its ``def``, dedented, as ``JITFunction.src`` holds it."""
    src = textwrap.dedent("".join(inspect.getsourcelines(fn)[0]))
    match = re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE)
    return src[match.start() :] if match else src


_INFO = weakref.WeakKeyDictionary()  # python function -> _Info


def _constexpr_params(fn) -> frozenset:
    try:
        annotations = inspect.get_annotations(fn)
    except Exception:
        return frozenset()
    names = set()
    for name, ann in annotations.items():
        try:
            if _normalize_ty(ann) == "constexpr":
                names.add(name)
        except Exception:
            continue
    return frozenset(names)


def _info(fn) -> _Info:
    info = _INFO.get(fn)
    if info is not None:
        return info
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = ()
    info = _Info(getattr(fn, "__name__", "?"), "", params, _constexpr_params(fn))
    try:
        info.src = _source(fn)
        tree = ast.parse(info.src)
        fdef = tree.body[0]
        if isinstance(fdef, ast.FunctionDef):
            scanner = _Scanner()
            scanner.locals = set(params)
            scanner.block(fdef.body)
            info.records = scanner.records
    except Exception:  # no source (a generated function), or one we cannot parse: nothing is refused
        info.records = []
    _INFO[fn] = info
    return info


# -- deciding the ifs a record sits in ----------------------------------------------------------------


class _Unknown(Exception):
    """The condition depends on a run-time value: the compiler compiles both branches."""


class _Later(Exception):
    """The condition depends on an argument of a function called from the kernel: decided at the call."""


_UNKNOWN, _LATER = object(), object()
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}


def _scope(fn) -> dict:
    """The names the compiler resolves a function's globals in: ``__globals__`` and its closure."""
    scope = fn.__globals__
    if fn.__closure__:
        try:
            nonlocals = {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__, strict=True)}
        except ValueError:  # an empty cell
            nonlocals = {}
        scope = {**scope, **nonlocals}
    return scope


@dataclass(frozen=True)
class _Runtime:
    """A launch argument the compiler sees as a run-time value (a pointer, an int): its type is known."""

    raw: object


_TENSOR_ATTRS = frozenset({"dtype", "type", "shape", "element_ty", "numel"})


def _known(value):
    if isinstance(value, tl.tensor):
        raise _Unknown
    return value


def _evaluate(node, env, scope, fn, local_names):
    """The value of a condition known before the launch runs, or ``_Unknown`` / ``_Later``.

    A tensor's type (``x_ptr.dtype.element_ty``) is known, its value is not."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            value = env[node.id]
            if value is _UNKNOWN:
                raise _Unknown
            if value is _LATER:
                raise _Later
            if isinstance(value, _Runtime):
                value = _interp._implicit_cvt(value.raw)
            return _unwrap(value)
        if node.id in local_names:
            raise _Unknown
        if node.id in scope and not _injected(fn, node.id):
            value = scope[node.id]
            if global_allowed(node.id, value):
                return _unwrap(value)
        raise _Unknown
    if isinstance(node, ast.Attribute):
        value = _evaluate(node.value, env, scope, fn, local_names)
        if isinstance(value, tl.tensor) and node.attr not in _TENSOR_ATTRS:
            raise _Unknown
        return _unwrap(getattr(value, node.attr))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left = _known(_evaluate(node.left, env, scope, fn, local_names))
        right = _known(_evaluate(node.comparators[0], env, scope, fn, local_names))
        return _COMPARE[type(node.ops[0])](left, right)
    if isinstance(node, ast.BoolOp):
        value = None
        for operand in node.values:
            value = _known(_evaluate(operand, env, scope, fn, local_names))
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_known(_evaluate(node.operand, env, scope, fn, local_names)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _known(_evaluate(node.left, env, scope, fn, local_names))
        return _BINARY[type(node.op)](left, _known(_evaluate(node.right, env, scope, fn, local_names)))
    raise _Unknown


_VISIT, _SKIP, _DEFER = "visit", "skip", "defer"


def _decide(guards, env, scope, fn) -> str:
    """Whether the compiler compiles code inside ``guards`` for this launch (or call)."""
    later = False
    for test, taken, local_names in guards:
        try:
            value = _known(_evaluate(test, env, scope, fn, local_names))
        except _Later:
            later = True
            continue
        except Exception:  # a run-time condition (both branches are compiled), or one we cannot tell
            continue
        try:
            if bool(value) != taken:
                return _SKIP
        except Exception:
            continue
    return _DEFER if later else _VISIT


# -- the checks ----------------------------------------------------------------------------------------

_INJECTED = {}  # id(globals dict) -> names the interpreter's rewriter added to it


_REWRITER_GLOBALS = vars(_interp)  # what the interpreter's rewriter copies into a kernel's module


def _injected(fn, name) -> bool:
    """Did the interpreter, not the module, put ``name`` in ``fn``'s globals?  (Its rewriter copies its
    own globals, ``np``, ``math``, ``tl``..., into every module whose kernels it runs.)"""
    added = _INJECTED.get(id(fn.__globals__))
    return bool(added) and name in added and fn.__globals__.get(name) is _REWRITER_GLOBALS.get(name)


def _describe(val) -> str:
    if isinstance(val, bool):
        return f"the bool {val}"
    if isinstance(val, (int, float, str)):
        return f"the {type(val).__name__} {val!r}"
    return f"a {type(val).__module__}.{type(val).__qualname__}"


def _constexpr_fix(name, val) -> str:
    text = repr(val)
    if isinstance(val, (bool, int, float, str, tuple)) and len(text) <= 40:
        return f"declare it `{name} = tl.constexpr({text})`, or pass it as a `tl.constexpr` argument"
    if hasattr(val, "data_ptr"):
        return "pass it to the kernel as an argument"
    return f"declare it `{name} = tl.constexpr(...)`, or pass it as a `tl.constexpr` argument"


def _where(chain) -> str:
    if len(chain) == 1:
        return f"@jit'ed function {chain[0]}"
    return f"@jit'ed function {chain[-1]} (called from kernel {' -> '.join(chain[:-1])})"


def _problem(record, fn, scope, chain):
    """``None``, a jit function to look into, or ``(error class, message)``."""
    if record.kind == "syntax":
        return JitRuleError, f"{record.key} (in {_where(chain)})"
    if record.kind == "name":
        name = record.key
        if name in scope and not _injected(fn, name):
            val = scope[name]
            if _is_jit(val):
                return val
            if unsupported_function(val):
                return UnsupportedFunctionError, (
                    f"Unsupported function referenced: {name} ({val!r}) in {_where(chain)}: a kernel can call only "
                    f"@triton.jit functions, triton.language and Python's {', '.join(sorted(BUILTINS))}; decorate "
                    f"{name} with @triton.jit, or compute its result on the host and pass it in"
                )
            if global_allowed(name, val):
                return None
            return JitRuleError, (
                f"Cannot access global variable {name} from within {_where(chain)}. Triton kernels can only access "
                f"global variables that are instantiated as constexpr; {name} is {_describe(val)}: "
                f"{_constexpr_fix(name, val)}."
            )
        if name in BUILTINS:
            return None
        if hasattr(builtins, name):
            hint = _BUILTIN_HINTS.get(name, "")
            return JitRuleError, (
                f"{name} is not defined (in {_where(chain)}): of Python's builtins a kernel can use only "
                f"{', '.join(sorted(BUILTINS))}" + (f"; {hint}" if hint else "")
            )
        return JitRuleError, (
            f"{name} is not defined (in {_where(chain)})"
            + (": CPU mode's interpreter lends it to the module, compiled Triton does not; import it" if name in
               _REWRITER_GLOBALS else "")
        )  # fmt: skip
    if record.kind == "attr":
        root, attrs = record.key
        if root not in scope or _injected(fn, root):
            return None
        value = scope[root]
        for attr in attrs:
            if value is None or getattr(value, "__name__", "") in _SUPPORTED_MODULES:
                return None
            try:
                value = getattr(value, attr)
            except Exception:
                return None
            if _is_jit(value):
                return value
            if unsupported_function(value):
                dotted = ".".join((root, *attrs[: attrs.index(attr) + 1]))
                return UnsupportedFunctionError, (
                    f"Unsupported function referenced: {dotted} ({value!r}) in {_where(chain)}: a kernel can call "
                    f"only @triton.jit functions and triton.language; decorate it with @triton.jit, or compute "
                    f"its result on the host and pass it in"
                )
        return None
    if record.kind == "return_in_loop":
        return JitRuleError, (
            f"Cannot have `return` statements inside `while` or `for` statements in triton (in {_where(chain)}): "
            f"a loop runs all its iterations; keep a flag (or narrow the mask) and return after the loop"
        )
    if record.kind == "iter":
        value = _static_value(record.key, scope, fn)
        if value is None or value is range or _is_range(value):
            return None
        return JitRuleError, (
            f"Only `range` and `static_range` iterators are currently supported (in {_where(chain)}): loop over "
            f"range(...), tl.range(...) or tl.static_range(...)"
        )
    return None


def _is_range(value) -> bool:
    """``tl.range`` / ``tl.static_range``, or the interpreter's stand-in for them (``_new_range``)."""
    return _module_name(value).startswith("triton.") and getattr(value, "__name__", "") in (
        "range",
        "static_range",
        "_new_range",
    )


def _static_value(node, scope, fn):
    """The object a Name / attribute chain names in the module, or ``None`` if it is not that simple."""
    if isinstance(node, ast.Name):
        if node.id in scope and not _injected(fn, node.id):
            return scope[node.id]
        return getattr(builtins, node.id, None) if node.id in BUILTINS else None
    if isinstance(node, ast.Attribute):
        base = _static_value(node.value, scope, fn)
        return None if base is None else getattr(base, node.attr, None)
    return None


def _raise(cls, info, node, message):
    raise cls(info.src, node, message)


def _check(fn, env, chain, seen, mode):
    """Check ``fn``'s records; look into the jit functions it reaches (``mode`` "launch" / "call")."""
    info = _info(fn)
    if not info.records:
        return
    scope = _scope(fn)
    for record in info.records:
        problem = _problem(record, fn, scope, chain)
        if problem is None:
            continue
        decision = _decide(record.guards, env, scope, fn) if record.guards else _VISIT
        if decision == _SKIP or decision == _DEFER:  # _DEFER: decided when the function is called
            continue
        if record.kind == "return_in_loop":  # refused only where the if is on a run-time value
            test, local_names = record.key
            if _decide(((test, True, local_names), (test, False, local_names)), env, scope, fn) != _VISIT:
                continue
        if isinstance(problem, tuple):
            _raise(problem[0], info, record.node, problem[1])
        if mode == "launch":
            _check_nested(problem, chain, seen)


_WALKED = weakref.WeakSet()  # functions a launch has checked with no condition left to decide


def _check_nested(jit_fn, chain, seen):
    inner = jit_fn.fn
    if inner in seen or _module_name(inner).startswith("triton."):
        return
    seen.add(inner)
    info = _info(inner)
    _check(inner, dict.fromkeys(info.params, _LATER), (*chain, info.name), seen, "launch")
    if not info.guarded:
        _WALKED.add(inner)


def _launch_env(fn, info, args, kwargs) -> dict:
    """The launch's constexpr arguments (and ``None`` ones, constexpr to the compiler); others run-time."""
    env = dict.fromkeys(info.params, _UNKNOWN)
    try:
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        bound.apply_defaults()
    except (TypeError, ValueError):
        return env
    for name, value in bound.arguments.items():
        env[name] = value if name in info.constexpr_params or value is None else _Runtime(value)
    return env


def check_launch(kernel, args, kwargs) -> None:
    """Raise :class:`JitRuleError` if compiled Triton would refuse ``kernel[grid](*args, **kwargs)``."""
    fn = kernel.fn
    info = _info(fn)
    seen = {fn}
    if info.records:
        _check(fn, _launch_env(fn, info, args, kwargs), (info.name,), seen, "launch")
    for value in (*args, *kwargs.values()):  # jit functions passed as constexpr arguments
        if _is_jit(value):
            _check_nested(value, (info.name,), seen)


def check_call(jit_fn, args, kwargs) -> None:
    """A call from inside a kernel: check what depended on the callee's arguments, now known."""
    fn = jit_fn.fn
    if fn in _WALKED or _module_name(fn).startswith("triton."):  # Triton's own library is not checked
        return
    info = _info(fn)
    if not info.records:
        return
    env = dict.fromkeys(info.params, _UNKNOWN)
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        bound.apply_defaults()
        env.update(bound.arguments)  # a Python value is a constexpr to the compiler; a tensor's type is known
    except (TypeError, ValueError):
        pass
    _check(fn, env, (info.name,), {fn}, "call")


# -- run-time checks, called from the rewritten kernels ------------------------------------------------


@dataclass
class _Site:
    kind: str
    name: str
    src: str
    node: ast.AST
    carried: tuple = ()
    constexpr_params: frozenset = frozenset()


_SITES = []


def _site_error(site, message, cls=JitRuleError):
    return cls(site.src, site.node, f"{message} (in @jit'ed function {site.name})")


def _type_text(ty) -> str:
    """A type as the compiler prints it: ``<[128], fp32>`` (the interpreter's shapes print oddly)."""
    if getattr(ty, "is_block", lambda: False)():
        return f"<{[int(_unwrap(d)) for d in ty.shape]}, {ty.scalar}>"
    return str(ty)


def _tensor_text(value) -> str:
    return f"a tensor of type {_type_text(value.type)}"


def cond(value, site_id):
    """The condition of an ``if``, ``while`` or conditional expression, as the compiler judges it."""
    if not _ORIGINALS:
        return value
    site = _SITES[site_id]
    if isinstance(value, tl.tensor):
        if value.type.is_block() and value.type.numel != 1:
            what = {"if": "an if", "while": "a while loop", "ifexp": "`a if c else b`"}[site.kind]
            fix = (
                "use tl.where(cond, a, b)"
                if site.kind == "ifexp"
                else "reduce it to one value (tl.max(x, axis=0) > 0, tl.sum(m, axis=0) == 0), or apply it "
                "elementwise with tl.where or a mask"
            )
            raise _site_error(
                site,
                f"Boolean value of Tensor with more than one value is ambiguous: the condition of {what} is "
                f"{_tensor_text(value)}; CPU mode's interpreter would take it as true. {fix}",
            )
        return value
    plain = _unwrap(value)
    if site.kind != "while" and isinstance(plain, (float, str, tuple, list, dict, tl.dtype)):
        raise _site_error(
            site,
            f"`if` conditionals can only accept values of type {{bool, int, NoneType}}, not objects of type "
            f"{type(plain).__name__}",
        )
    return value


@dataclass
class _IfState:
    cond: object
    entry: dict = None  # the tensors the if reassigns, at its start; None for an if on a constexpr


def if_enter(value, site_id, names):
    """Before an ``if``: judge its condition; on a run-time one, note the values its branches reassign."""
    value = cond(value, site_id)
    if not _ORIGINALS or not isinstance(value, tl.tensor):
        return _IfState(value)
    carried = _SITES[site_id].carried
    return _IfState(value, {n: names[n] for n in carried if isinstance(names.get(n), tl.tensor)})


def if_leave(site_id, state, names, branch):
    """At the end of a branch of an ``if`` on a run-time value: a reassigned variable keeps its type."""
    if not state.entry:
        return
    for name, live in state.entry.items():
        now = names.get(name, live)
        if now is not live and isinstance(now, tl.tensor) and now.type != live.type:
            raise _site_error(
                _SITES[site_id],
                f"initial value for `{name}` is of type {_type_text(live.type)}, but the {branch} block redefines "
                f"it as {_type_text(now.type)}: an if on a run-time value must leave each variable's type as it "
                f"was (convert with .to(...) after the if, or before it)",
            )


def scalar(value, kind, site_id):
    """``float(x)`` / ``int(x)`` in a kernel: the compiler applies them to constexprs only."""
    plain = _unwrap(value)
    if _ORIGINALS and isinstance(plain, tl.tensor):
        wants = "a string or a real number" if kind == "float" else "a string, a bytes-like object or a real number"
        raise _site_error(
            _SITES[site_id],
            f"{kind}() argument must be {wants}, not 'tensor': convert a tensor with x.to(tl.float32) / x.to(tl.int32)",
        )
    return float(plain) if kind == "float" else int(plain)


def device_print(site_id, *args, **kwargs):
    """``print`` inside a kernel: the compiler's ``device_print(prefix, *args)`` wants a string first."""
    if _ORIGINALS:
        site = _SITES[site_id]
        if not args:
            raise _site_error(site, "device_print() missing 1 required positional argument: 'prefix'")
        prefix = _unwrap(args[0])
        if not isinstance(prefix, str):
            what = _tensor_text(prefix) if isinstance(prefix, tl.tensor) else repr(prefix)
            raise _site_error(
                site,
                f"print's first argument is the prefix, which must be a string, not {what} (compiled Triton: "
                f"'... is not string'): write print(\"x\", x)",
            )
        if not prefix.isascii():
            raise _site_error(site, f"{prefix} is not an ascii string")
    kwargs.pop("hex", None)
    return builtins.print(*args, **kwargs)


def fvalue(value, site_id):
    """A value formatted into an f-string: the compiler formats only constexprs."""
    if _ORIGINALS and isinstance(value, tl.tensor):
        raise _site_error(
            _SITES[site_id],
            f"Cannot evaluate f-string containing non-constexpr conversion values, found conversion of type "
            f'{type(value)}: print tensors with print("x", x)',
        )
    return value


def loop_enter(site_id, names):
    """Before a loop: the values of the names it reassigns (the compiler's loop-carried values)."""
    if not _ORIGINALS:
        return None
    return {name: names[name] for name in _SITES[site_id].carried if name in names}


def loop_check(site_id, entry, names):
    """At the end of an iteration: a loop-carried value must keep its type, a constexpr its value."""
    if not entry:
        return
    site = _SITES[site_id]
    for name, live in entry.items():
        now = names.get(name, live)
        if now is live:
            continue
        if name in site.constexpr_params:
            raise _site_error(
                site,
                f"Loop carried variable {name} changed type: cannot reassign constexpr {name} in the loop (copy it "
                f"into a new variable before the loop)",
            )
        if isinstance(live, tl.tensor) and isinstance(now, tl.tensor) and now.type != live.type:
            raise _site_error(
                site,
                f"Loop-carried variable {name} has initial type {_type_text(live.type)} but is re-assigned to "
                f"{_type_text(now.type)} in "
                f"loop! Please make sure that the type stays consistent: give {name} its final type before the "
                f"loop (tl.zeros([BLOCK], dtype=...), or .to(...))",
            )


class _Transformer(_interp.ASTTransformer):
    """The interpreter's rewrite (``x = v`` -> ``to_tensor(v)``) plus calls to the checks above."""

    def __init__(self, fn, src):
        super().__init__()
        self.fn, self.src = fn, src
        self.name = getattr(fn, "__name__", "?")
        self.constexpr_params = _constexpr_params(fn)
        self.loops = self.ifs = 0
        self.print_is_builtin = "print" not in fn.__globals__

    def site(self, kind, node, **extra):
        # The rewriter shifts the tree's line numbers to the file's afterwards: keep the function's own.
        where = types.SimpleNamespace(lineno=node.lineno, col_offset=node.col_offset)
        _SITES.append(_Site(kind, self.name, self.src, where, constexpr_params=self.constexpr_params, **extra))
        return ast.Constant(len(_SITES) - 1)

    def call(self, helper, args, node):
        call = ast.Call(
            func=ast.Attribute(value=ast.Name(id=_HELPER, ctx=ast.Load()), attr=helper, ctx=ast.Load()),
            args=args,
            keywords=[],
        )
        return ast.copy_location(call, node)

    def visit_Assign(self, node):
        node.value = self.visit(node.value)  # the base class wraps the value without looking inside it
        return super().visit_Assign(node)

    def visit_FunctionDef(self, node):
        self.assigned = _assigned(node.body) | {a.arg for a in node.args.args}
        self.generic_visit(node)
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        names = tuple(sorted(_assigned(node.body) | _assigned(node.orelse)))
        site = self.site("if", node, carried=names)
        self.ifs += 1
        token = f"_kernels_if_{self.ifs}"
        locals_call = ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[])
        enter = ast.Assign(
            targets=[ast.Name(id=token, ctx=ast.Store())],
            value=self.call("if_enter", [node.test, site, locals_call], node.test),
        )
        node.test = ast.copy_location(
            ast.Attribute(value=ast.Name(id=token, ctx=ast.Load()), attr="cond", ctx=ast.Load()), node.test
        )
        for branch, body in (("then", node.body), ("else", node.orelse)):
            if body or branch == "then":
                leave = self.call(
                    "if_leave", [site, ast.Name(id=token, ctx=ast.Load()), locals_call, ast.Constant(branch)], node
                )
                body.append(ast.copy_location(ast.Expr(leave), node))
        return [ast.copy_location(enter, node), node]

    def visit_IfExp(self, node):
        self.generic_visit(node)
        node.test = self.call("cond", [node.test, self.site("ifexp", node)], node.test)
        return node

    def visit_While(self, node):
        self.generic_visit(node)
        node.test = self.call("cond", [node.test, self.site("while", node)], node.test)
        return self.loop(node, ())

    def visit_For(self, node):
        self.generic_visit(node)
        func = node.iter.func if isinstance(node.iter, ast.Call) else None
        if isinstance(func, (ast.Name, ast.Attribute)) and getattr(func, "attr", getattr(func, "id", "")) == (
            "static_range"
        ):
            return node  # unrolled by the compiler: no loop-carried values
        return self.loop(node, _targets(node.target))

    def loop(self, node, own):
        carried = tuple(sorted(_assigned(node.body) - set(own)))
        if not carried:
            return node
        site = self.site("loop", node, carried=carried)
        self.loops += 1
        token = f"_kernels_loop_{self.loops}"
        locals_call = ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[])
        enter = ast.Assign(
            targets=[ast.Name(id=token, ctx=ast.Store())], value=self.call("loop_enter", [site, locals_call], node)
        )
        check = ast.Expr(self.call("loop_check", [site, ast.Name(id=token, ctx=ast.Load()), locals_call], node))
        node.body = [*node.body, ast.copy_location(check, node)]
        return [ast.copy_location(enter, node), node]

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "print"
            and self.print_is_builtin
            and "print" not in getattr(self, "assigned", ())
        ):
            node.func = ast.copy_location(
                ast.Attribute(value=ast.Name(id=_HELPER, ctx=ast.Load()), attr="device_print", ctx=ast.Load()), func
            )
            node.args = [self.site("print", node), *node.args]
        elif (
            isinstance(func, ast.Name)
            and func.id in ("float", "int")
            and func.id not in self.fn.__globals__
            and func.id not in getattr(self, "assigned", ())
            and len(node.args) == 1
            and not node.keywords
        ):
            return self.call("scalar", [node.args[0], ast.Constant(func.id), self.site(func.id, node)], node)
        return node

    def visit_FormattedValue(self, node):
        self.generic_visit(node)
        node.value = self.call("fvalue", [node.value, self.site("fstring", node)], node.value)
        return node


def _targets(node) -> set:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, (ast.Tuple, ast.List)):
        return set().union(*(_targets(e) for e in node.elts)) if node.elts else set()
    return set()


def _assigned(stmts) -> set:
    """Names bound anywhere in ``stmts`` (assignments, loop targets, ``with ... as``)."""
    names = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    names |= _targets(target)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                names |= _targets(node.target)
            elif isinstance(node, ast.For):
                names |= _targets(node.target)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                names |= _targets(node.optional_vars)
    return {n for n in names if not n.startswith(("_kernels_loop_", "_kernels_if_"))}


# -- tl.dot's minimum sizes and accumulator -------------------------------------------------------------------


def min_dot_size(lhs_type, rhs_type):
    """The NVIDIA backend's ``min_dot_size`` (Triton 3.6: K >= 32 for 8-bit operands, else K >= 16;
    3.8 lowers that to 8 for fp32 and 4 for fp64, so this takes 3.6's, the stricter)."""
    lhs_bits = lhs_type.scalar.primitive_bitwidth
    rhs_bits = rhs_type.scalar.primitive_bitwidth
    assert lhs_bits == rhs_bits, "lhs and rhs bitwidth must be the same"
    k = 32 if lhs_bits == 8 else 16
    got = lhs_type.shape[-1]
    got = got.value if isinstance(got, tl.constexpr) else got
    assert got >= k, (
        f"Input shapes should have M >= 1, N >= 1 and K >= {k} (tl.dot of {lhs_type.scalar} on an NVIDIA GPU; "
        f"this dot has K = {got}): make the K block at least {k}, masking the extra lanes to zero"
    )
    return (1, 1, k)


def _dot(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype):
    """``tl.dot``'s front end with Triton 3.6's rule for an accumulator: 3.6 takes ``out_dtype=float32``
    when none is named and refuses any other accumulator; 3.8 infers it from ``acc``.  The stricter rule,
    so that a kernel CPU mode accepts compiles on both."""
    if acc is not None and out_dtype is None and acc.type.scalar != tl.float32:
        kind = acc.type.scalar
        raise JitRuleError(
            None,
            None,
            f"tl.dot into a {kind} accumulator needs out_dtype=tl.{kind}: Triton 3.6 takes float32 when none "
            f"is named and refuses the kernel (write tl.dot(a, b, acc, out_dtype=tl.{kind}))",
        )
    original = _ORIGINALS[(TritonSemantic, "dot")]
    return original(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype)


# -- install ---------------------------------------------------------------------------------------------

_ORIGINALS = {}


def _run(self, *args, grid, warmup, **kwargs):
    if not warmup:
        check_launch(self, args, kwargs)
    return _ORIGINALS[(_interp.InterpretedFunction, "run")](self, *args, grid=grid, warmup=warmup, **kwargs)


def _call(self, *args, **kwargs):
    check_call(self, args, kwargs)
    return _ORIGINALS[(_interp.InterpretedFunction, "__call__")](self, *args, **kwargs)


def _transform_ast(self, src):
    try:
        self.ast_transformer = _Transformer(self.fn, src)
        return _ORIGINALS[(_interp.FunctionRewriter, "_transform_ast")](self, src)
    except Exception:
        self.ast_transformer = type(self).ast_transformer
        return _ORIGINALS[(_interp.FunctionRewriter, "_transform_ast")](self, src)
    finally:
        vars(self).pop("ast_transformer", None)


def _compile_and_exec(self, transformed_ast):
    fn_globals = self.fn.__globals__
    before = set(fn_globals)
    fn_globals.setdefault(_HELPER, _REWRITER_GLOBALS[_HELPER])
    try:
        return _ORIGINALS[(_interp.FunctionRewriter, "_compile_and_exec")](self, transformed_ast)
    finally:
        _INJECTED.setdefault(id(fn_globals), set()).update(set(fn_globals) - before)


_PATCHES = (
    (_interp.InterpretedFunction, "run", _run),
    (_interp.InterpretedFunction, "__call__", _call),
    (_interp.FunctionRewriter, "_transform_ast", _transform_ast),
    (_interp.FunctionRewriter, "_compile_and_exec", _compile_and_exec),
    (TritonSemantic, "dot", _dot),
)


def installed() -> bool:
    return bool(_ORIGINALS)


def install() -> None:
    """Make the interpreter refuse what the compiler refuses (idempotent)."""
    if _ORIGINALS:
        return
    import sys

    _REWRITER_GLOBALS[_HELPER] = sys.modules[__name__]  # what rewritten kernels find under _HELPER
    for owner, name, replacement in _PATCHES:
        _ORIGINALS[(owner, name)] = owner.__dict__[name]
        setattr(owner, name, replacement)
    fns = _interp.interpreter_builder.codegen_fns
    _ORIGINALS["min_dot_size"] = fns.get("min_dot_size")
    fns["min_dot_size"] = min_dot_size


def uninstall() -> None:
    """Let the interpreter accept what it accepts on its own (idempotent)."""
    if not _ORIGINALS:
        return
    fns = _interp.interpreter_builder.codegen_fns
    fns["min_dot_size"] = _ORIGINALS.pop("min_dot_size")
    for (owner, name), original in list(_ORIGINALS.items()):
        setattr(owner, name, original)
    _ORIGINALS.clear()


__all__ = ["JitRuleError", "UnsupportedFunctionError", "check_launch", "install", "installed", "uninstall"]
