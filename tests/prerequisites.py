"""Prerequisites that ``make setup`` installs: a skip on a developer's machine, a failure in CI."""

import os

import pytest


def in_ci() -> bool:
    """True under CI (``.ci/run`` exports ``CI=true``)."""
    return bool(os.environ.get("CI"))


def require(condition: bool, reason: str) -> None:
    """Skip the calling test when ``condition`` is false, except in CI, where it fails.

    On a developer's machine a missing prerequisite is a skip whose reason says how to install it;
    in CI it means the setup is broken, and a skip would hide that.
    """
    if condition:
        return
    if in_ci():
        pytest.fail(f"missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)
