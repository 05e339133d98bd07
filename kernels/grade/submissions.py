"""Submissions: which lab, which student.  :func:`find_notebooks` lists the notebooks named or under
the named folders, :func:`identify` makes each a :class:`Submission` (its lab, its student, its hash,
whether it is a notebook at all), :func:`read_roster` reads ``--roster``, and :func:`review_intake` flags
what needs every submission at once (two notebooks of one student, answer cells identical across
students, notebooks the roster does not list).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import re
from pathlib import Path

from kernels.grade.config import ROOT

__all__ = ["Submission", "find_notebooks", "identify", "read_roster", "review_intake"]


@dataclasses.dataclass
class Submission:
    path: Path
    student: str
    lab: str | None
    lab_from: str  # "metadata", "file name", "--lab" or ""
    sha256: str
    notebook_error: str = ""  # why the file is not a notebook (or why it was refused)
    intake: list = dataclasses.field(default_factory=list)  # [(flag, note)] found before grading
    answers: dict = dataclasses.field(default_factory=dict)  # {hash of an answer cell: its first line}


def find_notebooks(paths) -> list:
    """[(notebook, the folder it was found under or None)] for every ``*.ipynb`` named or under a named
    folder (checkpoints skipped), in a stable order.  Symbolic links are listed too (and refused when
    graded), never followed: a link could point at a classmate's work or at the solutions."""
    found = []
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            for folder, dirs, files in os.walk(p, followlinks=False):
                dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
                for name in sorted(files) + sorted(d for d in dirs if Path(folder, d).is_symlink()):
                    if name.endswith(".ipynb"):
                        found.append((Path(folder) / name, p))
        elif p.is_file() or p.is_symlink():
            found.append((p, None))
        else:
            raise FileNotFoundError(f"submissions: no such file or folder: {p}")
    return found


def _symlink_in(path: Path, base: Path | None) -> Path | None:
    """The first symbolic link on the way from ``base`` (or the file's own folder) down to ``path``."""
    parts = [path]
    if base is not None:
        rel = path.relative_to(base)
        parts = [base / Path(*rel.parts[: i + 1]) for i in range(len(rel.parts))]
    return next((p for p in parts if p.is_symlink()), None)


def read_roster(path: Path) -> dict:
    """``--roster``: a CSV with columns ``student`` and ``file`` (a notebook, or a folder of them, relative
    to the roster's folder or absolute) -> {resolved path: student}."""
    rows = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"student", "file"} <= set(reader.fieldnames):
            raise ValueError(f"roster: {path} needs the columns student and file, has {reader.fieldnames}")
        for i, row in enumerate(reader, start=2):
            student, file = (row.get("student") or "").strip(), (row.get("file") or "").strip()
            if not student or not file:
                raise ValueError(f"roster: {path} line {i}: both student and file are needed")
            rows[(path.parent / file).resolve()] = student
    return rows


