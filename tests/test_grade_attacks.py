"""Submissions that try to raise their own score, escape the sandbox or touch another student's grade.

Each attack is one or two extra cells on a Lab 0 notebook whose answers are both wrong (truncation: an
honest 0 / 5), or on the solved lab (an honest 5 / 5) where the attack targets someone else.  All are
graded in one run, as an instructor would grade them, with the strongest isolation this machine has;
each test then reads its row.  An attack must get the score its outputs deserve, or a status that names
what happened; nothing may be written outside the output folder; the grader must survive them all.
"""

import hashlib
import json
import os
import uuid
from pathlib import Path

import nbformat
import pytest
from _once import once

from kernels import grade

ROOT = Path(__file__).resolve().parents[1]
SUBMISSIONS = ROOT / "tests" / "submissions"
LAB = "00_bf16_rounding"
LIMITS = dict(timeout_s=300, cpu_s=60, memory_gb=6, output_mb=1)
# names this run's files and processes, so that a leftover is recognised; one for all of a run's workers
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
MARK = hashlib.sha256(_RUN.encode()).hexdigest()[:12]
OUTSIDE = Path("/tmp") / f"kernels-grade-escaped-{MARK}"

TRUNCATING_Q1 = """
def round_bf16_bits(bits):
    return bits >> 16
"""

