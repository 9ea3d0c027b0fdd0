"""One hook vocabulary for scoring and intervention: ``hook_v``, ``hook_pattern``, ``hook_z``.

:class:`HeadHookRunner` installs, on every attention layer, hooks that hold that layer's value
vectors and pattern until its ``hook_z`` fires, then hand one :class:`LayerActivations` to a
callback. The callback reduces them (recording) or returns a new ``z`` with heads zeroed
(ablation). Nothing outlives its layer, so memory does not grow with depth.

Also here: tokenization without special tokens, length-sorted right-padded batches, and the
forward call that works for ``HookedTransformer`` and ``TransformerBridge`` alike.
"""

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .fast_attention import attention_form
from .hook_registry import installed, read_only  # noqa: F401  (installed: the toolkit's way to add hooks)
from ..models.loading import model_info
from .activations import LayerActivations
from .lines.base import line_of
from ..core.errors import UserError, WrongTypeError

LayerCallback = Callable[[LayerActivations], Tensor | None]


def hook_name(layer: int, name: str) -> str:
    """``blocks.{layer}.attn.hook_{name}`` — the names both TransformerLens backends share."""
    return f"blocks.{layer}.attn.hook_{name}"


class StopForward(Exception):
    """Raised by the last needed hook to skip the rest of the network (no MLP, no logits)."""


_BATCH_TOKENS = itertools.count()


def new_batch_token() -> int:
    """A token no other forward pass has: per-layer results that carry the same one
    (:attr:`LayerActivations.batch`) belong to one batch and reach the host in one copy."""
    return next(_BATCH_TOKENS)


class HeadHookRunner:
    """Per-layer hooks that assemble :class:`LayerActivations` and pass them to ``on_layer``.

    The one place that builds the per-layer hook list (:meth:`fwd_hooks`) and the activations
    handed to scores and ablations (:meth:`activations`). ``reads`` says which of
    ``pattern``/``v``/``z``/``W_O`` to capture (``z`` is always seen, since the callback runs at
    ``hook_z``), and ``resid_pre`` the residual stream entering the layer (for an ablation that
    decides from it; no score reads it). If ``on_layer`` returns a tensor it replaces ``z``: that is how ablation zeroes
    heads before ``W_O``. For padded batches call :meth:`set_batch` before each forward; without
    it every position counts as real. A caller that feeds other tensors (a shared prefix joining
    its cached rows to each input's own) overrides :meth:`at_z` and builds its activations with
    :meth:`activations`.
    """

    def __init__(
        self,
        model,
        on_layer: LayerCallback | None,
        *,
        reads: Sequence[str] = ("pattern", "v", "z"),
        seed: int = 0,
        stop_after_last_layer: bool = False,
    ):
        self.model = model
        self.info = model_info(model)
        self.on_layer = on_layer
        self.reads = set(reads)
        self.seed = seed
        self.stop_after_last_layer = stop_after_last_layer
        self._valid: Tensor | None = None
        self._sequence_ids: Tensor | None = None
        self._held: dict[str, Tensor] = {}
        self._batch: int | None = None

    def set_batch(self, valid: Bool[Tensor, "batch pos"], sequence_ids: Int[Tensor, " batch"]) -> None:
        self._valid = valid
        self._sequence_ids = sequence_ids

    def fwd_hooks(self) -> list[tuple[str, Callable]]:
        """On every layer: hold ``hook_v`` / ``hook_pattern`` (what ``reads`` asks for, read-only)
        until that layer's ``hook_z`` fires, then call :meth:`at_z` with them."""
        hooks = []
        for layer in range(self.info.n_layers):
            if "resid_pre" in self.reads:
                hooks.append((f"blocks.{layer}.hook_resid_pre", self._hold("resid_pre")))
            for name in ("v", "pattern"):
                if name in self.reads:
                    hooks.append((hook_name(layer, name), self._hold(name)))
            hooks.append((hook_name(layer, "z"), self._at_z(layer)))
        return hooks

    def _hold(self, key: str):
        @read_only
        def hook(activation: Tensor, hook) -> None:
            self._held[key] = activation

        return hook

    def _at_z(self, layer: int):
        def hook(z: Tensor, hook) -> Tensor | None:
            held, self._held = self._held, {}
            return self.at_z(layer, z, held)

        return hook

    def at_z(self, layer: int, z: Float[Tensor, "batch pos head d_head"], held: dict[str, Tensor]) -> Tensor | None:
        """What runs at ``hook_z``: ``on_layer`` on this layer's activations; its result replaces ``z``.

        ``held`` has the layer's ``v`` and ``pattern`` (those ``reads`` names). Each forward pass
        (its layer 0) is a new batch token."""
        if layer == 0:
            self._batch = new_batch_token()
        valid, sequence_ids = self._valid, self._sequence_ids
        if valid is None:  # no batch given: an unpadded batch, rows numbered from 0
            valid = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
            sequence_ids = torch.arange(z.shape[0])
        acts = self.activations(layer, z, valid=valid, sequence_ids=sequence_ids,
                                pattern=held.get("pattern"), v=held.get("v"), batch=self._batch,
                                resid_pre=held.get("resid_pre"))
        new_z = self.on_layer(acts)
        if self.stop_after_last_layer and layer == self.info.n_layers - 1:
            raise StopForward
        return new_z

    def activations(self, layer: int, z: Float[Tensor, "batch pos head d_head"], *,
                    valid: Bool[Tensor, "batch pos"], sequence_ids: Int[Tensor, " batch"],
                    pattern: Tensor | None = None, v: Tensor | None = None,
                    batch: int | None = None, resid_pre: Tensor | None = None) -> LayerActivations:
        """The :class:`LayerActivations` of ``layer`` for these tensors (``W_O`` if ``reads`` has it),
        belonging to the batch ``batch`` (:func:`new_batch_token`)."""
        acts = LayerActivations(
            layer=layer,
            n_heads=self.info.n_heads,
            valid=valid.to(z.device),
            sequence_ids=sequence_ids,
            pattern=pattern,
            v_grouped=v,
            z=z,
            W_O=self.model.blocks[layer].attn.W_O if "W_O" in self.reads else None,
            seed=self.seed,
            resid_pre=resid_pre,
        )
        acts.batch = batch
        return acts


