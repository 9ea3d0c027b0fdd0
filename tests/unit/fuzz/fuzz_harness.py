"""The harness of the fuzz tests (issue 30): every public name of ``inactive_heads`` and every
command-line sub-command, fed generated wrong input.

The contract: a call either works or raises a :class:`~inactive_heads.UserError` whose message is
one line naming the argument (or the bad value) and what is accepted. An ``InactiveHeadsError`` that
is not a ``UserError`` is a bug; any other exception escaping is a bug. A call that fails leaves
no file behind (writes are atomic), and a results folder given bad input is unchanged byte for byte.
On the command line: exit status 2 and one line on stderr, never a traceback.

The cases are in this folder, one file per pipeline stage (``test_fuzz_api_<stage>.py``), the
sub-commands in ``test_fuzz_cli.py`` and real processes in ``test_fuzz_process.py``; the tiny
model and files they share are the ``env`` fixture of ``conftest.py``. How to add a case for a new
public name: write a function ``(data, env)`` in its stage's file that draws wrong input with
``data.draw(...)`` and calls the name through :func:`expect`, and register it with
``@case("new_name")``. ``test_every_public_name_has_a_case`` (``test_fuzz_api_coverage.py``)
fails until every name in ``inactive_heads.__all__`` has one; ``CLI_CASES`` is the same table for
the sub-commands.

The package's own checks are what is under test, so the test run's type checker (jaxtyping +
beartype, ``--jaxtyping-packages`` in pyproject.toml) is switched off here: a user's process does
not have it, and with it a wrong type would be stopped before the package's own entry check runs.

The number of generated cases per name goes to ``$TMPDIR/inactive-heads-fuzz-counts.txt`` and into
the terminal summary (tests/conftest.py).
"""

import contextlib
import hashlib
import importlib
import io
import json
import re
import shutil
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads import cli
from inactive_heads.core.errors import InactiveHeadsError, UserError

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


COUNTS: Counter = Counter()  # generated cases per public name / sub-command (read by tests/conftest.py)
COUNTS_FILE = Path(tempfile.gettempdir()) / "inactive-heads-fuzz-counts.txt"
# No shrinking: a failure is reported with the example that found it (shrinking reruns the model
# hundreds of times); derandomized, so the same examples run every time.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=20,
                phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck))


# ----------------------------------------------------------------------------------------------
# The contract


class ContractBroken(AssertionError):
    pass


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    return f" (at {Path(last.filename).name}:{last.lineno})" if last else ""


def expect(call: Callable[[], Any], *, names: tuple[str, ...] = ()) -> Any:
    """Run ``call()``; return its value or the ``UserError`` it raised. Anything else breaks the
    contract. ``names``: words one of which the message must contain (the argument's name or the
    bad value), given when exactly one argument is wrong."""
    try:
        return call()
    except UserError as err:
        message = str(err)
        assert message.strip(), f"{type(err).__name__} with an empty message"
        assert len(message.strip().splitlines()) == 1, f"a message of several lines: {message!r}"
        if names:
            assert any(n in message for n in names), f"the message names none of {names}: {message!r}"
        return err
    except InactiveHeadsError as err:
        raise ContractBroken(f"an InactiveHeadsError that is not a UserError (a bug): "
                             f"{type(err).__name__}: {err}{_where(err)}") from err
    except Exception as err:  # noqa: BLE001 - the point: nothing else may escape
        raise ContractBroken(f"{type(err).__name__} escaped: {str(err)[:300]}{_where(err)}") from err


def fails(call: Callable[[], Any], *, names: tuple[str, ...] = ()) -> UserError:
    """As :func:`expect`, for input that cannot work: it must raise a ``UserError``."""
    out = expect(call, names=names)
    assert isinstance(out, UserError), f"wrong input accepted, returned {type(out).__name__}"
    return out


