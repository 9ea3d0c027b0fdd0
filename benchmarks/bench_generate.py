"""GSM8K generation speed with heads zeroed: per_step (the authors' protocol) against prompt decisions.

Variants, on the same GSM8K prompts (tokenized once), greedy, AHON (LN) at the τ that flags a
fraction ``p`` of the prompts' own pooled scores (recorded with nothing zeroed):

- ``per_step``: no KV cache; every new token re-runs the whole sequence and re-decides the heads;
- ``per_step_reuse``: the same protocol with ``reuse_prefix=True``: every state computed once per
  decision history (the shared few-shot prefix once, then only the newest token at each step);
- ``prompt_uncached``: heads decided on the prompt and held, whole sequence re-run per token;
- ``prompt_cached``: the same decision, TransformerLens's KV cache (left padding, per-row stop).

``tokens_per_s`` = generated tokens / wall seconds of each variant, measured in this run, and
``ratio_tps_prompt_cached_vs_per_step`` and ``ratio_tps_per_step_reuse_vs_per_step`` ratios.
Three checks, token for token: ``per_step_reuse_equals_per_step``,
``per_step_equals_reference`` (per_step against the independent Hugging Face loop of
``tests/reference_generation.py`` on the first ``--reference-prompts`` prompts) and
``prompt_cached_equals_uncached``. The last line printed is one JSON object.

    python benchmarks/bench_generate.py --model smollm2-135m --threads 2
"""

import argparse
import json
import sys
import time
from pathlib import Path

from inactive_heads.core.versions import library_versions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-fewshot", type=int, default=5)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--reference-prompts", type=int, default=None,
                        help="prompts checked against the reference loop (default: all)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import torch

    import inactive_heads as ih
    from inactive_heads.evaluation.generation import generate
    from inactive_heads.evaluation.gsm8k import build_gsm8k_requests

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.reference_generation import ReferenceGenerator

    if args.threads:
        torch.set_num_threads(args.threads)
    model = ih.load_model(args.model, dtype="float32", progress=False)
    info = ih.model_info(model)
    reqs = build_gsm8k_requests(model.tokenizer, limit=args.prompts, num_fewshot=args.num_fewshot,
                                apply_chat_template=info.is_chat, prepend_bos=info.prepend_bos)
    prompts = [list(r.context_ids) for r in reqs]
    until = list(reqs[0].until)
    scores = ih.record_scores(model, prompts, ["ahon_ln"], progress=False)
    tau = ih.calibrate(scores, "ahon_ln", [args.p]).values[0]

    runs = {}
    for name, decision, cache, reuse in (("per_step", "per_step", False, False),
                                         ("per_step_reuse", "per_step", False, True),
                                         ("prompt_uncached", "prompt", False, False),
                                         ("prompt_cached", "prompt", True, False)):
        start = time.perf_counter()
        out = generate(model, prompts, ablation=ih.DynamicAblation("ahon_ln", tau), decision=decision,
                       max_new_tokens=args.max_new_tokens, until=until, use_cache=cache, reuse_prefix=reuse,
                       batch_size=args.batch_size, progress=False)
        seconds = time.perf_counter() - start
        runs[name] = (out, seconds)
        n_tokens = sum(len(t) for t in out.tokens)
        print(f"{name}: {n_tokens} tokens in {seconds:.1f} s, realized fraction {out.realized_fraction:.4f}",
              file=sys.stderr)

    n_ref = len(prompts) if args.reference_prompts is None else args.reference_prompts
    reference = ReferenceGenerator(info.source, model.tokenizer)
    expected = [reference.generate(p, args.max_new_tokens, until, score="ahon_ln", tau=tau) for p in prompts[:n_ref]]
    per_step = runs["per_step"][0]

    def tps(name):
        out, seconds = runs[name]
        return sum(len(t) for t in out.tokens) / seconds

    result = {
        "model": args.model,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "num_fewshot": args.num_fewshot,
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
        "score": "ahon_ln",
        "p": args.p,
        "tau": tau,
        "threads": torch.get_num_threads(),
        "tokens_per_s": {name: tps(name) for name in runs},
        "realized_fraction": {name: runs[name][0].realized_fraction for name in runs},
        "savings_prompt": runs["prompt_cached"][0].savings,
        "prefix_reuse": runs["per_step_reuse"][0].prefix_reuse,
        "ratio_tps_per_step_reuse_vs_per_step": tps("per_step_reuse") / tps("per_step"),
        "ratio_tps_prompt_cached_vs_per_step": tps("prompt_cached") / tps("per_step"),
        "reference_prompts": n_ref,
        "per_step_equals_reference": per_step.tokens[:n_ref] == expected,
        "per_step_reuse_equals_per_step": runs["per_step_reuse"][0].tokens == per_step.tokens,
        "prompt_cached_equals_uncached": runs["prompt_cached"][0].tokens == runs["prompt_uncached"][0].tokens,
    }
    print(json.dumps({**library_versions(), **result}))


if __name__ == "__main__":
    main()
