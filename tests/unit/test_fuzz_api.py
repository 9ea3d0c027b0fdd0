"""Every public name of ``inactive_heads`` and every command-line sub-command, fed generated wrong
input (issue 30).

The contract: a call either works or raises a :class:`~inactive_heads.UserError` whose message is
one line naming the argument (or the bad value) and what is accepted. An ``InactiveHeadsError`` that
is not a ``UserError`` is a bug; any other exception escaping is a bug. A call that fails leaves
no file behind (writes are atomic), and a results folder given bad input is unchanged byte for byte.
On the command line: exit status 2 and one line on stderr, never a traceback.

How to add a case for a new public name: write a function ``(data, env)`` that draws wrong input
with ``data.draw(...)`` and calls the name through :func:`expect`, and register it with
``@case("new_name")``. :func:`test_every_public_name_has_a_case` fails until every name in
``inactive_heads.__all__`` has one; ``CLI_CASES`` is the same table for the sub-commands.

The package's own checks are what is under test, so the test run's type checker (jaxtyping +
beartype, ``--jaxtyping-packages`` in pyproject.toml) is switched off here: a user's process does
not have it, and with it a wrong type would be stopped before the package's own entry check runs.

The number of generated cases per name goes to ``$TMPDIR/inactive-heads-fuzz-counts.txt`` and into
the terminal summary (tests/conftest.py).
"""

import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads import cli
from inactive_heads.core.errors import InactiveHeadsError, UserError
from inactive_heads.evaluation.registry import check_task_options
from synthetic_sweep import synthetic_head_scores, write_synthetic_sweep
from tiny import TINY_GQA_VOCAB, random_sequences, tiny_gqa_model

REPO = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    import jaxtyping

    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    torch.manual_seed(0)
    model = tiny_gqa_model()  # a HookedTransformer on TransformerLens 3.9, a TransformerBridge on 4
    if model.tokenizer is None:  # 3.9's has none: the word-level one of the bridge, for text and tasks
        from tiny import _word_tokenizer

        model.set_tokenizer(_word_tokenizer(tmp_path_factory.mktemp("tokenizer"), TINY_GQA_VOCAB))
    scores = ih.record_scores(model, random_sequences(4, vocab=TINY_GQA_VOCAB), progress=False)
    root = tmp_path_factory.mktemp("fuzz")
    cwd = os.getcwd()
    os.chdir(root)  # a relative path drawn as wrong input ("x") that happens to work lands here
    _write_files(root / "files", scores)
    sweep = write_synthetic_sweep(root / "sweep", n_questions=8)
    yield Env(model, scores, root / "files", root / "scratch", sweep)
    os.chdir(cwd)
    jaxtyping.config.update("jaxtyping_disable", previous)
    _write_counts()


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


@case("InactiveHeadsError", "UserError", "UnknownNameError", "MissingFileError", "MissingDependencyError",
      "ModelLoadError", "WrongTypeError", "NonFiniteError", "OutOfRangeError")
def _error_classes(data, env):
    # Each class keeps its one-line message as str(), and is a UserError except the base.
    cls = data.draw(st.sampled_from((ih.UserError, ih.UnknownNameError, ih.MissingFileError, ih.WrongTypeError,
                                     ih.NonFiniteError, ih.OutOfRangeError, ih.MissingDependencyError,
                                     ih.ModelLoadError)))
    message = data.draw(st.text(alphabet="abc '\"xyz;:", min_size=1, max_size=20))
    err = cls(message)
    assert isinstance(err, ih.UserError) and isinstance(err, ih.InactiveHeadsError)
    assert str(err) == message
    assert not isinstance(ih.InactiveHeadsError("x"), ih.UserError)


@case("load_model", "BUILTIN_MODELS", "DEFAULT_MODEL", examples=25)
def _load_model(data, env):
    which = branch(("spec", "dtype", "device", "backend", "n_ctx", "n_devices"))
    # One wrong option with the tiny model's folder (never a built-in model: the fast tier converts none)
    kwargs: dict[str, Any] = {"spec": _tiny_dir(env)}
    names: tuple[str, ...] = ()
    if which == "spec":
        kwargs["spec"] = data.draw(st.one_of(unknown(ih.BUILTIN_MODELS), wrong_type,
                                             st.sampled_from((env.files / "a_folder", env.files / "text.txt"))))
    elif which == "dtype":
        kwargs.update(dtype=data.draw(st.one_of(unknown(("float32", "bfloat16", "float16",
                                                                                  "auto", "fp32", "bf16", "fp16")),
                                                                          wrong_type)))
        names = ("dtype",)
    elif which == "device":
        kwargs.update(device=data.draw(st.one_of(
            st.sampled_from(("gpu", "cuda:99", "cuda", "mps", "tpu", "cuda:-1", "cuda:x", "")), wrong_type)))
        names = ("device",)
    elif which == "backend":
        kwargs.update(backend=data.draw(st.one_of(unknown(("auto", "hooked", "bridge")),
                                                                          wrong_type)))
        names = ("backend",)
    elif which == "n_ctx":
        kwargs.update(n_ctx=data.draw(bad_int.filter(lambda v: v is not None)))
        names = ("n_ctx",)
    else:
        kwargs.update(n_devices=data.draw(st.one_of(st.integers(2, 9), bad_int)))
        names = ("n_devices",)
    spec = kwargs.pop("spec")
    expect(lambda: ih.load_model(spec, progress=False, **kwargs), names=names)


@case("model_info", "ModelInfo")
def _model_info(data, env):
    bad = data.draw(st.one_of(wrong_type, st.sampled_from((ih.DEFAULT_MODEL, env.scores, torch.zeros(3)))))
    fails(lambda: ih.model_info(bad), names=("model",))
    info = ih.model_info(env.model)
    assert isinstance(info, ih.ModelInfo) and info.n_heads == env.n_heads


