"""A model of neither TransformerLens class (a user's own module with a ``cfg``): no attention
form, cache or layer stack of the toolkit's; whole forwards, sliced."""

from __future__ import annotations

from contextlib import nullcontext

from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..hooks import run_forward
from .base import register


class OtherLine:
    """The fallback of :func:`~inactive_heads.runtime.lines.base.line_of`."""

    name = "other"
    attention_forward = None
    skip_attention = None
    warns_when_unsupported = True

    def owns(self, model) -> bool:
        return False

    def attention_unsupported(self, model) -> str | None:
        return f"{type(model).__name__} is not a HookedTransformer"

    def plain_gated_mlp(self, mlp) -> bool:
        return False

    def unembed(self, unembed, x: Float[Tensor, "n 1 d_model"]) -> Float[Tensor, "n 1 vocab"]:
        return unembed(x)

    def logits_at(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                  rows: Int[Tensor, " n"], positions: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        return model(tokens, attention_mask=valid.long())[rows, positions]

    def last_logits(self, model, tokens: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"],
                    rows: Int[Tensor, " n"], last: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
        return run_forward(model, tokens, valid)[rows, last]

    def cached_decoder(self, model):
        return None

    def prefix_reuse_supported(self, model) -> bool:
        return False

    def layer_stack_unsupported(self, model) -> str | None:
        return f"{type(model).__name__} is not a TransformerBridge"

    def stack_embed(self, model, tokens, mask):
        raise RuntimeError(f"LayerStack: {self.layer_stack_unsupported(model)}")

    def stack_layer(self, stack, resid, layer, mask, prefix_length):
        raise RuntimeError(f"LayerStack: {self.layer_stack_unsupported(stack.model)}")

    def skip_unsupported(self, model) -> str | None:
        return f"it is a {type(model).__name__}, not a HookedTransformer or TransformerBridge"

    def skip_weights(self, model, layer: int):
        raise RuntimeError(f"head skipping: {self.skip_unsupported(model)}")

    def skip_cache_offset(self, model):
        return nullcontext()

    def skip_forward_kwargs(self) -> dict:
        return {}


OTHER = register(OtherLine(), fallback=True)
