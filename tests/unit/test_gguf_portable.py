"""Converted directories are readable by transformers-4 tools too, and old caches are upgraded.

(The converted SmolLM2 itself is checked in ``tests/integration/test_gguf_anchor.py``.)

transformers 5 writes the rotary base only inside ``rope_parameters``; a transformers-4 reader
(lm-eval on transformers 4, vLLM, …) looks for ``rope_theta`` and silently uses 10 000 without it.
"""

import json

import pytest

from inactive_heads.models import gguf

# Transformers-4 semantics of the rope keys, written out by hand: the layouts below are the ones
# transformers 5 saves for Llama-3.x, SmolLM2 and Gemma-3.
CASES = [
    (
        {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}},
        {"rope_theta": 100000.0, "rope_scaling": None},
    ),
    (
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}},
        {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    ),
    (
        {"rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                             "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}},
        {"rope_theta": 1000000.0, "rope_scaling": None, "rope_local_base_freq": 10000.0},
    ),
    ({"rope_theta": 10000.0}, {}),  # already a transformers-4 config: nothing to add
]


@pytest.mark.parametrize("config, expected", CASES)
def test_classic_rope_keys(config, expected):
    assert gguf.classic_rope_keys(config) == expected


def _old_layout_dir(tmp_path):
    """A directory as the previous converter wrote it: rope only in rope_parameters, no format."""
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(
        {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    ))
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "CONVERTED.json").write_text(json.dumps({"alias": "x", "hf_name": "org/x"}))
    return d


def test_old_cache_is_upgraded_in_place_once(tmp_path):
    d = _old_layout_dir(tmp_path)
    weights_mtime = (d / "model.safetensors").stat().st_mtime_ns
    gguf.upgrade_converted(d)
    config = json.loads((d / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["rope_scaling"] is None
    assert config["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}  # kept
    assert json.loads((d / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    meta = json.loads((d / "CONVERTED.json").read_text())
    assert meta == {"alias": "x", "hf_name": "org/x", "format": gguf.CONVERTED_FORMAT}
    assert (d / "model.safetensors").stat().st_mtime_ns == weights_mtime
    # Once upgraded, a later load reads and writes nothing.
    (d / "config.json").write_text("not json: proves the file is not read again")
    gguf.upgrade_converted(d)
