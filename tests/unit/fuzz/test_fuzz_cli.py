"""Every sub-command, in-process, fed wrong command lines (fuzz_harness.py says the contract)."""

from pathlib import Path

import pytest
from hypothesis import strategies as st

from inactive_heads import cli
from inactive_heads.core.errors import InactiveHeadsError, UserError
from fuzz_harness import (
    CLI_CASES,
    REPO,
    _bad_option,
    _corrupt,
    _damaged_predictor,
    _params,
    _predictor_dir,
    _tiny_dir,
    branch,
    check_cli,
    cli_case,
    files,
    run_branches,
    run_cli,
    tree_hashes,
    unchanged_if_failed,
)


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



