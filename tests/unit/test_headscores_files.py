"""HeadScores files: safetensors + JSON metadata; old scores.pt still load; nothing is ever unpickled."""

import json
import pickle

import pytest
import torch
from safetensors import safe_open
from synthetic_sweep import synthetic_head_scores

from inactive_heads.scoring.recording import HeadScores


def test_save_writes_safetensors_that_round_trip(tmp_path):
    hs = synthetic_head_scores()
    hs.metadata.update({"lengths": [3, 5, 7], "seconds": 0.25, "nested": {"a": [1.5, None]}})
    path = hs.save(tmp_path / "scores.safetensors")
    with safe_open(str(path), framework="pt") as f:  # read by the safetensors library itself
        assert sorted(f.keys()) == sorted(hs.keys())
        assert json.loads(f.metadata()["metadata"]) == hs.metadata
        assert torch.equal(f.get_tensor("awft"), hs["awft"])
    back = HeadScores.load(path)
    assert back.metadata == hs.metadata
    assert back.keys() == ["ahon_ln", "awft", "aeqd"]  # the recorded order, not sorted
    for key in hs.keys():
        assert back[key].dtype == torch.float32 and torch.equal(back[key], hs[key])


def test_old_pt_files_still_load(tmp_path):
    hs = synthetic_head_scores()
    # the layout earlier versions wrote with torch.save
    torch.save({"format": 1, "scores": hs.scores, "metadata": json.dumps(hs.metadata)}, tmp_path / "scores.pt")
    back = HeadScores.load(tmp_path / "scores.pt")
    assert back.metadata == hs.metadata
    assert all(torch.equal(back[k], hs[k]) for k in hs.keys())


class _Payload:
    """Unpickling this object would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_unpickles_code(tmp_path):
    marker = tmp_path / "PWNED"
    evil_pt = tmp_path / "evil.pt"
    torch.save({"format": 1, "scores": {}, "metadata": _Payload(marker)}, evil_pt)  # a zip, like a real .pt
    with pytest.raises(ValueError, match="refusing to load"):
        HeadScores.load(evil_pt)
    evil_pickle = tmp_path / "evil.pkl"
    evil_pickle.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ValueError, match="is not a HeadScores file"):
        HeadScores.load(evil_pickle)
    assert not marker.exists()
    # the payload is live: plain pickle would have run it
    pickle.loads(evil_pickle.read_bytes()).close()
    assert marker.exists()


def test_other_safetensors_are_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not HeadScores"):
        HeadScores.load(tmp_path / "model.safetensors")


def test_concat_keeps_sequence_order():
    hs = synthetic_head_scores(n_sequences=5)
    parts = [hs.subset([0, 1]), hs.subset([2]), hs.subset([3, 4])]
    joined = HeadScores.concat(parts)
    assert all(torch.equal(joined[k], hs[k]) for k in hs.keys())
    with pytest.raises(ValueError, match="cannot concatenate"):
        HeadScores.concat([hs, synthetic_head_scores(keys=("awft",))])
