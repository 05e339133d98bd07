"""The first process of a grading sandbox's PID namespace: :func:`main`, run as a script by its path
(``unshare ... python kernels/grade/sandbox_init.py SPEC``, from :func:`kernels.grade.isolation.run_isolated`),
so that it imports nothing heavy, not even the package.

``unshare --pid --fork`` makes this process the namespace's init: when it exits, the kernel kills every
process left in the namespace, so nothing a notebook starts outlives its sandbox; and the signals a
notebook sends to it (``os.kill(os.getppid(), 9)``) are dropped, as for any init.  It starts the real
sandbox (``python -m kernels.grade --child SPEC``), reaps whatever is orphaned to it, and exits with the
sandbox's status, a death by signal N as 128 + N (``unshare`` itself cannot pass a signal on).  It also
dies, taking the namespace with it, when ``unshare`` dies (the grader killing the sandbox).
"""

import ctypes
import os
import signal
import sys

__all__ = ["main"]


def main(argv) -> int:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # unshare already died
        return 128 + signal.SIGKILL
    child = os.fork()
    if child == 0:
        try:
            os.execv(sys.executable, [sys.executable, "-m", "kernels.grade", "--child", *argv])
        finally:
            os._exit(127)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 127
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