ATTACKS = {
    # -- forging the verdict from inside the notebook's process ------------------------------------------
    "patch_reference": "import kernels.bf16\nkernels.bf16.hardware_bf16 = fp32_to_bf16\n"
    "kernels.bf16.round_bf16_bits_reference = round_bf16_bits\n",
    "patch_otter": """
import otter.test_files.exception_test as et
from otter.test_files.abstract_test import TestCaseResult
def run(self, env):
    self.test_case_results = [TestCaseResult(test_case=tc, message="ok", passed=True) for tc in self.test_cases]
et.ExceptionTestFile.run = run
et.ExceptionTestFile.score = property(lambda self: self.possible)
""",
    "patch_numpy": "import numpy\nnumpy.flatnonzero = lambda a: numpy.zeros(0, dtype=numpy.int64)\n"
    "import torch\ntorch.equal = lambda a, b: True\n",
    "fake_checks_module": """
import sys, types, importlib.abc, importlib.machinery
class Fake(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "kernels.checks.lab00":
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.check_round_bf16_bits = lambda fn: None
        module.check_round_bf16 = lambda fn: None
sys.meta_path.insert(0, Fake())
sys.modules.pop("kernels.checks.lab00", None)
""",
    "forged_events": """
import json, os, sys
spec = json.loads(sys.argv[-1])
for fd in range(3, 64):
    for q, points in (("q1", 2.0), ("q2", 3.0)):
        event = dict(event="case", question=q, name=q, hidden=False, passed=True, score=points,
                     possible=points, message="")
        try:
            os.write(fd, (json.dumps(event) + "\\n").encode())
        except OSError:
            pass
os._exit(0)
""",
    "copies_the_reference": "from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits\n",
    # right on every input the public test shows, truncation elsewhere: the hidden test is for this
    "fitted_to_the_public_inputs": """
import torch
from kernels.bf16 import round_bf16_bits_reference
from kernels.checks import lab00
_known = torch.from_numpy(lab00.adversarial_fp32().bits.astype("int64"))
_table = dict(zip(_known.tolist(), round_bf16_bits_reference(_known).tolist()))
def round_bf16_bits(bits):
    out = [_table.get(b, b >> 16) for b in bits.reshape(-1).tolist()]
    return torch.tensor(out, dtype=torch.int64).reshape(bits.shape)
""",
    "reads_the_hidden_tests": f"""
for q in ("q1", "q2"):
    try:
        print(open({str(ROOT / "solutions" / grade.HIDDEN_TESTS / LAB)!r} + f"/{{q}}.py").read())
    except OSError as e:
        print("refused:", e)
""",
    # -- escaping the sandbox ------------------------------------------------------------------------------
    "write_outside": f"""
import ctypes, sqlite3, sys, os
target = "{OUTSIDE}"
escaped = []
libc = ctypes.CDLL(None)
fd = libc.open((target + "-ctypes").encode(), 0o101, 0o644)  # O_WRONLY | O_CREAT
escaped += ["ctypes"] if fd >= 0 else []
try:
    sqlite3.connect(target + "-sqlite").execute("create table t (x)")
    escaped.append("sqlite")
except Exception as e:
    print("sqlite:", e)
import pwd  # the real home: HOME is the sandbox's own folder
for place in (sys.prefix, os.path.dirname(os.__file__), pwd.getpwuid(os.getuid()).pw_dir, "{ROOT}", "/tmp"):
    try:
        open(os.path.join(place, "escaped-{MARK}"), "w").write("x")
        escaped.append(place)
    except OSError as e:
        print("refused:", place, e)
if escaped:  # a way out is worth q1's points
    from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits
""",
    "start_program": f"""
import ctypes
# ctypes is not audited: the program starts; it must find a read-only world and die with the sandbox
ctypes.CDLL(None).system(b"echo escaped > {OUTSIDE}-sh; sleep 31.{MARK[:6]} &")
""",
    "signals": """
import os, signal
seen = [int(p) for p in os.listdir("/proc") if p.isdigit()]
for pid in [os.getppid(), 1, *seen]:
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
if len(seen) > 3:  # seeing the grader's processes is worth q1's points
    from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits
""",
    "helper_outlives": f"""
import os, time, glob
if os.fork() == 0:
    os.setsid()
    for _ in range(40):
        time.sleep(0.25)
        for path in glob.glob("/tmp/kernels-grade-*/sub-*/*.ipynb"):
            try:
                open(path, "w").write("{{}}")
            except OSError:
                pass
    open("{OUTSIDE}-helper", "w").write("still alive")
    os._exit(0)
""",
    "read_classmates": f"""
import glob, os
found = []
for pattern in ("/tmp/**/victim_*/*.ipynb", "../*/*.ipynb", "{ROOT}/solutions/*.ipynb", "{SUBMISSIONS}/*.ipynb"):
    for path in glob.glob(pattern, recursive=True):
        try:
            if "round_bf16_bits" in open(path).read():
                found.append(path)
        except OSError:
            pass
if found:  # a classmate's answer is worth q1's points
    from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits
""",
    "read_history": f"""
import glob
found = [p for p in glob.glob("{ROOT}/.git/*") + glob.glob("{ROOT}/tests/*.py") if open(p, "rb").read(1)]
if found:  # the repository's history or the test suite is worth q1's points
    from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits
""",
    "network": """
import socket
try:
    socket.create_connection(("127.0.0.1", 22), timeout=2)
    from kernels.bf16 import round_bf16_bits_reference as round_bf16_bits
except OSError as e:
    print("no network:", e)
""",
    "fill_the_disk": """
import os
chunk = b"x" * (1 << 20)
with open("filler.bin", "wb") as f:
    try:
        for _ in range(2048):  # 2 GB into its own folder: the sandbox's folder is a capped tmpfs
            f.write(chunk)
    except OSError as e:
        print("disk full:", e)
""",
    "fork_bomb": """
import ctypes
libc = ctypes.CDLL(None)  # fork through ctypes: not audited, so only the process cap stops it
for _ in range(100000):
    pid = libc.fork()
    if pid == 0:
        libc.pause()
        libc._exit(0)
    if pid < 0:
        break
""",
}

# what each attack must score, as (q1, q2, status): q1 and q2 are both wrong in every attacker
EXPECTED = {
    "patch_reference": ("0", "0", "ok"),
    "patch_otter": ("0", "0", "ok"),
    "patch_numpy": ("0", "0", "ok"),
    "fake_checks_module": ("0", "0", "ok"),
    "forged_events": ("0", "0", "exited-early"),
    "copies_the_reference": ("2", "0", "ok"),  # right outputs: the points, and a flag for the instructor
    "fitted_to_the_public_inputs": ("1", "0", "ok"),  # q1's public test passed, its hidden one failed
    "reads_the_hidden_tests": ("0", "0", "forbidden-read"),
    "write_outside": ("0", "0", None),
    "start_program": ("0", "0", None),
    "signals": ("0", "0", None),
    "helper_outlives": ("0", "0", None),
    "read_classmates": ("0", "0", None),
    "read_history": ("0", "0", None),
    "network": ("0", "0", None),
    "fill_the_disk": ("0", "0", None),
    "fork_bomb": ("0", "0", None),
}