@case("record_scores", "HeadScores", examples=30)
def _record_scores(data, env):
    n_vocab = TINY_GQA_VOCAB
    which = branch(("inputs", "token_ids", "scores", "batch_size", "model", "attention", "seed"))
    inputs: Any = [[1, 2, 3]]
    kwargs: dict[str, Any] = {"progress": False}
    model, names = env.model, ()
    if which == "inputs":
        inputs = data.draw(st.one_of(
            wrong_type,
            st.lists(st.one_of(st.integers(), st.none(), st.floats()), min_size=1, max_size=3),  # [3]: not lists
            st.lists(st.lists(st.integers(min_value=-10**9, max_value=10**9), min_size=0, max_size=5),
                     min_size=0, max_size=3),  # ids out of the vocabulary, empty inputs
            st.lists(st.lists(st.sampled_from((0.5, NAN, "a", None, 3)), min_size=1, max_size=3), min_size=1,
                     max_size=2),
            st.just([[1] * 200]),  # longer than the context
            st.just([""]),
        ))
    elif which == "token_ids":  # one id outside the vocabulary, among good ones
        bad_id = data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=n_vocab)))
        inputs = [[1, 2, bad_id, 3]]
        names = ("token id",)
    elif which == "scores":
        scores_arg = data.draw(st.one_of(unknown(ih.score_keys()), wrong_type,
                                         st.lists(st.one_of(unknown(ih.score_keys()), wrong_type), max_size=3)))
        kwargs["scores"] = scores_arg
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "attention":
        kwargs["attention"] = data.draw(st.one_of(unknown(("exact", "fast")), wrong_type))
        names = ("attention",)
    elif which == "seed":
        kwargs["seed"] = data.draw(st.one_of(st.integers(-10**30, 10**30), wrong_type))
    else:
        model = data.draw(st.one_of(wrong_type, st.just(ih.DEFAULT_MODEL)))
        names = ("model",)
    out = expect(lambda: ih.record_scores(model, inputs, **kwargs), names=names)
    if not isinstance(out, UserError):  # only valid token ids get through
        assert isinstance(out, ih.HeadScores) and which != "token_ids"
        for seq in inputs if which == "inputs" else ():
            assert all(0 <= t < n_vocab for t in seq)
    # HeadScores built by hand, indexed, subset
    bad_tensors = data.draw(st.one_of(wrong_type, st.dictionaries(name_text, st.one_of(
        wrong_type, st.sampled_from((torch.zeros(2), torch.zeros(2, 3, 4), torch.zeros(1, 1)))), max_size=2)))
    expect(lambda: ih.HeadScores(bad_tensors))
    expect(lambda: env.scores[data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))])
    index = data.draw(st.one_of(st.lists(st.integers(-10**6, 10**6), max_size=3), wrong_type))
    expect(lambda: env.scores.subset(index))


@case("HeadScores.load/save")
def _head_scores_files(data, env):
    path = data.draw(st.one_of(files(env, "heads.json", "text.txt"), wrong_type))
    fails(lambda: ih.HeadScores.load(path))
    scratch = env.scratch()
    target = data.draw(st.one_of(wrong_type, st.sampled_from((scratch / "no/dir/s.safetensors", scratch,
                                                               Path("/proc/forbidden.safetensors")))))
    expect_in(scratch, lambda: env.scores.save(target))


@case("calibrate", "Thresholds", "DEFAULT_QUANTILES", examples=30)
def _calibrate(data, env):
    which = branch(("quantiles", "key", "scores", "direction", "thresholds"))
    key, quantiles, scores, direction = "ahon_ln", list(ih.DEFAULT_QUANTILES), env.scores, None
    names: tuple[str, ...] = ()
    if which == "quantiles":
        quantiles = data.draw(st.one_of(
            st.lists(bad_quantile, min_size=1, max_size=3).map(lambda bad: list(ih.DEFAULT_QUANTILES) + bad),
            st.just([]), wrong_type))
        names = ("quantiles",)
    elif which == "key":
        key = data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))
    elif which == "scores":
        scores = data.draw(st.one_of(wrong_type, st.sampled_from((
            torch.tensor([NAN, 1.0]), torch.tensor([]), torch.full((2, 3, 4), INF), [1.0, NAN], "scores.pt"))))
    elif which == "direction":
        direction = data.draw(st.one_of(unknown(("below", "above")), wrong_type))
        names = ("direction",)
    else:
        t = ih.calibrate(env.scores, "ahon_ln", [0.1, 0.3])
        expect(lambda: t.at(data.draw(st.one_of(bad_quantile, st.floats(0, 0.99), wrong_type))))
        fields = {"key": "k", "quantiles": [0.1], "values": [1.0], "direction": "below"}
        field = data.draw(st.sampled_from(sorted(fields)))
        fields[field] = data.draw(wrong_type)
        expect(lambda: ih.Thresholds(**fields))
        broken = {k: v for k, v in t.to_dict().items() if k != data.draw(st.sampled_from(sorted(t.to_dict())))}
        expect(lambda: ih.Thresholds.from_dict(data.draw(st.one_of(st.just(broken), wrong_type))))
        return
    expect(lambda: ih.calibrate(scores, key, quantiles, direction=direction), names=names)


@case("official_thresholds", "official_models", examples=15)
def _official(data, env):
    models = ih.official_models("mmlu")
    model = data.draw(st.one_of(unknown(models), wrong_type, st.sampled_from(models)))
    task = data.draw(st.one_of(unknown(("mmlu", "piqa", "winogrande")), wrong_type, st.just("mmlu")))
    key = data.draw(st.one_of(unknown(ih.score_keys()), wrong_type, st.just("awft")))
    expect(lambda: ih.official_thresholds(model, task, key))
    expect(lambda: ih.official_models(task))


@case("get_score", "PAPER_SCORES", "score_keys")
def _get_score(data, env):
    key = data.draw(st.one_of(unknown(ih.PAPER_SCORES + ("random", "fho", "fho_ln")), wrong_type))
    fails(lambda: ih.get_score(key), names=(repr(key), str(key)))
    flags = {"include_appendix": data.draw(st.one_of(st.booleans(), wrong_type)),
             "include_random": data.draw(st.one_of(st.booleans(), wrong_type))}
    expect(lambda: ih.score_keys(**flags))


