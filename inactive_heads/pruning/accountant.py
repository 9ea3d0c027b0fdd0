"""What removing heads saves: parameters, FLOPs per token and KV-cache bytes, GQA-aware.

Counting rules (docs/pruning.md, "The accountant"):

- a removed **query head** takes its ``q_proj`` rows (d_model·d_head, plus d_head of bias where
  the family has q/k/v biases) and its ``o_proj`` columns (d_head·d_model);
- a **key/value head** is removable only when every query head of its group is removed (grouped-
  query attention shares it); it takes its ``k_proj`` and ``v_proj`` rows (2·(d_model·d_head +
  bias)) and its share of the KV cache;
- a layer with **no head left** also drops its input norm (d_model); an output bias stays;
- FLOPs count 2 per multiply-add, matrix products only (norms, softmax and rotary are
  negligible). Per token at position t (0-based, attending to t + 1 keys), one query head costs
  2·d_model·d_head (q) + 2·d_head·d_model (o) + 4·d_head·(t + 1) (scores and weighted sum); one
  key/value head 4·d_model·d_head. Prefill of n tokens averages the attention term over t < n:
  4·d_head·(n + 1)/2; decode at context n pays 4·d_head·n. The rest of the model (MLP, LM head)
  is counted for the totals, so that a throughput ratio can be predicted;
- KV-cache bytes: 2 (keys, values) · kept key/value heads · d_head · tokens · bytes per value.
- Decode **bytes read** per token (one sequence): a decode step reads every weight once (an untied
  input embedding only by its one row, so its table is left out) and the whole KV cache at its
  context. Removed heads save their weights and their freed KV heads' cache. Where one token's
  work is bound by memory traffic rather than arithmetic — a decode step of a large model on a
  GPU — this ratio, not the FLOP ratio, is the speed-up to expect.

:func:`savings` gives these figures for one fixed set of heads, :func:`oracle_savings` for each
input of a dynamic run (what an oracle that skipped each input's flagged heads would save), and
:func:`paper_projections` for the paper's largest models from their shapes alone (labelled as
projections: which heads would go is unknown, so removable key/value heads are a range).
"""

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from ..core.checks import head_pairs, result_fields
from ..core.errors import UserError, WrongTypeError
from ..models.architectures import by_model_type, projection_biases
from ..models.devices import resolve_dtype
from ..scoring.calibration import Real
from .static import check_fraction, check_heads

KV_LENGTHS = (2048, 8192, 32768)


@dataclass(frozen=True)
class ModelShape:
    """The sizes that the accountant needs (a JSON-friendly dataclass)."""

    name: str
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    d_mlp: int
    vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # OLMo-2: RMSNorm over all heads' q and k (weights n_heads·d_head, n_kv·d_head)
    gated_mlp: bool = True

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelShape":
        return cls(**result_fields(cls, d))

    @classmethod
    def from_hf_config(cls, config, name: str = "model") -> "ModelShape":
        n_heads = config.num_attention_heads
        model_type = config.model_type
        qkv_bias, o_bias = projection_biases(model_type, bool(getattr(config, "attention_bias", False)))
        return cls(
            name=name,
            family=model_type,
            n_layers=config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            d_head=getattr(config, "head_dim", None) or config.hidden_size // n_heads,
            d_model=config.hidden_size,
            d_mlp=config.intermediate_size,
            vocab_size=config.vocab_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=by_model_type(model_type).qk_norm,
        )

    # -- counts for a dense model ------------------------------------------------------------
    def q_head_params(self) -> int:
        return 2 * self.d_model * self.d_head + (self.d_head if self.qkv_bias else 0) + (
            self.d_head if self.qk_norm else 0)

    def kv_head_params(self) -> int:
        return 2 * (self.d_model * self.d_head + (self.d_head if self.qkv_bias else 0)) + (
            self.d_head if self.qk_norm else 0)

    def n_params(self) -> int:
        """Parameters of the dense model (embeddings, LM head unless tied, layers, final norm)."""
        mlp = (3 if self.gated_mlp else 2) * self.d_model * self.d_mlp
        layer = (self.n_heads * self.q_head_params() + self.n_kv_heads * self.kv_head_params()
                 + (self.d_model if self.o_bias else 0) + 2 * self.d_model + mlp)
        embed = self.vocab_size * self.d_model
        return embed * (1 if self.tied_embeddings else 2) + self.n_layers * layer + self.d_model

    def q_head_flops(self, attended):
        """FLOPs per token of one query head attending to ``attended`` keys (a number, or a tensor
        of them: elementwise): its q and o projections and its scores and weighted sum."""
        return 4.0 * self.d_model * self.d_head + 4.0 * self.d_head * attended

    def kv_head_flops(self) -> float:
        return float(4 * self.d_model * self.d_head)

    def rest_flops(self) -> float:
        """FLOPs per token outside attention: MLPs and the LM head."""
        mlp = (3 if self.gated_mlp else 2) * self.d_model * self.d_mlp
        return float(self.n_layers * 2 * mlp + 2 * self.d_model * self.vocab_size)

    def flops_per_token(self, attended: int | float) -> float:
        return (self.n_layers * (self.n_heads * self.q_head_flops(attended) + self.n_kv_heads * self.kv_head_flops())
                + self.rest_flops())

    def kv_bytes_per_token(self, n_bytes: int) -> int:
        """KV-cache bytes of one cached token: keys and values of every KV head of every layer."""
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * n_bytes

    def decode_bytes_per_token(self, context: int | float, n_bytes: int) -> float:
        """Bytes one decode step reads at ``context`` cached tokens: every weight (an untied input
        embedding only by its one row: its table is left out) and the whole KV cache."""
        weights = self.n_params() - (0 if self.tied_embeddings else self.vocab_size * self.d_model)
        return float(n_bytes * weights + self.kv_bytes_per_token(n_bytes) * context)


