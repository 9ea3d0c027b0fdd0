"""Acceptance check for a new machine (GPU or CPU): does the toolkit run here, how fast, in how much memory.

One command, any device::

    python benchmarks/gpu_check.py --model Qwen/Qwen2.5-7B --device cuda --dtype bfloat16
    python benchmarks/gpu_check.py --model /path/to/hf_dir --device cuda:1
    python benchmarks/gpu_check.py --model smollm2-135m --device cpu --n 8 --eval-n 4   # small, CPU

What it does, in the requested dtype (``auto``: the config's dtype on a GPU, float32 on the CPU):

1. loads the model (built-in alias, local Hugging Face directory or hub name);
2. records the scores ``ahon_ln`` and ``awft`` on ``--n`` MMLU 5-shot prompts (the evaluator's own
   inputs) and reports tokens/s of that pass;
3. evaluates ``--eval-n`` of those questions plainly and with the paper's dynamic ablation
   (AHON (LN) at the p = 10 % threshold calibrated on step 2's scores);
4. reports peak memory: ``torch.cuda.max_memory_allocated`` on CUDA, peak RSS on the CPU (a
   process-wide high-water mark: it includes the loaded weights).

Then, unless ``--no-agreement``, it repeats 1–3 in the other precision (float32 if the first was
not float32, else bfloat16) and reports bf16-vs-fp32 agreement of the p = 10 % flags of AHON (LN)
and AWFT over all (prompt, layer, head) triples: the fraction of equal flags and the IoU of the
flagged sets (each precision calibrates its own τ, as a user of that precision would), plus both
accuracies. Accuracy on n questions carries a binomial standard error, printed with it.

``--paper-row`` runs one row of the paper instead: AHON (LN) and AWFT at the paper's 7 quantiles
on ``--subjects``/``--limit`` of MMLU (a sweep, ``--out`` or a temporary folder), and prints each
run's accuracy with its 95 % interval, the realized % zeroed, τ calibrated here beside the paper's
released τ for the model (``--paper-model``, else guessed from the model directory's name; the
package holds the paper's thresholds, not its per-run accuracies), the measured questions/s, and
the projected wall time and peak memory of the paper's whole grid for the model (13 scores and
Random at 7 quantiles on all of MMLU, or ``--grid-subjects``/``--grid-limit``; the sweep
estimator, ``inactive-heads sweep --estimate``)::

    python benchmarks/gpu_check.py --model /models/Llama-3.1-8B --device cuda --paper-row --limit 20

The last line printed is one JSON object.
"""

import argparse
import gc
import json
import math
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clock import synchronizer  # noqa: E402  (the benchmarks' one device-aware clock)

from inactive_heads.core.versions import library_versions

P = 0.10
AGREEMENT_SCORES = ("ahon_ln", "awft")


