"""The labs and their tests: :func:`load_labs` (every lab of ``labs/`` as a :class:`Lab`, with the hidden
tests from ``solutions/``), :func:`lab_tests` (the public tests a generated lab carries in its metadata),
:func:`hidden_tests` and :func:`with_hidden` (the hidden test files of ``solutions/hidden_tests/``, checked,
and merged into one test per question), and :func:`natural` (names in natural order: ``q2`` before ``q10``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
from pathlib import Path

from kernels.grade.config import ROOT

__all__ = ["HIDDEN_TESTS", "Lab", "hidden_tests", "lab_tests", "load_labs", "natural", "with_hidden"]


@dataclasses.dataclass
class Lab:
    name: str  # "00_bf16_rounding"
    tests: dict  # question -> otter exception-test source
    source: str  # where the tests came from, for the report
    secret: tuple = ()  # folders no submission may read (where the hidden tests came from)

    @property
    def questions(self) -> list:
        return sorted(self.tests, key=natural)

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


def natural(s: str):
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
    for path in sorted(folder.glob("*.py"), key=lambda p: natural(p.stem)):
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
    from kernels.authoring import labgen

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
