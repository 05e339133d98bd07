"""The student edition, built with ``_toc_student.yml``, is the book without its solutions, and no page
of it links to a page it lacks.

Sphinx resolves a ``{doc}`` role only against the pages of the table of contents it builds; a link to
one of the solutions would build with no more than an "unknown document" warning and reach the student
as dead text.  The roles are read from the markdown cells of the notebooks and from the ``.md`` pages,
in both MyST forms, ``{doc}`target``` and ``{doc}`text <target>```, with the target relative to the
linking page's folder (or to the root, with a leading ``/``) and without extension, as Sphinx reads it.
"""

import json
import posixpath
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FULL_TOC, STUDENT_TOC = "_toc.yml", "_toc_student.yml"
SOLUTIONS = "solutions/"

DOC_ROLE = re.compile(r"\{doc\}`([^`]+)`")  # the text may run over a line break
EXPLICIT_TARGET = re.compile(r"<([^<>]+)>\s*$")


def toc_pages(root: Path, toc: str) -> list:
    """The pages of a jb-book table of contents, the root page first, then in reading order."""
    data = yaml.safe_load((root / toc).read_text(encoding="utf-8"))
    pages = [data["root"]]

    def walk(node):
        if isinstance(node, list):
            for entry in node:
                walk(entry)
        elif isinstance(node, dict):
            if "glob" in node:  # the pages would depend on the files present, not on the TOC
                raise ValueError(f"{toc}: glob entries are not read here, got {node['glob']!r}")
            if "file" in node:
                pages.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                walk(node.get(key, []))

    walk(data)
    return pages


def page_text(root: Path, page: str) -> str:
    """What MyST parses for links on a page: a notebook's markdown cells, or a whole ``.md`` file."""
    notebook, markdown = root / f"{page}.ipynb", root / f"{page}.md"
    if notebook.is_file():
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        sources = [c["source"] for c in cells if c["cell_type"] == "markdown"]
        return "\n\n".join(s if isinstance(s, str) else "".join(s) for s in sources)
    if markdown.is_file():
        return markdown.read_text(encoding="utf-8")
    raise FileNotFoundError(f"the TOC lists {page}, but neither {page}.ipynb nor {page}.md exists")


def doc_targets(text: str) -> list:
    """The targets of the ``{doc}`` roles in ``text``, as written."""
    targets = []
    for content in DOC_ROLE.findall(text):
        explicit = EXPLICIT_TARGET.search(content)
        targets.append((explicit.group(1) if explicit else content).strip())
    return targets


def resolve(page: str, target: str) -> str:
    """The page a ``{doc}`` target on ``page`` names, as a path from the root without extension."""
    if target.startswith("/"):
        return posixpath.normpath(target.lstrip("/"))
    return posixpath.normpath(posixpath.join(posixpath.dirname(page), target))


def broken_links(root: Path, toc: str) -> list:
    """``"page: target"`` for every ``{doc}`` link on a page of ``toc`` to a page that ``toc`` lacks."""
    pages = toc_pages(root, toc)
    listed = set(pages)
    return [
        f"{page}: {target}"
        for page in pages
        for target in doc_targets(page_text(root, page))
        if resolve(page, target) not in listed
    ]


def test_the_student_toc_is_the_full_toc_without_the_solutions():
    full, student = toc_pages(ROOT, FULL_TOC), toc_pages(ROOT, STUDENT_TOC)
    solutions = [p for p in full if p.startswith(SOLUTIONS)]
    assert solutions, f"{FULL_TOC} lists no page of {SOLUTIONS}"
    assert student == [p for p in full if p not in solutions], (
        f"{STUDENT_TOC} must list the pages of {FULL_TOC} but {SOLUTIONS}, in the same order; "
        f"only in the student TOC: {sorted(set(student) - set(full))}, "
        f"missing from it: {sorted(set(full) - set(student) - set(solutions))}"
    )


def test_every_link_of_the_student_edition_reaches_a_page_of_it():
    offenders = broken_links(ROOT, STUDENT_TOC)
    assert not offenders, f"{STUDENT_TOC}: links to pages outside the student edition:\n" + "\n".join(offenders)


def _write_book(root: Path, pages: dict) -> None:
    """A book under ``root``: a TOC of ``pages`` ({page: markdown}), notebooks for pages under
    ``book/``, ``.md`` files for the others."""
    for page, text in pages.items():
        path = root / page
        path.parent.mkdir(parents=True, exist_ok=True)
        if page.startswith("book/"):
            cells = [
                {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)},
                {"cell_type": "code", "metadata": {}, "source": "# {doc}`not a link <nowhere>`", "outputs": []},
            ]
            path.with_suffix(".ipynb").write_text(json.dumps({"cells": cells}), encoding="utf-8")
        else:
            path.with_suffix(".md").write_text(text, encoding="utf-8")
    root_page, *rest = pages
    toc = {"format": "jb-book", "root": root_page, "parts": [{"chapters": [{"file": p} for p in rest]}]}
    (root / "toc.yml").write_text(yaml.safe_dump(toc), encoding="utf-8")


def test_the_links_are_read_in_every_form_and_resolved_from_the_linking_page(tmp_path):
    _write_book(
        tmp_path,
        {
            "index": "{doc}`book/one`, {doc}`/book/two`, {doc}`the lab <labs/lab>`",
            "book/one": "{doc}`two`, {doc}`Lab 1 <../labs/lab>`, {doc}`Solution 1\n<../solutions/lab>`",
            "book/two": "{doc}`one` and {doc}`glossary` and {doc}`three <one.ipynb>`",
            "labs/lab": "{doc}`/index`, {doc}`Chapter 1 <../book/one>`",
        },
    )
    assert broken_links(tmp_path, "toc.yml") == [
        "book/one: ../solutions/lab",
        "book/two: glossary",
        "book/two: one.ipynb",  # Sphinx wants the name without extension
    ]


def test_a_page_the_toc_lists_but_the_tree_lacks_is_named(tmp_path):
    _write_book(tmp_path, {"index": "{doc}`book/one`"})
    toc = yaml.safe_load((tmp_path / "toc.yml").read_text())
    toc["parts"] = [{"chapters": [{"file": "book/one"}]}]
    (tmp_path / "toc.yml").write_text(yaml.safe_dump(toc))
    with pytest.raises(FileNotFoundError, match="the TOC lists book/one"):
        broken_links(tmp_path, "toc.yml")