@case("register_score", "unregister_score", "ScoreFunction", "LayerActivations", "layer_normalize", examples=25)
def _register_score(data, env):
    which = branch(("raises", "shape", "nan", "args", "unregister", "is_inactive", "normalize"))
    key = "fuzz_score"
    try:
        if which in ("raises", "shape", "nan"):
            # A registered score function that raises, or returns a wrong shape or NaN, while recording.
            bad = {"raises": lambda acts: 1 / 0, "shape": lambda acts: torch.zeros(3),
                   "nan": lambda acts: torch.full((acts.valid.shape[0], acts.n_heads), NAN)}[which]
            ih.register_score(key, reads=("pattern",), direction="below")(bad)
            fails(lambda: ih.record_scores(env.model, [[1, 2, 3]], [key], progress=False), names=(key,))
        elif which == "args":
            kwargs = {"key": key, "reads": ("pattern",), "direction": "below"}
            field = data.draw(st.sampled_from(("key", "reads", "direction")))
            kwargs[field] = data.draw(st.one_of(wrong_type, name_text, st.lists(name_text, max_size=2)))
            out = expect(lambda: ih.register_score(**kwargs))
            if not isinstance(out, UserError):
                expect(lambda: out(lambda acts: acts.pattern[:, :, -1, 0]))
        elif which == "unregister":
            expect(lambda: ih.unregister_score(data.draw(st.one_of(unknown(ih.score_keys()), wrong_type,
                                                                   st.sampled_from(("awft", "random"))))))
        elif which == "is_inactive":
            fn = ih.get_score("ahon_ln")
            threshold = data.draw(st.one_of(non_finite, wrong_type))
            fails(lambda: fn.is_inactive(torch.rand(2, 3), threshold), names=("threshold",))
        else:
            fails(lambda: ih.layer_normalize(data.draw(st.one_of(
                wrong_type, st.sampled_from((torch.zeros(3), torch.zeros(2, 3, 4), [[1.0, 2.0]]))))),
                names=("scores",))
    finally:
        if key in ih.score_keys():
            ih.unregister_score(key)


@case("DynamicAblation", "RandomAblation", "StaticAblation", "HeadAblation", "AblationStats", examples=30)
def _ablations(data, env):
    which = branch(("dynamic", "random", "static", "subclass", "stats"))
    if which == "dynamic":
        score = data.draw(st.one_of(st.just("ahon_ln"), unknown(ih.score_keys()), wrong_type))
        threshold = data.draw(st.one_of(st.just(0.5), non_finite, wrong_type))
        seed = data.draw(st.one_of(st.just(0), wrong_type))
        expect(lambda: ih.DynamicAblation(score, threshold, seed=seed))
    elif which == "random":
        expect(lambda: ih.RandomAblation(data.draw(st.one_of(bad_quantile, wrong_type)),
                                         seed=data.draw(st.one_of(st.just(0), wrong_type))))
    elif which == "static":
        heads = data.draw(bad_heads(env.n_layers, env.n_heads))
        out = expect(lambda: ih.StaticAblation(heads))
        if not isinstance(out, UserError):  # out-of-range heads: known once it meets the model
            fails(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=out, progress=False),
                  names=("head",))
    elif which == "subclass":
        shape = data.draw(st.sampled_from(((1,), (5, 2), (1, env.n_heads + 1))))

        class Wrong(ih.HeadAblation):
            def decide(self, acts):
                return torch.zeros(*shape, dtype=torch.bool)

        fails(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=Wrong(), progress=False))
    else:
        expect(lambda: ih.AblationStats(data.draw(int_or_wrong), data.draw(int_or_wrong)))


@case("ablation_from_spec", "AblationSpec", "ablation_kinds", "register_ablation", "unregister_ablation",
      examples=25)
def _ablation_specs(data, env):
    which = branch(("spec", "dict", "register", "unregister"))
    if which == "spec":
        fields: dict[str, Any] = {"kind": "dynamic", "score": "ahon_ln", "threshold": 0.5}
        field = data.draw(st.sampled_from(("kind", "score", "threshold", "heads", "seed", "params")))
        fields[field] = data.draw(st.one_of(wrong_type, unknown(ih.ablation_kinds()), non_finite))
        spec = expect(lambda: ih.AblationSpec(**fields))
        if not isinstance(spec, UserError):
            expect(lambda: spec.build())
            expect(lambda: ih.ablation_from_spec(spec))
    elif which == "dict":
        d = data.draw(st.one_of(wrong_type, st.dictionaries(
            st.sampled_from(("kind", "score", "threshold", "heads", "seed", "p", "params", "other")),
            st.one_of(wrong_type, unknown(ih.ablation_kinds()), st.sampled_from(ih.ablation_kinds())), max_size=4)))
        expect(lambda: ih.ablation_from_spec(d))
    elif which == "register":
        kind = data.draw(st.one_of(wrong_type, st.sampled_from(ih.ablation_kinds()), name_text))
        cls = data.draw(st.sampled_from((int, object, "x", None)))
        try:
            decorate = expect(lambda: ih.register_ablation(kind))
            if not isinstance(decorate, UserError):
                expect(lambda: decorate(cls))
        finally:
            if isinstance(kind, str) and kind not in ("static", "dynamic", "random") and kind in ih.ablation_kinds():
                ih.unregister_ablation(kind)
    else:
        expect(lambda: ih.unregister_ablation(data.draw(st.one_of(wrong_type, unknown(ih.ablation_kinds()),
                                                                  st.sampled_from(("static", "dynamic"))))))


@case("zero_heads_hook")
def _zero_heads_hook(data, env):
    heads = data.draw(st.one_of(wrong_type, st.lists(st.one_of(st.integers(-10**6, 10**6), wrong_type),
                                                     max_size=3)))
    hook = expect(lambda: ih.zero_heads_hook(heads), names=("heads",))
    if not isinstance(hook, UserError):  # a head index out of range is known once the hook meets z
        z = torch.ones(1, 2, env.n_heads, 8)
        expect(lambda: hook(z, None), names=("head",))


