"""The grader's settings, shared by its modules: :data:`ROOT` (the repository), :data:`GRADER_VERSION`,
the default limits (``DEFAULT_*``, what :class:`kernels.grade.isolation.Limits` and the command line start
from), and the statuses, the most serious first (:data:`STATUS_ORDER`), with the flags that only ask for
the instructor's review (:data:`REVIEW`).
"""

from __future__ import annotations

from kernels import ROOT  # the checkout (labs/, solutions/, tests/): the package's one ROOT

__all__ = [
    "DEFAULT_CELL_S",
    "DEFAULT_DISK_MB",
    "DEFAULT_MEMORY_GB",
    "DEFAULT_OUTPUT_MB",
    "DEFAULT_PROCESSES",
    "DEFAULT_TIMEOUT_S",
    "GRADER_VERSION",
    "REVIEW",
    "ROOT",
    "STATUS_ORDER",
]


GRADER_VERSION = 1  # part of every result's key: bump when grading itself changes

DEFAULT_TIMEOUT_S = 600
# torch + triton + the package reserve about 3.5 GB of address space before any student code runs
# (VmPeak measured after the imports); 8 GB leaves room for the labs' largest CPU arrays.
DEFAULT_MEMORY_GB = 8.0
DEFAULT_OUTPUT_MB = 2.0
DEFAULT_DISK_MB = 256.0
DEFAULT_CELL_S = 120.0  # CPU seconds for one cell, or one call of a graded function while scoring
DEFAULT_PROCESSES = 256  # torch's thread pools count too

# Flags for the instructor's review, listed in ``flags``, that do not make the status: the notebook was
# graded as it is (a status says what happened while grading).
REVIEW = ("duplicate", "identical-answer", "package-code", "repaired", "unisolated")

STATUS_ORDER = [
    "not-a-notebook",
    "symlink",
    "not-in-roster",
    "unknown-lab",
    "timeout",
    "memory",
    "killed",
    "crashed",
    "exited-early",
    "grader-error",
    "forbidden-read",
    "forbidden-write",
    "forbidden-exec",
    "out-of-bounds",
    "output-capped",
    "syntax-error",
    "all-cells-failed",
    "missing-function",
    "cell-errors",
    "duplicate",
    "identical-answer",
    "package-code",
    "repaired",
    "unisolated",
    "ok",
]
