"""One adapter per TransformerLens line: :mod:`.hooked` (3.9's ``HookedTransformer``) and
:mod:`.bridge` (``TransformerBridge``, both lines), plus :mod:`.other` (a model of neither class).

Everything outside this package asks :func:`line_of` for a model's :class:`ModelLine` and calls
its methods; no other module names either class or branches on the line
(``tests/unit/test_line_adapter.py`` enforces it). Retiring TransformerLens 3.9 means deleting
``hooked.py`` (and the builder of ``HookedTransformer`` in ``models/tl_line.py``).
"""

from .base import ModelLine, line_of, register

__all__ = ["ModelLine", "line_of", "register"]