@lru_cache(maxsize=1)
def _paper_shapes() -> dict[str, dict[str, Any]]:
    text = files("inactive_heads").joinpath("data", "paper_model_shapes.json").read_text(encoding="utf-8")
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def paper_model_shapes() -> dict[str, ModelShape]:
    """The shapes of the paper's largest models (Llama-3.1-8B, Qwen2.5-14B, OLMo-2-7B), as data."""
    return {name: ModelShape(name=name, **d) for name, d in _paper_shapes().items()}


def model_shape(model) -> ModelShape:
    """The :class:`ModelShape` of a model from ``load_model`` (read from its Hugging Face config),
    any TransformerLens model, a Hugging Face config or model, a built-in alias, a local
    directory, or one of :func:`paper_model_shapes`."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, str):
        shapes = paper_model_shapes()
        if model in shapes:
            return shapes[model]
        from ..models.loading import read_hf_config, resolve_model_dir

        path, name = resolve_model_dir(model, progress=False)
        return ModelShape.from_hf_config(read_hf_config(path), name)
    if hasattr(model, "num_attention_heads"):  # a Hugging Face config
        return ModelShape.from_hf_config(model, getattr(model, "_name_or_path", "") or "model")
    if hasattr(model, "config") and hasattr(model.config, "num_attention_heads") and not hasattr(model, "cfg"):
        return ModelShape.from_hf_config(model.config, getattr(model.config, "_name_or_path", "") or "model")
    info = getattr(model, "inactive_heads_info", None)
    if info is not None:
        from pathlib import Path

        from ..models.loading import read_hf_config

        if (Path(info.source) / "config.json").is_file():
            return ModelShape.from_hf_config(read_hf_config(info.source), info.name)
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise UserError(f"cannot read the shape of {type(model).__name__}; pass a model from ih.load_model, "
                        "a Hugging Face config, or a name from paper_model_shapes()")
    from ..models.loading import model_info

    info = model_info(model)
    return ModelShape(
        name=info.name, family=info.family, n_layers=info.n_layers, n_heads=info.n_heads,
        n_kv_heads=info.n_kv_heads, d_head=info.d_head, d_model=info.d_model, d_mlp=cfg.d_mlp,
        vocab_size=cfg.d_vocab, tied_embeddings=False, qkv_bias=projection_biases(info.family, False)[0],
        gated_mlp=bool(getattr(cfg, "gated_mlp", True)),
    )


def removal_counts(shape: ModelShape, removed: Bool[Tensor, "*batch layer head"]) -> dict[str, Tensor]:
    """Removed query heads, removable key/value heads (whole groups) and layers left without a
    head, for one ``[layer, head]`` mask or a batch of them (counts per leading index)."""
    if tuple(removed.shape[-2:]) != (shape.n_layers, shape.n_heads):
        raise UserError(f"a head mask must be [..., {shape.n_layers}, {shape.n_heads}] for {shape.name}; "
                        f"got {tuple(removed.shape)}")
    removed = removed.to(torch.bool)
    groups = removed.reshape(*removed.shape[:-1], shape.n_kv_heads, shape.group_size).all(dim=-1)
    return {
        "query_heads": removed.sum(dim=(-2, -1)),
        "kv_heads": groups.sum(dim=(-2, -1)),
        "empty_layers": removed.all(dim=-1).sum(dim=-1),
    }


def held_fractions(shape: ModelShape, held: Bool[Tensor, "seq layer head"]) -> dict[str, float]:
    """The share of (sequence, layer, query head) held, and of (sequence, layer, KV group) whose
    query heads are all held: the KV heads a real skip frees (every held head under multi-head
    attention, where each group is one head). 0 for no sequence."""
    counts = removal_counts(shape, held)
    n = held.shape[0]
    if n == 0:
        return {"query_heads": 0.0, "kv_groups": 0.0}
    return {"query_heads": float(counts["query_heads"].sum()) / (n * shape.n_layers * shape.n_heads),
            "kv_groups": float(counts["kv_heads"].sum()) / (n * shape.n_layers * shape.n_kv_heads)}


def _dtype_bytes(dtype) -> int:
    return torch.empty((), dtype=resolve_dtype(dtype)).element_size()


@dataclass
class Savings:
    """What removing a set of heads saves (one model, one set). ``to_dict()`` is JSON-friendly."""

    model: str
    seq_len: int
    dtype: str
    query_heads_removed: int
    query_heads_total: int
    kv_heads_removable: int
    kv_heads_total: int
    layers_without_attention: int
    params_removed: int
    params_total: int
    prefill_flops_per_token: float
    prefill_flops_per_token_removed: float
    decode_flops_per_token: float
    decode_flops_per_token_removed: float
    decode_bytes_per_token: float
    decode_bytes_per_token_removed: float
    kv_cache_bytes: dict[int, int]
    kv_cache_bytes_removed: dict[int, int]
    projection: bool = False

    @property
    def predicted_prefill_ratio(self) -> float:
        """Dense prefill FLOPs / pruned prefill FLOPs: the throughput ratio the FLOPs predict."""
        return self.prefill_flops_per_token / (self.prefill_flops_per_token - self.prefill_flops_per_token_removed)

    @property
    def predicted_decode_ratio(self) -> float:
        return self.decode_flops_per_token / (self.decode_flops_per_token - self.decode_flops_per_token_removed)

    @property
    def predicted_decode_bytes_ratio(self) -> float:
        """Dense / pruned bytes read per decode step: the speed-up of a decode bound by memory traffic."""
        return self.decode_bytes_per_token / (self.decode_bytes_per_token - self.decode_bytes_per_token_removed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicted_prefill_ratio"] = self.predicted_prefill_ratio
        d["predicted_decode_ratio"] = self.predicted_decode_ratio
        d["predicted_decode_bytes_ratio"] = self.predicted_decode_bytes_ratio
        return d

    def table(self):
        """Dense, removed and the removed share, one row per figure (a pandas DataFrame)."""
        import pandas as pd

        rows = [
            ("query heads", self.query_heads_total, self.query_heads_removed),
            ("KV heads (whole groups)", self.kv_heads_total, self.kv_heads_removable),
            ("parameters", self.params_total, self.params_removed),
            (f"prefill FLOPs/token (n={self.seq_len})", self.prefill_flops_per_token,
             self.prefill_flops_per_token_removed),
            (f"decode FLOPs/token (context {self.seq_len})", self.decode_flops_per_token,
             self.decode_flops_per_token_removed),
            (f"decode bytes read/token (context {self.seq_len}, {self.dtype})", self.decode_bytes_per_token,
             self.decode_bytes_per_token_removed),
        ]
        rows += [(f"KV cache bytes at {n} tokens ({self.dtype})", self.kv_cache_bytes[n],
                  self.kv_cache_bytes_removed[n]) for n in self.kv_cache_bytes]
        frame = pd.DataFrame(rows, columns=["figure", "dense", "removed"])
        frame["removed_pct"] = 100.0 * frame["removed"] / frame["dense"]
        return frame


def _mask(shape: ModelShape, heads) -> Tensor:
    pairs = head_pairs(heads)
    check_heads(pairs, shape.n_layers, shape.n_heads)
    mask = torch.zeros((shape.n_layers, shape.n_heads), dtype=torch.bool)
    for l, h in pairs:
        mask[l, h] = True
    return mask


def _figures(shape: ModelShape, nq, nkv, nempty, seq_len: int, n_bytes: int) -> dict[str, Any]:
    """The removed figures from counts (tensors or ints, elementwise)."""
    prefill_attended = (seq_len + 1) / 2
    params_removed = nq * shape.q_head_params() + nkv * shape.kv_head_params() + nempty * shape.d_model
    return {
        "params_removed": params_removed,
        "prefill_flops_per_token_removed": nq * shape.q_head_flops(prefill_attended) + nkv * shape.kv_head_flops(),
        "decode_flops_per_token_removed": nq * shape.q_head_flops(seq_len) + nkv * shape.kv_head_flops(),
        "kv_bytes_per_token_removed": 2 * nkv * shape.d_head * n_bytes,
        "decode_bytes_per_token_removed": n_bytes * (params_removed + 2 * nkv * shape.d_head * seq_len),
    }


def savings(model, heads, *, seq_len: int = 2048, dtype: torch.dtype | str | None = None,
            kv_lengths: tuple[int, ...] = KV_LENGTHS) -> Savings:
    """What removing ``heads`` from ``model`` saves (module docstring for the counting rules).

    >>> s = savings("meta-llama/Llama-3.1-8B", [(0, h) for h in range(4)], dtype="bfloat16")
    >>> s.query_heads_removed, s.kv_heads_removable, s.params_removed
    (4, 1, 5242880)

    ``model``: anything :func:`model_shape` accepts. ``heads``: a ``HeadSet`` or (layer, head)
    pairs. ``seq_len``: the prefill length (and the decode context). ``dtype``: of the KV cache and the weights
    (default: the model's, else bfloat16).
    """
    shape = model_shape(model)
    if not isinstance(seq_len, int) or seq_len < 1:
        raise UserError(f"seq_len must be a positive integer; got {seq_len!r}")
    if dtype is None:
        info = getattr(model, "inactive_heads_info", None)
        dtype = info.dtype if info is not None else "bfloat16"
    n_bytes = _dtype_bytes(dtype)
    counts = {k: int(v) for k, v in removal_counts(shape, _mask(shape, heads)).items()}
    fig = _figures(shape, counts["query_heads"], counts["kv_heads"], counts["empty_layers"], seq_len, n_bytes)
    dense_kv_per_token = shape.kv_bytes_per_token(n_bytes)
    return Savings(
        model=shape.name,
        seq_len=seq_len,
        dtype=str(resolve_dtype(dtype)).removeprefix("torch."),
        query_heads_removed=counts["query_heads"],
        query_heads_total=shape.n_layers * shape.n_heads,
        kv_heads_removable=counts["kv_heads"],
        kv_heads_total=shape.n_layers * shape.n_kv_heads,
        layers_without_attention=counts["empty_layers"],
        params_removed=int(fig["params_removed"]),
        params_total=shape.n_params(),
        prefill_flops_per_token=shape.flops_per_token((seq_len + 1) / 2),
        prefill_flops_per_token_removed=float(fig["prefill_flops_per_token_removed"]),
        decode_flops_per_token=shape.flops_per_token(seq_len),
        decode_flops_per_token_removed=float(fig["decode_flops_per_token_removed"]),
        decode_bytes_per_token=shape.decode_bytes_per_token(seq_len, n_bytes),
        decode_bytes_per_token_removed=float(fig["decode_bytes_per_token_removed"]),
        kv_cache_bytes={n: dense_kv_per_token * n for n in kv_lengths},
        kv_cache_bytes_removed={n: int(fig["kv_bytes_per_token_removed"]) * n for n in kv_lengths},
        projection=getattr(model, "name", None) in _paper_shapes() if isinstance(model, ModelShape)
        else isinstance(model, str) and model in _paper_shapes(),
    )


def oracle_savings(model, flagged: Bool[Tensor, "seq layer head"], *, lengths=None):
    """Per input of a dynamic run, what an oracle that skipped that input's flagged heads would save.

    ``flagged`` is the run's ``[sequence, layer, head]`` mask (``ablation.stats.flagged_mask()``).
    ``lengths`` (one per sequence) sets each input's prefill length; without it the FLOPs are
    for a length of 1 (projections only). Returns a pandas DataFrame, one row per input:
    ``query_heads_removed, kv_heads_removable, query_heads_pct, kv_heads_pct,
    prefill_flops_removed_pct, kv_cache_removed_pct``.
    """
    import pandas as pd

    shape = model_shape(model)
    try:
        flagged = torch.as_tensor(flagged, dtype=torch.bool)
    except (TypeError, ValueError, RuntimeError):
        raise WrongTypeError(f"flagged must be a [sequence, layer, head] bool tensor, got {type(flagged).__name__}") from None
    if flagged.ndim != 3:
        raise UserError(f"flagged must be [sequence, layer, head]; got shape {tuple(flagged.shape)}")
    counts = removal_counts(shape, flagged)
    n = flagged.shape[0]
    try:
        lens = torch.ones(n, dtype=torch.float64) if lengths is None else torch.as_tensor(lengths, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise WrongTypeError(f"lengths must be one number per sequence, got {type(lengths).__name__}") from None
    if lens.shape != (n,):
        raise UserError(f"lengths must give one length per sequence ({n}); got {tuple(lens.shape)}")
    nq, nkv = counts["query_heads"].double(), counts["kv_heads"].double()
    attended = (lens + 1) / 2
    removed = nq * shape.q_head_flops(attended) + nkv * shape.kv_head_flops()
    dense = torch.tensor([shape.flops_per_token(float(a)) for a in attended.tolist()], dtype=torch.float64)
    return pd.DataFrame({
        "query_heads_removed": counts["query_heads"].numpy(),
        "kv_heads_removable": counts["kv_heads"].numpy(),
        "query_heads_pct": (100.0 * nq / (shape.n_layers * shape.n_heads)).numpy(),
        "kv_heads_pct": (100.0 * nkv / (shape.n_layers * shape.n_kv_heads)).numpy(),
        "prefill_flops_removed_pct": (100.0 * removed / dense).numpy(),
        "kv_cache_removed_pct": (100.0 * nkv / (shape.n_layers * shape.n_kv_heads)).numpy(),
    })


ORACLE_COLUMNS = ("query_heads_pct", "kv_heads_pct", "prefill_flops_removed_pct", "kv_cache_removed_pct")


def oracle_summary(model, flagged: Bool[Tensor, "seq layer head"], lengths) -> dict[str, Any]:
    """:func:`oracle_savings` averaged over a run's inputs (each input weighs the same): the % of
    query heads, removable KV heads, prefill FLOPs at the input's length and KV-cache bytes that an
    oracle skipping each input's zeroed heads would save. Estimated: the toolkit computes them."""
    frame = oracle_savings(model, flagged, lengths=lengths)
    return {"basis": "estimated", **{c: float(frame[c].mean()) for c in ORACLE_COLUMNS}}


def paper_projections(fraction: Real, *, seq_len: int = 2048, dtype: torch.dtype | str = "bfloat16"):
    """Projected savings of removing ``fraction`` of the query heads of each of the paper's
    largest models (a pandas DataFrame, one row per model, ``projection=True``).

    Which heads would go is unknown without scores of those models, so the key/value heads
    removable are a range: at best the removed heads fill whole groups (``⌊removed / group⌋``),
    at worst they spread over as many groups as possible (pigeonhole). Rows ``*_min``/``*_max``
    follow. OLMo-2's q/k norms span all heads of a layer, so removing a head there changes the
    others' normalization: its rows count weights, not an exact equivalent of zeroing.
    """
    import pandas as pd

    fraction = check_fraction(fraction)
    n_bytes = _dtype_bytes(dtype)
    rows = []
    for name, shape in paper_model_shapes().items():
        total = shape.n_layers * shape.n_heads
        nq = int(round(fraction * total))
        groups = shape.n_layers * shape.n_kv_heads
        kv_max = nq // shape.group_size
        kv_min = max(0, nq - groups * (shape.group_size - 1))
        lo = _figures(shape, nq, kv_min, 0, seq_len, n_bytes)
        hi = _figures(shape, nq, kv_max, 0, seq_len, n_bytes)
        dense_prefill = shape.flops_per_token((seq_len + 1) / 2)
        dense_decode_bytes = shape.decode_bytes_per_token(seq_len, n_bytes)
        dense_kv = shape.kv_bytes_per_token(n_bytes)
        rows.append({
            "model": name,
            "projection": True,
            "query_heads_removed": nq,
            "query_heads_total": total,
            "kv_heads_removable_min": kv_min,
            "kv_heads_removable_max": kv_max,
            "kv_heads_total": groups,
            "params_total": shape.n_params(),
            "params_removed_min": int(lo["params_removed"]),
            "params_removed_max": int(hi["params_removed"]),
            "prefill_flops_removed_pct_min": 100.0 * lo["prefill_flops_per_token_removed"] / dense_prefill,
            "prefill_flops_removed_pct_max": 100.0 * hi["prefill_flops_per_token_removed"] / dense_prefill,
            "decode_bytes_removed_pct_min": 100.0 * lo["decode_bytes_per_token_removed"] / dense_decode_bytes,
            "decode_bytes_removed_pct_max": 100.0 * hi["decode_bytes_per_token_removed"] / dense_decode_bytes,
            **{f"kv_cache_bytes_{n // 1024}k": dense_kv * n for n in KV_LENGTHS},
            **{f"kv_cache_bytes_removed_max_{n // 1024}k": int(hi["kv_bytes_per_token_removed"]) * n
               for n in KV_LENGTHS},
        })
    return pd.DataFrame(rows)
