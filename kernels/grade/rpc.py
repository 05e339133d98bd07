"""Plain-data calls between the grader's judge and a submission's sandbox: :func:`serve` (the sandbox's
side), :class:`Client` and the :class:`Remote` proxies it hands out (the judge's side), the framing
(:func:`write_message`, :func:`read_message`) and its values (:class:`Encoder`, :class:`Decoder`), and
:func:`time_limit`; :func:`run_student_side` and the ``remote_*`` questions serve :mod:`kernels.checks`.

The batch grader (:mod:`kernels.grade`) never runs a lab's checks in the process that ran the student's
notebook: whatever that process did to itself (replaced a reference, wrapped otter, patched numpy, hooked
imports) would decide its own score.  Instead two processes meet over two pipes:

* the **sandbox** ran the notebook; it then *serves* the names the tests take, answering requests;
* the **judge** never runs student code.  It runs the lab's otter tests, in which every graded name is a
  :class:`Remote`: calling it, reading an attribute, indexing it or calling a method sends the arguments
  to the sandbox and waits for the answer.

Only plain data crosses, in both directions: ``None``, booleans, numbers, strings, bytes, fractions,
tuples, lists, dicts, slices, ``torch.dtype``, and tensors and numpy arrays as (dtype, shape, strides,
raw bytes).  Nothing that runs code when it is decoded (no pickle).  An object of any other kind stays
where it is and travels as a numbered reference: the judge holds a :class:`Remote` for the sandbox's
object, and the sandbox receives the object itself when the judge sends the reference back.  Tensors the
judge passes are copies; any the student's code changed in place are sent back after the call and
copied into the judge's own (``unscale_(grads, found_inf, inv_scale)`` writes its arguments).

An exception raised by the student's code comes back as the same chain of exception types by name with
their messages, so the checks' diagnoses ("raised NotImplementedError: not done yet", a compiler's
refusal, an out-of-bounds access) read as they do in the notebook; a compiler's refusal is rebuilt as a
``CompilationError`` and the bounds check's refusal as a :class:`kernels._bounds.OutOfBounds`, which the
checks match by class.

Checks whose student part needs live objects (a model with an optimizer, autograd through the student's
backward) run that part in the sandbox with :func:`kernels.checks.student_side`; it returns what the
part observed, as plain data, and the judge compares it with its own reference.  Everything that comes
back from the sandbox is the submission's output: a tampered sandbox can only change what it answers,
and it scores only if its answers are the right ones.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import fractions
import importlib
import json
import os
import signal
import struct

import numpy as np
import torch

from kernels._bounds import OutOfBounds

__all__ = [
    "MAX_MESSAGE",
    "Client",
    "Decoder",
    "Encoder",
    "ProtocolError",
    "Refs",
    "Remote",
    "RemoteCallable",
    "RemoteError",
    "RemoteObject",
    "SandboxGone",
    "TimeLimit",
    "describe",
    "describe_exception",
    "is_remote",
    "read_message",
    "remote_info",
    "remote_is_triton_function",
    "remote_kind",
    "run_student_side",
    "serve",
    "time_limit",
    "write_message",
]

MAX_MESSAGE = 1 << 30  # bytes; a sandbox that sends more is cut off, not believed
_HEADER = struct.Struct("<QI")  # total length, JSON length


class ProtocolError(RuntimeError):
    """The other side sent something that is not a well-formed message (or went away)."""


class SandboxGone(ProtocolError):
    """The sandbox closed its end: it exited, crashed or was killed while the judge was waiting."""


class RemoteError(Exception):
    """Base of the exceptions rebuilt from the sandbox (the student's code raised)."""

    text = ""

    def __str__(self):
        return self.text


# ------------------------------------------------------------------------------------------------
# Encoding


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"not a torch dtype: {name!r}")
    return dtype


def _numpy_dtype(name: str) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except TypeError as e:
        raise ProtocolError(f"not a numpy dtype: {name!r}") from e
    if dtype.kind not in "biufcmM" or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"numpy dtype {name!r} is not plain data")
    return dtype