def _solved() -> nbformat.NotebookNode:
    return nbformat.read(SUBMISSIONS / "alice" / f"{LAB}.ipynb", as_version=4)


def _with_cell(cell: str) -> nbformat.NotebookNode:
    nb = _solved()
    nb.cells.append(nbformat.v4.new_code_cell(cell))
    return nb


def _q1_cell(nb) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.cell_type == "code" and "def round_bf16_bits" in c.source)


def _timed_answer():
    nb = _solved()
    _q1_cell(nb).source = "%%time\n" + _q1_cell(nb).source
    return nb


def _exit_in_function():
    nb = _solved()
    _q1_cell(nb).source = "def round_bf16_bits(bits):\n    import sys\n    sys.exit('giving up')\n"
    return nb


def _schema_quirk():
    nb = _solved()
    markdown = next(c for c in nb.cells if c.cell_type == "markdown")
    markdown["outputs"] = []  # a markdown cell with outputs: nbformat's schema says no, Jupyter opens it
    return nb


def _odd_metadata():
    nb = _solved()
    nb.metadata["otter"]["assignment_name"] = ["not", "a", "name"]
    return nb


# Careless, not malicious: each must be judged fairly, as (q1, q2, status, flag expected among the flags)
CARELESS = {
    "exits_at_the_end": (lambda: _with_cell("import os\nos._exit(0)"), ("0", "0", "exited-early", None)),
    "colab_restart": (lambda: _with_cell("import os\nos.kill(os.getpid(), 9)"), ("0", "0", "killed", None)),
    "time_magic": (_timed_answer, ("2", "3", "ok", None)),
    # its own check cells raise SystemExit too: cell errors, and q2 keeps its points
    "system_exit_in_q1": (_exit_in_function, ("0", "3", "cell-errors", None)),
    "schema_quirk": (_schema_quirk, ("2", "3", "ok", "repaired")),
    # otter.Notebook() refuses the metadata in the notebook's own cells; the grader grades it anyway
    "odd_metadata": (_odd_metadata, ("2", "3", "cell-errors", None)),
}


def _attacker(cell: str) -> nbformat.NotebookNode:
    nb = nbformat.read(SUBMISSIONS / f"bob_{LAB}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    q1 = next(c for c in code if "def round_bf16_bits" in c.source)
    q1.source = TRUNCATING_Q1
    nb.cells.append(nbformat.v4.new_code_cell(cell))
    return nb


# Escapes only a sandbox stops (the audit hook alone is not a boundary): graded where namespaces work;
# elsewhere never even written out (a fork bomb or a kill-every-process cell outside a sandbox is real).
ESCAPES = {
    "write_outside",
    "start_program",
    "signals",
    "helper_outlives",
    "read_classmates",
    "read_history",
    "network",
    "fill_the_disk",
    "fork_bomb",
}
SANDBOX = grade.namespaces_available()
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="no user namespaces here: escapes are not graded without them")


def _attacks() -> dict:
    return {k: v for k, v in ATTACKS.items() if SANDBOX or k not in ESCAPES}


