"""The package's folders are the pipeline's stages, and imports point down them only.

Both checks read every ``import`` statement of the package, those inside functions included
(grimp, the import graph behind import-linter), so a lazy import that reaches back up fails here.
"""

import importlib
import re
from pathlib import Path

import grimp
import pytest

import inactive_heads as ih

ROOT = Path(ih.__file__).parent
STAGES = ("models", "runtime", "scoring", "ablation", "pruning", "evaluation", "analysis", "prediction", "sweep",
          "reporting", "lmeval")


def _module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def test_a_planted_cycle_is_found():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _module_cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_package_has_no_import_cycle():
    graph = grimp.build_graph("inactive_heads")
    # Each package __init__ imports its own modules; only cycles between modules count.
    assert _module_cycles(graph) == []


def test_the_layers_contract_holds():
    from importlinter.cli import lint_imports

    root = Path(__file__).resolve().parents[2]
    assert lint_imports(config_filename=str(root / "pyproject.toml")) == 0, "lint-imports: see the report above"


def test_every_stage_is_a_folder_named_in_the_contract():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    layers = re.findall(r'"inactive_heads\.(\w+)"', text)
    for stage in STAGES:
        assert (ROOT / stage / "__init__.py").is_file(), stage
        assert stage in layers, stage
    flat = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "cli", "__main__"))
    assert flat == [], f"modules outside a stage folder: {flat}"


@pytest.mark.parametrize("name", sorted(ih.__all__))
def test_every_public_name_resolves(name):
    assert getattr(ih, name) is not None
    importlib.import_module("inactive_heads")
