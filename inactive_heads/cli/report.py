"""``inactive-heads report``: a sweep folder's table and HTML report, or several compared."""

import argparse
import sys

from ..core.errors import UserError
from .options import tolerance
from .registry import register_subcommand


def _add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_dir", metavar="RESULTS_DIR", nargs="?",
                        help="a folder written by 'inactive-heads sweep'")
    parser.add_argument("--tolerance", type=tolerance, default=1.0, help="accuracy points for 'within' (default 1)")
    parser.add_argument("--runs", action="store_true",
                        help="also print one row per run: accuracy, paired difference from the baseline, "
                        "answer agreement and choice KL, with 95%% intervals")
    parser.add_argument("--json", action="store_true",
                        help="print the summary table as JSON instead (a max-%% that never reached its line has "
                        "\"censored\": true and its lower bound as value) and write no HTML; with --compare, the "
                        "cross-model table as JSON (its files are still written)")
    parser.add_argument("--compare", nargs="+", metavar="DIR", default=None,
                        help="put several sweep folders side by side (Table 2 layout): writes compare.md/.csv/.html")
    parser.add_argument("--compare-out", default="compare", metavar="DIR",
                        help="where --compare writes its tables (default ./compare)")


def _run_compare(folders, out, tolerance: float, as_json: bool = False) -> int:
    from ..sweep.grid import _markdown, compare_table, write_compare

    table = compare_table(folders, tolerance=tolerance)
    paths = write_compare(table, out, tolerance=tolerance)
    written = f"written: {', '.join(str(p) for p in paths)}"
    if as_json:
        import json

        from ..analysis.tables import summary_records

        print(json.dumps(summary_records(table), indent=1))
        print(written, file=sys.stderr)
        return 0
    print(_markdown(table))
    print(f"\n{written}")
    return 0


def _run_report(args: argparse.Namespace) -> int:
    if args.compare:
        return _run_compare(([args.results_dir] if args.results_dir else []) + args.compare, args.compare_out,
                            args.tolerance, args.json)
    if args.results_dir is None:
        raise UserError("give a RESULTS_DIR, or several folders with --compare DIR ...")
    if args.json:
        import json

        from ..analysis.tables import summary_records, summary_table
        from ..sweep.results import SweepResults

        frame = summary_table(SweepResults.load(args.results_dir), args.tolerance)
        print(json.dumps(summary_records(frame), indent=1))
        return 0
    from ..reporting.report import format_table as results_table
    from ..reporting.report import write_report

    print(results_table(args.results_dir, tolerance=args.tolerance, runs=args.runs))
    print(f"\nreport: {write_report(args.results_dir, tolerance=args.tolerance)}")
    return 0


register_subcommand("report", "print the results table and write a self-contained HTML report",
                    _add_report_arguments, _run_report)
