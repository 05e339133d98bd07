"""The instructor's grader: every kind of bad submission gets its status, nobody's grading is hurt,
nothing leaks or escapes, results survive interruption, and the students' own checks agree.

One grading run of ``tests/submissions/`` (Lab 0, parallel workers) is shared by the tests below; its
CSV must equal ``tests/submissions/expected.csv``.
"""

import csv
import hashlib
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from _once import once

from kernels import grade
from kernels.grade import command
from kernels.grade.isolation import JudgeServer
from kernels.grade.results import diagnosis

ROOT = Path(__file__).resolve().parents[1]
SUBMISSIONS = ROOT / "tests" / "submissions"
LAB_NAME = "00_bf16_rounding"
LAB = ROOT / "labs" / f"{LAB_NAME}.ipynb"
SECRET = "hidden-detail-7f3a"  # in the hidden test's source and message only: must never reach feedback

HIDDEN_CASE = f'''
@test_case(points=None, hidden=True)
def test_q2_tie(fp32_to_bf16):
    import torch
    x = torch.tensor([0x3F808001], dtype=torch.int32).view(torch.float32)  # just above a tie
    assert fp32_to_bf16(x).view(torch.int16).item() == 0x3F81, "{SECRET}: 0x3F808001 must round up"
'''
# The endless loop is stopped by its CPU time (a machine busy with other work cannot make a sound
# notebook time out); the wall clock is left generous.
LIMITS = dict(timeout_s=900, cpu_s=60, memory_gb=6, output_mb=1, cell_s=15)
ESCAPE_TARGETS = [ROOT / "ESCAPED.txt", Path("/tmp/ESCAPED-kernels-grade.txt")]


def _labs():
    tests = grade.lab_tests(LAB)
    tests["q2"] += HIDDEN_CASE
    # what this checkout keeps secret, also where the package is installed from another checkout
    secret = [ROOT / "solutions", ROOT / ".git", *(p for p in (ROOT / "tests").iterdir() if p.name != "data")]
    return {LAB_NAME: grade.Lab(LAB_NAME, tests, "labs/ plus one hidden test", tuple(map(str, secret)))}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _grade_the_samples(folder: Path) -> dict:
    out = folder / "grades"
    out.mkdir()
    canary = out / "earlier-result.txt"  # something the grader's output folder held before
    canary.write_text("keep me")
    protected = {str(p): _digest(p) for p in [ROOT / "README.md", LAB, ROOT / "solutions" / LAB.name]}
    for target in ESCAPE_TARGETS:
        target.unlink(missing_ok=True)
    limits = grade.Limits(**LIMITS, namespaces=grade.namespaces_available())
    results = grade.grade([SUBMISSIONS], out, labs=_labs(), jobs=2, limits=limits, progress=False)
    return {"out": str(out), "results": results, "canary": str(canary), "protected": protected}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    done = once(tmp_path_factory, "grade-samples", _grade_the_samples)  # once, whatever the workers
    protected = {Path(p): digest for p, digest in done["protected"].items()}
    return {**done, "out": Path(done["out"]), "canary": Path(done["canary"]), "protected": protected}


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_csv_is_the_expected_one(graded):
    got = _rows(graded["out"] / "scores.csv")
    want = _rows(SUBMISSIONS / "expected.csv")
    columns = list(want[0])
    assert [{k: r[k] for k in columns} for r in got] == want
    assert all(r["possible"] == "5" for r in got)
    assert {r["sha256"] for r in got} == {_digest(p) for p in SUBMISSIONS.rglob("*.ipynb")}


def test_every_bad_kind_is_explained(graded):
    detail = {r["student"]: r["detail"] for r in _rows(graded["out"] / "scores.csv")}
    assert detail["carol"].startswith("not a notebook: NotJSONError")
    assert re.match(r"cell 4: SyntaxError: unmatched '\)' \(line 3\); not defined: round_bf16_bits", detail["dave"])
    assert detail["erin"] == "not defined: round_bf16_bits"
    assert detail["frank"].startswith("all 6 code cells raised an exception; not defined: fp32_to_bf16, round_bf16")
    assert detail["grace"].startswith("cell 7 ran longer than 15 s of CPU time and was stopped there; the other cells")
    assert detail["heidi"].startswith("ran out of memory (limit 6 GB of address space)")
    assert detail["ivan"].startswith("printed more than 1 MB; the rest of the output was dropped; a cell starting")
    for what in ["solutions/00_bf16_rounding.ipynb: the solutions", "tests/test_grade.py", "cmdline: another process"]:
        assert what in detail["judy"], what
    for what in [
        "writing /tmp/ESCAPED-kernels-grade.txt",
        "deleting ",
        "renaming ",
        "starting a process",
        "network access",
    ]:
        assert what in detail["mallory"], what
    # how many lanes miss every argument depends on where the allocator put the tensors
    assert re.match(r"out-of-bounds tl\.load: \d+ of 1024 active lanes address memory outside", detail["oscar"])
    assert "mask=offs < n" in detail["oscar"]


