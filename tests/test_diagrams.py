"""kernels.diagrams: boxes are placed by their centres, arrows run between facing edges, and a bit
layout draws one cell per bit with the field widths of the format table."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kernels import diagrams, formats  # noqa: E402


def _arrow_ends(ax):
    (ann,) = [c for c in ax.get_children() if isinstance(c, matplotlib.text.Annotation)]
    return ann.xyann, ann.xy  # (start, end)


@pytest.mark.parametrize(
    ("a", "b", "start", "end"),
    [
        ((1, 2), (5, 2), (2.25, 2), (3.75, 2)),  # left to right: right edge to left edge
        ((5, 2), (1, 2), (3.75, 2), (2.25, 2)),  # right to left
        ((1, 1), (1, 4), (1, 1.45), (1, 3.55)),  # upwards: top edge to bottom edge
        ((1, 4), (1, 1), (1, 3.55), (1, 1.45)),  # downwards
    ],
)
def test_an_arrow_runs_between_the_facing_edges(a, b, start, end):
    fig, ax = plt.subplots()
    first, second = diagrams.box(ax, a, "a", "w"), diagrams.box(ax, b, "b", "w")
    assert first == (*a, diagrams.WIDTH, diagrams.HEIGHT)
    diagrams.arrow(ax, first, second, "label")
    got_start, got_end = _arrow_ends(ax)
    assert got_start == pytest.approx(start) and got_end == pytest.approx(end)
    assert any(t.get_text() == "label" for t in ax.texts)
    plt.close(fig)


def test_boxes_on_a_diagonal_are_refused_by_name():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="share neither a row nor a column"):
        diagrams.arrow(ax, diagrams.box(ax, (0, 0), "a", "w"), diagrams.box(ax, (3, 3), "b", "w"))
    plt.close(fig)


def test_the_legend_names_each_colour_and_hides_the_frame():
    fig, ax = plt.subplots()
    diagrams.legend(ax, [("#c6dbef", "storage"), ("#fdd0a2", "compute")])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["storage", "compute"]
    assert not ax.axison
    plt.close(fig)


BOOK_FORMATS = ["fp32", "tf32", "bf16", "fp16", "e4m3fn", "e5m2", "e2m1", "e8m0"]


def test_a_bit_layout_has_one_cell_per_bit_with_the_tables_field_widths():
    fig, ax = plt.subplots()
    rows = diagrams.bit_layout(ax, BOOK_FORMATS)
    assert list(rows) == BOOK_FORMATS
    for name, cells in rows.items():
        f = formats.FORMATS[name]
        assert len(cells) == f.bits, name
        assert all(cell in ax.patches for cell in cells)
        # gid "name field bit", most significant bit first
        gids = [cell.get_gid().split() for cell in cells]
        assert [int(bit) for _, _, bit in gids] == list(range(f.bits - 1, -1, -1)), name
        fields = [field for _, field, _ in gids]
        widths = {"sign": int(f.signed), "exponent": f.exponent_bits, "mantissa": f.mantissa_bits}
        assert {field: fields.count(field) for field in widths} == widths, name
        assert fields == sorted(fields, key=list(widths).index), f"{name}: fields out of order"
        for cell, field in zip(cells, fields, strict=True):
            assert cell.get_facecolor() == matplotlib.colors.to_rgba(diagrams.FIELD_COLOURS[field]), (name, field)
        assert any(t.get_text() == f"{name}  {f.bits} bits" for t in ax.texts)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sign", "exponent", "mantissa"]
    plt.close(fig)


def test_an_unsigned_format_keeps_its_exponent_in_the_same_column():
    fig, ax = plt.subplots()
    rows = diagrams.bit_layout(ax, ["e4m3fn", "e8m0"])
    assert rows["e4m3fn"][1].get_x() == rows["e8m0"][0].get_x() == 1  # the first exponent bit
    plt.close(fig)


@pytest.mark.parametrize(
    ("names", "offending"),
    [(["fp32", "e4m3"], "['e4m3']"), (["int8"], "['int8']"), ([], "[]")],
    ids=["misspelt", "integer", "empty"],
)
def test_a_bit_layout_of_an_unknown_format_is_refused_by_name(names, offending):
    fig, ax = plt.subplots()
    expected = r"names must be one or more floating-point formats of kernels\.formats\.FORMATS \(.*e4m3fn.*\)"
    with pytest.raises(ValueError, match=expected + ", got " + re.escape(offending)):
        diagrams.bit_layout(ax, names)
    plt.close(fig)


def test_a_bit_layout_of_one_string_is_refused_not_read_letter_by_letter():
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match="names must be a list of format names, got the string 'fp32'"):
        diagrams.bit_layout(ax, "fp32")
    plt.close(fig)
