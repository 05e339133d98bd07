"""The package's layout: no import cycle among the modules of ``kernels``, and no module uses another
module's private names (a helper two modules need is public, or lives where it is used).

Each module of ``kernels/`` is a node (a package's ``__init__`` is the node of the package's own name,
``kernels`` included) and each import of one by another is an edge, wherever the import stands: at the
top, inside a function or under ``if TYPE_CHECKING``.  A lazy import inside a function breaks a cycle at
import time only; the two modules still cannot be understood, tested or moved one without the other,
and a later top-level import turns it into an ImportError, so every cycle fails here, named.

An import of a submodule is an edge to that submodule only, not to the packages above it (which Python
runs first): otherwise every ``__init__`` that imports its own submodules, as ``kernels/__init__.py``
imports ``kernels._mode``, would close a cycle with each of them.  An import of ``kernels`` itself
counts: the root ``__init__`` imports ``_mode`` (and through it ``_interpreter`` and ``_jit_rules``), so
one of those importing ``kernels`` would be a real cycle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kernels"


def module_names(package: Path = PACKAGE) -> dict:
    """{dotted module name: its file} for every ``.py`` file under ``package``."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _owner(name: str, modules: dict) -> str | None:
    """The module that ``name`` (a module, or a name inside one) lives in, if it is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _source(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute name of the module a ``from ... import`` takes from (``from . import x`` too)."""
    if not node.level:
        return node.module or ""
    package = (module if path.name == "__init__.py" else module.rpartition(".")[0]).split(".")
    return ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict) -> set:
    """The modules among ``modules`` that ``module`` (the file ``path``) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):  # import kernels.x.y [as z]
            found.update(_owner(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):  # from kernels import x: the submodule x if there is one
            source = _source(node, module, path)
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in modules else _owner(source, modules))
    found.discard(None)
    found.discard(module)
    return found


def private_names_used(module: str, path: Path, modules: dict) -> list:
    """[(module it belongs to, private name)] for each private name (``_x``, not ``__x__``) of another
    module of the package that ``module`` imports (``from m import _x``) or reads (``m._x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound, used = {}, []  # local name -> the module of the package it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source(node, module, path)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif source in modules and alias.name.startswith("_") and source != module:
                    used.append((source, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "kernels"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            dotted = ast.unparse(node.value)
            head, _, rest = dotted.partition(".")
            owner = ".".join(filter(None, [bound.get(head), rest])) if head in bound else None
            if owner in modules and owner != module and f"{owner}.{node.attr}" not in modules:
                used.append((owner, node.attr))
    return sorted(set(used))


def import_graph(package: Path = PACKAGE) -> dict:
    """{module: the set of modules of the package it imports}."""
    modules = module_names(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict) -> list:
    """One cycle ([a, b, ..., a]) for each group of modules that import each other (Tarjan's strongly
    connected components, each with a shortest cycle through its first module)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:
        start = min(group)
        paths, seen = {start: [start]}, {start}
        frontier = [start]
        while frontier and start not in {w for v in frontier for w in graph[v]}:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group - seen):
                    seen.add(w)
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return sorted(found)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    package = tmp_path / "kernels"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from kernels import a\n",
        "a.py": "import kernels.b\n",
        "b.py": "def f():\n    from kernels.sub.c import thing\n",
        "sub/__init__.py": "from . import c\n",
        "sub/c.py": "from .. import d\nfrom ..a import name\n",
        "d.py": "from kernels import INTERPRETER\nimport numpy\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    assert import_graph(package) == {
        "kernels": {"kernels.a"},
        "kernels.a": {"kernels.b"},
        "kernels.b": {"kernels.sub.c"},
        "kernels.sub": {"kernels.sub.c"},
        "kernels.sub.c": {"kernels.d", "kernels.a"},
        "kernels.d": {"kernels"},
    }
    assert cycles(import_graph(package)) == [
        ["kernels", "kernels.a", "kernels.b", "kernels.sub.c", "kernels.d", "kernels"]
    ]


def test_no_import_cycle_among_the_packages_modules():
    found = cycles(import_graph())
    assert not found, "import cycles among kernels' modules: " + "; ".join(" -> ".join(c) for c in found)


def test_no_module_uses_another_modules_private_names():
    modules = module_names()
    found = [
        f"{name} uses {owner}.{private}"
        for name, path in modules.items()
        for owner, private in private_names_used(name, path, modules)
    ]
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_private_names_are_seen_however_they_are_reached(tmp_path):
    package = tmp_path / "kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("_helper = 1\n")
    (package / "b.py").write_text(
        "from kernels.a import _helper\nimport kernels.a\nfrom kernels import a as alias\n"
        "x = kernels.a._other + alias._third + alias.__name__\n"
    )
    modules = module_names(package)
    assert private_names_used("kernels.b", package / "b.py", modules) == [
        ("kernels.a", "_helper"),
        ("kernels.a", "_other"),
        ("kernels.a", "_third"),
    ]
