"""Exact reuse of a shared prompt prefix: compute it once, run only the rest of each input.

All MMLU prompts of one subject start with the same few-shot examples (about 80 % of their
tokens). In a causal model the prefix's activations do not depend on what follows it, only on the
heads zeroed while computing it. :class:`SharedPrefix` runs the inputs of one group (a
:class:`PrefixGroup`) layer by layer against a cache of the prefix:

- the prefix's state at layer ``l`` (its residual stream, rotated keys, values, attention output
  before zeroing, and pattern when a score reads it) is computed once per distinct *decision
  history*: the heads zeroed at layers ``0..l-1``. The cache is a tree: a node per (layer,
  history), a child per distinct set of heads zeroed at that layer;
- at every layer, each input's tokens after the prefix attend to its node's cached keys and
  values. The score functions see the whole sequence, exactly as without reuse: the hooks join the
  node's prefix rows with the input's own rows (values, outputs, and pattern rows padded with the
  zeros a causal mask gives), so every score — built-in or registered — runs unchanged;
- the input's decision at that layer (zero these heads for this sequence) then picks the child it
  continues from. While inputs decide alike they share one path; an input that decides otherwise
  gets its own branch, computed from that layer on from the cached attention output of the layer
  where it left (nothing before it is recomputed), and later inputs with the same decisions reuse
  that branch.

A prefix can also grow: after ``forward(..., keep=True)``, :meth:`SharedPrefix.extended` gives, for
each input, a prefix that is this one followed by that input's tokens, holding the one decision
history the input followed. Per-step generation runs each new token against its sequence so far
this way: a step costs that token's rows while its decisions repeat the step before, and branches
(recomputing from the layer that decided otherwise) where they do not.

Plain runs have one path (nothing zeroed), static runs too (the same heads everywhere); dynamic
runs branch where sequences disagree. The numbers equal a full recompute up to float rounding
(prefix and rest are separate matrix products), so a flag can only differ for a head whose score
lies within rounding of τ. Random ablation draws independently per sequence, so nothing is shared:
it always runs in full. ``ReuseStats`` counts how often the cache held.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .fast_attention import PrefixKV, state_of, supports_fast_attention
from .hook_registry import installed
from .hooks import HeadHookRunner, LayerCallback, StopForward, new_batch_token, zero_heads
from .layer_stack import LayerStack
from .lines.base import line_of

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


def supports_prefix_reuse(model, ablation=None) -> bool:
    """A model on the fast attention path that runs layer by layer can reuse a prefix, with or
    without ablation: a rotary ``HookedTransformer``, or a ``TransformerBridge`` that
    :class:`~inactive_heads.runtime.layer_stack.LayerStack` runs (Llama, Qwen2, Mistral, full
    attention) — except with an ablation whose ``shares_prefix`` is False (Random: its draws
    differ per sequence at every layer, so there is nothing to share)."""
    if ablation is not None and not getattr(ablation, "shares_prefix", True):
        return False
    if not supports_fast_attention(model):
        return False
    return line_of(model).prefix_reuse_supported(model)


# Bytes of prefix states a SharedPrefix keeps for later batches; past it, new branches are used by
# the batch that made them and dropped.
CACHE_BYTES = 4 * 2**30


class _Node:
    """The prefix at one layer under one decision history."""

    __slots__ = ("layer", "resid", "keys", "values", "z", "pattern", "children")

    def __init__(self, layer: int, resid: Tensor):
        self.layer = layer
        self.resid = resid  # [1, prefix, d_model], entering `layer`
        self.keys: Tensor | None = None  # [1, prefix, kv_head, d_head], rotated
        self.values: Tensor | None = None
        self.z: Tensor | None = None  # [1, prefix, head, d_head], before any zeroing at `layer`
        self.pattern: Tensor | None = None  # [1, head, prefix, prefix], when a score reads it
        self.children: dict[bytes, _Node] = {}

    def nbytes(self) -> int:
        parts = (self.resid, self.keys, self.values, self.z, self.pattern)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


@dataclass
class _Step:
    """One layer of a ``forward(keep=True)``: the inputs' own rows at that layer (as a prefix node
    keeps them) and the node and decision key each input followed."""

    resid: Tensor  # [batch, rest, d_model], entering the layer
    keys: Tensor  # [batch, rest, kv_head, d_head], rotated
    values: Tensor
    z: Tensor  # [batch, rest, head, d_head], before zeroing
    pattern: Tensor | None  # [batch, head, rest, prefix + rest]
    nodes: list[_Node]
    route: list[bytes] | None = None  # each input's decision key at this layer (None: the last layer)


@dataclass
class ReuseStats:
    """How often the cached prefix held: prefix layers a full recompute would run
    (``needed`` = inputs × layers) and those actually computed."""

    groups: int = 0
    inputs: int = 0
    needed: int = 0
    computed: int = 0
    branches: int = 0  # prefix states made for a decision history other than the first one seen

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.computed / self.needed if self.needed else 0.0

    def as_dict(self) -> dict:
        return {"groups": self.groups, "inputs_reused": self.inputs, "prefix_layers_needed": self.needed,
                "prefix_layers_computed": self.computed, "branches": self.branches,
                "hit_rate": round(self.hit_rate, 4)}


class _PrefixHooks(HeadHookRunner):
    """The hook runner's per-layer hooks, with what runs at ``hook_z`` given to a :class:`SharedPrefix`."""

    def __init__(self, shared: "SharedPrefix"):
        super().__init__(shared.model, None, reads=sorted(shared.reads), seed=shared.seed)
        self.shared = shared

    def at_z(self, layer: int, z: Tensor, held: dict[str, Tensor]) -> Tensor | None:
        return self.shared._on_z(layer, z, held)


