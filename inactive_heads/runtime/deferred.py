"""Per-layer results of a forward pass, brought to the host in one copy per batch.

Scores and zeroing flags are computed on the model's device, layer by layer. Copying each to the
host where it is made would make every layer wait for the device; instead they wait here and are
copied together once per batch (when the next batch starts, or when someone reads them). The
recorder (:mod:`inactive_heads.scoring.recording`) and the ablation counts
(:mod:`inactive_heads.ablation.head_ablation`) both keep their per-layer results this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class HostBatch:
    """One batch's pending results, on the host: ``values[i]`` is layer ``layers[i]``'s tensor."""

    layers: list[int]
    sequence_ids: Tensor
    values: Tensor  # [entry, *payload shape], on the CPU
    extras: list[Any]


class DeferredCopies:
    """Tensors of one layer each, kept on their device until :meth:`drain` copies them in one go per batch.

    A batch is the run of entries added with one batch token (the forward pass's
    :attr:`~inactive_heads.runtime.activations.LayerActivations.batch`; None is a batch of its
    own); every entry of a batch has the same payload shape and dtype. A payload may also be a tuple of
    tensors (None for a part that is all zeros): each entry's parts are then flattened and joined,
    once per batch, into one row of ``values``.

    >>> buf = DeferredCopies()
    >>> ids = torch.tensor([4, 7])
    >>> for layer in range(3):
    ...     buf.add(layer, 17, ids, torch.full((2,), layer))
    >>> [(b.layers, b.values.tolist()) for b in buf.drain()]
    [([0, 1, 2], [[0, 0], [1, 1], [2, 2]])]
    >>> buf.drain()
    []
    """

    def __init__(self) -> None:
        # (batch token, its entries: (layer, sequence ids, value, extra))
        self._pending: list[tuple[int | None, list[tuple[int, Tensor, Any, Any]]]] = []

    def add(self, layer: int, batch: int | None, sequence_ids: Tensor,
            value: Tensor | tuple[Tensor | None, ...], extra: Any = None) -> None:
        """Keep ``value`` (layer ``layer`` of the batch whose token is ``batch``) until :meth:`drain`."""
        if batch is None or not self._pending or self._pending[-1][0] != batch:
            self._pending.append((batch, []))
        self._pending[-1][1].append((layer, sequence_ids, value, extra))

    def drain(self) -> list[HostBatch]:
        """Every pending batch on the host (one device→host copy each); nothing is pending after."""
        groups, self._pending = self._pending, []
        out = []
        for _, group in groups:
            values = _stacked([v for _, _, v, _ in group]).cpu()  # the one copy
            out.append(HostBatch([layer for layer, *_ in group], group[0][1], values, [e for *_, e in group]))
        return out


def _stacked(values: list) -> Tensor:
    """One batch's payloads stacked on the first one's device: ``[entry, ...]``, or for tuple
    payloads ``[entry, part sizes summed]`` (a None part is zeros, in the first part's dtype)."""
    if isinstance(values[0], Tensor):
        device = values[0].device
        return torch.stack([v.to(device) for v in values])
    first = values[0][0]
    columns = []
    for j in range(len(values[0])):
        like = next((v[j] for v in values if v[j] is not None), None)
        if like is None:
            columns.append(torch.zeros((len(values), 1), dtype=first.dtype, device=first.device))
            continue
        zero = torch.zeros_like(like, device=first.device)
        columns.append(torch.stack([(zero if v[j] is None else v[j].to(first.device)).reshape(-1)
                                    for v in values]).to(first.dtype))
    return torch.cat(columns, dim=1)
