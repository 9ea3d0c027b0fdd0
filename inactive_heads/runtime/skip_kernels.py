"""The line-independent arithmetic of head skipping (:mod:`inactive_heads.pruning.skipping`):
one layer's weights packed for a kept set of heads, the projections, the attention over kept
heads and the output projection, and which keys each query sees. Each line's attention forward
(:mod:`inactive_heads.runtime.lines`) calls these on its own inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor


@dataclass
class Packed:
    """One layer's weights for one kept set: ``F.linear`` layouts over the kept heads only."""

    kept_q: Tensor  # [kept] query-head indices
    kept_kv: Tensor  # [kept_kv] KV-head indices some kept query head reads
    uniform: bool  # every kept KV head serves the same number of kept query heads, in order
    counts: tuple[int, ...]  # kept query heads per kept KV head
    d_head: int
    w_q: Tensor
    b_q: Tensor | None
    w_k: Tensor
    b_k: Tensor | None
    w_v: Tensor
    b_v: Tensor | None
    w_o: Tensor
    b_o: Tensor | None


def project(x: Float[Tensor, "batch pos d_model"], p: Packed):
    """Queries of the kept heads, keys and values of the kept KV heads: ``[batch, pos, head, d]``."""
    b, n = x.shape[:2]
    q = F.linear(x, p.w_q, p.b_q).view(b, n, len(p.kept_q), p.d_head)
    k = F.linear(x, p.w_k, p.b_k).view(b, n, len(p.kept_kv), p.d_head)
    v = F.linear(x, p.w_v, p.b_v).view(b, n, len(p.kept_kv), p.d_head)
    return q, k, v


def attend(q: Tensor, k: Tensor, v: Tensor, p: Packed, allowed: Tensor | None, scale: float) -> Tensor:
    """z ``[batch, pos, kept, d]`` of the kept query heads over their KV heads (``[batch, key, kv, d]``).
    Where the kept KV heads serve unequal numbers of kept query heads, one fused call per KV head
    (its query heads are consecutive: kept heads are sorted) instead of copying K and V per head."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype)
    n_q, n_kv = qh.shape[1], kh.shape[1]
    if n_q == 0:
        return q

    def sdpa(qs, ks, vs):
        return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, is_causal=allowed is None,
                                              scale=scale, enable_gqa=ks.shape[1] != qs.shape[1])

    if n_kv == n_q or p.uniform:
        z = sdpa(qh, kh, vh)
    else:
        parts, start = [], 0
        for j, count in enumerate(p.counts):
            parts.append(sdpa(qh[:, start:start + count], kh[:, j:j + 1], vh[:, j:j + 1]))
            start += count
        z = torch.cat(parts, dim=1)
    return z.transpose(1, 2)


def output(z: Tensor, p: Packed, zero: Tensor | None) -> Float[Tensor, "batch pos d_model"]:
    """``z`` (the held heads zeroed, in the dense mode) through the kept heads' ``W_O`` columns."""
    if zero is not None:
        z = z.masked_fill(zero.to(z.device)[:, None, :, None], 0.0)
    b, n = z.shape[:2]
    if z.shape[2] == 0:
        out = z.new_zeros((b, n, p.w_o.shape[0]))
        return out if p.b_o is None else out + p.b_o
    return F.linear(z.reshape(b, n, -1).to(p.w_o.dtype), p.w_o, p.b_o)


def seen_keys(mask: Tensor | None, n: int, n_keys: int, device) -> Tensor | None:
    """Which keys each query sees, ``[batch, 1, n, keys]`` (None: plain causal, no cache): causal
    from the cache's end, not padding; a query seeing nothing sees itself (no NaN)."""
    if n_keys == n and (mask is None or bool(mask.bool().all())):
        return None  # plain causal: the fused kernel's causal form (it skips the masked half)
    offset = n_keys - n
    causal = torch.ones(n, n_keys, dtype=torch.bool, device=device).tril(offset)
    allowed = causal[None, None] if mask is None else causal[None, None] & mask.bool()[:, None, None, :]
    return _self_if_empty(allowed, offset)


def seen_keys_from_4d(mask: Tensor | None, n: int, n_keys: int, device) -> Tensor | None:
    """The same from Hugging Face's 4-D mask (additive: 0 where seen; or boolean: True where seen)."""
    if mask is None:
        return seen_keys(None, n, n_keys, device)
    allowed = (mask if mask.dtype == torch.bool else mask == 0).to(device)[..., -n_keys:]
    if n_keys == n and bool((allowed == torch.ones(n, n, dtype=torch.bool, device=device).tril()).all()):
        return None  # plain causal: the fused kernel's causal form (it skips the masked half)
    return _self_if_empty(allowed, n_keys - n)


def _self_if_empty(allowed: Tensor, offset: int) -> Tensor:
    n, n_keys = allowed.shape[-2], allowed.shape[-1]
    empty = ~allowed.any(dim=-1, keepdim=True)
    if not bool(empty.any()):
        return allowed
    diagonal = torch.zeros(n, n_keys, dtype=torch.bool, device=allowed.device)
    diagonal[torch.arange(n), torch.arange(n) + offset] = True
    return allowed | (empty & diagonal)
