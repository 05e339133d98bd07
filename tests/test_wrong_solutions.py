"""Every exercise of every lab has deliberately wrong solutions, and each loses points in the grader.

For each lab in ``labs/``, the otter questions are read from the notebook's metadata (what
``grader.check`` and ``python -m kernels.grade`` run).  ``tests/test_checks_labNN.py`` must define
``WRONG_SOLUTIONS = {"q1": {"description": wrong_fn, ...}, ...}`` with a non-empty set for every
question: a lab without that file, or a question without a set, fails here.  Then every wrong
solution is run through the question's own otter test, exactly as the grader scores a student, and
must score less than full marks (kill rate 100%).  Whether each is caught *with the right diagnosis*
is the business of the lab's own test file, which asserts on the message.

A wrong solution is the value the question's test takes as its one argument (the student's
function); for a test with several arguments it is a tuple in the order the test takes them, or a
dict ``{argument name: value}``; anything else (one wrong part of a several-part answer) is judged by
the lab's own ``CHECKS[question]``, which must reject it.

The other half is symmetric: the same file must define ``STUDENT_SOLUTIONS`` in the same shape, at
least two right solutions per question, written the ways different students would write them (not
the lab's own solution), and each one, run through the question's otter test as the grader scores a
student, must get full marks: a check that rejects a right answer is as wrong as one that passes a
wrong one.  A right solution is always a whole answer (a function, a tuple or a dict as above).
"""

import contextlib
import functools
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from otter.test_files.exception_test import ExceptionTestFile

from kernels import grade

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def public_questions(lab: Path) -> dict:
    """{question: otter test source} from a generated lab's metadata: the public tests only."""
    return dict(nbformat.read(lab, as_version=4).metadata["otter"]["tests"])


@functools.cache
def lab_questions(lab: Path) -> dict:
    """{question: otter test source}, public and hidden (``solutions/hidden_tests/``), as the grader has them."""
    public = public_questions(lab)
    return grade.with_hidden(public, grade.hidden_tests(ROOT / "solutions", lab.stem, public))


def check_tests_path(lab: Path) -> Path:
    return ROOT / "tests" / f"test_checks_lab{lab.stem.split('_', 1)[0]}.py"