def flag_agreement(a, b, key: str, p: float = P) -> dict:
    """Agreement of the flags at quantile ``p`` between two recordings of one score.

    ``a`` and ``b`` are ``[sequence, layer, head]`` tensors of the same score; each is thresholded
    at its own τ (the p-quantile of its pooled values, in the score's direction).
    """
    from inactive_heads.scoring.calibration import calibrate
    from inactive_heads.scoring.scores import get_score

    if a.shape != b.shape:
        raise ValueError(f"score tensors differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    score = get_score(key)
    flags = []
    for t in (a, b):
        tau = calibrate(t, key, [p]).at(p)
        flags.append(score.is_inactive(t, tau))
    fa, fb = flags
    union = (fa | fb).sum().item()
    return {
        "agreement": round((fa == fb).float().mean().item(), 5),
        "iou": round((fa & fb).sum().item() / union, 5) if union else 1.0,
        "flagged_a": int(fa.sum()),
        "flagged_b": int(fb.sum()),
        "n_triples": fa.numel(),
    }


def _peak_memory_mb(device: str) -> tuple[float, str]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20, "torch.cuda.max_memory_allocated"
    if device == "mps" and hasattr(torch, "mps"):
        return torch.mps.driver_allocated_memory() / 2**20, "torch.mps.driver_allocated_memory"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak RSS (process)"


def _stderr(acc: float, n: int) -> float:
    return math.sqrt(acc * (1 - acc) / n) if n else float("nan")


def _first_questions(plan, n: int):
    """The plan restricted to its first ``n`` MMLU questions (one forward input each)."""
    if hasattr(plan, "subset"):
        return plan.subset(list(range(n)))
    from dataclasses import replace

    return replace(plan, requests=plan.requests[:n], inputs=plan.inputs[:n], targets=plan.targets[:n])


def run_one(args, dtype) -> dict:
    """Load in ``dtype``, record, evaluate plain and ablated; return figures and the scores."""
    import torch

    import inactive_heads as ih
    from inactive_heads.scoring.calibration import calibrate
    from inactive_heads.evaluation.evaluator import evaluate, plan_evaluation
    from inactive_heads.runtime.hooks import model_device

    if str(args.device or "").startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    model = ih.load_model(args.model, backend=args.backend, dtype=dtype, device=args.device,
                          n_ctx=args.n_ctx, progress=False)
    load_s = time.perf_counter() - start
    info = ih.model_info(model)
    device = str(model_device(model))
    sync = synchronizer(device)
    plan = plan_evaluation(model, "mmlu", subjects=args.subjects, limit=args.limit, num_fewshot=args.num_fewshot)
    if len(plan.requests) < args.n:
        raise SystemExit(f"only {len(plan.requests)} MMLU questions in --subjects/--limit; lower --n")
    inputs = plan.inputs[: args.n]  # MMLU: one forward input per question, in question order
    sync()
    start = time.perf_counter()
    hs = ih.record_scores(model, inputs, list(AGREEMENT_SCORES), batch_size=args.batch_size, progress=False)
    sync()
    record_s = time.perf_counter() - start
    n_tokens = sum(len(x) for x in inputs)

    eval_plan = _first_questions(plan, args.eval_n)
    plain = evaluate(model, eval_plan, batch_size=args.batch_size, progress=False)
    tau = calibrate(hs["ahon_ln"], "ahon_ln", [P]).at(P)
    sync()
    start = time.perf_counter()
    ablated = evaluate(model, eval_plan, ablation=ih.DynamicAblation("ahon_ln", tau),
                       batch_size=args.batch_size, progress=False)
    sync()
    eval_s = time.perf_counter() - start
    peak, peak_kind = _peak_memory_mb(device)
    out = {
        "dtype": info.dtype,
        "device": device,
        "backend": info.backend,
        "load_s": round(load_s, 2),
        "n_prompts": len(inputs),
        "n_tokens": n_tokens,
        "record_tokens_per_s": round(n_tokens / record_s, 1),
        "ablated_eval_tokens_per_s": round(sum(len(x) for x in eval_plan.inputs) / eval_s, 1),
        "peak_memory_mb": round(peak, 1),
        "peak_memory_kind": peak_kind,
        "eval_n": plain.n,
        "accuracy": round(plain.accuracy, 4),
        "accuracy_stderr": round(_stderr(plain.accuracy, plain.n), 4),
        "ablation": f"ahon_ln < {tau:.6g} (p = {P:g})",
        "accuracy_ablated": round(ablated.accuracy, 4),
        "realized_fraction": round(ablated.realized_fraction, 5),
    }
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"figures": out, "scores": {k: hs[k] for k in AGREEMENT_SCORES}}


def paper_model(args) -> str | None:
    """The paper's name of ``--model`` (``--paper-model``, else a release name whose last part is the
    model directory's name, e.g. /models/Llama-3.1-8B), or None: the paper released no thresholds for it."""
    from inactive_heads.scoring.calibration import official_models

    known = official_models("mmlu")
    wanted = (args.paper_model or Path(args.model.rstrip("/")).name).replace("/", "_")
    for name in known:
        if wanted in (name, name.split("_", 1)[1]):
            return name
    if args.paper_model:
        raise SystemExit(f"gpu_check: error: the paper released no MMLU thresholds for {args.paper_model!r}; "
                         f"known: {', '.join(known)}")
    return None


