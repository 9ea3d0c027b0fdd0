"""``PredictedAblation``: zero, per sequence, the heads a saved :class:`Predictor` holds.

The decision for layer ``l`` reads only the residual stream entering layer ``l`` (lookahead 0) or
layer ``l - 1`` (lookahead 1; layer 0 reads its own), pooled per sequence — never anything the
heads of layer ``l`` compute — so it could be made before those heads run. Here (the simulation)
every head is still computed and the held ones are zeroed at ``hook_z``, as for the other kinds;
realized fractions are counted the same way.
"""

import os
from typing import Any

from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..ablation.head_ablation import HeadAblation, register_ablation
from ..core.checks import check_path
from ..pruning.skipping import check_group_fraction, group_level
from ..core.errors import UserError
from ..models.loading import model_info
from ..scoring.scores import LayerActivations
from .probe import Predictor, pooled_features


@register_ablation("predicted")
class PredictedAblation(HeadAblation):
    """Zero the heads the predictor saved in ``path`` holds for each sequence (spec:
    ``{"kind": "predicted", "path": DIR}``; ``path`` is stored absolute). ``digest``
    (:meth:`Predictor.digest`), when given, must be the saved predictor's: a spec that names it
    never runs a predictor fit again in the same folder.

    ``hold_groups=F`` applies the group-level rule (:func:`~inactive_heads.pruning.skipping.group_level`)
    to each decision: under grouped-query attention a KV group at least ``F`` of whose query heads
    are held is held whole, so its KV head can be freed (more heads zeroed than predicted)."""

    reads = ("z", "resid_pre")
    # The decision pools the whole sequence: inputs sharing a prefix decide differently on it.
    shares_prefix = False

    def __init__(self, path: "str | os.PathLike", hold_groups: float | None = None, digest: str | None = None):
        super().__init__()
        self.path = str(check_path(path, "PredictedAblation path").resolve())
        self.hold_groups = None if hold_groups is None else check_group_fraction(hold_groups,
                                                                                 "PredictedAblation hold_groups")
        self.predictor = Predictor.load(self.path)
        if digest is not None and digest != self.predictor.digest():
            raise UserError(f"the predictor in {self.path} is not the one this ablation names (digest "
                            f"{digest[:12]}..., the folder's is {self.predictor.digest()[:12]}...): it was fit "
                            "again; evaluate it afresh (predict eval --fresh) or restore the predictor")
        self.digest = digest
        self._previous: tuple[Any, int, Tensor] | None = None  # (batch token, layer, pooled features)
        self._n_kv_heads: int | None = None

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.hold_groups is not None:
            out["hold_groups"] = self.hold_groups
        if self.digest is not None:
            out["digest"] = self.digest
        return out

    @property
    def lookahead(self) -> int:
        return self.predictor.lookahead

    def reset(self, model) -> None:
        info = model_info(model)
        self.predictor.check_model(info.n_layers, info.n_heads, info.d_model, f"model {info.name!r}")
        self._previous = None
        self._n_kv_heads = info.n_kv_heads
        super().reset(model)

    def held_heads(self, layer: int, resid: Float[Tensor, "batch pos d_model"],
                   attention_mask: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch head"]:
        """The decider form (:class:`~inactive_heads.pruning.skipping.Decider`): the predictor's
        held heads of ``layer`` from the stream ``resid`` entering layer ``layer - lookahead``, with
        the group-level rule when ``hold_groups`` is set; :meth:`reset` first."""
        return self._grouped(self.predictor.held_heads(layer, resid, attention_mask))

    def decide(self, acts: LayerActivations) -> Bool[Tensor, "batch head"]:
        """The held heads of this layer, from the pooled stream entering it (lookahead 0) or
        entering the layer before (lookahead 1, kept from that layer's call in the same pass)."""
        if acts.resid_pre is None:
            raise UserError("PredictedAblation reads the residual stream entering each layer; run it through a hook "
                            "runner built with reads=ablation.reads")
        features = pooled_features(acts.resid_pre, acts.valid)
        use = features
        if self.lookahead == 1 and acts.layer > 0:
            previous = self._previous
            if previous is None or previous[0] != acts.batch or previous[1] != acts.layer - 1:
                raise UserError(f"PredictedAblation (lookahead 1) at layer {acts.layer} did not see layer "
                                f"{acts.layer - 1} of the same forward pass; layers must run in order")
            use = previous[2]
        self._previous = (acts.batch, acts.layer, features)
        return self._grouped(self.predictor.decide(acts.layer, use))

    def _grouped(self, held: Bool[Tensor, "batch head"]) -> Bool[Tensor, "batch head"]:
        return held if self.hold_groups is None else group_level(held, self._n_kv_heads, self.hold_groups)
