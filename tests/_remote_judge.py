"""Every right and wrong solution of one lab, judged the way the batch grader judges a submission.

    python tests/_remote_judge.py 00_bf16_rounding     # prints one JSON list of verdicts

The solutions of ``tests/test_checks_labNN.py`` (``STUDENT_SOLUTIONS``, ``WRONG_SOLUTIONS``,
``HIDDEN_CATCHES``) live in a second process, served by :func:`kernels.grade.rpc.serve` as a sandbox
serves a notebook's names; this process runs the question's otter test against
:class:`kernels.grade.rpc.Remote` proxies of them, as the grader's judge does.  Both run in CPU mode,
as the grader does on any machine.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SEP = "\x1f"
TABLES = ("STUDENT_SOLUTIONS", "WRONG_SOLUTIONS", "HIDDEN_CATCHES")


def _modules():
    sys.path.insert(0, str(HERE))
    import test_wrong_solutions as W

    return W


def serve(lab_stem: str, in_fd: int, out_fd: int):
    from kernels.grade import rpc as grade_rpc

    W = _modules()
    lab = ROOT / "labs" / f"{lab_stem}.ipynb"
    module = W.load_check_tests(W.check_tests_path(lab))
    solutions = {}
    for table in TABLES:
        for question, named in getattr(module, table, {}).items():
            for name, value in named.items():
                solutions[SEP.join((table, question, name))] = value
    sys.stdout = sys.stderr  # what the solutions print must not reach the answers
    grade_rpc.serve(in_fd, out_fd, {"solutions": solutions}, ["solutions"])


def judge(lab_stem: str) -> list:
    from otter.test_files.exception_test import ExceptionTestFile

    from kernels.grade import rpc as grade_rpc

    W = _modules()
    tests = W.lab_questions(ROOT / "labs" / f"{lab_stem}.ipynb")
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", lab_stem, str(requests_r), str(answers_w)],
        pass_fds=(requests_r, answers_w),
        env=os.environ,
        stdout=subprocess.DEVNULL,
    )
    os.close(requests_r)
    os.close(answers_w)
    client = grade_rpc.Client(answers_r, requests_w)
    verdicts = []
    try:
        served = client.hello()["solutions"]
        for key, value in served.items():
            table, question, name = key.split(SEP)
            test_file = ExceptionTestFile.from_string(tests[question], path=question)
            env = W._otter_env(test_file, value)
            if env is None:  # one part of a several-part answer: judged in the notebook's process only
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                test_file.run(env)
            verdicts.append(
                {
                    "table": table,
                    "question": question,
                    "name": name,
                    "score": float(test_file.score),
                    "possible": float(test_file.possible),
                    "messages": [r.message for r in test_file.test_case_results if not r.passed],
                }
            )
    finally:
        os.close(requests_w)
        server.wait(timeout=60)
        os.close(answers_r)
    return verdicts


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        print(json.dumps(judge(sys.argv[1])))