@case("evaluate", "plan_evaluation", "EvalPlan", "EvalResult", "TASKS", examples=30)
def _evaluate(data, env):
    which = branch(("task", "limit", "subjects", "num_fewshot", "ablation", "model", "plan", "result", "attention",
                    "batch_size"))
    kwargs: dict[str, Any] = {"limit": 1}
    task: Any = "piqa"
    model = env.model
    names: tuple[str, ...] = ()
    if which == "task":
        task = data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type))
    elif which == "limit":
        kwargs["limit"] = data.draw(bad_int.filter(lambda v: v is not None))
        names = ("limit",)
    elif which == "subjects":
        task = "mmlu"
        kwargs["subjects"] = data.draw(st.one_of(st.just([]), st.lists(st.one_of(name_text, wrong_type), min_size=1,
                                                                                 max_size=2), st.just(3)))
    elif which == "num_fewshot":
        kwargs["num_fewshot"] = data.draw(st.one_of(st.integers(max_value=-1), st.integers(6, 10**6), wrong_type))
        names = ("num_fewshot", "few-shot")
    elif which == "ablation":
        kwargs["ablation"] = data.draw(st.one_of(wrong_type, name_text, st.sampled_from(("ahon_ln@nan", "ahon_ln@x",
                                                                                         "static:99.0", "zz@0.5"))))
    elif which == "attention":
        kwargs["attention"] = data.draw(st.one_of(wrong_type, unknown(("exact", "fast"))))
        names = ("attention",)
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "model":
        model = data.draw(st.one_of(wrong_type, st.just(ih.DEFAULT_MODEL)))
        names = ("model",)
    elif which == "plan":
        plan = ih.plan_evaluation(env.model, "piqa", limit=1)
        expect(lambda: plan.subset(data.draw(st.one_of(st.lists(st.integers(-10**6, 10**6), max_size=3),
                                                       wrong_type))))
        field = data.draw(st.sampled_from(("requests", "inputs", "targets", "metrics")))
        broken = dict(vars(plan))
        broken[field] = data.draw(st.one_of(wrong_type, st.just([])))
        hand = expect(lambda: ih.EvalPlan(**broken))
        if not isinstance(hand, UserError):
            expect(lambda: ih.evaluate(env.model, hand, progress=False))
        expect(lambda: ih.plan_evaluation(env.model, data.draw(st.one_of(unknown(ih.TASKS), wrong_type))))
        return
    else:  # a record read back: EvalResult.from_dict of a foreign or truncated dict
        good = ih.EvalResult(task="piqa", accuracy=0.5, n=2, correct=[True, False],
                             loglikelihoods=[[-1.0, -2.0], [-1.0, -0.5]]).to_dict()
        drop = data.draw(st.sampled_from(sorted(good)))
        bad = data.draw(st.one_of(wrong_type, st.just({k: v for k, v in good.items() if k != drop}),
                                  st.just({**good, drop: data.draw(wrong_type)})))
        expect(lambda: ih.EvalResult.from_dict(bad))
        return
    expect(lambda: ih.evaluate(model, task, progress=False, **kwargs), names=names)


@case("generate", "evaluate_generation", "GenerationOutput", "GenerationResult", examples=25)
def _generate(data, env):
    which = branch(("prompts", "max_new_tokens", "decision", "ablation", "until", "eos", "batch_size",
                    "evaluate_generation", "result"))
    prompts: Any = [[1, 2, 3]]
    kwargs: dict[str, Any] = {"max_new_tokens": 2, "progress": False}
    names: tuple[str, ...] = ()
    if which == "prompts":
        prompts = data.draw(st.one_of(wrong_type, st.just([]), st.just([[]]), st.just(["t1 t2"]),
                                      st.lists(st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=3),
                                               min_size=1, max_size=2)))
    elif which == "max_new_tokens":
        kwargs["max_new_tokens"] = data.draw(st.one_of(bad_int, st.integers(64, 10**6)))
        names = ("max_new_tokens",)
    elif which == "decision":
        kwargs["decision"] = data.draw(st.one_of(unknown(("per_step", "prompt")), wrong_type))
        names = ("decision",)
    elif which == "ablation":
        kwargs["ablation"] = data.draw(st.one_of(wrong_type, st.just(ih.StaticAblation([(99, 0)]))))
    elif which == "until":
        kwargs["until"] = data.draw(st.one_of(wrong_type, st.lists(wrong_type, min_size=1, max_size=2)))
    elif which == "eos":
        kwargs["eos_token_id"] = data.draw(st.one_of(wrong_type, st.integers(-10**6, -1)))
    elif which == "batch_size":
        kwargs["batch_size"] = data.draw(bad_int)
        names = ("batch_size",)
    elif which == "evaluate_generation":
        task = data.draw(st.one_of(st.just("gsm8k"), unknown(("gsm8k",)), wrong_type, st.sampled_from(ih.TASKS)))
        limit = data.draw(st.one_of(st.just(1), bad_int))
        expect(lambda: ih.evaluate_generation(env.model, task, limit=limit, max_gen_toks=2, progress=False))
        return
    else:
        good = ih.GenerationResult(task="gsm8k", accuracy=0.0, accuracy_flexible=0.0, n=1, correct=[False],
                                   correct_flexible=[False], generations=["x"], answers=[{}], golds=["1"]).to_dict()
        drop = data.draw(st.sampled_from(sorted(good)))
        expect(lambda: ih.GenerationResult.from_dict(data.draw(st.one_of(
            wrong_type, st.just({k: v for k, v in good.items() if k != drop})))))
        expect(lambda: ih.GenerationOutput(tokens=data.draw(wrong_type), decision="prompt", use_cache=True))
        return
    out = expect(lambda: ih.generate(env.model, prompts, **kwargs), names=names)
    assert isinstance(out, (UserError, ih.GenerationOutput))


@case("load_docs", "build_requests", "task_spec", "TaskSpec", "plan_for_task", examples=20)
def _tasks(data, env):
    which = branch(("load_docs", "build_requests", "task_spec", "plan_for_task"))
    task = data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type, st.sampled_from(ih.TASKS)))
    limit = data.draw(st.one_of(st.just(1), bad_int))
    source = data.draw(st.one_of(st.none(), files(env)))
    if which == "load_docs":
        expect(lambda: ih.load_docs(task, limit=limit, source=source))
    elif which == "build_requests":
        tokenizer = data.draw(st.one_of(st.just(env.model.tokenizer), wrong_type))
        expect(lambda: ih.build_requests(task, tokenizer, limit=limit, source=source))
    elif which == "task_spec":
        spec = expect(lambda: ih.task_spec(task))
        if not isinstance(spec, UserError):
            subjects = data.draw(st.one_of(st.none(), wrong_type))
            expect(lambda: check_task_options(spec.name, limit=limit, subjects=subjects))
    else:
        expect(lambda: ih.plan_for_task(env.model, task, limit=limit, source=source))


