"""kernels.diagrams: boxes are placed by their centres, arrows run between facing edges."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kernels import diagrams  # noqa: E402


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
