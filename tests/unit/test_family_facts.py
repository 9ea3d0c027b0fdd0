"""The per-family facts table (inactive_heads/models/architectures.py) against transformers itself:
each family's class and model type pair up as transformers maps them, and the attention
projections and QK norms the table claims are the modules a tiny random model of the family has."""

import pytest
import torch

from inactive_heads.models import architectures
from inactive_heads.pruning import modeling_pruned_heads

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

# Families whose attention has separate q_proj / k_proj / v_proj / o_proj (or out_proj, dense).
_SEPARATE_PROJECTIONS = ("llama", "qwen2", "mistral", "olmo2", "gemma2", "gemma3_text", "olmo3", "olmoe", "opt",
                         "phi")


def _tiny(model_type: str, **overrides):
    sizes = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=8, num_hidden_layers=1,
                 intermediate_size=32, ffn_dim=32, vocab_size=64, num_experts=2, num_experts_per_tok=1,
                 max_position_embeddings=64)
    config = AutoConfig.for_model(model_type, **{**sizes, **overrides})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _attention(model):
    layer = model.model.decoder.layers[0] if hasattr(model.model, "decoder") else model.model.layers[0]
    return layer.self_attn


@pytest.mark.parametrize("facts", architectures.ARCHITECTURES, ids=lambda a: a.model_type)
def test_each_class_is_the_causal_lm_of_its_model_type(facts):
    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[facts.model_type] == facts.hf_class
    assert architectures.by_class(facts.hf_class) is architectures.by_model_type(facts.model_type) is facts


@pytest.mark.parametrize("model_type", _SEPARATE_PROJECTIONS)
@pytest.mark.parametrize("attention_bias", [False, True])
def test_biases_and_qk_norm_are_those_of_a_tiny_model(model_type, attention_bias):
    overrides = {"attention_bias": attention_bias}
    if model_type == "opt":
        overrides = {"enable_bias": True}  # OPT's own switch; it has no attention_bias
    attn = _attention(_tiny(model_type, **overrides))
    facts = architectures.by_model_type(model_type)
    out = getattr(attn, "o_proj", None) or getattr(attn, "out_proj", None) or attn.dense
    qkv, o = architectures.projection_biases(model_type, attention_bias)
    if model_type in ("opt", "phi"):  # biased whatever attention_bias says: the table marks their v bias
        qkv = o = True
    assert (attn.q_proj.bias is not None, out.bias is not None) == (qkv, o)
    assert (attn.v_proj.bias is not None) == (facts.value_bias or (qkv and attention_bias))
    whole_vector_norm = getattr(getattr(attn, "q_norm", None), "weight", torch.zeros(0)).numel() == 2 * 8
    assert whole_vector_norm == facts.qk_norm  # OLMo's; Gemma-3's q_norm is per head (8 weights)


def test_the_exported_modeling_file_has_the_tables_biases():
    # modeling_pruned_heads.py is copied into checkpoints and cannot import the table; its own
    # copy of the bias facts must agree with it for every family it builds.
    for name in architectures.classes_with("pruned_class"):
        model_type = architectures.by_class(name).model_type
        for attention_bias in (False, True):
            config = AutoConfig.for_model(model_type, attention_bias=attention_bias)
            assert modeling_pruned_heads._projection_biases(config) == architectures.projection_biases(
                model_type, attention_bias)
