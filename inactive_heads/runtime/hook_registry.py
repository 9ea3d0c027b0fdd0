"""The toolkit's own registry of the hooks it installs, and which of them only read.

The fast attention forward (:mod:`inactive_heads.runtime.fast_attention`) needs to know whether
every hook on a layer's ``hook_pattern`` only reads the pattern (then ``z`` may still come from
the fused kernel) or may change it (then ``z`` must come from what the hook returns, as in
TransformerLens). It does not look inside TransformerLens's hook wrappers for that: the toolkit
installs its hooks through :func:`installed`, which records here the ids PyTorch gives the hooks
it added from functions marked :func:`read_only`. A hook point counts as read-only when every
forward hook on it is one of those (a hook anyone else added, permanent ones included, is not).
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from weakref import WeakKeyDictionary

READ_ONLY = "_inactive_heads_read_only"

# hook point -> ids (keys of its ``_forward_hooks``) of the read-only hooks the toolkit installed
_REGISTRY: "WeakKeyDictionary[object, set[int]]" = WeakKeyDictionary()


def read_only(hook_fn: Callable) -> Callable:
    """Mark a hook function as one that never changes its activation (returns None, edits nothing).

    The mark takes effect for hooks installed with :func:`installed`."""
    setattr(hook_fn, READ_ONLY, True)
    return hook_fn


@contextmanager
def installed(model, fwd_hooks: Sequence[tuple[str, Callable]]) -> Iterator[None]:
    """``model.hooks(fwd_hooks=...)``, recording which of the hooks added are marked read-only."""
    points = getattr(model, "hook_dict", None) or {}
    added: dict[object, list[Callable]] = {}
    for name, fn in fwd_hooks:
        point = points.get(name) if isinstance(name, str) else None
        if point is not None and hasattr(point, "_forward_hooks"):
            added.setdefault(point, []).append(fn)
    before = {point: set(point._forward_hooks) for point in added}
    mine: dict[object, set[int]] = {}
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        for point, fns in added.items():
            new = [key for key in point._forward_hooks if key not in before[point]]
            if len(new) != len(fns):
                continue  # cannot pair hooks with functions: none counts as read-only (the safe side)
            ids = {key for key, fn in zip(new, fns) if getattr(fn, READ_ONLY, False)}
            if ids:
                _REGISTRY.setdefault(point, set()).update(ids)
                mine[point] = ids
        try:
            yield
        finally:
            for point, ids in mine.items():
                left = _REGISTRY.get(point, set()) - ids
                if left:
                    _REGISTRY[point] = left
                else:
                    _REGISTRY.pop(point, None)


def only_read_only(hook_point) -> bool:
    """True when every hook on ``hook_point`` is a read-only hook the toolkit installed."""
    if hook_point._forward_pre_hooks or hook_point._backward_hooks:
        return False
    return set(hook_point._forward_hooks) <= _REGISTRY.get(hook_point, set())


def hooked(hook_point) -> bool:
    """True when any hook is attached to ``hook_point``."""
    return bool(hook_point._forward_hooks or hook_point._forward_pre_hooks or hook_point._backward_hooks)
