"""One place assembles per-layer hooks: runtime/hooks.py (HeadHookRunner) alone names the attention
hook points and builds LayerActivations; prefix reuse, generation, recording and ablation feed it."""

import ast
from pathlib import Path

import inactive_heads

PACKAGE = Path(inactive_heads.__file__).parent
HOME = PACKAGE / "runtime" / "hooks.py"


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if "attn.hook_" in node.value:
                found.append(f"{path.name}:{node.lineno} names a hook point ({node.value!r}); use hook_name")
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "LayerActivations":
            found.append(f"{path.name}:{node.lineno} builds LayerActivations; use HeadHookRunner.activations")
    return found


def test_only_the_hook_runner_names_hook_points_and_builds_activations():
    offences = [o for path in sorted(PACKAGE.rglob("*.py")) if path != HOME for o in _offences(path)]
    assert offences == []
    assert len(_offences(HOME)) == 2  # the one hook_name and the one LayerActivations(...) (the check sees them)