def test_nothing_escaped_and_nothing_leaked(graded):
    """judy and mallory answer q1 wrongly if any read or write got through: both have q1 = 2."""
    rows = {r["student"]: r for r in _rows(graded["out"] / "scores.csv")}
    assert rows["judy"]["q1"] == rows["mallory"]["q1"] == "2"
    for path, digest in graded["protected"].items():
        assert _digest(path) == digest, f"{path} changed"
    assert (ROOT / "labs").is_dir()
    for target in ESCAPE_TARGETS:
        assert not target.exists(), f"{target} was written"
    assert graded["canary"].read_text() == "keep me"
    names = {p.relative_to(graded["out"]).parts[0] for p in graded["out"].iterdir()}
    assert names == {"earlier-result.txt", "feedback", "results", "scores.csv"}
    assert not list(graded["out"].rglob(".*")), "a temporary file was left behind"


def test_feedback_names_hidden_tests_without_revealing_them(graded):
    feedback = graded["out"] / "feedback" / LAB_NAME
    assert sorted(p.stem for p in feedback.iterdir()) == sorted(r["student"] for r in graded["results"])
    every = "".join(p.read_text() for p in feedback.iterdir())
    assert SECRET not in every and "0x3F808001 must round up" not in every and "test_q2_tie" not in every
    bob = (feedback / "bob.md").read_text()
    assert "Score: **2 / 5**" in bob
    assert "* `q1 - 1`: passed" in bob
    assert "* `q2 - 1`: failed" in bob and "truncates instead of rounding (0x3F808001 -> 0x3F80" in bob
    assert "* hidden test `q2 - 2`: failed" in bob
    assert "* hidden test `q2 - 2`: passed" in (feedback / "alice.md").read_text()
    grace = (feedback / "grace.md").read_text()
    assert "cell 7 ran longer than 15 s of CPU time and was stopped there" in grace and "## q2: 3 / 3" in grace
    assert "q2: fp32_to_bf16 (your kernel's launcher): out-of-bounds tl.load" in (feedback / "oscar.md").read_text()


def test_a_rerun_grades_nothing_twice_and_force_regrades(graded, monkeypatch):
    before = (graded["out"] / "scores.csv").read_text()

    def must_not_run(*args, **kwargs):
        raise AssertionError("an already graded submission was run again")

    monkeypatch.setattr(command, "run_isolated", must_not_run)
    again = grade.grade([SUBMISSIONS], graded["out"], labs=_labs(), limits=grade.Limits(**LIMITS), progress=False)
    assert again == graded["results"]
    assert (graded["out"] / "scores.csv").read_text() == before

    ran = []
    monkeypatch.setattr(command, "run_isolated", lambda sub, *a: ran.append(sub.student) or _fake(sub))
    grade.grade(
        [SUBMISSIONS / "bob_00_bf16_rounding.ipynb"],
        graded["out"],
        labs=_labs(),
        limits=grade.Limits(**LIMITS),
        force=True,
        progress=False,
    )
    assert ran == ["bob"]


def _fake(sub, status="ok"):
    return {
        "student": sub.student,
        "lab": sub.lab,
        "lab_from": sub.lab_from,
        "submission": str(sub.path),
        "sha256": sub.sha256,
        "status": status,
        "flags": [],
        "notes": [],
        "total": 1.0,
        "possible": 5.0,
        "questions": {"q1": {"points": 1.0, "possible": 2.0, "cases": [], "note": ""}},
        "seconds": 0.0,
        "log_tail": "",
    }


