"""The child: what runs inside the sandbox of one submission.  :func:`run_sandbox` (``python -m
kernels.grade --child SPEC``) seals the sandbox's file system where namespaces work, installs the bounds
check (:mod:`kernels._bounds`) and an audit hook (PEP 578) that refuses, and reports, reading the hidden
paths, writing outside its folder, starting programs and opening sockets; runs the notebook's code
cells one by one, each under a CPU-time limit, its output capped; then serves the graded names to the
judge (:func:`kernels.grade.rpc.serve`).  :func:`describe_error` says what an exception was (its first
line; out of memory; out of bounds), for the sandbox's cells and the judge's tests alike.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import threading
from pathlib import Path

from kernels._bounds import OutOfBounds, install_bounds_check

__all__ = ["describe_error", "run_sandbox"]


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
        with contextlib.suppress(BaseException):  # a mount that cannot be remounted (gone, or not ours) stays as it was
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
    with contextlib.suppress(BaseException):
        os.setpgid(0, 0)


def run_sandbox(spec: dict) -> int:
    """The sandbox of one submission: execute its cells, then serve the graded names to the judge."""
    if spec["namespaces"]:
        _leave_group()
    events_fd = spec["events_fd"]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # input() must not wait
    lock = threading.Lock()

    def emit(**event):
        data = (json.dumps(event, default=str) + "\n").encode()
        with lock, contextlib.suppress(BaseException):
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
        from kernels.grade import rpc

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
            with rpc.time_limit(limit, f"cell {i + 1}"):
                exec(code, ns)
        except rpc.TimeLimit as e:
            record.update(error=str(e), slow=True)
        except BaseException as e:  # noqa: BLE001 - the student's error, reported; the next cell runs
            record.update(describe_error(e))
        emit(**record)
    sys.stdout.flush()
    emit(event="executed")
    # The tests never come here: the judge asks for the graded names' values, and for calls on them.
    try:
        rpc.serve(spec["requests_fd"], spec["answers_fd"], ns, spec["names"], limit)
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


def describe_error(e: BaseException) -> dict:
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
