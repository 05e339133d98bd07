"""House rules of the package, checked on its source: every module declares ``__all__`` (the rule on
private names is in ``tests/test_layout.py``, beside the import graph it shares its parsing with)."""

import ast

import pytest

from kernels import ROOT

MODULES = sorted(p for p in (ROOT / "kernels").rglob("*.py") if "data" not in p.relative_to(ROOT).parts)


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
