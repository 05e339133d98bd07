"""pytest's setup for the whole checkout: the tests under tests/ and nbval over the notebooks.

Two things concern the notebooks' Jupyter kernels, which nbval starts:

* a kernel that dies while starting is started again (:func:`_starting_again`);
* the CPU's matrix arithmetic is made the recording host's where it can be (:func:`host_blas`).  A few cells
  (tagged :data:`TAG`) print losses of chapter 7's model, which is trained and evaluated in float64 on the
  CPU.  PyTorch's CPU BLAS on x86 is MKL, and MKL picks its code by CPU vendor: on an AMD processor it
  runs other code than on the Intel Xeon that hosted the GPU recordings, the last bits of products differ,
  and the quantized losses move in their fourth decimal (and, for one symmetric INT4 row, by a unit of the
  third).  MKL decides through one function, ``mkl_serv_intel_cpu_true``, which PyTorch's build exports;
  a kernel started with a one-function library in ``LD_PRELOAD`` that answers "yes" runs MKL's Intel code,
  and an AMD processor with the same instructions (AVX-512) then gives the recording host's bits.  Each
  process checks that with a fixed probe of products (:data:`PROBE`) against the recording host's hash
  (:data:`RECORDING_HOST_BLAS`) and uses the library only if the bits then agree.  Where they cannot
  agree (a CPU without AVX-512, an ARM laptop, no C compiler), a tagged cell is accepted when it differs
  from the recording only in the last digits of its numbers (:func:`outputs_within`), with a warning;
  every other cell, and every other difference, still fails.
"""

import atexit
import contextlib
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from decimal import Decimal

STARTS = 3  # tries at starting a notebook's Jupyter kernel

TAG = "host-blas-digits"  # a checked cell whose printed numbers depend on the CPU's BLAS
UNITS = 10  # how far such a number may move, in units of its last printed digit, where the bits differ

# Fixed float32 and float64 products on one thread; the first 12 hex digits of their bits' SHA-256.
PROBE = """
import hashlib
import torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
h = hashlib.sha256()
for dtype in (torch.float32, torch.float64):
    for m, n, k in ((64, 64, 64), (256, 192, 64), (8192, 96, 64), (1000, 333, 257)):
        a = torch.randn(m, k, generator=g, dtype=dtype)
        b = torch.randn(k, n, generator=g, dtype=dtype)
        h.update((a @ b).numpy().tobytes())
print(h.hexdigest()[:12])
"""
RECORDING_HOST_BLAS = "ed29c04b28c1"  # PROBE on the H100 host (Intel Xeon, torch 2.11); AMD EPYC + library, 2.14.1

INTEL_CODE_PATH = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"  # MKL: "is this CPU an Intel one?"


def _starting_again(start_new_kernel):
    """``start_new_kernel`` that starts a kernel again if the first one dies before it answers.

    Many kernels starting at once (the GPU lane runs nbval and the grader's notebooks side by side) can
    lose a race for a port, and the new kernel exits before replying; nbval would then fail every cell
    of that notebook.  Nothing of the notebook has run by then, so starting again loses nothing; a
    kernel that dies ``STARTS`` times is still an error."""

    def start(*args, **kwargs):
        with _kernel_environment():
            for _ in range(STARTS - 1):
                try:
                    return start_new_kernel(*args, **kwargs)
                except RuntimeError as exc:
                    if "died before replying" not in str(exc):
                        raise
                    warnings.warn(f"a Jupyter kernel died while starting ({exc}); starting it again", stacklevel=2)
            return start_new_kernel(*args, **kwargs)

    start.starts_again = True
    return start


def probe(preload: str | None = None) -> str:
    """:data:`PROBE` run in a fresh Python, with ``preload`` in front of its ``LD_PRELOAD`` if given."""
    env = _preloading(preload)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"the BLAS probe failed: {done.stderr.strip()[-500:]}")
    return done.stdout.split()[-1]


