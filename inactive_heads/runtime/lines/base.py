"""The interface every TransformerLens line implements, and the lookup of a model's line.

This module imports nothing else of the toolkit: every runtime module may ask :func:`line_of`, and
the adapters (:mod:`.hooked`, :mod:`.bridge`, :mod:`.other`) register themselves when the runtime
package is imported (``inactive_heads/runtime/__init__.py`` imports them first).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from jaxtyping import Bool, Float, Int
from torch import Tensor


@runtime_checkable
class ModelLine(Protocol):
    """What the toolkit needs to know or do differently on one TransformerLens model class.

    Every feature that differs between the lines is written once, against this interface; each
    adapter is the one place that knows its class. ``name`` is the backend name
    (``"hooked"``, ``"bridge"``, or ``"other"`` for a model of neither class)."""

    name: str
    # The forward the attention forms install on each attention module (None: none runs), and
    # whether a model outside the forms' allow-list gets a warning.
    attention_forward: Any
    warns_when_unsupported: bool
    # The attention forward head skipping installs: (module, state, layer, *args, **kwargs).
    skip_attention: Any

    def owns(self, model) -> bool:
        """True when ``model`` belongs to this line."""

    def attention_unsupported(self, model) -> str | None:
        """Why the toolkit's attention forms do not run on ``model`` (None: they do)."""

    def plain_gated_mlp(self, mlp) -> bool:
        """Whether ``mlp`` is TransformerLens's own gated MLP, which the forms replace."""

    def unembed(self, unembed, x: Float[Tensor, "n 1 d_model"]) -> Float[Tensor, "n 1 vocab"]:
        """The model's unembedding module applied to ``x``."""

    def logits_at(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                  rows: Int[Tensor, " n"], positions: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """Scoring's rule: logits at (row, position) pairs, in the caller's attention form."""

    def last_logits(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                    rows: Int[Tensor, " n"], last: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        """Uncached generation's rule: logits at each row's last real position, exact form."""

    def cached_decoder(self, model) -> Any:
        """The class that decodes left-padded batches with a KV cache on ``model`` (None: none)."""

    def prefix_reuse_supported(self, model) -> bool:
        """Whether a shared prefix's keys and values can be reused on ``model`` (forms aside)."""

    def layer_stack_unsupported(self, model) -> str | None:
        """Why ``model``'s layers cannot run one at a time (None: they can)."""

    def stack_embed(self, model, tokens: Int[Tensor, "batch pos"],
                    mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering layer 0."""

    def stack_layer(self, stack, resid: Float[Tensor, "batch pos d_model"], layer: int,
                    mask: Int[Tensor, "batch pos"], prefix_length: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream leaving ``layer`` (``stack``: the calling LayerStack)."""

    def skip_unsupported(self, model) -> str | None:
        """Why head skipping (:mod:`inactive_heads.pruning.skipping`) cannot run on ``model``."""

    def skip_weights(self, model, layer: int) -> dict[str, Tensor | None]:
        """A layer's projections per head: ``q [head, d_head, d_model]``, ``k``/``v [kv_head,
        d_head, d_model]``, biases ``[head or kv_head, d_head]`` (or None), ``o [d_model, head,
        d_head]``, ``b_o [d_model]`` (or None)."""

    def skip_cache_offset(self, model) -> Any:
        """A context manager: what the model's KV cache needs while skipping keeps only kept heads."""

    def skip_forward_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments of a skipping forward (no cache made)."""


_LINES: list[ModelLine] = []
_FALLBACK: list[ModelLine] = []


def register(line: ModelLine, *, fallback: bool = False) -> ModelLine:
    """Add ``line`` to the lines :func:`line_of` asks (in order), or make it the fallback."""
    (_FALLBACK if fallback else _LINES).append(line)
    return line


def line_of(model) -> ModelLine:
    """The line ``model`` belongs to: the first registered adapter that owns it, else the fallback
    (a model of neither class)."""
    for line in _LINES:
        if line.owns(model):
            return line
    return _FALLBACK[0]