def paper_row_lines(records, thresholds_paper) -> tuple[list[str], list[dict]]:
    """One line (and one dict) per run of the paper row: accuracy % [95 % interval], realized % zeroed,
    τ calibrated here and the paper's released τ for the model (where the package has it)."""
    from inactive_heads.analysis.bootstrap import accuracy_interval

    rows = []
    for rid, rec in sorted(records.items(), key=lambda kv: (kv[1]["score"] or "", kv[1]["p"] or 0)):
        ci = accuracy_interval(rec["correct"])
        paper = None if rec["score"] is None or thresholds_paper is None else thresholds_paper[rec["score"]].at(rec["p"])
        rows.append({"run": rid, "accuracy_pct": round(ci.estimate, 2), "low": round(ci.low, 2),
                     "high": round(ci.high, 2), "realized_pct": round(rec["realized_percent"], 2),
                     "tau": rec["threshold"], "tau_paper": paper, "n": rec["n"]})
    lines = [f"{'run':<18} {'accuracy % [95 % CI]':>24} {'zeroed %':>9} {'tau here':>10} {'tau paper':>10}"]
    for r in rows:
        tau = "-" if r["tau"] is None else f"{r['tau']:.4g}"
        paper = "-" if r["tau_paper"] is None else f"{r['tau_paper']:.4g}"
        lines.append(f"{r['run']:<18} {r['accuracy_pct']:>8.2f} [{r['low']:6.2f}, {r['high']:6.2f}] "
                     f"{r['realized_pct']:>9.2f} {tau:>10} {paper:>10}")
    return lines, rows


