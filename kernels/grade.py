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
  student's function on them and returns plain data (:mod:`kernels.grade_rpc`).  The tests call the
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
own user, mount, network and PID namespaces, under an init (``kernels/_sandbox_init.py``) whose death
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
is first checked against the memory of the kernel's tensor arguments and refused with a clear error.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from kernels._bounds import OutOfBounds, install_bounds_check

ROOT = Path(__file__).resolve().parent.parent
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

# ------------------------------------------------------------------------------------------------
# The labs and their tests


@dataclasses.dataclass
class Lab:
    name: str  # "00_bf16_rounding"
    tests: dict  # question -> otter exception-test source
    source: str  # where the tests came from, for the report
    secret: tuple = ()  # folders no submission may read (where the hidden tests came from)

    @property
    def questions(self) -> list:
        return sorted(self.tests, key=_natural)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.tests, sort_keys=True).encode()).hexdigest()

    def summary(self) -> list:
        """[(question, points, public test cases, hidden test cases, the names the tests take)]."""
        from otter.test_files.exception_test import ExceptionTestFile

        rows = []
        for q in self.questions:
            tf = ExceptionTestFile.from_string(self.tests[q], path=q)
            names = sorted({a for c in tf.test_cases for a in c.body._get_func_params()} - {"env"})
            hidden = sum(c.hidden for c in tf.test_cases)
            rows.append((q, float(tf.possible), len(tf.test_cases) - hidden, hidden, names))
        return rows

    def describe(self) -> str:
        """A few lines for an instructor: each question, its points, its tests and what it grades."""
        rows = self.summary()
        lines = [f"{self.name}: {len(rows)} questions, {sum(r[1] for r in rows):g} points (tests: {self.source})"]
        for q, points, public, hidden, names in rows:
            tests = f"{public} public" + (f" + {hidden} hidden" if hidden else "")
            unit = "point" if points == 1 else "points"
            lines.append(f"  {q}: {points:g} {unit}, {tests} test case(s), grades {', '.join(names) or '-'}")
        return "\n".join(lines)

    def graded_names(self) -> list:
        """The names the lab's tests take (what a notebook must define)."""
        return sorted({n for row in self.summary() for n in row[4]})

    def aliases(self) -> list:
        """Names a file may carry to say it is this lab: the full name, and ``labNN``."""
        number = self.name.split("_", 1)[0]
        return [self.name, f"lab{number}", f"lab_{number}", f"lab-{number}"]


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _may_hide_tests(master: Path) -> bool:
    """True unless no test cell of an otter master notebook can be hidden (otter marks a hidden test
    with the word "hidden" in its first line or its config)."""
    import nbformat

    nb = nbformat.read(master, as_version=4)
    in_tests = False
    for cell in nb.cells:
        text = cell.source.strip()
        if re.match(r"#\s*BEGIN TESTS", text, flags=re.I) or re.match(r'"""\s*#\s*BEGIN TESTS', text, flags=re.I):
            in_tests = True
        elif re.match(r'(#|"""\s*#)\s*END TESTS', text, flags=re.I):
            in_tests = False
        elif in_tests and cell.cell_type == "code" and re.search(r"\bhidden\b", text, flags=re.I):
            return True
    return False


def lab_tests(lab: Path) -> dict:
    """{question name: otter test source} stored in a generated lab's metadata (public tests only)."""
    import nbformat

    nb = nbformat.read(lab, as_version=4)
    try:
        return dict(nb.metadata["otter"]["tests"])
    except KeyError:
        raise ValueError(f"lab {lab} holds no otter tests in its metadata; pass a notebook from labs/") from None


HIDDEN_TESTS = "hidden_tests"  # solutions/hidden_tests/<lab>/<question>.py: otter test files, hidden cases only


def hidden_tests(solutions_dir: Path, lab: str, public: dict) -> dict:
    """{question: otter test source} of the hidden test files of ``lab`` kept beside the solutions.

    ``solutions_dir/hidden_tests/<lab>/<question>.py`` is an otter exception-based test file (as in
    otter's own ``tests/`` folders) for one question of the lab: ``name = "<question>"`` and one or more
    ``@test_case(name=..., hidden=True)`` functions that take only names the question's public test
    takes.  It sets no ``points`` of its own: the question's total stays the one its public test states,
    and otter shares it among all its cases.  The files live with the solutions, which no submission may
    read, and only the judge ever runs them.
    """
    from otter.test_files.exception_test import ExceptionTestFile

    folder = Path(solutions_dir) / HIDDEN_TESTS / lab
    found = {}
    for path in sorted(folder.glob("*.py"), key=lambda p: _natural(p.stem)):
        where = f"{HIDDEN_TESTS}/{lab}/{path.name}"
        question = path.stem
        if question not in public:
            raise ValueError(f"{where}: {lab} has no question {question!r} (its questions: {sorted(public)})")
        source = path.read_text(encoding="utf-8")
        env: dict = {}
        exec(compile(source, str(path), "exec"), env)  # the instructor's own file, never a submission's
        if env.get("name") != question:
            raise ValueError(f"{where} must set name = {question!r}, got {env.get('name')!r}")
        if "points" in env:
            raise ValueError(f"{where} must not set points: the question's points come from its public test")
        cases = ExceptionTestFile.from_string(source, path=where).test_cases
        public_cases = ExceptionTestFile.from_string(public[question], path=question).test_cases
        takes = {a for c in public_cases for a in c.body._get_func_params()}
        if not cases:
            raise ValueError(f"{where} defines no @test_case")
        for case in cases:
            if not case.hidden:
                raise ValueError(f"{where}: test {case.name!r} is not hidden=True (public tests live in the lab)")
            if re.fullmatch(rf"{re.escape(question)} - \d+", case.name):
                raise ValueError(f"{where}: give each hidden test a name (feedback names it), as test_case(name=...)")
            extra = set(case.body._get_func_params()) - takes - {"env"}
            if extra:
                raise ValueError(
                    f"{where}: test {case.name!r} takes {sorted(extra)}, which {question}'s public test does not"
                )
        found[question] = source
    return found


def with_hidden(public: dict, hidden: dict) -> dict:
    """One otter test source per question: its public cases, then its hidden ones."""
    return {q: src if q not in hidden else f"{src.rstrip()}\n\n\n# hidden\n{hidden[q]}" for q, src in public.items()}


def load_labs(labs_dir: Path = ROOT / "labs", solutions_dir: Path = ROOT / "solutions") -> dict:
    """{lab name: Lab} for every lab in ``labs_dir``, with the hidden tests from ``solutions_dir``.

    The student lab carries only the public tests.  The hidden ones are the test files of
    ``solutions_dir/hidden_tests/<lab>/`` (:func:`hidden_tests`), and any hidden test cells of the
    solution itself, which only the autograder notebook that ``otter assign`` makes from it carries
    (``otter assign`` takes seconds per lab, so it runs only for a solution that may hold one).
    """
    from kernels import labgen

    labs = {}
    for path in sorted(Path(labs_dir).glob("*.ipynb")):
        master = Path(solutions_dir) / path.name
        if master.is_file() and _may_hide_tests(master):
            with tempfile.TemporaryDirectory(prefix="kernels-grade-assign-") as tmp:
                _, autograder = labgen.assign(master, Path(tmp))
                tests, source = lab_tests(autograder), f"solutions/{path.name}"
        else:
            tests, source = lab_tests(path), f"labs/{path.name}"
        hidden = hidden_tests(solutions_dir, path.stem, tests)
        if hidden:
            source += f" + {HIDDEN_TESTS}/{path.stem}/"
        secret = (str(solutions_dir),) if Path(solutions_dir).is_dir() else ()
        labs[path.stem] = Lab(path.stem, with_hidden(tests, hidden), source, secret)
    if not labs:
        raise ValueError(f"labs_dir: no lab notebooks in {labs_dir}")
    return labs


# ------------------------------------------------------------------------------------------------
# Submissions: which lab, which student