def identify(
    path: Path, labs: dict, forced_lab: str | None = None, base: Path | None = None, roster=None
) -> Submission:
    """Which lab and which student a notebook is.  The student is, in this order: the ``roster``'s name
    for the file or a folder above it; the first folder under ``base`` (one folder per student:
    ``submissions/alice/anything.ipynb`` is alice's, whatever the file is called); the file name without
    the lab's name (``alice_00_bf16_rounding.ipynb``, for files side by side)."""
    link = _symlink_in(path, base)
    if link is not None:
        student = _student_from(path, base, labs, None, roster)
        target = os.readlink(link)
        sub = Submission(path, student, None, "", "", f"a symbolic link ({link.name} -> {target}): not followed")
        sub.intake.append(("symlink", sub.notebook_error))
        return sub
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    error, meta_lab, intake, nb = "", None, [], None
    try:
        import nbformat

        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("it has no list of cells")
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as e:  # Jupyter opens it anyway (with a warning): so does the grader
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            intake.append(
                ("repaired", f"the notebook does not follow the nbformat schema ({first[:200]}); graded as is")
            )
        if not any(isinstance(c, dict) and c.get("cell_type") == "code" for c in nb.cells):
            error = "the notebook has no code cells"
        meta = nb.get("metadata", {}).get("otter", {})
        meta_lab = meta.get("assignment_name") if isinstance(meta, dict) else None
        meta_lab = meta_lab if isinstance(meta_lab, str) else None
    except Exception as e:  # noqa: BLE001 - anything unreadable is "not a notebook", with the reason
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        error = f"not a notebook: {type(e).__name__}: {first}"[:300]
    lab, lab_from = None, ""
    if forced_lab:
        lab, lab_from = forced_lab, "--lab"
    elif meta_lab in labs:
        lab, lab_from = meta_lab, "metadata"
    else:
        names = [path.stem, *(part for part in reversed(path.parent.parts))]
        for name in names:
            hits = [lab for lab in labs.values() for alias in lab.aliases() if alias.lower() in name.lower()]
            if hits:
                lab, lab_from = hits[0].name, "file name"
                break
    sub = Submission(path, _student_from(path, base, labs, lab, roster), lab, lab_from, sha, error, intake)
    if nb is not None and not error and lab in labs:
        sub.answers = _answer_cells(nb, labs[lab].graded_names())
    return sub


def _student_from(path: Path, base, labs, lab, roster) -> str:
    if roster:
        resolved = path.absolute()
        for candidate in [resolved, *resolved.parents]:
            if candidate in roster:
                return roster[candidate]
        return ""
    if base is not None and len(path.relative_to(base).parts) > 1:
        return path.relative_to(base).parts[0]
    student = path.stem
    if lab:
        for alias in sorted(labs[lab].aliases(), key=len, reverse=True) if lab in labs else [lab]:
            student = re.sub(re.escape(alias), "", student, flags=re.IGNORECASE)
        student = student.strip("_-. ")
    return student or path.parent.name or path.stem


def _answer_cells(nb, names=None) -> dict:
    """{sha256 of a code cell's normalised source: its first line} for the cells worth comparing across
    students: those that define one of the graded ``names`` (all code cells if None), a few lines at
    least."""
    defines = re.compile(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", flags=re.M)
    out = {}
    for cell in nb.cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        lines = [line.rstrip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
        if len(lines) < 3:
            continue
        if names is not None and not {a or b for a, b in defines.findall(source)} & set(names):
            continue
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        out[digest] = lines[0][:80]
    return out


def _lab_cells() -> set:
    """Digests of the labs' own code cells (what every student is given)."""
    import nbformat

    digests = set()
    for path in (ROOT / "labs").glob("*.ipynb"):
        digests |= set(_answer_cells(nbformat.read(path, as_version=4)))
    return digests


def review_intake(submissions: list):
    """Flags that need every submission at once: two notebooks for one student and lab, and answer cells
    that are character for character the same in different students' notebooks (comments and blank
    lines aside), which the instructor should look at."""
    by_key = {}
    for sub in submissions:
        if sub.lab and sub.student:
            by_key.setdefault((sub.student, sub.lab), []).append(sub)
    for (student, lab), subs in by_key.items():
        if len(subs) > 1:
            for sub in subs:
                others = ", ".join(str(o.path) for o in subs if o is not sub)
                sub.intake.append(("duplicate", f"{student} has another notebook for {lab}: {others}"))
    given = _lab_cells()
    owners = {}
    for sub in submissions:
        for digest in set(sub.answers) - given:
            owners.setdefault((sub.lab, digest), []).append(sub)
    for (_, digest), subs in owners.items():
        students = sorted({s.student for s in subs})
        if len(students) < 2:
            continue
        for sub in subs:
            same = ", ".join(s for s in students if s != sub.student)
            sub.intake.append(
                ("identical-answer", f"a cell starting {sub.answers[digest]!r} is identical in {same}'s notebook")
            )
    for sub in submissions:
        if not sub.student:
            sub.intake.append(("not-in-roster", f"{sub.path} is not in the roster: not graded"))
