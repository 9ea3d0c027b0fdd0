"""Results folders are a versioned format that opens anywhere.

``tests/fixtures/sweep_format_1`` is a real sweep folder written by the code before folders
carried a format version (a tiny random Llama with SmolLM2's tokenizer, PIQA, 6 questions, AHON (LN),
AWFT and Random at p = 0 and 0.3); the expected numbers below are read from its JSON files by
hand, not recomputed.
"""

import json
import shutil
from pathlib import Path

import pytest

from inactive_heads.core.errors import UserError
from inactive_heads.reporting.report import format_table, write_report
from inactive_heads.sweep.config import SweepConfig
from inactive_heads.sweep.folder import RESULTS_FORMAT, prepare_folder
from inactive_heads.sweep.results import SweepResults, load_results

FORMAT_1 = Path(__file__).parent.parent / "fixtures" / "sweep_format_1"


@pytest.fixture
def old_folder(tmp_path):
    return Path(shutil.copytree(FORMAT_1, tmp_path / "old"))


def test_a_folder_of_format_1_still_opens(old_folder):
    results = SweepResults.load(old_folder)
    assert results.config.task == "piqa" and results.config.limit == 6
    assert sorted(results.records) == ["ahon_ln@p=0.0", "ahon_ln@p=0.3", "awft@p=0.0", "awft@p=0.3", "baseline",
                                       "random@p=0.0", "random@p=0.3"]
    assert results.is_complete
    # runs/awft@p=0.3.json: 4 of 6 right, a third of the heads zeroed
    awft = results.records["awft@p=0.3"]
    assert awft.correct == [True, False, True, True, False, True]
    assert awft.realized_percent == pytest.approx(100 / 3)
    assert len(load_results(old_folder)) == 7
    assert "AWFT" in format_table(results)
    assert write_report(old_folder).is_file()


def test_reading_a_folder_needs_neither_the_users_modules_nor_their_scores(old_folder):
    # The sweep was run with a user's score module that registered "my_score"; this machine has
    # neither the module nor the score. Reading, the table and the report still work.
    config = json.loads((old_folder / "sweep.json").read_text())
    config.update(imports=["my_lab_scores_not_installed_here"], scores=["ahon_ln", "my_score"])
    (old_folder / "sweep.json").write_text(json.dumps(config))
    for path in sorted((old_folder / "runs").glob("awft@*.json")):
        record = json.loads(path.read_text())
        record.update(score="my_score", label="my_score", run_id=record["run_id"].replace("awft", "my_score"))
        path.with_name(path.name.replace("awft", "my_score")).write_text(json.dumps(record))
        path.unlink()
    with pytest.raises(UserError, match="cannot import module 'my_lab_scores_not_installed_here'"):
        SweepConfig.from_dict(config).validate()  # running it here would need the module
    results = SweepResults.load(old_folder)
    assert results.config.imports == ["my_lab_scores_not_installed_here"]
    assert "my_score" in results.score_keys and results.is_complete
    assert "my_score" in format_table(results)
    assert write_report(old_folder).is_file()


def test_new_folders_and_records_carry_the_format_and_a_newer_one_is_one_line(old_folder, tmp_path):
    config = SweepResults.load(old_folder).config
    new = tmp_path / "new"
    new.mkdir()
    prepare_folder(config, new)
    assert json.loads((new / "sweep.json").read_text())["format_version"] == RESULTS_FORMAT == 3
    stored = json.loads((new / "sweep.json").read_text())
    stored["format_version"] = 99
    (new / "sweep.json").write_text(json.dumps(stored))
    with pytest.raises(UserError, match=r"results format 99; this inactive-heads reads formats up to 3: "
                                        r"upgrade inactive-heads"):
        SweepResults.load(new)
    record = json.loads((old_folder / "runs" / "baseline.json").read_text())
    record["format_version"] = 4
    (old_folder / "runs" / "baseline.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"baseline.json' is in results format 4"):
        SweepResults.load(old_folder)
