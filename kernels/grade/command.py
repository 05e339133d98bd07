"""The command: :func:`grade` grades every notebook under some paths into an output folder, each in its
own sandbox, several side by side, resuming where an earlier run stopped; :func:`main` is ``python -m
kernels.grade`` (its options, and the internal ``--child`` and ``--judge-server`` processes, handed to
:func:`kernels.grade.child.run_sandbox` and :func:`kernels.grade.judge.judge_server`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from kernels.grade.child import run_sandbox
from kernels.grade.config import (
    DEFAULT_CELL_S,
    DEFAULT_DISK_MB,
    DEFAULT_MEMORY_GB,
    DEFAULT_OUTPUT_MB,
    DEFAULT_TIMEOUT_S,
    ROOT,
    STATUS_ORDER,
)
from kernels.grade.isolation import (
    JudgeServer,
    Limits,
    kill_running,
    namespaces_available,
    not_graded,
    run_isolated,
    warm_caches,
)
from kernels.grade.judge import judge_server
from kernels.grade.labs import load_labs
from kernels.grade.results import (
    atomic_write,
    feedback_markdown,
    feedback_names,
    inside,
    result_key,
    safe_name,
    with_intake,
    write_csv,
)
from kernels.grade.submissions import find_notebooks, identify, read_roster, review_intake

__all__ = ["grade", "main"]


def grade(
    paths,
    out: Path,
    *,
    labs: dict | None = None,
    lab: str | None = None,
    jobs: int = 1,
    limits: Limits | None = None,
    force: bool = False,
    progress: bool = True,
    roster: dict | None = None,
) -> list:
    """Grade every notebook in ``paths`` into ``out``; returns the results (one dict per submission).
    ``roster``: {path: student} (:func:`read_roster`); without it, identity comes from the folders."""
    out = Path(out).resolve()
    labs = labs if labs is not None else load_labs()
    limits = limits or Limits(namespaces=namespaces_available())
    if lab is not None and lab not in labs:
        raise ValueError(f"lab: unknown lab {lab!r}; known: {', '.join(labs)}")
    found = find_notebooks(paths)
    submissions = [identify(p, labs, lab, base, roster) for p, base in found]
    review_intake(submissions)
    notebooks = [p for p, _ in found]
    folders = {p.absolute().parent for p in notebooks} | {Path(p).resolve() for p in paths if Path(p).is_dir()}
    # Off limits to every submission: the solutions (hidden tests live there), the test suite (its data
    # files excepted: notebooks read them), the repository's history, every submissions folder and the
    # output folder.  A folder holding the package itself cannot be hidden from the code that imports it.
    tests = [p for p in (ROOT / "tests").iterdir() if p.name != "data"]
    secret = {ROOT / "solutions", ROOT / ".git", *tests, out, *folders}
    secret |= {Path(d).resolve() for one in labs.values() for d in one.secret}
    hidden = sorted(p for p in secret if p.exists() and not inside(ROOT / "kernels", p))
    hidden = [p for p in hidden if not any(q != p and inside(p, q) for q in hidden)]  # covered by a parent
    (out / "results").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="kernels-grade-"))
    hidden.append(scratch)  # other submissions' sandboxes; a child's own folder stays visible

    results, todo, subs_of = {}, [], {}
    for sub in submissions:
        key = result_key(sub, labs.get(sub.lab), limits)
        subs_of[key] = sub
        refused = next(((f, n) for f, n in sub.intake if f in ("symlink", "not-in-roster")), None)
        if refused:  # never read, never run
            results[key] = not_graded(sub, labs.get(sub.lab), *refused)
            continue
        stored = out / "results" / f"{key}.json"
        if stored.is_file() and not force:
            try:
                results[key] = json.loads(stored.read_text())
                continue
            except ValueError:
                pass
        todo.append((key, sub))

    judges = None
    if todo:
        warm_caches(scratch)
        judges = JudgeServer(scratch / "judge")
    feedback_files = feedback_names(submissions)

    def report(key, result) -> dict:
        """The stored result with what this run's intake found (which depends on the other submissions)."""
        result = with_intake(result, subs_of[key])
        name = feedback_files.get(result["student"], safe_name(result["student"]))
        atomic_write(out / "feedback" / safe_name(result["lab"] or "unknown") / f"{name}.md", feedback_markdown(result))
        return result

    def one(key, sub):
        lab_ = labs.get(sub.lab)
        if sub.notebook_error:
            result = not_graded(sub, lab_, "not-a-notebook", sub.notebook_error)
        elif lab_ is None:
            result = not_graded(
                sub,
                None,
                "unknown-lab",
                f"no lab in the notebook's metadata or its file name (labs: {', '.join(labs)})",
            )
        else:
            result = run_isolated(sub, lab_, limits, [h for h in hidden if h != scratch] + [scratch], scratch, judges)
        atomic_write(out / "results" / f"{key}.json", json.dumps(result, indent=1))
        return key, result

    for key in list(results):
        results[key] = report(key, results[key])
    bar = _progress_bar(
        total=len(submissions),
        initial=len(submissions) - len(todo),
        desc="grading",
        unit="notebook",
        disable=not progress,
        file=sys.stderr,
    )
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = []
    try:
        futures += [pool.submit(one, key, sub) for key, sub in todo]
        for future in as_completed(futures):
            key, result = future.result()
            results[key] = result = report(key, result)
            bar.set_postfix_str(f"{result['student']}: {result['status']}", refresh=False)
            bar.update()
            write_csv(out / "scores.csv", list(results.values()))
    except BaseException:
        # Interrupted (Ctrl-C) or failed: what finished is on disk; stop the rest, keep nothing half-done.
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running()
        raise
    finally:
        pool.shutdown(wait=True)
        for future in futures:  # finished while the interruption was handled: on disk, so in the CSV too
            if future.done() and not future.cancelled() and future.exception() is None:
                key, result = future.result()
                results[key] = with_intake(result, subs_of[key])
        bar.close()
        write_csv(out / "scores.csv", list(results.values()))
        if judges is not None:
            judges.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return sorted(results.values(), key=lambda r: (r["lab"], r["student"], r["submission"]))


