"""The toolkit's errors: one base, and the kind that bad input raises.

- :class:`InactiveHeadsError`: the base of every error this package raises on purpose.
- :class:`UserError`: bad input (an unknown name, a value out of range, a missing file, a results
  folder of another run). Its message names the value and the fix in one line; the command line
  prints that line and exits 2. It is also a ``ValueError``.
- :class:`UnknownNameError`: an unknown score, model, task or key; a ``UserError`` that is also a
  ``KeyError``, so ``except KeyError`` keeps working.
- :class:`MissingFileError`: a file or folder the input names does not exist; also a
  ``FileNotFoundError``.
- :class:`MissingDependencyError`: an optional package a feature needs is not installed; the
  message names the extra (``pip install 'inactive-heads[lmeval]'``) or the install command. Also
  a ``ModuleNotFoundError``.

Anything else that escapes is a bug: the command line says so and how to get the traceback.
"""


class InactiveHeadsError(Exception):
    """Base class of the errors this package raises on purpose."""


class UserError(InactiveHeadsError, ValueError):
    """Bad input: the message names the bad value and the fix."""


class UnknownNameError(UserError, KeyError):
    """An unknown name (score, model, task, threshold key); also a ``KeyError``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingFileError(UserError, FileNotFoundError):
    """A path given as input does not exist; also a ``FileNotFoundError``."""


class MissingDependencyError(UserError, ModuleNotFoundError):
    """An optional package is not installed; the message says what to install."""
