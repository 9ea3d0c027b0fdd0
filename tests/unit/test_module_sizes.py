"""Modules with one concern (issue 47): no module of the package over 600 lines, no function over 80.

A module counts its lines as ``wc -l`` does; a function (or method, or nested function) counts
from its ``def`` line to its last line, docstring included. The allow-lists name what is still
being split; they can only shrink: an entry that is back under its limit fails until it is removed.
"""

import ast
from pathlib import Path

import inactive_heads as ih

ROOT = Path(ih.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Still being split (issue 47, part 6): none left. Add nothing here: split the module instead.
LONG_MODULES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def module_lines(root: Path) -> dict[str, int]:
    """Lines of every module below ``root``, by its path relative to ``root``."""
    return {p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(root.rglob("*.py"))}


def function_lines(root: Path) -> dict[str, int]:
    """Lines of every function below ``root``, as ``path::Class.method`` (nested: ``outer.inner``)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[f"{path}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", path)
            else:
                visit(child, prefix, path)

    for p in sorted(root.rglob("*.py")):
        visit(ast.parse(p.read_text(encoding="utf-8")), "", p.relative_to(root).as_posix())
    return out


def over(sizes: dict[str, int], limit: int) -> set[str]:
    return {name for name, n in sizes.items() if n > limit}


def test_sizes_are_measured_as_wc_and_from_def_to_last_line(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(79))  # def line + 79 = 80 lines: at the limit
    (pkg / "sub" / "ok.py").write_text(f"def fits():\n{body}\n" + "\n" * (600 - 80))
    (pkg / "big.py").write_text("y = 1\n" * 601)
    method_body = body.replace("\n", "\n    ")
    (pkg / "long.py").write_text(
        f"class A:\n    def method(self):\n        '''doc'''\n    {method_body}\n        def inner():\n            pass\n"
    )
    modules, functions = module_lines(pkg), function_lines(pkg)
    assert modules == {"big.py": 601, "long.py": 84, "sub/ok.py": 600}
    assert functions == {"sub/ok.py::fits": 80, "long.py::A.method": 83, "long.py::A.method.inner": 2}
    assert over(modules, MAX_MODULE_LINES) == {"big.py"}
    assert over(functions, MAX_FUNCTION_LINES) == {"long.py::A.method"}


def test_no_module_over_600_lines():
    long = over(module_lines(ROOT), MAX_MODULE_LINES)
    assert not long - LONG_MODULES, f"modules over {MAX_MODULE_LINES} lines: split {sorted(long - LONG_MODULES)}"
    assert not LONG_MODULES - long, f"now {MAX_MODULE_LINES} lines or fewer: remove {sorted(LONG_MODULES - long)} " \
                                    "from LONG_MODULES"


def test_no_function_over_80_lines():
    long = over(function_lines(ROOT), MAX_FUNCTION_LINES)
    assert not long - LONG_FUNCTIONS, f"functions over {MAX_FUNCTION_LINES} lines: split {sorted(long - LONG_FUNCTIONS)}"
    assert not LONG_FUNCTIONS - long, f"now {MAX_FUNCTION_LINES} lines or fewer: remove " \
                                      f"{sorted(LONG_FUNCTIONS - long)} from LONG_FUNCTIONS"
