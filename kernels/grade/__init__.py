"""Grade a workshop's submitted lab notebooks, each in a sandbox, offline, without a GPU or Docker.

    python -m kernels.grade submissions/ --out grades/ [--jobs 4] [--roster roster.csv] [--timeout 600]

Each argument is a notebook or a folder searched for notebooks (``*.ipynb``).  For every submission:

* the **student** is the roster's name for the file (``--roster``: a CSV of ``student,file``), or else
  the first folder under the submissions folder (``submissions/alice/anything.ipynb`` -> ``alice``),
  or else, for a notebook directly in it, its file name without the lab's name
  (``alice_00_bf16_rounding.ipynb`` -> ``alice``);
* the **lab** is read from the notebook's otter metadata (``assignment_name``), or else from its file
  or folder name; the CSV says which;
* symbolic links are refused unread; a notebook that breaks nbformat's schema in a way Jupyter
  tolerates is graded as it is (flagged ``repaired``); two notebooks of one student for one lab, answer
  cells identical across students and graded names that are the package's own functions are flagged
  for review (``duplicate``, ``identical-answer``, ``package-code``) without changing the status;
* the notebook runs in a **sandbox** (below), cell by cell, each cell under a CPU-time limit;
* then a **judge**, a second process that never runs student code, runs the lab's otter tests (the
  public ones the lab carries, and the hidden ones of ``solutions/hidden_tests/NN_name/`` and of any
  hidden test cells of ``solutions/NN_name.ipynb``; they never enter the sandbox) against proxies of
  the graded names: each call's inputs go to the sandbox, which runs the
  student's function on them and returns plain data (:mod:`kernels.grade.rpc`).  The tests call the
  ``kernels.checks`` functions that the students' own check cells call, so the diagnoses are the same.

Written to ``--out``: ``scores.csv`` (student, lab, points per question, total, status; cells that a
spreadsheet would read as a formula are neutralised) and ``feedback/<lab>/<student>.md`` (per question:
passed, or failed with the check's diagnosis; hidden tests named, never shown; one file per student,
whatever the script of the name).  Every result is also kept as ``results/<key>.json``, keyed by the
submission's content hash, its student and lab, and the tests; all files are written atomically, so an
interrupted run loses nothing and a re-run grades only what is new or changed (``--force`` regrades).

Statuses (one per submission, the most serious; ``flags`` lists all, review flags included):

==================  ========================================================================
``not-a-notebook``  the file is not a notebook (not JSON, or no cells); scores 0
``symlink``         the file, or a folder on the way to it, is a symbolic link: refused unread
``not-in-roster``   a roster was given and does not list the notebook; not graded
``unknown-lab``     neither metadata nor file name says which lab; not graded
``timeout``         a cell (or a call while scoring) ran past ``--cell-timeout`` CPU seconds and was
                    stopped, the rest going on; or the whole run past the time limit, questions
                    scored before that keeping their points
``memory``          the address-space limit was hit (MemoryError)
``killed``          the process was killed (SIGKILL) but not by the grader: by the system, or by
                    the notebook itself (Colab's restart cell)
``crashed``         the process died of another signal
``exited-early``    the notebook ended its own process (``os._exit``): what came after is unscored
``grader-error``    the judge failed: the grader's fault, not the student's
``forbidden-read``  a cell tried to read the solutions, the tests, other submissions or the
                    grader's outputs: refused, and flagged for the instructor
``forbidden-write`` a cell tried to write, delete or rename outside its folder: refused, flagged
``forbidden-exec``  a cell tried to start a program or open a network connection: refused
``out-of-bounds``   a Triton kernel loaded or stored outside every tensor passed to it
``output-capped``   the notebook printed more than the output cap; the rest was dropped
``syntax-error``    a cell does not compile
``all-cells-failed`` every code cell raised an exception
``missing-function`` a question's function is not defined at all
``cell-errors``     some cells raised exceptions
``ok``              every cell ran (the score may still be partial)
==================  ========================================================================

Isolation.  Where unprivileged user namespaces work (``unshare -rmnpf``, tried at start-up; some
distributions restrict them, and the start-up line says which case holds), each notebook runs in its
own user, mount, network and PID namespaces, under an init (``kernels/grade/sandbox_init.py``) whose death
ends every process in them: no network at all; only its own processes visible, and its signals reach
nothing outside; the whole file system read-only except one size-capped tmpfs holding only its own
folder; the solutions, the test suite (its data files excepted), ``.git``, the submission folders, the
output folder and the other sandboxes covered by empty mounts, all of them locked by a nested
namespace so that the notebook cannot undo them: the guarantee is the kernel's.  Its processes and
threads, address space, CPU time and file sizes are capped.  In every case an audit hook (PEP 578) in
the sandbox also refuses and reports opening those paths, writing anywhere but its folder, starting
processes and opening sockets.  Without namespaces that hook is the only barrier, and audit hooks are
not a security boundary against code written to evade them (ctypes, for one): every row is then
flagged ``unisolated``.  Either way, a notebook cannot change its own score by tampering with its own
process, because the score is decided in the judge; it can only change what its functions answer.

Out-of-bounds accesses: Triton's CPU interpreter performs an unmasked ``tl.load`` past the end of a
tensor as a raw read of whatever memory follows (garbage, silently) and an unmasked ``tl.store`` as a
raw write (heap corruption, often a crash much later).  In the grading process every load and store
is first checked against the memory of the kernel's tensor arguments and refused with a clear error
(:mod:`kernels._bounds`, the check the labs' own check cells install too).

The modules, in the order a submission meets them: :mod:`~kernels.grade.labs` (the labs and their
tests), :mod:`~kernels.grade.submissions` (which lab, which student), :mod:`~kernels.grade.isolation`
(one submission's sandbox and judge, seen from the grader, and the summary of what they reported),
:mod:`~kernels.grade.child` (what runs in the sandbox), :mod:`~kernels.grade.judge` (what scores it),
:mod:`~kernels.grade.rpc` (the plain-data calls between the two), :mod:`~kernels.grade.results` (results
and feedback on disk), :mod:`~kernels.grade.command` (:func:`grade` and the command line), with
:mod:`~kernels.grade.config` (the defaults and statuses) and ``sandbox_init.py`` (the sandbox's init,
run as a script).  This package re-exports what an instructor's code uses.
"""

from kernels.grade.command import grade, main
from kernels.grade.config import (
    DEFAULT_CELL_S,
    DEFAULT_DISK_MB,
    DEFAULT_MEMORY_GB,
    DEFAULT_OUTPUT_MB,
    DEFAULT_TIMEOUT_S,
    GRADER_VERSION,
    STATUS_ORDER,
)
from kernels.grade.isolation import Limits, namespaces_available
from kernels.grade.labs import HIDDEN_TESTS, Lab, hidden_tests, lab_tests, load_labs, with_hidden
from kernels.grade.submissions import Submission, identify, read_roster

__all__ = [
    "DEFAULT_CELL_S",
    "DEFAULT_DISK_MB",
    "DEFAULT_MEMORY_GB",
    "DEFAULT_OUTPUT_MB",
    "DEFAULT_TIMEOUT_S",
    "GRADER_VERSION",
    "HIDDEN_TESTS",
    "STATUS_ORDER",
    "Lab",
    "Limits",
    "Submission",
    "grade",
    "hidden_tests",
    "identify",
    "lab_tests",
    "load_labs",
    "main",
    "namespaces_available",
    "read_roster",
    "with_hidden",
]
