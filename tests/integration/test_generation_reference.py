"""Generation on SmolLM2 against an independent loop, token for token.

``decision="per_step"`` (no cache, heads re-decided at every token) must equal
``tests/reference_generation.py``: plain Hugging Face forwards of the same converted model folder,
scores from the attention weights and value vectors in float64, heads zeroed before ``o_proj``.
``decision="prompt"`` with TransformerLens's KV cache must equal the same decision without one.
``per_step`` with ``reuse_prefix=True`` (the few-shot prefix computed once) must equal the loop too.
"""

import pytest

import inactive_heads as ih
from inactive_heads.evaluation.generation import generate
from inactive_heads.evaluation.gsm8k import build_gsm8k_requests
from tests.reference_generation import ReferenceGenerator

pytestmark = pytest.mark.slow

MAX_NEW = 8


@pytest.fixture(scope="module")
def requests_(smollm2):
    return build_gsm8k_requests(smollm2.tokenizer, limit=2, num_fewshot=1, apply_chat_template=True)


@pytest.fixture(scope="module")
def thresholds(smollm2, requests_):
    # Thresholds at p = 0.1 of the prompts' own scores, so that something is flagged.
    prompts = [list(r.context_ids) for r in requests_]
    scores = ih.record_scores(smollm2, prompts, ["ahon_ln", "awft"], progress=False)
    return {key: ih.calibrate(scores, key, [0.1]).values[0] for key in ("ahon_ln", "awft")}


@pytest.mark.parametrize("score", ["ahon_ln", "awft"])
def test_per_step_equals_the_independent_loop(smollm2, requests_, thresholds, score):
    model = smollm2
    tau = thresholds[score]
    prompts = [list(r.context_ids) for r in requests_]
    until = list(requests_[0].until)
    ours = generate(model, prompts, ablation=ih.DynamicAblation(score, tau), decision="per_step",
                    max_new_tokens=MAX_NEW, until=until, batch_size=2, progress=False)
    reference = ReferenceGenerator(ih.model_info(model).source, model.tokenizer)
    expected = [reference.generate(p, MAX_NEW, until, score=score, tau=tau) for p in prompts]
    assert ours.tokens == expected
    assert ours.realized_fraction > 0
    assert ours.realized_fraction == pytest.approx(reference.realized_fraction(), abs=1e-12)
    # The few-shot prefix computed once per decision history: still the independent loop's tokens.
    reused = generate(model, prompts, ablation=ih.DynamicAblation(score, tau), decision="per_step",
                      max_new_tokens=MAX_NEW, until=until, batch_size=2, progress=False, reuse_prefix=True)
    assert reused.prefix_reuse["used"] and reused.prefix_reuse["prompts_reused"] == len(prompts)
    assert reused.tokens == expected
    assert reused.realized_fraction == pytest.approx(ours.realized_fraction, abs=1e-12)


def test_prompt_decision_cached_equals_uncached(smollm2, requests_, thresholds):
    model = smollm2
    prompts = [list(r.context_ids) for r in requests_]
    until = list(requests_[0].until)
    runs = {
        cache: generate(model, prompts, ablation=ih.DynamicAblation("ahon_ln", thresholds["ahon_ln"]),
                        decision="prompt", max_new_tokens=MAX_NEW, until=until, use_cache=cache,
                        batch_size=2, progress=False)
        for cache in (True, False)
    }
    assert runs[True].use_cache and not runs[False].use_cache
    assert runs[True].tokens == runs[False].tokens
    assert runs[True].realized_fraction == runs[False].realized_fraction > 0