class Encoder:
    """Turns a value into JSON plus raw buffers.  ``refs`` (the sandbox's side) numbers the objects that
    are not plain data; without it (the judge's side) such an object is an error."""

    def __init__(self, refs: Refs | None = None):
        self.refs = refs
        self.blobs: list[bytes] = []
        self.tensors: list[torch.Tensor] = []  # every tensor encoded, in order (for write-backs)

    def blob(self, data: bytes) -> int:
        self.blobs.append(bytes(data))
        return len(self.blobs) - 1

    def __call__(self, v, depth=0):
        if depth > 64:
            raise ValueError("a value nested more than 64 deep")
        if v is None or isinstance(v, bool | str):
            return v
        if isinstance(v, int):
            return v if -(2**63) <= v < 2**63 else {"t": "int", "v": str(v)}
        if isinstance(v, float):
            return {"t": "float", "v": float(v).hex()}  # exact, and NaN/inf without JSON extensions
        if isinstance(v, Remote):
            return {"t": "ref", "id": v._id}
        if isinstance(v, torch.Tensor):
            return self._tensor(v)
        if isinstance(v, np.ndarray) and v.dtype.kind in "biufcmM" and v.dtype.fields is None:
            a = np.ascontiguousarray(v)
            return {"t": "ndarray", "dtype": a.dtype.str, "shape": list(a.shape), "b": self.blob(a.tobytes())}
        if isinstance(v, np.generic) and np.dtype(type(v)).kind in "biufcmM":
            return {"t": "npscalar", "dtype": v.dtype.str, "b": self.blob(v.tobytes())}
        if isinstance(v, torch.dtype):
            return {"t": "dtype", "v": _dtype_name(v)}
        if isinstance(v, torch.device):
            return {"t": "device", "v": str(v)}
        if isinstance(v, torch.Size):
            return {"t": "size", "v": [int(x) for x in v]}
        if isinstance(v, fractions.Fraction):
            return {"t": "fraction", "n": str(v.numerator), "d": str(v.denominator)}
        if isinstance(v, complex):
            return {"t": "complex", "re": v.real.hex(), "im": v.imag.hex()}
        if isinstance(v, bytes | bytearray):
            return {"t": "bytes", "b": self.blob(v)}
        if isinstance(v, slice):
            return {"t": "slice", "v": [self(v.start, depth + 1), self(v.stop, depth + 1), self(v.step, depth + 1)]}
        if v is Ellipsis:
            return {"t": "ellipsis"}
        if isinstance(v, tuple | list):  # namedtuples and torch's return types arrive as tuples
            return {"t": "tuple" if isinstance(v, tuple) else "list", "v": [self(x, depth + 1) for x in v]}
        if isinstance(v, set | frozenset):
            return {"t": "frozenset" if isinstance(v, frozenset) else "set", "v": [self(x, depth + 1) for x in v]}
        if isinstance(v, dict):  # an OrderedDict (a state_dict) arrives as a dict
            items = list(dict.items(v))
            keys, values = [self(k, depth + 1) for k, _ in items], [self(x, depth + 1) for _, x in items]
            return {"t": "dict", "k": keys, "v": values}
        if _package_dataclass(type(v)):  # a kernels.formats.Format, say: rebuilt from its fields
            fields = {f.name: self(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v) if f.init}
            return {"t": "dataclass", "module": type(v).__module__, "qualname": type(v).__qualname__, "v": fields}
        if self.refs is None:
            raise TypeError(f"cannot send a {type(v).__name__} to the submission: only plain data crosses")
        return self.refs.add(v)

    def _tensor(self, v: torch.Tensor) -> dict:
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        shape, strides = list(t.shape), list(t.stride())
        flat = t.contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        self.tensors.append(v)
        return {
            "t": "tensor",
            "dtype": _dtype_name(t.dtype),
            "shape": shape,
            "strides": strides,
            "grad": bool(v.requires_grad),
            "b": self.blob(raw),
        }