@dataclasses.dataclass
class Submission:
    path: Path
    student: str
    lab: str | None
    lab_from: str  # "metadata", "file name", "--lab" or ""
    sha256: str
    notebook_error: str = ""  # why the file is not a notebook (or why it was refused)
    intake: list = dataclasses.field(default_factory=list)  # [(flag, note)] found before grading
    answers: dict = dataclasses.field(default_factory=dict)  # {hash of an answer cell: its first line}


def find_notebooks(paths) -> list:
    """[(notebook, the folder it was found under or None)] for every ``*.ipynb`` named or under a named
    folder (checkpoints skipped), in a stable order.  Symbolic links are listed too (and refused when
    graded), never followed: a link could point at a classmate's work or at the solutions."""
    found = []
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            for folder, dirs, files in os.walk(p, followlinks=False):
                dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
                for name in sorted(files) + sorted(d for d in dirs if Path(folder, d).is_symlink()):
                    if name.endswith(".ipynb"):
                        found.append((Path(folder) / name, p))
        elif p.is_file() or p.is_symlink():
            found.append((p, None))
        else:
            raise FileNotFoundError(f"submissions: no such file or folder: {p}")
    return found


def _symlink_in(path: Path, base: Path | None) -> Path | None:
    """The first symbolic link on the way from ``base`` (or the file's own folder) down to ``path``."""
    parts = [path]
    if base is not None:
        rel = path.relative_to(base)
        parts = [base / Path(*rel.parts[: i + 1]) for i in range(len(rel.parts))]
    return next((p for p in parts if p.is_symlink()), None)


def read_roster(path: Path) -> dict:
    """``--roster``: a CSV with columns ``student`` and ``file`` (a notebook, or a folder of them, relative
    to the roster's folder or absolute) -> {resolved path: student}."""
    rows = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"student", "file"} <= set(reader.fieldnames):
            raise ValueError(f"roster: {path} needs the columns student and file, has {reader.fieldnames}")
        for i, row in enumerate(reader, start=2):
            student, file = (row.get("student") or "").strip(), (row.get("file") or "").strip()
            if not student or not file:
                raise ValueError(f"roster: {path} line {i}: both student and file are needed")
            rows[(path.parent / file).resolve()] = student
    return rows


def identify(
    path: Path, labs: dict, forced_lab: str | None = None, base: Path | None = None, roster=None
) -> Submission:
    """Which lab and which student a notebook is.  The student is, in this order: the ``roster``'s name
    for the file or a folder above it; the first folder under ``base`` (one folder per student:
    ``submissions/alice/anything.ipynb`` is alice's, whatever the file is called); the file name without
    the lab's name (``alice_00_bf16_rounding.ipynb``, for files side by side)."""
    link = _symlink_in(path, base)
    if link is not None:
        student = _student_from(path, base, labs, None, roster)
        target = os.readlink(link)
        sub = Submission(path, student, None, "", "", f"a symbolic link ({link.name} -> {target}): not followed")
        sub.intake.append(("symlink", sub.notebook_error))
        return sub
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    error, meta_lab, intake, nb = "", None, [], None
    try:
        import nbformat

        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("it has no list of cells")
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as e:  # Jupyter opens it anyway (with a warning): so does the grader
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            intake.append(
                ("repaired", f"the notebook does not follow the nbformat schema ({first[:200]}); graded as is")
            )
        if not any(isinstance(c, dict) and c.get("cell_type") == "code" for c in nb.cells):
            error = "the notebook has no code cells"
        meta = nb.get("metadata", {}).get("otter", {})
        meta_lab = meta.get("assignment_name") if isinstance(meta, dict) else None
        meta_lab = meta_lab if isinstance(meta_lab, str) else None
    except Exception as e:  # noqa: BLE001 - anything unreadable is "not a notebook", with the reason
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        error = f"not a notebook: {type(e).__name__}: {first}"[:300]
    lab, lab_from = None, ""
    if forced_lab:
        lab, lab_from = forced_lab, "--lab"
    elif meta_lab in labs:
        lab, lab_from = meta_lab, "metadata"
    else:
        names = [path.stem, *(part for part in reversed(path.parent.parts))]
        for name in names:
            hits = [lab for lab in labs.values() for alias in lab.aliases() if alias.lower() in name.lower()]
            if hits:
                lab, lab_from = hits[0].name, "file name"
                break
    sub = Submission(path, _student_from(path, base, labs, lab, roster), lab, lab_from, sha, error, intake)
    if nb is not None and not error and lab in labs:
        sub.answers = _answer_cells(nb, labs[lab].graded_names())
    return sub


def _student_from(path: Path, base, labs, lab, roster) -> str:
    if roster:
        resolved = path.absolute()
        for candidate in [resolved, *resolved.parents]:
            if candidate in roster:
                return roster[candidate]
        return ""
    if base is not None and len(path.relative_to(base).parts) > 1:
        return path.relative_to(base).parts[0]
    student = path.stem
    if lab:
        for alias in sorted(labs[lab].aliases(), key=len, reverse=True) if lab in labs else [lab]:
            student = re.sub(re.escape(alias), "", student, flags=re.IGNORECASE)
        student = student.strip("_-. ")
    return student or path.parent.name or path.stem