@functools.cache
def load_check_tests(path: Path):
    """The lab's check-test module, imported from its file (under a name of its own)."""
    spec = importlib.util.spec_from_file_location(f"_wrong_solutions_of_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases(table: str = "WRONG_SOLUTIONS"):
    cases = []
    for lab in LABS:
        path = check_tests_path(lab)
        if not path.is_file():
            continue  # test_every_question_has_wrong_solutions (or _student_solutions) fails for it
        solutions = getattr(load_check_tests(path), table, {})
        if not isinstance(solutions, dict):
            continue
        for question in lab_questions(lab):
            named = solutions.get(question)
            for name in named if isinstance(named, dict) else {}:
                cases.append(pytest.param(lab, question, name, id=f"{lab.stem}-{question}-{name}"))
    return cases


def _otter_env(test_file, solution) -> dict | None:
    """The environment the question's otter test runs in, with ``solution`` where the student's
    notebook would define its arguments; None if ``solution`` is one part of a several-part answer."""
    arguments = [a for a in test_file.test_cases[0].body._get_func_params() if a != "env"]
    if isinstance(solution, dict):
        return solution
    if isinstance(solution, tuple) and len(solution) == len(arguments) > 1:
        return dict(zip(arguments, solution, strict=True))  # in the order the question's test takes them
    if len(arguments) == 1:
        return {arguments[0]: solution}
    return None


def test_there_are_labs():
    assert [lab.stem for lab in LABS][:2] == ["00_bf16_rounding", "01_formats_encoder"]


def wrong_solution_problems(lab: Path, tests_dir: Path = ROOT / "tests") -> list:
    """What is missing or malformed in the wrong-solution set of ``lab`` (empty when all is well)."""
    questions = lab_questions(lab)
    if not questions:
        return [f"labs/{lab.name} has no otter questions in its metadata"]
    path = tests_dir / check_tests_path(lab).name
    if not path.is_file():
        return [
            f"labs/{lab.name} has questions {sorted(questions)} but tests/{path.name} is missing: it must define "
            f"WRONG_SOLUTIONS with deliberately wrong solutions for each question"
        ]
    wrongs = getattr(load_check_tests(path), "WRONG_SOLUTIONS", None)
    if not isinstance(wrongs, dict):
        return [f"tests/{path.name} defines no WRONG_SOLUTIONS dict at module level"]
    problems = []
    missing = [q for q in questions if not wrongs.get(q)]
    if missing:
        problems.append(f"tests/{path.name}: WRONG_SOLUTIONS has no wrong solutions for {missing}")
    unknown = sorted(set(wrongs) - set(questions))
    if unknown:
        problems.append(f"tests/{path.name}: WRONG_SOLUTIONS names {unknown}, not questions of {lab.stem}")
    for q in questions:
        if not isinstance(wrongs.get(q, {}), dict):
            problems.append(f"WRONG_SOLUTIONS[{q!r}] must map descriptions to wrong solutions")
            continue
        for name, wrong in wrongs.get(q, {}).items():
            if not (isinstance(name, str) and name):
                problems.append(f"WRONG_SOLUTIONS[{q!r}]: describe each wrong solution with a string")
            if wrong is None or wrong is Ellipsis:
                problems.append(f"WRONG_SOLUTIONS[{q!r}][{name!r}] is a stub")
    return problems


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_every_question_has_wrong_solutions(lab):
    assert wrong_solution_problems(lab) == []


def test_a_missing_set_fails(tmp_path):
    lab = ROOT / "labs" / "00_bf16_rounding.ipynb"
    assert "tests/test_checks_lab00.py is missing" in wrong_solution_problems(lab, tmp_path)[0]
    (tmp_path / "test_checks_lab00.py").write_text("WRONG_SOLUTIONS = {'q1': {'truncates': lambda b: b >> 16}}\n")
    assert wrong_solution_problems(lab, tmp_path) == [
        "tests/test_checks_lab00.py: WRONG_SOLUTIONS has no wrong solutions for ['q2']"
    ]
    load_check_tests.cache_clear()
    (tmp_path / "test_checks_lab00.py").write_text("WRONG_SOLUTIONS = {'q1': {'x': None}, 'q2': {}, 'q9': {'y': 1}}\n")
    assert wrong_solution_problems(lab, tmp_path) == [
        "tests/test_checks_lab00.py: WRONG_SOLUTIONS has no wrong solutions for ['q2']",
        "tests/test_checks_lab00.py: WRONG_SOLUTIONS names ['q9'], not questions of 00_bf16_rounding",
        "WRONG_SOLUTIONS['q1']['x'] is a stub",
    ]
    load_check_tests.cache_clear()
    (tmp_path / "test_checks_lab00.py").write_text("wrong_solutions = {}\n")
    assert wrong_solution_problems(lab, tmp_path) == [
        "tests/test_checks_lab00.py defines no WRONG_SOLUTIONS dict at module level"
    ]
    load_check_tests.cache_clear()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lab, question, name", _cases())
def test_each_wrong_solution_loses_points(lab, question, name):
    test_file = ExceptionTestFile.from_string(lab_questions(lab)[question], path=question)
    wrong = load_check_tests(check_tests_path(lab)).WRONG_SOLUTIONS[question][name]
    env = _otter_env(test_file, wrong)
    if env is None:
        arguments = [a for a in test_file.test_cases[0].body._get_func_params() if a != "env"]
        # A wrong part of a multi-part answer (one of the functions a question's test takes): the lab's
        # own CHECKS[question] knows how to judge it alone.
        checks = getattr(load_check_tests(check_tests_path(lab)), "CHECKS", {})
        assert question in checks, (
            f"{question}'s test takes {arguments}: give WRONG_SOLUTIONS[{question!r}][{name!r}] as a tuple in that "
            f"order, or a dict {{argument name: value}}, or define CHECKS[{question!r}] that judges it"
        )
        with pytest.raises(AssertionError) as info, contextlib.redirect_stdout(io.StringIO()):
            checks[question](wrong)
        assert type(info.value).__name__ != "ExerciseNotDone", f"{name!r} is read as 'not done yet', not as wrong"
        return
    with contextlib.redirect_stdout(io.StringIO()):
        test_file.run(env)
    assert test_file.possible > 0, f"{question} is worth no points"
    assert test_file.score < test_file.possible, f"{lab.stem} {question}: {name!r} got full marks from the lab's test"
    failed = [r.message for r in test_file.test_case_results if not r.passed]
    assert not any("ExerciseNotDone" in m for m in failed), f"{name!r} is read as 'not done yet', not as wrong"


# -- the symmetric demand: right solutions written the ways students write them get full marks ----------

MIN_STUDENT_SOLUTIONS = 2


def student_solution_problems(lab: Path, tests_dir: Path = ROOT / "tests") -> list:
    """What is missing or malformed in the right-solution set of ``lab`` (empty when all is well)."""
    questions = lab_questions(lab)
    if not questions:
        return [f"labs/{lab.name} has no otter questions in its metadata"]
    path = tests_dir / check_tests_path(lab).name
    want = f"at least {MIN_STUDENT_SOLUTIONS} right solutions, written the ways students write them, for each question"
    if not path.is_file():
        return [
            f"labs/{lab.name} has questions {sorted(questions)} but tests/{path.name} is missing: it must define "
            f"STUDENT_SOLUTIONS with {want}"
        ]
    rights = getattr(load_check_tests(path), "STUDENT_SOLUTIONS", None)
    if not isinstance(rights, dict):
        return [
            f"tests/{path.name} defines no STUDENT_SOLUTIONS dict at module level: {lab.stem} questions "
            f"{sorted(questions)} lack right solutions ({want})"
        ]
    problems = []
    few = {q: len(rights[q]) if isinstance(rights.get(q), dict) else 0 for q in questions}
    few = {q: n for q, n in few.items() if n < MIN_STUDENT_SOLUTIONS}
    if few:
        counts = ", ".join(f"{q} has {n}" for q, n in few.items())
        problems.append(
            f"tests/{path.name}: STUDENT_SOLUTIONS of {lab.stem} lacks right solutions for {sorted(few)} "
            f"({counts}; want at least {MIN_STUDENT_SOLUTIONS} each)"
        )
    unknown = sorted(set(rights) - set(questions))
    if unknown:
        problems.append(f"tests/{path.name}: STUDENT_SOLUTIONS names {unknown}, not questions of {lab.stem}")
    for q in questions:
        if not isinstance(rights.get(q, {}), dict):
            problems.append(f"STUDENT_SOLUTIONS[{q!r}] of {lab.stem} must map descriptions to right solutions")
            continue
        for name, right in rights.get(q, {}).items():
            if not (isinstance(name, str) and name):
                problems.append(f"STUDENT_SOLUTIONS[{q!r}] of {lab.stem}: describe each right solution with a string")
            if right is None or right is Ellipsis:
                problems.append(f"STUDENT_SOLUTIONS[{q!r}][{name!r}] of {lab.stem} is a stub")
    return problems


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_every_question_has_student_solutions(lab):
    assert student_solution_problems(lab) == []


def test_a_missing_student_set_fails(tmp_path):
    lab = ROOT / "labs" / "00_bf16_rounding.ipynb"
    assert "tests/test_checks_lab00.py is missing" in student_solution_problems(lab, tmp_path)[0]
    (tmp_path / "test_checks_lab00.py").write_text(
        "STUDENT_SOLUTIONS = {'q1': {'a': abs, 'b': abs}, 'q2': {'c': abs}}\n"
    )
    assert student_solution_problems(lab, tmp_path) == [
        "tests/test_checks_lab00.py: STUDENT_SOLUTIONS of 00_bf16_rounding lacks right solutions for ['q2'] "
        "(q2 has 1; want at least 2 each)"
    ]
    load_check_tests.cache_clear()
    (tmp_path / "test_checks_lab00.py").write_text(
        "STUDENT_SOLUTIONS = {'q1': {'x': None, 'y': abs}, 'q9': {'z': abs}}\nWRONG_SOLUTIONS = {}\n"
    )
    assert student_solution_problems(lab, tmp_path) == [
        "tests/test_checks_lab00.py: STUDENT_SOLUTIONS of 00_bf16_rounding lacks right solutions for ['q2'] "
        "(q2 has 0; want at least 2 each)",
        "tests/test_checks_lab00.py: STUDENT_SOLUTIONS names ['q9'], not questions of 00_bf16_rounding",
        "STUDENT_SOLUTIONS['q1']['x'] of 00_bf16_rounding is a stub",
    ]
    load_check_tests.cache_clear()
    (tmp_path / "test_checks_lab00.py").write_text("WRONG_SOLUTIONS = {}\n")
    assert student_solution_problems(lab, tmp_path)[0].startswith(
        "tests/test_checks_lab00.py defines no STUDENT_SOLUTIONS dict at module level: 00_bf16_rounding questions "
        "['q1', 'q2'] lack right solutions (at least 2"
    )
    load_check_tests.cache_clear()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lab, question, name", _cases("STUDENT_SOLUTIONS"))
def test_each_student_solution_gets_full_marks(lab, question, name):
    test_file = ExceptionTestFile.from_string(lab_questions(lab)[question], path=question)
    right = load_check_tests(check_tests_path(lab)).STUDENT_SOLUTIONS[question][name]
    env = _otter_env(test_file, right)
    arguments = [a for a in test_file.test_cases[0].body._get_func_params() if a != "env"]
    assert env is not None, (
        f"{lab.stem} {question}'s test takes {arguments}: give STUDENT_SOLUTIONS[{question!r}][{name!r}] as a "
        f"tuple in that order, or a dict {{argument name: value}}: a right solution is a whole answer"
    )
    with contextlib.redirect_stdout(io.StringIO()):
        test_file.run(env)
    assert test_file.possible > 0, f"{question} is worth no points"
    failed = [r.message for r in test_file.test_case_results if not r.passed]
    assert test_file.score == test_file.possible and not failed, (
        f"{lab.stem} {question}: the right solution {name!r} got {test_file.score} of {test_file.possible} "
        f"points from the lab's test:\n" + "\n".join(failed)
    )


# -- hidden tests: every question has one, and each checks something its public test does not --------------


def _hidden_count(source: str, question: str) -> int:
    return sum(c.hidden for c in ExceptionTestFile.from_string(source, path=question).test_cases)


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_every_question_has_a_hidden_test(lab):
    merged = lab_questions(lab)
    assert set(merged) == set(public_questions(lab))
    bare = [q for q, source in merged.items() if _hidden_count(source, q) < 1]
    assert not bare, f"{lab.stem}: {bare} have no hidden test in solutions/{grade.HIDDEN_TESTS}/{lab.stem}/"
    shown = [q for q, source in public_questions(lab).items() if _hidden_count(source, q)]
    assert not shown, f"labs/{lab.name} carries hidden tests of {shown}: students would see them"


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_every_hidden_test_has_a_catch(lab):
    """``HIDDEN_CATCHES`` (in ``tests/test_checks_labNN.py``, shaped like ``WRONG_SOLUTIONS``) holds, for every
    question, wrong solutions that its public test passes and its hidden test does not."""
    catches = getattr(load_check_tests(check_tests_path(lab)), "HIDDEN_CATCHES", None)
    assert isinstance(catches, dict), f"{check_tests_path(lab).name} defines no HIDDEN_CATCHES dict"
    missing = [q for q in public_questions(lab) if not catches.get(q)]
    assert not missing, f"HIDDEN_CATCHES of {lab.stem} has nothing for {missing}"
    unknown = sorted(set(catches) - set(public_questions(lab)))
    assert not unknown, f"HIDDEN_CATCHES of {lab.stem} names {unknown}, not questions of the lab"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lab, question, name", _cases("HIDDEN_CATCHES"))
def test_each_hidden_catch_passes_the_public_test_and_fails_a_hidden_one(lab, question, name):
    wrong = load_check_tests(check_tests_path(lab)).HIDDEN_CATCHES[question][name]
    public = ExceptionTestFile.from_string(public_questions(lab)[question], path=question)
    env = _otter_env(public, wrong)
    assert env is not None, f"HIDDEN_CATCHES[{question!r}][{name!r}] must be a whole answer"
    with contextlib.redirect_stdout(io.StringIO()):
        public.run(env)
    failed = [r.message for r in public.test_case_results if not r.passed]
    assert public.score == public.possible and not failed, (
        f"{lab.stem} {question}: {name!r} does not pass the public test, so it shows nothing about the hidden "
        "one:\n" + "\n".join(failed)
    )
    merged = ExceptionTestFile.from_string(lab_questions(lab)[question], path=question)
    with contextlib.redirect_stdout(io.StringIO()):
        merged.run(env)
    failed = [r for r in merged.test_case_results if not r.passed]
    assert merged.score < merged.possible and failed, f"{lab.stem} {question}: {name!r} passed the hidden test too"
    assert all(r.test_case.hidden for r in failed)
    assert not any("ExerciseNotDone" in r.message for r in failed), f"{name!r} is read as 'not done yet'"


# -- the same verdicts through the batch grader's judge ---------------------------------------------------


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_the_graders_judge_gives_every_solution_the_same_verdict(lab):
    """The grader runs the checks in a judge process that holds only proxies of the student's objects
    (kernels.grade.rpc): every right solution still gets full marks there and every wrong one loses
    points, with a diagnosis, not a failure of the proxies.  Run as the grader runs, in CPU mode."""
    env = {**os.environ, "KERNELS_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_remote_judge.py"), lab.stem],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout)
    module = load_check_tests(check_tests_path(lab))
    judged = {(v["table"], v["question"], v["name"]) for v in verdicts}
    for table in ("STUDENT_SOLUTIONS", "WRONG_SOLUTIONS", "HIDDEN_CATCHES"):
        for question, named in getattr(module, table, {}).items():
            test_file = ExceptionTestFile.from_string(lab_questions(lab)[question], path=question)
            for name, value in named.items():
                if _otter_env(test_file, value) is not None:
                    assert (table, question, name) in judged, f"{table}[{question!r}][{name!r}] was not judged"
    for v in verdicts:
        where = f"{lab.stem} {v['question']} {v['name']!r}"
        if v["table"] == "STUDENT_SOLUTIONS":
            assert v["score"] == v["possible"] > 0, f"{where}: a right solution lost points: {v['messages']}"
        else:
            assert v["score"] < v["possible"], f"{where}: a wrong solution got full marks through the judge"
        for message in v["messages"]:
            for sign in ("ProtocolError", "SandboxGone", "cannot send", "RemoteError"):
                assert sign not in message, f"{where}: the proxies failed, not the solution: {message[-500:]}"
