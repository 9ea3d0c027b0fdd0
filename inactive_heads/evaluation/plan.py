"""A task's requests tokenized once: :class:`EvalPlan`, and the one planning step that groups
requests into forward inputs (:func:`index_forward_inputs`), shared by the built-in tasks, lm-eval
tasks and the lm-eval model type."""

from collections.abc import Sequence
from numbers import Integral
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import OutOfRangeError, UserError, WrongTypeError
from .tasks import Request


@dataclass
class EvalPlan:
    """Requests of one task, tokenized once, with their unique forward inputs.

    ``inputs[i]`` is a token list; ``targets[i]`` lists, for that input, the
    ``(request, choice, first position, continuation tokens)`` it scores. ``n_truncated`` counts
    the requests (questions) with at least one choice left-truncated to the model context.
    ``metrics`` are the metrics its task declares (``"acc"``, and ``"acc_norm"`` where the task has
    it: :func:`~inactive_heads.evaluation.registry.task_spec`); a result of the plan reports those.
    """

    task: str
    requests: list[Request]
    inputs: list[list[int]]
    targets: list[list[tuple[int, int, int, tuple[int, ...]]]]
    config: dict[str, Any]
    n_truncated: int = 0
    # A part of a larger plan (see :meth:`subset`): the global ids of its inputs and requests.
    sequence_ids: list[int] | None = None
    request_ids: list[int] | None = None
    metrics: tuple[str, ...] = ("acc",)

    def __post_init__(self):
        for name in ("requests", "inputs", "targets"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise WrongTypeError(f"{name} must be a list (build a plan with plan_evaluation), got "
                                     f"{type(getattr(self, name)).__name__}")
        if len(self.inputs) != len(self.targets):
            raise UserError(f"a plan has one targets entry per input; got {len(self.inputs)} inputs and "
                            f"{len(self.targets)} targets (build a plan with plan_evaluation)")
        if isinstance(self.metrics, str) or not isinstance(self.metrics, (tuple, list)):
            raise WrongTypeError(f"metrics must be a tuple such as ('acc', 'acc_norm'), got {self.metrics!r}")
        self.metrics = tuple(self.metrics)
        if not self.metrics or self.metrics[0] != "acc" or not set(self.metrics) <= {"acc", "acc_norm"}:
            raise UserError(f"a plan's metrics are 'acc', then optionally 'acc_norm'; got {self.metrics!r}")

    @property
    def n_requests(self) -> int:
        return len(self.requests)

    def global_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Sequence ids of ``inputs[indices]`` in the whole plan (the ids Random draws are seeded by)."""
        if self.sequence_ids is None:
            return indices
        return torch.tensor([self.sequence_ids[i] for i in indices.tolist()], dtype=torch.long)

    def subset(self, input_indices: Sequence[int]) -> "EvalPlan":
        """The plan restricted to some inputs (a shard), keeping their global sequence and request
        ids; requests are those the inputs score (a request may be split across shards)."""
        n = len(self.inputs)
        if isinstance(input_indices, (str, bytes)) or not hasattr(input_indices, "__iter__") or not all(
                isinstance(i, Integral) and not isinstance(i, bool) and 0 <= i < n for i in input_indices):
            raise OutOfRangeError(f"input_indices must be indices in 0..{n - 1} of the plan's inputs, got {input_indices!r}")
        requests, request_ids, where = [], [], {}
        targets = []
        for i in input_indices:
            mine = []
            for r, c, first, cont in self.targets[i]:
                if r not in where:
                    where[r] = len(requests)
                    requests.append(self.requests[r])
                    request_ids.append(r if self.request_ids is None else self.request_ids[r])
                mine.append((where[r], c, first, cont))
            targets.append(mine)
        ids = [i if self.sequence_ids is None else self.sequence_ids[i] for i in input_indices]
        return EvalPlan(self.task, requests, [self.inputs[i] for i in input_indices], targets, dict(self.config),
                        n_truncated=0, sequence_ids=ids, request_ids=request_ids, metrics=self.metrics)



def index_forward_inputs(
    task: str, requests: Sequence[Request], n_ctx: int, *, context_name: str = "the model context",
    fix: str = "load the model with a larger n_ctx",
) -> tuple[list[list[int]], list[list[tuple[int, int, int, tuple[int, ...]]]], int]:
    """The unique forward inputs of ``requests``, what each scores, and how many requests were cut.

    The one planning step of every log-likelihood evaluation: :func:`plan_evaluation`,
    :func:`~inactive_heads.evaluation.lm_eval_tasks.plan_lm_eval_task` and the ``inactive-heads``
    lm-eval model type. As lm-eval does, choices whose model input (context + continuation minus
    its last token, before truncation) is the same share one forward pass; an input longer than
    ``n_ctx`` keeps its last ``n_ctx`` tokens (the last ``n_ctx + 1`` of context + continuation,
    minus the last one). Returns ``(inputs, targets, n_truncated)`` with ``targets[i]`` =
    ``(request, choice, first position, continuation)``. ``context_name`` and ``fix`` word the
    error for an answer longer than ``n_ctx``.
    """
    index: dict[tuple[int, ...], int] = {}
    inputs: list[list[int]] = []
    targets: list[list[tuple[int, int, int, tuple[int, ...]]]] = []
    truncated: set[int] = set()
    for r, req in enumerate(requests):
        for c, choice in enumerate(req.choices):
            if not choice.context_ids or not choice.continuation_ids:
                raise UserError(f"{task} request {req.doc_id} choice {c} has an empty context or continuation")
            cont = tuple(choice.continuation_ids)
            if len(cont) > n_ctx:
                raise UserError(
                    f"{task} request {req.doc_id} choice {c} has a {len(cont)}-token answer, longer than "
                    f"{context_name} {n_ctx}; {fix}"
                )
            whole = tuple(choice.context_ids) + cont
            key = whole[:-1]
            i = index.get(key)
            if i is None:
                i = index[key] = len(inputs)
                # lm-eval 0.4.5: keep the last n_ctx + 1 tokens, feed all but the last one.
                inputs.append(list(whole[-(n_ctx + 1):][:-1]))
                targets.append([])
            if len(key) > n_ctx:
                truncated.add(r)
            targets[i].append((r, c, len(inputs[i]) - len(cont), cont))
    return inputs, targets, len(truncated)
