"""The run record (:class:`RunRecord`): its JSON is the text earlier versions wrote, read back and
written again unchanged. The expected text is the fixtures' own files (``tests/fixtures``), written
by the code of formats 1 and 2 before the class existed, and a generation record laid out by hand
as docs/sweeps.md and docs/generation.md describe it."""

import json
import shutil
from pathlib import Path

import pytest

from inactive_heads.core.errors import UserError
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.folder import prepare_folder, read_records, record_path, write_reused_runs
from inactive_heads.sweep.record import RESULTS_FORMAT, RunRecord
from inactive_heads.sweep.results import SweepResults

FIXTURES = Path(__file__).parent.parent / "fixtures"
RUN_FILES = sorted((FIXTURES / "sweep_format_2" / "runs").glob("*.json"))


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.stem)
def test_a_format_2_record_reads_back_and_writes_the_same_text(path):
    text = path.read_text()
    record = RunRecord.from_json(json.loads(text), path)
    assert record.format_version == 2 and record.run_id == path.stem
    assert json.dumps(record.to_json(), indent=1) == text  # byte for byte, keys in their order


def test_a_format_1_record_gains_only_its_version():
    path = FIXTURES / "sweep_format_1" / "runs" / "awft@p=0.3.json"
    original = json.loads(path.read_text())
    record = RunRecord.from_json(original, path)
    assert record.format_version == 1 and record.correct == [True, False, True, True, False, True]
    assert record.to_json() == {"format_version": 1, **original}
    assert list(record.to_json())[1:] == list(original)


def test_a_reused_record_is_the_baseline_under_the_runs_own_name():
    """``ahon_ln@p=0.0`` of the format 2 fixture was written by the code before this class, from
    its baseline; the class writes the same, but for the time and the format it is in now."""
    runs = FIXTURES / "sweep_format_2" / "runs"
    baseline = RunRecord.from_json(json.loads((runs / "baseline.json").read_text()), "baseline")
    written = json.loads((runs / "ahon_ln@p=0.0.json").read_text())
    again = baseline.reused("ahon_ln@p=0.0", "ahon_ln", "AHON (LN)", 0.0, written["threshold"],
                            written["ablation"]).to_json()
    assert list(again) == list(written)  # "reused_from" last, after "finished_at"
    assert again["format_version"] == RESULTS_FORMAT == 3 and again["reused_from"] == "baseline"
    for key in ("format_version", "finished_at"):
        del again[key], written[key]
    assert again == written


GENERATION_RECORD = {
    "format_version": 2, "run_id": "ahon_ln@p=0.2", "model": "m", "task": "gsm8k", "score": "ahon_ln",
    "label": "AHON (LN)", "p": 0.2, "threshold": 0.5, "accuracy": 0.5, "accuracy_percent": 50.0,
    "acc_norm": None, "accuracy_flexible": 1.0, "realized_fraction": 0.25, "realized_percent": 25.0,
    "realized_fraction_per_layer": [0.5, 0.0], "realized_fraction_prompts": None, "decision": "per_step",
    "use_cache": True, "n": 2, "n_forward_sequences": 9, "n_generated_tokens": 7, "correct": [True, False],
    "correct_norm": None, "correct_flexible": [True, True], "loglikelihoods": None, "gold": ["4", "6"],
    "generations": ["2 + 2 = 4", "3 + 3 = 7"], "answers": [{"strict-match": "4"}, {"strict-match": "7"}],
    "doc_ids": [0, 1], "subjects": None, "per_subject": {}, "savings": None, "dtype": "float32",
    "device": "cpu", "backend": "bridge", "batch_size": 8, "torch_threads": 1, "seconds": 1.5,
    "ablation": {"kind": "dynamic", "score": "ahon_ln", "threshold": 0.5, "heads": [], "seed": 0},
    "finished_at": "2026-01-01T00:00:00",
}


def test_a_generation_record_keeps_its_own_keys_and_nulls():
    record = RunRecord.from_json(GENERATION_RECORD, "gsm8k.json")
    assert record.is_generation and record.realized_fraction_prompts is None
    assert json.dumps(record.to_json()) == json.dumps(GENERATION_RECORD)
    plain = RunRecord.from_json({k: v for k, v in GENERATION_RECORD.items() if k != "decision"}, "x.json")
    assert "generations" not in plain.to_json() and "savings" not in plain.to_json()  # a multiple-choice record


def test_unknown_keys_are_kept_and_bad_records_are_one_line():
    record = RunRecord.from_json({**GENERATION_RECORD, "from_a_later_minor": [1]}, "x.json")
    assert record.extra == {"from_a_later_minor": [1]} and list(record.to_json())[-1] == "from_a_later_minor"
    with pytest.raises(UserError, match=r"'x.json' is in results format 4; this inactive-heads reads formats up to 3"):
        RunRecord.from_json({**GENERATION_RECORD, "format_version": 4}, "x.json")
    with pytest.raises(UserError, match=r"'y.json' is not a run record of inactive-heads \(no score and p\)"):
        RunRecord.from_json({"run_id": "baseline"}, "y.json")


def test_a_format_2_folder_still_opens_and_a_resume_upgrades_it(tmp_path):
    folder = Path(shutil.copytree(FIXTURES / "sweep_format_2", tmp_path / "old"))
    results = SweepResults.load(folder)
    assert results.score_info == {} and results.is_complete and len(results.records) == 7
    # runs/awft@p=0.3.json, read by hand: 4 of 6 right
    assert results.records["awft@p=0.3"].correct == [True, False, True, True, False, True]
    assert results.score_label("awft") == "AWFT" and results.score_direction("awft") == "above"  # thresholds.json
    # A resume rewrites sweep.json in format 3 with the scores described; the records there stay
    # as they are (a record is the same in 2 and 3), new ones say 3.
    config = SweepConfig.stored(json.loads((folder / "sweep.json").read_text()))
    prepare_folder(config, folder)
    stored = json.loads((folder / "sweep.json").read_text())
    assert stored["format_version"] == 3 and stored["score_info"]["awft"] == {
        "label": "AWFT", "direction": "above", "reads": ["pattern"]}
    record_path(folder, "awft@p=0.0").unlink()
    write_reused_runs(config, folder, SweepResults.load(folder).thresholds)
    versions = {rid: r.format_version for rid, r in read_records(folder).items()}
    assert versions["awft@p=0.0"] == 3 and versions["baseline"] == 2
    assert SweepResults.load(folder).score_info["awft"].direction == "above"
