"""A fingerprint of the numbers the toolkit computes on a real model, to prove a change bit-identical.

Run it before and after a change (same machine, same libraries) and compare the two files:

    .venv/bin/python benchmarks/fingerprint.py --out before.json        # at the old commit
    .venv/bin/python benchmarks/fingerprint.py --out after.json         # at the new one
    .venv/bin/python benchmarks/fingerprint.py --compare before.json after.json

Both runs must use the same thread count (``--threads``, default 1): float sums in another order
give other bits. Each group is a SHA-256 of the exact bytes of its numbers (float32/float64 as stored, token ids as
int64), so two files agree only where every bit agrees; ``--compare`` lists the groups that
differ. The groups: the 13 scores and their thresholds at p = 0.1 and 0.3 on MMLU prompts; MMLU
(2 subjects) plain, AHON (LN), AWFT and Random, each with and without prefix reuse (log-likelihoods,
answers, realized fraction per layer); PIQA plain, AHON (LN) and Random; GSM8K generation in both
decision modes (tokens and realized fractions). The last line is JSON with the library versions.
"""

import argparse
import hashlib
import json
import sys
import warnings

import numpy as np

try:
    from inactive_heads.core.versions import library_versions
except ImportError:  # a commit older than core/versions.py, fingerprinted for comparison
    def library_versions() -> dict:
        from importlib.metadata import version

        return {f"{name.replace('-', '_')}_version": version(name) for name in ("transformer-lens", "torch")}


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.asarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:20]


def fingerprint(model_name: str, threads: int) -> dict[str, str]:
    import torch

    import inactive_heads as ih

    torch.set_num_threads(threads)  # another thread count sums in another order: other bits
    torch.manual_seed(0)
    model = ih.load_model(model_name, dtype="float32", progress=False)
    out: dict[str, str] = {}
    subjects = ["abstract_algebra", "anatomy"]
    plan = ih.plan_evaluation(model, "mmlu", subjects=subjects, limit=6)
    scores = ih.record_scores(model, plan.inputs, batch_size=4, progress=False)
    thresholds = {}
    for key in ih.score_keys():
        out[f"scores/{key}"] = digest(scores[key].numpy())
        t = ih.calibrate(scores, key, [0.1, 0.3])
        thresholds[key] = list(t.values)
        out[f"thresholds/{key}"] = digest(np.array(t.values, dtype=np.float64))

    def result_digest(res) -> str:
        lls = np.array([x for row in res.loglikelihoods for x in row], dtype=np.float64)
        return digest(lls, np.array(res.correct, dtype=np.int64),
                      np.array(res.realized_fraction_per_layer or [], dtype=np.float64))

    ablations = {
        "plain": None,
        "ahon_ln": ih.DynamicAblation("ahon_ln", thresholds["ahon_ln"][0]),
        "awft": ih.DynamicAblation("awft", thresholds["awft"][0]),
        "random": ih.RandomAblation(0.1),
    }
    for name, ablation in ablations.items():
        for reuse in (False, True):
            res = ih.evaluate(model, plan, ablation=ablation, batch_size=4, progress=False, reuse_prefix=reuse)
            out[f"mmlu/{name}/reuse={reuse}"] = result_digest(res)
    for name in ("plain", "ahon_ln", "random"):
        res = ih.evaluate(model, "piqa", limit=8, ablation=ablations[name], batch_size=4, progress=False)
        out[f"piqa/{name}"] = result_digest(res)
    for decision in ("per_step", "prompt"):
        res = ih.evaluate(model, "gsm8k", limit=2, ablation=ablations["ahon_ln"], decision=decision,
                          max_gen_toks=16, batch_size=2, progress=False)
        text = "\x00".join(res.generations).encode()
        out[f"gsm8k/{decision}"] = digest(np.frombuffer(text, dtype=np.uint8),
                                          np.array(res.n_generated_per_question, dtype=np.int64),
                                          np.array([res.realized_fraction, *res.realized_fraction_per_layer],
                                                   dtype=np.float64))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", help="write the fingerprint here (JSON)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (compare runs with the same)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprints")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.load(open(path))["groups"] for path in args.compare)
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for key in differ:
            print(f"differs: {key}")
        print(json.dumps({"groups": len(before), "differ": len(differ), "bit_identical": not differ}))
        return 1 if differ else 0
    warnings.filterwarnings("ignore")
    groups = fingerprint(args.model, args.threads)
    result = {**library_versions(), "model": args.model, "threads": args.threads, "groups": groups}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({**library_versions(), "model": args.model, "n_groups": len(groups)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
