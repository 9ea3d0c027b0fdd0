"""Real models load offline on both TransformerLens backends and reproduce Hugging Face logits.

The reference is ``AutoModelForCausalLM(attn_implementation="eager")`` loaded from the same
converted directory (``model_info(model).source``), in fp32.

SmolLM2-135M runs always (CI converts it once, ~20 s). Gemma-3-270m and Qwen2.5-Coder-0.5B are
``slow``: run them with ``INACTIVE_HEADS_SLOW=1`` after ``make models-extra`` (each converts once,
1-3 min, then loads in 5-25 s).
"""

import gc

import pytest
import torch

from inactive_heads.models import BUILTIN_MODELS, is_installed, load_model, model_info

PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
SHAPES = {"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "d_head": 64}


def hf_reference_logits(source: str, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        logits = hf(tokens).logits
    del hf
    gc.collect()
    return logits


def prompt_tokens(source: str, prompt: str = PROMPT) -> torch.Tensor:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)(prompt, return_tensors="pt").input_ids


def max_logit_diff(model, tokens: torch.Tensor, reference: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == reference.shape
    return (logits - reference).abs().max().item()


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_hooked):
    source = model_info(smollm2_hooked).source
    tokens = prompt_tokens(source)
    return tokens, hf_reference_logits(source, tokens)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M (always)


def test_default_backend_is_hooked_transformer(smollm2_hooked):
    from transformer_lens import HookedTransformer

    assert isinstance(smollm2_hooked, HookedTransformer)
    info = model_info(smollm2_hooked)
    assert {k: getattr(info, k) for k in SHAPES} == SHAPES
    assert (info.backend, info.dtype, info.family) == ("hooked", "float32", "llama")
    assert info.gqa_group_size == 3
    assert info.extra["official_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert info.source.endswith(BUILTIN_MODELS["smollm2-135m"].sha256[:16])


def test_bridge_backend_info(smollm2_bridge):
    from transformer_lens.model_bridge import TransformerBridge

    assert isinstance(smollm2_bridge, TransformerBridge)
    info = model_info(smollm2_bridge)
    assert {k: getattr(info, k) for k in SHAPES} == SHAPES
    assert info.backend == "bridge"


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_logits_match_hugging_face(backend, request, smollm2_reference):
    model = request.getfixturevalue(f"smollm2_{backend}")
    tokens, reference = smollm2_reference
    assert tokens.shape[1] >= 16
    assert max_logit_diff(model, tokens, reference) < 1e-4


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_hook_shapes(backend, request):
    model = request.getfixturevalue(f"smollm2_{backend}")
    b, pos = 2, 7
    tokens = torch.randint(100, 1000, (b, pos), generator=torch.Generator().manual_seed(0))
    layers = (0, 29)
    names = [f"blocks.{layer}.attn.hook_{h}" for layer in layers for h in ("pattern", "v", "z")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    for layer in layers:
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert tuple(pattern.shape) == (b, 9, pos, pos)
        assert tuple(cache[f"blocks.{layer}.attn.hook_v"].shape) == (b, pos, 3, 64)
        assert tuple(cache[f"blocks.{layer}.attn.hook_z"].shape) == (b, pos, 9, 64)
        # A causal softmax: rows sum to one, nothing above the diagonal.
        torch.testing.assert_close(pattern.sum(-1), torch.ones(b, 9, pos), atol=1e-5, rtol=0)
        assert pattern.triu(1).abs().max().item() == 0.0


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_hooks_can_edit_z_and_reset_cleanly(backend, request, smollm2_reference):
    """Zeroing a layer's z changes logits; after reset_hooks the model is exactly as before."""
    model = request.getfixturevalue(f"smollm2_{backend}")
    tokens, _ = smollm2_reference
    with torch.no_grad():
        before = model(tokens)
        model.add_hook("blocks.3.attn.hook_z", lambda z, hook: torch.zeros_like(z))
        ablated = model(tokens)
        model.reset_hooks()
        after = model(tokens)
    assert (ablated - before).abs().max().item() > 1e-2
    assert torch.equal(after, before)


def test_both_backends_agree(smollm2_hooked, smollm2_bridge, smollm2_reference):
    tokens, _ = smollm2_reference
    names = ["blocks.10.attn.hook_pattern", "blocks.10.attn.hook_z"]
    with torch.no_grad():
        _, hooked = smollm2_hooked.run_with_cache(tokens, names_filter=lambda n: n in names)
        _, bridge = smollm2_bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    for name in names:
        torch.testing.assert_close(hooked[name], bridge[name], atol=1e-5, rtol=1e-4)


def test_second_load_reuses_the_conversion(smollm2_hooked):
    """Loading again reads the cached HF directory; nothing is converted twice."""
    info = model_info(smollm2_hooked)
    again = load_model("smollm2-135m", backend="hooked", progress=False)
    assert model_info(again).source == info.source
    assert sum(p.numel() for p in again.parameters()) == sum(
        p.numel() for p in smollm2_hooked.parameters()
    )


# ----------------------------------------------------------------------------------------------
# Larger built-in models (slow)

# Max |logit diff| against HF eager, fp32. Measured on this prompt: Gemma-3 hooked 7.8e-5 on a
# 262k vocabulary (logits up to ~30; up to 1.6e-3 at 700 random tokens), Qwen hooked 1.9e-5;
# the bridge wraps the HF modules and matches exactly.
TOLERANCE = {
    ("gemma-3-270m", "hooked"): 5e-4,
    ("gemma-3-270m", "bridge"): 1e-5,
    ("qwen2.5-coder-0.5b", "hooked"): 1e-4,
    ("qwen2.5-coder-0.5b", "bridge"): 1e-5,
}
EXPECTED = {
    "gemma-3-270m": {"n_layers": 18, "n_heads": 4, "n_kv_heads": 1, "d_head": 256},
    "qwen2.5-coder-0.5b": {"n_layers": 24, "n_heads": 14, "n_kv_heads": 2, "d_head": 64},
}
_REFERENCE: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _require_installed(alias: str) -> None:
    model = BUILTIN_MODELS[alias]
    if not is_installed(model):
        pytest.skip(f"{alias} is not installed: {model.install_command} (or make models-extra)")


@pytest.mark.slow
@pytest.mark.parametrize("alias, backend", list(TOLERANCE))
def test_larger_model_matches_hugging_face(alias, backend):
    _require_installed(alias)
    model = load_model(alias, backend=backend, progress=False)
    try:
        info = model_info(model)
        assert {k: getattr(info, k) for k in EXPECTED[alias]} == EXPECTED[alias]
        assert info.backend == backend
        if alias not in _REFERENCE:
            tokens = prompt_tokens(info.source)
            _REFERENCE[alias] = tokens, hf_reference_logits(info.source, tokens)
        tokens, reference = _REFERENCE[alias]
        assert max_logit_diff(model, tokens, reference) < TOLERANCE[alias, backend]
        n_kv, n_heads, d_head = (EXPECTED[alias][k] for k in ("n_kv_heads", "n_heads", "d_head"))
        names = ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_v", "blocks.0.attn.hook_z"]
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens[:, :8], names_filter=lambda n: n in names)
        assert tuple(cache[names[0]].shape) == (1, n_heads, 8, 8)
        assert tuple(cache[names[1]].shape) == (1, 8, n_kv, d_head)
        assert tuple(cache[names[2]].shape) == (1, 8, n_heads, d_head)
    finally:
        del model
        gc.collect()


@pytest.mark.slow
def test_gemma_hooked_sliding_window_beyond_512_tokens():
    """Gemma-3 local layers attend to 512 tokens: past that the hooked model must still match."""
    alias = "gemma-3-270m"
    _require_installed(alias)
    model = load_model(alias, backend="hooked", progress=False)
    tokens = torch.randint(100, 30000, (1, 640), generator=torch.Generator().manual_seed(0))
    reference = hf_reference_logits(model_info(model).source, tokens)
    # Without the window the late positions differ by whole logits, not by float rounding.
    assert max_logit_diff(model, tokens, reference) < 5e-3
    del model, reference
    gc.collect()
