"""Grade submitted lab notebooks with otter-grader, offline and without Docker.

    python -m kernels.grade labs/00_bf16_rounding.ipynb submissions/*.ipynb [--csv scores.csv]

The lab notebook carries its tests in its metadata (written by ``python -m kernels.labgen``); each
submission is executed top to bottom in a scratch folder and scored question by question with the
same ``kernels.checks`` functions the students ran.  Submissions run as ordinary Python on this
machine: grade them in a throwaway account or container if you do not trust them.
"""

import argparse
import csv
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat


@dataclass
class Score:
    submission: str
    earned: float = 0.0
    possible: float = 0.0
    questions: dict = field(default_factory=dict)  # name -> (earned, possible)
    error: str = ""


def lab_tests(lab: Path) -> dict:
    """{question name: otter test source} stored in a generated lab's metadata."""
    nb = nbformat.read(lab, as_version=4)
    try:
        return dict(nb.metadata["otter"]["tests"])
    except KeyError:
        raise ValueError(f"lab {lab} holds no otter tests in its metadata; pass a notebook from labs/") from None


def grade_one(submission: Path, tests: dict, workdir: Path) -> Score:
    """Run ``submission`` in ``workdir`` and score it against ``tests``."""
    from otter.execute import grade_notebook

    tests_dir = workdir / "tests"
    tests_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, source in tests.items():
        path = tests_dir / f"{name}.py"
        path.write_text(source)
        paths.append(str(path))
    copy = workdir / submission.name
    shutil.copy(submission, copy)
    score = Score(str(submission))
    try:
        results = grade_notebook(str(copy), tests_glob=paths, test_dir=str(tests_dir), cwd=str(workdir))
    except Exception as exc:  # noqa: BLE001 - a broken submission scores 0 and grading goes on
        score.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        score.possible = float(len(tests))
        return score
    score.earned, score.possible = float(results.total), float(results.possible)
    for name, result in results.results.items():
        score.questions[name] = (float(result.score), float(result.possible))
    return score


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.grade", description=__doc__.splitlines()[0])
    parser.add_argument("lab", type=Path, help="the generated lab notebook (labs/NN_name.ipynb)")
    parser.add_argument("submissions", type=Path, nargs="+", help="submitted notebooks")
    parser.add_argument("--csv", type=Path, help="also write the scores to this CSV file")
    args = parser.parse_args(argv)
    if not args.lab.is_file():
        parser.error(f"lab: no such notebook {args.lab}")
    missing = [str(s) for s in args.submissions if not s.is_file()]
    if missing:
        parser.error(f"submissions: no such file(s): {', '.join(missing)}")
    tests = lab_tests(args.lab)
    scores = []
    for sub in args.submissions:
        with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
            score = grade_one(sub, tests, Path(tmp))
        scores.append(score)
        detail = "  ".join(f"{q} {e:g}/{p:g}" for q, (e, p) in sorted(score.questions.items()))
        print(f"{sub}: {score.earned:g}/{score.possible:g}  {detail}{'  ERROR ' + score.error if score.error else ''}")
    if args.csv:
        names = sorted(tests)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["submission", "earned", "possible", *names, "error"])
            for s in scores:
                writer.writerow(
                    [s.submission, s.earned, s.possible, *(s.questions.get(n, (0.0, 0.0))[0] for n in names), s.error]
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
