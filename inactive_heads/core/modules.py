"""Importing the user's modules by name (a module that registers scores or ablation kinds)."""

import importlib
import os
import sys

from .errors import UserError


def import_modules(names, *, what: str) -> list[str]:
    """Import each module of ``names`` (a module name, or a list of them); a failure is one line
    naming ``what`` asked for it. Returns the names, as a list.

    >>> import_modules("json", what="imports")
    ['json']
    """
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n.strip() for n in names):
        raise UserError(f"{what} must be a module name or a list of them, got {names!r}")
    names = [n.strip() for n in names]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # the user's module: whatever it raises is bad input here
            raise UserError(f"cannot import module '{name}' ({what}): {type(err).__name__}: {err}; "
                            "make it importable (PYTHONPATH) or remove it") from err
    return names


def cwd_on_path() -> None:
    """Put the current folder first on ``sys.path`` (once), as ``python -m`` does, so a user's
    module beside their work imports by name."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
