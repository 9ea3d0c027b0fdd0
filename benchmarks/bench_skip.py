"""Held heads really skipped: measured prefill and decode speed and KV bytes, beside the FLOP model.

Steps, all in one run (inactive_heads.pruning.skipping; docs/skipping.md):

1. a static held set: ``--fraction`` of all heads by AHON (LN) (most often flagged at the matched
   quantile) on PIQA questions ``--calibration``, or ``--random-heads SEED``: a seeded random
   set of the same size (no scoring; for quick runs);
2. equality: logits of a left-padded batch whose rows hold different sets (the static set, and
   it with extra heads) against the zeroing simulation in the toolkit's fused form (within
   1e-4 × the largest |logit|, the fast forward's own tolerance; identical argmax; the distance
   to the model's own attention forward is printed too), and
   the generated tokens of the decode step below against the simulated prompt-held run;
3. prefill: ``T`` LAMBADA tokens (passages joined, cycled) at T = 512 and 2048 (8192 with
   ``--long``), one row, the skipping forward (cost rule ``auto``) against two dense forwards —
   the toolkit's fast form (``fast_attention``) and the skipping code with no head held —
   interleaved round after round, the fastest round of each counting; the ratio is against the
   faster dense one. The accountant's ``predicted_prefill_ratio`` beside it;
4. decode: ``--context`` prompt tokens, ``--new-tokens`` greedy tokens with the held set
   (``generate(..., decision="prompt", skip=True)``, its tokens against the simulated
   prompt-held run's); the decode steps alone timed (after an untimed prefill), skipped against
   the same code with nothing held and against the simulated cached decode (every head
   computed, held ones zeroed), best of ``--rounds``; the ratio is against the faster dense one,
   beside the accountant's two predictions: by FLOPs and by bytes read (what a decode bound by
   memory traffic saves); KV bytes measured from the cache tensors against the accountant.

``--random-weights SHAPE`` times a random-weight model of that shape instead of ``--model``'s
weights (``random_model.py``: a name from ``paper_model_shapes()`` such as
``meta-llama/Llama-3.1-8B``, or a Hugging Face directory whose ``config.json`` gives the shape),
with random token ids and a random held set (``--random-heads``, default seed 0): for a machine
real weights and data cannot reach. Speed and KV bytes do not depend on the weights' values; the
equality with the simulation is checked on those random weights.

The predictor fields (``predictor_precision``, ``predictor_recall``, ``predictor_cost_fraction``)
come from ``--predictor DIR``, a folder written by ``inactive-heads predict fit`` on which
``inactive-heads predict eval`` has run (its held-out figures, lookahead 0, and the probe's cost
at the prefill length of the ratios); null without it. The last line printed is one JSON object.

    python benchmarks/bench_skip.py --model smollm2-135m --threads 2
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clock import synchronizer, timed  # noqa: E402  (the benchmarks' one device-aware clock)

from inactive_heads.core.versions import library_versions


def predictor_fields(directory, model=None, seq_len: int = 2048):
    """The causal predictor's figures from a ``predict fit`` folder (or its ``lookahead-0`` folder):
    held-out precision and recall (mean over layers, and pooled over (sequence, layer, head)) of
    its lookahead-0 predictor, from the ``eval.json`` that ``predict eval`` wrote beside it, and
    the probe's cost as a fraction of one layer's multiply-adds at ``seq_len`` tokens (the FLOP
    model). Null, with a note, without ``--predictor``."""
    empty = {"predictor_precision": None, "predictor_recall": None, "predictor_cost_fraction": None}
    if directory is None:
        return {**empty, "predictor_note": "no --predictor given (a folder from inactive-heads predict fit, "
                                           "after predict eval)"}
    from pathlib import Path

    import inactive_heads as ih
    from inactive_heads.prediction.command import predictor_dirs

    dirs = {str(d.resolve()): d for d in predictor_dirs(directory)}
    chosen = next((d for d in dirs.values() if ih.Predictor.load(d).lookahead == 0), None)
    if chosen is None:
        return {**empty, "predictor_note": f"no lookahead-0 predictor in {directory}"}
    predictor = ih.Predictor.load(chosen)
    out = dict(empty)
    if model is not None:
        from inactive_heads.pruning.accountant import model_shape

        out["predictor_cost_fraction"] = predictor.cost_fraction(model_shape(model), seq_len)
    folder = Path(directory) if (Path(directory) / "eval.json").is_file() else chosen.parent
    report = folder / "eval.json"
    if not report.is_file():
        return {**out, "predictor_note": f"no {report}: run inactive-heads predict eval {folder} --limit N first"}
    entries = json.loads(report.read_text())["predictors"]  # keyed by the folder's path when evaluated
    entry = entries.get(str(chosen.resolve())) or next(
        (v for k, v in entries.items() if Path(k).name == chosen.name), None)  # the folder moved since
    if entry is None:
        return {**out, "predictor_note": f"{report} does not hold {chosen}: run predict eval again"}
    held_out = entry["teacher_forced"]["summary"]
    return {**out, "predictor_precision": held_out["mean_precision"], "predictor_recall": held_out["mean_recall"],
            "predictor_micro_precision": held_out["micro_precision"],
            "predictor_micro_recall": held_out["micro_recall"],
            "predictor_heldout_sequences": held_out["n_sequences"],
            "predictor_note": f"{chosen}: held-out figures from {report} (teacher-forced; mean over layers and "
                              "pooled); cost at the prefill length of the ratios"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="built-in alias or Hugging Face directory (default smollm2-135m)")
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--score", default="ahon_ln")
    parser.add_argument("--calibration", type=int, nargs=2, default=[200, 240], metavar=("FIRST", "END"))
    parser.add_argument("--random-heads", type=int, default=None, metavar="SEED",
                        help="a seeded random held set of the same size instead of scoring (quick runs)")
    parser.add_argument("--long", action="store_true", help="also T = 8192 (slow on a CPU)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="prefill lengths instead of 512 2048 (the JSON's ratios are at 2048 when it is among them)")
    parser.add_argument("--context", type=int, default=1024, help="decode prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1, ... (default: the toolkit's choice, a GPU when there is one)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the model's dtype; the equality verdict is given in float32 only")
    parser.add_argument("--predictor", default=None, metavar="DIR",
                        help="a predict fit folder, after predict eval: its held-out precision/recall and cost")
    parser.add_argument("--random-weights", default=None, metavar="SHAPE",
                        help="a random-weight model of SHAPE instead of --model's weights (a name from "
                             "paper_model_shapes(), or a Hugging Face directory: its config), random token ids")
    parser.add_argument("--layers", type=int, default=None,
                        help="with --random-weights: its first N layers only (a smaller model of the same width)")
    args = parser.parse_args()
    if args.layers is not None and args.random_weights is None:
        parser.error("--layers applies to --random-weights; drop it or add --random-weights SHAPE")
    if args.random_weights is not None:
        if args.model is not None:
            parser.error(f"--model {args.model} and --random-weights {args.random_weights}: give one (random "
                         "weights are built from the shape alone)")
        if args.predictor is not None:
            parser.error("--predictor reads a predictor of real weights; drop it with --random-weights")
        if args.random_heads is None:
            args.random_heads = 0
        import tempfile

        from random_model import random_model_dir

        with tempfile.TemporaryDirectory(prefix="bench-skip-random-") as directory:
            random_model_dir(args.random_weights, directory, n_layers=args.layers, dtype=args.dtype)
            run(args, directory)
    else:
        args.model = args.model or "smollm2-135m"
        run(args, args.model)


def run(args, model_spec: str) -> None:
    import torch

    import inactive_heads as ih
    from inactive_heads.evaluation.decoding import HeldHeads
    from inactive_heads.evaluation.generation import generate
    from inactive_heads.evaluation.texts import lambada_passages
    from inactive_heads.models.tl_line import is_bridge
    from inactive_heads.pruning.skipping import skip_logits
    from inactive_heads.runtime.fast_attention import fast_attention
    from inactive_heads.runtime.hooks import installed, model_device

    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = ih.load_model(model_spec, dtype=args.dtype, device=args.device, progress=False)
    device = model_device(model)
    sync = synchronizer(device)
    info = ih.model_info(model)
    n_layers, n_heads = info.n_layers, info.n_heads
    n_pick = round(args.fraction * n_layers * n_heads)
    if args.random_heads is not None:
        gen = torch.Generator().manual_seed(args.random_heads)
        flat = torch.randperm(n_layers * n_heads, generator=gen)[:n_pick].tolist()
        heads = sorted((i // n_heads, i % n_heads) for i in flat)
        source = f"random (seed {args.random_heads})"
    else:
        first, end = args.calibration
        plan = ih.plan_evaluation(model, "piqa", limit=end)
        cal = [i for i, targets in enumerate(plan.targets) if first <= targets[0][0] < end]
        scores = ih.record_scores(model, [plan.inputs[i] for i in cal], [args.score], progress=False)
        heads = list(ih.static_heads(scores, args.score, args.fraction))
        source = f"{args.score} on PIQA questions {first}-{end - 1}"
    held = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for l, h in heads:
        held[l, h] = True
    print(f"held set: {len(heads)} of {n_layers * n_heads} heads ({100 * len(heads) / (n_layers * n_heads):.1f} %), "
          f"{source}")

    lengths = (args.lengths or [512, 2048]) + ([8192] if args.long else [])
    width = 256  # the equality batch's row length
    need = max(lengths + [args.context, 2 * width])
    if args.random_weights is None:
        stream = [t for p in lambada_passages(400, tokenizer=model.tokenizer) for t in p]
        stream = (stream * (need // len(stream) + 1))[:need]
    else:  # token ids past the tokenizer's three special ones, seeded
        stream = torch.randint(3, model.cfg.d_vocab, (need,),
                               generator=torch.Generator().manual_seed(1)).tolist()
    extra = {"use_cache": False} if is_bridge(model) else {}

    # 2. equality on a left-padded batch with two held sets
    gen = torch.Generator().manual_seed(0)
    rows = 2
    tokens = torch.tensor([stream[:width], stream[width:2 * width]], device=device)
    mask = torch.ones(rows, width, dtype=torch.long, device=device)
    mask[1, :40] = 0
    mixed = held[None].repeat(rows, 1, 1)
    mixed[1] |= torch.rand(n_layers, n_heads, generator=gen) < 0.1
    with torch.inference_mode():
        got = skip_logits(model, tokens, mask, held=mixed, rule="skip")
        zeroing = HeldHeads(model)
        zeroing.masks = mixed
        with installed(model, zeroing.hooks()):
            want_own = model(tokens, attention_mask=mask, **extra)  # the model's own attention
            with fast_attention(model):
                want = model(tokens, attention_mask=mask, **extra)  # the toolkit's fused form
    real = mask.bool()
    logits_diff = float((got - want)[real].abs().max())
    logits_diff_own = float((got - want_own)[real].abs().max())
    rounding_floor = float((want - want_own)[real].abs().max())  # the same simulation in two attention forms
    scale = float(want[real].abs().max())
    tolerance = 1e-4 * max(1.0, scale)  # as the fast forward's first-use check: relative to the largest logit
    exact_dtype = args.dtype == "float32"  # in 16-bit floats rounding alone moves logits by far more
    argmax_equal = bool(torch.equal(got[real].argmax(-1), want[real].argmax(-1)))
    print(f"skip vs zeroing simulation: max |logit diff| {logits_diff:.2e} (fused form), {logits_diff_own:.2e} "
          f"(the model's own attention), largest |logit| {scale:.1f}; argmax equal {argmax_equal}; the simulation "
          f"itself differs by {rounding_floor:.2e} between the fused form and the model's own attention")

    # 3. prefill
    prefill = {}
    with torch.inference_mode():
        for T in lengths:
            x = torch.tensor([stream[:T]], device=device)
            fns = {
                "dense_fast": lambda: _dense(model, x, extra, fast_attention),
                "dense_same_code": lambda: skip_logits(model, x, held=torch.zeros_like(held), rule="skip"),
                "skip": lambda: skip_logits(model, x, held=held, rule="auto"),
            }
            for fn in fns.values():
                fn()  # warm-up (and the skipping code's weight gathers)
            times = {k: [] for k in fns}
            for r in range(args.rounds):
                order = list(fns) if r % 2 == 0 else list(reversed(fns))
                for k in order:
                    times[k] += timed(fns[k], 1, sync)
            best = {k: min(v) for k, v in times.items()}
            dense = min(best["dense_fast"], best["dense_same_code"])
            predicted = ih.savings(model, heads, seq_len=T, dtype=args.dtype).predicted_prefill_ratio
            prefill[T] = {"tps": {k: round(T / v, 1) for k, v in best.items()},
                          "ratio": dense / best["skip"], "predicted": predicted}
            print(f"prefill T={T}: " + ", ".join(f"{k} {T / v:.0f} tok/s" for k, v in best.items())
                  + f"; skip/dense {dense / best['skip']:.3f} (predicted {predicted:.3f})")

    # 4. decode
    prompt = [stream[:args.context]]
    kw = dict(decision="prompt", progress=False, batch_size=1)
    ablation = ih.StaticAblation(heads)

    def run(max_new, **extra_kw):
        return generate(model, prompt, max_new_tokens=max_new, **kw, **extra_kw)

    outputs = {"skip": run(args.new_tokens, ablation=ablation, skip=True),
               "simulated": run(args.new_tokens, ablation=ablation)}
    decode_s = {name: min(decode_seconds(model, prompt[0], held if name != "dense_same_code" else None,
                                         name == "simulated", args.new_tokens, sync) for _ in range(args.rounds))
                for name in ("skip", "dense_same_code", "simulated")}
    n_dec = args.new_tokens - 1
    dense_decode = min(decode_s["dense_same_code"], decode_s["simulated"])
    tokens_equal = outputs["skip"].tokens == outputs["simulated"].tokens
    kv = outputs["skip"].skipping
    decode_savings = ih.savings(model, heads, seq_len=args.context + args.new_tokens // 2, dtype=args.dtype)
    decode_pred, decode_bytes_pred = decode_savings.predicted_decode_ratio, decode_savings.predicted_decode_bytes_ratio
    print(f"decode at {args.context} context, {args.new_tokens} new tokens: "
          + ", ".join(f"{k} {n_dec / v:.1f} tok/s" for k, v in decode_s.items())
          + f"; skip/dense {dense_decode / decode_s['skip']:.3f} (predicted {decode_pred:.3f} by FLOPs, "
          f"{decode_bytes_pred:.3f} by bytes read); tokens equal "
          f"{tokens_equal}; KV bytes measured {kv['kv_bytes_measured_end']} predicted {kv['kv_bytes_predicted_end']}; "
          f"whole KV groups held {100 * kv['kv_groups_held_fraction']:.1f} %")

    main_T = 2048 if 2048 in prefill else max(prefill)
    print(json.dumps({
        **library_versions(),
        "model": args.model if args.random_weights is None else f"random weights, shape {args.random_weights}"
                 + (f", first {args.layers} layers" if args.layers else ""),
        "device": str(device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "held_heads": len(heads),
        "held_fraction": len(heads) / (n_layers * n_heads),
        "held_source": source,
        "kv_groups_held_fraction": kv["kv_groups_held_fraction"],
        "rounds": args.rounds,
        "prefill": {str(T): v for T, v in prefill.items()},
        "prefill_ratio_at": main_T,
        "ratio_prefill_skip_vs_dense": round(prefill[main_T]["ratio"], 4),
        "predicted_prefill_ratio": round(prefill[main_T]["predicted"], 4),
        "ratio_prefill_measured_vs_predicted": round(prefill[main_T]["ratio"] / prefill[main_T]["predicted"], 4),
        "decode_context": args.context,
        "decode_new_tokens": args.new_tokens,
        "decode_tps": {k: round(n_dec / v, 2) for k, v in decode_s.items()},
        "ratio_decode_skip_vs_dense": round(dense_decode / decode_s["skip"], 4),
        "predicted_decode_ratio": round(decode_pred, 4),
        "predicted_decode_bytes_ratio": round(decode_bytes_pred, 4),
        "kv_bytes_measured": kv["kv_bytes_measured_end"],
        "kv_bytes_predicted": kv["kv_bytes_predicted_end"],
        "kv_bytes_measured_vs_predicted": kv["kv_bytes_measured_vs_predicted"],
        "skip_logits_max_abs_diff": logits_diff,
        "skip_logits_max_abs_diff_vs_own_attention": logits_diff_own,
        "simulation_fused_vs_own_max_abs_diff": rounding_floor,
        "skip_logits_tolerance": tolerance,
        "argmax_equal": argmax_equal,
        "tokens_equal": tokens_equal,
        "skip_equals_simulation": bool(logits_diff <= tolerance and argmax_equal and tokens_equal)
        if exact_dtype else None,
        **predictor_fields(args.predictor, model, main_T),
    }))


def decode_seconds(model, prompt, held, simulated: bool, new_tokens: int, sync=lambda: None) -> float:
    """Seconds of ``new_tokens - 1`` greedy decode steps after a prefill of ``prompt`` (not timed):
    skipped (``held``, or nothing held: None) or simulated (every head computed, ``held`` zeroed at
    hook_z), each with its cached decode."""
    from contextlib import ExitStack

    import torch

    from inactive_heads.evaluation.decoding import HeldHeads, left_padded
    from inactive_heads.pruning.skipping import skipping
    from inactive_heads.runtime.hooks import installed, model_device

    from inactive_heads.runtime.lines import line_of

    cached = line_of(model).cached_decoder(model)
    info_heads = (model.cfg.n_layers, model.cfg.n_heads)
    mask = held if held is not None else torch.zeros(info_heads, dtype=torch.bool)
    tokens, pad = left_padded([prompt], [0])
    device = model_device(model)
    tokens, pad = tokens.to(device), pad.to(device)
    with ExitStack() as stack:
        stack.enter_context(torch.inference_mode())
        if simulated:
            zeroing = HeldHeads(model)
            zeroing.masks = mask[None]
            stack.enter_context(installed(model, zeroing.hooks()))
            stack.enter_context(cached.forms(model))
        else:
            stack.enter_context(skipping(model, mask[None], rule="skip"))
        batch = cached(model, tokens, pad)
        nxt = batch.logits.argmax(dim=-1)
        sync()
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            nxt = batch.step(nxt).argmax(dim=-1)
        sync()
        return time.perf_counter() - start


def _dense(model, x, extra, fast_attention):
    with fast_attention(model):
        return model(x, **extra)


if __name__ == "__main__":
    main()
