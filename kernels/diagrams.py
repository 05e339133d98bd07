"""Boxes and arrows for the book's dataflow diagrams, drawn with matplotlib.

Used by the chapters' figures (Chapter 4's training step by tier, Chapter 6's W4A16 kernel); no lab.
Entry points: :func:`box`, :func:`arrow`, :func:`legend`.  A diagram is an ``Axes`` with its frame
turned off; boxes are placed by their centres in data coordinates, and arrows run between the edges
of two boxes, so a diagram is a list of positions and labels, not of pixel offsets.
"""

from matplotlib.patches import FancyBboxPatch

WIDTH, HEIGHT = 2.5, 0.9  # a box's size in data units


def box(ax, centre, text: str, colour, width: float = WIDTH, height: float = HEIGHT) -> tuple:
    """Draw a rounded box centred at ``centre`` = (x, y) with ``text`` in it; return ``(x, y, width,
    height)``, what :func:`arrow` needs to start or end at its edge."""
    x, y = centre
    ax.add_patch(
        FancyBboxPatch((x - width / 2, y - height / 2), width, height, boxstyle="round,pad=0.05", fc=colour, ec="0.3")
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=8.5)
    return (x, y, width, height)


def arrow(ax, start: tuple, end: tuple, text: str = "") -> None:
    """An arrow from box ``start`` to box ``end`` (as :func:`box` returns them), horizontal or vertical:
    it leaves and enters at the edges that face each other.  ``text`` labels it, above its middle."""
    (x0, y0, w0, h0), (x1, y1, w1, h1) = start, end
    if abs(y1 - y0) < 1e-9:  # side by side
        sign = 1 if x1 > x0 else -1
        a, b = (x0 + sign * w0 / 2, y0), (x1 - sign * w1 / 2, y1)
    elif abs(x1 - x0) < 1e-9:  # one above the other
        sign = 1 if y1 > y0 else -1
        a, b = (x0, y0 + sign * h0 / 2), (x1, y1 - sign * h1 / 2)
    else:
        raise ValueError(f"arrow: boxes at {(x0, y0)} and {(x1, y1)} share neither a row nor a column")
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "->", "color": "0.25", "lw": 1.2})
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.15, text, ha="center", fontsize=7.5, color="0.25")


def legend(ax, entries, loc: str = "lower right") -> None:
    """A legend of coloured squares, ``entries`` = [(colour, label), ...], and the frame turned off."""
    for colour, label in entries:
        ax.plot([], [], "s", color=colour, markersize=12, label=label)
    ax.legend(loc=loc, fontsize=8, frameon=False)
    ax.axis("off")


__all__ = ["arrow", "box", "legend"]
