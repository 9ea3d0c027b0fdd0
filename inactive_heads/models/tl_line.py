"""Which TransformerLens line is installed, and what it offers this toolkit.

Two lines are supported: **3.9** (the last release with both ``HookedTransformer`` and
``TransformerBridge``) and **4.x** (``TransformerBridge`` only: 4.0 removed ``HookedTransformer``,
``HookedTransformerConfig``, ``transformer_lens.components`` and ``loading``). Everything in the
toolkit that needs a ``HookedTransformer`` asks :func:`is_hooked_transformer`, which never imports
``HookedTransformer`` on a line that has none; everything else speaks the hook names both lines
share (``blocks.{l}.attn.hook_pattern`` / ``hook_v`` / ``hook_z``).
"""

import re
from functools import lru_cache
from importlib import metadata

from ..core.errors import UserError

# The supported range, as pyproject.toml states it: [3.9, 5).
SUPPORTED_RANGE = ">=3.9,<5"
_LOWEST = (3, 9)
_FIRST_UNSUPPORTED = (5,)
# The first release without HookedTransformer.
_BRIDGE_ONLY_FROM = (4,)


@lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed ``transformer-lens`` version string, or None if it is not installed."""
    try:
        return metadata.version("transformer-lens")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '4.3.0' -> (4, 3, 0), '3.9.0rc1' -> (3, 9, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else (0,)


def check_supported() -> str:
    """The installed version, after checking it is in the supported range (else one line)."""
    version = installed_version()
    if version is None:
        raise UserError(
            f"transformer-lens is not installed; install a supported version ({SUPPORTED_RANGE}): "
            "pip install 'transformer-lens>=3.9,<5'"
        )
    release = _release(version)
    if not (_LOWEST <= release < _FIRST_UNSUPPORTED):
        raise UserError(
            f"transformer-lens {version} is installed, but inactive-heads supports {SUPPORTED_RANGE} "
            "(3.9 and 4.x); install one of those, e.g. pip install 'transformer-lens==4.3.0'"
        )
    return version


def has_hooked_transformer() -> bool:
    """True on the 3.9 line (``HookedTransformer`` exists), False on 4.x."""
    version = installed_version()
    return version is not None and _release(version) < _BRIDGE_ONLY_FROM


def line() -> str:
    """``"3.9"`` or ``"4"``: the supported line the installed TransformerLens belongs to."""
    return "3.9" if has_hooked_transformer() else "4"


def what_loads() -> str:
    """The installed line, and which class a model loads as on it (one phrase, for ``models``)."""
    if has_hooked_transformer():
        return ("the 3.9 line: a HookedTransformer where it builds the architecture faithfully, "
                "else a TransformerBridge")
    return "the 4 line: every model loads as a TransformerBridge (4.0 removed HookedTransformer)"


def is_hooked_transformer(model) -> bool:
    """True for a ``HookedTransformer`` (or a subclass such as SAELens' ``HookedSAETransformer``).

    Always False on TransformerLens 4, which has no such class (nothing is imported there)."""
    if not has_hooked_transformer():
        return False
    from transformer_lens import HookedTransformer

    return isinstance(model, HookedTransformer)


def is_bridge(model) -> bool:
    """True for a ``TransformerBridge`` (both lines have one)."""
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(model, TransformerBridge)
