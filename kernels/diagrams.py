"""Boxes and arrows for the book's dataflow diagrams, and the bit layouts of the formats, drawn with
matplotlib.

Used by the chapters' figures (Chapter 1's fields of each format, Chapter 4's training step by tier,
Chapter 6's W4A16 kernel); no lab.  Entry points: :func:`box`, :func:`arrow`, :func:`legend`,
:func:`bit_layout`.  A diagram is an ``Axes`` with its frame turned off; boxes are placed by their
centres in data coordinates, and arrows run between the edges of two boxes, so a diagram is a list of
positions and labels, not of pixel offsets.  A bit layout takes its field widths from
:data:`kernels.formats.FORMATS`, so the figure cannot drift from the decoder the chapters run.
"""

from matplotlib.patches import FancyBboxPatch, Rectangle

from kernels.formats import FORMATS, Format

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


FIELD_COLOURS = {"sign": "#fdd0a2", "exponent": "#c6dbef", "mantissa": "#c7e9c0"}
CELL = 0.7  # a bit's cell is 1 wide and CELL high; rows are 1 apart


def bit_layout(ax, names, loc: str = "lower right") -> dict:
    """One row per format of ``names`` (names of floating-point formats in
    :data:`kernels.formats.FORMATS`, drawn top to bottom): one cell per bit, most significant on the
    left, coloured by field and numbered from ``bits - 1`` down to 0.  The format's name and width
    stand at the left of its row, its field widths at the right, and a legend of the field colours at
    ``loc``.

    Rows start in the same column, so bf16 and tf32 show as the top of an fp32; an unsigned format
    (the e8m0 scale) leaves the sign column empty, so that every exponent field starts there too.
    Returns ``{name: [cell, ...]}``, the ``Rectangle`` of each bit, most significant first; a cell's
    gid (the element id in an SVG) is ``"name field bit"``.
    """
    if isinstance(names, str):
        raise TypeError(f"bit_layout: names must be a list of format names, got the string {names!r}")
    names = list(names)
    known = sorted(n for n, f in FORMATS.items() if isinstance(f, Format))
    wrong = [n for n in names if n not in known]
    if wrong or not names:
        raise ValueError(
            f"bit_layout: names must be one or more floating-point formats of kernels.formats.FORMATS "
            f"({', '.join(known)}), got {wrong or names!r}"
        )
    widest = max(1 + FORMATS[n].exponent_bits + FORMATS[n].mantissa_bits for n in names)
    rows = {}
    for row, name in enumerate(names):
        f = FORMATS[name]
        y = -row
        fields = [("sign", int(f.signed)), ("exponent", f.exponent_bits), ("mantissa", f.mantissa_bits)]
        column = 0 if f.signed else 1  # an unsigned format's exponent still starts in column 1
        bit = f.bits - 1
        cells = []
        for field, width in fields:
            for _ in range(width):
                cell = Rectangle((column, y - CELL / 2), 1, CELL, fc=FIELD_COLOURS[field], ec="0.3", lw=0.6)
                cell.set_gid(f"{name} {field} {bit}")
                ax.add_patch(cell)
                ax.text(column + 0.5, y, str(bit), ha="center", va="center", fontsize=6.5)
                cells.append(cell)
                column, bit = column + 1, bit - 1
        rows[name] = cells
        ax.text(-0.6, y, f"{name}  {f.bits} bits", ha="right", va="center", fontsize=9)
        widths = ", ".join(f"{field} {width}" for field, width in fields)
        ax.text(widest + 0.6, y, widths, ha="left", va="center", fontsize=8, color="0.25")
    # room at the left for the names, at the right for the widths, below the last row for the legend
    ax.set(xlim=(-7, widest + 11), ylim=(-len(names) - 0.6, 0.6))
    legend(ax, [(FIELD_COLOURS[field], field) for field in FIELD_COLOURS], loc)
    return rows


__all__ = ["CELL", "FIELD_COLOURS", "arrow", "bit_layout", "box", "legend"]
