"""The GPU lane: every test and notebook run compiled on a CUDA GPU, and a record of the outcome that CI reads.

    python -m kernels.gpu_lane                        # both parts side by side, on a CUDA GPU
    python -m kernels.gpu_lane --part tests -n 8      # one part (each takes several minutes)
    python -m kernels.gpu_lane --part notebooks
    python -m kernels.gpu_lane --part tests -- -k fp8 # extra pytest arguments: results printed, no record
    python -m kernels.gpu_lane --check                # any machine: is tests/gpu_lane.json fresh and clean?

CI has no GPU, so it runs everything in CPU mode, where a corrected Triton interpreter stands in for the
compiler.  What only compiled Triton shows (the GPU-only tests, native FP8, the notebooks' GPU cells) is
checked here instead, by two pytest runs: part ``tests`` (``pytest tests``) and part ``notebooks`` (nbval of
book/, solutions/ and labs/, comparing the cells marked ``# NBVAL_CHECK_OUTPUT``); part ``tests`` leaves out
only the test that reads the record being written.  Their outcomes, read from pytest's junit XML (which
works under xdist), go to ``tests/gpu_lane.json`` with the device and stack they ran on and the sha256 of
what they cover: the files under kernels/ and tests/, the hidden tests under solutions/ and the code cells
of every notebook.  ``--check``
and ``tests/test_gpu_lane.py`` compare that hash with the tree, so a record cannot vouch for code it never
ran.  A part is merged into an existing record only if that record is for the same tree and stack;
otherwise the other part is dropped and has to be run again.

Both parts (the default) run side by side, their workers splitting the CPUs (:func:`split_workers`), each
pytest's output in its own log; each part is written to the record as soon as it ends, so a run cut short
keeps the part it finished, and the other can be run alone.  Each part's record also names its slowest
items and every file's time, and the next run of part ``notebooks`` starts the notebooks it did not run, then the
slowest (:func:`longest_first`).
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from kernels import ROOT

RECORD = "tests/gpu_lane.json"
PARTS = {"tests": ["tests"], "notebooks": ["book", "solutions", "labs"]}
# The CPU test that reads this record cannot pass while the record is being written.
DESELECT = ("tests/test_gpu_lane.py::test_the_gpu_lane_record_is_fresh_and_clean",)
STACK = ("device", "capability", "torch", "triton", "python")


def _skipped(name: str) -> bool:
    """Whether a file or folder is left out of the hash wherever it lies: what tools leave behind
    (``__pycache__``, ``*.egg-info``, and every dot-name: ``.ruff_cache``, ``.pytest_cache``,
    ``.ipynb_checkpoints``), which the device's copy of a tree may hold and a clean clone does not."""
    return name.startswith(".") or name == "__pycache__" or name.endswith(".egg-info")


def covered(root) -> list:
    """Relative paths (with '/', sorted) of what the record vouches for: every file under kernels/ and
    tests/ (but the record itself), every notebook under book/, solutions/ and labs/, and the hidden
    tests (the ``.py`` files under solutions/), which part ``tests`` runs."""
    root = Path(root)
    found = []
    for top in ("kernels", "tests", "book", "solutions", "labs"):
        for folder, dirs, files in os.walk(root / top):
            dirs[:] = [d for d in dirs if not _skipped(d)]
            for name in files:
                rel = (Path(folder) / name).relative_to(root).as_posix()
                if _skipped(name) or name.endswith(".pyc") or rel == RECORD:
                    continue
                hidden_test = top == "solutions" and name.endswith(".py")
                if top in ("kernels", "tests") or name.endswith(".ipynb") or hidden_test:
                    found.append(rel)
    return sorted(found)


def _content(path: Path) -> bytes:
    """A file's bytes; for a notebook, only its code cells' sources (as ``kernels.authoring.record.code_sha256``)."""
    data = path.read_bytes()
    if path.suffix != ".ipynb":
        return data
    try:
        cells = json.loads(data)["cells"]
        sources = [c["source"] for c in cells if c.get("cell_type") == "code"]
    except (ValueError, KeyError, TypeError):
        return data  # not a notebook nbformat could read: hash it whole
    return b"".join(("".join(s) if isinstance(s, list) else s).encode("utf-8") + b"\x00" for s in sources)


def tree_sha256(root) -> str:
    """sha256 over (path, sha256 of content) of every covered file, in path order: the same on any machine."""
    h = hashlib.sha256()
    for rel in covered(root):
        h.update(f"{rel}\x00{hashlib.sha256(_content(Path(root) / rel)).hexdigest()}\n".encode())
    return h.hexdigest()


