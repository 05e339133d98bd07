"""labs/ is exactly what ``python -m kernels.authoring.labgen`` makes of solutions/, and the otter pipeline grades.

The grading test runs otter's own grading (execute the notebook, then run the tests stored in the lab)
on the solution and on the untouched lab: full marks and zero.  It executes both notebooks in the CPU
interpreter, about half a minute together.
"""

import copy
import shutil
from pathlib import Path

import nbformat
import pytest

from kernels import ROOT
from kernels.authoring import labgen
from kernels.authoring.record import is_provenance_cell

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def test_labs_are_generated_from_solutions():
    problems = labgen.stale_labs(ROOT)
    assert not problems, "\n".join(problems)


def _copy_root(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "solutions").mkdir(parents=True)
    (root / "labs").mkdir()
    for path in SOLUTIONS:
        shutil.copy(path, root / "solutions" / path.name)
    return root


LAB0 = "00_bf16_rounding.ipynb"


def test_check_names_stale_missing_and_orphaned_labs(tmp_path, capsys):
    root = _copy_root(tmp_path)
    assert labgen.main(["--check", "--root", str(root)]) == 1
    assert f"labs/{LAB0} is missing: run `python -m kernels.authoring.labgen`" in capsys.readouterr().err

    assert labgen.main(["--root", str(root)]) == 0
    assert f"wrote labs/{LAB0}" in capsys.readouterr().out
    assert labgen.main(["--check", "--root", str(root)]) == 0
    assert (root / "labs" / LAB0).read_bytes() == (ROOT / "labs" / LAB0).read_bytes()

    lab = root / "labs" / LAB0
    lab.write_text(lab.read_text().replace("Lab 0", "Lab zero"))
    (root / "labs" / "99_gone.ipynb").write_text("{}")
    assert labgen.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"labs/{LAB0} is stale (differs from solutions/{LAB0}): run `python -m kernels.authoring.labgen`" in err
    assert "labs/99_gone.ipynb has no solutions/99_gone.ipynb" in err


def test_executed_and_stamped_solution_gives_the_same_lab(tmp_path):
    """What a GPU run and the provenance tool change in a solution must not reach the lab."""
    master = nbformat.read(ROOT / "solutions" / LAB0, as_version=4)
    stamped = copy.deepcopy(master)
    note = nbformat.v4.new_markdown_cell("Executed on STAMPED-DEVICE at commit abc123.")
    note.metadata["tags"] = ["provenance"]
    stamped.cells.insert(0, note)
    stamped.metadata["provenance"] = {"device": "STAMPED-DEVICE", "when": "2026-01-01T00:00:00Z"}
    for i, cell in enumerate(stamped.cells):
        if cell.cell_type == "code" and not cell.source.startswith(labgen.CHECK_OUTPUT_MARK):
            cell.execution_count = 100 + i
            cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"GPU says {i}\n")]
    path = tmp_path / LAB0
    nbformat.write(stamped, path)
    text = labgen.render_lab(path)
    assert text == (ROOT / "labs" / LAB0).read_text(encoding="utf-8")
    assert "STAMPED-DEVICE" not in text and "2026-01-01" not in text and "GPU says" not in text


def test_check_output_cell_without_stored_output_is_an_error(tmp_path):
    master = nbformat.read(ROOT / "solutions" / LAB0, as_version=4)
    for cell in master.cells:
        if cell.cell_type == "code" and cell.source.startswith(labgen.CHECK_OUTPUT_MARK):
            cell.outputs = []
            break
    nbformat.write(master, tmp_path / LAB0)
    with pytest.raises(labgen.LabgenError, match="has no stored output; execute the solution notebook first"):
        labgen.render_lab(tmp_path / LAB0)


@pytest.mark.parametrize("master", SOLUTIONS, ids=lambda p: p.name)
def test_lab_shape(master):
    lab = nbformat.read(ROOT / "labs" / master.name, as_version=4)
    code = [c for c in lab.cells if c.cell_type == "code"]
    first = code[0].source
    assert first.index("import kernels") < first.index("from kernels import device") < first.index("device.report()"), (
        "the first code cell must import kernels and report the device"
    )
    assert f'otter.Notebook("{master.name}")' in "\n".join(c.source for c in code)
    tests = lab.metadata["otter"]["tests"]
    assert tests, "the tests travel in the lab's metadata"
    checks = [c.source for c in code if c.source.startswith("grader.check(")]
    assert checks == [f'grader.check("{q}")' for q in tests]
    for cell in code:
        if not cell.source.startswith(labgen.CHECK_OUTPUT_MARK):
            assert not cell.outputs and cell.execution_count is None
    # solutions stay in the solution notebook
    sources = "\n".join(c.source for c in code)
    assert "BEGIN SOLUTION" not in sources and "BEGIN PROMPT" not in sources
    assert not any(c.cell_type == "raw" for c in lab.cells), "otter's block markers must be gone"


def test_lab0_prompts_replace_the_solutions():
    lab = nbformat.read(ROOT / "labs" / LAB0, as_version=4)
    sources = "\n".join(c.source for c in lab.cells if c.cell_type == "code")
    assert 'raise NotImplementedError("q1: round fp32 bit patterns to bf16 bit patterns")' in sources
    assert "out = u >> 16" in sources  # q2 starts from truncation, which its check diagnoses
    assert "0x7FFF + lsb) >> 16" not in sources


def _grade(notebook: Path, lab: Path, tmp_path: Path):
    """The batch grader's score of ``notebook`` as lab ``lab``; returns (earned, possible)."""
    from kernels import grade

    out = tmp_path / f"grades-{notebook.parent.name}"
    (result,) = grade.grade([notebook], out, lab=lab.stem, progress=False)
    assert result["status"] == "ok", f"{notebook.name}: status {result['status']}: {result.get('detail', '')}"
    return result["total"], result["possible"]


@pytest.mark.parametrize("master", SOLUTIONS, ids=lambda p: p.name)
def test_otter_grades_solution_full_and_untouched_lab_zero(master, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # otter writes its log where the notebook runs
    with_solutions = tmp_path / "autograder"
    _, autograder_nb = labgen.assign(master, with_solutions)
    lab = ROOT / "labs" / master.name
    earned, possible = _grade(autograder_nb, lab, tmp_path)
    assert possible > 0 and earned == possible, f"solution graded {earned}/{possible}"
    student = tmp_path / "student" / master.name
    student.parent.mkdir()
    shutil.copy(lab, student)
    earned, possible = _grade(student, lab, tmp_path)
    assert earned == 0, f"the untouched lab earned {earned}/{possible}"


@pytest.mark.parametrize("master", SOLUTIONS, ids=lambda p: p.name)
def test_the_solution_and_the_lab_are_titled_apart(master):
    def title(path):
        nb = nbformat.read(path, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "markdown" and not is_provenance_cell(c))
        return first.source.splitlines()[0]

    solution, lab = title(master), title(ROOT / "labs" / master.name)
    assert solution.startswith(labgen.SOLUTION_TITLE) and lab.startswith(labgen.LAB_TITLE)
    assert solution[len(labgen.SOLUTION_TITLE) :] == lab[len(labgen.LAB_TITLE) :]


@pytest.mark.parametrize("source", ["# Lab 3: a title the lab would share", "Some text\n# Solution to Lab 3: late"])
def test_a_solution_titled_like_its_lab_is_refused(source):
    with pytest.raises(labgen.LabgenError, match=r"solutions/x\.ipynb: the first markdown cell must open with"):
        labgen.lab_title(nbformat.v4.new_markdown_cell(source), "solutions/x.ipynb")
