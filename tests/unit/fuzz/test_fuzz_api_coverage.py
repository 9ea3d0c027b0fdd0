"""Every public name of ``inactive_heads`` has a fuzz case in one of the stage files."""

import inactive_heads as ih
from fuzz_harness import (
    HERE,
    all_cases,
)


def test_every_public_name_has_a_case():
    """A new public name without a fuzz case fails here: add one with @case("name")."""
    cases = all_cases()
    missing = sorted(set(ih.__all__) - set(cases))
    assert not missing, f"public names without a fuzz case in {HERE.name}/test_fuzz_api_*.py: {missing}"
    stale = sorted(n for n in set(cases) - set(ih.__all__) if "." not in n)
    assert not stale, f"fuzz cases for names that are not public: {stale}"