def parse_junit(path) -> dict:
    """Outcomes from a pytest junit XML: {"passed": [id], "failed": [id], "skipped": {id: reason}}.

    Ids are pytest node ids (``file::Class::name``) where the testcase has a ``file`` attribute
    (``junit_family=xunit1``), else ``classname::name``.  A failure or error element makes a test failed
    (a teardown error after a pass included), a skipped element (skip or xfail) makes it skipped."""
    outcome, reasons = {}, {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
        module = file[:-3] if file and file.endswith(".py") else file
        if file and cls == module.replace("/", "."):
            tid = f"{file}::{name}"
        elif file and cls.startswith(module.replace("/", ".") + "."):
            tid = "::".join([file, *cls[len(module) + 1 :].split("."), name])
        elif file and not cls:
            tid = file if name == module.replace("/", ".") else f"{file}::{name}"  # a collection error
        else:
            tid = f"{cls}::{name}" if cls else name
        new = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            new = "failed"
        elif (skip := case.find("skipped")) is not None:
            new = "skipped"
            prefix = "xfail: " if skip.get("type") == "pytest.xfail" else ""
            reasons[tid] = prefix + (skip.get("message") or skip.text or "").strip()
        if rank[new] >= rank.get(outcome.get(tid, "passed"), 0):
            outcome[tid] = new
    ids = sorted(outcome)
    return {
        "passed": [t for t in ids if outcome[t] == "passed"],
        "failed": [t for t in ids if outcome[t] == "failed"],
        "skipped": {t: reasons[t] for t in ids if outcome[t] == "skipped"},
    }


def merge(old, name: str, part: dict, env: dict) -> tuple:
    """A record with ``part`` as part ``name``; the other parts of ``old`` are kept only if ``old`` is for
    the same tree (``sha256``) and stack.  Returns (record, names of the parts dropped)."""
    parts = {}
    dropped = []
    if isinstance(old, dict) and isinstance(old.get("parts"), dict):
        same = all(old.get(k) == env.get(k) for k in ("sha256", *STACK))
        others = {k: v for k, v in old["parts"].items() if k != name and isinstance(v, dict) and "counts" in v}
        parts, dropped = (others, []) if same else ({}, sorted(others))
    parts[name] = part
    totals = {k: sum(p["counts"][k] for p in parts.values()) for k in ("passed", "failed", "skipped")}
    return {**env, "parts": parts, "totals": totals}, dropped


def check(root=ROOT) -> tuple:
    """(exit code, one line): 0 fresh and clean, 1 stale but clean, 2 missing, incomplete or failing."""
    root = Path(root)
    hint = "run python -m kernels.gpu_lane on a CUDA GPU"
    try:
        rec = json.loads((root / RECORD).read_text())
        parts, sha = rec["parts"], rec["sha256"]
        failed = [t for p in parts.values() for t in p["failed"]]
        counts = {k: sum(int(p["counts"][k]) for p in parts.values()) for k in ("passed", "failed", "skipped")}
        stack = f"{rec['device']} ({rec['capability']}), torch {rec['torch']}, triton {rec['triton']}"
        date = str(rec["date"])[:10]
    except FileNotFoundError:
        return 2, f"gpu lane: no record at {RECORD}; {hint}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return 2, f"gpu lane: {RECORD} is unreadable ({type(exc).__name__}: {exc}); {hint}"
    missing = [p for p in PARTS if p not in parts]
    if missing:
        run = f"run python -m kernels.gpu_lane --part {missing[0]} on a CUDA GPU"
        return 2, f"gpu lane: the record lacks part {', '.join(missing)}; {run}"
    summary = (
        f"{counts['passed']} passed, {max(counts['failed'], len(failed))} failed, {counts['skipped']} skipped "
        f"on {stack}, {date}, tree {sha[:12]}"
    )
    current = tree_sha256(root)
    stale = f"; stale too (this tree is {current[:12]})" if current != sha else ""
    if failed or counts["failed"]:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        return 2, f"gpu lane: FAILED {', '.join(failed[:3])}{more}: {summary}{stale}"
    if stale:
        return 1, f"gpu lane: stale (this tree is {current[:12]}; {hint}), otherwise clean: {summary}"
    return 0, f"gpu lane: fresh and clean: {summary}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment(root) -> dict:
    """Device, stack, date (UTC), git commit (or null) and the tree's sha256."""
    from kernels.device import gpu_environment

    env = gpu_environment()
    commit = os.environ.get("KERNELS_COMMIT") or None  # for a copy of the tree without .git
    if commit is None:
        try:
            git = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, cwd=root)
            commit = git.stdout.strip() if git.returncode == 0 else None
        except OSError:
            pass
    return {**env, "date": _now(), "python": platform.python_version(), "commit": commit, "sha256": tree_sha256(root)}


