"""TransformerLens's gated MLP without its per-call weight copies, and the forward swap both the
attention forms and the decoders use.

TransformerLens's ``GatedMLP`` copies each weight transposed on every call (to match Hugging Face's
bf16 rounding). Two replacements, each with the same hooks:

- :func:`fused_forward` uses the weights in place (``x @ W``); it runs with the fused attention
  kernel (:func:`~inactive_heads.runtime.fast_attention.fast_attention`), whose numbers are within
  float rounding anyway.
- :func:`exact_forward` makes the same ``F.linear`` calls on the same contiguous transposed
  weights, each transpose made once per weight: TransformerLens's arithmetic to the bit.

Which MLPs are TransformerLens's plain ``GatedMLP`` is the line adapter's question
(:meth:`~inactive_heads.runtime.lines.base.ModelLine.plain_gated_mlp`; none on a bridge).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import MethodType

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from .activations import keeps_transposes, transposed_weight
from .lines.base import line_of


@contextmanager
def swapped_forwards(forwards: dict):
    """Each module's forward replaced by the given one inside the block, restored after it."""
    # object.__setattr__: a bridge component would hand ``forward`` on to the module it wraps.
    previous = {module: module.__dict__.get("forward") for module in forwards}
    try:
        for module, forward in forwards.items():
            object.__setattr__(module, "forward", forward)
        yield
    finally:
        for module, prev in previous.items():
            if prev is None:
                module.__dict__.pop("forward", None)
            else:
                object.__setattr__(module, "forward", prev)


def fused_forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    """TransformerLens's gated MLP (same hooks) with its weights used in place: the transposed
    copies cost ~7 % of a forward on CPU."""
    if self.W_gate.device != x.device:
        x = x.to(self.W_gate.device)
    pre_act = self.hook_pre(x @ self.W_gate)
    pre_linear = self.hook_pre_linear(x @ self.W_in)
    post_act = self.hook_post((self.act_fn(pre_act) * pre_linear) + self.b_in)
    return torch.addmm(self.b_out, post_act.reshape(-1, post_act.shape[-1]), self.W_out).view(
        *post_act.shape[:-1], self.W_out.shape[-1])


def exact_forward(self, x: Float[Tensor, "batch pos d_model"], **_: object) -> Float[Tensor, "batch pos d_model"]:
    """TransformerLens's gated MLP to the bit — the same hooks and the same ``F.linear`` calls on
    the same contiguous transposed weights — with each transpose made once per weight
    (:func:`~inactive_heads.runtime.activations.transposed_weight`) instead of on every call.
    Those copies were most of a decoding step: on 2 CPU cores, 2 GSM8K prompts × 32 new tokens of
    Qwen2.5-Coder-0.5B with a KV cache took 42 s instead of 76 s (one run). Only where
    :func:`~inactive_heads.runtime.activations.keeps_transposes` (CPU, gradients off; the copies
    then double the MLP weights' memory); elsewhere TransformerLens's forward runs."""
    if not keeps_transposes(self.W_gate) or x.device != self.W_gate.device:
        return type(self).forward(self, x)
    pre_act = self.hook_pre(F.linear(x, transposed_weight(self.W_gate)))
    pre_linear = self.hook_pre_linear(F.linear(x, transposed_weight(self.W_in)))
    post_act = self.hook_post((self.act_fn(pre_act) * pre_linear) + self.b_in)
    return F.linear(post_act, transposed_weight(self.W_out), self.b_out)


@contextmanager
def gated_mlps_without_copies(model):
    """Inside the block, ``model``'s plain gated MLPs run :func:`exact_forward`: TransformerLens's
    arithmetic to the bit, without its per-call transposed weight copies (for passes that run
    TransformerLens's own attention, e.g. with a KV cache)."""
    line = line_of(model)
    with swapped_forwards({block.mlp: MethodType(exact_forward, block.mlp)
                           for block in model.blocks if line.plain_gated_mlp(block.mlp)}):
        yield