class Decoder:
    """The inverse of :class:`Encoder`; ``refs`` resolves references to the sandbox's objects (on the
    sandbox's side), ``make_remote`` wraps them (on the judge's side)."""

    def __init__(self, blobs, refs: Refs | None = None, make_remote=None):
        self.blobs, self.refs, self.make_remote = blobs, refs, make_remote
        self.tensors: list[torch.Tensor] = []

    def blob(self, i) -> bytes:
        if not isinstance(i, int) or not 0 <= i < len(self.blobs):
            raise ProtocolError(f"bad buffer index {i!r}")
        return self.blobs[i]

    def __call__(self, v, depth=0):
        if depth > 64:
            raise ProtocolError("nested more than 64 deep")
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):  # the other side never sends bare floats, but JSON may
            return v
        if not isinstance(v, dict) or not isinstance(v.get("t"), str):
            raise ProtocolError(f"not an encoded value: {str(v)[:80]}")
        t = v["t"]
        if t == "int":
            return int(v["v"])
        if t == "float":
            return float.fromhex(v["v"])
        if t == "tensor":
            return self._tensor(v)
        if t == "ndarray":
            dtype = _numpy_dtype(v["dtype"])
            shape = tuple(int(x) for x in v["shape"])
            data = self.blob(v["b"])
            if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
                raise ProtocolError("array size does not match its bytes")
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if t == "npscalar":
            dtype = _numpy_dtype(v["dtype"])
            data = self.blob(v["b"])
            if len(data) != dtype.itemsize:
                raise ProtocolError("scalar size does not match its bytes")
            return np.frombuffer(data, dtype=dtype)[0]
        if t == "dtype":
            return _torch_dtype(v["v"])
        if t == "device":
            return torch.device(str(v["v"]))
        if t == "size":
            return torch.Size([int(x) for x in v["v"]])
        if t == "fraction":
            return fractions.Fraction(int(v["n"]), int(v["d"]))
        if t == "complex":
            return complex(float.fromhex(v["re"]), float.fromhex(v["im"]))
        if t == "bytes":
            return self.blob(v["b"])
        if t == "slice":
            return slice(*(self(x, depth + 1) for x in v["v"][:3]))
        if t == "ellipsis":
            return Ellipsis
        if t in ("tuple", "list"):
            items = [self(x, depth + 1) for x in v["v"]]
            return tuple(items) if t == "tuple" else items
        if t in ("set", "frozenset"):
            items = [self(x, depth + 1) for x in v["v"]]
            return set(items) if t == "set" else frozenset(items)
        if t == "dict":
            return {self(k, depth + 1): self(x, depth + 1) for k, x in zip(v["k"], v["v"], strict=True)}
        if t == "dataclass":
            cls = _package_attr(v.get("module"), v.get("qualname"))
            if not _package_dataclass(cls) or not isinstance(v.get("v"), dict):
                raise ProtocolError(f"not a package dataclass: {v.get('module')}:{v.get('qualname')}")
            return _interned(cls(**{str(k): self(x, depth + 1) for k, x in v["v"].items()}))
        if t == "ref":
            if self.refs is not None:
                return self.refs.get(v["id"])
            if self.make_remote is not None:
                return self.make_remote(v)
        raise ProtocolError(f"unknown value type {t!r}")

    def _tensor(self, v) -> torch.Tensor:
        dtype = _torch_dtype(v["dtype"])
        shape = [int(x) for x in v["shape"]]
        data = self.blob(v["b"])
        numel = int(np.prod(shape, dtype=np.int64))
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != len(data) or any(s < 0 for s in shape):
            raise ProtocolError("tensor size does not match its bytes")
        if numel:
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
            t = flat.reshape(shape)
        else:
            t = torch.empty(shape, dtype=dtype)
        strides = [int(x) for x in v.get("strides", [])]
        if numel > 1 and len(strides) == len(shape) and tuple(strides) != t.stride():
            try:  # the student's layout (a transposed result stays transposed)
                laid = torch.empty_strided(shape, strides, dtype=dtype)
                if laid.untyped_storage().nbytes() <= 4 * len(data) + 64:
                    laid.copy_(t)
                    t = laid
            except RuntimeError:
                pass
        if v.get("grad") and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        self.tensors.append(t)
        return t


def _package_attr(module, qualname):
    """``module.qualname``, for a module of this package only (never a name the other side made up)."""
    module, qualname = str(module or ""), str(qualname or "")
    parts = qualname.split(".")
    if not (module == "kernels" or module.startswith("kernels.")) or not all(p.isidentifier() for p in parts):
        raise ProtocolError(f"not a name in the package: {module}:{qualname}")
    try:
        obj = importlib.import_module(module)
        for part in parts:
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ProtocolError(f"no such name in the package: {module}:{qualname}") from e
    return obj


