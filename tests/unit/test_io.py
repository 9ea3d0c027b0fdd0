"""The one atomic writer: whole files only, and the permissions an ordinary open() would give."""

import json
import os
import stat

import pytest
import torch
from synthetic_sweep import synthetic_head_scores, write_synthetic_sweep

from inactive_heads.core.io import atomic_path, current_umask, write_json_atomic, write_text_atomic
from inactive_heads.reporting.report import write_report


@pytest.fixture
def umask():
    """Set a umask for the test and restore the previous one afterwards."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(saved)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def plain_open_mode(tmp_path) -> int:
    """What ``open(path, "w")`` gives under the current umask: the independent reference."""
    ref = tmp_path / "reference.txt"
    with open(ref, "w") as f:
        f.write("x")
    m = mode(ref)
    ref.unlink()
    return m


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_written_files_honour_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    assert current_umask() == mask
    assert plain_open_mode(tmp_path) == expected
    assert mode(write_json_atomic(tmp_path / "a.json", {"x": 1})) == expected
    assert mode(write_text_atomic(tmp_path / "b.txt", "hello")) == expected
    assert mode(synthetic_head_scores().save(tmp_path / "scores.pt")) == expected
    sweep = write_synthetic_sweep(tmp_path / "sweep")
    assert mode(write_report(sweep)) == expected


def test_json_round_trips_and_replaces(tmp_path):
    target = tmp_path / "sub" / "r.json"
    write_json_atomic(target, {"a": [1, 2]})
    write_json_atomic(target, {"b": 0.1})
    assert json.loads(target.read_text()) == {"b": 0.1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    with pytest.raises(TypeError):  # not JSON-serializable: nothing written
        write_json_atomic(tmp_path / "bad.json", {"t": torch.zeros(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
