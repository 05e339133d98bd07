"""Generate the student labs from the solution notebooks: ``python -m kernels.authoring.labgen [--check]``.

``solutions/NN_name.ipynb`` is the single source of a lab: an otter-grader master notebook (an
ASSIGNMENT CONFIG raw cell, BEGIN/END QUESTION, SOLUTION and TESTS blocks).  For each one this runs
``otter assign`` into a temporary folder (offline: no PDFs, no autograder zip, no test run) and writes
the student notebook to ``labs/NN_name.ipynb``.  The tests travel inside that notebook's metadata, so
a lab is one self-contained file that ``grader.check("q1")`` reads.

The generated file must depend on the solution notebook alone, byte for byte, so that ``--check`` can
tell a stale lab from a fresh one.  Hence, after otter:

* cells tagged ``provenance`` are dropped (a stamping tool adds one to executed solutions);
* outputs and execution counts are cleared, except in cells starting with ``# NBVAL_CHECK_OUTPUT``:
  those keep the solution's stored outputs (and a count from their position, since nbval skips cells
  that look unrun), which nbval then demands of the lab as well; such cells must not depend on the
  exercises, and print only device-independent facts;
* cell ids are renumbered, and cell and notebook metadata are cut down to what otter, Jupyter and
  nbval read (no timestamps, no execution records, no provenance);
* the title changes hands: a solution's first markdown cell opens with ``# Solution to Lab N: ...``, so
  that the book's pages (and the browser's tabs and the "next" buttons that show page titles) tell the
  solution from the lab, and the lab's opens with ``# Lab N: ...``.
"""

import argparse
import contextlib
import copy
import io
import logging
import sys
import tempfile
from pathlib import Path

import nbformat

from kernels import ROOT
from kernels.authoring.record import is_provenance_cell

CHECK_OUTPUT_MARK = "# NBVAL_CHECK_OUTPUT"
# Cell metadata worth keeping: tags (nbval, otter), otter's own entries and its cell locks.
CELL_METADATA_KEPT = ("deletable", "editable", "otter", "tags")
SOLUTION_TITLE, LAB_TITLE = "# Solution to Lab ", "# Lab "
NOTEBOOK_METADATA_KEPT = ("kernelspec", "otter")


class LabgenError(Exception):
    """A solution notebook that cannot become a lab; the message names the file and the cell."""


def _checked_outputs(master: nbformat.NotebookNode, name: str) -> dict:
    """Source -> cleaned outputs of the master's ``# NBVAL_CHECK_OUTPUT`` cells."""
    stored = {}
    for i, cell in enumerate(master.cells):
        if cell.cell_type != "code" or not cell.source.startswith(CHECK_OUTPUT_MARK):
            continue
        if not cell.get("outputs"):
            raise LabgenError(
                f"{name}: cell {i} starts with {CHECK_OUTPUT_MARK} but has no stored output; "
                f"execute the solution notebook first (its outputs are what nbval compares with)"
            )
        stored[cell.source] = [_clean_output(o) for o in cell.outputs]
    return stored


def _clean_output(output) -> nbformat.NotebookNode:
    out = copy.deepcopy(output)
    if out.get("output_type") == "execute_result":
        out["execution_count"] = None
    if "metadata" in out:
        out["metadata"] = {}
    return out


def assign(master_path: Path, result_dir: Path) -> tuple:
    """Run ``otter assign`` on a master notebook (provenance cells removed first), offline and quietly.

    Returns the paths of the student and autograder notebooks otter wrote under ``result_dir``.
    """
    from otter.assign import main as otter_assign

    master = nbformat.read(master_path, as_version=4)
    master.cells = [c for c in master.cells if not is_provenance_cell(c)]
    src = result_dir / "master" / master_path.name
    src.parent.mkdir(parents=True)
    nbformat.write(master, src)
    out = result_dir / "dist"
    # otter reports progress through logging and prints its assignment summary; neither belongs in a
    # generator's output, and failures still raise.
    otter_logger = logging.getLogger("otter")
    level = otter_logger.level
    otter_logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            otter_assign(str(src), str(out), no_pdfs=True, no_run_tests=True)
    except Exception as e:
        raise LabgenError(f"{master_path.name}: otter assign failed: {type(e).__name__}: {e}") from e
    finally:
        otter_logger.setLevel(level)
    return out / "student" / master_path.name, out / "autograder" / master_path.name