def tree_hashes(root: Path) -> dict[str, str]:
    """Every file (and folder) below ``root``, relative path → sha256 of its bytes."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def unchanged_if_failed(root: Path):
    """A call that raised a ``UserError`` (or returned one, through :func:`expect`) left ``root``
    exactly as it was: no temp file, no partial output, no edited file."""
    before = tree_hashes(root)
    box: dict[str, Any] = {}
    yield box
    if isinstance(box.get("out"), UserError):
        after = tree_hashes(root)
        assert after == before, (f"a failing call changed {root}: added {sorted(set(after) - set(before))}, "
                                 f"removed {sorted(set(before) - set(after))}, edited "
                                 f"{sorted(k for k in before if k in after and before[k] != after[k])}")


def expect_in(root: Path, call: Callable[[], Any], *, names: tuple[str, ...] = ()) -> Any:
    with unchanged_if_failed(root) as box:
        box["out"] = expect(call, names=names)
    return box["out"]


# ----------------------------------------------------------------------------------------------
# Wrong values

NAN, INF = float("nan"), float("inf")
WRONG_TYPES = (None, 3, -1, 2.5, "x", b"x", [], [3], {"a": 1}, object(), NAN, True, (1, 2))
wrong_type = st.sampled_from(WRONG_TYPES)
non_finite = st.sampled_from((NAN, INF, -INF))
bad_quantile = st.one_of(non_finite, st.floats(max_value=-1e-6, allow_nan=False),
                         st.floats(min_value=1.0, allow_nan=False), st.sampled_from(("0.3", None, [0.1])))
bad_fraction = st.one_of(non_finite, st.floats(max_value=0.0, allow_nan=False),
                         st.floats(min_value=1.0, allow_nan=False), st.sampled_from(("0.3", None, True)))
name_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789-:./", min_size=0, max_size=14)
bad_int = st.one_of(st.integers(max_value=0), st.sampled_from((None, "2", 2.5, NAN, True, [1])))
int_or_wrong = st.one_of(st.integers(min_value=-10**6, max_value=10**6), wrong_type)


# Which argument a case makes wrong: each option in turn, one hypothesis run per option (drawing it
# with sampled_from would favour the first options and leave the last ones rarely tried).
_BRANCH = {"k": 0, "n": 1}


def branch(options: tuple[str, ...]) -> str:
    _BRANCH["n"] = max(_BRANCH["n"], len(options))
    return options[_BRANCH["k"] % len(options)]


def run_branches(count_as: str, entry: "Case", env) -> None:
    """Run ``entry`` once per branch, with ``entry.examples`` generated cases shared among them."""
    _BRANCH.update(k=0, n=1)
    k = 0
    while k < _BRANCH["n"]:
        _BRANCH["k"] = k

        @settings(FUZZ, max_examples=max(2, -(-entry.examples // _BRANCH["n"])))
        @given(data=st.data())
        def run(data):
            COUNTS[count_as] += 1
            entry.run(data, env)

        run()
        k += 1
    _write_counts()
    assert COUNTS[count_as] > 0, f"no generated case reached {count_as}"


def unknown(known) -> st.SearchStrategy[str]:
    known = set(known)
    mutated = st.sampled_from(sorted(known)).flatmap(
        lambda k: st.sampled_from((k + "2", k.upper(), k[:-1], " " + k, k + " ")))
    return st.one_of(name_text, mutated).filter(lambda s: s not in known)


def bad_heads(n_layers: int, n_heads: int) -> st.SearchStrategy:
    """(layer, head) lists with an index out of range or of the wrong type, or not pairs at all."""
    out_of_range = st.one_of(
        st.tuples(st.integers(n_layers, 10**6), st.integers(0, n_heads - 1)),
        st.tuples(st.integers(0, n_layers - 1), st.integers(n_heads, 10**6)),
        st.tuples(st.integers(-10**6, -1), st.integers(0, n_heads - 1)),
        st.tuples(st.integers(0, n_layers - 1), st.integers(-10**6, -1)),
    )
    odd = st.sampled_from(((0,), (0, 1, 2), ("a", "b"), (0.5, 1), (NAN, 0), 3, "0.1", None, (True, 0)))
    return st.one_of(st.lists(st.one_of(out_of_range, odd), min_size=1, max_size=3), wrong_type)


# ----------------------------------------------------------------------------------------------
# The shared tiny model and files


@dataclass
class Env:
    model: Any
    scores: Any  # HeadScores of the model on a few random sequences
    files: Path  # read-only inputs: good, truncated and foreign files
    tmp: Path  # a scratch folder emptied before each case
    sweep: Path  # a synthetic sweep results folder (read-only)

    @property
    def n_layers(self) -> int:
        return self.model.cfg.n_layers

    @property
    def n_heads(self) -> int:
        return self.model.cfg.n_heads

    def scratch(self) -> Path:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def copy_sweep(self) -> Path:
        out = self.scratch() / "sweep"
        shutil.copytree(self.sweep, out)
        return out


def _write_files(root: Path, scores) -> None:
    root.mkdir(parents=True, exist_ok=True)
    scores.save(root / "scores.safetensors")
    data = (root / "scores.safetensors").read_bytes()
    (root / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    (root / "empty.bin").write_bytes(b"")
    (root / "foreign.json").write_text(json.dumps({"name": "not ours", "values": [1, 2]}))
    (root / "list.json").write_text("[[0, 1], [1, 2]]")
    (root / "truncated.json").write_text('{"heads": [[0, 1], [1')
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "text.txt").write_text("t5 t6 t7 t8\n\nt9 t10 t11\n")
    (root / "blank.txt").write_text("\n\n   \n")
    (root / "grid.toml").write_text('[sweep]\nlimit = 2\n')
    (root / "foreign.toml").write_text('title = "not a grid"\n[owner]\nname = "x"\n')
    (root / "truncated.toml").write_text('[sweep\nlimit = ')
    ih.HeadSet(((0, 1), (1, 2)), n_layers=scores.n_layers, n_heads=scores.n_heads).save(root / "heads.json")
    (root / "a_folder").mkdir(exist_ok=True)


def _write_counts() -> None:
    rows = sorted(COUNTS.items())
    width = max((len(k) for k, _ in rows), default=4)
    text = "".join(f"{k:<{width}}  {n}\n" for k, n in rows)
    COUNTS_FILE.write_text(f"{'name':<{width}}  generated cases\n{text}total  {sum(COUNTS.values())}\n")


def files(env: Env, *names: str) -> st.SearchStrategy[Path]:
    """Paths to bad files: missing, a folder, empty, truncated, foreign; plus ``names`` in env.files."""
    bad = ["missing.safetensors", "no/such/dir/x.json", "a_folder", "empty.bin", "truncated.safetensors",
           "foreign.json", "list.json", "truncated.json", "binary.bin", *names]
    return st.sampled_from([env.files / n for n in bad])


# ----------------------------------------------------------------------------------------------
# The cases, one (or a few) per public name


@dataclass
class Case:
    run: Callable[[Any, Env], None]
    examples: int


CASES: dict[str, Case] = {}


def case(*names: str, examples: int = 20):
    def register(fn):
        for name in names:
            CASES[name] = Case(fn, examples)
        return fn

    return register


def cases_in(module: str) -> list[str]:
    """The public names whose cases the test module ``module`` defines, sorted."""
    return sorted(n for n, c in CASES.items() if c.run.__module__ == module)


def all_cases() -> dict[str, Case]:
    """Every case of every stage: imports each ``test_fuzz_api_*.py`` of this folder (a module
    pytest has imported already is not imported again)."""
    for path in sorted(HERE.glob("test_fuzz_api_*.py")):
        importlib.import_module(path.stem)
    return CASES


def _corrupt(folder: Path, data) -> None:
    """Truncate, replace by foreign JSON or delete one file of a sweep folder."""
    target = data.draw(st.sampled_from(sorted(p for p in folder.rglob("*") if p.is_file())))
    how = branch(("truncate", "foreign", "delete", "empty", "binary"))
    if how == "truncate":
        target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 3)])
    elif how == "foreign":
        target.write_text(json.dumps(data.draw(st.sampled_from(([1, 2], {"x": 1}, "text", None, {"format": 99})))))
    elif how == "delete":
        target.unlink()
    elif how == "empty":
        target.write_bytes(b"")
    else:
        target.write_bytes(bytes(range(256)))


_PREDICTOR: list[Path] = []


def _predictor_dir(env) -> Path:
    """A predictor fit on the tiny model's own oracle (tests/tiny_predictor.py), saved once."""
    if not _PREDICTOR:
        from tiny_predictor import fit_tiny_predictor

        directory = env.files.parent / "predictor"
        fit_tiny_predictor(env.model, directory, n=8, steps=5)
        _PREDICTOR.append(directory)
    return _PREDICTOR[0]


