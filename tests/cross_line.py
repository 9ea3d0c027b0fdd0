"""What the cross-line test compares, computed on the TransformerLens line this interpreter has.

    python tests/cross_line.py OUT.json [--models smollm2-135m qwen2.5-coder-0.5b]

For each model, on small fixed subsets: the 13 paper scores of every (sequence, layer, head) on
MMLU prompts, thresholds calibrated on them, every dynamic zeroing decision per (sequence, layer,
head) with their log-likelihoods and answers on MMLU, PIQA and WinoGrande, and GSM8K's generated
tokens in both decision modes. Written as JSON (numbers only; nothing executable). The test in
tests/integration/test_cross_line.py runs this under both lines and compares the two files.
"""

import argparse
import json
import os
import sys
import tempfile
from importlib.metadata import version

import torch

import inactive_heads as ih
from inactive_heads.evaluation.gsm8k import build_gsm8k_requests

# MMLU prompts to score and calibrate on; questions to evaluate (another subject: held out).
CALIBRATION = {"subjects": ["astronomy"], "limit": 6}
EVALUATIONS = {"mmlu": {"subjects": ["anatomy"], "limit": 4}, "piqa": {"limit": 6}, "winogrande": {"limit": 6}}
SCORE, QUANTILES = "ahon_ln", (0.2, 0.5)
GSM8K_PROMPTS, GSM8K_TOKENS = 1, 10


def probe(name: str) -> dict:
    model = ih.load_model(name)
    info = ih.model_info(model)
    out = {"class": info.extra.get("model_class"), "n_layers": info.n_layers, "n_heads": info.n_heads}
    plan = ih.plan_evaluation(model, "mmlu", **CALIBRATION)
    scores = ih.record_scores(model, plan.inputs, list(ih.PAPER_SCORES), progress=False)
    out["scores"] = {key: scores[key].double().tolist() for key in ih.PAPER_SCORES}
    thresholds = ih.calibrate(scores, SCORE, QUANTILES)
    out["thresholds"] = list(thresholds.values)
    tau = thresholds.values[-1]
    out["tasks"] = {}
    for task, kwargs in EVALUATIONS.items():
        for label, ablation in (("baseline", None), ("dynamic", ih.DynamicAblation(SCORE, tau))):
            result = ih.evaluate(model, task, ablation=ablation, progress=False, **kwargs)
            entry = {"correct": result.correct, "loglikelihoods": result.loglikelihoods,
                     "realized_fraction": result.realized_fraction}
            if result.flagged is not None:
                entry["flagged"] = torch.as_tensor(result.flagged).int().tolist()
            out["tasks"][f"{task}/{label}"] = entry
    requests = build_gsm8k_requests(model.tokenizer, limit=GSM8K_PROMPTS)
    prompts = [list(r.context_ids) for r in requests]
    out["gsm8k"] = {}
    for decision in ("per_step", "prompt"):
        generated = ih.generate(model, prompts, ablation=ih.DynamicAblation(SCORE, tau), decision=decision,
                                max_new_tokens=GSM8K_TOKENS, progress=False)
        out["gsm8k"][decision] = {"tokens": generated.tokens, "realized_fraction": generated.realized_fraction}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    args = parser.parse_args()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    result = {"transformer_lens": version("transformer-lens"), "models": {}}
    for name in args.models:
        result["models"][name] = probe(name)
    folder = os.path.dirname(os.path.abspath(args.out))
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
        json.dump(result, f)
    os.replace(f.name, args.out)
    print(f"{args.out}: transformer-lens {result['transformer_lens']}, {len(result['models'])} models", file=sys.stderr)


if __name__ == "__main__":
    main()
