"""The parser of ``inactive-heads`` and its entry point: one-line errors, exit statuses."""

import argparse
import os
import sys
from collections.abc import Sequence

from .registry import SUBCOMMANDS


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (``prog: error: message``) and exit 2, like a
    ``UserError``: ``--help`` shows the usage."""

    def error(self, message: str):
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __doc__ as package_doc

    parser = _Parser(
        prog="inactive-heads",
        description=(package_doc or "").strip().splitlines()[0],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line "
                        "(same as INACTIVE_HEADS_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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


# Where a bug report goes and what it includes (the project has no public tracker address).
BUG_REPORT = "docs/errors.md#reporting-a-bug"


def _import_user_modules(argv: Sequence[str]) -> None:
    """Import the modules that ``--import MODULE`` names before the options are parsed, so that the
    scores, tasks and ablation kinds they register are valid choices of ``--scores`` and
    ``--task`` (modules beside the user's work are found, as ``python -m`` finds them)."""
    from ..core.modules import cwd_on_path, import_modules

    names = [value for flag, value in zip(argv, argv[1:]) if flag == "--import"]
    names += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--import=")]
    if names:
        cwd_on_path()
        import_modules(names, what="--import")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inactive-heads`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Bad input (:class:`~inactive_heads.core.errors.UserError`) is one line and exit status 2;
    anything else is a bug (an ``InactiveHeadsError`` that is not a ``UserError`` included): one
    line, a pointer to ``--debug`` and to where to report it, and exit status 1.
    """
    from ..core.errors import UserError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        _import_user_modules(argv)
    except UserError as err:
        print(f"inactive-heads: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("INACTIVE_HEADS_DEBUG") == "1"
    try:
        return int(args._run(args) or 0)
    except UserError as err:
        # One line the user can act on; tracebacks are for bugs, not for bad input.
        if debug:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"inactive-heads {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"inactive-heads {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"inactive-heads {args.command}: internal error (a bug; please report it): "
              f"{type(err).__name__}: {message}; rerun with --debug for the traceback and see "
              f"{BUG_REPORT} for what to include", file=sys.stderr)
        return 1