def lab_title(cell: nbformat.NotebookNode, name: str) -> None:
    """Turn the solution's title cell (``# Solution to Lab N: ...``) into the lab's (``# Lab N: ...``), in place."""
    if cell.cell_type != "markdown" or not cell.source.startswith(SOLUTION_TITLE):
        raise LabgenError(
            f"{name}: the first markdown cell must open with {SOLUTION_TITLE!r} (the lab's title is made from it), "
            f"got {cell.source.splitlines()[:1]}"
        )
    cell.source = LAB_TITLE + cell.source[len(SOLUTION_TITLE) :]


def render_lab(master_path: Path) -> str:
    """The exact text of the lab generated from one solution notebook."""
    name = f"solutions/{master_path.name}"
    master = nbformat.read(master_path, as_version=4)
    stored = _checked_outputs(master, name)
    with tempfile.TemporaryDirectory(prefix="labgen-") as tmp:
        student_path, _ = assign(master_path, Path(tmp))
        lab = nbformat.read(student_path, as_version=4)

    cells = []
    for cell in lab.cells:
        if is_provenance_cell(cell):
            continue
        cell.metadata = {k: cell.metadata[k] for k in CELL_METADATA_KEPT if k in cell.metadata}
        if cell.cell_type == "code":
            cell.execution_count = None
            cell.outputs = []
            if cell.source.startswith(CHECK_OUTPUT_MARK):
                if cell.source not in stored:
                    raise LabgenError(
                        f"{name}: a {CHECK_OUTPUT_MARK} cell changed between solution and lab "
                        f"(inside a SOLUTION block?): {cell.source.splitlines()[1:2]}"
                    )
                cell.outputs = stored[cell.source]
                # nbval only compares cells that look executed; a count derived from the position
                # keeps the file deterministic.
                cell.execution_count = sum(c.cell_type == "code" for c in cells) + 1
        cells.append(cell)
    lab_title(next((c for c in cells if c.cell_type == "markdown"), nbformat.v4.new_raw_cell()), name)
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:03d}"
    lab.cells = cells
    lab.metadata = {k: lab.metadata[k] for k in NOTEBOOK_METADATA_KEPT if k in lab.metadata}
    lab.metadata["language_info"] = {"name": "python"}
    lab.nbformat, lab.nbformat_minor = 4, 5
    nbformat.validate(lab)
    return nbformat.writes(lab) + "\n"


def expected_labs(root: Path = ROOT) -> dict:
    """labs/NAME.ipynb path -> generated text, for every solutions/NAME.ipynb under ``root``."""
    masters = sorted((root / "solutions").glob("*.ipynb"))
    return {root / "labs" / m.name: render_lab(m) for m in masters}


def stale_labs(root: Path = ROOT) -> list:
    """Messages for every lab that differs from what the generator produces (or has no solution)."""
    want = expected_labs(root)
    problems = []
    for path, text in want.items():
        rel = path.relative_to(root)
        if not path.exists():
            problems.append(f"{rel} is missing: run `python -m kernels.authoring.labgen`")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(
                f"{rel} is stale (differs from solutions/{path.name}): run `python -m kernels.authoring.labgen`"
            )
    for path in sorted((root / "labs").glob("*.ipynb")):
        if path not in want:
            problems.append(f"{path.relative_to(root)} has no solutions/{path.name}: delete it or add the solution")
    return problems


def write_labs(root: Path = ROOT) -> list:
    """Write every lab; returns the paths whose content changed."""
    changed = []
    (root / "labs").mkdir(exist_ok=True)
    for path, text in expected_labs(root).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.authoring.labgen", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming every lab that is stale, missing or orphaned"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "solutions").is_dir():
        parser.error(f"--root {root} has no solutions/ folder")
    try:
        if args.check:
            problems = stale_labs(root)
            for p in problems:
                print(p, file=sys.stderr)
            if not problems:
                print(f"labs up to date ({len(list((root / 'solutions').glob('*.ipynb')))} solution notebooks)")
            return 1 if problems else 0
        changed = write_labs(root)
    except LabgenError as e:
        print(f"labgen: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"wrote {path.relative_to(root)}")
    if not changed:
        print("labs up to date")
    return 0


__all__ = [
    "CELL_METADATA_KEPT",
    "CHECK_OUTPUT_MARK",
    "LAB_TITLE",
    "LabgenError",
    "NOTEBOOK_METADATA_KEPT",
    "SOLUTION_TITLE",
    "assign",
    "expected_labs",
    "lab_title",
    "main",
    "render_lab",
    "stale_labs",
    "write_labs",
]


if __name__ == "__main__":
    sys.exit(main())
