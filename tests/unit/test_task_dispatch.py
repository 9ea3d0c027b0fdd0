"""No task is dispatched on by name outside the task definitions: a string comparison with a task
name (``task == "mmlu"``, ``task in ("gsm8k",)``) anywhere else in the package fails here. The task's
own attributes (kind, subjects, metrics, ...) say what it is."""

import ast
from pathlib import Path

import inactive_heads as ih
from inactive_heads.evaluation.tasks import task_names

ROOT = Path(ih.__file__).parent
# Where the tasks are defined: the tasks package, and the generation task's own module.
DEFINITIONS = (ROOT / "evaluation" / "tasks", ROOT / "evaluation" / "gsm8k.py")
NAMES = {"mmlu", "piqa", "winogrande", "gsm8k"}


def _named(node: ast.AST) -> set[str]:
    """The task names a comparison operand spells out: a string, or a tuple/list/set of strings."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)} & NAMES


def task_name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of each ==, !=, in, not in comparison with a task name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            for operand in [node.left, *node.comparators]:
                found += [(node.lineno, name) for name in sorted(_named(operand))]
    return found


def test_the_scan_finds_a_planted_dispatch():
    planted = 'if task == "mmlu":\n    pass\nelif spec.name in ("piqa", "x"):\n    pass\nok = kind == "generation"\n'
    assert task_name_comparisons(planted) == [(1, "mmlu"), (3, "piqa")]


def test_the_names_scanned_for_are_the_builtin_tasks():
    assert NAMES == {n for n in task_names() if ih.evaluation.tasks.is_builtin(n)}


def test_no_task_name_comparison_outside_the_task_definitions():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(path == d or d in path.parents for d in DEFINITIONS):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                      for line, name in task_name_comparisons(path.read_text(encoding="utf-8"))]
    assert offenders == [], "dispatch on the task's kind or attributes instead: " + "; ".join(offenders)