def _interned(obj):
    """The package's own constant equal to ``obj`` (``formats.E8M0``), if its module has one: code that
    compares formats by identity (``fmt is formats.E8M0``) sees what it would see in one process."""
    module = importlib.import_module(type(obj).__module__)
    for value in vars(module).values():
        if type(value) is type(obj) and value == obj:
            return value
    return obj


def _package_dataclass(cls) -> bool:
    return (
        isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and (cls.__module__ == "kernels" or cls.__module__.startswith("kernels."))
    )


class Refs:
    """The sandbox's numbered objects (what the judge holds as :class:`Remote`)."""

    def __init__(self):
        self.objects: dict[int, object] = {}

    def add(self, obj) -> dict:
        i = len(self.objects) + 1
        self.objects[i] = obj
        return {"t": "ref", "id": i, **describe(obj)}

    def get(self, i):
        if i not in self.objects:
            raise ProtocolError(f"no object number {i!r}")
        return self.objects[i]


def describe(obj) -> dict:
    """What the judge may know of a sandbox object without asking: its kind and names."""
    name = getattr(obj, "__name__", None)
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    return {
        "module": module[:200] if isinstance(module, str) else None,
        "kind": "class" if isinstance(obj, type) else "callable" if callable(obj) else "object",
        "type": type(obj).__name__[:200],
        "name": name[:200] if isinstance(name, str) else None,
        "qualname": qualname[:200] if isinstance(qualname, str) else None,
        "jit": _is_triton_function(obj),
    }


def _is_triton_function(obj) -> bool:
    try:
        import triton

        return isinstance(obj, triton.runtime.KernelInterface)
    except Exception:  # noqa: BLE001 - whatever the object's own isinstance hooks do
        return False


# ------------------------------------------------------------------------------------------------
# Framing


def write_message(fd: int, header: dict, blobs=()):
    body = json.dumps(header, allow_nan=False).encode()
    lengths = [len(b) for b in blobs]
    head = json.dumps(lengths).encode()
    total = _HEADER.size + len(head) + len(body) + sum(lengths)
    data = b"".join([_HEADER.pack(total, len(head)), head, struct.pack("<I", len(body)), body, *blobs])
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise SandboxGone("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int, limit: int = MAX_MESSAGE):
    total, head_len = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if total > limit or head_len > total:
        raise ProtocolError(f"a message of {total} bytes (the limit is {limit})")
    rest = _read_exact(fd, total - _HEADER.size + 4)
    try:
        lengths = json.loads(rest[:head_len])
        (body_len,) = struct.unpack("<I", rest[head_len : head_len + 4])
        start = head_len + 4
        header = json.loads(rest[start : start + body_len])
    except (ValueError, struct.error) as e:
        raise ProtocolError(f"a malformed message: {e}") from e
    if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths):
        raise ProtocolError("a malformed message: bad buffer lengths")
    pos, blobs = start + body_len, []
    for n in lengths:
        blobs.append(rest[pos : pos + n])
        pos += n
    if pos != len(rest) or not isinstance(header, dict):
        raise ProtocolError("a malformed message: lengths do not add up")
    return header, blobs


# ------------------------------------------------------------------------------------------------
# The judge's side


class Remote:
    """A sandbox object, seen from the judge.  Calls, attributes, items and methods go to the sandbox."""

    __slots__ = ("_client", "_id", "_info")

    def __init__(self, client, info: dict):
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_id", info["id"])
        object.__setattr__(self, "_info", info)

    def __getattr__(self, name):
        if name in ("__name__", "__qualname__"):
            value = self._info.get(name.strip("_"))
            if value is None:
                raise AttributeError(name)
            return value
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._client.request("getattr", self, [name], {})

    def __setattr__(self, name, value):
        self._client.request("setattr", self, [name, value], {})

    def __getitem__(self, key):
        return self._client.request("getitem", self, [key], {})

    def __setitem__(self, key, value):
        self._client.request("setitem", self, [key, value], {})

    def __repr__(self):
        return f"<the submission's {self._info.get('type') or 'object'} {self._info.get('qualname') or ''}>".replace(
            " >", ">"
        )


