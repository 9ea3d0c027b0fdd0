"""Safetensors checkpoints read and written one tensor at a time (the streaming export's files).

References come from the safetensors library itself: files it wrote are read here, and files
written here are read back by it and by ``transformers``' sharded loading.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from inactive_heads.core.errors import UserError
from inactive_heads.core.tensor_files import INDEX_FILE, CheckpointReader, write_checkpoint


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(5, 7, generator=gen).to(torch.bfloat16),
        "b.weight": torch.randn(3, generator=gen),
        "c.bias": torch.randn(4, 2, generator=gen).to(torch.float16),
        "d.index": torch.arange(6, dtype=torch.int64),
        "e.empty": torch.zeros(0, 3),
    }


def test_reader_returns_what_safetensors_wrote(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    reader = CheckpointReader(tmp_path)
    assert set(reader.names()) == set(tensors)
    for name, t in tensors.items():
        got = reader.get(name)
        assert got.dtype == t.dtype and torch.equal(got, t), name
        assert reader.meta(name).shape == t.shape


def test_written_shards_read_back_by_safetensors(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    out = tmp_path / "out"
    out.mkdir()

    def transform(name, t):  # drop one, rename one, slice one, cast one
        if name == "b.weight":
            return []
        if name == "c.bias":
            return [("c.renamed", t[1:3].clone())]
        if name == "a.weight":
            return [(name, t.to(torch.float32))]
        return [(name, t)]

    files = write_checkpoint(CheckpointReader(tmp_path), transform, out, shard_bytes=64)
    assert len(files) > 1  # 140 + 16 + 48 bytes of data over 64-byte shards
    index = json.loads((out / INDEX_FILE).read_text())
    got = {}
    for file in files:
        got.update(load_file(out / file))
    assert set(index["weight_map"]) == set(got) == {"a.weight", "c.renamed", "d.index", "e.empty"}
    assert torch.equal(got["a.weight"], tensors["a.weight"].float()) and got["a.weight"].dtype == torch.float32
    assert torch.equal(got["c.renamed"], tensors["c.bias"][1:3])
    assert torch.equal(got["d.index"], tensors["d.index"])
    assert got["e.empty"].shape == (0, 3)
    assert index["metadata"]["total_size"] == 5 * 7 * 4 + 2 * 2 * 2 + 6 * 8


def test_unchanged_tensors_are_copied_in_chunks_never_read_whole(tmp_path, monkeypatch):
    """A tensor the transform returns as it came (renamed or not) is copied byte for byte through
    a small buffer; reading it whole (what made an 8B export peak a 1 GiB embedding above the
    model) fails this test."""
    from inactive_heads.core import tensor_files

    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(tensor_files, "COPY_BYTES", 6)  # a.weight's 70 bytes take 12 chunks, the last short
    read = []
    real_get = CheckpointReader.get
    monkeypatch.setattr(CheckpointReader, "get", lambda self, name: read.append(name) or real_get(self, name))

    def transform(name, t):
        if name == "a.weight":
            return [("a.renamed", t)]  # unchanged, renamed
        if name == "c.bias":
            return [(name, t * 2)]  # changed: read whole
        return [(name, t)]

    write_checkpoint(CheckpointReader(tmp_path), transform, out)
    got = load_file(out / "model.safetensors")
    assert read == ["c.bias"]
    assert set(got) == {"a.renamed", "b.weight", "c.bias", "d.index", "e.empty"}
    assert torch.equal(got["a.renamed"], tensors["a.weight"]) and got["a.renamed"].dtype == torch.bfloat16
    assert torch.equal(got["b.weight"], tensors["b.weight"]) and torch.equal(got["d.index"], tensors["d.index"])
    assert torch.equal(got["c.bias"], tensors["c.bias"] * 2)
    assert got["e.empty"].shape == (0, 3)


def test_a_folder_without_safetensors_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="holds no model.safetensors"):
        CheckpointReader(tmp_path)


def test_a_sharded_export_loads_in_transformers_like_a_single_file(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import inactive_heads as ih
    from inactive_heads.core import tensor_files
    from tiny import save_tiny_family

    tokenizer = _word_tokenizer(tmp_path / "tok")
    src = save_tiny_family("qwen2.5-untied", tmp_path / "model", tokenizer)
    heads = [(0, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (2, 3)]  # layer 2 loses every head
    whole = ih.export_pruned(str(src), heads, tmp_path / "whole")
    monkeypatch.setattr(tensor_files, "SHARD_BYTES", 20_000)
    sharded = ih.export_pruned(str(src), heads, tmp_path / "sharded")
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 2 and not (sharded / "model.safetensors").exists()
    tokens = torch.tensor([[5, 9, 2, 7, 11]])
    a = AutoModelForCausalLM.from_pretrained(whole, trust_remote_code=True)(tokens).logits
    b = AutoModelForCausalLM.from_pretrained(sharded, trust_remote_code=True)(tokens).logits
    assert torch.equal(a, b)


def _word_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tiny import TINY_VOCAB

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(TINY_VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w1", bos_token="w2",
                                   eos_token="w3")