def paper_row(args, dtype) -> dict:
    """AHON (LN) and AWFT at the paper's 7 quantiles on an MMLU subset (a sweep), beside the paper's
    figures the package has (its released thresholds), the measured questions/s, and the projected
    time of the paper's whole grid for this model (13 scores and Random at 7 quantiles, all of MMLU)."""
    import tempfile

    import inactive_heads as ih
    from inactive_heads.scoring.calibration import DEFAULT_QUANTILES, official_thresholds
    from inactive_heads.scoring.scores import PAPER_SCORES
    from inactive_heads.sweep.config import SweepConfig
    from inactive_heads.sweep.estimate import estimate_sweep
    from inactive_heads.sweep.run import run_sweep

    model = ih.load_model(args.model, backend=args.backend, dtype=dtype, device=args.device,
                          n_ctx=args.n_ctx, progress=False)
    info = ih.model_info(model)
    shared = dict(model=args.model, task="mmlu", num_fewshot=args.num_fewshot, batch_size=args.batch_size,
                  dtype=info.dtype, backend=info.backend, device=args.device, n_ctx=args.n_ctx)
    row = SweepConfig(subjects=args.subjects, limit=args.limit, scores=list(AGREEMENT_SCORES),
                      quantiles=list(DEFAULT_QUANTILES), include_random=False, **shared)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_check_paper_row_"))
    results = run_sweep(row, out, model=model, progress=False)
    name = paper_model(args)
    paper = {k: official_thresholds(name, "mmlu", k) for k in AGREEMENT_SCORES} if name else None
    records = {rid: rec.to_json() for rid, rec in results.records.items()}  # the JSON each run wrote
    lines, rows = paper_row_lines(records, paper)
    ran = [r for r in records.values() if "reused_from" not in r]
    questions_per_s = sum(r["n"] for r in ran) / sum(r["seconds"] for r in ran)
    grid = SweepConfig(subjects=args.grid_subjects, limit=args.grid_limit, scores=list(PAPER_SCORES),
                       quantiles=list(DEFAULT_QUANTILES), include_random=True, **shared)
    estimate = estimate_sweep(grid, model=model)
    print("\n".join(lines))
    print(f"paper: {'released thresholds of ' + name if name else 'no released thresholds for this model'}; "
          "the package holds no per-run accuracies of the paper, so none are shown")
    print(f"measured: {questions_per_s:.2f} questions/s over {len(ran)} passes; full grid "
          f"({len(grid.run_ids())} runs): {estimate.summary()}")
    return {"model": args.model, "dtype": info.dtype, "device": args.device, "folder": str(out),
            "paper_model": name, "paper_accuracies": None, "runs": rows,
            "questions_per_s": round(questions_per_s, 3), "grid_runs": len(grid.run_ids()),
            "grid_estimate": estimate.to_dict()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="built-in alias, local HF directory or hub name")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps (default: first GPU, else cpu)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    parser.add_argument("--backend", default="auto", choices=("auto", "hooked", "bridge"))
    parser.add_argument("--n-ctx", type=int, default=None)
    parser.add_argument("--n", type=int, default=64, help="MMLU prompts to record scores on (default 64)")
    parser.add_argument("--eval-n", type=int, default=40, help="questions to evaluate (default 40; ≤ --n)")
    parser.add_argument("--subjects", nargs="+", default=["anatomy", "astronomy", "marketing", "management"])
    parser.add_argument("--limit", type=int, default=16, help="questions per subject")
    parser.add_argument("--num-fewshot", type=int, default=None, help="default 5 (lm-eval's MMLU)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-agreement", action="store_true", help="skip the second precision")
    row = parser.add_argument_group("--paper-row: one row of the paper instead of the checks above")
    row.add_argument("--paper-row", action="store_true",
                     help="AHON (LN) and AWFT at the paper's 7 quantiles on --subjects/--limit of MMLU, beside the "
                     "paper's released thresholds, with questions/s and the projected time of the full grid")
    row.add_argument("--paper-model", default=None, help="the paper's name of the model (default: from --model)")
    row.add_argument("--grid-subjects", nargs="+", default=None, help="the projected grid's subjects (default all 57)")
    row.add_argument("--grid-limit", type=int, default=None, help="the projected grid's questions per subject")
    row.add_argument("--out", default=None, help="the paper row's sweep folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    if not 1 <= args.eval_n <= args.n:
        parser.error(f"--eval-n must be between 1 and --n ({args.n}), got {args.eval_n}")

    import torch

    from inactive_heads.models.devices import check_device_dtype

    try:
        args.device, first = check_device_dtype(args.device, args.dtype)  # before any weight is read
    except ValueError as exc:
        parser.exit(2, f"gpu_check: error: {exc}\n")
    print(f"gpu_check: {args.model} on {args.device}, {str(first).removeprefix('torch.')}", file=sys.stderr)
    if args.paper_row:
        print(json.dumps({**library_versions(), **paper_row(args, first)}))
        return 0
    primary = run_one(args, first)
    summary = {"model": args.model, **primary["figures"], "p": P}
    if not args.no_agreement:
        other = torch.float32 if first != torch.float32 else torch.bfloat16
        try:
            check_device_dtype(args.device, other)
        except ValueError as exc:
            summary["agreement_skipped"] = str(exc)
        else:
            second = run_one(args, other)
            by_dtype = {first: primary, other: second}
            bf = by_dtype.get(torch.bfloat16)
            fp = by_dtype.get(torch.float32)
            if bf is None or fp is None:  # float16 first: compare it with float32 instead
                bf, fp = primary, second
            summary["compared"] = f"{bf['figures']['dtype']} vs {fp['figures']['dtype']}"
            summary["flag_agreement"] = {k: flag_agreement(bf["scores"][k], fp["scores"][k], k) for k in AGREEMENT_SCORES}
            for name, run in (("low", bf), ("fp32", fp)):
                f = run["figures"]
                summary[f"accuracy_{name}"] = f["accuracy"]
                summary[f"accuracy_ablated_{name}"] = f["accuracy_ablated"]
                summary[f"realized_fraction_{name}"] = f["realized_fraction"]
            summary["second_run"] = second["figures"]
    print(json.dumps({**library_versions(), **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