# One wrong field of a Task each (the rest a valid multiple-choice task): register_task refuses it.
_BAD_TASK_FIELDS = {
    "name": st.one_of(wrong_type, st.sampled_from(("", " t", "lm-eval:t"))),
    "kind": st.one_of(unknown(("multiple_choice", "generation")), wrong_type),
    "metrics": st.one_of(wrong_type, st.sampled_from(((), ("acc_norm",), ("acc", "f1"), ([1],), ("exact_match",)))),
    "num_fewshot": bad_int.filter(lambda v: v != 0 and v is not None),
    "fewshot_sampler": st.one_of(unknown(("default", "first_n")), wrong_type),
    "docs": st.sampled_from((3, "x", b"x", 2.5, True)),
    "doc_to_text": st.just(None),
}


@case("Task", "register_task", "unregister_task", "get_task", examples=20)
def _task_registry(data, env):
    which = branch(("task", "register", "unregister", "get"))
    if which == "task":
        field = data.draw(st.sampled_from(sorted(_BAD_TASK_FIELDS)))
        fields = {"name": "fuzz_task", "docs": {"test": []}, "doc_to_text": str, "doc_to_choice": list,
                  "doc_to_target": len, field: data.draw(_BAD_TASK_FIELDS[field])}
        out = expect(lambda: ih.register_task(ih.Task(**fields)))
        assert isinstance(out, UserError), f"a task with a bad {field} was registered"
    elif which == "register":
        expect(lambda: ih.register_task(data.draw(wrong_type)))
        builtin = ih.get_task(data.draw(st.sampled_from(ih.TASKS)))
        assert isinstance(expect(lambda: ih.register_task(builtin, overwrite=True)), UserError)
    elif which == "unregister":
        name = data.draw(st.one_of(st.sampled_from(ih.TASKS), unknown(ih.TASKS + ("gsm8k",)), wrong_type))
        assert isinstance(expect(lambda: ih.unregister_task(name)), UserError)
    else:
        expect(lambda: ih.get_task(data.draw(st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type))))


@case("read_text_file", "lambada_passages")
def _texts(data, env):
    path = data.draw(st.one_of(files(env, "blank.txt"), wrong_type))
    expect(lambda: ih.read_text_file(path))
    kwargs = {name: data.draw(st.one_of(bad_int, st.integers(10**5, 10**7)))
              for name in data.draw(st.sets(st.sampled_from(("n", "min_tokens", "max_tokens")), min_size=1))}
    tokenizer = data.draw(st.one_of(st.none(), wrong_type))
    expect(lambda: ih.lambada_passages(tokenizer=tokenizer, **kwargs))


@case("static_heads", "HeadSet", examples=25)
def _static_heads(data, env):
    which = branch(("fraction", "key", "rule", "scores", "headset", "load"))
    args: dict[str, Any] = {"head_scores": env.scores, "key": "ahon_ln", "fraction": 0.3}
    names: tuple[str, ...] = ()
    if which == "fraction":
        args["fraction"] = data.draw(st.one_of(bad_fraction, st.just(0.001)))
        names = ("fraction",)
    elif which == "key":
        args["key"] = data.draw(st.one_of(unknown(env.scores.keys()), wrong_type))
    elif which == "rule":
        args["rule"] = data.draw(st.one_of(unknown(("flag_rate", "mean")), wrong_type))
        names = ("rule",)
    elif which == "scores":
        args["head_scores"] = data.draw(st.one_of(wrong_type, st.sampled_from((torch.zeros(3), torch.full((2, 3, 4),
                                                                                                            NAN)))))
    elif which == "headset":
        heads = data.draw(bad_heads(env.n_layers, env.n_heads))
        expect(lambda: ih.HeadSet(heads, n_layers=env.n_layers, n_heads=env.n_heads), names=("head",))
        expect(lambda: ih.HeadSet(((0, 0),), n_layers=data.draw(int_or_wrong), n_heads=data.draw(int_or_wrong)))
        return
    else:
        fails(lambda: ih.HeadSet.load(data.draw(st.one_of(files(env, "text.txt"), wrong_type))))
        return
    expect(lambda: ih.static_heads(**args), names=names)


@case("savings", "oracle_savings", "paper_projections", "ModelShape", "Savings", examples=25)
def _savings(data, env):
    which = branch(("heads", "seq_len", "dtype", "model", "oracle", "projections", "shape"))
    args: dict[str, Any] = {"model": env.model, "heads": [(0, 0)]}
    names: tuple[str, ...] = ()
    if which == "heads":
        args["heads"] = data.draw(bad_heads(env.n_layers, env.n_heads))
    elif which == "seq_len":
        args["seq_len"] = data.draw(bad_int)
        names = ("seq_len",)
    elif which == "dtype":
        args["dtype"] = data.draw(st.one_of(unknown(("float32", "bfloat16", "float16")), wrong_type))
        names = ("dtype",)
    elif which == "model":
        args["model"] = data.draw(st.one_of(wrong_type, unknown(("meta-llama/Llama-3.1-8B",))))
    elif which == "oracle":
        flagged = data.draw(st.one_of(wrong_type, st.sampled_from((
            torch.zeros(2, env.n_layers, env.n_heads), torch.zeros(2, 1, 1, dtype=torch.bool),
            torch.zeros(3, dtype=torch.bool)))))
        lengths = data.draw(st.one_of(st.none(), wrong_type, st.lists(st.integers(-5, 5), max_size=3)))
        expect(lambda: ih.oracle_savings(env.model, flagged, lengths=lengths))
        return
    elif which == "projections":
        expect(lambda: ih.paper_projections(data.draw(st.one_of(bad_fraction, wrong_type)),
                                            seq_len=data.draw(st.one_of(st.just(2048), bad_int))))
        return
    else:
        d = ih.ModelShape(name="m", family="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
                          d_mlp=64, vocab_size=100).to_dict()
        field = data.draw(st.sampled_from(sorted(d)))
        broken = data.draw(st.one_of(st.just({k: v for k, v in d.items() if k != field}),
                                     st.just({**d, field: data.draw(st.one_of(wrong_type, st.integers(-5, 0)))})))
        shape = expect(lambda: ih.ModelShape.from_dict(broken))
        if not isinstance(shape, UserError):
            expect(lambda: ih.savings(shape, [(0, 0)]))
        return
    expect(lambda: ih.savings(**args), names=names)