def zero_heads(z: Float[Tensor, "batch pos head d_head"], flags: Bool[Tensor, "batch head"]) -> Tensor:
    """``z`` with the flagged heads of each row set to 0: the one zeroing of the toolkit.

    ``masked_fill``, never a multiply by 0/1, so a NaN or inf in a zeroed head does not survive.

    >>> z = torch.tensor([[[[1.0], [float("nan")]]]])  # batch 1, pos 1, heads 2, d_head 1
    >>> zero_heads(z, torch.tensor([[False, True]])).flatten().tolist()
    [1.0, 0.0]
    """
    return z.masked_fill(flags.to(z.device)[:, None, :, None], 0.0)


def run_forward(model, tokens: Tensor, valid: Tensor, *, stop_early: bool = False,
                attention: str = "exact") -> Tensor | None:
    """Forward a right-padded batch with its attention mask; logits, or None if stopped early.

    A ``HookedTransformer`` runs with :func:`~inactive_heads.runtime.fast_attention.fast_attention`, by
    default in its exact form: the same operations as TransformerLens (the mask built once per
    forward, grouped heads without copies, query rows in blocks), so recorded scores (and the
    thresholds calibrated on them) do not move. ``attention="fast"`` uses the fused kernel where no
    score reads the pattern (as ``evaluate(..., attention="fast")`` does); ``"eager"``
    TransformerLens's own attention.
    """
    mask = valid.to(dtype=torch.long, device=tokens.device)
    try:
        with torch.inference_mode(), attention_form(model, attention):
            return model(tokens, attention_mask=mask)
    except StopForward:
        if not stop_early:
            raise
        return None


