"""Attention arithmetic shared by the exact forms of a ``HookedTransformer``
(:mod:`~inactive_heads.runtime.fast_attention`) and of a ``TransformerBridge``
(:mod:`~inactive_heads.runtime.bridge_attention`): grouped KV heads without copies, and the
pattern computed a block of query rows at a time."""

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor


def grouped_scores(q: Float[Tensor, "batch head query d_head"], k: Float[Tensor, "batch kv_head key d_head"],
                   start: int, stop: int) -> Float[Tensor, "batch head rows key"]:
    """``q @ kᵀ`` of query rows ``start:stop`` per head, unscaled, the query heads of one KV head
    stacked along the rows (no copies of ``k``); query head ``h`` reads KV head ``h // (head / kv_head)``."""
    b, n_heads, _, d_head = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    m = stop - start
    qg = q[:, :, start:stop].reshape(b, n_kv, n_heads // n_kv * m, d_head)
    return (qg @ k.transpose(-1, -2).to(qg.dtype)).view(b, n_heads, m, n_keys)


def weighted(pattern: Float[Tensor, "batch head rows key"],
             v: Float[Tensor, "batch kv_head key d_head"]) -> Float[Tensor, "batch head rows d_head"]:
    """``pattern @ v`` per head, the query heads of one KV head stacked along the rows (no copies
    of ``v``); query head ``h`` reads KV head ``h // (head / kv_head)``."""
    b, n_heads, m, n_keys = pattern.shape
    n_kv, d_head = v.shape[1], v.shape[3]
    pattern = pattern.to(device=v.device, dtype=v.dtype)
    return (pattern.reshape(b, n_kv, n_heads // n_kv * m, n_keys) @ v).view(b, n_heads, m, d_head)


def in_row_blocks(pattern_rows: Callable[[int, int], Tensor], v: Tensor, n_heads: int, n_queries: int,
                  *, keep_pattern: bool, keep_z: bool, block_elements: int,
                  dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """The whole pattern ``[batch, head, query, key]`` (``keep_pattern``) and z ``[batch, head,
    query, d_head]`` (``keep_z``) from ``pattern_rows(start, stop)``, the pattern of query rows
    ``start:stop``, called on blocks of about ``block_elements`` score elements (so the scale,
    mask and softmax passes stay in cache; each row's numbers are unchanged by blocking)."""
    b, n_keys, d_head = v.shape[0], v.shape[2], v.shape[3]
    rows = max(1, block_elements // max(1, b * n_heads * n_keys))
    pattern = torch.empty((b, n_heads, n_queries, n_keys), dtype=dtype, device=v.device) if keep_pattern else None
    z = torch.empty((b, n_heads, n_queries, d_head), dtype=v.dtype, device=v.device) if keep_z else None
    for start in range(0, n_queries, rows):
        stop = min(n_queries, start + rows)
        block = pattern_rows(start, stop)
        if pattern is not None:
            pattern[:, :, start:stop] = block
        if z is not None:
            z[:, :, start:stop] = weighted(block, v)
    return pattern, z
