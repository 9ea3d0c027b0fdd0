"""Measured prefill speed of a pruned export against the dense model, beside the accountant's prediction.

Steps, all in one run:

1. choose a static head set: ``--fraction`` of all heads by AHON (LN) (most often flagged at the
   matched quantile), on PIQA questions ``--calibration`` (a calibration split);
2. export it with ``mode="pruned"`` to a temporary folder and load both the dense checkpoint and the
   export with plain ``AutoModelForCausalLM`` (the export with ``trust_remote_code=True``), fp32;
3. check it: on PIQA questions 0..``--check``-1 (held out from step 1), the export's answer
   log-likelihoods, computed with lm-eval's HF-backend arithmetic, against the toolkit's
   ``StaticAblation`` of the same heads; parameter counts against the accountant;
4. time it: the same ``--batch`` × ``--seq-len`` LAMBADA tokens (passages joined) through both models' plain forward,
   interleaved round after round (load on a shared machine falls on both alike); the fastest
   round of each counts. ``ratio_prefill_tps_pruned_vs_dense`` = dense seconds / pruned seconds.

When the measured ratio and the FLOP prediction differ by more than 30 %, a profile of one
forward of each (top operators by self CPU time) is printed to say why. The last line printed is
one JSON object.

    python benchmarks/bench_pruned.py --model smollm2-135m --threads 2
"""

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eval import hf_reference, max_abs_diff  # noqa: E402  (lm-eval's HF-backend arithmetic, one place)

from inactive_heads.core.versions import library_versions


def profile(model, tokens, label: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.inference_mode(), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        model(tokens)
    print(f"--- profile: {label} ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--score", default="ahon_ln")
    parser.add_argument("--calibration", type=int, nargs=2, default=[200, 260], metavar=("FIRST", "END"),
                        help="PIQA questions FIRST..END-1 choose the heads (default 200 260)")
    parser.add_argument("--check", type=int, default=20, help="PIQA questions 0..N-1 for the equality check")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    import inactive_heads as ih
    from inactive_heads.evaluation.texts import lambada_passages

    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = ih.load_model(args.model, dtype="float32", progress=False)
    first, end = args.calibration
    if args.check > first:
        raise SystemExit(f"--check {args.check} overlaps the calibration questions from {first}")
    plan = ih.plan_evaluation(model, "piqa", limit=end)
    cal = [i for i, targets in enumerate(plan.targets) if first <= targets[0][0] < end]
    scores = ih.record_scores(model, [plan.inputs[i] for i in cal], [args.score], progress=False)
    heads = ih.static_heads(scores, args.score, args.fraction)
    out = Path(tempfile.mkdtemp(prefix="ih-pruned-")) / "pruned"
    ih.export_pruned(model, heads, out, mode="pruned")
    src = ih.model_info(model).source
    dense = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    pruned = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=True).eval()
    acct = ih.savings(model, heads, seq_len=args.seq_len, dtype="float32")

    check = ih.plan_evaluation(model, "piqa", limit=args.check)
    ours = ih.evaluate(model, check, ablation=ih.StaticAblation(heads), progress=False)
    theirs, _ = hf_reference(pruned, check, batch_size=8)
    answers = [max(range(len(ll)), key=ll.__getitem__) for ll in theirs]
    answers_equal = answers == [max(range(len(ll)), key=ll.__getitem__) for ll in ours.loglikelihoods]
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    params_removed = n_params(dense) - n_params(pruned)

    # LAMBADA passages are short: join them into one stream and cut it into batch rows.
    stream = [t for passage in lambada_passages(400, tokenizer=model.tokenizer) for t in passage]
    need = args.batch * args.seq_len
    if len(stream) < need:
        raise SystemExit(f"only {len(stream)} LAMBADA tokens; lower --batch or --seq-len")
    tokens = torch.tensor(stream[:need]).reshape(args.batch, args.seq_len)
    times = {"dense": [], "pruned": []}
    with torch.inference_mode():
        for name, m in (("dense", dense), ("pruned", pruned)):
            m(tokens)  # warm-up
        for r in range(args.rounds):
            order = (("dense", dense), ("pruned", pruned)) if r % 2 == 0 else (("pruned", pruned), ("dense", dense))
            for name, m in order:
                start = time.perf_counter()
                m(tokens)
                times[name].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    ratio = best["dense"] / best["pruned"]
    predicted = acct.predicted_prefill_ratio
    n_tokens = tokens.numel()
    print(f"{len(heads)} heads removed ({100 * heads.realized_fraction:.1f} %), chosen on PIQA questions "
          f"{first}-{end - 1}; checked on questions 0-{args.check - 1}")
    print(f"dense {n_tokens / best['dense']:.0f} tok/s, pruned {n_tokens / best['pruned']:.0f} tok/s "
          f"(best of {args.rounds} interleaved rounds, batch {args.batch} x {args.seq_len})")
    print(acct.table().to_string(index=False))
    if abs(ratio / predicted - 1) > 0.3:
        profile(dense, tokens, "dense")
        profile(pruned, tokens, "pruned")
    print(json.dumps({
        **library_versions(),
        "model": args.model,
        "fraction": args.fraction,
        "heads_removed": len(heads),
        "kv_heads_removed": acct.kv_heads_removable,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "threads": torch.get_num_threads(),
        "dense_prefill_tps": round(n_tokens / best["dense"], 1),
        "pruned_prefill_tps": round(n_tokens / best["pruned"], 1),
        "ratio_prefill_tps_pruned_vs_dense": round(ratio, 4),
        "predicted_prefill_ratio": round(predicted, 4),
        "params_removed": params_removed,
        "params_removed_exact": params_removed == acct.params_removed,
        "answers_equal_static": answers_equal,
        "max_abs_dll_vs_static": max_abs_diff(theirs, ours.loglikelihoods),
        "n_check_questions": args.check,
    }))


if __name__ == "__main__":
    main()
