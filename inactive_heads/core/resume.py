"""Resuming: the one rule for results of another setup where a run would resume.

A sweep's folder and ``predict eval``'s record of finished runs both store what their runs
depend on (an identity: plain JSON). A run that finds results of another identity is refused with
one line naming what differs, never mixed with them and never silently replaced.

    >>> check_same_setup("out", {"model": "a", "seed": 0}, {"model": "a", "seed": 1}, what="sweep",
    ...                  fix="use another --out folder or delete it")
    Traceback (most recent call last):
    ...
    inactive_heads.core.errors.UserError: 'out' holds a different sweep (differs in seed); use another --out folder or delete it
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import UserError


def differing_keys(stored: Mapping[str, Any], wanted: Mapping[str, Any], *, ignore: Iterable[str] = ()) -> list[str]:
    """The keys whose values differ between two identities (a key one lacks differs), sorted."""
    skip = set(ignore)
    return sorted(k for k in set(stored) | set(wanted) if k not in skip and stored.get(k) != wanted.get(k))


def check_same_setup(where: str | os.PathLike, stored: Mapping[str, Any], wanted: Mapping[str, Any], *, what: str,
                     fix: str, ignore: Iterable[str] = ()) -> None:
    """One line when ``where`` holds results of another setup than ``wanted`` (``ignore``: keys
    the caller compares itself)."""
    differing = differing_keys(stored, wanted, ignore=ignore)
    if differing:
        raise UserError(f"'{where}' holds a different {what} (differs in {', '.join(differing)}); {fix}")