class _TextBar:
    """A one-line progress bar on stderr, for when tqdm is not installed."""

    def __init__(self, total, initial=0, desc="", unit="", disable=False, file=sys.stderr):
        self.total, self.n, self.desc, self.unit, self.disable, self.file = total, initial, desc, unit, disable, file
        self.started, self.postfix = time.monotonic(), ""
        self._draw()

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s

    def update(self, n=1):
        self.n += n
        self._draw()

    def _draw(self, end="\r"):
        if self.disable:
            return
        done = int(20 * self.n / self.total) if self.total else 20
        elapsed = time.monotonic() - self.started
        self.file.write(
            f"{self.desc}: [{'#' * done}{'.' * (20 - done)}] {self.n}/{self.total} {self.unit}s "
            f"{elapsed:.0f} s  {self.postfix}".ljust(100)
            + end
        )
        self.file.flush()

    def close(self):
        self._draw(end="\n")


def _progress_bar(**kwargs):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _TextBar(**kwargs)
    return tqdm(**kwargs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return run_sandbox(json.loads(argv[1]))
    if argv[:1] == ["--judge-server"]:
        return judge_server(int(argv[1]))
    parser = argparse.ArgumentParser(
        prog="python -m kernels.grade",
        description=sys.modules[__package__].__doc__.splitlines()[0],  # kernels.grade's first line
        epilog="Statuses and the isolation guarantee: see the module's docstring.",
    )
    parser.add_argument("submissions", type=Path, nargs="*", help="submitted notebooks, or folders holding them")
    parser.add_argument("--list-labs", action="store_true", help="print each lab's questions, points and tests; exit")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("grades"),
        help="where scores.csv, feedback/ and results/ go (default: %(default)s)",
    )
    parser.add_argument("--lab", help="grade every submission as this lab (default: from metadata or file name)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="submissions graded side by side (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="wall-clock seconds per submission (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu-timeout", type=float, default=None, help="CPU seconds per submission (default: the same as --timeout)"
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=DEFAULT_CELL_S,
        help="CPU seconds per cell, and per call of a graded function while scoring (default: %(default)s)",
    )
    parser.add_argument(
        "--disk-mb",
        type=float,
        default=DEFAULT_DISK_MB,
        help="the sandbox's one writable folder, MB (default: %(default)s)",
    )
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=DEFAULT_MEMORY_GB,
        help="address-space limit per submission, GB (default: %(default)s; torch and triton alone take about 3.5)",
    )
    parser.add_argument(
        "--output-mb",
        type=float,
        default=DEFAULT_OUTPUT_MB,
        help="printed output kept per submission, MB (default: %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="regrade submissions already graded")
    parser.add_argument(
        "--roster",
        type=Path,
        help="CSV with columns student,file (a notebook or a folder of them): who submitted what; notebooks "
        "not in it are not graded (default: one folder per student, or the file name)",
    )
    parser.add_argument(
        "--no-namespaces",
        action="store_true",
        help="do not use unshare even where it works (the audit hook alone then isolates)",
    )
    parser.add_argument("--labs-dir", type=Path, default=ROOT / "labs", help="default: %(default)s")
    parser.add_argument("--solutions-dir", type=Path, default=ROOT / "solutions", help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.list_labs:
        for lab in load_labs(args.labs_dir, args.solutions_dir).values():
            print(lab.describe())
        return 0
    if not args.submissions:
        parser.error("submissions: name at least one notebook or folder")
    missing = [str(s) for s in args.submissions if not s.exists()]
    if missing:
        parser.error(f"submissions: no such file(s) or folder(s): {', '.join(missing)}")
    for name in ("timeout", "memory_gb", "output_mb", "jobs", "cpu_timeout", "cell_timeout", "disk_mb"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not args.labs_dir.is_dir():
        parser.error(f"--labs-dir: no such folder {args.labs_dir}")
    roster = None
    if args.roster is not None:
        try:
            roster = read_roster(args.roster)
        except (OSError, ValueError) as e:
            parser.error(f"--roster: {e}")
    labs = load_labs(args.labs_dir, args.solutions_dir)
    if args.lab is not None and args.lab not in labs:
        parser.error(f"--lab: unknown lab {args.lab!r}; known: {', '.join(labs)}")
    namespaces = not args.no_namespaces and namespaces_available()
    print(
        (
            "grading in sandboxes of user, mount, network and PID namespaces (unshare -rmnpf) with an audit hook"
            if namespaces
            else "grading WITHOUT a sandbox: no user namespaces here (or --no-namespaces), so ONLY an audit hook "
            "isolates each notebook, and every row is flagged unisolated"
        )
        + f"; {args.timeout:g} s, {args.cell_timeout:g} CPU s per cell, {args.memory_gb:g} GB, {args.output_mb:g} MB "
        f"of output per submission; {args.jobs} at a time",
        file=sys.stderr,
    )
    limits = Limits(
        args.timeout,
        args.memory_gb,
        args.output_mb,
        namespaces,
        args.cpu_timeout,
        disk_mb=args.disk_mb,
        cell_s=args.cell_timeout,
    )
    results = grade(
        args.submissions,
        args.out,
        labs=labs,
        lab=args.lab,
        jobs=args.jobs,
        limits=limits,
        force=args.force,
        roster=roster,
    )
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: STATUS_ORDER.index(kv[0])))
    print(
        f"{len(results)} submissions graded ({summary}): {args.out / 'scores.csv'}, feedback in {args.out / 'feedback'}"
    )
    return 0