def split_workers(workers: int) -> dict:
    """Workers for each part when both run side by side (``--part all``): about 3 in 8 to the notebooks.

    Run one after the other, the parts take about 1,040 s on an H200 with 16 workers, and much of it is
    spent waiting on a few long notebooks and grader tests while other cores idle; side by side, 10 and
    6 workers finished both in about 500 s."""
    nb = max(1, round(workers * 3 / 8))
    return {"tests": max(1, workers - nb), "notebooks": nb}


def slowest(path, n: int = 10) -> dict:
    """The ``n`` slowest items and every file of a pytest junit XML, as [id, seconds] pairs, slowest first:
    where the part's time went, for whoever makes the lane faster, and the order :func:`longest_first`
    starts the next run's notebooks in."""
    items, files = [], {}
    for case in ET.parse(path).getroot().iter("testcase"):
        t = float(case.get("time") or 0.0)
        file, name = case.get("file") or case.get("classname", ""), case.get("name", "")
        items.append((t, f"{file}::{name}"))
        files[file] = files.get(file, 0.0) + t
    top = sorted(items, key=lambda x: (-x[0], x[1]))[:n]
    by_file = sorted(files.items(), key=lambda x: (-x[1], x[0]))
    return {"slowest": [[i, round(t, 1)] for t, i in top], "slowest_files": [[f, round(t, 1)] for f, t in by_file]}


def longest_first(root) -> list:
    """The notebooks of part ``notebooks`` in the order to start them: those the last recorded run did not
    run at all (new ones, whose length is unknown, so that a long one cannot start last and end the part
    late), in path order; then those it ran, slowest first (a notebook it ran but did not time, from a
    record that kept only the slowest, counts as fast).  The part's wall time is at least its longest
    notebook's, so that one must start at once: given folders, xdist queues notebooks by their count of
    cells, and a long notebook queued behind another's long last cells once made the part 90 s longer than
    its longest notebook."""
    root = Path(root)
    notebooks = [p for p in covered(root) if p.endswith(".ipynb") and p.split("/")[0] in PARTS["notebooks"]]
    try:
        last = json.loads((root / RECORD).read_text())["parts"]["notebooks"]
        seconds = {str(path): float(t) for path, t in last["slowest_files"]}
        ran = {arg for arg in str(last["command"]).split() if arg.endswith(".ipynb")} | set(seconds)
    except (OSError, ValueError, KeyError, TypeError):
        seconds, ran = {}, set()
    return sorted(notebooks, key=lambda p: (p in ran, -seconds.get(p, 0.0), p))


def _xdist_keeps_order() -> bool:
    """Whether this pytest-xdist has ``--no-loadscope-reorder`` (3.8.0 and later)."""
    try:
        return tuple(int(n) for n in metadata.version("pytest-xdist").split(".")[:2]) >= (3, 8)
    except (metadata.PackageNotFoundError, ValueError):
        return False


def run_part(root, name: str, workers: int, extra: list, threads: int = 1, log=None) -> dict:
    """Run one part under pytest (a subprocess, in ``root``) and return its record.

    Each worker gets ``threads`` CPU threads for torch and OpenMP (``OMP_NUM_THREADS``, unless set), so
    that workers side by side do not oversubscribe the cores; ``log``, a path, takes pytest's output
    (when two parts run at once), else it goes to this process's."""
    # Tests are spread one by one (a file of grader runs would otherwise hold one worker for minutes);
    # a notebook's cells share one kernel, so notebooks go whole.
    dist = "loadfile" if name == "notebooks" else "worksteal"  # worksteal: a long test does not hold up a queue
    flags = ["-o", "addopts=", "-p", "no:cacheprovider", "--dist", dist, "-n", str(workers)]
    # Many workers starting Jupyter kernels at once on a loaded machine can take longer than nbval's
    # default minute to answer; a kernel that never starts is still an error, after five.
    notebooks = ["--nbval-lax", "--nbval-kernel-startup-timeout=300"]
    if _xdist_keeps_order():  # in the order given (longest first), not xdist's order by count of cells
        notebooks.append("--no-loadscope-reorder")
    elif name == "notebooks":
        print("kernels.gpu_lane: pytest-xdist < 3.8 orders notebooks by count of cells, not longest first", flush=True)
    flags += notebooks if name == "notebooks" else [f"--deselect={d}" for d in DESELECT]
    targets = longest_first(root) if name == "notebooks" else PARTS[name]
    shown = ["python", "-m", "pytest", *flags, *extra, *targets]
    where = f" (output in {log})" if log else ""
    print(f"gpu lane, part {name}: {' '.join(shown)}{where}", flush=True)
    env = {**os.environ}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, str(threads))
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *flags, "-o", "junit_family=xunit1", f"--junitxml={junit}"]
        date, start = _now(), time.perf_counter()
        with open(log, "w") if log else contextlib.nullcontext() as out:
            proc = subprocess.run([*cmd, *extra, *targets], cwd=root, env=env, stdout=out, stderr=out)
        rc, wall = proc.returncode, time.perf_counter() - start
        found = parse_junit(junit) if junit.exists() else {"passed": [], "failed": [], "skipped": {}}
        times = slowest(junit) if junit.exists() else {"slowest": [], "slowest_files": []}
    if rc != 0 and not found["failed"]:  # interrupted, internal error, nothing collected: not clean
        found["failed"].append(f"pytest: exit status {rc}" + ("" if junit.exists() else ", no junit report"))
    counts = {k: len(found[k]) for k in ("passed", "failed", "skipped")}
    print(
        f"gpu lane, part {name}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"in {wall:.0f} s with {workers} workers",
        flush=True,
    )
    for tid in found["failed"]:
        print(f"  FAILED {tid}", flush=True)
    for tid, t in times["slowest_files"][:5]:
        print(f"  {t:7.1f} s  {tid}", flush=True)
    return {
        "command": " ".join(shown),
        "counts": counts,
        "date": date,
        "deselected": list(DESELECT) if name == "tests" else [],
        "failed": found["failed"],
        "returncode": rc,
        "skipped": found["skipped"],
        "wall_s": round(wall, 1),
        "workers": workers,
        **times,
    }


