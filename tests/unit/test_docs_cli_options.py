"""The command-line option tables in the docs agree with ``inactive_heads.cli.build_parser()``.

A CLI option table is a Markdown table whose first header cell is ``option`` and whose first column
holds backticked options (`` `--dtype float32|bfloat16` ``, several separated by ``/``). Its
``commands`` column lists the subcommands that have the option; an optional ``default`` column
gives the default, otherwise the last column's wording does: ``default X``, ``(default X; demo
Y)``, ``demo default Y``, ``(required for sweep)``. For every row the test checks, per listed
subcommand:

- each option exists there, and no other subcommand has it (hidden options aside);
- ``a|b|c`` after the option equals the parser's choices, where the parser has choices;
- a documented default equals the parser's (defaults the parser leaves as None, and flags, are
  described in words and not compared);
- "required for X" matches the parser's ``required``.
"""

import argparse
import re
from pathlib import Path

from inactive_heads.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
OPTION = re.compile(r"`(--[a-z][a-z0-9-]*)(?: ([^`]*))?`")


def subcommand_options() -> dict[str, dict[str, argparse.Action]]:
    """{subcommand: {option string: action}}, hidden options left out."""
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out = {}
    for name, sub in subparsers.choices.items():
        out[name] = {
            option: action
            for action in sub._actions
            if action.help != argparse.SUPPRESS
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        }
    return out


