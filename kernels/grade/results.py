"""Results on disk, atomic and resumable: :func:`result_key` (what a stored result is keyed by),
:func:`atomic_write`, :func:`with_intake` (a result with this run's intake flags merged in),
:func:`feedback_markdown` (a student's feedback file; :func:`diagnosis` is the check's own message in it),
:func:`feedback_names` and :func:`safe_name` (one feedback file per student, whatever the script of the
name), :func:`write_csv` (``scores.csv``, no cell read as a formula) and :func:`inside`.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import os
import re
import tempfile
import unicodedata
from pathlib import Path

from kernels.grade.config import GRADER_VERSION, REVIEW, STATUS_ORDER
from kernels.grade.isolation import Limits
from kernels.grade.labs import Lab, natural
from kernels.grade.submissions import Submission

__all__ = [
    "atomic_write",
    "diagnosis",
    "feedback_markdown",
    "feedback_names",
    "inside",
    "result_key",
    "safe_name",
    "with_intake",
    "write_csv",
]


def inside(path: Path, folder: Path) -> bool:
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def atomic_write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(BaseException):
            os.unlink(tmp)
        raise


def result_key(sub: Submission, lab: Lab | None, limits: Limits) -> str:
    parts = [
        sub.sha256,
        sub.student,
        lab.name if lab else "",
        lab.digest if lab else "",
        str(GRADER_VERSION),
        f"{limits.timeout_s}:{limits.memory_gb}:{limits.output_mb}",
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def safe_name(name: str) -> str:
    """A file name for ``name``: letters and digits of any script kept (Zoë, 李雷), the rest ``_``."""
    name = unicodedata.normalize("NFC", name)
    return re.sub(r"[^\w.-]+", "_", name).strip("._")[:100] or "unnamed"


def feedback_names(submissions) -> dict:
    """{student: feedback file name}, unique even where two names fold to one file name (``Zoë`` and
    ``Zoé`` stay apart; ``Bob`` and ``bob`` too, on a file system that ignores case)."""
    students = sorted({s.student for s in submissions if s.student})
    folded = {}
    for student in students:
        folded.setdefault(safe_name(student).casefold(), []).append(student)
    names = {}
    for student in students:
        safe = safe_name(student)
        clash = len(folded[safe.casefold()]) > 1 or safe != unicodedata.normalize("NFC", student)
        names[student] = f"{safe}-{hashlib.sha256(student.encode()).hexdigest()[:6]}" if clash else safe
    return names


def with_intake(result: dict, sub: Submission) -> dict:
    """``result`` with the intake's flags (duplicates, identical cells, repairs) merged in by severity."""
    result = dict(result, flags=list(result["flags"]), notes=list(result["notes"]))
    for flag, note in sub.intake:
        if flag not in result["flags"]:
            result["flags"].append(flag)
        if note not in result["notes"]:
            result["notes"].append(note)
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    result["flags"].sort(key=lambda f: order.get(f, len(order)))
    graded = [f for f in result["flags"] if f not in REVIEW]
    result["status"] = graded[0] if graded else "ok"
    return result


def feedback_markdown(result: dict) -> str:
    lines = [f"# {result['lab']}: feedback for {result['student']}", ""]
    lines.append(f"Score: **{result['total']:g} / {result['possible']:g}**  (status: `{result['status']}`)")
    lines.append("")
    for note in result["notes"]:
        lines.append(f"* {note}")
    if result["notes"]:
        lines.append("")
    for q, v in sorted(result["questions"].items(), key=lambda kv: natural(kv[0])):
        lines.append(f"## {q}: {v['points']:g} / {v['possible']:g}")
        lines.append("")
        if v["note"]:
            lines.append(v["note"])
            lines.append("")
        for case in v["cases"]:
            if case["hidden"]:
                lines.append(f"* hidden test `{case['name']}`: {'passed' if case['passed'] else 'failed'}")
            elif case["passed"]:
                lines.append(f"* `{case['name']}`: passed")
            else:
                lines.append(f"* `{case['name']}`: failed")
                lines.append("")
                lines.append("  ```")
                lines.extend("  " + line for line in diagnosis(case["message"]).splitlines())
                lines.append("  ```")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def diagnosis(message: str) -> str:
    """The check's own message, without otter's quoting of the test file's source line."""
    m = re.search(r"^Error at line \d+ in test [^\n]*\n(?:  [^\n]*\n)?(.*)$", message, flags=re.S)
    text = m.group(1) if m else message
    return re.sub(r"^AssertionError: ", "", text.strip())


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet shows as text: one that would start a formula (=, +, -, @, a tab or a
    carriage return) gets a leading apostrophe (OWASP's advice for CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(path: Path, results: list):
    questions = sorted({q for r in results for q in r["questions"]}, key=natural)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "student",
            "lab",
            *questions,
            "total",
            "possible",
            "status",
            "flags",
            "detail",
            "seconds",
            "cpu_seconds",
            "lab_from",
            "submission",
            "sha256",
        ]
    )
    for r in sorted(results, key=lambda r: (r["lab"], r["student"], r["submission"])):
        r = {k: _cell(v) if isinstance(v, str) else v for k, v in r.items()}
        r["flags"], r["notes"] = [_cell(f) for f in r["flags"]], [_cell(n) for n in r["notes"]]
        points = [f"{r['questions'][q]['points']:g}" if q in r["questions"] else "" for q in questions]
        writer.writerow(
            [
                r["student"],
                r["lab"],
                *points,
                f"{r['total']:g}",
                f"{r['possible']:g}",
                r["status"],
                " ".join(r["flags"]),
                "; ".join(r["notes"]),
                f"{r['seconds']:g}",
                f"{r.get('cpu_seconds', 0.0):g}",
                r["lab_from"],
                r["submission"],
                r["sha256"],
            ]
        )
    atomic_write(path, buffer.getvalue())
