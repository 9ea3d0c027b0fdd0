"""One adapter per TransformerLens line: outside ``inactive_heads/runtime/lines/`` and
``inactive_heads/models/tl_line.py`` no module names ``HookedTransformer`` or ``TransformerBridge``
or branches on the line; each asks ``line_of(model)`` instead.

The rule is about code, read from the syntax tree: a name or attribute ``HookedTransformer`` /
``TransformerBridge`` (an import, an ``isinstance`` against it, a call of it), and a call of one
of the line checks ``is_hooked_transformer``, ``is_bridge``, ``has_hooked_transformer`` and
``line`` (bare or as ``tl_line.line()``). Docstrings, comments and message strings that mention
the classes are prose and do not count.
"""

import ast
from pathlib import Path

import pytest

import inactive_heads as ih

ROOT = Path(ih.__file__).parent
CLASSES = frozenset({"HookedTransformer", "TransformerBridge"})
LINE_CHECKS = frozenset({"is_hooked_transformer", "is_bridge", "has_hooked_transformer", "line"})
ADAPTERS = ("runtime/lines/", "models/tl_line.py")

# Line branches not yet behind an adapter, per module (none left; it held 30 in 11 modules): this
# list only shrinks. A module whose count falls must be lowered here (or removed); one that rises,
# or a new module, fails.
REMAINING: dict[str, int] = {}


def _is_line_check(func: ast.expr, from_tl_line: set[str]) -> str | None:
    """The line check ``func`` names, if it does. ``line`` is a common word: only ``tl_line.line``
    or a ``line`` imported from ``tl_line`` counts (a local helper named ``line`` does not)."""
    if isinstance(func, ast.Name) and func.id in LINE_CHECKS:
        return func.id if func.id != "line" or "line" in from_tl_line else None
    if isinstance(func, ast.Attribute) and func.attr in LINE_CHECKS:
        owner = func.value
        return func.attr if func.attr != "line" or isinstance(owner, ast.Name) and owner.id == "tl_line" else None
    return None


def line_branches(source: str) -> list[tuple[int, str]]:
    """(line, what) for every place ``source`` names a line's class or calls a line check."""
    found = []
    tree = ast.parse(source)
    from_tl_line = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").endswith("tl_line") for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in CLASSES:
            found.append((node.lineno, f"names {node.id}"))
        elif isinstance(node, ast.Attribute) and node.attr in CLASSES:
            found.append((node.lineno, f"names {node.attr}"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name.rsplit(".", 1)[-1] in CLASSES:
                    found.append((node.lineno, f"imports {alias.name}"))
        elif isinstance(node, ast.Call):
            name = _is_line_check(node.func, from_tl_line)
            if name is not None:
                found.append((node.lineno, f"calls {name}()"))
    return sorted(found)


def package_branches(root: Path = ROOT) -> dict[str, list[tuple[int, str]]]:
    """The line branches of every module of the package outside the adapters, by relative path."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ADAPTERS):
            continue
        found = line_branches(path.read_text(encoding="utf-8"))
        if found:
            out[rel] = found
    return out


def check_package(root: Path = ROOT) -> None:
    found = package_branches(root)
    counts = {rel: len(hits) for rel, hits in found.items()}
    print(f"line branches outside the adapters: {sum(counts.values())} in {len(counts)} modules {counts}")
    detail = "; ".join(f"{rel}:{line} {what}" for rel, hits in found.items() for line, what in hits)
    assert counts == REMAINING, f"line branches outside runtime/lines (ask line_of(model) instead): {detail}"


def test_no_module_outside_the_adapters_branches_on_the_line():
    check_package()


@pytest.mark.parametrize("source, expected", [
    ("if is_hooked_transformer(model):\n    pass\n", [(1, "calls is_hooked_transformer()")]),
    ("x = tl_line.is_bridge(model)\n", [(1, "calls is_bridge()")]),
    ("if tl_line.line() == '4':\n    pass\n", [(1, "calls line()")]),
    ("from ..models.tl_line import line\nif line() == '4':\n    pass\n", [(2, "calls line()")]),
    ("if has_hooked_transformer():\n    pass\n", [(1, "calls has_hooked_transformer()")]),
    ("from transformer_lens import HookedTransformer\n",
     [(1, "imports HookedTransformer")]),
    ("ok = isinstance(model, transformer_lens.model_bridge.TransformerBridge)\n",
     [(1, "names TransformerBridge")]),
    ("ok = isinstance(model, TransformerBridge)\n", [(1, "names TransformerBridge")]),
])
def test_a_branch_added_back_is_found(source, expected):
    assert line_branches(source) == expected


def test_prose_about_the_classes_is_not_a_branch():
    source = ('def f(model):\n'
              '    """Runs on a HookedTransformer or a TransformerBridge."""\n'
              '    # a TransformerBridge takes this path too\n'
              '    raise ValueError("not a HookedTransformer")\n'
              'def line(row):\n'
              '    return row\n'
              'line("a local helper named line")\n')
    assert line_branches(source) == []


def test_a_planted_branch_in_a_module_fails_the_package_check(tmp_path):
    """The package scan itself (not only the parser) sees a branch added to a new module."""
    import shutil

    copy = tmp_path / "inactive_heads"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "evaluation" / "planted.py").write_text(
        "from ..models.tl_line import is_bridge\n\n\ndef f(model):\n    return 1 if is_bridge(model) else 2\n")
    with pytest.raises(AssertionError, match=r"evaluation/planted.py:5 calls is_bridge\(\)"):
        check_package(copy)


def test_every_line_adapter_implements_the_interface():
    from inactive_heads.runtime.lines import ModelLine
    from inactive_heads.runtime.lines.base import _FALLBACK, _LINES

    names = [line.name for line in _LINES + _FALLBACK]
    assert sorted(names) == ["bridge", "hooked", "other"]
    for line in _LINES + _FALLBACK:
        assert isinstance(line, ModelLine), line.name


def test_line_of_a_tiny_model_is_its_class_line():
    from inactive_heads.models.tl_line import has_hooked_transformer
    from inactive_heads.runtime.lines import line_of
    from tiny import tiny_gqa_model

    model = tiny_gqa_model()
    assert line_of(model).name == ("hooked" if has_hooked_transformer() else "bridge")
    assert line_of(object()).name == "other"