def _intel_code_path_library() -> str | None:
    """The one-function library of :data:`INTEL_CODE_PATH`, compiled into a folder removed at exit; ``None``
    where there is no C compiler or it fails."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    folder = tempfile.mkdtemp(prefix="mkl-intel-path-")
    atexit.register(shutil.rmtree, folder, True)
    src, lib = os.path.join(folder, "intel.c"), os.path.join(folder, "libmkl_intel_path.so")
    with open(src, "w") as f:
        f.write(INTEL_CODE_PATH)
    done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", lib, src], capture_output=True, timeout=120)
    return lib if done.returncode == 0 else None


def _preloading(lib: str | None) -> dict:
    """``os.environ`` with ``lib`` in front of its ``LD_PRELOAD`` (unchanged for ``None``)."""
    env = dict(os.environ)
    if lib:
        env["LD_PRELOAD"] = " ".join(filter(None, (lib, env.get("LD_PRELOAD"))))
    return env


@functools.cache
def _arrangement() -> tuple[str, str | None]:
    """(:func:`host_blas`'s answer, the library to preload or ``None``), found once per process."""
    try:
        if probe() == RECORDING_HOST_BLAS:
            return "recording host", None
        if sys.platform == "linux" and platform.machine() == "x86_64":
            lib = _intel_code_path_library()
            if lib is not None and probe(lib) == RECORDING_HOST_BLAS:
                return "intel code path", lib
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        warnings.warn(f"host_blas: {exc}; comparing as on a CPU of other arithmetic", stacklevel=2)
    return "other", None


def host_blas() -> str:
    """How this process's notebook kernels compute CPU products: ``"recording host"`` (the probe's bits
    are the recording host's as they are), ``"intel code path"`` (they are with the library of
    :data:`INTEL_CODE_PATH` preloaded, which every kernel this process starts gets) or ``"other"``."""
    return _arrangement()[0]


@contextlib.contextmanager
def _kernel_environment():
    """The environment a notebook's kernel starts in (it inherits ``os.environ`` when it starts): the
    library of :data:`INTEL_CODE_PATH` preloaded where :func:`host_blas` found it gives the recording
    host's bits, and ``LD_PRELOAD`` as it was again afterwards, so that nothing else this process starts
    (the grader's sandboxes, the tests' subprocesses) runs with it."""
    lib, before = _arrangement()[1], os.environ.get("LD_PRELOAD")
    if lib is not None:
        os.environ["LD_PRELOAD"] = _preloading(lib)["LD_PRELOAD"]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before


# A signed decimal number (digits, a point, digits) with an optional exponent, or an integer.
_NUMBER = re.compile(r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _split(number: str) -> tuple[str, str]:
    mantissa, _, exponent = number.lower().partition("e")
    return mantissa, exponent


def _table_cell(before: str, after: str) -> bool:
    """Whether a number stands alone as a percentage column of a table: whitespace before it, ``%`` and
    then whitespace or the end after it (not ``(< 1%)`` or ``1-3%`` in a printed verdict)."""
    return (before == "" or before[-1].isspace()) and re.match(r"%(\s|$)", after) is not None


def within_last_digits(recorded: str, rerun: str, units: int = UNITS) -> bool:
    """Whether ``rerun`` is ``recorded`` with only decimal numbers moved, each by at most ``units`` units
    of its last printed digit, and whole percentages standing alone in a table column (`` 19%``) by at
    most one.  Text between numbers, other integers, the number of digits after each point and each
    exponent must be identical."""
    if not isinstance(units, int) or units < 0:
        raise ValueError(f"units must be a non-negative int, got {units!r}")
    a, b = _NUMBER.split(recorded), _NUMBER.split(rerun)
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            continue
        if i % 2 == 0:  # text between numbers (the even places of the split) must be equal
            return False
        (mx, ex), (my, ey) = _split(x), _split(y)
        decimals = len(mx.partition(".")[2])
        if x.isdigit() and y.isdigit() and _table_cell(a[i - 1], a[i + 1]):
            if abs(int(mx) - int(my)) > 1:  # a whole percentage in a table: its last digit may move by one
                return False
            continue
        if "." not in mx or "." not in my or ex != ey:  # other integers and exponents exactly
            return False
        if len(my.partition(".")[2]) != decimals:  # the same format
            return False
        if abs(Decimal(mx) - Decimal(my)) > units * Decimal(10) ** -decimals:
            return False
    return True


_TEXT_KEYS = ("text", "text/plain")
_IGNORED = ("execution_count", "metadata", "transient")


def outputs_within(rerun: list, recorded: list, units: int = UNITS) -> bool:
    """:func:`within_last_digits` over a cell's outputs (nbformat output dicts, streams coalesced): the same
    outputs in the same order, plain text compared digit-tolerantly, everything else exactly."""
    if len(rerun) != len(recorded):
        return False
    for new, old in zip(rerun, recorded, strict=True):
        if set(new) - set(_IGNORED) != set(old) - set(_IGNORED):
            return False
        for key in set(old) - set(_IGNORED):
            if key == "data":
                if set(new["data"]) != set(old["data"]):
                    return False
                pairs = [(k, new["data"][k], old["data"][k]) for k in old["data"]]
            else:
                pairs = [(key, new[key], old[key])]
            for k, n, o in pairs:
                if k in _TEXT_KEYS and isinstance(o, str) and isinstance(n, str):
                    if not within_last_digits(o, n, units):
                        return False
                elif n != o:
                    return False
    return True


def _host_blas_tolerant(compare_outputs):
    """nbval's ``compare_outputs``, which also accepts a cell tagged :data:`TAG` whose output differs from
    the recording only as :func:`outputs_within` allows, and only where :func:`host_blas` could not give the
    recording host's bits; it warns when it does.  Everywhere else the comparison is nbval's own."""

    def compare(self, test, ref, skip_compare=None):
        if compare_outputs(self, test, ref, skip_compare):
            return True
        if TAG not in self.cell.metadata.get("tags", []) or host_blas() != "other":
            return False
        if not outputs_within(test, ref):
            return False
        self.comparison_traceback = []
        warnings.warn(
            f"{self.name}: this CPU's BLAS cannot give the recording host's bits, and the output differs from "
            f"the recording within {UNITS} units of the last digit of its decimal numbers (see conftest.py)",
            stacklevel=2,
        )
        return True

    compare.host_blas_tolerant = True
    return compare


def pytest_configure(config):
    try:
        import nbval.kernel
        import nbval.plugin
    except ImportError:  # nbval is in requirements.txt; without it there are no notebook tests to start
        return
    if not getattr(nbval.kernel.start_new_kernel, "starts_again", False):
        nbval.kernel.start_new_kernel = _starting_again(nbval.kernel.start_new_kernel)
    cell = nbval.plugin.IPyNbCell
    if not getattr(cell.compare_outputs, "host_blas_tolerant", False):
        cell.compare_outputs = _host_blas_tolerant(cell.compare_outputs)
