"""The toolkit's errors: one base, and the kind that bad input raises.

- :class:`InactiveHeadsError`: the base of every error this package raises on purpose.
- :class:`UserError`: bad input (an unknown name, a value out of range, a missing file, a results
  folder of another run). Its message names the value and the fix in one line; the command line
  prints that line and exits 2. It is also a ``ValueError``.
- :class:`UnknownNameError`: an unknown score, model, task or key; a ``UserError`` that is also a
  ``KeyError``, so ``except KeyError`` keeps working.
- :class:`WrongTypeError`: an argument of the wrong type (a number where a list belongs, a path
  that is not a string); a ``UserError`` that is also a ``TypeError``, so ``except TypeError``
  keeps working.
- :class:`NonFiniteError`: a score or log-likelihood that came out NaN/inf; also a
  ``FloatingPointError``.
- :class:`OutOfRangeError`: an index past the end (a sequence of recorded scores); also an
  ``IndexError``.
- :class:`MissingFileError`: a file or folder the input names does not exist; also a
  ``FileNotFoundError``.
- :class:`MissingDependencyError`: an optional package a feature needs is not installed; the
  message names the extra (``pip install 'inactive-heads[lmeval]'``) or the install command. Also
  a ``ModuleNotFoundError``.

Anything else that escapes is a bug (an ``InactiveHeadsError`` that is not a ``UserError`` included):
the command line says so, how to get the traceback, and where to report it (docs/errors.md).
"""


class InactiveHeadsError(Exception):
    """Base class of the errors this package raises on purpose."""


class UserError(InactiveHeadsError, ValueError):
    """Bad input: the message names the bad value and the fix."""


class UnknownNameError(UserError, KeyError):
    """An unknown name (score, model, task, threshold key); also a ``KeyError``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class WrongTypeError(UserError, TypeError):
    """An argument of the wrong type; also a ``TypeError``."""


class NonFiniteError(UserError, FloatingPointError):
    """A score or log-likelihood came out NaN/inf (half precision overflowed, or a custom score
    divides by zero); also a ``FloatingPointError``."""


class OutOfRangeError(UserError, IndexError):
    """An index past the end of a sequence of results; also an ``IndexError``."""


class MissingFileError(UserError, FileNotFoundError):
    """A path given as input does not exist; also a ``FileNotFoundError``."""


class MissingDependencyError(UserError, ModuleNotFoundError):
    """An optional package is not installed; the message says what to install."""