def _damaged_predictor(env, data) -> Path:
    """A copy of the tiny predictor with one file damaged: truncated, foreign, missing or of another shape."""
    folder = env.scratch() / "predictor"
    shutil.copytree(_predictor_dir(env), folder)
    config, weights = folder / "predictor.json", folder / "predictor.safetensors"
    damage = data.draw(st.sampled_from(("truncated json", "foreign json", "list json", "truncated weights",
                                        "no weights", "no config", "wrong field", "other shape", "binary json")))
    if damage == "truncated json":
        config.write_text(config.read_text()[:40])
    elif damage == "foreign json":
        config.write_text(json.dumps({"name": "not ours"}))
    elif damage == "list json":
        config.write_text("[1, 2]")
    elif damage == "binary json":
        config.write_bytes(bytes(range(256)))
    elif damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "no weights":
        weights.unlink()
    elif damage == "no config":
        config.unlink()
    else:
        d = json.loads(config.read_text())
        key = data.draw(st.sampled_from(("n_layers", "n_heads", "d_model", "lookahead", "rank", "threshold",
                                         "decision_threshold", "format")))
        d[key] = data.draw(st.one_of(wrong_type, st.integers(-3, 10**4))) if damage == "wrong field" else d[key] + 1
        config.write_text(json.dumps(d))
    return folder