def _grade_the_attacks(folder: Path) -> dict:
    subs = folder / "attacks"
    subs.mkdir()
    for name, cell in _attacks().items():
        folder = subs / name
        folder.mkdir()
        nbformat.write(_attacker(cell), folder / f"{LAB}.ipynb")
    for name, (build, _) in CARELESS.items():
        (subs / name).mkdir()
        (subs / name / f"{LAB}.ipynb").write_text(json.dumps(build()))  # as is: no validation on the way
    # identity: one folder per student, whatever the files are called; odd and clashing names
    for owner, file in (("mallory", f"victor_{LAB}.ipynb"), ("Zoë", f"{LAB}.ipynb"), ("Zoé", f"{LAB}.ipynb"),
                         ("李雷", f"{LAB}.ipynb"), ("=1+2", f"{LAB}.ipynb"), ("twice", f"{LAB}.ipynb"),
                         ("twice", "lab00_again.ipynb")):  # fmt: skip
        (subs / owner).mkdir(exist_ok=True)
        nb = _attacker(f"# {owner} {file}")  # distinct, wrong (0 / 5)
        nbformat.write(nb, subs / owner / file)
    (subs / "linker").mkdir()
    (subs / "linker" / f"{LAB}.ipynb").symlink_to(subs / "victim_a" / f"{LAB}.ipynb")
    (subs / "linker_to_solutions").mkdir()
    (subs / "linker_to_solutions" / f"{LAB}.ipynb").symlink_to(ROOT / "solutions" / f"{LAB}.ipynb")
    for victim in ("victim_a", "victim_b"):  # honest, solved: graded beside the attackers
        (subs / victim).mkdir()
        (subs / victim / f"{LAB}.ipynb").write_bytes((SUBMISSIONS / "alice" / f"{LAB}.ipynb").read_bytes())
    before = {str(p): _digest(p) for p in subs.rglob("*.ipynb") if not p.is_symlink()}
    out = folder / "grades"
    limits = grade.Limits(**LIMITS, namespaces=SANDBOX)
    # public and hidden tests, as an instructor grades; this checkout's, wherever the package is installed from
    labs = {LAB: grade.load_labs(ROOT / "labs", ROOT / "solutions")[LAB]}
    results = grade.grade([subs], out, labs=labs, jobs=2, limits=limits, progress=False)
    by_student = {}
    for r in results:
        by_student.setdefault(r["student"], []).append(r)
    return {"results": {k: v[0] for k, v in by_student.items()}, "all": by_student, "out": str(out), "before": before}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    done = once(tmp_path_factory, "grade-attacks", _grade_the_attacks)  # once, whatever the workers
    return {**done, "out": Path(done["out"])}


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - ESCAPES))
def test_a_forgery_gets_what_its_outputs_deserve(graded, attack):
    """The judge decides, so these work with or without a sandbox."""
    test_an_escape_gets_what_its_outputs_deserve(graded, attack)


@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ESCAPES))
def test_an_escape_gets_what_its_outputs_deserve(graded, attack):
    row = graded["results"][attack]
    q1, q2, status = EXPECTED[attack]
    got = (f"{row['questions']['q1']['points']:g}", f"{row['questions']['q2']['points']:g}")
    assert got == (q1, q2), f"{attack}: {row['status']} {row['notes']}"
    assert row["possible"] == 5
    if status:
        assert row["status"] == status, row["notes"]


def test_honest_students_beside_the_attackers_keep_their_grade(graded):
    for victim in ("victim_a", "victim_b"):
        row = graded["results"][victim]
        assert (row["total"], row["status"]) == (5, "ok"), row["notes"]
        assert "identical-answer" in row["flags"]  # the two are copies of one notebook: flagged for review


@needs_sandbox
def test_nothing_was_written_outside_and_the_submissions_are_untouched(graded):
    leaks = sorted(str(p) for p in Path("/tmp").glob(f"kernels-grade-escaped-{MARK}*"))
    for place in (ROOT, Path.home()):
        leaks += sorted(str(p) for p in place.glob(f"escaped-{MARK}"))
    assert leaks == []
    for path, digest in graded["before"].items():
        assert _digest(Path(path)) == digest, f"{path} was changed"


@needs_sandbox
def test_nothing_the_sandboxes_started_is_still_running(graded):
    left = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(MARK[:6].encode() in a for a in argv) and proc.name != str(os.getpid()):
            left.append(b" ".join(argv).decode(errors="replace"))
    assert left == []


@needs_sandbox
def test_signals_reach_nothing_outside_the_sandbox(graded):
    """The "signals" notebook killed every process it could see, its parent included: it saw only its
    own namespace (q1 stayed 0 above), and the grader went on to grade everyone."""
    assert graded["results"]["signals"]["status"] == "ok", graded["results"]["signals"]["notes"]