@case("export_pruned", examples=12)
def _export(data, env):
    scratch = env.scratch()
    (scratch / "full").mkdir()
    (scratch / "full" / "keep.txt").write_text("keep")
    which = branch(("heads", "mode", "out", "model", "dtype"))
    args: dict[str, Any] = {"model": env.model, "heads": [(0, 0)], "out_dir": scratch / "out"}
    if which == "heads":
        args["heads"] = data.draw(st.one_of(bad_heads(env.n_layers, env.n_heads), st.just([])))
    elif which == "mode":
        args["mode"] = data.draw(st.one_of(unknown(("zeroed", "pruned")), wrong_type))
    elif which == "out":
        args["out_dir"] = data.draw(st.one_of(wrong_type, st.sampled_from((scratch / "full", env.files / "text.txt"))))
    elif which == "model":
        args["model"] = data.draw(st.one_of(wrong_type, unknown(ih.BUILTIN_MODELS),
                                            st.sampled_from((env.files / "a_folder",))))
    else:
        args["dtype"] = data.draw(st.one_of(unknown(("float32", "bfloat16", "float16")), wrong_type))
    out = expect_in(scratch, lambda: ih.export_pruned(**args))
    assert (scratch / "full" / "keep.txt").read_text() == "keep"
    del out


@case("SweepConfig", "run_sweep", examples=25)
def _sweep_config(data, env):
    field = branch(("task", "limit", "quantiles", "scores", "dtype", "device", "batch_size", "n_ctx", "thresholds",
                    "subjects", "num_fewshot", "seed", "backend", "ablations", "imports", "static_calibration",
                    "attention", "model"))
    values = {
        "task": st.one_of(unknown(ih.TASKS + ("gsm8k",)), wrong_type),
        "limit": bad_int.filter(lambda v: v is not None),
        "quantiles": st.one_of(st.lists(bad_quantile, min_size=1, max_size=2), st.just([]), wrong_type),
        "scores": st.one_of(st.lists(st.one_of(unknown(ih.score_keys()), wrong_type), min_size=1, max_size=2),
                            wrong_type),
        "dtype": st.one_of(unknown(("float32", "bfloat16", "float16", "auto")), wrong_type),
        "device": st.one_of(st.sampled_from(("gpu", "cuda:99", "tpu", "")), wrong_type),
        "batch_size": bad_int,
        "n_ctx": bad_int.filter(lambda v: v is not None),
        "thresholds": st.one_of(unknown(("calibrated",)), wrong_type, st.just("official:nobody/none")),
        "subjects": st.one_of(st.lists(name_text, max_size=2), wrong_type),
        "num_fewshot": st.one_of(st.integers(max_value=-1), wrong_type),
        "seed": wrong_type,
        "backend": st.one_of(unknown(("auto", "hooked", "bridge")), wrong_type),
        "ablations": st.one_of(wrong_type, st.lists(st.one_of(wrong_type, name_text), min_size=1, max_size=2)),
        "imports": st.one_of(wrong_type, st.lists(st.one_of(wrong_type, name_text), min_size=1, max_size=2)),
        "static_calibration": st.one_of(wrong_type, st.lists(st.integers(-5, 5), max_size=3)),
        "attention": st.one_of(unknown(("exact", "fast")), wrong_type),
        "model": st.one_of(wrong_type, st.just("")),
    }
    kwargs = {"task": "piqa", "limit": 1, "scores": ["ahon_ln"], "quantiles": [0.1], field: data.draw(values[field])}
    config = expect(lambda: ih.SweepConfig(**kwargs))
    if isinstance(config, UserError):
        return
    expect(lambda: config.validate())
    # run_sweep: the bad config is refused before anything is written; an existing folder is untouched
    scratch = env.scratch()
    out = data.draw(st.sampled_from((scratch / "new", scratch / "existing")))
    if out.name == "existing":
        shutil.copytree(env.sweep, out)
    expect_in(scratch, lambda: ih.run_sweep(config, out, model=env.model, progress=False))
    # a config read back from a hand-edited sweep.json
    d = ih.SweepConfig(task="piqa", limit=1).to_dict()
    d[data.draw(st.sampled_from(sorted(d) + ["modle"]))] = data.draw(wrong_type)
    expect(lambda: ih.SweepConfig.from_dict(d))


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


@case("load_results", "sweep_results", "SweepResults", examples=30)
def _results(data, env):
    folder = env.copy_sweep()
    _corrupt(folder, data)
    before = tree_hashes(folder)
    level = data.draw(st.one_of(st.just("runs"), st.just("questions"), unknown(("runs", "questions")), wrong_type))
    expect(lambda: ih.load_results(folder, level=level))
    results = expect(lambda: ih.sweep_results(folder))
    if not isinstance(results, UserError):
        for use in (lambda: results.baseline_percent, lambda: results.curves(), lambda: results.score_keys,
                    lambda: results.to_dataframe("runs")):
            expect(use)
    expect(lambda: ih.sweep_results(data.draw(st.one_of(wrong_type, files(env)))))
    assert tree_hashes(folder) == before, "reading a results folder changed it"


@case("lm_eval_model", examples=8)
def _lm_eval_model(data, env):
    model = data.draw(st.one_of(wrong_type, unknown(ih.BUILTIN_MODELS)))
    ablation = data.draw(st.one_of(st.none(), wrong_type, name_text))
    expect(lambda: ih.lm_eval_model(model, ablation))


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