# Defects the fuzz still finds, not fixed yet (issue 30): each case is expected to fail (strict: once
# fixed, the case passes and this entry must go). Keep this list short and say what escapes.
OPEN_DEFECTS: dict[str, str] = {
}


def _params(names, prefix=""):
    return [pytest.param(n, marks=pytest.mark.xfail(reason=OPEN_DEFECTS[prefix + n], strict=True))
            if prefix + n in OPEN_DEFECTS else n for n in names]


# ----------------------------------------------------------------------------------------------
# The command line, in-process


def run_cli(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse
            code = exit_.code
    return code, err.getvalue()


def check_cli(command: str, argv: list[str]) -> int:
    code, err = run_cli([command, *argv])
    if code == 0:
        return code
    assert code == 2, f"inactive-heads {command} {argv}: exit {code} (2 for bad input): {err!r}"
    assert "Traceback" not in err, err
    # Progress bars (model loading, recording) may come first; the error is one line, the last.
    lines = [line for line in err.replace("\r", "\n").strip().splitlines() if ": error: " in line or "rror" in line]
    assert len(lines) == 1, f"inactive-heads {command} {argv}: {len(lines)} error lines on stderr: {err!r}"
    lines = [err.strip().splitlines()[-1]]
    # argparse reports an unknown option from the top-level parser: "inactive-heads: error: ..."
    assert re.match(rf"inactive-heads( {command}( [a-z]+)?)?: error: ", lines[0]), err  # 'predict fit': a sub-sub-command
    return code


CLI_CASES: dict[str, Case] = {}


def cli_case(name: str, examples: int = 15):
    def register(fn):
        CLI_CASES[name] = Case(fn, examples)
        return fn

    return register


_TINY_DIR: list[Path] = []


def _tiny_dir(env) -> Path:
    """The tiny GQA model's Hugging Face folder (tests/tiny.py saves it), for the CLI's --model."""
    if not _TINY_DIR:
        from tiny import tiny_gqa_bridge

        _TINY_DIR.append(Path(ih.model_info(tiny_gqa_bridge()).source))
    return _TINY_DIR[0]


BAD_OPTIONS = {
    "--model": st.one_of(unknown(ih.BUILTIN_MODELS), st.just("./no/such/model")),
    "--dtype": unknown(("float32", "bfloat16", "float16", "auto")),
    "--device": st.sampled_from(("gpu", "cuda:99", "tpu", "cuda:x")),
    "--batch-size": st.sampled_from(("0", "-3", "x", "1.5")),
    "--n-ctx": st.sampled_from(("0", "-1", "many")),
    "--task": unknown(ih.TASKS + ("gsm8k",)),
    "--limit": st.sampled_from(("0", "-2", "nan", "x")),
    "--num-fewshot": st.sampled_from(("-1", "x", "1000000")),
    "--scores": unknown(ih.score_keys()),
    "--quantiles": st.sampled_from(("nan", "inf", "1.5", "-0.1", "x", "1")),
}


def _bad_option(data, *options: str) -> list[str]:
    option = branch(options)
    value = data.draw(BAD_OPTIONS[option])
    if option == "--subjects":
        return ["--task", "mmlu", option, value]
    return [option, value]
