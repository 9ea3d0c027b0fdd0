"""OLMo-2 in bfloat16 on a TransformerBridge: its attention is TransformerLens's own (the toolkit's
forms do not cover Q/K norms), whose rotary embedding leaves the queries in float32; called through
the Hugging Face base model with an attention mask it failed with "expected scalar type Float but
found BFloat16", so ``evaluate`` and generation failed on the paper's OLMo-2-7B in bfloat16.

The reference is Hugging Face's own ``Olmo2ForCausalLM`` loaded from the same folder in bfloat16."""

import pytest
import torch

import inactive_heads as ih
from inactive_heads.evaluation.evaluator import _logits_at
from inactive_heads.models.tl_line import is_bridge
from tests.tiny import save_tiny_family
from tests.unit.test_tensor_files import _word_tokenizer


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    d = tmp_path_factory.mktemp("olmo2")
    src = save_tiny_family("olmo-2", d / "model", _word_tokenizer(d / "tok"))
    model = ih.load_model(str(src), dtype="bfloat16", backend="bridge", progress=False)
    assert is_bridge(model)
    return src, model


def test_logits_at_chosen_positions_equal_hugging_face_in_bfloat16(olmo2):
    from transformers import AutoModelForCausalLM

    src, model = olmo2
    tokens = torch.tensor([[5, 9, 2, 7, 11, 3], [6, 8, 10, 12, 0, 0]])
    valid = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    rows, positions = torch.tensor([0, 0, 1]), torch.tensor([2, 5, 3])
    with torch.inference_mode():
        ours = _logits_at(model, tokens, valid, rows, positions).float()
        hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, attn_implementation="eager").eval()
        theirs = hf(input_ids=tokens, attention_mask=valid.long()).logits[rows, positions].float()
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 2e-2 * scale  # bfloat16's own rounding, two attention codes
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_evaluate_and_generation_run_in_bfloat16(olmo2):
    _, model = olmo2
    ablation = ih.DynamicAblation("ahon_ln", 1.0)
    with torch.inference_mode(), ablation.apply(model):
        logits = _logits_at(model, torch.tensor([[5, 9, 2, 7]]), torch.ones(1, 4, dtype=torch.bool),
                            torch.tensor([0]), torch.tensor([3]))
    assert logits.dtype == torch.bfloat16 and ablation.stats.realized_fraction > 0
    for decision in ("prompt", "per_step"):
        out = ih.generate(model, [[5, 9, 2, 7], [6, 8]], ablation=ih.DynamicAblation("ahon_ln", 1.0),
                          decision=decision, max_new_tokens=3, eos_token_id=None, progress=False)
        assert [len(t) for t in out.tokens] == [3, 3]
