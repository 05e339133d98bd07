"""The instructor's command: scores per question, broken submissions reported, bad arguments named."""

import csv
import shutil
from pathlib import Path

import pytest

from kernels import grade

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "00_bf16_rounding.ipynb"


def test_grades_a_folder_and_survives_a_broken_submission(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    untouched = tmp_path / "alice.ipynb"
    shutil.copy(LAB, untouched)
    broken = tmp_path / "bob.ipynb"
    broken.write_text("{ this is not a notebook")
    out_csv = tmp_path / "scores.csv"
    assert grade.main([str(LAB), str(untouched), str(broken), "--csv", str(out_csv)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{untouched}: 0/5") and "q1 0/2" in lines[0] and "q2 0/3" in lines[0]
    assert lines[1].startswith(f"{broken}: 0/") and "ERROR" in lines[1]
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["submission"] for r in rows] == [str(untouched), str(broken)]
    assert rows[0]["earned"] == "0.0" and rows[0]["possible"] == "5.0" and rows[1]["error"]


def test_bad_arguments_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        grade.main([str(tmp_path / "nope.ipynb"), str(LAB)])
    assert "lab: no such notebook" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grade.main([str(LAB), str(tmp_path / "missing.ipynb")])
    assert "submissions: no such file(s)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="holds no otter tests"):
        grade.lab_tests(ROOT / "book" / "00_preface.ipynb")