def _answer_cells(nb, names=None) -> dict:
    """{sha256 of a code cell's normalised source: its first line} for the cells worth comparing across
    students: those that define one of the graded ``names`` (all code cells if None), a few lines at
    least."""
    defines = re.compile(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", flags=re.M)
    out = {}
    for cell in nb.cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        lines = [line.rstrip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
        if len(lines) < 3:
            continue
        if names is not None and not {a or b for a, b in defines.findall(source)} & set(names):
            continue
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        out[digest] = lines[0][:80]
    return out


def _lab_cells() -> set:
    """Digests of the labs' own code cells (what every student is given)."""
    import nbformat

    digests = set()
    for path in (ROOT / "labs").glob("*.ipynb"):
        digests |= set(_answer_cells(nbformat.read(path, as_version=4)))
    return digests


def review_intake(submissions: list):
    """Flags that need every submission at once: two notebooks for one student and lab, and answer cells
    that are character for character the same in different students' notebooks (comments and blank
    lines aside), which the instructor should look at."""
    by_key = {}
    for sub in submissions:
        if sub.lab and sub.student:
            by_key.setdefault((sub.student, sub.lab), []).append(sub)
    for (student, lab), subs in by_key.items():
        if len(subs) > 1:
            for sub in subs:
                others = ", ".join(str(o.path) for o in subs if o is not sub)
                sub.intake.append(("duplicate", f"{student} has another notebook for {lab}: {others}"))
    given = _lab_cells()
    owners = {}
    for sub in submissions:
        for digest in set(sub.answers) - given:
            owners.setdefault((sub.lab, digest), []).append(sub)
    for (_, digest), subs in owners.items():
        students = sorted({s.student for s in subs})
        if len(students) < 2:
            continue
        for sub in subs:
            same = ", ".join(s for s in students if s != sub.student)
            sub.intake.append(
                ("identical-answer", f"a cell starting {sub.answers[digest]!r} is identical in {same}'s notebook")
            )
    for sub in submissions:
        if not sub.student:
            sub.intake.append(("not-in-roster", f"{sub.path} is not in the roster: not graded"))


# ------------------------------------------------------------------------------------------------
# Isolation of one submission


UNSHARE = ("-rmnpf", "--mount-proc")  # user, mount, network and PID namespaces, with the namespace's own /proc


def namespaces_available() -> bool:
    """True if unprivileged user, mount, network and PID namespaces work here (``unshare -rmnpf``)."""
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        done = subprocess.run([exe, *UNSHARE, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@dataclasses.dataclass
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_gb: float = DEFAULT_MEMORY_GB
    output_mb: float = DEFAULT_OUTPUT_MB
    namespaces: bool = True
    cpu_s: float | None = None  # CPU seconds (RLIMIT_CPU); None: the same as timeout_s
    disk_mb: float = DEFAULT_DISK_MB  # the sandbox's one writable folder (a tmpfs of this size)
    processes: int = DEFAULT_PROCESSES  # processes and threads inside the sandbox (RLIMIT_NPROC)
    cell_s: float = DEFAULT_CELL_S  # CPU seconds per cell and per call while scoring

    @property
    def cpu_limit(self) -> int:
        return int(self.cpu_s if self.cpu_s is not None else self.timeout_s)


def _child_env(workdir: Path) -> dict:
    # PYTHONPATH: where the grading installation keeps its packages (the grader's own, not a secret).
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        # Always Triton's CPU interpreter (corrected to Hopper's bits): the checks are device-independent,
        # so a grade does not depend on the grading machine, and every load and store is bounds-checked.
        KERNELS_INTERPRET="1",
        # and no GPU at all: on a GPU machine the child would otherwise start CUDA under the address-space
        # limit (which fails) whenever a cell asks torch about the device.
        CUDA_VISIBLE_DEVICES="",
        HOME=str(workdir),
        TMPDIR=str(workdir / "tmp"),
        MPLCONFIGDIR=str(workdir / "tmp"),
        TRITON_CACHE_DIR=str(workdir / "tmp" / "triton"),
        MPLBACKEND="Agg",
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",  # workers run side by side; one thread each keeps them from fighting
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


_RUNNING = set()  # child processes in flight, killed if grading is interrupted
_RUNNING_LOCK = threading.Lock()


def _kill_running():
    with _RUNNING_LOCK:
        for proc in list(_RUNNING):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _warm_caches(scratch: Path) -> Path:
    """Caches every sandbox starts with, built once per run outside them: matplotlib's font list
    (building it runs ``fc-list``, a program, which a sandbox may not start)."""
    cache = scratch / "cache"
    cache.mkdir()
    if importlib.util.find_spec("matplotlib") is not None:
        env = _child_env(cache)
        env["MPLCONFIGDIR"] = str(cache)
        subprocess.run(
            [sys.executable, "-c", "import matplotlib.font_manager"],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
    return cache


def run_isolated(sub: Submission, lab: Lab, limits: Limits, hidden_paths: list, scratch: Path, judges=None) -> dict:
    """Grade one submission: its notebook runs in a sandbox, its questions are judged by a second process
    that never runs student code (see :mod:`kernels.grade_rpc`); returns their events summarised."""
    workdir = Path(tempfile.mkdtemp(prefix="sub-", dir=scratch))
    if (scratch / "cache").is_dir():
        shutil.copytree(scratch / "cache", workdir / "tmp", ignore=shutil.ignore_patterns("tmp"))
    else:
        (workdir / "tmp").mkdir()
    shutil.copyfile(sub.path, workdir / f"{lab.name}.ipynb")
    judge_dir = workdir.with_name(workdir.name + "-judge")
    judge_dir.mkdir()
    names = lab.graded_names()
    own_server = judges is None
    judges = judges or _JudgeServer(judge_dir / "server")
    requests_r, requests_w = os.pipe()  # judge -> sandbox
    answers_r, answers_w = os.pipe()  # sandbox -> judge
    events_r, events_w = os.pipe()  # sandbox -> grader: what each cell did (told, not trusted)
    verdicts_r, verdicts_w = os.pipe()  # judge -> grader: the scores
    spec = {
        "notebook": f"{lab.name}.ipynb",
        "workdir": str(workdir),
        "scratch": str(scratch),
        "hidden": [str(p) for p in hidden_paths],
        "root": str(ROOT),
        "output_bytes": int(limits.output_mb * 2**20),
        "namespaces": limits.namespaces,
        "disk_bytes": int(limits.disk_mb * 2**20),
        "processes": limits.processes,
        "cell_seconds": min(limits.cell_s, limits.timeout_s),
        "names": names,
        "events_fd": events_w,
        "requests_fd": requests_r,
        "answers_fd": answers_w,
    }
    cmd = [sys.executable, "-m", "kernels.grade", "--child", json.dumps(spec)]
    if limits.namespaces:  # the namespace's init starts the sandbox and passes on how it ended
        cmd = [shutil.which("unshare"), *UNSHARE, sys.executable, str(ROOT / "kernels" / "_sandbox_init.py"), cmd[-1]]
    memory = int(limits.memory_gb * 2**30)
    file_cap = int(limits.output_mb * 2**20) * 4 + 64 * 2**20  # the child's own files: logs, caches

    def limit_child():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        # CPU time stops a busy loop however loaded the machine is; the wall clock catches the rest
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_limit, limits.cpu_limit + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_cap, file_cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    log = open(workdir / "tmp" / "child.log", "wb")
    judge_log = open(judge_dir / "judge.log", "wb")
    started = time.monotonic()
    procs, judge, judge_failure = [], None, ""
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_child_env(workdir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(events_w, requests_r, answers_w),
            preexec_fn=limit_child,
            start_new_session=True,
        )
        procs.append(proc)
        # the tests exist only in the judge, never in the sandbox
        try:
            judge = judges.start(lab.tests, (verdicts_w, answers_r, requests_w, judge_log.fileno()))
        except (OSError, RuntimeError, ValueError) as e:  # the grader's own failure: this row says so
            judge_failure = f"{type(e).__name__}: {e}"[:500]
    finally:
        for fd in (events_w, requests_r, answers_w, verdicts_w, answers_r, requests_w):
            os.close(fd)
        log.close()
        judge_log.close()
        if judge is None:
            _stop(procs)
            os.close(events_r)
            os.close(verdicts_r)
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(judge_dir, ignore_errors=True)
    if judge is None:
        verdicts = [{"event": "judge-error", "error": judge_failure}]
        result = summarise(sub, lab, [], 0, False, time.monotonic() - started, limits, "", verdicts)
        return result | {"cpu_seconds": 0.0}
    with _RUNNING_LOCK:
        _RUNNING.update(procs)
    events, verdicts, timed_out = [], [], False
    streams = {events_r: (events, b""), verdicts_r: (verdicts, b"")}
    deadline = started + limits.timeout_s
    try:
        while verdicts_r in streams:  # until the judge is done; the sandbox may still be serving
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(list(streams), [], [], min(left, 1.0))
            for fd in ready:
                into, buffer = streams[fd]
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    os.close(fd)
                    del streams[fd]
                    continue
                *lines, buffer = (buffer + chunk).split(b"\n")
                streams[fd] = (into, buffer[-(1 << 20) :])  # a line longer than 1 MB is not an event
                for line in lines:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        into.append(event)
        # The judge closed its end, so a sandbox that is still serving sees the end of its requests and
        # exits by itself; give it a moment before the kill, so that its own exit status is what counts.
        end = min(deadline, time.monotonic() + 5) if not timed_out else 0
        while _running(proc) and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        if verdicts_r in streams:  # the judge has not finished (a timeout, an interruption): stop it
            with _suppress():
                os.kill(judge, signal.SIGKILL)
        for fd in list(streams):
            os.close(fd)
        exited = not _running(proc)
        statuses = _stop(procs)
        with _RUNNING_LOCK:
            _RUNNING.difference_update(procs)
    elapsed = time.monotonic() - started
    returncode, cpu_s = statuses[0]
    if limits.namespaces and returncode > 128:  # the sandbox's init reports a death by signal N as 128 + N
        returncode = 128 - returncode
    if not exited and not timed_out:
        returncode = 0  # still serving when the judge had finished: stopped by the grader, not dead
    if own_server:
        judges.close()
    log_tail = (workdir / "tmp" / "child.log").read_bytes()[-4000:].decode("utf-8", "replace")
    judge_tail = (judge_dir / "judge.log").read_bytes()[-4000:].decode("utf-8", "replace")
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(judge_dir, ignore_errors=True)
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and cpu_s >= limits.cpu_limit - 1:
        timed_out = "cpu"
    result = summarise(sub, lab, events, returncode, timed_out, elapsed, limits, log_tail, verdicts, judge_tail)
    result["cpu_seconds"] = round(cpu_s, 1)
    if not limits.namespaces:
        result["flags"].append("unisolated")
        result["notes"].append("graded without a sandbox (no user namespaces): only the audit hook isolated it")
    return result


def _running(proc) -> bool:
    """Whether ``proc`` has not exited yet, without reaping it (its exit status and CPU time stay for
    :func:`_stop`)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _stop(procs) -> list:
    """Kill each process's whole group (a sandbox's PID namespace dies with it); [(exit code, CPU s)]."""
    out = []
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # wait4, not wait: the child's own CPU time (user + system) comes with its exit status
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.append((proc.returncode, usage.ru_utime + usage.ru_stime))
        except ChildProcessError:
            proc.wait()
            out.append((proc.returncode, float("nan")))
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with _suppress():
                    stream.close()
    return out


def _judge_env(judge_dir: Path) -> dict:
    (judge_dir / "tmp").mkdir(exist_ok=True)
    return _child_env(judge_dir)  # CPU mode, no GPU: the references run as the sandbox's code does


FORBIDDEN = ("forbidden-read", "forbidden-write", "forbidden-exec")


def _told(events: list) -> list:
    """The sandbox's events, kept only in the shapes the grader reads (the sandbox ran student code, so
    what it says is told, never trusted for a score: it can only describe the notebook's own cells)."""
    kinds = {
        "cell": {"index": int, "error": str, "syntax": bool, "memory": bool, "slow": bool},
        "started": {"index": int},
        "executed": {},
        "violation": {"status": str, "detail": str},
        "oob": {"message": str},
        "output-capped": {},
        "setup-error": {"error": str},
    }
    kept = []
    for e in events:
        fields = kinds.get(e.get("event"))
        if fields is None:
            continue
        clean = {"event": e["event"]}
        for name, kind in fields.items():
            if isinstance(e.get(name), kind) and not (kind is int and isinstance(e.get(name), bool)):
                clean[name] = e[name][:2000] if kind is str else e[name]
        if e["event"] == "violation" and clean.get("status") not in FORBIDDEN:
            continue
        if e["event"] in ("cell", "started") and "index" not in clean:
            continue
        kept.append(clean)
    return kept


def summarise(sub, lab, events, returncode, timed_out, elapsed, limits, log_tail="", verdicts=(), judge_log="") -> dict:
    """Turn the sandbox's events and the judge's verdicts into a result: points per question, feedback,
    status and flags."""
    flags, notes = [], []
    events = _told(events)
    cells = [e for e in events if e["event"] == "cell"]
    violations = [e for e in events if e["event"] == "violation"]
    setup = next((e for e in events if e["event"] == "setup-error"), None)
    cases = [e for e in verdicts if e.get("event") == "case"]
    served = any(e.get("event") == "served" for e in verdicts)
    gone = next((e for e in verdicts if e.get("event") == "sandbox-gone"), None)
    judged = any(e.get("event") == "done" for e in verdicts)
    judge_error = next((e for e in verdicts if e.get("event") == "judge-error"), None)

    def flag(status, note):
        if status not in flags:
            flags.append(status)
        if note not in notes:
            notes.append(note)

    running_cell = next((e for e in reversed(events) if e["event"] == "started"), None)
    in_cell = f"in cell {running_cell['index'] + 1}" if running_cell else "before its first cell"
    scoring = next((e.get("question") for e in reversed(verdicts) if e.get("event") == "started"), None)
    where = f"while scoring {scoring}" if served and scoring else "while scoring" if served else in_cell
    if timed_out:
        spent = f"{limits.cpu_limit} s of CPU time" if timed_out == "cpu" else f"{limits.timeout_s:g} s"
        flag("timeout", f"stopped after {spent} {where} (an infinite loop?)")
    slow = [e for e in cells if e.get("slow")]
    if slow:
        cut = ", ".join(str(e["index"] + 1) for e in slow)
        flag(
            "timeout",
            f"cell {cut} ran longer than {limits.cell_s:g} s of CPU time and was stopped there; the other cells "
            f"ran (a cell that runs this long belongs outside the graded notebook)",
        )
    if any(e.get("memory") for e in cells) or any(c.get("memory") for c in cases):
        flag("memory", f"ran out of memory (limit {limits.memory_gb:g} GB of address space)")
    if not timed_out and returncode not in (0, None):
        if returncode < 0:
            signum = -returncode
            name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
            if signum == signal.SIGKILL and "memory" not in flags:
                flag(
                    "killed",
                    f"the notebook's process was killed (SIGKILL) {where}, not by the grader: by the system "
                    f"(out of memory?) or by the notebook itself",
                )
            elif signum != signal.SIGKILL:
                flag("crashed", f"the process died of {name} {where}")
        elif not served or gone:
            flag("exited-early", f"the notebook's process exited (status {returncode}) {where}")
    if gone and not timed_out and not flags:
        flag(
            "exited-early",
            f"the notebook's process ended {where} (os._exit, or sys.exit outside a cell?): "
            + ("nothing could be scored" if not served else "the questions after it were not scored"),
        )
    if judge_error or (not judged and not timed_out and not gone):
        detail = judge_error.get("error") if judge_error else judge_log.strip().splitlines()[-1:] or ["no result"]
        flag("grader-error", f"the judge failed (the grader's fault, not the student's): {str(detail)[:500]}")
    for v in violations:
        flag(v["status"], v["detail"])
    for e in verdicts:
        if e.get("event") == "package-code":
            flag(
                "package-code",
                f"{e.get('name')} is the package's own {e.get('what')}, not code written in the notebook "
                f"(scored as it is; the instructor decides)",
            )
    oob = [e for e in events if e["event"] == "oob"]
    if oob:
        flag("out-of-bounds", oob[0].get("message", "a kernel read or wrote outside its tensors"))
    if any(e["event"] == "output-capped" for e in events):
        flag("output-capped", f"printed more than {limits.output_mb:g} MB; the rest of the output was dropped")
    syntax = [e for e in cells if e.get("syntax")]
    if syntax:
        flag("syntax-error", f"cell {syntax[0]['index'] + 1}: {syntax[0].get('error', '')}")
    if cells and served and all(e.get("error") for e in cells):
        flag("all-cells-failed", f"all {len(cells)} code cells raised an exception")
    missing = [c for c in cases if c.get("missing")]
    if missing:
        flag("missing-function", "not defined: " + ", ".join(sorted({str(c["missing"]) for c in missing})))
    errors = [e for e in cells if e.get("error") and not e.get("syntax") and not e.get("slow")]
    if errors and "all-cells-failed" not in flags:
        flag(
            "cell-errors",
            f"{len(errors)} of {len(cells)} code cells raised; first, cell {errors[0]['index'] + 1}: "
            f"{errors[0]['error']}",
        )
    if setup:
        flag("crashed", f"the grading process could not start: {setup.get('error', '')}")
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    flags.sort(key=order.get)
    status = flags[0] if flags else "ok"

    questions = {}
    for q in lab.questions:
        qcases = [c for c in cases if c["question"] == q]
        possible = _question_points(lab.tests[q])  # from the tests alone, whatever happened
        if not qcases:
            serious = flags and flags[0] in ("timeout", "memory", "killed", "crashed", "exited-early", "grader-error")
            why = "not scored: " + (notes[0] if serious else "no result")
            questions[q] = {"points": 0.0, "possible": possible, "cases": [], "note": why}
            continue
        questions[q] = {
            "points": min(qcases[0]["score"], possible),
            "possible": possible,
            "cases": [{k: c[k] for k in ("name", "hidden", "passed", "message")} for c in qcases],
            "note": "",
        }
    total = sum(v["points"] for v in questions.values())
    possible = sum(v["possible"] for v in questions.values())
    return {
        "student": sub.student,
        "lab": lab.name,
        "lab_from": sub.lab_from,
        "submission": str(sub.path),
        "sha256": sub.sha256,
        "status": status,
        "flags": flags,
        "notes": notes,
        "questions": questions,
        "total": total,
        "possible": possible,
        "seconds": round(elapsed, 1),
        "log_tail": (log_tail if status in ("crashed", "killed") else judge_log if status == "grader-error" else ""),
    }


def _question_points(source: str) -> float:
    from otter.test_files.exception_test import ExceptionTestFile

    try:
        return float(ExceptionTestFile.from_string(source, path="q").possible)
    except Exception:  # noqa: BLE001
        return 0.0


def not_graded(sub: Submission, lab: Lab | None, status: str, note: str) -> dict:
    questions = {}
    if lab:
        for q in lab.questions:
            questions[q] = {"points": 0.0, "possible": _question_points(lab.tests[q]), "cases": [], "note": note}
    return {
        "student": sub.student,
        "lab": lab.name if lab else (sub.lab or ""),
        "lab_from": sub.lab_from,
        "submission": str(sub.path),
        "sha256": sub.sha256,
        "status": status,
        "flags": [status],
        "notes": [note],
        "questions": questions,
        "total": 0.0,
        "possible": sum(v["possible"] for v in questions.values()),
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "log_tail": "",
    }


# ------------------------------------------------------------------------------------------------
# The child: runs in the sandbox


class _Capped(io.TextIOBase):
    """A stdout that keeps at most ``limit`` characters (to a file in the sandbox) and drops the rest."""

    def __init__(self, stream, limit, on_cap):
        self.stream, self.limit, self.used, self.on_cap, self.capped = stream, limit, 0, on_cap, False

    def writable(self):
        return True

    def write(self, s):
        s = str(s)
        if self.used + len(s) > self.limit:
            s = s[: max(0, self.limit - self.used)]
            if not self.capped:
                self.capped = True
                self.on_cap()
        self.used += len(s)
        if s:
            self.stream.write(s)
        return len(s)

    def flush(self):
        self.stream.flush()


def _seal(spec: dict):
    """Inside fresh user, mount, network and PID namespaces: make the whole file system read-only, cover
    the hidden paths, and give the sandbox one writable, size-capped folder (a tmpfs over the scratch
    folder holding only this submission's files), then lock those mounts and cap the process count."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
    kept = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048}
    kept["relatime"] = 1 << 21

    def mount(src, target, fstype, flags, data):
        if libc.mount(src, str(target).encode(), fstype, flags, data) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount {target}: {os.strerror(errno)}")

    workdir, scratch = Path(spec["workdir"]), Path(spec["scratch"])
    files = {}  # this submission's own files, carried over into its tmpfs
    for path in sorted(workdir.rglob("*")):
        files[path.relative_to(workdir)] = None if path.is_dir() else path.read_bytes()
    for path in map(Path, spec["hidden"]):
        if path == scratch or scratch in path.parents:
            continue
        if path.is_dir():
            mount(b"tmpfs", path, b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=0555")
        elif path.is_file():
            mount(b"/dev/null", path, None, MS_BIND, None)
    size = f"size={int(spec['disk_bytes'])},mode=0700".encode()
    mount(b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV, size)  # other submissions' folders vanish
    workdir.mkdir(parents=True)
    for rel, data in files.items():
        if data is None:
            (workdir / rel).mkdir(parents=True, exist_ok=True)
        else:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).write_bytes(data)
    # Everything else read-only: each mount remounted with its own locked flags plus MS_RDONLY.
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            mounts.append((point, fields[5]))
    for point, options in sorted(mounts, key=lambda m: m[0].count("/")):
        if point == str(scratch) or point == "/proc" or point.startswith("/proc/"):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for option in options.split(","):
            flags |= kept.get(option, 0)
        with _suppress():  # a mount that cannot be remounted (gone, or not ours) stays as it was
            mount(None, point, None, flags, None)
    # Lock those mounts: in a user and mount namespace nested inside this one, mounts made here can be
    # neither unmounted nor remounted writable (the kernel's "locked mounts"), not even by this process.
    CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare (locking the mounts): {os.strerror(errno)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    # counted per user namespace: this sandbox's processes and threads only
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["processes"], spec["processes"]))


def _leave_group():
    """In the sandbox: a process group of its own, so that a signal the notebook sends to "its group"
    (``os.kill(0, ...)``) reaches nothing outside the sandbox."""
    with _suppress():
        os.setpgid(0, 0)


def _child(spec: dict) -> int:
    """The sandbox of one submission: execute its cells, then serve the graded names to the judge."""
    if spec["namespaces"]:
        _leave_group()
    events_fd = spec["events_fd"]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # input() must not wait
    lock = threading.Lock()

    def emit(**event):
        data = (json.dumps(event, default=str) + "\n").encode()
        with lock, _suppress():
            os.write(events_fd, data)

    workdir = Path(spec["workdir"])
    root = Path(spec["root"])
    hidden = [Path(p) for p in spec["hidden"]]
    try:
        if spec["namespaces"]:
            _seal(spec)
        os.chdir(workdir)
        # Everything the grader needs is imported before the first student line runs.
        import nbformat
        import numpy  # noqa: F401
        import torch  # noqa: F401
        from IPython.core.inputtransformer2 import TransformerManager

        import kernels  # noqa: F401
        import kernels.checks  # noqa: F401
        from kernels import grade_rpc

        install_bounds_check(lambda message: emit(event="oob", message=message))
        nb = nbformat.read(spec["notebook"], as_version=4)
    except BaseException as e:  # noqa: BLE001
        emit(event="setup-error", error=f"{type(e).__name__}: {e}"[:500])
        return 1

    real_stdout = sys.stdout
    out_file = open(workdir / "tmp" / "output.txt", "w", encoding="utf-8", errors="replace")
    capped = _Capped(out_file, spec["output_bytes"], lambda: emit(event="output-capped"))
    sys.stdout = sys.stderr = capped

    # IPython's shell, for what its transformer makes of magics (%%time, %timeit, !ls -> get_ipython())
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    _shell(ns)
    hook = _audit_hook(workdir, root, hidden, emit)
    sys.addaudithook(hook)

    transformer = TransformerManager()
    limit = float(spec["cell_seconds"])
    code_cells = [c for c in nb.cells if c.get("cell_type") == "code"]
    for i, cell in enumerate(code_cells):
        record = {"event": "cell", "index": i}
        emit(event="started", index=i)
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        try:
            code = compile(transformer.transform_cell(source), f"<cell {i + 1}>", "exec")
        except (SyntaxError, ValueError) as e:
            record.update(
                error=f"{type(e).__name__}: {getattr(e, 'msg', e)} (line {getattr(e, 'lineno', '?')})", syntax=True
            )
            emit(**record)
            continue
        try:
            with grade_rpc.time_limit(limit, f"cell {i + 1}"):
                exec(code, ns)
        except grade_rpc.TimeLimit as e:
            record.update(error=str(e), slow=True)
        except BaseException as e:  # noqa: BLE001 - the student's error, reported; the next cell runs
            record.update(_describe(e))
        emit(**record)
    sys.stdout.flush()
    emit(event="executed")
    # The tests never come here: the judge asks for the graded names' values, and for calls on them.
    try:
        grade_rpc.serve(spec["requests_fd"], spec["answers_fd"], ns, spec["names"], limit)
    except BaseException as e:  # noqa: BLE001 - a broken connection, or the student's code breaking it
        emit(event="serve-error", error=f"{type(e).__name__}: {e}"[:500])
    sys.stdout = real_stdout
    emit(event="done")
    out_file.close()
    return 0


def _shell(ns: dict):
    """An IPython shell whose namespace is ``ns`` (no history file, no display of its own), so that a
    cell's magics run as in Jupyter; None where IPython cannot start one."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        shell = InteractiveShell.instance(config=config, user_ns=ns)
        ns.setdefault("get_ipython", shell.get_ipython)
        return shell
    except Exception:  # noqa: BLE001 - a notebook without magics runs without the shell
        return None


JUDGE_MODULES = ("otter.test_files.exception_test", "kernels", "kernels.checks", "kernels.grade_rpc")


def _judge_server(fd: int) -> int:
    """Import what a judge needs once, then fork a fresh judge for every job the grader sends on the
    socket ``fd`` (a message of JSON: the tests; with it the job's file descriptors: verdicts, answers,
    requests, log).  Forking gives every submission a judge in a clean state without paying the imports
    (torch, triton, otter: seconds of CPU) again; the server itself never runs a check, and no student
    code ever reaches it."""
    import importlib
    import pkgutil
    import socket

    sock = socket.socket(fileno=fd)
    for name in JUDGE_MODULES:
        importlib.import_module(name)
    import kernels.checks

    for info in pkgutil.iter_modules(kernels.checks.__path__):  # the labs' checks, imported once too
        importlib.import_module(f"kernels.checks.{info.name}")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the judges
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 4)
        except OSError:
            return 0
        if not message:
            return 0  # the grader closed its end
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                verdicts, answers, requests, log = fds
                os.dup2(log, 1)
                os.dup2(log, 2)
                code = _judge(json.loads(message), verdicts, answers, requests)
            finally:
                os._exit(code)
        for f in fds:
            os.close(f)
        sock.send(str(pid).encode())


class _JudgeServer:
    """The grader's end of :func:`_judge_server`: starts it once per run, hands it one job per
    submission (from any thread) and returns the new judge's process id."""

    def __init__(self, folder: Path):
        folder.mkdir(exist_ok=True)
        self.log = folder / "judge-server.log"
        self.lock = threading.Lock()
        self._spawn()

    def _spawn(self):
        import socket

        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        folder = self.log.parent
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernels.grade", "--judge-server", str(theirs.fileno())],
                cwd=folder,
                env=_judge_env(folder),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        theirs.close()

    def start(self, tests: dict, fds) -> int:
        """A new judge for one submission (the server is started again, once, if it has died)."""
        import socket

        with self.lock:
            for attempt in range(2):
                try:
                    socket.send_fds(self.sock, [json.dumps(tests).encode()], list(fds))
                    reply = self.sock.recv(64)
                except OSError:
                    reply = b""
                if reply:
                    return int(reply)
                if attempt == 0:
                    self.close()
                    self._spawn()
        tail = self.log.read_bytes()[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"the judge server has stopped: {tail}")

    def close(self):
        self.sock.close()
        _stop([self.proc])


def _judge(tests: dict, events_fd: int, answers_fd: int, requests_fd: int) -> int:
    """The judge of one submission: runs the lab's otter tests against the sandbox's graded names, as
    :class:`kernels.grade_rpc.Remote` proxies.  It never runs student code; its events on ``events_fd``
    are the only source of scores."""

    def emit(**event):
        os.write(events_fd, (json.dumps(event, default=str) + "\n").encode())

    try:
        from otter.test_files.exception_test import ExceptionTestFile

        import kernels  # noqa: F401
        import kernels.checks  # noqa: F401
        from kernels import grade_rpc

        client = grade_rpc.Client(answers_fd, requests_fd)
    except BaseException as e:  # noqa: BLE001
        emit(event="judge-error", error=f"{type(e).__name__}: {e}"[:500])
        return 1
    try:
        ns = client.hello()
    except grade_rpc.ProtocolError as e:
        emit(event="sandbox-gone", question=None, error=str(e)[:500])
        emit(event="done")
        return 0
    emit(event="served", names=sorted(ns))
    for name, value in sorted(ns.items()):  # the package's own code handed in as the answer
        module = value._info.get("module") if isinstance(value, grade_rpc.Remote) else None
        if module and (module == "kernels" or module.startswith("kernels.")):
            emit(event="package-code", name=name, what=f"{module}.{value._info.get('qualname') or ''}".rstrip("."))
    for q in sorted(tests, key=_natural):
        emit(event="started", question=q)
        try:
            tf = ExceptionTestFile.from_string(tests[q], path=q)
            tf.run(dict(ns))
        except BaseException as e:  # noqa: BLE001
            emit(
                event="case",
                question=q,
                name=q,
                hidden=False,
                passed=False,
                score=0.0,
                possible=0.0,
                message=f"the test could not run: {type(e).__name__}: {e}"[:2000],
                **_describe(e),
            )
            continue
        if client.gone:  # the sandbox died during this question: its results say nothing
            emit(event="sandbox-gone", question=q, error=client.gone)
            break
        for result in tf.test_case_results:
            case = result.test_case
            message = result.message.replace("✅ Test case passed", "").replace("❌ Test case failed\n", "")
            info = {}
            if not result.passed and re.search(r"is not defined yet", message):
                m = re.search(r": (\w+)(?: \([^)]*\))? is not defined yet", message)
                info["missing"] = m.group(1) if m else q
            if "out-of-bounds" in message:
                info["out_of_bounds"] = re.search(r"out-of-bounds [^\n]*", message).group(0)[:500]
            if "MemoryError" in message or "can't allocate memory" in message:
                info["memory"] = True
            emit(
                event="case",
                question=q,
                name=case.name,
                hidden=case.hidden,
                passed=result.passed,
                score=float(tf.score),
                possible=float(tf.possible),
                message=message.strip()[:4000],
                **info,
            )
    emit(event="done")
    return 0


def _describe(e: BaseException) -> dict:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    info = {"error": f"{type(e).__name__}: {first}"[:500]}
    chain, seen = e, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        text = f"{type(chain).__name__}: {chain}"
        if isinstance(chain, MemoryError) or "can't allocate memory" in text or "std::bad_alloc" in text:
            info["memory"] = True
        if isinstance(chain, OutOfBounds) or "out-of-bounds tl." in text:
            m = re.search(r"out-of-bounds tl\.[^\n'\"]*", text)
            info["out_of_bounds"] = m.group(0) if m else text[:300]
        chain = chain.__cause__ or chain.__context__
    return info


def _audit_hook(workdir: Path, root: Path, hidden: list, emit):
    """An audit hook that refuses (and reports) reads of hidden paths, writes outside ``workdir``,
    new processes and sockets."""
    work = os.path.realpath(workdir)
    unlistable = {os.path.realpath(root / "tests")}  # its data files may be opened by name, not browsed
    hidden_real = [os.path.realpath(p) for p in hidden]
    pid = os.getpid()
    write_ok = ("/dev/null",)
    reported = set()
    busy = threading.local()

    def inside(path, base):
        return path == base or path.startswith(base + os.sep)

    def refuse(status, detail):
        if detail not in reported:
            reported.add(detail)
            emit(event="violation", status=status, detail=detail)
        raise PermissionError(f"refused by the grader: {detail}")

    def real(path):
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            return None
        return os.path.realpath(os.path.join(work, path)) if not os.path.isabs(path) else os.path.realpath(path)

    def check_read(path, what):
        p = real(path)
        if p is None or inside(p, work):
            return
        for h in hidden_real:
            if inside(p, h):
                refuse("forbidden-read", f"{what} {p}: the solutions, tests and other submissions are off limits")
        m = re.match(r"/proc/(\d+)(/|$)", p)
        if m and int(m.group(1)) != pid:
            refuse("forbidden-read", f"{what} {p}: another process's files are off limits")

    def check_write(path, what):
        p = real(path)
        if p is None:
            return
        if not inside(p, work) and p not in write_ok:
            refuse("forbidden-write", f"{what} {p}: outside the submission's folder")

    def hook(event, args):
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            if event == "open":
                path, mode, flags = (list(args) + [None, None, None])[:3]
                if isinstance(path, int):
                    return
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
                )
                if writing:
                    check_write(path, "writing")
                check_read(path, "opening")
            elif event in ("os.listdir", "os.scandir", "glob.glob", "os.chdir"):
                if args and args[0] is not None:
                    check_read(args[0], "listing" if event != "os.chdir" else "entering")
                    p = real(args[0])
                    if event in ("os.listdir", "os.scandir") and p in unlistable:
                        refuse("forbidden-read", f"listing {p}: the test suite is off limits")
            elif event in (
                "os.remove",
                "os.rmdir",
                "os.mkdir",
                "os.chmod",
                "os.chown",
                "os.truncate",
                "os.utime",
                "shutil.rmtree",
                "os.symlink",
                "os.link",
            ):
                if args and not isinstance(args[0], int):
                    check_write(
                        args[0],
                        {"os.remove": "deleting", "os.rmdir": "deleting", "shutil.rmtree": "deleting"}.get(
                            event, event.split(".")[-1]
                        ),
                    )
                if event in ("os.symlink", "os.link") and len(args) > 1:
                    check_write(args[1], "linking")
            elif event == "os.rename":
                check_write(args[0], "renaming")
                check_write(args[1], "renaming")
            elif event in (
                "subprocess.Popen",
                "os.system",
                "os.exec",
                "os.posix_spawn",
                "os.spawn",
                "os.fork",
                "os.forkpty",
                "pty.spawn",
            ):
                refuse("forbidden-exec", f"starting a process ({event}): not allowed while grading")
            elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
                target = args[:2] if event == "socket.getaddrinfo" else args[1:2]
                target = ":".join(map(str, target[0] if len(target) == 1 and isinstance(target[0], tuple) else target))
                refuse("forbidden-exec", f"network access ({event} {target}): not allowed while grading")
        finally:
            busy.on = False

    return hook


# ------------------------------------------------------------------------------------------------
# Results on disk: atomic, resumable


def _inside(path: Path, folder: Path) -> bool:
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def _atomic_write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def result_key(sub: Submission, lab: Lab | None, limits: Limits) -> str:
    parts = [
        sub.sha256,
        sub.student,
        lab.name if lab else "",
        lab.digest if lab else "",
        str(GRADER_VERSION),
        f"{limits.timeout_s}:{limits.memory_gb}:{limits.output_mb}",
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _safe(name: str) -> str:
    """A file name for ``name``: letters and digits of any script kept (Zoë, 李雷), the rest ``_``."""
    name = unicodedata.normalize("NFC", name)
    return re.sub(r"[^\w.-]+", "_", name).strip("._")[:100] or "unnamed"


def _feedback_names(submissions) -> dict:
    """{student: feedback file name}, unique even where two names fold to one file name (``Zoë`` and
    ``Zoé`` stay apart; ``Bob`` and ``bob`` too, on a file system that ignores case)."""
    students = sorted({s.student for s in submissions if s.student})
    folded = {}
    for student in students:
        folded.setdefault(_safe(student).casefold(), []).append(student)
    names = {}
    for student in students:
        safe = _safe(student)
        clash = len(folded[safe.casefold()]) > 1 or safe != unicodedata.normalize("NFC", student)
        names[student] = f"{safe}-{hashlib.sha256(student.encode()).hexdigest()[:6]}" if clash else safe
    return names


def _with_intake(result: dict, sub: Submission) -> dict:
    """``result`` with the intake's flags (duplicates, identical cells, repairs) merged in by severity."""
    result = dict(result, flags=list(result["flags"]), notes=list(result["notes"]))
    for flag, note in sub.intake:
        if flag not in result["flags"]:
            result["flags"].append(flag)
        if note not in result["notes"]:
            result["notes"].append(note)
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    result["flags"].sort(key=lambda f: order.get(f, len(order)))
    graded = [f for f in result["flags"] if f not in REVIEW]
    result["status"] = graded[0] if graded else "ok"
    return result


def feedback_markdown(result: dict) -> str:
    lines = [f"# {result['lab']}: feedback for {result['student']}", ""]
    lines.append(f"Score: **{result['total']:g} / {result['possible']:g}**  (status: `{result['status']}`)")
    lines.append("")
    for note in result["notes"]:
        lines.append(f"* {note}")
    if result["notes"]:
        lines.append("")
    for q, v in sorted(result["questions"].items(), key=lambda kv: _natural(kv[0])):
        lines.append(f"## {q}: {v['points']:g} / {v['possible']:g}")
        lines.append("")
        if v["note"]:
            lines.append(v["note"])
            lines.append("")
        for case in v["cases"]:
            if case["hidden"]:
                lines.append(f"* hidden test `{case['name']}`: {'passed' if case['passed'] else 'failed'}")
            elif case["passed"]:
                lines.append(f"* `{case['name']}`: passed")
            else:
                lines.append(f"* `{case['name']}`: failed")
                lines.append("")
                lines.append("  ```")
                lines.extend("  " + line for line in _diagnosis(case["message"]).splitlines())
                lines.append("  ```")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _diagnosis(message: str) -> str:
    """The check's own message, without otter's quoting of the test file's source line."""
    m = re.search(r"^Error at line \d+ in test [^\n]*\n(?:  [^\n]*\n)?(.*)$", message, flags=re.S)
    text = m.group(1) if m else message
    return re.sub(r"^AssertionError: ", "", text.strip())


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet shows as text: one that would start a formula (=, +, -, @, a tab or a
    carriage return) gets a leading apostrophe (OWASP's advice for CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(path: Path, results: list):
    questions = sorted({q for r in results for q in r["questions"]}, key=_natural)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "student",
            "lab",
            *questions,
            "total",
            "possible",
            "status",
            "flags",
            "detail",
            "seconds",
            "cpu_seconds",
            "lab_from",
            "submission",
            "sha256",
        ]
    )
    for r in sorted(results, key=lambda r: (r["lab"], r["student"], r["submission"])):
        r = {k: _cell(v) if isinstance(v, str) else v for k, v in r.items()}
        r["flags"], r["notes"] = [_cell(f) for f in r["flags"]], [_cell(n) for n in r["notes"]]
        points = [f"{r['questions'][q]['points']:g}" if q in r["questions"] else "" for q in questions]
        writer.writerow(
            [
                r["student"],
                r["lab"],
                *points,
                f"{r['total']:g}",
                f"{r['possible']:g}",
                r["status"],
                " ".join(r["flags"]),
                "; ".join(r["notes"]),
                f"{r['seconds']:g}",
                f"{r.get('cpu_seconds', 0.0):g}",
                r["lab_from"],
                r["submission"],
                r["sha256"],
            ]
        )
    _atomic_write(path, buffer.getvalue())


# ------------------------------------------------------------------------------------------------
# The command


def grade(
    paths,
    out: Path,
    *,
    labs: dict | None = None,
    lab: str | None = None,
    jobs: int = 1,
    limits: Limits | None = None,
    force: bool = False,
    progress: bool = True,
    roster: dict | None = None,
) -> list:
    """Grade every notebook in ``paths`` into ``out``; returns the results (one dict per submission).
    ``roster``: {path: student} (:func:`read_roster`); without it, identity comes from the folders."""
    out = Path(out).resolve()
    labs = labs if labs is not None else load_labs()
    limits = limits or Limits(namespaces=namespaces_available())
    if lab is not None and lab not in labs:
        raise ValueError(f"lab: unknown lab {lab!r}; known: {', '.join(labs)}")
    found = find_notebooks(paths)
    submissions = [identify(p, labs, lab, base, roster) for p, base in found]
    review_intake(submissions)
    notebooks = [p for p, _ in found]
    folders = {p.absolute().parent for p in notebooks} | {Path(p).resolve() for p in paths if Path(p).is_dir()}
    # Off limits to every submission: the solutions (hidden tests live there), the test suite (its data
    # files excepted: notebooks read them), the repository's history, every submissions folder and the
    # output folder.  A folder holding the package itself cannot be hidden from the code that imports it.
    tests = [p for p in (ROOT / "tests").iterdir() if p.name != "data"]
    secret = {ROOT / "solutions", ROOT / ".git", *tests, out, *folders}
    secret |= {Path(d).resolve() for one in labs.values() for d in one.secret}
    hidden = sorted(p for p in secret if p.exists() and not _inside(ROOT / "kernels", p))
    hidden = [p for p in hidden if not any(q != p and _inside(p, q) for q in hidden)]  # covered by a parent
    (out / "results").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="kernels-grade-"))
    hidden.append(scratch)  # other submissions' sandboxes; a child's own folder stays visible

    results, todo, subs_of = {}, [], {}
    for sub in submissions:
        key = result_key(sub, labs.get(sub.lab), limits)
        subs_of[key] = sub
        refused = next(((f, n) for f, n in sub.intake if f in ("symlink", "not-in-roster")), None)
        if refused:  # never read, never run
            results[key] = not_graded(sub, labs.get(sub.lab), *refused)
            continue
        stored = out / "results" / f"{key}.json"
        if stored.is_file() and not force:
            try:
                results[key] = json.loads(stored.read_text())
                continue
            except ValueError:
                pass
        todo.append((key, sub))

    judges = None
    if todo:
        _warm_caches(scratch)
        judges = _JudgeServer(scratch / "judge")
    feedback_names = _feedback_names(submissions)

    def report(key, result) -> dict:
        """The stored result with what this run's intake found (which depends on the other submissions)."""
        result = _with_intake(result, subs_of[key])
        name = feedback_names.get(result["student"], _safe(result["student"]))
        _atomic_write(out / "feedback" / _safe(result["lab"] or "unknown") / f"{name}.md", feedback_markdown(result))
        return result

    def one(key, sub):
        lab_ = labs.get(sub.lab)
        if sub.notebook_error:
            result = not_graded(sub, lab_, "not-a-notebook", sub.notebook_error)
        elif lab_ is None:
            result = not_graded(
                sub,
                None,
                "unknown-lab",
                f"no lab in the notebook's metadata or its file name (labs: {', '.join(labs)})",
            )
        else:
            result = run_isolated(sub, lab_, limits, [h for h in hidden if h != scratch] + [scratch], scratch, judges)
        _atomic_write(out / "results" / f"{key}.json", json.dumps(result, indent=1))
        return key, result

    for key in list(results):
        results[key] = report(key, results[key])
    bar = _progress_bar(
        total=len(submissions),
        initial=len(submissions) - len(todo),
        desc="grading",
        unit="notebook",
        disable=not progress,
        file=sys.stderr,
    )
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = []
    try:
        futures += [pool.submit(one, key, sub) for key, sub in todo]
        for future in as_completed(futures):
            key, result = future.result()
            results[key] = result = report(key, result)
            bar.set_postfix_str(f"{result['student']}: {result['status']}", refresh=False)
            bar.update()
            write_csv(out / "scores.csv", list(results.values()))
    except BaseException:
        # Interrupted (Ctrl-C) or failed: what finished is on disk; stop the rest, keep nothing half-done.
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_running()
        raise
    finally:
        pool.shutdown(wait=True)
        for future in futures:  # finished while the interruption was handled: on disk, so in the CSV too
            if future.done() and not future.cancelled() and future.exception() is None:
                key, result = future.result()
                results[key] = _with_intake(result, subs_of[key])
        bar.close()
        write_csv(out / "scores.csv", list(results.values()))
        if judges is not None:
            judges.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return sorted(results.values(), key=lambda r: (r["lab"], r["student"], r["submission"]))