class RemoteCallable(Remote):
    """A sandbox object that can be called (a function, a class, a kernel launcher, a bound method)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return self._client.request("call", self, list(args), kwargs)


class RemoteObject(Remote):
    """A sandbox object that is not callable: ``callable()`` says so, as it would in the notebook."""

    __slots__ = ()


def is_remote(obj) -> bool:
    return isinstance(obj, Remote)


def remote_kind(obj) -> str | None:
    """ "class", "callable" or "object" for a :class:`Remote`; None for anything else."""
    return obj._info.get("kind") if isinstance(obj, Remote) else None


def remote_is_triton_function(obj) -> bool:
    return isinstance(obj, Remote) and bool(obj._info.get("jit"))


def remote_info(obj) -> dict:
    """What the sandbox told of the object a :class:`Remote` stands for (:func:`describe`: its module,
    kind, type and names); {} for anything else."""
    return dict(obj._info) if isinstance(obj, Remote) else {}


def _rebuild(chain: list) -> BaseException:
    """The student's exception chain, outermost first, as exceptions of the same names."""
    from triton.compiler.errors import CompilationError

    built = None
    for item in reversed(chain[:16]):
        name = str(item.get("type", "Exception"))[:100]
        name = name if name.isidentifier() else "Exception"
        base = getattr(builtins, name, None)
        bases = (RemoteError,)
        if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
            bases = (base, RemoteError)
        elif item.get("compilation_error"):
            bases = (CompilationError, RemoteError)
        elif item.get("out_of_bounds"):  # the bounds check's refusal: the checks match it by its class
            bases = (OutOfBounds, RemoteError)
        cls = type(name, bases, {"__str__": RemoteError.__str__, "__module__": "submission"})
        e = cls.__new__(cls)
        e.args = (str(item.get("text", ""))[:20000],)
        e.text = e.args[0]
        e.__cause__ = built
        built = e
    return built or RemoteError()


class Client:
    """The judge's connection: requests on ``out_fd``, answers on ``in_fd``."""

    def __init__(self, in_fd: int, out_fd: int):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.names: dict = {}
        self.calls = 0
        self.gone = ""  # why the sandbox stopped answering, once it has

    def _remote(self, info):
        if not isinstance(info, dict) or not isinstance(info.get("id"), int):
            raise ProtocolError("a malformed reference")
        kind = info.get("kind")
        return (RemoteObject if kind == "object" else RemoteCallable)(self, info)

    def hello(self) -> dict:
        """Wait for the sandbox to finish the notebook; returns {name: value or Remote} of what it serves."""
        header, blobs = read_message(self.in_fd)
        if header.get("op") != "ready":
            raise ProtocolError("the sandbox did not say it was ready")
        decode = Decoder(blobs, make_remote=self._remote)
        names = header.get("names", {})
        if not isinstance(names, dict):
            raise ProtocolError("a malformed list of names")
        self.names = {str(k): decode(v) for k, v in names.items()}
        return self.names

    def request(self, op, target, args, kwargs):
        encode = Encoder()
        header = {
            "op": op,
            "target": target if op == "run" else encode(target),
            "args": encode(list(args)),
            "kwargs": encode(dict(kwargs)),
        }
        sent = encode.tensors
        if self.gone:
            raise SandboxGone(self.gone)
        try:
            write_message(self.out_fd, header, encode.blobs)
            self.calls += 1
            reply, blobs = read_message(self.in_fd)
        except (ProtocolError, OSError) as e:  # a dead sandbox (EPIPE, EOF) or a garbled one
            self.gone = f"{type(e).__name__}: {e}"
            raise SandboxGone(self.gone) from e
        decode = Decoder(blobs, make_remote=self._remote)
        for item in reply.get("written", []):  # tensor arguments changed in place by the student's code
            i, value = item.get("i"), decode(item.get("v"))
            if isinstance(i, int) and 0 <= i < len(sent) and isinstance(value, torch.Tensor):
                _write_back(sent[i], value)
        if "error" in reply:
            raise _rebuild(reply["error"] if isinstance(reply["error"], list) else [])
        if "value" not in reply:
            raise ProtocolError("an answer with neither a value nor an error")
        return decode(reply["value"])


def _write_back(original: torch.Tensor, new: torch.Tensor):
    with torch.no_grad():
        if original.shape == new.shape and original.dtype == new.dtype:
            original.copy_(new.to(original.device))
        elif original.numel() == new.numel() and original.dtype == new.dtype:
            original.copy_(new.reshape(original.shape).to(original.device))


