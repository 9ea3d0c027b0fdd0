"""Exact reuse of a shared prompt prefix: compute it once, run only the rest of each input.

All MMLU prompts of one subject start with the same few-shot examples (about 80 % of their
tokens). In a causal model the prefix's keys and values do not depend on what follows, so a
plain or statically ablated evaluation can run the prefix once per group and the remaining tokens
of each input against its cached keys and values — the same numbers up to float rounding.

Dynamic ablation decides per *whole sequence* (a score averages over all positions, and later
layers see earlier layers' decisions), so a cached prefix computed under other decisions is not
reusable as is; those runs recompute every input in full (see ``docs/gotchas.md``).
"""

from dataclasses import dataclass

import torch


@dataclass
class PrefixGroup:
    """Inputs (indices into ``EvalPlan.inputs``) that share their first ``length`` tokens."""

    tokens: list[int]
    members: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def group_by_prefix(
    inputs: list[list[int]], limits: list[int], *, min_length: int = 32, min_fraction: float = 0.5
) -> tuple[list[PrefixGroup], list[int]]:
    """Groups of inputs sharing a long prefix, and the inputs left alone.

    ``limits[i]`` is the most tokens of input ``i`` that may be shared (its first scored
    position, so every scored position is computed after the prefix). Inputs are sorted; a run of
    neighbours whose common prefix is at least ``max(min_length, min_fraction × median length)``
    forms a group, its prefix being the shortest of those common prefixes (capped by ``limits``).
    Groups of one input are not worth it and are left alone.
    """
    if not inputs:
        return [], []
    lengths = sorted(len(x) for x in inputs)
    threshold = max(min_length, int(min_fraction * lengths[len(lengths) // 2]))
    order = sorted(range(len(inputs)), key=lambda i: inputs[i])
    runs: list[list[int]] = [[order[0]]]
    shared: list[int] = [10**9]
    for prev, cur in zip(order, order[1:]):
        lcp = min(_common_prefix(inputs[prev], inputs[cur]), limits[prev], limits[cur])
        if lcp >= threshold:
            runs[-1].append(cur)
            shared[-1] = min(shared[-1], lcp)
        else:
            runs.append([cur])
            shared.append(10**9)
    groups, alone = [], []
    for members, length in zip(runs, shared):
        if len(members) < 2:
            alone.extend(members)
            continue
        groups.append(PrefixGroup(list(inputs[members[0]][:length]), sorted(members)))
    return groups, sorted(alone)


def supports_prefix_reuse(model, ablation) -> bool:
    """Plain or static runs of a rotary ``HookedTransformer`` (the fast attention path) can reuse."""
    from .ablation import StaticAblation
    from .fast_attention import supports_fast_attention

    if ablation is not None and type(ablation) is not StaticAblation:
        return False
    return supports_fast_attention(model) and model.cfg.positional_embedding_type == "rotary"


def prefix_tokens(group: PrefixGroup, device) -> torch.Tensor:
    return torch.tensor(group.tokens, dtype=torch.long, device=device)