class SharedPrefix:
    """Run inputs that share a prefix, computing the prefix once per decision history.

    ``callbacks`` are called at every layer with whole-sequence :class:`LayerActivations` (prefix
    and rest joined; what ``reads`` asks for, ``z`` always); each returns the heads to zero per
    sequence (``[batch, head]`` bool) or None (it only reads), and the last flags returned decide. Use
    inside :func:`~inactive_heads.runtime.fast_attention.fast_attention` and ``torch.inference_mode()``:

    >>> shared = SharedPrefix(model, prefix_ids, [ablation.flags_for], reads=ablation.reads)  # doctest: +SKIP
    >>> resid = shared.forward(rest_tokens, valid, sequence_ids)   # [batch, rest, d_model]  # doctest: +SKIP
    """

    def __init__(self, model, tokens: list[int], callbacks: list[LayerCallback], *,
                 reads=("z",), seed: int = 0, stats: ReuseStats | None = None,
                 cache_bytes: int = CACHE_BYTES):
        self.model = model
        self.callbacks = list(callbacks)
        self.reads = set(reads) | {"z"}
        self.seed = seed
        self.stats = stats if stats is not None else ReuseStats()
        self.cache_bytes = cache_bytes
        self.n_layers = model.cfg.n_layers
        self.n_heads = model.cfg.n_heads
        self._state = state_of(model)
        self._stack = LayerStack(model)
        device = next(model.parameters()).device
        prefix = torch.tensor([tokens], dtype=torch.long, device=device)
        self._reset(len(tokens))
        self.root = _Node(0, self._stack.embed(prefix, self._ones))
        self._stored = self.root.nbytes()
        self.stats.groups += 1

    def _reset(self, length: int) -> None:
        """The per-prefix state: its length and nothing cached or held."""
        self.length = length
        device = next(self.model.parameters()).device
        self._ones = torch.ones((1, length), dtype=torch.long, device=device)
        self._mode: str | None = None
        self._held: dict[str, Tensor] = {}
        self._nodes: list[_Node] = []
        self._batch: tuple[Tensor, Tensor] | None = None
        self._flags: Tensor | None = None
        self._pattern_buffer: Tensor | None = None
        self._layers_made: set[int] = set()  # layers for which a prefix state was made (later ones branch)
        self._trace: list[_Step] | None = None  # forward(keep=True): what extended() appends
        self._valid: Tensor | None = None
        self._token: int | None = None  # the batch token of the forward() under way
        self._runner = _PrefixHooks(self)
        self._held_rest: tuple[Tensor, Tensor | None] | None = None

    # -- hooks ------------------------------------------------------------------------------
    def _on_z(self, layer: int, z: Tensor, held: dict[str, Tensor]) -> Tensor | None:
        """At ``hook_z``: a prefix node keeps its ``z`` (and pattern) and stops; the inputs' rows
        are joined with their nodes' prefix rows and handed to the callbacks."""
        if self._mode == "node":
            self._held = {**held, "z": z}
            raise StopForward  # the prefix node needs nothing after its attention
        if self._mode != "rows":
            return None
        b = z.shape[0]
        valid, sequence_ids = self._batch
        pattern = None
        if "pattern" in self.reads:
            pattern = self._whole_pattern(held["pattern"])
        acts = self._runner.activations(
            layer,
            torch.cat([self._rows("z", b), z], dim=1),
            valid=torch.cat([valid.new_ones((b, self.length)), valid], dim=1),
            sequence_ids=sequence_ids,
            pattern=pattern,
            v=torch.cat([self._rows("values", b), held["v"]], dim=1) if "v" in self.reads else None,
            batch=self._token,
        )
        flags = None
        for callback in self.callbacks:
            out = callback(acts)
            if out is not None:
                flags = out
        self._flags = flags
        if self._trace is not None:
            self._held_rest = (z, held.get("pattern"))
        return None if flags is None else zero_heads(z, flags)

    def _rows(self, attr: str, b: int) -> Tensor:
        """The nodes' cached ``attr`` for each row of the batch: ``[batch, ...]``."""
        parts = [getattr(node, attr) for node in self._nodes]
        if all(p is parts[0] for p in parts):
            return parts[0].expand(b, *parts[0].shape[1:])
        return torch.cat(parts)

    def _whole_pattern(self, rest: Tensor) -> Tensor:
        """``[batch, head, prefix + rest, prefix + rest]``: the nodes' prefix rows (which never see
        the rest's keys: zeros, as the causal mask gives) above the rest's own rows.

        One buffer serves every layer of a batch (score functions reduce the pattern of their
        layer and keep nothing of it), so it is allocated, and its zero block written, once."""
        b, n_heads, n_rest, n_keys = rest.shape
        p = self.length
        shape = (b, n_heads, p + n_rest, n_keys)
        whole = self._pattern_buffer
        if whole is None or whole.shape != shape or whole.dtype != rest.dtype or whole.device != rest.device:
            whole = self._pattern_buffer = torch.empty(shape, dtype=rest.dtype, device=rest.device)
            whole[:, :, :p, p:] = 0.0
        whole[:, :, :p, :p] = self._rows("pattern", b)
        whole[:, :, p:] = rest
        return whole

    # -- the prefix tree --------------------------------------------------------------------
    def _run_layer(self, resid: Tensor, layer: int, mask: Tensor) -> Tensor:
        prefix = self._state.prefix
        return self._stack.layer(resid, layer, mask, prefix.length if prefix is not None else 0)

    def _attend(self, node: _Node) -> None:
        """The prefix's attention at ``node.layer``: keys, values, z (and pattern), nothing after."""
        capture = PrefixKV(self.length)
        self._state.capture, self._mode, self._held = capture, "node", {}
        try:
            self._run_layer(node.resid, node.layer, self._ones)
        except StopForward:
            pass
        finally:
            self._state.capture, self._mode = None, None
        held, self._held = self._held, {}
        node.keys, node.values, node.z = capture.keys[0], capture.values[0], held["z"]
        node.pattern = held.get("pattern")
        self.stats.computed += 1

    def _child(self, node: _Node, flags: Tensor | None) -> _Node:
        """The prefix entering the next layer when ``flags`` (``[head]``, or None) are zeroed at
        ``node.layer``: that layer's W_O and the rest of its block, from the cached z."""
        z = node.z if flags is None else zero_heads(node.z, flags[None])
        self._state.z_override = z
        try:
            resid = self._run_layer(node.resid, node.layer, self._ones)
        finally:
            self._state.z_override = None
        return _Node(node.layer + 1, resid)

    def _route(self, nodes: list[_Node], flags: Tensor | None) -> tuple[list[_Node], list[bytes]]:
        """Each row's state for the next layer, following its decision at this one, and the
        decision keys it followed."""
        layer = nodes[0].layer
        if flags is None:
            keys, rows = [b""] * len(nodes), [None] * len(nodes)
        else:
            host = flags.to("cpu", torch.bool)  # one device->host copy per layer and batch
            rows = list(host)
            keys = [bytes(row.numpy().tobytes()) for row in rows]
        made: dict[tuple[int, bytes], _Node] = {}
        out = []
        for node, key, row in zip(nodes, keys, rows):
            child = node.children.get(key) or made.get((id(node), key))
            if child is None:
                zeroed = None if row is None or not bool(row.any()) else row.to(node.z.device)
                child = self._child(node, zeroed)
                if layer + 1 in self._layers_made:
                    self.stats.branches += 1
                self._layers_made.add(layer + 1)
                size = child.resid.numel() * child.resid.element_size() * 4  # with its attention, roughly
                if self._stored + size <= self.cache_bytes:
                    node.children[key] = child
                    self._stored += size
                else:
                    made[(id(node), key)] = child
            out.append(child)
        return out, keys

    def forward(self, tokens: Int[Tensor, "batch rest"], valid: Bool[Tensor, "batch rest"],
                sequence_ids: Int[Tensor, " batch"], *, keep: bool = False) -> Float[Tensor, "batch rest d_model"]:
        """The residual stream after the last layer at the positions after the prefix, for a
        right-padded batch of inputs with the prefix removed.

        ``keep=True`` also keeps the inputs' own states at every layer, for :meth:`extended`."""
        model, state = self.model, self._state
        b = tokens.shape[0]
        mask = valid.to(dtype=torch.long, device=tokens.device)
        kv = PrefixKV(self.length, [None] * self.n_layers, [None] * self.n_layers)
        self._batch = (valid, sequence_ids)
        self._token = new_batch_token()
        self._trace = [] if keep else None
        nodes = [self.root] * b
        with installed(model, self._runner.fwd_hooks()):
            resid = self._stack.embed(tokens, mask)
            for layer in range(self.n_layers):
                for node in {id(n): n for n in nodes}.values():
                    if node.z is None:
                        self._attend(node)
                self._nodes = nodes
                kv.keys[layer], kv.values[layer] = self._rows("keys", 1), self._rows("values", 1)
                own = PrefixKV(0) if keep else None
                state.prefix, state.capture, self._mode, self._flags = kv, own, "rows", None
                entering = resid
                try:
                    resid = self._run_layer(resid, layer, mask)
                finally:
                    state.prefix, state.capture, self._mode = None, None, None
                if keep:
                    z, pattern = self._held_rest
                    self._trace.append(_Step(entering, own.keys[0], own.values[0], z, pattern, nodes))
                if layer + 1 < self.n_layers:
                    nodes, route = self._route(nodes, self._flags)
                    if keep:
                        self._trace[-1].route = route
        self._nodes, self._batch, self._pattern_buffer, self._held_rest = [], None, None, None
        if keep:
            self._valid = valid
        self.stats.inputs += b
        self.stats.needed += b * self.n_layers
        return resid

    def extended(self) -> list["SharedPrefix"]:
        """After ``forward(..., keep=True)``: for each input of that batch, a prefix that is this one
        followed by that input's tokens (its real ones), holding only the decision history the input
        followed (one node per layer, its states being the cached prefix's joined with the input's
        own). Running the next token against it costs that token's rows only, as long as its
        decisions follow the same history; where they do not, it branches as any prefix does.

        This is the reuse of per-step generation: each step runs the newest token against its
        sequence so far, then extends it by that token."""
        if self._trace is None:
            raise RuntimeError("extended() needs a forward(..., keep=True) first")
        trace, valid, self._trace, self._valid = self._trace, self._valid, None, None
        out = []
        for row in range(len(trace[0].nodes)):
            n = int(valid[row].sum())
            new = object.__new__(SharedPrefix)
            new.__dict__.update({k: getattr(self, k) for k in
                                 ("model", "callbacks", "reads", "seed", "stats", "cache_bytes", "n_layers",
                                  "n_heads", "_state", "_stack")})
            new._reset(self.length + n)
            nodes = []
            for step in trace:
                node, p = step.nodes[row], self.length
                joined = _Node(len(nodes), torch.cat([node.resid, step.resid[row:row + 1, :n]], dim=1))
                joined.keys = torch.cat([node.keys, step.keys[row:row + 1, :n]], dim=1)
                joined.values = torch.cat([node.values, step.values[row:row + 1, :n]], dim=1)
                joined.z = torch.cat([node.z, step.z[row:row + 1, :n]], dim=1)
                if step.pattern is not None:
                    pattern = step.pattern.new_zeros((1, self.n_heads, p + n, p + n))
                    pattern[:, :, :p, :p] = node.pattern
                    pattern[:, :, p:] = step.pattern[row:row + 1, :, :n, :p + n]
                    joined.pattern = pattern
                if nodes:
                    nodes[-1].children[trace[len(nodes) - 1].route[row]] = joined
                nodes.append(joined)
            new.root = nodes[0]
            new._stored = sum(node.nbytes() for node in nodes)
            new._layers_made = set(range(1, self.n_layers))
            out.append(new)
        return out
