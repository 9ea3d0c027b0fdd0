"""The subcommands of ``inactive-heads``, by name.

Each is a :class:`Subcommand`: a one-line help, a function that adds its options to an
``argparse`` parser, and a function that runs it with the parsed namespace and returns the exit
status. The command modules of this package register theirs when imported.
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Subcommand:
    help: str
    add_arguments: AddArguments
    run: Run


SUBCOMMANDS: dict[str, Subcommand] = {}


def register_subcommand(name: str, help: str, add_arguments: AddArguments, run: Run) -> None:
    """Add (or replace) a subcommand of ``inactive-heads``."""
    SUBCOMMANDS[name] = Subcommand(help=help, add_arguments=add_arguments, run=run)
