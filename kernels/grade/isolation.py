"""Isolation of one submission, from the grader's side.  :func:`run_isolated` starts the submission's
sandbox (:mod:`kernels.grade.child`; where :func:`namespaces_available`, in namespaces of its own,
``unshare`` :data:`UNSHARE`, under the init :data:`SANDBOX_INIT`) and its judge
(:mod:`kernels.grade.judge`, forked by the run's :class:`JudgeServer`), under the :class:`Limits`; then
:func:`summarise` turns what they reported into a result: points, status and flags (:func:`not_graded`
for a submission that never runs).  :func:`warm_caches` builds what every sandbox starts with;
:func:`kill_running` stops every sandbox in flight when grading is interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kernels.grade.config import (
    DEFAULT_CELL_S,
    DEFAULT_DISK_MB,
    DEFAULT_MEMORY_GB,
    DEFAULT_OUTPUT_MB,
    DEFAULT_PROCESSES,
    DEFAULT_TIMEOUT_S,
    ROOT,
    STATUS_ORDER,
)
from kernels.grade.labs import Lab
from kernels.grade.submissions import Submission

__all__ = [
    "FORBIDDEN",
    "JudgeServer",
    "Limits",
    "SANDBOX_INIT",
    "UNSHARE",
    "kill_running",
    "namespaces_available",
    "not_graded",
    "run_isolated",
    "summarise",
    "warm_caches",
]


UNSHARE = ("-rmnpf", "--mount-proc")  # user, mount, network and PID namespaces, with the namespace's own /proc
SANDBOX_INIT = Path(__file__).resolve().with_name("sandbox_init.py")  # the namespace's init, run as a script


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


def kill_running():
    with _RUNNING_LOCK:
        for proc in list(_RUNNING):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def warm_caches(scratch: Path) -> Path:
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
    that never runs student code (see :mod:`kernels.grade.rpc`); returns their events summarised."""
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
    judges = judges or JudgeServer(judge_dir / "server")
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
        cmd = [shutil.which("unshare"), *UNSHARE, sys.executable, str(SANDBOX_INIT), cmd[-1]]
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
            with contextlib.suppress(BaseException):
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
                with contextlib.suppress(BaseException):
                    stream.close()
    return out


def _judge_env(judge_dir: Path) -> dict:
    (judge_dir / "tmp").mkdir(exist_ok=True)
    return _child_env(judge_dir)  # CPU mode, no GPU: the references run as the sandbox's code does


class JudgeServer:
    """The grader's end of :func:`kernels.grade.judge.judge_server`: starts it once per run, hands it one job per
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
