"""The HookedTransformer build's memory check: a one-line refusal before any weight is read.

The weight bytes are checked against Llama-3.1-8B's published parameter count (8,030,261,248),
on a checkpoint of that shape whose data is a sparse hole (its safetensors header is all the
check reads); the available memory is monkeypatched, so the check runs without a large machine.
"""

import json
import struct

import pytest
import torch

import inactive_heads as ih
from inactive_heads.models import memory

LLAMA_8B_PARAMS = 8_030_261_248  # the published count of meta-llama/Llama-3.1-8B


def _llama_8b_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)


def _sparse_checkpoint(directory, config):
    """A safetensors checkpoint of ``config``'s model in bfloat16 whose data is never written."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    header, offset = {}, 0
    for name, t in model.state_dict().items():
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + 2 * t.numel()]}
        offset += 2 * t.numel()
    text = json.dumps(header).encode()
    directory.mkdir()
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    config.save_pretrained(directory)
    return directory


def test_an_8b_build_that_does_not_fit_is_refused_with_need_and_free(tmp_path, monkeypatch):
    directory = _sparse_checkpoint(tmp_path / "llama8b", _llama_8b_config())
    monkeypatch.setattr(memory, "available_memory", lambda: 22 * 2**30)
    weights = LLAMA_8B_PARAMS * 2  # bfloat16
    need = memory.HOOKED_BUILD_COPIES * weights / 2**30
    with pytest.raises(ih.UserError) as err:
        memory.check_hooked_memory(directory, "LlamaForCausalLM", torch.bfloat16, "cpu")
    message = str(err.value)
    assert "\n" not in message
    assert f"needs about {need:.1f} GiB ({weights / 2**30:.1f} GiB of weights" in message
    assert "but 22.0 GiB is available" in message and "TransformerLens 4 line" in message


def test_a_build_that_fits_or_runs_on_a_gpu_is_not_refused(tmp_path, monkeypatch):
    directory = _sparse_checkpoint(tmp_path / "llama8b", _llama_8b_config())
    weights = LLAMA_8B_PARAMS * 4  # float32
    monkeypatch.setattr(memory, "available_memory", lambda: int(memory.HOOKED_BUILD_COPIES * weights) + 1)
    memory.check_hooked_memory(directory, "LlamaForCausalLM", torch.float32, "cpu")
    monkeypatch.setattr(memory, "available_memory", lambda: int(memory.HOOKED_BUILD_COPIES * weights) - 1)
    with pytest.raises(ih.UserError, match="needs about"):
        memory.check_hooked_memory(directory, "LlamaForCausalLM", torch.float32, "cpu")
    memory.check_hooked_memory(directory, "LlamaForCausalLM", torch.float32, "cuda")  # host memory is not the limit


@pytest.mark.hooked
def test_load_model_refuses_before_reading_a_weight(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from tiny import save_tiny_family, _word_tokenizer, TINY_VOCAB

    directory = save_tiny_family("llama-3.2", tmp_path / "model", _word_tokenizer(tmp_path / "tok", TINY_VOCAB))
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)

    def no_read(*args, **kwargs):
        raise AssertionError("weights were read before the memory check")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_read)
    with pytest.raises(ih.ModelLoadError, match=r"HookedTransformer of LlamaForCausalLM .* but 0\.0 GiB is available"):
        ih.load_model(str(directory), backend="hooked", dtype="float32")