@case("PredictedAblation", "Predictor", examples=30)
def _predictor(data, env):
    which = branch(("path", "damaged", "held_heads", "evaluate"))
    if which == "path":
        path = data.draw(st.one_of(wrong_type, files(env)))
        expect(lambda: ih.PredictedAblation(path), names=("path", "predictor", str(path)))
        expect(lambda: ih.Predictor.load(path))
    elif which == "damaged":
        folder = _damaged_predictor(env, data)
        before = tree_hashes(folder)
        for build in (lambda: ih.Predictor.load(folder), lambda: ih.PredictedAblation(folder)):
            out = expect(build)
            if not isinstance(out, UserError):  # a damaged field that still loads must fail on the model
                ablation = out if isinstance(out, ih.PredictedAblation) else None
                if ablation is not None:
                    expect(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=ablation, progress=False))
        assert tree_hashes(folder) == before, "loading a predictor changed its folder"
    elif which == "held_heads":
        predictor = ih.Predictor.load(_predictor_dir(env))
        d = env.model.cfg.d_model
        layer = data.draw(st.one_of(st.just(0), st.integers(-10**6, -1), st.integers(env.n_layers, 10**6), wrong_type))
        resid = data.draw(st.sampled_from((torch.zeros(2, 5, d), torch.zeros(2, 5, d + 1), torch.zeros(5, d),
                                           torch.full((1, 3, d), NAN), None, [[0.0] * d], "x")))
        mask = data.draw(st.sampled_from((None, torch.ones(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long),
                                          torch.ones(3, 7, dtype=torch.long), "x", 3)))
        expect(lambda: predictor.held_heads(layer, resid, mask))
    else:
        spec = {"kind": "predicted", "path": data.draw(st.one_of(wrong_type, files(env)))}
        expect(lambda: ih.ablation_from_spec(spec))
        expect(lambda: ih.evaluate(env.model, "piqa", limit=1, ablation=spec, progress=False))


# Defects the fuzz still finds, not fixed yet (issue 30): each case is expected to fail (strict: once
# fixed, the case passes and this entry must go). Keep this list short and say what escapes.
OPEN_DEFECTS: dict[str, str] = {
}


def _params(names, prefix=""):
    return [pytest.param(n, marks=pytest.mark.xfail(reason=OPEN_DEFECTS[prefix + n], strict=True))
            if prefix + n in OPEN_DEFECTS else n for n in names]


def test_every_public_name_has_a_case():
    """A new public name without a fuzz case fails here: add one with @case("name")."""
    missing = sorted(set(ih.__all__) - set(CASES))
    assert not missing, f"public names without a fuzz case in {Path(__file__).name}: {missing}"
    stale = sorted(n for n in set(CASES) - set(ih.__all__) if "." not in n)
    assert not stale, f"fuzz cases for names that are not public: {stale}"


@pytest.mark.parametrize("name", _params(sorted(CASES)))
def test_wrong_input_gets_a_one_line_user_error(name, env):
    run_branches(name, CASES[name], env)


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


@cli_case("models", examples=3)
def _cli_models(data, env):
    check_cli("models", data.draw(st.sampled_from((["--json"], ["--bad"], ["--json", "x"]))))


@cli_case("score")
def _cli_score(data, env):
    argv = ["--model", _tiny_dir(env), "--text-file", env.files / "text.txt", "--out", env.scratch() / "s.safetensors"]
    which = branch(("option", "text-file", "out"))
    if which == "option":
        argv += _bad_option(data, "--model", "--dtype", "--device", "--batch-size", "--n-ctx", "--scores")
    elif which == "text-file":
        argv += ["--text-file", data.draw(st.sampled_from((env.files / "missing.txt", env.files / "blank.txt",
                                                            env.files / "binary.bin", env.files / "a_folder")))]
    else:
        argv[-1] = data.draw(st.sampled_from((env.tmp / "no/dir/s.safetensors", env.tmp)))
    with unchanged_if_failed(env.tmp) as box:
        code = check_cli("score", argv)
        box["out"] = UserError() if code else None


@cli_case("calibrate")
def _cli_calibrate(data, env):
    scratch = env.scratch()
    argv = [data.draw(st.one_of(st.just(env.files / "scores.safetensors"), files(env)))]
    argv += data.draw(st.sampled_from(([], ["--scores", "zz"], ["--quantiles", "nan"], ["--quantiles", "2"],
                                       ["--out", scratch / "no/dir/t.json"], ["--out", scratch])))
    with unchanged_if_failed(scratch) as box:
        box["out"] = UserError() if check_cli("calibrate", argv) else None


@cli_case("export", examples=10)
def _cli_export(data, env):
    scratch = env.scratch()
    source = data.draw(st.sampled_from((
        ["--heads", env.files / "heads.json"], ["--heads", env.files / "truncated.json"],
        ["--heads", env.files / "foreign.json"], ["--heads", env.files / "missing.json"],
        ["--from-scores", env.files / "truncated.safetensors"], ["--from-scores", env.files / "scores.safetensors"],
        ["--from-sweep", env.files / "a_folder"])))
    extra = data.draw(st.sampled_from(([], ["--score", "zz", "--fraction", "0.3"], ["--score", "ahon_ln"],
                                       ["--score", "ahon_ln", "--fraction", "1.5"],
                                       ["--score", "ahon_ln", "--fraction", "0.3"])))
    model = data.draw(st.sampled_from(("no-such-model", env.files / "a_folder")))
    with unchanged_if_failed(scratch) as box:
        box["out"] = UserError() if check_cli("export", ["--model", model, *source, *extra,
                                                          "--out", scratch / "out"]) else None


@cli_case("sweep")
def _cli_sweep(data, env):
    scratch = env.scratch()
    argv = ["--model", _tiny_dir(env), "--task", "piqa", "--limit", "1", "--scores", "ahon_ln", "--quantiles", "0.1",
            "--out", scratch / "out"]
    argv += _bad_option(data, "--model", "--dtype", "--device", "--batch-size", "--n-ctx", "--task", "--limit",
                        "--num-fewshot", "--scores", "--quantiles")
    with unchanged_if_failed(scratch) as box:
        box["out"] = UserError() if check_cli("sweep", argv) else None


@cli_case("grid")
def _cli_grid(data, env):
    grid = data.draw(st.one_of(files(env, "foreign.toml", "truncated.toml", "grid.toml")))
    check_cli("grid", [grid, *data.draw(st.sampled_from(([], ["--tolerance", "nan"], ["--tolerance", "x"])))])


