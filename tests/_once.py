"""A module fixture's work done once per test run, however many pytest-xdist workers run the module.

``--dist load`` and ``--dist worksteal`` spread one module's tests over several workers, and each
worker builds module-scoped fixtures on its own: a fixture that grades forty notebooks would grade them
once per worker.  :func:`once` lets the first worker do the work while the others wait for its result
(the pattern pytest-xdist's documentation gives for session fixtures), with a lock file in the folder
all workers of one run share.
"""

import fcntl
import json
import os


def once(tmp_path_factory, name: str, compute):
    """``compute(folder)`` (a folder of its own, shared by the run's workers) -> a JSON-able value,
    computed by the first worker that asks and read back by the others."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' base folders are siblings under the run's own
    folder = root / f"once-{name}"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "result.json"
        if done.is_file():
            return json.loads(done.read_text())
        folder.mkdir(exist_ok=True)
        value = compute(folder)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(done)
        return value
