"""Entry checks shared by the public functions: one-line errors for arguments of the wrong type.

Each check returns the value in the form the caller uses (a ``Path``, an ``int``) or raises a
:class:`~inactive_heads.core.errors.WrongTypeError` (a ``UserError`` and a ``TypeError``) or a
``UserError`` that names the argument and what it accepts.

    >>> check_int(3, "limit")
    3
    >>> check_int(0, "limit")
    Traceback (most recent call last):
    ...
    inactive_heads.core.errors.UserError: limit must be a positive integer, got 0
    >>> check_path(3, "path")
    Traceback (most recent call last):
    ...
    inactive_heads.core.errors.WrongTypeError: path must be a file path (str or os.PathLike), got int
"""

import operator
import os
from pathlib import Path
from typing import Any

from .errors import UserError, WrongTypeError


def type_name(value: Any) -> str:
    return type(value).__name__


def check_path(value: Any, name: str) -> Path:
    """``value`` as a ``Path``; a str or ``os.PathLike`` only (not bytes, not a number)."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        return Path(value)
    raise WrongTypeError(f"{name} must be a file path (str or os.PathLike), got {type_name(value)}")


def check_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UserError(f"{name} must be {what}, got {value!r}")
    return value


def check_model(model: Any, name: str = "model") -> Any:
    """A TransformerLens model (anything with a ``cfg`` of layers and heads), as ``load_model`` returns."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "n_layers") or not hasattr(cfg, "n_heads"):
        raise WrongTypeError(f"{name} must be a TransformerLens model from ih.load_model (HookedTransformer "
                             f"or TransformerBridge), got {type_name(model)}")
    return model


def head_index(value: Any, name: str = "heads") -> int:
    """``value`` as a head (or layer) index: an integer of any integer type, not a bool, >= 0.

    The package's one head-index rule: heads and layers are numbered from 0, and a negative index
    is refused everywhere (never read as counting from the end).

    >>> head_index(-1)
    Traceback (most recent call last):
    ...
    inactive_heads.core.errors.UserError: heads: index -1 is negative; heads and layers are numbered from 0 (the last head is n_heads - 1)
    """
    if isinstance(value, bool):
        raise TypeError
    index = operator.index(value)
    if index < 0:
        raise UserError(f"{name}: index {index} is negative; heads and layers are numbered from 0 "
                        f"(the last head is n_heads - 1)")
    return index


def head_indices(heads: Any, name: str = "heads") -> list[int]:
    """``heads`` (the heads of one layer) as a list of indices, each checked by :func:`head_index`."""
    if isinstance(heads, (str, bytes, dict)) or not hasattr(heads, "__iter__"):
        raise WrongTypeError(f"{name} must be a list of head indices (int), got {type_name(heads)}")
    heads = list(heads)
    try:
        return [head_index(h, name) for h in heads]
    except UserError:
        raise
    except (TypeError, ValueError):
        raise WrongTypeError(f"{name} must be a list of head indices (int), got {heads!r}") from None


def head_pairs(heads: Any, name: str = "heads") -> tuple[tuple[int, int], ...]:
    """``heads`` as sorted, distinct ``(layer, head)`` pairs of ints (any integer type: Python, numpy,
    a 0-d torch tensor), each index checked by :func:`head_index`; whether they exist in a model is
    :func:`check_heads`' question."""
    if isinstance(heads, (str, bytes, dict)) or not hasattr(heads, "__iter__"):
        raise WrongTypeError(f"{name} must be (layer, head) pairs, e.g. [(0, 3), (2, 1)], got {type_name(heads)}")
    pairs = set()
    for pair in heads:
        try:
            layer, head = pair
            pairs.add((head_index(layer, name), head_index(head, name)))
        except UserError:
            raise
        except (TypeError, ValueError):
            raise WrongTypeError(f"{name} must be (layer, head) pairs of integers, e.g. [(0, 3), (2, 1)]; "
                                 f"got {pair!r}") from None
    return tuple(sorted(pairs))


def check_heads(heads, n_layers: int, n_heads: int) -> None:
    """One-line error for a (layer, head) outside a model of ``n_layers`` x ``n_heads``."""
    bad = [(l, h) for l, h in heads if not (0 <= l < n_layers and 0 <= h < n_heads)]
    if bad:
        raise UserError(f"head {bad[0]} does not exist; layers are 0..{n_layers - 1}, heads 0..{n_heads - 1}")


def result_fields(cls: type, data: Any) -> dict[str, Any]:
    """``data`` checked as the ``to_dict()`` of dataclass ``cls`` (for its ``from_dict``): a dict with
    every field that has no default and no field ``cls`` does not have."""
    import dataclasses

    name = cls.__name__
    if not isinstance(data, dict):
        raise WrongTypeError(f"{name}.from_dict needs a dict ({name}.to_dict()), got {type_name(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in fields)
    missing = [n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        raise UserError(f"not a {name} record: {'unknown keys ' + ', '.join(unknown) if unknown else ''}"
                        f"{'; ' if unknown and missing else ''}{'missing ' + ', '.join(missing) if missing else ''}"
                        f"; pass what {name}.to_dict() wrote")
    return data


def as_tokenizer(tokenizer: Any) -> Any:
    """A Hugging Face tokenizer, or the ``.tokenizer`` of a TransformerLens model."""
    if hasattr(tokenizer, "cfg") and getattr(tokenizer, "tokenizer", None) is not None:
        return tokenizer.tokenizer
    if callable(tokenizer) and hasattr(tokenizer, "encode"):
        return tokenizer
    raise WrongTypeError(
        f"tokenizer must be a Hugging Face tokenizer (e.g. model.tokenizer), got {type(tokenizer).__name__}"
    )
