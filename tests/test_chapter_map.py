"""The chapter map in ``kernels/__init__.py`` (and the README) names modules that exist, and every
chapter kernel, check and benchmark module appears in it."""

import importlib
import re

import kernels
from kernels import ROOT, bench

FIELDS = {
    "Kernels": "kernels/{}.py",
    "Checks": "kernels/checks/{}.py",
    "Tests": "tests/{}.py",
    "Benchmarks": "kernels/bench/{}.py",
}
TOOLING = {"__init__", "device", "testing", "numerics_probe", "gpu_lane", "_mode", "_bounds", "diagrams"}


def chapter_map() -> dict:
    """field -> the names the map gives it, over all chapters."""
    text = kernels.__doc__.split("Chapter map:", 1)[1].split("Beside them:", 1)[0]
    entries = [" ".join(entry.split()) for entry in re.split(r"\n\* ", text)]
    named = {field: [] for field in FIELDS}
    for entry in entries[1:]:
        for field in FIELDS:
            m = re.search(rf"{field}: ([^.]+)\.", entry)
            if m:
                named[field] += re.findall(r"``(\w+)``", m.group(1))
    return named


def test_every_module_the_map_names_exists():
    named = chapter_map()
    assert all(named.values()), named
    missing = [pattern.format(n) for field, pattern in FIELDS.items() for n in named[field]]
    missing = [path for path in missing if not (ROOT / path).is_file()]
    assert not missing, f"the chapter map names modules that do not exist: {missing}"


def test_every_chapter_module_is_on_the_map():
    named = chapter_map()
    kernels_here = {p.stem for p in (ROOT / "kernels").glob("*.py")} - TOOLING
    checks_here = {p.stem for p in (ROOT / "kernels" / "checks").glob("lab*.py")}
    bench_here = {p.stem for p in (ROOT / "kernels" / "bench").glob("*.py")} - {"__init__", "__main__", *bench.TOOLS}
    assert kernels_here <= set(named["Kernels"]), kernels_here - set(named["Kernels"])
    assert checks_here <= set(named["Checks"]), checks_here - set(named["Checks"])
    assert bench_here <= set(named["Benchmarks"]), bench_here - set(named["Benchmarks"])
    assert {f"test_checks_{lab}" for lab in checks_here} <= set(named["Tests"])


def test_the_readme_carries_the_same_map():
    readme = (ROOT / "README.md").read_text()
    named = chapter_map()
    absent = [n for names in named.values() for n in names if f"`{n}`" not in readme]
    assert not absent, f"README.md's chapter map lacks {absent}"


def test_each_chapter_module_says_which_chapter_and_lab_use_it():
    """A module's docstring names, after its first line, the chapter and the lab that use it, and its
    entry points."""
    text = kernels.__doc__.split("Chapter map:", 1)[1].split("Beside them:", 1)[0]
    wrong = []
    for entry in [" ".join(e.split()) for e in re.split(r"\n\* ", text)][1:]:
        chapter = re.match(r"(Chapter \d|Appendix A)", entry).group(1)
        labs = re.findall(r"\b(\d\d) \(", entry.split("Kernels:")[0])
        for name in re.findall(r"``(\w+)``", re.search(r"Kernels: ([^.]+)\.", entry).group(1)):
            doc = importlib.import_module(f"kernels.{name}").__doc__
            opening = " ".join(doc.split("\n\n")[1].split())
            has_lab = any(f"Lab {lab}" in opening for lab in labs) or not labs or "no lab" in opening
            if not (opening.startswith(chapter) and has_lab and "Entry point" in opening):
                wrong.append(f"kernels.{name}: {opening[:80]!r}")
    assert not wrong, "docstrings whose second paragraph does not name chapter, lab and entry points:\n" + "\n".join(
        wrong
    )
