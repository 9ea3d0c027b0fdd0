"""Every model family loads faithfully with the default backend, on tiny random-weight models.

The models are built in the test session with ``transformers`` (``tests/tiny.py``: 3 layers,
hidden 64, 4 query / 2 KV heads, biases and norm weights perturbed, features made to matter on a
24-token input: llama3/longrope rope scaling from position 8, sliding windows of 4, Gemma's
``query_pre_attn_scalar`` != head_dim, partial rotary). The references are independent of the
code under test:
- logits: the Hugging Face model itself (eager attention, fp32);
- scores: the slow loop-by-loop reference (``tests/reference_scores.py``), one sequence at a time;
- ablation: the Hugging Face model with the same heads zeroed by a forward pre-hook on its output
  projection (``o_proj``/``c_proj``/``dense``) — not through ``hook_z``.
Which backend ``auto`` must choose on TransformerLens 4 is a bridge for every family (4 has no
HookedTransformer); on 3.9 it is the measured behaviour: HookedTransformer
is exact for Llama-3.x, Qwen2.5, Mistral, Phi-3 without rope scaling and GPT-NeoX; it has no route
for OLMo-2, Gemma-2/3 and transformers-5 GPT-2, and is wrong for Phi-3 longrope/partial rotary.
"""

import gc
import re

import pytest
import torch
from reference_scores import reference_scores
from tiny import FAMILIES, TINY_VOCAB, save_tiny_family

import inactive_heads as ih
from inactive_heads.scoring.scores import APPENDIX_SCORES
from inactive_heads.models import loading as models
from inactive_heads.models.loading import ModelLoadError, load_model, model_info
from inactive_heads.models import tl_line
from inactive_heads.models.tl_line import has_hooked_transformer

LLAMA_3B_PATH = "llama-3.2 in meta-llama/Llama-3.2-3B"
CASES = (*FAMILIES, LLAMA_3B_PATH)
HOOKED = {"llama-3.2", "llama-3.1", "qwen2.5-tied", "qwen2.5-untied", "mistral", "phi-3-window", "gpt-neox",
          LLAMA_3B_PATH}
MODEL_TYPES = {
    "llama-3.2": "llama", "llama-3.1": "llama", "olmo-2": "olmo2", "qwen2.5-tied": "qwen2",
    "qwen2.5-untied": "qwen2", "gemma-2": "gemma2", "gemma-3": "gemma3_text", "mistral": "mistral",
    "phi-3-window": "phi3", "phi-3-longrope": "phi3", "phi-3-partial-rotary": "phi3", "gpt2": "gpt2",
    "gpt-neox": "gpt_neox",
}
N_TOKENS = 24  # > sliding window 4 and > original_max_position_embeddings 8
# The built-in scores (a score registered by other test code is not this file's to check).
REFERENCE_KEYS = [k for k in (*ih.PAPER_SCORES, *APPENDIX_SCORES) if k != "random"]
OUTPUT_PROJECTIONS = ("self_attn.o_proj", "attn.c_proj", "attention.dense")


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    """Every tiny family saved once per session (~1.5 s each), with SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    source, _ = models.resolve_model_dir("smollm2-135m", progress=False)
    tokenizer = AutoTokenizer.from_pretrained(source)
    root = tmp_path_factory.mktemp("families")
    dirs = {family: save_tiny_family(family, root / family, tokenizer) for family in FAMILIES}
    # A directory named like the real checkpoint: TransformerLens's loader would pick its fixed
    # Llama-3.2-3B config (n_ctx 2048, 28 layers) from that name; the config.json must win.
    dirs[LLAMA_3B_PATH] = save_tiny_family("llama-3.2", root / "meta-llama" / "Llama-3.2-3B", tokenizer)
    return dirs


def _right_padded(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and real-position mask of a right-padded batch, N_TOKENS wide."""
    tokens = torch.zeros(len(sequences), N_TOKENS, dtype=torch.long)
    valid = torch.zeros(len(sequences), N_TOKENS, dtype=torch.bool)
    for i, seq in enumerate(sequences):
        tokens[i, :len(seq)] = torch.tensor(seq)
        valid[i, :len(seq)] = True
    return tokens, valid


