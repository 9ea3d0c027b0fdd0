"""What an ablation zeroed: counts of zeroed (sequence, layer, head) triples, per layer and per
sequence, gathered inside the forward passes (:class:`AblationStats`)."""

from dataclasses import dataclass, field

import torch
from jaxtyping import Bool
from torch import Tensor

from ..core.checks import check_int
from ..core.errors import NonFiniteError
from ..runtime.deferred import DeferredCopies


@dataclass
class AblationStats:
    """Counts of zeroed (sequence, layer, head) triples seen so far.

    During a forward pass the per-layer flags stay on the device they were computed on; they are
    brought to the host once per batch (at the next batch's first layer, or when these numbers
    are read through ``HeadAblation.stats``), so no layer waits for a device→host copy.
    """

    n_layers: int
    n_heads: int
    n_sequences: int = 0
    flagged_per_layer: Tensor = field(default=None)  # [layer], int64
    masks: dict[int, Bool[Tensor, "layer head"]] = field(default_factory=dict)
    # Flags not yet brought to the host: per layer, the flags and the non-finite-score flag in one
    # tensor, with (flags shape, score key).
    _pending: DeferredCopies = field(default_factory=DeferredCopies, repr=False)

    def __post_init__(self):
        check_int(self.n_layers, "n_layers")
        check_int(self.n_heads, "n_heads")
        if self.flagged_per_layer is None:
            self.flagged_per_layer = torch.zeros(self.n_layers, dtype=torch.long)

    def add(self, layer: int, sequence_ids: Tensor, flags: Bool[Tensor, "batch head"],
            nonfinite: Tensor | None = None, what: str = "", batch: int | None = None) -> None:
        """Record one layer's flags for a batch (token ``batch``, as in
        :attr:`LayerActivations.batch`; kept on the device until :meth:`flush`)."""
        if layer == 0:
            self.n_sequences += flags.shape[0]
        # flags and the non-finite flag join into one row at the flush, not here (a per-layer op)
        self._pending.add(layer, batch, sequence_ids, (flags, nonfinite), (tuple(flags.shape), what))

    def flush(self) -> None:
        """Bring pending flags to the host, one copy per batch; raise if a score was not finite."""
        for batch in self._pending.drain():
            for layer, bad, (_, what) in zip(batch.layers, batch.values[:, -1].tolist(), batch.extras):
                if bad:
                    raise NonFiniteError(
                        f"score '{what}' is not finite at layer {layer}; try dtype=torch.float32"
                    )
            host = batch.values[:, :-1].reshape(len(batch.layers), *batch.extras[0][0])  # [layer entry, batch, head]
            # out of place: the counts may have been made under torch.inference_mode() and read outside it
            self.flagged_per_layer = self.flagged_per_layer.index_add(
                0, torch.tensor(batch.layers), host.sum(dim=(1, 2))
            )
            for row, seq in enumerate(batch.sequence_ids.tolist()):
                mask = self.masks.get(seq)
                if mask is None:
                    mask = self.masks[seq] = torch.zeros((self.n_layers, self.n_heads), dtype=torch.bool)
                mask[batch.layers] = host[:, row]

    @property
    def realized_fraction(self) -> float:
        """Zeroed (sequence, layer, head) triples / all triples (the paper's "% of heads zeroed")."""
        self.flush()
        if self.n_sequences == 0:
            return 0.0
        return float(self.flagged_per_layer.sum()) / (self.n_sequences * self.n_layers * self.n_heads)

    @property
    def realized_fraction_per_layer(self) -> list[float]:
        self.flush()
        if self.n_sequences == 0:
            return [0.0] * self.n_layers
        return (self.flagged_per_layer.double() / (self.n_sequences * self.n_heads)).tolist()

    def flagged_mask(self, n: int | None = None) -> Bool[Tensor, "seq layer head"]:
        """Per-sequence flags, indexed by the sequence ids the forward passes used; ``n`` rows at
        least (sequences never seen, e.g. prompts that decided nothing, are all False)."""
        self.flush()
        n = max(max(self.masks, default=-1) + 1, n or 0)
        out = torch.zeros((n, self.n_layers, self.n_heads), dtype=torch.bool)
        for seq, mask in self.masks.items():
            out[seq] = mask
        return out