def test_an_interrupted_run_loses_nothing(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ["ann", "ben", "cat"]:
        shutil.copy(LAB, subs / f"{name}_{LAB_NAME}.ipynb")
        (subs / f"{name}_{LAB_NAME}.ipynb").write_text(LAB.read_text().replace("Lab 0", f"Lab 0 ({name})"))
    out = tmp_path / "out"
    calls = []

    def interrupted(sub, *args):
        calls.append(sub.student)
        if sub.student == "ben":
            raise KeyboardInterrupt
        return _fake(sub)

    monkeypatch.setattr(command, "run_isolated", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grade.grade([subs], out, labs=_labs(), jobs=1, limits=grade.Limits(**LIMITS), progress=False)
    # what finished before the interruption is on disk (cat may or may not have started), ben is not
    stored = [r["student"] for r in _rows(out / "scores.csv")]
    assert stored[0] == "ann" and "ben" not in stored
    assert len(list((out / "results").glob("*.json"))) == len(stored) and not list(out.rglob(".*"))

    calls.clear()
    monkeypatch.setattr(command, "run_isolated", lambda sub, *a: calls.append(sub.student) or _fake(sub))
    grade.grade([subs], out, labs=_labs(), jobs=1, limits=grade.Limits(**LIMITS), progress=False)
    assert calls == [s for s in ["ann", "ben", "cat"] if s not in stored]
    assert [r["student"] for r in _rows(out / "scores.csv")] == ["ann", "ben", "cat"]

    # a changed submission is graded again; the same content under another student's name is graded too
    (subs / f"ann_{LAB_NAME}.ipynb").write_text(LAB.read_text())
    shutil.copy(subs / f"cat_{LAB_NAME}.ipynb", subs / f"dan_{LAB_NAME}.ipynb")
    calls.clear()
    grade.grade([subs], out, labs=_labs(), jobs=1, limits=grade.Limits(**LIMITS), progress=False)
    assert sorted(calls) == ["ann", "dan"]


def test_lab_and_student_are_identified(tmp_path):
    labs = {
        "00_bf16_rounding": grade.Lab("00_bf16_rounding", {}, ""),
        "01_formats_encoder": grade.Lab("01_formats_encoder", {}, ""),
    }
    nb = nbformat.read(LAB, as_version=4)
    cases = {
        "alice/00_bf16_rounding.ipynb": ("alice", "00_bf16_rounding", "metadata"),
        "bob-lab01.ipynb": ("bob", "01_formats_encoder", "metadata"),  # metadata wins over the name
        "week1/carol/untitled.ipynb": ("untitled", "00_bf16_rounding", "metadata"),
    }
    for name, want in cases.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nb.metadata["otter"]["assignment_name"] = want[1]
        nbformat.write(nb, path)
        sub = grade.identify(path, labs)
        assert (sub.student, sub.lab, sub.lab_from) == want, name
    del nb.metadata["otter"]
    for name, want in {
        "dave_01_formats_encoder.ipynb": ("dave", "01_formats_encoder"),
        "erin/lab01.ipynb": ("erin", "01_formats_encoder"),
        "lab00/frank.ipynb": ("frank", "00_bf16_rounding"),
        "grace.ipynb": ("grace", None),
    }.items():
        path = tmp_path / "plain" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        sub = grade.identify(path, labs)
        assert (sub.student, sub.lab) == want, name
        assert sub.lab_from == ("file name" if want[1] else "")


def test_unknown_lab_is_a_status(tmp_path):
    nb = nbformat.read(LAB, as_version=4)
    del nb.metadata["otter"]
    nbformat.write(nb, tmp_path / "someone.ipynb")
    results = grade.grade([tmp_path / "someone.ipynb"], tmp_path / "out", labs=_labs(), progress=False)
    assert [(r["student"], r["status"], r["total"]) for r in results] == [("someone", "unknown-lab", 0.0)]


def test_the_real_labs_carry_their_tests():
    labs = grade.load_labs()
    assert {"00_bf16_rounding", "01_formats_encoder"} <= set(labs)
    assert labs["00_bf16_rounding"].questions == ["q1", "q2"]
    assert labs["01_formats_encoder"].questions == ["q1", "q2", "q3", "q4"]
    assert all(lab.source.startswith((f"labs/{name}.ipynb", f"solutions/{name}.ipynb")) for name, lab in labs.items())


def test_the_real_labs_carry_hidden_tests():
    lab = grade.load_labs(ROOT / "labs", ROOT / "solutions")["00_bf16_rounding"]
    assert lab.source == "labs/00_bf16_rounding.ipynb + hidden_tests/00_bf16_rounding/"
    assert [row[:4] for row in lab.summary()] == [("q1", 2.0, 1, 1), ("q2", 3.0, 1, 1)]
    assert str(ROOT / "solutions") in lab.secret


HIDDEN_FILE = """from otter.test_files import test_case

name = "q1"


@test_case(name="q1 hidden: twice", hidden=True)
def test_twice(round_bf16_bits):
    assert round_bf16_bits is not None
"""


@pytest.mark.parametrize(
    "file, text, error",
    [
        ("q1.py", HIDDEN_FILE, None),
        ("q9.py", HIDDEN_FILE.replace('"q1"', '"q9"'), "00_bf16_rounding has no question 'q9'"),
        ("q2.py", HIDDEN_FILE, "q2.py must set name = 'q2', got 'q1'"),
        ("q1.py", HIDDEN_FILE.replace('name = "q1"', 'name = "q1"\npoints = 5'), "must not set points"),
        ("q1.py", HIDDEN_FILE.replace("hidden=True", "hidden=False"), "is not hidden=True"),
        ("q1.py", HIDDEN_FILE.replace('name="q1 hidden: twice", ', ""), "give each hidden test a name"),
        ("q1.py", HIDDEN_FILE.replace("(round_bf16_bits)", "(round_bf16_bits, x)"), "takes ['x']"),
        ("q1.py", 'name = "q1"\n', "defines no @test_case"),
    ],
)
def test_a_hidden_test_file_is_checked_before_it_grades(tmp_path, file, text, error):
    folder = tmp_path / grade.HIDDEN_TESTS / LAB_NAME
    folder.mkdir(parents=True)
    (folder / file).write_text(text)
    public = grade.lab_tests(LAB)
    if error is None:
        merged = grade.with_hidden(public, grade.hidden_tests(tmp_path, LAB_NAME, public))
        assert merged["q2"] == public["q2"] and merged["q1"].startswith(public["q1"].rstrip())
        labs = grade.load_labs(ROOT / "labs", tmp_path)
        assert [row[:4] for row in labs[LAB_NAME].summary()] == [("q1", 2.0, 1, 1), ("q2", 3.0, 1, 0)]
        return
    with pytest.raises(ValueError, match=re.escape(error)):
        grade.hidden_tests(tmp_path, LAB_NAME, public)


def test_bad_arguments_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        grade.main([str(tmp_path / "missing.ipynb")])
    assert "submissions: no such file(s) or folder(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grade.main([str(tmp_path), "--timeout", "0"])
    assert "--timeout must be positive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="holds no otter tests"):
        grade.lab_tests(ROOT / "book" / "00_preface.ipynb")
    with pytest.raises(ValueError, match="lab: unknown lab 'lab99'"):
        grade.grade([tmp_path], tmp_path / "out", labs=_labs(), lab="lab99", progress=False)


# -- self-paced readers: grader.check and check-all in the notebook give the batch grader's verdicts ---


def _self_paced(submission: Path, workdir: Path) -> dict:
    """Run a submission as a reader would (Jupyter kernel, the notebook's own grader); return
    {question: (passed, text)} from its grader.check cells and from its check-all cell."""
    import nbclient

    path = workdir / f"{LAB_NAME}.ipynb"
    shutil.copy(submission, path)
    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(workdir)}}
    nbclient.NotebookClient(nb, timeout=300, allow_errors=True, resources=resources).execute()
    single, every = {}, {}
    for cell in nb.cells:
        text = "".join(o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []))
        m = re.fullmatch(r'grader\.check\("(q\d+)"\)', cell.source.strip())
        if m:
            single[m.group(1)] = text
        elif cell.source.strip() == "grader.check_all()":
            for q, block in re.findall(r"^(q\d+) results:(.*?)(?=^q\d+ results:|\Z)", text, flags=re.M | re.S):
                every[q] = block
    return single, every