def _sequences(n_tokens=(N_TOKENS, 13, 5), seed=0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY_VOCAB, (n,), generator=gen).tolist() for n in n_tokens]


def _hf_eager(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()


def _zero_heads_at_output_projection(hf_model, mask: torch.Tensor, d_head: int):
    """Forward pre-hooks zeroing head slices of the output projection's input: mask [layer, head]."""
    handles = []
    for name, module in hf_model.named_modules():
        if not name.endswith(OUTPUT_PROJECTIONS):
            continue
        layer = int(re.search(r"\.(\d+)\.", name).group(1))
        heads = mask[layer].nonzero().flatten().tolist()

        def pre_hook(mod, args, heads=heads):
            x = args[0].clone()
            for h in heads:
                x[..., h * d_head:(h + 1) * d_head] = 0.0
            return (x, *args[1:])

        handles.append(module.register_forward_pre_hook(pre_hook))
    assert len(handles) == mask.shape[0], f"found {len(handles)} output projections"
    return handles


@pytest.fixture(scope="module", params=CASES)
def family(request, family_dirs):
    """(case, directory, model loaded with the default backend, HF eager model)."""
    directory = family_dirs[request.param]
    torch.manual_seed(0)
    model = load_model(str(directory), progress=False)
    hf = _hf_eager(directory)
    yield request.param, directory, model, hf
    del model, hf
    gc.collect()


FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_figures(request):
    """At the end of the module, print the measured differences per family (pytest -s shows it)."""
    yield
    if FIGURES:
        lines = ["", "family                               backend  logit diff  score diff  ablation diff  padded diff"]
        for case, f in FIGURES.items():
            lines.append(
                f"{case:36s} {f.get('backend', '?'):8s} {f.get('logit_diff', float('nan')):10.2e}"
                f"  {f.get('score_diff', float('nan')):10.2e}  {f.get('ablation_logit_diff', float('nan')):13.2e}"
                f"  {f.get('padded_logit_diff', float('nan')):11.2e}"
            )
        print("\n".join(lines))


def test_default_backend_is_the_faithful_one(family):
    case, directory, model, _ = family
    from transformer_lens.model_bridge import TransformerBridge

    info = model_info(model)
    # TransformerLens 4 has no HookedTransformer: every family is a bridge there.
    expected = "hooked" if case in HOOKED and has_hooked_transformer() else "bridge"
    assert info.backend == expected
    if expected == "hooked":
        from transformer_lens import HookedTransformer

        assert isinstance(model, HookedTransformer)
    else:
        assert isinstance(model, TransformerBridge)
    assert (info.n_layers, info.n_heads) == (3, 4)
    assert info.n_kv_heads == (4 if case in ("gpt2", "gpt-neox") else 2)
    assert info.n_ctx == 128  # max_position_embeddings / n_positions of the tiny configs
    # The family is the config's model_type; lm-eval 0.4.5 forces a BOS for Gemma only.
    assert info.family == MODEL_TYPES[case.split(" ")[0]]
    assert info.prepend_bos == case.startswith("gemma")
    FIGURES.setdefault(case, {})["backend"] = info.backend


def test_logits_match_hugging_face_eager(family):
    case, _, model, hf = family
    tokens = torch.tensor([_sequences()[0]])
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    diff = (got - expected).abs().max().item()
    FIGURES.setdefault(case, {})["logit_diff"] = diff
    assert diff <= 1e-4


def test_padded_batch_rows_equal_each_sequence_alone_in_hugging_face(family):
    """The toolkit's forward (right padding + mask, as evaluate runs it): each row's logits at its
    real positions equal HF eager on that sequence alone."""
    from inactive_heads.runtime.hooks import run_forward

    case, _, model, hf = family
    sequences = _sequences((N_TOKENS, 13, 9) if case == "phi-3-longrope" else (N_TOKENS, 13, 5))
    tokens, valid = _right_padded(sequences)
    logits = run_forward(model, tokens, valid)
    worst = 0.0
    for i, seq in enumerate(sequences):
        with torch.no_grad():
            alone = hf(torch.tensor([seq])).logits[0]
        worst = max(worst, (logits[i, :len(seq)] - alone).abs().max().item())
    FIGURES.setdefault(case, {})["padded_logit_diff"] = worst
    assert worst <= 1e-4


def test_every_score_equals_the_slow_reference_at_any_batch_size(family):
    case, _, model, _ = family
    # Longrope switches to its long factors by the longest position in the batch (Hugging Face's
    # own rule), so there a short row's numbers depend on its batch; all rows are kept past 8.
    sequences = _sequences((N_TOKENS, 13, 9) if case == "phi-3-longrope" else (N_TOKENS, 13, 5))
    reference = reference_scores(model, sequences)
    padded = ih.record_scores(model, sequences, batch_size=3, progress=False)
    alone = ih.record_scores(model, sequences, batch_size=1, progress=False)
    worst = 0.0
    for key in REFERENCE_KEYS:
        torch.testing.assert_close(padded[key], reference[key], rtol=1e-5, atol=1e-5, msg=key)
        torch.testing.assert_close(padded[key], alone[key], rtol=1e-5, atol=1e-5, msg=key)
        worst = max(worst, (padded[key] - reference[key]).abs().max().item())
    FIGURES.setdefault(case, {})["score_diff"] = worst


def test_dynamic_ablation_equals_zeroing_at_the_output_projection(family):
    case, _, model, hf = family
    tokens = torch.tensor([_sequences()[0]])
    ablation = ih.DynamicAblation("ahon_ln", 1.0)  # heads below their layer's mean output norm
    with torch.no_grad(), ablation.apply(model):
        got = model(tokens)
    mask = ablation.stats.flagged_mask()[0]
    assert 0 < mask.sum() < mask.numel(), "the test needs some heads zeroed and some kept"
    handles = _zero_heads_at_output_projection(hf, mask, model_info(model).d_head)
    try:
        with torch.no_grad():
            expected = hf(tokens).logits
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        plain = hf(tokens).logits
    assert (expected - plain).abs().max().item() > 1e-3  # the zeroing did change the model
    diff = (got - expected).abs().max().item()
    FIGURES.setdefault(case, {})["ablation_logit_diff"] = diff
    assert diff <= 1e-4


# ----------------------------------------------------------------------------------------------
# Explicit backends


UNFAITHFUL = sorted(set(FAMILIES) - HOOKED)


@pytest.mark.hooked  # on TransformerLens 4 backend='hooked' is refused for every family (tests/unit)
@pytest.mark.parametrize("case", UNFAITHFUL)
def test_hooked_on_an_unfaithful_family_is_a_one_line_error(case, family_dirs):
    with pytest.raises(ModelLoadError, match=r"backend='hooked' would build a different model: ") as err:
        load_model(str(family_dirs[case]), backend="hooked", progress=False)
    message = str(err.value)
    assert "\n" not in message and "backend='bridge'" in message


@pytest.mark.hooked
@pytest.mark.parametrize("case", ["phi-3-longrope", "phi-3-partial-rotary"])
def test_the_refused_hooked_model_really_differs(case, family_dirs):
    """HookedTransformer builds these without an error, but wrong: the refusal is not overcautious."""
    directory = family_dirs[case]
    hooked, _ = tl_line.build_hooked(directory, case, torch.float32, None, None, 1)
    tokens = torch.tensor([_sequences()[0]])
    with torch.no_grad():
        diff = (hooked(tokens) - _hf_eager(directory)(tokens).logits).abs().max().item()
    assert diff > 1e-3


def test_explicit_bridge_on_a_hooked_family(family_dirs):
    model = load_model(str(family_dirs["qwen2.5-untied"]), backend="bridge", progress=False)
    info = model_info(model)
    assert info.backend == "bridge" and info.extra["backend_requested"] == "bridge"


def test_auto_logs_one_line_saying_which_and_why(family_dirs, caplog):
    with caplog.at_level("INFO", logger="inactive_heads.models.loading"):
        load_model(str(family_dirs["olmo-2"]), progress=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "inactive_heads.models.loading"]
    assert len(lines) == 1
    assert "Olmo2ForCausalLM" in lines[0] and "backend bridge" in lines[0]
    assert caplog.records[-1].levelname == "WARNING"


def test_n_ctx_override(family_dirs):
    model = load_model(str(family_dirs[LLAMA_3B_PATH]), n_ctx=4096, progress=False)
    assert model_info(model).n_ctx == model.cfg.n_ctx == 4096


# ----------------------------------------------------------------------------------------------
# Models the user loaded themselves


@pytest.mark.hooked
def test_processed_weights_are_flagged_because_hook_v_changes(family_dirs):
    """HookedTransformer.from_pretrained's default processing folds value biases into b_O: hook_v
    changes, so model_info warns about such a model (Qwen2 has value biases)."""
    model = load_model(str(family_dirs["qwen2.5-untied"]), progress=False)
    tokens = torch.tensor([_sequences()[0]])
    name = "blocks.1.attn.hook_v"
    with torch.no_grad():
        before = model.run_with_cache(tokens, names_filter=name)[1][name]
        # What HookedTransformer.from_pretrained does by default (here only the value-bias fold).
        model.load_and_process_state_dict(model.state_dict(), fold_ln=False, center_writing_weights=False,
                                          center_unembed=False, fold_value_biases=True)
        after = model.run_with_cache(tokens, names_filter=name)[1][name]
    assert (after - before).abs().max().item() > 1e-3
    del model.inactive_heads_info  # now it is "a model the user built"
    with pytest.warns(UserWarning, match=r"hook_v/hook_z differ from the original model's"):
        info = model_info(model)
    assert info.extra["processed_weights"] is not None
    assert info.family == "qwen2" and info.backend == "hooked"


def test_unprocessed_user_model_gets_no_warning(family, recwarn):
    case, _, model, _ = family
    info = getattr(model, "inactive_heads_info")
    try:
        del model.inactive_heads_info
        built = model_info(model)
    finally:
        model.inactive_heads_info = info
    assert not [w for w in recwarn if "hook_v/hook_z" in str(w.message)]
    assert built.backend == info.backend  # isinstance, not the class name
    assert built.family == info.family


def test_a_subclass_of_the_bridge_is_still_a_bridge(family_dirs):
    from transformer_lens.model_bridge import TransformerBridge

    model = load_model(str(family_dirs["olmo-2"]), progress=False)
    model.__class__ = type("MyBridge", (TransformerBridge,), {})
    del model.inactive_heads_info
    assert model_info(model).backend == "bridge"


def test_evaluator_logits_at_scored_positions_equal_hugging_face(family):
    """What evaluate scores: logits at chosen (row, position) pairs of a right-padded batch (the
    bridge projects only those positions onto the vocabulary) equal HF eager on each sequence alone."""
    from inactive_heads.evaluation.evaluator import _logits_at

    case, _, model, hf = family
    sequences = _sequences((N_TOKENS, 13, 9) if case == "phi-3-longrope" else (N_TOKENS, 13, 5))
    tokens, valid = _right_padded(sequences)
    pairs = [(i, t) for i, seq in enumerate(sequences) for t in range(len(seq) - 3, len(seq))]
    rows, positions = torch.tensor([i for i, _ in pairs]), torch.tensor([t for _, t in pairs])
    with torch.inference_mode():
        got = _logits_at(model, tokens, valid, rows, positions)
    with torch.no_grad():
        alone = [hf(torch.tensor([seq])).logits[0] for seq in sequences]
    expected = torch.stack([alone[i][t] for i, t in pairs])
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4
