"""The one head-index rule: heads and layers are numbered from 0 and a negative index is refused
by every public entry that takes heads, with a one-line error naming the value."""

import json

import pytest
import torch

import inactive_heads as ih
from inactive_heads.ablation.coerce import parse_ablation
from inactive_heads.cli import main as cli_main

NEGATIVE = "index -1 is negative"

ENTRIES = {
    "zero_heads_hook": lambda tmp: ih.zero_heads_hook([0, -1]),
    "StaticAblation (head)": lambda tmp: ih.StaticAblation([(0, -1)]),
    "StaticAblation (layer)": lambda tmp: ih.StaticAblation([(-1, 0)]),
    "AblationSpec.build": lambda tmp: ih.AblationSpec("static", heads=((1, -1),)).build(),
    "ablation_from_spec": lambda tmp: ih.ablation_from_spec({"kind": "static", "heads": [[1, -1]]}),
    "HeadSet": lambda tmp: ih.HeadSet(heads=((0, -1),), n_layers=2, n_heads=4),
    "savings": lambda tmp: ih.savings("meta-llama/Llama-3.1-8B", [(0, -1)]),
    "export_pruned": lambda tmp: ih.export_pruned("smollm2-135m", [(0, -1)], tmp / "out"),
}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_entry_taking_heads_refuses_a_negative_index(name, tmp_path):
    with pytest.raises(ih.UserError) as err:
        ENTRIES[name](tmp_path)
    message = str(err.value)
    assert NEGATIVE in message and len(message.splitlines()) == 1, message


def test_zero_heads_hook_minus_one_is_not_the_last_head():
    """The reported bug: [-1] zeroed the last head. Now it is refused before any hook runs."""
    with pytest.raises(ih.UserError, match=NEGATIVE):
        ih.zero_heads_hook([-1])
    z = torch.ones(1, 2, 4, 3)
    out = ih.zero_heads_hook([3])(z, None)  # the last head, named by its own index
    assert out[0, :, 3].abs().sum().item() == 0.0 and out[0, :, :3].sum().item() == 18.0


def test_static_text_form_refuses_a_negative_head():
    with pytest.raises(ih.UserError, match=r"bad head '0\.-1'"):
        parse_ablation("static:0.-1")


def test_head_set_file_with_a_negative_head_is_refused(tmp_path):
    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"heads": [[0, -2]], "n_layers": 2, "n_heads": 4}))
    with pytest.raises(ih.UserError, match="index -2 is negative"):
        ih.HeadSet.load(path)


def test_cli_export_refuses_a_head_set_with_a_negative_head(tmp_path, capsys):
    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"heads": [[-1, 0]], "n_layers": 2, "n_heads": 4}))
    code = cli_main(["export", "--model", "smollm2-135m", "--heads", str(path), "--out", str(tmp_path / "o")])
    assert code != 0 and NEGATIVE in capsys.readouterr().err


def test_the_first_and_last_indices_are_accepted():
    assert ih.StaticAblation([(1, 3), (0, 0)]).heads == ((0, 0), (1, 3))
    assert ih.HeadSet(heads=((1, 3), (0, 0)), n_layers=2, n_heads=4).heads == ((0, 0), (1, 3))
