"""A paper-size model end to end in one process: memory and time per stage, and its numerics.

One command per shape (random weights of that shape, written first by ``random_model.py`` in a
process of their own when ``--dir`` holds no model; docs/fullsize.md)::

    python benchmarks/bench_fullsize.py --shape meta-llama/Llama-3.1-8B --dir /work/big/llama8b
    python benchmarks/bench_fullsize.py --shape Qwen/Qwen2.5-14B --layers 20 --dir /work/big/qwen14b
    python benchmarks/bench_fullsize.py --shape allenai/OLMo-2-1124-7B --layers 24 --dir /work/big/olmo7b

Stages, in this order, in one process, in ``--dtype`` (bfloat16 by default) on the CPU:

1. ``load``: ``ih.load_model(dir)``;
2. ``scores``: the 13 scores of the paper on ``--n-seq`` random sequences of ``--seq-len`` tokens,
   and the AHON (LN) threshold at p = 10 % calibrated on them;
3. ``evaluate``: ``--questions`` questions in PIQA's format (a ``--question-tokens`` context, two
   answers of ``--answer-tokens`` and 4 more; random token ids, as text means nothing to random
   weights) with the dynamic AHON (LN) ablation at that threshold;
4. ``generate``: ``--new-tokens`` greedy tokens from a ``--prompt-len``-token prompt, the heads
   decided on the prompt and held, held heads skipped (``skip=True``; families without skipping
   zero them instead);
5. ``check``: numerics at full size: the toolkit's logits, and its logits under a dynamic
   ablation (AHON (LN) < 1: in every layer the heads below its mean), against the Hugging Face
   model class's own forward (built on the same weight tensors: no second copy) with the flagged
   heads zeroed by ``o_proj`` pre-hooks; the 13 scores against
   the loop-by-loop reference (``tests/reference_scores.py``) on one ``--check-len`` sequence;
6. ``export``: the pruned checkpoint without the static 10 % of heads by AHON (LN) (zeroed for
   families without a pruned class), written to ``--export`` (default ``<dir>-pruned``);
7. ``fp32``: the model is freed; the first ``--fp32-layers`` layers cut from the same weights in
   float32, and the same three checks there; then the rounding that bounds any bfloat16
   comparison, on that cut: Hugging Face's bfloat16 logits and the toolkit's (the cut loaded in
   bfloat16), each against Hugging Face's float32 logits. ``--fp32-only`` runs this stage alone.

Memory: before each stage the available memory, after it ``VmHWM`` (the process's resident
high-water mark so far, from /proc/self/status) and the stage's own peak (resident set sampled every 20 ms by a thread). Both
as a ratio to the weights' bytes (the safetensors files). ``uptime``'s load average is printed
beside the times: the CPU is shared. Major page faults per stage say whether weight pages were
read back from disk (memory-mapped weights are evictable: where the machine has less memory
available than the weights, the resident figures are bounded by it, and the faults show it).
The last line printed is one JSON object.
"""

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent / "tests"))  # reference_scores.py

from inactive_heads.core.versions import library_versions  # noqa: E402

P = 0.10
SCORE = "ahon_ln"


