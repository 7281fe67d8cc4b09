"""The package's import graph: no cycles, at module level or through a function's own imports (which
are only for commands and for keeping torch out of modules that do not need it)."""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "oocgnn"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module_level: bool) -> set:
    """The package modules `path` imports (relative and absolute), at module level only or everywhere."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "oocgnn":
                continue
            for alias in node.names:             # `from . import x` / `from .policies import base`: a module
                sub = f"{target}.{alias.name}"
                out.add(sub if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                        or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "oocgnn"}
    out.discard(name)
    return out


def _graph(module_level: bool) -> dict:
    return {_module(p): _imports(p, module_level) for p in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("module_level", [True, False], ids=["module level", "with function imports"])
def test_the_import_graph_has_no_cycle(module_level):
    graph = _graph(module_level)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100, "the graph was read"
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")
    assert order.index("oocgnn.store") < order.index("oocgnn.loop") < order.index("oocgnn.train")


def test_the_cycle_check_sees_a_cycle():
    """The oracle catches what it is for: a cycle made by hand."""
    with pytest.raises(CycleError):
        list(TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}}).static_order())