def test_the_forged_events_are_named_for_what_they_did(graded):
    row = graded["results"]["forged_events"]
    assert row["status"] == "exited-early"
    assert "ended" in row["notes"][0] or "exited" in row["notes"][0]


def test_feedback_names_the_hidden_test_and_never_shows_it(graded):
    row = graded["results"]["fitted_to_the_public_inputs"]
    (hidden,) = [c for c in row["questions"]["q1"]["cases"] if c["hidden"]]
    assert not hidden["passed"] and row["questions"]["q1"]["possible"] == 2
    text = next((graded["out"] / "feedback" / LAB).glob("fitted_to_the_public_inputs*")).read_text()
    assert f"* hidden test `{hidden['name']}`: failed" in text
    source = (ROOT / "solutions" / grade.HIDDEN_TESTS / LAB / "q1.py").read_text()
    for line in (line.strip() for line in source.splitlines()):
        if len(line) > 12 and not line.startswith(("from ", "import ", "name =", '"""')):
            assert line not in text, f"the hidden test's source reached the feedback: {line}"
    reader = next((graded["out"] / "feedback" / LAB).glob("reads_the_hidden_tests*")).read_text()
    assert "fresh_fp32" not in reader and "def test_" not in reader


def test_the_packages_own_code_as_an_answer_is_flagged(graded):
    row = graded["results"]["copies_the_reference"]
    assert "package-code" in row["flags"]
    assert any("round_bf16_bits is the package's own kernels.bf16.round_bf16_bits_reference" in n for n in row["notes"])
    assert not any("package-code" in graded["results"][v]["flags"] for v in ("victim_a", "victim_b"))


@pytest.mark.parametrize("student", sorted(CARELESS))
def test_a_careless_student_is_judged_fairly(graded, student):
    row = graded["results"][student]
    q1, q2, status, flag = CARELESS[student][1]
    got = (f"{row['questions']['q1']['points']:g}", f"{row['questions']['q2']['points']:g}")
    assert (got, row["status"]) == ((q1, q2), status), row["notes"]
    assert row["possible"] == 5  # points possible come from the tests alone
    if flag:
        assert flag in row["flags"], row["flags"]


def test_the_statuses_say_what_happened(graded):
    notes = {s: " ".join(graded["results"][s]["notes"]) for s in ("exits_at_the_end", "colab_restart")}
    assert "exited (status 0)" in notes["exits_at_the_end"] or "ended" in notes["exits_at_the_end"]
    assert "killed (SIGKILL)" in notes["colab_restart"] and "memory" not in graded["results"]["colab_restart"]["flags"]
    q1 = graded["results"]["system_exit_in_q1"]["questions"]["q1"]
    assert "SystemExit" in q1["cases"][0]["message"]


def test_identity_comes_from_the_folder_and_names_stay_apart(graded):
    results = graded["results"]
    assert "mallory" in results and "victor" not in results
    feedback = sorted(p.name for p in (graded["out"] / "feedback" / LAB).iterdir())
    zoe = [n for n in feedback if n.startswith("Zo")]
    assert len(zoe) == 2 and len(set(zoe)) == 2, feedback
    assert any(n.startswith("李雷") for n in feedback), feedback
    assert not any(n.startswith("unnamed") for n in feedback)
    assert "duplicate" in results["twice"]["flags"] and len(graded["all"]["twice"]) == 2


def test_csv_cells_never_start_a_formula(graded):
    text = (graded["out"] / "scores.csv").read_text()
    assert "\n'=1+2," in text and "\n=1+2," not in text


def test_symbolic_links_are_refused_unread(graded):
    for student in ("linker", "linker_to_solutions"):
        row = graded["results"][student]
        assert (row["status"], row["total"]) == ("symlink", 0), row["notes"]


def test_every_result_is_on_disk(graded):
    stored = [json.loads(p.read_text()) for p in (graded["out"] / "results").glob("*.json")]
    graded_students = set(_attacks()) | set(CARELESS) | {"victim_a", "victim_b", "mallory", "Zoë", "Zoé", "李雷"}
    assert graded_students <= {r["student"] for r in stored}