def refusal() -> str:
    """Why the lane cannot run here ('' if it can): it needs compiled Triton on a CUDA GPU."""
    if os.environ.get("KERNELS_INTERPRET") == "1":
        return "KERNELS_INTERPRET=1 is set; the GPU lane runs compiled Triton: unset it"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False); on this machine, pytest is the CPU lane"
    import kernels

    if kernels.INTERPRETER:
        return "Triton runs in its interpreter here (TRITON_INTERPRET=1?); the GPU lane needs compiled Triton"
    return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m kernels.gpu_lane", description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all", help="what to run (default: all)")
    parser.add_argument("-n", "--workers", type=int, default=min(os.cpu_count() or 1, 16), help="pytest-xdist workers")
    parser.add_argument("--check", action="store_true", help=f"only say whether {RECORD} is fresh and clean")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository's root (default: this checkout)")
    parser.add_argument(
        "--logs", type=Path, help="where pytest's output goes when both parts run side by side (default: the temp dir)"
    )
    args = parser.parse_args(argv)
    if args.check:
        code, line = check(args.root)
        print(line)
        return code
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if why := refusal():
        print(f"kernels.gpu_lane: {why}", file=sys.stderr)
        return 2
    env = environment(args.root)
    names = list(PARTS) if args.part == "all" else [args.part]
    side_by_side = len(names) > 1 and args.workers >= 2
    plan = split_workers(args.workers) if side_by_side else {name: args.workers for name in names}
    busy = sum(plan.values()) if side_by_side else max(plan.values())  # workers running at once
    threads = max(1, (os.cpu_count() or 1) // busy)  # CPU threads for each
    logs = args.logs if args.logs is not None else Path(tempfile.gettempdir())
    path = args.root / RECORD
    failed = False

    def record(name, part):  # each part goes into the record as it ends: a run cut short keeps what it finished
        nonlocal failed
        failed = failed or bool(part["failed"])
        if extra:
            return
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            rec = None
        rec, dropped = merge(rec, name, part, env)
        if dropped:
            print(f"kernels.gpu_lane: dropped part {', '.join(dropped)} of {RECORD}: it was for another tree or stack")
        path.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        print(f"wrote part {name} to {path}", flush=True)

    if side_by_side:
        logs.mkdir(parents=True, exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
            running = {
                pool.submit(run_part, args.root, name, n, extra, threads, logs / f"gpu_lane_{name}.log"): name
                for name, n in plan.items()
            }
            for done in concurrent.futures.as_completed(running):
                record(running[done], done.result())
    else:
        for name, n in plan.items():
            record(name, run_part(args.root, name, n, extra, threads))
    if tree_sha256(args.root) != env["sha256"]:
        print("kernels.gpu_lane: covered files changed while the lane ran; the record keeps the hash from before it")
    if extra:
        print(f"kernels.gpu_lane: extra pytest arguments {extra} run a subset, so {RECORD} is left as it was")
    else:
        print(check(args.root)[1])
    return int(failed)


__all__ = [
    "DESELECT",
    "PARTS",
    "RECORD",
    "STACK",
    "check",
    "covered",
    "environment",
    "longest_first",
    "main",
    "merge",
    "parse_junit",
    "refusal",
    "run_part",
    "slowest",
    "split_workers",
    "tree_sha256",
]


if __name__ == "__main__":
    sys.exit(main())