def _cells(line: str) -> list[str]:
    # Split on | that is not escaped (\| inside a cell is a literal bar).
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def option_tables(path: Path):
    """(line number, {column: cell}) for each row of each CLI option table of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s|:-]+\|$", lines[i + 1].strip()):
            header = [h.lower() for h in _cells(lines[i])]
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append((j + 1, dict(zip(header, _cells(lines[j])))))
                j += 1
            if header[0] == "option" and any(OPTION.search(r[header[0]]) for _, r in rows):
                yield from rows
            i = j
        else:
            i += 1


def _defaults(meaning: str, commands: list[str]) -> dict[str, str]:
    """The documented default per subcommand, from the wording of the meaning column."""
    general, per_command = None, {}
    for m in re.finditer(r"(?:\b([a-z]+):?\s+)?\bdefault\b:?\s*([^;),:]*)", meaning):
        word, value = m.group(1), m.group(2).strip().strip("`").strip()
        if not value:
            continue
        if word in commands:
            per_command[word] = value
        elif general is None:
            general = value
    for m in re.finditer(r";\s*([a-z]+)\s+([^\s;),:]+)", meaning):
        if m.group(1) in commands:
            per_command.setdefault(m.group(1), m.group(2).strip("`"))
    return {c: per_command.get(c, general) for c in commands if per_command.get(c, general) is not None}


def _same(documented: str, actual) -> bool:
    tokens = documented.replace("`", "").split()
    if isinstance(actual, (list, tuple)):
        try:
            return [float(t) for t in tokens] == [float(a) for a in actual]
        except ValueError:
            return False
    if isinstance(actual, (int, float)):
        try:
            return float(tokens[0]) == float(actual)
        except ValueError:
            return False
    return tokens[:1] == [str(actual)]


def table_mismatches(path: Path, options_by_command: dict[str, dict[str, argparse.Action]],
                     root: Path = ROOT) -> list[str]:
    problems = []
    name = path.relative_to(root)
    for line, row in option_tables(path):
        where = f"{name}:{line}"
        first = row.get("option", "")
        documented = OPTION.findall(first)
        if not documented:
            continue
        if "commands" not in row:
            problems.append(f"{where}: the table has no 'commands' column, so its options cannot be checked")
            continue
        commands = [c.strip() for c in re.split(r"[,/]", row["commands"].replace("`", "")) if c.strip()]
        unknown = [c for c in commands if c not in options_by_command]
        if unknown:
            problems.append(f"{where}: unknown subcommand(s) {unknown}; the CLI has {sorted(options_by_command)}")
            continue
        meaning = " ".join(v for k, v in row.items() if k not in ("option", "commands", "default"))
        defaults = ({c: row["default"].strip("`") for c in commands} if row.get("default") not in (None, "", "—")
                    else _defaults(meaning, commands))
        for option, value in documented:
            having = sorted(c for c, opts in options_by_command.items() if option in opts)
            if not having:
                problems.append(f"{where}: `{option}` is not an option of any subcommand")
                continue
            if sorted(commands) != having:
                problems.append(f"{where}: `{option}` is listed for {', '.join(commands)}; "
                                f"the parser has it in {', '.join(having)}")
            for command in commands:
                action = options_by_command[command].get(option)
                if action is None:
                    continue
                choices = value.split("|") if "|" in value else None
                if choices and action.choices is not None and sorted(choices) != sorted(map(str, action.choices)):
                    problems.append(f"{where}: `{option}` in {command}: the table gives the choices "
                                    f"{'|'.join(choices)}, the parser {'|'.join(map(str, action.choices))}")
                flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                           argparse._StoreConstAction))
                # A row of several options (a / b) has no single default to compare.
                compared = command in defaults and action.default is not None and not flag and len(documented) == 1
                if compared and not _same(defaults[command], action.default):
                    problems.append(f"{where}: `{option}` in {command}: the table says default "
                                    f"{defaults[command]!r}, the parser {action.default!r}")
                m = re.search(r"\brequired(?: for ([a-z, ]+))?", meaning)
                required_in = [] if m is None else [c.strip() for c in m.group(1).split(",")] if m.group(1) else commands
                if action.required != (command in required_in):
                    problems.append(f"{where}: `{option}` in {command}: the table says "
                                    f"{'' if command in required_in else 'not '}required, the parser "
                                    f"{'' if action.required else 'not '}required")
    return problems


def test_the_docs_have_option_tables_to_check():
    tables = [path.name for path in DOC_FILES if any(True for _ in option_tables(path))]
    assert tables, "no CLI option table found in docs/*.md: did the table format change?"


def test_cli_option_tables_match_the_parser():
    options_by_command = subcommand_options()
    problems = [p for path in DOC_FILES for p in table_mismatches(path, options_by_command)]
    assert not problems, "CLI option tables disagree with build_parser():\n" + "\n".join(problems)


def test_the_checker_catches_each_kind_of_mismatch(tmp_path):
    """A hand-written table with one error of each kind: every one is reported, the good row is not."""
    doc = tmp_path / "docs" / "cli.md"
    doc.parent.mkdir()
    doc.write_text(
        "| option | commands | meaning |\n"
        "|---|---|---|\n"
        "| `--batch-size N` | score, sweep, demo | sequences per pass (default 8; demo 16) |\n"  # right
        "| `--dtype float32\\|bfloat16` | sweep | dtype (default float32) |\n"  # commands, choices, default
        "| `--tolerance X` | report | accuracy points (default 2) |\n"  # commands (grid too), default
        "| `--out PATH` | score, calibrate, sweep, demo | output |\n"  # sweep requires it; not said
        "| `--frobnicate` | sweep | not an option |\n",
        encoding="utf-8",
    )
    problems = table_mismatches(doc, subcommand_options(), root=tmp_path)
    text = "\n".join(problems)
    assert "cli.md:3" not in text, text
    assert "cli.md:4: `--dtype` is listed for sweep; the parser has it in demo, score, sweep" in text
    assert "cli.md:4: `--dtype` in sweep: the table gives the choices float32|bfloat16, the parser " in text
    assert "cli.md:4: `--dtype` in sweep: the table says default 'float32', the parser 'auto'" in text
    assert "cli.md:5: `--tolerance` is listed for report; the parser has it in grid, report" in text
    assert "cli.md:5: `--tolerance` in report: the table says default '2', the parser 1.0" in text
    assert "cli.md:6: `--out` in sweep: the table says not required, the parser required" in text
    assert "cli.md:6: `--out` is listed for score, calibrate, sweep, demo; the parser has it in calibrate, demo, export, score, sweep" in text
    assert "cli.md:7: `--frobnicate` is not an option of any subcommand" in text
    assert len(problems) == 8, text
