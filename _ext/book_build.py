"""Build-time adjustments for the book, loaded through ``sphinx.local_extensions`` in _config.yml.

Offline MathJax
    MathJax 3 (es5/tex-chtml-full.js and the woff-v2 fonts it loads) lives in _static/mathjax, and
    ``mathjax_path`` points at it, so math renders without a network.  jupyter-book adds every .js
    file found under _static to every page; MathJax must be loaded exactly once, by
    sphinx.ext.mathjax (after its configuration, and only on pages with math), so the bundled
    files are taken back out of ``html_js_files`` here.

Provenance cells
    ``kernels.authoring.record`` puts a markdown cell tagged ``provenance`` first in every notebook it runs:
    a one-line blockquote naming the GPU and versions that produced the outputs.  myst-nb gives
    *code* cells a ``tag_<name>`` class but renders markdown cells without a wrapper, so their
    tags never reach the HTML.  Here the blockquote of such a cell gets the classes
    ``tag_provenance`` and ``provenance`` and is moved under the page title; _static/custom.css
    styles it.

Bibliography order
    The bibliography style ``lowprec`` is pybtex's ``plain`` with one change: sorting ignores the
    braces that protect an organisation's name (``{{Open Compute Project}}``), which would otherwise
    put every organisation after all the people.
"""

from pathlib import Path

import nbformat
from docutils import nodes
from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.sorting.author_year_title import SortingStyle
from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_DIR = "mathjax/"
PROVENANCE_TAG = "provenance"


def _js_name(entry) -> str:
    return entry[0] if isinstance(entry, (tuple, list)) else entry


def _serve_mathjax_once(app, config) -> None:
    config.html_js_files = [e for e in config.html_js_files if not _js_name(e).startswith(MATHJAX_DIR)]
    path = config.mathjax_path
    if "://" in path:
        return  # a URL: nothing bundled to check
    if not any((Path(app.confdir) / static / path).is_file() for static in config.html_static_path):
        logger.warning(
            "mathjax_path %r is not a file under html_static_path %r",
            path,
            config.html_static_path,
            type="book",
            subtype="mathjax",
        )


def _first_cell_is_provenance(source: Path) -> bool:
    if source.suffix != ".ipynb" or not source.is_file():
        return False
    cells = nbformat.read(source, as_version=4).cells
    return bool(cells) and cells[0].cell_type == "markdown" and PROVENANCE_TAG in cells[0].metadata.get("tags", [])


def _mark_provenance(app, doctree) -> None:
    docname = app.env.docname
    if not _first_cell_is_provenance(Path(app.env.doc2path(docname))):
        return
    quote = next(iter(doctree.findall(nodes.block_quote)), None)
    if quote is None:
        logger.warning(
            "the provenance cell of %s is not a blockquote; it is left unstyled",
            docname,
            type="book",
            subtype="provenance",
            location=docname,
        )
        return
    quote["classes"].extend(["tag_" + PROVENANCE_TAG, PROVENANCE_TAG])
    # The recorder puts the cell above the notebook's "# Title"; show it under the title instead.
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is not None and quote.parent is not section and len(section) and isinstance(section[0], nodes.title):
        quote.parent.remove(quote)
        section.insert(1, quote)


class BraceBlindSorting(SortingStyle):
    def person_key(self, person):
        return super().person_key(person).replace("{", "").replace("}", "")


class BookStyle(PlainStyle):
    default_sorting_style = "lowprec"


def setup(app):
    register_plugin("pybtex.style.sorting", "lowprec", BraceBlindSorting, force=True)
    register_plugin("pybtex.style.formatting", "lowprec", BookStyle, force=True)
    app.connect("config-inited", _serve_mathjax_once)
    app.connect("doctree-read", _mark_provenance)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
