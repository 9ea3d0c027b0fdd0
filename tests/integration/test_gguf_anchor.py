"""The converted SmolLM2 directory holds the GGUF file's own weights and rope base: tensors
dequantized here by the ``gguf`` package (llama.cpp's reference Python dequantizers), read straight
from ``model.safetensors`` with the ``safetensors`` package; transformers' GGUF loader is not
involved."""

import json

import numpy as np
import pytest
from safetensors import safe_open

from inactive_heads.models import gguf as ih_gguf
from inactive_heads.models.loading import BUILTIN_MODELS, resolve_model_dir

gguf = pytest.importorskip("gguf")

# GGUF names -> HF names of tensors the conversion copies without permuting them (Q/K rows are
# permuted for rotary embeddings, so they are left out here).
PAIRS = {
    "token_embd.weight": "model.embed_tokens.weight",          # Q8_0
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",  # F32
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",     # Q4_1
    "blk.29.attn_v.weight": "model.layers.29.self_attn.v_proj.weight",  # Q4_1
    "output_norm.weight": "model.norm.weight",                  # F32
}


def test_converted_weights_equal_the_gguf_tensors_dequantized_by_the_gguf_package():
    model = BUILTIN_MODELS["smollm2-135m"]
    resolve_model_dir("smollm2-135m", progress=False)  # converts once if the cache is empty
    (part,) = ih_gguf.gguf_part_paths(model)
    reader = gguf.GGUFReader(str(part))
    tensors = {t.name: t for t in reader.tensors}
    converted = safe_open(str(ih_gguf.converted_dir(model) / "model.safetensors"), framework="numpy")
    rows = 512  # the first rows of each matrix keep the test cheap; every block type is covered
    for gguf_name, hf_name in PAIRS.items():
        t = tensors[gguf_name]
        # GGUF shapes list the fastest axis first; the array comes out as [rows, columns].
        n = min(rows, int(t.shape[-1]))
        expected = gguf.quants.dequantize(t.data[:n], t.tensor_type)
        expected = expected.reshape(-1) if len(t.shape) == 1 else expected.reshape(-1, int(t.shape[0]))
        got = converted.get_slice(hf_name)[:n]
        assert got.shape == expected.shape, hf_name
        np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=0, atol=1e-6,
                                   err_msg=hf_name)
    # The file is what the package pins: 30 blocks, SmolLM2's 49,152-token vocabulary.
    assert int(reader.fields["llama.block_count"].parts[-1][0]) == 30
    assert tensors["token_embd.weight"].shape.tolist() == [576, 49152]


def test_smollm2_conversion_carries_rope_theta_for_transformers_4():
    """SmolLM2's rope base read the transformers-4 way equals the GGUF's own metadata (100 000)."""
    directory, _ = resolve_model_dir("smollm2-135m", progress=False)
    config = json.loads((directory / "config.json").read_text())
    (part,) = ih_gguf.gguf_part_paths(BUILTIN_MODELS["smollm2-135m"])
    field = gguf.GGUFReader(str(part)).fields["llama.rope.freq_base"]
    freq_base = float(field.parts[field.data[0]][0])
    assert freq_base == 100000.0  # the published SmolLM2-135M config says rope_theta 100000
    assert config["rope_theta"] == freq_base
    assert config.get("rope_scaling") is None
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
