"""Chapters and solutions carry outputs recorded on a GPU, for exactly the code they contain."""

import pathlib

import nbformat
import pytest

from kernels.authoring import record

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDED = sorted(
    p for d in record.DEFAULT_PATHS for p in (ROOT / d).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
)


def test_there_are_recorded_notebooks():
    assert RECORDED, "book/ and solutions/ hold no notebooks"


@pytest.mark.parametrize("path", RECORDED, ids=[str(p.relative_to(ROOT)) for p in RECORDED])
def test_outputs_recorded_on_a_gpu_for_this_code(path):
    nb = nbformat.read(path, as_version=4)
    rel = path.relative_to(ROOT)
    hint = f"re-record it on a GPU: python -m kernels.authoring.record {rel}"
    prov = nb.metadata.get(record.PROVENANCE_TAG)
    assert prov, f"{rel} has no recorded outputs; {hint}"
    assert set(record.KEYS) <= set(prov), f"{rel}: provenance lacks {set(record.KEYS) - set(prov)}; {hint}"
    assert prov["capability"] not in ("", "0.0") and "CPU" not in prov["gpu"], f"{rel} was not recorded on a GPU"
    assert prov["code_sha256"] == record.code_sha256(nb), f"{rel}: its code changed after the recording; {hint}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    unrun = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unrun, f"{rel}: code cells {unrun} have no recorded execution; {hint}"
    first = nb.cells[0]
    assert record.is_provenance_cell(first), f"{rel}: the first cell must state the provenance; {hint}"
    assert first.source == record.provenance_text(prov), f"{rel}: provenance cell disagrees with metadata; {hint}"


def _toy_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# t"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("print(x)"),
    ]
    return nb


def test_hash_follows_code_not_prose():
    nb = _toy_notebook()
    before = record.code_sha256(nb)
    nb.cells[0].source = "# another title"
    record.stamp(nb, {"gpu": "G", "capability": "9.0", "torch": "t", "triton": "r", "date": "d", "code_sha256": before})
    assert record.code_sha256(nb) == before
    nb.cells[2].source = "print(x + 1)"
    assert record.code_sha256(nb) != before
    # moving code between cells changes the hash too
    nb2 = _toy_notebook()
    nb2.cells[1].source, nb2.cells[2].source = "x = 1\nprint(x)", ""
    assert record.code_sha256(nb2) != record.code_sha256(_toy_notebook())


def test_stamp_replaces_the_old_provenance_cell():
    nb = _toy_notebook()
    prov = {
        "gpu": "NVIDIA H200",
        "capability": "9.0",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "date": "2026-11-30",
        "code_sha256": record.code_sha256(nb),
    }
    record.stamp(nb, prov)
    record.stamp(nb, {**prov, "date": "2026-12-01"})
    tagged = [c for c in nb.cells if record.is_provenance_cell(c)]
    assert len(tagged) == 1 and "2026-12-01" in tagged[0].source and "sm_90" in tagged[0].source
    assert nb.cells[0] is tagged[0]


def test_record_refuses_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        record.environment()