def run_student_side(func, args, kwargs):
    """For :func:`kernels.checks.student_side`: run ``func`` (a module-level function or class of the
    package) in the sandbox that holds the Remote among ``args``."""
    client = next((a._client for a in [*args, *kwargs.values()] if isinstance(a, Remote)), None)
    if client is None:
        return func(*args, **kwargs)
    where = {"t": "function", "module": func.__module__, "qualname": func.__qualname__}
    return client.request("run", where, list(args), kwargs)


# ------------------------------------------------------------------------------------------------
# The sandbox's side


def _package_function(where: dict):
    """A function or class of the package named by the judge (``student_side``): only kernels.*."""
    return _package_attr(where.get("module"), where.get("qualname"))


def describe_exception(e: BaseException) -> list:
    from triton.compiler.errors import CompilationError

    chain, seen, cur = [], set(), e
    while cur is not None and id(cur) not in seen and len(chain) < 16:
        seen.add(id(cur))
        try:
            text = str(cur)
        except Exception:  # noqa: BLE001 - a student's exception whose __str__ raises
            text = f"<{type(cur).__name__} whose message cannot be shown>"
        chain.append(
            {
                "type": type(cur).__name__,
                "text": text[:20000],
                "compilation_error": isinstance(cur, CompilationError),
                "out_of_bounds": isinstance(cur, OutOfBounds),
            }
        )
        cur = cur.__cause__ or cur.__context__
    return chain


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().reshape(-1), b.reshape(-1)
    return a.numel() == 0 or torch.equal(a.view(torch.uint8), b.view(torch.uint8))


class TimeLimit(BaseException):
    """A cell, or a call while scoring, used more than its CPU time (raised in it by SIGPROF)."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """Interrupt the block with :class:`TimeLimit` once the process has spent ``seconds`` of CPU time
    in it (main thread).  CPU time, not the wall clock: a loaded grading machine does not make a cell
    slower by this measure; a cell that sleeps is left to the submission's wall-clock limit."""

    def alarm(signum, frame):
        raise TimeLimit(f"{what} ran longer than {seconds:g} s of CPU time and was stopped")

    previous = signal.signal(signal.SIGPROF, alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def serve(in_fd: int, out_fd: int, namespace: dict, names: list, limit_s: float = 0):
    """Answer the judge's requests until it closes the connection.  ``names``: what the tests take;
    ``limit_s``: the longest one call of the student's code may run (0: no limit)."""
    refs = Refs()
    encode = Encoder(refs)
    served = {n: encode(namespace[n]) for n in names if n in namespace}
    write_message(out_fd, {"op": "ready", "names": served}, encode.blobs)
    while True:
        try:
            header, blobs = read_message(in_fd)
        except SandboxGone:
            return
        decode = Decoder(blobs, refs=refs)
        reply, encode = {}, Encoder(refs)
        try:
            op = header.get("op")
            target = header.get("target")
            if op == "run":
                target = _package_function(target)
            else:
                target = decode(target)
            args, kwargs = decode(header.get("args", {"t": "list", "v": []})), decode(header.get("kwargs"))
            received = [(t, t.detach().clone()) for t in decode.tensors]
            try:
                if op in ("call", "run") and limit_s:
                    with time_limit(limit_s, "a call of the graded code"):
                        value = target(*args, **kwargs)
                elif op in ("call", "run"):
                    value = target(*args, **kwargs)
                elif op == "getattr":
                    value = getattr(target, args[0])
                elif op == "setattr":
                    value = setattr(target, args[0], args[1])
                elif op == "getitem":
                    value = target[args[0]]
                elif op == "setitem":
                    target[args[0]] = args[1]
                    value = None
                else:
                    raise ProtocolError(f"unknown request {op!r}")
                reply["value"] = encode(value)
            except BaseException as e:  # noqa: BLE001 - the student's error (SystemExit too) goes to the judge
                reply = {"error": describe_exception(e)}
                encode = Encoder(refs)
            written = []
            for i, (now, before) in enumerate(received):
                if not _same_bits(now, before):
                    written.append({"i": i, "v": encode(now)})
            reply["written"] = written
        except ProtocolError as e:
            reply = {"error": [{"type": "ProtocolError", "text": str(e)[:2000]}], "written": []}
            encode = Encoder(refs)
        write_message(out_fd, reply, encode.blobs)