class Memory:
    """Resident memory per stage: a sampling thread's peak, and VmHWM after the stage."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self.process = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def available(self) -> int:
        import psutil

        return int(psutil.virtual_memory().available)

    def reset(self) -> None:
        self.peak = self.process.memory_info().rss

    @staticmethod
    def hwm() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


def weight_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def load_average() -> float:
    return os.getloadavg()[0]


def hf_twin(model):
    """The Hugging Face model class of a ``TransformerBridge``, built on the meta device and given
    the bridge's own weight tensors (no copy): Hugging Face's forward, not the bridge's components
    (the bridge replaces the attention modules inside ``model.original_model``). For a
    ``HookedTransformer`` (TransformerLens 3.9), the Hugging Face model loaded from its folder."""
    import torch
    from transformers import AutoModelForCausalLM

    import inactive_heads as ih
    from inactive_heads.models.tl_line import is_bridge

    if not is_bridge(model):  # a HookedTransformer holds converted copies: HF's model is read again
        info = ih.model_info(model)
        return AutoModelForCausalLM.from_pretrained(info.source, dtype=getattr(torch, info.dtype),
                                                    attn_implementation="eager").eval()
    wrapped = model.original_model
    state = {n.replace("._original_component", ""): p for n, p in wrapped.named_parameters()}
    config = wrapped.config
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=wrapped.dtype)
    # tensors the bridge adds (TransformerLens 3.9 gives OLMo-2's LM head a bias) must be zeros
    own = set(twin.state_dict())
    added = {n: t for n, t in state.items() if n not in own}
    if any(t.count_nonzero() for t in added.values()):
        raise RuntimeError(f"the bridge holds non-zero tensors Hugging Face's model has not: {sorted(added)}")
    state = {n: t for n, t in state.items() if n not in added}
    missing, unexpected = twin.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"weights do not fit {type(twin).__name__}: missing {missing}, unexpected {unexpected}")
    if tied:
        twin.tie_weights()
    rotary = twin.model.rotary_emb
    twin.model.rotary_emb = type(rotary)(config=config)  # its buffers, computed on the CPU
    left = [n for n, t in [*twin.named_parameters(), *twin.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"tensors left on the meta device: {left[:4]}")
    return twin.eval()


def zeroed_at_o_proj(hf, mask, d_head: int, tokens):
    """Hugging Face logits with each flagged head's slice of the ``o_proj`` input set to 0."""
    import torch

    handles = []
    for layer, block in enumerate(hf.model.layers):
        heads = mask[layer].nonzero().flatten().tolist()

        def pre_hook(module, args, heads=heads):
            x = args[0].clone()
            for h in heads:
                x[..., h * d_head:(h + 1) * d_head] = 0.0
            return (x, *args[1:])

        handles.append(block.self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        with torch.inference_mode():
            return hf(tokens).logits
    finally:
        for handle in handles:
            handle.remove()


def differences(scale: float, **pairs) -> dict:
    """``NAME_max_abs_diff`` and ``NAME_rel_diff`` (over ``scale``, the reference's largest |logit|)
    for each ``NAME=(ours, reference)``."""
    out = {}
    for name, (a, b) in pairs.items():
        out[f"{name}_max_abs_diff"] = (a - b).abs().max().item()
        out[f"{name}_rel_diff"] = out[f"{name}_max_abs_diff"] / scale
    return out


def numerics(model, tokens) -> dict:
    """The toolkit against Hugging Face's forward on the same weights: plain logits, logits under
    a dynamic ablation (AHON (LN) below 1: each layer's heads whose output norm is below the
    layer's mean, so every layer zeroes some; HF: ``o_proj`` pre-hooks zeroing the same heads),
    and the 13 scores against the loop-by-loop reference on one sequence."""
    import torch

    import inactive_heads as ih
    from reference_scores import reference_scores

    hf = hf_twin(model)
    info = ih.model_info(model)
    with torch.inference_mode():
        ours = model(tokens).float()
        theirs = hf(tokens).logits.float()
    ablation = ih.DynamicAblation(SCORE, 1.0)
    with torch.inference_mode(), ablation.apply(model):
        ours_ablated = model(tokens).float()
    mask = ablation.stats.flagged_mask()[0]
    theirs_ablated = zeroed_at_o_proj(hf, mask, info.d_head, tokens).float()
    scale = theirs.abs().max().item()
    seq = tokens[0].tolist()
    reference = reference_scores(model, [seq])
    recorded = ih.record_scores(model, [seq], list(ih.PAPER_SCORES), batch_size=1, progress=False)
    score_rel = max(((recorded[k] - reference[k]).abs() / reference[k].abs().clamp_min(1e-6)).max().item()
                    for k in ih.PAPER_SCORES)
    score_abs = max((recorded[k] - reference[k]).abs().max().item() for k in ih.PAPER_SCORES)
    del hf
    return {
        **differences(scale, logits=(ours, theirs), ablated_logits=(ours_ablated, theirs_ablated)),
        "logits_max_abs": scale,
        "argmax_equal": bool(torch.equal(ours.argmax(-1), theirs.argmax(-1))),
        "ablated_heads": int(mask.sum()),
        "ablated_changed_logits_by": (theirs_ablated - theirs).abs().max().item(),
        "scores_max_abs_diff": score_abs,
        "scores_max_rel_diff": score_rel,
    }


def cut_layers(src: Path, out: Path, n_layers: int, dtype: str) -> Path:
    """The first ``n_layers`` layers of ``src`` (embeddings, final norm and LM head kept), cast
    to ``dtype``, written one tensor at a time."""
    import torch

    from inactive_heads.models.loading import read_hf_config
    from inactive_heads.core.tensor_files import CheckpointReader, write_checkpoint

    target = getattr(torch, dtype)

    def keep(name, tensor):
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and int(parts[2]) >= n_layers:
            return []
        return [(name, tensor.to(target))]

    out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(CheckpointReader(src), keep, out)
    config = read_hf_config(src)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    config.dtype = target
    config.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def random_sequences(n: int, length: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """Token ids past the word-list tokenizer's three special ones, seeded."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


def piqa_format_plan(model, n: int, context: int, answers: tuple[int, int], seed: int = 4):
    """``n`` questions in PIQA's format (one context, two answers, one gold) of random token ids:
    ``context`` tokens, answers of ``answers`` tokens (text means nothing to random weights)."""
    import torch

    import inactive_heads as ih
    from inactive_heads.evaluation.plan import index_forward_inputs
    from inactive_heads.evaluation.tasks import Choice, Request

    gen = torch.Generator().manual_seed(seed)
    vocab = model.cfg.d_vocab

    def ids(k: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, vocab, (k,), generator=gen).tolist())

    requests = []
    for q in range(n):
        ctx = ids(context)
        choices = tuple(Choice(ctx, ids(k), f"answer {c}") for c, k in enumerate(answers))
        requests.append(Request("piqa", q, None, choices, q % 2, f"question {q}"))
    inputs, targets, cut = index_forward_inputs("piqa", requests, ih.model_info(model).n_ctx)
    return ih.EvalPlan("piqa", requests, inputs, targets, {"task": "piqa", "random_tokens": True}, n_truncated=cut)


class Stages:
    """Runs named stages, recording seconds, the stage's sampled peak and VmHWM after it."""

    def __init__(self, weights: int):
        self.memory = Memory()
        self.weights = weights
        self.rows: dict[str, dict] = {}

    def run(self, name: str, fn):
        gc.collect()
        print(f"{name}: start, {self.memory.available() / 2**30:.1f} GiB available", file=sys.stderr, flush=True)
        self.memory.reset()
        load = load_average()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
        peak, hwm = max(self.memory.peak, self.memory.process.memory_info().rss), Memory.hwm()
        self.rows[name] = {"seconds": round(seconds, 2), "peak_rss": peak, "peak_ratio": round(peak / self.weights, 3),
                           "vmhwm": hwm, "vmhwm_ratio": round(hwm / self.weights, 3),
                           "load_average": round((load + load_average()) / 2, 2), "major_faults": faults,
                           "mem_available_after": self.memory.available()}
        print(f"{name:9s} {seconds:8.1f} s  stage peak {peak / 2**30:6.2f} GiB ({peak / self.weights:.3f}x)  "
              f"VmHWM {hwm / 2**30:6.2f} GiB ({hwm / self.weights:.3f}x)  load {self.rows[name]['load_average']}  "
              f"major faults {faults}  available {self.rows[name]['mem_available_after'] / 2**30:.1f} GiB",
              flush=True)
        return out


def pipeline(args, stages: Stages, directory: Path) -> dict:
    """Stages 1-6 on the model in ``directory``; returns the figures that are not per stage."""
    import torch

    import inactive_heads as ih
    from inactive_heads.pruning.export import PRUNED_CLASSES
    from inactive_heads.pruning.skipping import check_supported

    model = stages.run("load", lambda: ih.load_model(str(directory), dtype=args.dtype, device="cpu", progress=False))
    info = ih.model_info(model)
    vocab = model.cfg.d_vocab
    sequences = random_sequences(args.n_seq, args.seq_len, vocab)

    def scores():
        hs = ih.record_scores(model, sequences, list(ih.PAPER_SCORES), batch_size=1, progress=False)
        return hs, ih.calibrate(hs[SCORE], SCORE, [P]).at(P)

    hs, tau = stages.run("scores", scores)
    plan = piqa_format_plan(model, args.questions, args.question_tokens, (args.answer_tokens, args.answer_tokens + 4))
    result = stages.run("evaluate", lambda: ih.evaluate(model, plan, ablation=ih.DynamicAblation(SCORE, tau),
                                                          batch_size=1, progress=False))
    try:
        check_supported(model)
        skip = True
    except ih.UserError:
        skip = False  # a family held heads cannot be skipped in: zeroed instead
    prompt = random_sequences(1, args.prompt_len, vocab, seed=2)
    generated = stages.run("generate", lambda: ih.generate(
        model, prompt, ablation=ih.DynamicAblation(SCORE, tau), decision="prompt", skip=skip,
        max_new_tokens=args.new_tokens, batch_size=1, progress=False))
    check = random_sequences(1, args.check_len, vocab, seed=3)
    full = stages.run("check", lambda: numerics(model, torch.tensor(check)))
    heads = ih.static_heads(hs, SCORE, P)
    mode = "pruned" if info.extra["architecture"] in PRUNED_CLASSES else "zeroed"
    export = Path(args.export or f"{directory}-pruned")
    stages.run("export", lambda: ih.export_pruned(model, heads, export, mode=mode, overwrite=True))
    del model
    gc.collect()
    return {
        "n_layers": info.n_layers, "n_heads": info.n_heads, "n_kv_heads": info.n_kv_heads, "backend": info.backend,
        "tau": tau, "questions": result.n, "accuracy_ablated": result.accuracy,
        "realized_fraction": result.realized_fraction,
        "seconds_per_question": round(stages.rows["evaluate"]["seconds"] / max(result.n, 1), 2),
        "generated_tokens": len(generated.tokens[0]), "generation_skipped_heads": skip,
        "export_mode": mode, "export_heads": len(list(heads)), "export_dir": str(export),
        "export_bytes": weight_bytes(export), "numerics_full": full,
    }


def fp32_cut(args, directory: Path) -> dict:
    """The first layers in float32: the same checks; then the bfloat16 rounding that bounds any
    bfloat16 comparison, on the same cut and tokens: Hugging Face's bfloat16 forward and the
    toolkit's, each against Hugging Face's float32 forward, and against each other."""
    import torch

    import inactive_heads as ih

    cut = cut_layers(directory, Path(f"{directory}-fp32-cut"), args.fp32_layers, "float32")
    model = ih.load_model(str(cut), dtype="float32", device="cpu", progress=False)
    tokens = torch.tensor(random_sequences(1, args.check_len, model.cfg.d_vocab, seed=3))
    out = numerics(model, tokens)
    hf = hf_twin(model)
    with torch.inference_mode():
        fp32 = hf(tokens).logits
        hf.to(torch.bfloat16)  # the twin's own tensors are the model's: it is not used after this
        bf16 = hf(tokens).logits.float()
    del model, hf
    gc.collect()
    # the same weights in bfloat16 (the cut is their exact float32 image, so the cast back is exact)
    model = ih.load_model(str(cut), dtype="bfloat16", device="cpu", progress=False)
    with torch.inference_mode():
        ours = model(tokens).float()
    out.update(differences(fp32.abs().max().item(), hf_bf16_vs_fp32=(bf16, fp32),
                           ours_bf16_vs_fp32=(ours, fp32), ours_bf16_vs_hf_bf16=(ours, bf16)))
    out["ours_bf16_argmax_equal_hf_bf16"] = bool(torch.equal(ours.argmax(-1), bf16.argmax(-1)))
    out["fp32_layers"] = args.fp32_layers
    del model
    gc.collect()
    shutil.rmtree(cut)
    return out


def make_weights(args, directory: Path) -> None:
    """Random weights of ``--shape`` in ``directory``, written by another process (its memory is
    not this one's)."""
    cmd = [sys.executable, str(HERE / "random_model.py"), args.shape, str(directory), "--dtype", args.dtype]
    if args.layers is not None:
        cmd += ["--layers", str(args.layers)]
    print(f"writing random weights: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def table(stages: Stages, weights: int, figures: dict) -> None:
    print(f"\nweights {weights / 2**30:.2f} GiB ({weights} bytes)")
    print(f"{'stage':9s} {'seconds':>8s} {'peak GiB':>9s} {'peak/w':>7s} {'VmHWM GiB':>10s} {'HWM/w':>6s} {'load':>5s}")
    for name, r in stages.rows.items():
        print(f"{name:9s} {r['seconds']:8.1f} {r['peak_rss'] / 2**30:9.2f} {r['peak_ratio']:7.3f} "
              f"{r['vmhwm'] / 2**30:10.2f} {r['vmhwm_ratio']:6.3f} {r['load_average']:5.1f}")
    for where in ("numerics_full", "numerics_fp32"):
        n = figures.get(where) or {}
        if n:
            print(f"{where}: logits rel diff {n['logits_rel_diff']:.2e} (max |logit| {n['logits_max_abs']:.2f}), "
                  f"ablated rel diff {n['ablated_logits_rel_diff']:.2e} ({n['ablated_heads']} heads zeroed, "
                  f"changing logits by {n['ablated_changed_logits_by']:.2e}), scores max rel diff "
                  f"{n['scores_max_rel_diff']:.2e}")
        if "ours_bf16_vs_fp32_rel_diff" in n:
            print(f"bfloat16 on the {n['fp32_layers']}-layer cut, relative to HF's float32 logits: HF "
                  f"{n['hf_bf16_vs_fp32_rel_diff']:.2e}, toolkit {n['ours_bf16_vs_fp32_rel_diff']:.2e}, "
                  f"toolkit vs HF {n['ours_bf16_vs_hf_bf16_rel_diff']:.2e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="meta-llama/Llama-3.1-8B",
                        help="a name from paper_model_shapes() or a Hugging Face directory (its config)")
    parser.add_argument("--dir", required=True, help="the model folder (random weights are written there if absent)")
    parser.add_argument("--layers", type=int, default=None, help="with weights to write: the first N layers only")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--n-seq", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--question-tokens", type=int, default=32, help="context tokens of each question")
    parser.add_argument("--answer-tokens", type=int, default=24, help="tokens of the first answer (the second: 4 more)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--check-len", type=int, default=32, help="tokens of the numerics checks' sequence")
    parser.add_argument("--fp32-layers", type=int, default=2, help="layers of the float32 cut (0: none)")
    parser.add_argument("--fp32-only", action="store_true",
                        help="only the float32 cut's checks (stage 7), for weights already measured")
    parser.add_argument("--export", default=None, help="where the pruned checkpoint goes (default <dir>-pruned)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.fp32_only and not args.fp32_layers:
        parser.error("--fp32-only runs only the float32 cut, but --fp32-layers is 0; give it the layers to cut")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    directory = Path(args.dir)
    if not (directory / "config.json").is_file():
        make_weights(args, directory)
    weights = weight_bytes(directory)
    stages = Stages(weights)
    figures = {} if args.fp32_only else pipeline(args, stages, directory)
    if args.fp32_layers:
        figures["numerics_fp32"] = stages.run("fp32", lambda: fp32_cut(args, directory))
    stages.memory.stop.set()
    table(stages, weights, figures)
    # with --fp32-only no stage held the model: no peak of the pipeline to report
    peak = max((r["peak_rss"] for name, r in stages.rows.items() if name != "fp32"), default=None)
    print(json.dumps({**library_versions(), "shape": args.shape, "dir": str(directory), "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "weight_bytes": weights, "stages": stages.rows,
                      "peak_rss": peak, "peak_ratio": round(peak / weights, 3) if peak else None,
                      "vmhwm_ratio_end": round(Memory.hwm() / weights, 3), **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