class _TextBar:
    """A one-line progress bar on stderr, for when tqdm is not installed."""

    def __init__(self, total, initial=0, desc="", unit="", disable=False, file=sys.stderr):
        self.total, self.n, self.desc, self.unit, self.disable, self.file = total, initial, desc, unit, disable, file
        self.started, self.postfix = time.monotonic(), ""
        self._draw()

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s

    def update(self, n=1):
        self.n += n
        self._draw()

    def _draw(self, end="\r"):
        if self.disable:
            return
        done = int(20 * self.n / self.total) if self.total else 20
        elapsed = time.monotonic() - self.started
        self.file.write(
            f"{self.desc}: [{'#' * done}{'.' * (20 - done)}] {self.n}/{self.total} {self.unit}s "
            f"{elapsed:.0f} s  {self.postfix}".ljust(100)
            + end
        )
        self.file.flush()

    def close(self):
        self._draw(end="\n")


def _progress_bar(**kwargs):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _TextBar(**kwargs)
    return tqdm(**kwargs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(json.loads(argv[1]))
    if argv[:1] == ["--judge-server"]:
        return _judge_server(int(argv[1]))
    parser = argparse.ArgumentParser(
        prog="python -m kernels.grade",
        description=__doc__.splitlines()[0],
        epilog="Statuses and the isolation guarantee: see the module's docstring.",
    )
    parser.add_argument("submissions", type=Path, nargs="*", help="submitted notebooks, or folders holding them")
    parser.add_argument("--list-labs", action="store_true", help="print each lab's questions, points and tests; exit")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("grades"),
        help="where scores.csv, feedback/ and results/ go (default: %(default)s)",
    )
    parser.add_argument("--lab", help="grade every submission as this lab (default: from metadata or file name)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="submissions graded side by side (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="wall-clock seconds per submission (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu-timeout", type=float, default=None, help="CPU seconds per submission (default: the same as --timeout)"
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=DEFAULT_CELL_S,
        help="CPU seconds per cell, and per call of a graded function while scoring (default: %(default)s)",
    )
    parser.add_argument(
        "--disk-mb",
        type=float,
        default=DEFAULT_DISK_MB,
        help="the sandbox's one writable folder, MB (default: %(default)s)",
    )
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=DEFAULT_MEMORY_GB,
        help="address-space limit per submission, GB (default: %(default)s; torch and triton alone take about 3.5)",
    )
    parser.add_argument(
        "--output-mb",
        type=float,
        default=DEFAULT_OUTPUT_MB,
        help="printed output kept per submission, MB (default: %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="regrade submissions already graded")
    parser.add_argument(
        "--roster",
        type=Path,
        help="CSV with columns student,file (a notebook or a folder of them): who submitted what; notebooks "
        "not in it are not graded (default: one folder per student, or the file name)",
    )
    parser.add_argument(
        "--no-namespaces",
        action="store_true",
        help="do not use unshare even where it works (the audit hook alone then isolates)",
    )
    parser.add_argument("--labs-dir", type=Path, default=ROOT / "labs", help="default: %(default)s")
    parser.add_argument("--solutions-dir", type=Path, default=ROOT / "solutions", help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.list_labs:
        for lab in load_labs(args.labs_dir, args.solutions_dir).values():
            print(lab.describe())
        return 0
    if not args.submissions:
        parser.error("submissions: name at least one notebook or folder")
    missing = [str(s) for s in args.submissions if not s.exists()]
    if missing:
        parser.error(f"submissions: no such file(s) or folder(s): {', '.join(missing)}")
    for name in ("timeout", "memory_gb", "output_mb", "jobs", "cpu_timeout", "cell_timeout", "disk_mb"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not args.labs_dir.is_dir():
        parser.error(f"--labs-dir: no such folder {args.labs_dir}")
    roster = None
    if args.roster is not None:
        try:
            roster = read_roster(args.roster)
        except (OSError, ValueError) as e:
            parser.error(f"--roster: {e}")
    labs = load_labs(args.labs_dir, args.solutions_dir)
    if args.lab is not None and args.lab not in labs:
        parser.error(f"--lab: unknown lab {args.lab!r}; known: {', '.join(labs)}")
    namespaces = not args.no_namespaces and namespaces_available()
    print(
        (
            "grading in sandboxes of user, mount, network and PID namespaces (unshare -rmnpf) with an audit hook"
            if namespaces
            else "grading WITHOUT a sandbox: no user namespaces here (or --no-namespaces), so ONLY an audit hook "
            "isolates each notebook, and every row is flagged unisolated"
        )
        + f"; {args.timeout:g} s, {args.cell_timeout:g} CPU s per cell, {args.memory_gb:g} GB, {args.output_mb:g} MB "
        f"of output per submission; {args.jobs} at a time",
        file=sys.stderr,
    )
    limits = Limits(
        args.timeout,
        args.memory_gb,
        args.output_mb,
        namespaces,
        args.cpu_timeout,
        disk_mb=args.disk_mb,
        cell_s=args.cell_timeout,
    )
    results = grade(
        args.submissions,
        args.out,
        labs=labs,
        lab=args.lab,
        jobs=args.jobs,
        limits=limits,
        force=args.force,
        roster=roster,
    )
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: STATUS_ORDER.index(kv[0])))
    print(
        f"{len(results)} submissions graded ({summary}): {args.out / 'scores.csv'}, feedback in {args.out / 'feedback'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
