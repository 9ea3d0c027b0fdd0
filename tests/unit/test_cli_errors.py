"""How the command line reports errors: bad input (``UserError``) is one line and exit 2; anything
else is a bug, one line that says so and how to see the traceback, and exit 1."""

import pytest

from inactive_heads import cli
from inactive_heads.core.errors import InactiveHeadsError, UnknownNameError, UserError
from inactive_heads.scoring.scores import get_score


def run_failing(monkeypatch, capsys, error):
    def fail(args):
        raise error

    monkeypatch.setitem(cli.SUBCOMMANDS, "models", cli.Subcommand("fails", lambda parser: None, fail))
    code = cli.main(["models"])
    return code, capsys.readouterr().err


def test_user_errors_are_one_line_and_exit_2(monkeypatch, capsys):
    code, err = run_failing(monkeypatch, capsys, UserError("unknown thing 'x'; use 'y'"))
    assert (code, err) == (2, "inactive-heads models: error: unknown thing 'x'; use 'y'\n")


@pytest.mark.parametrize("error", [ValueError("bad shape (3,) in a kernel"), KeyError("layer_7"),
                                   RuntimeError("boom\nsecond line")])
def test_anything_else_is_reported_as_a_bug_in_one_line_and_exit_1(monkeypatch, capsys, error):
    # ValueError and KeyError included: raised by the toolkit's own code, they are bugs, not bad input
    code, err = run_failing(monkeypatch, capsys, error)
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "internal error (a bug" in err and type(error).__name__ in err
    assert "rerun with --debug for the traceback" in err and err.strip().endswith("docs/errors.md#reporting-a-bug for what to include")


def test_debug_lets_a_bug_propagate(monkeypatch):
    monkeypatch.setitem(cli.SUBCOMMANDS, "models",
                        cli.Subcommand("fails", lambda parser: None, lambda args: 1 / 0))
    with pytest.raises(ZeroDivisionError):
        cli.main(["--debug", "models"])


def test_an_unknown_score_is_a_user_error_and_a_key_error():
    with pytest.raises(UnknownNameError) as err:
        get_score("ahon_ln2")
    assert isinstance(err.value, UserError) and isinstance(err.value, KeyError)
    assert isinstance(err.value, InactiveHeadsError)
    assert str(err.value).startswith("unknown score 'ahon_ln2'; known: ")  # not quoted as KeyError would


def test_an_unknown_score_on_the_command_line_exits_2(capsys):
    code = cli.main(["sweep", "--scores", "ahon_ln2", "--out", "never-written"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("inactive-heads sweep: error: unknown score 'ahon_ln2'")
    assert len(err.strip().splitlines()) == 1


def test_a_missing_optional_dependency_is_one_line_naming_the_extra(monkeypatch, capsys):
    # lm-eval (the "lmeval" extra) is not installed: a user error that says what to install, in one
    # line and exit 2, not a bug. sys.modules[name] = None makes `import name` fail as if absent.
    import sys

    from inactive_heads.core.errors import MissingDependencyError
    from inactive_heads.evaluation.lm_eval_tasks import plan_lm_eval_task

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(MissingDependencyError) as err:
        plan_lm_eval_task(None, "lm-eval:arc_easy")
    assert isinstance(err.value, UserError) and isinstance(err.value, ModuleNotFoundError)
    code, out = run_failing(monkeypatch, capsys, err.value)
    assert code == 2 and out.strip().endswith("pip install 'inactive-heads[lmeval]'")
    assert len(out.strip().splitlines()) == 1