@cli_case("report", examples=25)
def _cli_report(data, env):
    folder = env.copy_sweep()
    _corrupt(folder, data)
    before = tree_hashes(folder)
    extra = data.draw(st.sampled_from(([], ["--runs"], ["--tolerance", "nan"], ["--tolerance", "-1"],
                                       ["--tolerance", "inf"])))
    code = check_cli("report", [folder, *extra])
    if code:
        assert tree_hashes(folder) == before, "a report given a bad folder changed it"
    check_cli("report", [data.draw(files(env)), "--compare", folder])


@cli_case("demo", examples=8)
def _cli_demo(data, env):
    scratch = env.scratch()
    argv = ["--out", scratch / "demo", *_bad_option(data, "--dtype", "--device", "--batch-size", "--n-ctx",
                                                    "--limit", "--quantiles")]
    if data.draw(st.booleans()):
        argv += ["--subjects", "anatomy"]  # with --task piqa: not for this task
    with unchanged_if_failed(scratch) as box:
        box["out"] = UserError() if check_cli("demo", argv) else None


@cli_case("predict", examples=20)
def _cli_predict(data, env):
    scratch = env.scratch()
    which = branch(("fit option", "fit value", "eval dir", "eval option"))
    if which == "fit option":
        argv = ["fit", "--model", _tiny_dir(env), "--task", "piqa", "--limit", "2", "--steps", "2", "--out",
                scratch / "pred", *_bad_option(data, "--model", "--dtype", "--device", "--batch-size", "--task",
                                               "--limit")]
    elif which == "fit value":
        argv = ["fit", "--model", _tiny_dir(env), "--limit", "2", "--out", scratch / "pred"]
        argv += data.draw(st.sampled_from((["--score", "zz"], ["--p", "nan"], ["--p", "1.5"], ["--threshold", "x"],
                                           ["--lookahead", "2"], ["--rank", "0"], ["--steps", "-1"],
                                           ["--p", "0.1", "--threshold", "0.5"], ["--out", scratch / "f.txt"])))
        (scratch / "f.txt").write_text("a file, not a folder")
    elif which == "eval dir":
        argv = ["eval", data.draw(st.one_of(files(env), st.builds(lambda _: _damaged_predictor(env, data),
                                                                   st.just(0))))]
    else:
        argv = ["eval", _predictor_dir(env), *data.draw(st.sampled_from((
            ["--task", "nope"], ["--limit", "0"], ["--model", "no-such-model"], ["--task", "winogrande",
                                                                                  "--subjects", "anatomy"])))]
    with unchanged_if_failed(scratch) as box:
        box["out"] = UserError() if check_cli("predict", argv) else None


def test_every_sub_command_has_a_case():
    missing = sorted(set(cli.SUBCOMMANDS) - set(CLI_CASES))
    assert not missing, f"sub-commands without a fuzz case in {Path(__file__).name}: {missing}"


@pytest.mark.parametrize("command", _params(sorted(CLI_CASES), "cli "))
def test_wrong_command_line_input_exits_2_in_one_line(command, env):
    run_branches(f"cli {command}", CLI_CASES[command], env)


def test_a_toolkit_failure_is_reported_as_a_bug_with_where_to_report_it(monkeypatch):
    def fail(args):
        raise InactiveHeadsError("a pinned model's weights did not convert cleanly")

    monkeypatch.setitem(cli.SUBCOMMANDS, "models", cli.Subcommand("fails", lambda parser: None, fail))
    code, err = run_cli(["models"])
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "a bug" in err and "docs/errors.md#reporting-a-bug" in err
    section = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    assert "\n## Reporting a bug\n" in section


# ----------------------------------------------------------------------------------------------
# The command line as a user runs it: a real process per sub-command


SUBPROCESS_CASES = {
    "models": ["models", "--jsn"],
    "score": ["score", "--scores", "ahon_ln2", "--out", "{tmp}/s.safetensors"],
    "calibrate": ["calibrate", "{tmp}/missing.safetensors"],
    "export": ["export", "--model", "no-such-model", "--heads", "{tmp}/missing.json", "--out", "{tmp}/out"],
    "sweep": ["sweep", "--quantiles", "nan", "--out", "{tmp}/out"],
    "grid": ["grid", "{tmp}/missing.toml"],
    "report": ["report", "{tmp}"],
    "demo": ["demo", "--task", "piqa", "--subjects", "anatomy", "--out", "{tmp}/demo"],
    "predict": ["predict", "eval", "{tmp}/no-predictor"],
}


@pytest.mark.parametrize("command", sorted(SUBPROCESS_CASES))
def test_a_real_process_exits_2_with_one_line_and_no_traceback(command, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in SUBPROCESS_CASES[command]]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("INACTIVE_HEADS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "inactive_heads.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and lines[0].startswith("inactive-heads"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a failing command left files behind"


def test_a_real_process_reports_a_toolkit_failure_as_a_bug(tmp_path):
    # The other class of error: an InactiveHeadsError that is not a UserError, raised by a sub-command.
    script = ("import sys; from inactive_heads import cli; from inactive_heads.core.errors import InactiveHeadsError\n"
              "def fail(args):\n    raise InactiveHeadsError('weights did not convert cleanly')\n"
              "cli.SUBCOMMANDS['models'] = cli.Subcommand('fails', lambda parser: None, fail)\n"
              "sys.exit(cli.main(['models']))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("INACTIVE_HEADS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "a bug" in lines[0] and "docs/errors.md#reporting-a-bug" in lines[0]


def test_every_sub_command_has_a_real_process_case():
    assert sorted(SUBPROCESS_CASES) == sorted(cli.SUBCOMMANDS)


def test_every_case_generated_input(request):
    """Runs last in this file: each public name and sub-command got generated cases (when its test ran)."""
    ran = {item.callspec.params.get("name") or item.callspec.params.get("command")
           for item in request.session.items if getattr(item, "module", None) is request.module
           and hasattr(item, "callspec")
           and item.originalname in ("test_wrong_input_gets_a_one_line_user_error",
                                     "test_wrong_command_line_input_exits_2_in_one_line")}
    expected = {n for n in CASES if n in ran} | {f"cli {c}" for c in CLI_CASES if c in ran}
    _write_counts()
    empty = sorted(n for n in expected if COUNTS[n] == 0)
    assert not empty, f"no generated case reached {empty}"