def unembed_at(model, resid: Float[Tensor, "batch pos d_model"], rows: Int[Tensor, " n"],
               positions: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
    """A model's logits from its last residual stream at (row, position) pairs only: the final
    norm and its line's unembedding
    (:meth:`~inactive_heads.runtime.lines.base.ModelLine.unembed`) run on those rows, not on the
    whole batch (then the soft cap of models that have one)."""
    x = resid[rows, positions][:, None, :]
    logits = line_of(model).unembed(model.unembed, model.ln_final(x))[:, 0, :]
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0)
    if cap and cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits


# ----------------------------------------------------------------------------------------------
# Tokenization and batching


def check_token_ids(ids: list, where: str, d_vocab: int) -> None:
    """Token ids (of ``where``: "input 3") are integers in [0, d_vocab): one line naming the first that is not."""
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) and not (
                isinstance(t, Tensor) and t.ndim == 0 and not t.is_floating_point()):
            raise WrongTypeError(f"{where} holds {t!r} ({type(t).__name__}); token ids are integers")
        if not 0 <= int(t) < d_vocab:
            raise UserError(f"{where} holds token id {int(t)}, outside the vocabulary 0..{d_vocab - 1}")


def tokenize(model, inputs: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
    """Strings → token ids without special tokens (no BOS); token-id lists are used as given."""
    if isinstance(inputs, str):
        raise WrongTypeError("inputs must be a list of strings or of token-id lists, not one string; wrap it: [text]")
    if isinstance(inputs, (bytes, dict)) or not isinstance(inputs, Iterable):
        raise WrongTypeError(f"inputs must be a list of strings or of token-id lists, got {type(inputs).__name__}")
    inputs = list(inputs)
    if not inputs:
        raise UserError("inputs is empty; pass at least one string or token-id list")
    info = model_info(model)
    out: list[list[int]] = []
    tokenizer = model.tokenizer
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            if tokenizer is None:
                raise UserError(f"input {i} is text but the model has no tokenizer; pass token-id lists, or load the "
                                "model with ih.load_model")
            ids = tokenizer(item, add_special_tokens=False)["input_ids"]
        elif isinstance(item, Tensor):
            ids = item.flatten().tolist()
        elif isinstance(item, (bytes, dict)) or not isinstance(item, Iterable):
            raise WrongTypeError(f"input {i} must be a string or a list of token ids, got {type(item).__name__}")
        else:
            ids = list(item)
        check_token_ids(ids, f"input {i}", model.cfg.d_vocab)
        if not ids:
            raise UserError(f"input {i} is empty after tokenization; remove it or give it text")
        out.append([int(t) for t in ids])
    n_ctx = info.n_ctx
    too_long = [i for i, ids in enumerate(out) if len(ids) > n_ctx]
    if too_long:
        i = too_long[0]
        raise UserError(
            f"input {i} has {len(out[i])} tokens, more than the model context {n_ctx}; truncate it"
        )
    return out


@dataclass
class Batch:
    """A right-padded batch: ``tokens``, ``valid`` (True at real positions) and original indices."""

    tokens: Int[Tensor, "batch pos"]
    valid: Bool[Tensor, "batch pos"]
    indices: Int[Tensor, " batch"]


def make_batches(
    sequences: Sequence[Sequence[int]], batch_size: int, *, pad_id: int = 0, device=None
) -> Iterator[Batch]:
    """Length-sorted (longest first) right-padded batches, like lm-eval; pads never reach real tokens."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in idx)
        tokens = torch.full((len(idx), width), pad_id, dtype=torch.long)
        valid = torch.zeros((len(idx), width), dtype=torch.bool)
        for row, i in enumerate(idx):
            n = len(sequences[i])
            tokens[row, :n] = torch.tensor(sequences[i], dtype=torch.long)
            valid[row, :n] = True
        yield Batch(tokens.to(device), valid.to(device), torch.tensor(idx, dtype=torch.long))


def model_device(model) -> torch.device:
    return next(model.parameters()).device
