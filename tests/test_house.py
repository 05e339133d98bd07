"""House rules of the package, checked on its source: every module declares ``__all__``, and no module
uses another module's private names (a helper two modules need is public, or lives where it is used)."""

import ast

import pytest

from kernels import ROOT

MODULES = sorted(p for p in (ROOT / "kernels").rglob("*.py") if "data" not in p.relative_to(ROOT).parts)


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_uses(path) -> list:
    """``module._name`` and ``from module import _name`` in ``path`` where ``module`` is another module
    of the package (a private *module* such as ``kernels._interpreter`` may be imported: it is the
    package's own; its underscore names may not)."""
    here = module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}  # local name -> the kernels module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kernels.") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "kernels" or node.module.startswith("kernels."):
                for a in node.names:
                    target = f"{node.module}.{a.name}"
                    if (ROOT / (target.replace(".", "/") + ".py")).is_file() or (
                        ROOT / target.replace(".", "/") / "__init__.py"
                    ).is_file():
                        aliases[a.asname or a.name] = target
                    elif a.name.startswith("_") and not a.name.startswith("__") and node.module != here:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and aliases[node.value.id] != here:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {aliases[node.value.id]}.{name}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_every_module_declares_all(path):
    tree = ast.parse(path.read_text(), str(path))
    declared = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    ]
    assert declared, f"{path.relative_to(ROOT)} has no __all__"
    names = ast.literal_eval(declared[0].value)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defined |= {(a.asname or a.name).split(".")[0] for n in imports for a in n.names}
    for n in tree.body:  # BLOCK, WARPS = ...
        if isinstance(n, ast.Assign):
            defined |= {e.id for t in n.targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)}
    assert set(names) <= defined, f"{path.relative_to(ROOT)}: __all__ names {set(names) - defined}, not defined there"


def test_no_module_uses_another_modules_private_names():
    found = [use for path in MODULES for use in private_uses(path)]
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_the_private_name_check_catches_both_spellings(tmp_path, monkeypatch):
    fake = tmp_path / "kernels" / "x.py"
    fake.parent.mkdir()
    (tmp_path / "kernels" / "quantize.py").write_text("")
    fake.write_text("from kernels import quantize as Q\nfrom kernels.quantize import _hidden\nQ._other(1)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert private_uses(fake) == [
        "kernels/x.py:2: from kernels.quantize import _hidden",
        "kernels/x.py:3: kernels.quantize._other",
    ]
