"""Command line: ``inactive-heads <subcommand> ...``.

One module per command group (``models``, ``scoring``: score and calibrate, ``export``,
``sweeps``: sweep and grid, ``report``, ``demo``, ``predict``); each registers its subcommands in
:data:`SUBCOMMANDS` (:mod:`.registry`). To add a subcommand, write a function that adds its
options and one that runs it, and pass them to :func:`register_subcommand`. The options the
commands share are in :mod:`.options`; the parser and the entry point in :mod:`.entry`.

Errors the user can fix (a bad model name, a missing package) print one line to stderr and exit
with status 2, like argparse's own errors for bad options.
"""

from .registry import SUBCOMMANDS, Subcommand, register_subcommand

# Registration order is the order ``--help`` lists the subcommands in.
from . import models, scoring, export, sweeps, report, demo, predict  # noqa: E402,F401  isort: skip
from .entry import BUG_REPORT, build_parser, main  # noqa: E402

__all__ = ["BUG_REPORT", "SUBCOMMANDS", "Subcommand", "build_parser", "main", "register_subcommand"]
