"""What the toolkit knows about each model family: one table, read by every place that asks.

A family is one Hugging Face causal-LM class (``config.architectures[0]``, which TransformerLens
also keeps as ``cfg.original_architecture``) and its ``config.model_type``. :data:`ARCHITECTURES`
lists the families the toolkit has facts about; a family not listed has none of the features
below (every flag False, biases as its config says). Which backend builds it
(:func:`~inactive_heads.models.loading.hooked_support`), whether the fast attention forward runs
it, whether prefix reuse can run a bridge of it layer by layer, whether a bridge's logits can be
taken at chosen positions, whether it can be exported, and how its attention projections count,
all come from here.

``pruning/modeling_pruned_heads.py`` is the one exception: it is copied into exported checkpoints
and imports nothing from the toolkit, so it keeps its own copy of the q/k/v and o bias facts of
the families it builds; a unit test checks that copy against this table.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Architecture:
    """The facts of one family (see the module docstring for who reads which)."""

    hf_class: str  # the causal-LM class: config.architectures[0], TransformerLens's original_architecture
    model_type: str  # config.model_type
    # Attention projections. None: as the config's attention_bias says.
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    value_bias: bool = False  # the attention has value biases (folding them into b_O changes hook_v/hook_z)
    # A norm on the whole projected query and key vectors (OLMo's; not Gemma-3's per-head one),
    # outside TransformerLens's q/k/v computation.
    qk_norm: bool = False
    # TransformerLens 3.9's HookedTransformer: builds the family with logits equal to Hugging Face's
    # (checked per family in tests/integration/test_families.py), unless a feature below is present.
    hooked: bool = False
    hooked_rope_types: tuple[str, ...] = ("default",)  # rotary scalings it implements (others ignored)
    hooked_partial_rotary: bool = False  # it honours partial_rotary_factor
    hooked_any_head_dim: bool = False  # it allows head_dim != hidden_size / heads
    hooked_drops_biases: bool = False  # it drops attention_bias / mlp_bias
    hooked_ignores_sliding: bool = False  # it ignores sliding-window layers
    # The causal-LM head is one linear map (then Gemma's soft cap) of the base model's last hidden
    # state: a bridge's logits can be taken at chosen positions only.
    head_is_one_linear: bool = False
    # The Hugging Face base model is embed -> layers (one rotary table, causal mask) -> final norm:
    # prefix reuse can run a bridge of it layer by layer (runtime/layer_stack.py).
    plain_decoder: bool = False
    # One q/k/v/o_proj per layer with heads as contiguous d_head slices: zeroing W_O columns is
    # exactly zeroing a head (export --mode zeroed).
    zeroable: bool = False
    pruned_class: str | None = None  # its class in modeling_pruned_heads.py (export --mode pruned)


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("LlamaForCausalLM", "llama", hooked=True, hooked_rope_types=("default", "llama3"),
                 hooked_drops_biases=True, hooked_ignores_sliding=True, head_is_one_linear=True,
                 plain_decoder=True, zeroable=True, pruned_class="PrunedLlamaForCausalLM"),
    Architecture("Qwen2ForCausalLM", "qwen2", qkv_bias=True, o_bias=False, value_bias=True, hooked=True,
                 hooked_ignores_sliding=True, head_is_one_linear=True, plain_decoder=True, zeroable=True,
                 pruned_class="PrunedQwen2ForCausalLM"),
    Architecture("MistralForCausalLM", "mistral", qkv_bias=False, o_bias=False, hooked=True, hooked_any_head_dim=True, hooked_drops_biases=True,
                 head_is_one_linear=True, plain_decoder=True, zeroable=True),
    Architecture("Olmo2ForCausalLM", "olmo2", qk_norm=True, head_is_one_linear=True, zeroable=True),
    Architecture("Gemma2ForCausalLM", "gemma2", head_is_one_linear=True, zeroable=True),
    Architecture("Gemma3ForCausalLM", "gemma3_text", head_is_one_linear=True, zeroable=True),
    Architecture("Phi3ForCausalLM", "phi3", hooked=True, hooked_drops_biases=True, head_is_one_linear=True,
                 zeroable=True),
    Architecture("GPTNeoXForCausalLM", "gpt_neox", value_bias=True, hooked=True, hooked_partial_rotary=True,
                 head_is_one_linear=True),
    Architecture("GPT2LMHeadModel", "gpt2", value_bias=True, head_is_one_linear=True),
    Architecture("OPTForCausalLM", "opt", value_bias=True),
    Architecture("PhiForCausalLM", "phi", value_bias=True),
    Architecture("BloomForCausalLM", "bloom", value_bias=True),
    Architecture("OlmoeForCausalLM", "olmoe", qk_norm=True),
    Architecture("Olmo3ForCausalLM", "olmo3", qk_norm=True),
)

_BY_CLASS = {a.hf_class: a for a in ARCHITECTURES}
_BY_MODEL_TYPE = {a.model_type: a for a in ARCHITECTURES}
_UNKNOWN = Architecture("", "")


def by_class(hf_class: str | None) -> Architecture:
    """The facts of a causal-LM class name; a class not in the table has none (every flag False).

    >>> by_class("Qwen2ForCausalLM").qkv_bias, by_class("SomeNewForCausalLM").plain_decoder
    (True, False)
    """
    return _BY_CLASS.get(hf_class or "", _UNKNOWN)


def by_model_type(model_type: str | None) -> Architecture:
    """The facts of a ``config.model_type``; one not in the table has none (every flag False)."""
    return _BY_MODEL_TYPE.get(model_type or "", _UNKNOWN)


def classes_with(flag: str) -> tuple[str, ...]:
    """The class names whose ``flag`` is set, in table order.

    >>> classes_with("pruned_class")
    ('LlamaForCausalLM', 'Qwen2ForCausalLM')
    """
    return tuple(a.hf_class for a in ARCHITECTURES if getattr(a, flag))


def model_types_with(flag: str) -> frozenset[str]:
    """The model types whose ``flag`` is set."""
    return frozenset(a.model_type for a in ARCHITECTURES if getattr(a, flag))


def projection_biases(model_type: str | None, attention_bias: bool) -> tuple[bool, bool]:
    """(q/k/v bias, o bias) of a family whose config says ``attention_bias``: the family's own
    where it has them (Qwen2: q/k/v biases, no o bias), else ``attention_bias`` for both.

    >>> projection_biases("qwen2", False), projection_biases("llama", True)
    ((True, False), (True, True))
    """
    facts = by_model_type(model_type)
    qkv = attention_bias if facts.qkv_bias is None else facts.qkv_bias
    o = attention_bias if facts.o_bias is None else facts.o_bias
    return qkv, o


def rope_by_layer_type(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rotary settings as (those of the model, those of its sliding-window layers where they have
    their own): transformers 5 may write one entry per layer type (``full_attention``,
    ``sliding_attention``; Gemma-3); the model's are then the full-attention entry (else the
    sliding one). A flat dict is the model's, with no sliding entry.

    >>> rope_by_layer_type({"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}})
    ({'rope_theta': 1000000.0}, {'rope_theta': 10000.0})
    >>> rope_by_layer_type({"rope_theta": 5e5})
    ({'rope_theta': 500000.0}, {})
    """
    if "full_attention" in params or "sliding_attention" in params:
        sliding = params.get("sliding_attention") or {}
        return params.get("full_attention") or sliding, sliding
    return params, {}