@pytest.mark.parametrize("student", ["bob", "erin"])
def test_self_paced_checks_agree_with_the_batch_grader(graded, student, tmp_path):
    submission = SUBMISSIONS / f"{student}_{LAB_NAME}.ipynb"
    single, every = _self_paced(submission, tmp_path)
    result = next(r for r in graded["results"] if r["student"] == student)
    assert set(single) == set(every) == set(result["questions"]) == {"q1", "q2"}
    for q, batch in result["questions"].items():
        public = [c for c in batch["cases"] if not c["hidden"]]
        passed = all(c["passed"] for c in public)
        for text in (single[q], every[q]):
            assert ("All test cases passed!" in text) == passed, f"{student} {q}: {text[:300]}"
            for case in public:
                if not case["passed"]:  # the same diagnosis, word for word
                    assert diagnosis(case["message"]).splitlines()[0] in text


def test_a_failing_judge_is_the_graders_error_on_its_own_row(tmp_path, monkeypatch):
    """If the judge cannot be started, the row says it is the grader's fault, and the run goes on."""

    def broken(self, tests, fds):
        raise RuntimeError("the judge server has stopped: simulated")

    monkeypatch.setattr(JudgeServer, "start", broken)
    sample = SUBMISSIONS / "bob_00_bf16_rounding.ipynb"
    results = grade.grade([sample], tmp_path / "out", labs=_labs(), limits=grade.Limits(**LIMITS), progress=False)
    assert [(r["status"], r["total"]) for r in results] == [("grader-error", 0)]
    assert "the grader's fault" in results[0]["notes"][0]
    assert (tmp_path / "out" / "scores.csv").is_file()
