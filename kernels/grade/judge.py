"""The judge: the process that scores a submission and never runs a line of it.  :func:`judge_server`
(``python -m kernels.grade --judge-server FD``, started once per run by
:class:`kernels.grade.isolation.JudgeServer`) imports :data:`JUDGE_MODULES` and the labs' checks once,
then forks a fresh judge for every submission, which runs the lab's otter tests against
:class:`kernels.grade.rpc.Remote` proxies of the sandbox's graded names and reports each case's verdict:
the only source of scores.
"""

from __future__ import annotations

import json
import os
import re
import signal

from kernels.grade.child import describe_error
from kernels.grade.labs import natural

__all__ = ["JUDGE_MODULES", "judge_server"]


JUDGE_MODULES = ("otter.test_files.exception_test", "kernels", "kernels.checks", "kernels.grade.rpc")


def judge_server(fd: int) -> int:
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


def _judge(tests: dict, events_fd: int, answers_fd: int, requests_fd: int) -> int:
    """The judge of one submission: runs the lab's otter tests against the sandbox's graded names, as
    :class:`kernels.grade.rpc.Remote` proxies.  It never runs student code; its events on ``events_fd``
    are the only source of scores."""

    def emit(**event):
        os.write(events_fd, (json.dumps(event, default=str) + "\n").encode())

    try:
        from otter.test_files.exception_test import ExceptionTestFile

        import kernels  # noqa: F401
        import kernels.checks  # noqa: F401
        from kernels.grade import rpc

        client = rpc.Client(answers_fd, requests_fd)
    except BaseException as e:  # noqa: BLE001
        emit(event="judge-error", error=f"{type(e).__name__}: {e}"[:500])
        return 1
    try:
        ns = client.hello()
    except rpc.ProtocolError as e:
        emit(event="sandbox-gone", question=None, error=str(e)[:500])
        emit(event="done")
        return 0
    emit(event="served", names=sorted(ns))
    for name, value in sorted(ns.items()):  # the package's own code handed in as the answer
        info = rpc.remote_info(value)
        module = info.get("module")
        if module and (module == "kernels" or module.startswith("kernels.")):
            emit(event="package-code", name=name, what=f"{module}.{info.get('qualname') or ''}".rstrip("."))
    for q in sorted(tests, key=natural):
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
                **describe_error(e),
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
