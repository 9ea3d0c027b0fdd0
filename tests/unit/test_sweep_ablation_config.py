"""``SweepConfig.ablations``: fixed ablations of any registered kind beside a sweep's curves.

No model here: the checks ``validate`` makes (one line each), the run ids, the identity a resume
compares (an older folder without the option, ``tests/fixtures/sweep_format_1``, still resumes;
a changed list is another sweep), and the command line's ``--ablation``. The runs themselves:
tests/integration/test_sweep_ablations.py (local) and test_distributed.py (Ray).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

import inactive_heads as ih
from inactive_heads.cli import build_parser
from inactive_heads.cli.sweeps import sweep_config as _sweep_config
from inactive_heads.core.errors import UserError
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.folder import check_folder

FORMAT_1 = Path(__file__).parent.parent / "fixtures" / "sweep_format_1"
STATIC_SPEC = {"kind": "static", "score": None, "threshold": None, "heads": [[0, 1], [2, 3]], "seed": 0}


class EveryHeadOf(ih.HeadAblation):
    def __init__(self, layer):
        super().__init__()
        self.layer = int(layer)

    def params(self):
        return {"layer": self.layer}

    def decide(self, acts):
        return torch.full((acts.z.shape[0], acts.n_heads), acts.layer == self.layer, device=acts.z.device)


@pytest.fixture(autouse=True)
def every_head_of():
    ih.register_ablation("unit_every_head_of")(EveryHeadOf)
    yield "unit_every_head_of"
    ih.unregister_ablation("unit_every_head_of")


def config(**overrides):
    base = dict(model="smollm2-135m", task="piqa", limit=6, scores=["ahon_ln"], quantiles=[0.0, 0.3])
    base.update(overrides)
    return SweepConfig(**base)


def test_each_ablation_is_stored_as_its_spec_and_runs_once_without_p(every_head_of):
    c = config(ablations=[{"kind": every_head_of, "layer": 2}, "static:0.1/2.3"]).validate()
    assert c.ablations == [{"kind": every_head_of, "layer": 2}, STATIC_SPEC]
    custom = [(rid, key, q) for rid, key, q in c.run_ids() if q is None and key is not None]
    assert [key for _, key, _ in custom] == [rid for rid, _, _ in custom]  # the run id is the key
    assert [rid.split("@")[0] for rid, _, _ in custom] == [every_head_of, "static"]
    assert len(c.run_ids()) == 1 + 2 * 2 + 2  # baseline, ahon_ln and random at two p, two fixed ablations
    # the spec, not its spelling, decides the id: the same heads as a dict give the same run
    same = config(ablations=[{"kind": "static", "heads": [[0, 1], [2, 3]]}]).validate()
    assert list(same.ablation_runs()) == [custom[1][0]]
    other = config(ablations=[{"kind": every_head_of, "layer": 1}]).validate()
    assert list(other.ablation_runs()) != [custom[0][0]]


@pytest.mark.parametrize("ablations, message", [
    ([{"kind": "no_such_kind"}], r"unknown ablation kind 'no_such_kind'; registered: static, dynamic, random, predicted, "),
    ([3], r"each of ablations is a spec dict \(\{'kind': ...\}\) or ablation text, got 3"),
    ({"kind": "static"}, r"ablations must be a list of ablation specs"),
    (["none"], r"ablation 'none' zeroes nothing"),
    ([{"kind": "static", "heads": [[0, 1]]}, "static:0.1"], r"is listed twice; list each ablation once"),
    ([{"kind": "unit_every_head_of", "layers": 2}], r"unit_every_head_of"),
])
def test_bad_ablations_are_one_line(ablations, message):
    bad = config()
    bad.ablations = ablations  # as JSON data may say (a sweep.json, a config file)
    with pytest.raises(UserError, match=message) as err:
        bad.validate()
    assert "\n" not in str(err.value)


def test_a_kind_from_a_module_that_is_missing_is_one_line():
    with pytest.raises(UserError, match=r"cannot import module 'no_such_lab_module_xyz' \(sweep imports\)"):
        config(imports=["no_such_lab_module_xyz"], ablations=[{"kind": "lab_kind"}]).validate()
    with pytest.raises(UserError, match=r"unknown ablation kind 'lab_kind'"):  # the import forgotten
        config(ablations=[{"kind": "lab_kind"}]).validate()


def test_a_sweep_with_only_fixed_ablations_is_a_sweep():
    c = config(scores=[], include_random=False, ablations=["static:0.1"]).validate()
    assert [key for _, key, _ in c.run_ids()] == [None, c.ablations and next(iter(c.ablation_runs()))]
    with pytest.raises(UserError, match="no score functions"):
        config(scores=[], include_random=False).validate()


def test_an_older_folder_without_the_option_resumes_and_a_changed_list_is_another_sweep(tmp_path):
    folder = Path(shutil.copytree(FORMAT_1, tmp_path / "old"))
    stored = json.loads((folder / "sweep.json").read_text())
    plain = SweepConfig.from_dict(stored).validate()
    assert set(plain.to_dict()) == set(stored)  # no ablations: sweep.json keeps its keys
    check_folder(plain, folder)  # the same sweep: no error
    with pytest.raises(UserError, match=r"holds a different sweep \(differs in ablations\)"):
        check_folder(SweepConfig.from_dict({**stored, "ablations": ["static:0.1"]}).validate(), folder)
    # and a folder with ablations compares them
    with_ablation = SweepConfig.from_dict({**stored, "ablations": ["static:0.1"]}).validate()
    (folder / "sweep.json").write_text(json.dumps(with_ablation.to_dict()))
    check_folder(SweepConfig.from_dict({**stored, "ablations": [{"kind": "static", "heads": [[0, 1]]}]}).validate(),
                 folder)
    with pytest.raises(UserError, match=r"differs in ablations"):
        check_folder(plain, folder)


def test_the_command_line_reads_repeated_ablations(every_head_of):
    args = build_parser().parse_args([
        "sweep", "--model", "smollm2-135m", "--task", "piqa", "--limit", "6", "--scores", "ahon_ln", "--out", "x",
        "--ablation", json.dumps({"kind": every_head_of, "layer": 1}), "--ablation", "static:0.1/2.3",
        "--ablation", every_head_of.join(['{"kind": "', '", "layer": 0}'])])
    assert _sweep_config(args).ablations == [{"kind": every_head_of, "layer": 1}, STATIC_SPEC,
                                             {"kind": every_head_of, "layer": 0}]
    args = build_parser().parse_args(["sweep", "--task", "piqa", "--out", "x", "--ablation", "not a spec"])
    with pytest.raises(UserError, match="cannot read ablation 'not a spec'"):
        _sweep_config(args)


def test_the_question_window_and_saved_flags_are_new_options_an_older_folder_lacks(tmp_path):
    """questions_from and save_flags: absent from an older sweep.json, which resumes; set, they are
    written and compared (another window is another sweep)."""
    folder = Path(shutil.copytree(FORMAT_1, tmp_path / "old"))
    stored = json.loads((folder / "sweep.json").read_text())
    assert "questions_from" not in stored and "save_flags" not in stored
    check_folder(SweepConfig.from_dict(stored).validate(), folder)
    limit = stored["limit"]
    windowed = SweepConfig.from_dict({**stored, "questions_from": limit - 1, "save_flags": True}).validate()
    assert {"questions_from": limit - 1, "save_flags": True}.items() <= windowed.to_dict().items()
    with pytest.raises(UserError, match=r"differs in questions_from, save_flags\)"):
        check_folder(windowed, folder)
    (folder / "sweep.json").write_text(json.dumps(windowed.to_dict()))
    check_folder(SweepConfig.from_dict({**stored, "questions_from": limit - 1, "save_flags": True}).validate(), folder)
    with pytest.raises(UserError, match=r"differs in questions_from\)"):
        check_folder(SweepConfig.from_dict({**stored, "questions_from": 0, "save_flags": True}).validate(), folder)


@pytest.mark.parametrize("options, message", [
    ({"questions_from": -1}, "questions_from must be a question index >= 0, got -1"),
    ({"questions_from": 6}, "needs limit > 6, got limit=6"),
    ({"questions_from": 2, "limit": None}, "needs limit > 2, got limit=None"),
    ({"save_flags": True, "reuse_prefix": True}, "drop save_flags or reuse_prefix"),
    ({"save_flags": True, "task": "gsm8k", "scores": ["ahon_ln"]}, "generation has only with decision 'prompt'"),
])
def test_bad_window_or_flags_options_are_one_line(options, message):
    with pytest.raises(UserError) as err:
        config(**options).validate()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_saved_flags_must_be_a_boolean():
    c = config()
    c.save_flags = 1  # as a hand-written sweep.json could say
    with pytest.raises(UserError, match="save_flags must be true or false, got 1"):
        c.validate()


def test_saved_flags_on_ray_are_refused_before_ray_starts(tmp_path):
    with pytest.raises(UserError, match=r"save_flags \(each input's zeroed heads\) runs on the local executor only"):
        ih.run_sweep(config(save_flags=True), tmp_path / "out", executor="ray")
    assert not (tmp_path / "out").exists()
