"""A pruned SmolLM2 (GQA, 9 query / 3 KV heads) under lm-eval's own Hugging Face backend equals the
toolkit's StaticAblation of the same heads, and its parameter count drops by the accountant's figure.

The head set (30 % of heads, AHON (LN), most often flagged) is chosen on PIQA questions 200-239
and evaluated on questions 0-7 of PIQA and 0-5 of MMLU anatomy: never chosen and scored on the
same questions.
"""

import pytest
import torch

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import inactive_heads as ih  # noqa: E402
from inactive_heads.lmeval.model import offline_tasks_dir  # noqa: E402

# A choice's log-likelihood sums 10-40 token log-probs, from lm-eval's HF model (SDPA) on one side and
# HookedTransformer on the other: float rounding adds up. Measured 4.1e-4 on the CI machine of
# 2026-12 (and at the commit before, with the same libraries); the answers must still be equal.
LL_TOL = 1e-3
CALIBRATION = range(200, 240)


@pytest.fixture(scope="module")
def head_set(smollm2):
    plan = ih.plan_evaluation(smollm2, "piqa", limit=CALIBRATION.stop)
    cal = [i for i, targets in enumerate(plan.inputs) if plan.targets[i][0][0] in CALIBRATION]
    scores = ih.record_scores(smollm2, [plan.inputs[i] for i in cal], ["ahon_ln"], progress=False)
    return ih.static_heads(scores, "ahon_ln", 0.3)


@pytest.fixture(scope="module")
def pruned_dir(smollm2, head_set, tmp_path_factory):
    return ih.export_pruned(smollm2, head_set, tmp_path_factory.mktemp("smollm2") / "pruned", mode="pruned")


@pytest.mark.slow
def test_lm_eval_hf_backend_on_the_pruned_export_equals_static_ablation(smollm2, head_set, pruned_dir,
                                                                        tmp_path_factory):
    assert len(head_set) == 81  # 30 % of 30 x 9
    tasks = TaskManager(include_path=str(offline_tasks_dir(tmp_path_factory.mktemp("tasks"))), include_defaults=False)
    hflm = HFLM(pretrained=str(pruned_dir), trust_remote_code=True, dtype="float32", batch_size=4, device="cpu")
    assert type(hflm.model).__name__ == "PrunedLlamaForCausalLM"
    for task, lm_task, n, subjects in (("piqa", "piqa", 8, None), ("mmlu", "mmlu_anatomy", 6, ["anatomy"])):
        out = lm_eval.simple_evaluate(model=hflm, tasks=[lm_task], task_manager=tasks, log_samples=True,
                                      num_fewshot=0, limit=n)
        samples = sorted(out["samples"][lm_task], key=lambda s: s["doc_id"])
        theirs = [[resp[0] for resp in s["filtered_resps"]] for s in samples]
        ours = ih.evaluate(smollm2, task, subjects=subjects, limit=n, num_fewshot=0, apply_chat_template=False,
                           ablation=ih.StaticAblation(head_set), progress=False).loglikelihoods
        assert len(ours) == len(theirs) == n
        for a, b in zip(ours, theirs):
            assert max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
            assert max(abs(x - y) for x, y in zip(a, b)) <= LL_TOL
    dense = sum(p.numel() for p in HFLM(pretrained=ih.model_info(smollm2).source, dtype="float32",
                                        device="cpu").model.parameters())
    pruned = sum(p.numel() for p in hflm.model.parameters())
    assert dense - pruned == ih.savings(smollm2, head_set).params_removed > 0


def test_from_pretrained_offline_runs_the_pruned_export(smollm2, head_set, pruned_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pruned_dir, trust_remote_code=True, dtype=torch.float32,
                                                 local_files_only=True)
    tokens = torch.tensor([smollm2.tokenizer.encode("The cat sat on the mat because it was warm.")])
    with torch.no_grad(), ih.StaticAblation(head_set).apply(smollm2):
        expected = smollm2(tokens)
    with torch.no_grad():
        assert (model(tokens).logits - expected).abs().max() <= LL_TOL
