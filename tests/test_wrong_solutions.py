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
"""

import contextlib
import functools
import importlib.util
import io
from pathlib import Path

import nbformat
import pytest
from otter.test_files.exception_test import ExceptionTestFile

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def lab_questions(lab: Path) -> dict:
    """{question: otter test source} from a generated lab's metadata."""
    return dict(nbformat.read(lab, as_version=4).metadata["otter"]["tests"])


def check_tests_path(lab: Path) -> Path:
    return ROOT / "tests" / f"test_checks_lab{lab.stem.split('_', 1)[0]}.py"


@functools.cache
def load_check_tests(path: Path):
    """The lab's check-test module, imported from its file (under a name of its own)."""
    spec = importlib.util.spec_from_file_location(f"_wrong_solutions_of_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases():
    cases = []
    for lab in LABS:
        path = check_tests_path(lab)
        if not path.is_file():
            continue  # test_every_question_has_wrong_solutions fails for it
        wrongs = getattr(load_check_tests(path), "WRONG_SOLUTIONS", {})
        for question in lab_questions(lab):
            for name in wrongs.get(question) or {}:
                cases.append(pytest.param(lab, question, name, id=f"{lab.stem}-{question}-{name}"))
    return cases


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
    arguments = [a for a in test_file.test_cases[0].body._get_func_params() if a != "env"]
    if isinstance(wrong, dict):
        env = wrong
    elif isinstance(wrong, tuple) and len(wrong) == len(arguments) > 1:
        env = dict(zip(arguments, wrong, strict=True))  # in the order the question's test takes them
    elif len(arguments) == 1:
        env = {arguments[0]: wrong}
    else:
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
