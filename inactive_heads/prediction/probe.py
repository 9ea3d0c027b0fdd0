"""A causal predictor of the in-pass oracle: per layer, a low-rank logistic probe on the pooled,
RMS-normalized residual stream entering the layer (lookahead 0) or the layer before (lookahead 1).

Features of one sequence at one layer: the residual stream ``hook_resid_pre``, each token divided
by its root mean square (no learned weights), then averaged over the sequence's real (non-pad)
tokens (:func:`pooled_features`). The probe of layer ``l`` maps them to one logit per head of
layer ``l`` through a rank-``r`` bottleneck (standardized features → ``d_model × r`` → ``r × H``,
plus a per-head bias). A head is held (predicted inactive) when its logit exceeds the one decision
threshold of the probe set, chosen on the fit split so that the predicted fraction of (sequence,
layer, head) held equals the oracle's (:func:`decision_threshold`).

Lookahead 1 decides layer ``l`` from the residual stream entering layer ``l - 1`` (DejaVu's
one-layer-ahead decision); layer 0 has no layer before it, so its probe reads the stream entering
layer 0 (lookahead 0 there).
"""

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.checks import check_int, check_path, result_fields
from ..core.errors import MissingFileError, UserError, WrongTypeError
from ..core.io import write_bytes_atomic, write_json_atomic
from ..core.versions import library_versions

RMS_EPS = 1e-6
FORMAT = 1
WEIGHTS_FILE = "predictor.safetensors"
CONFIG_FILE = "predictor.json"
LOOKAHEADS = (0, 1)


def pooled_features(
    resid: Float[Tensor, "batch pos d_model"], attention_mask: Int[Tensor, "batch pos"] | Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "batch d_model"]:
    """Each token's residual vector divided by its RMS (no learned weights), averaged over the
    real tokens of each row (``attention_mask`` 1/True; None = all real), in float32. Pad positions
    (left or right) contribute nothing, whatever they hold.

    >>> x = torch.tensor([[[3.0, 4.0], [9.0, 9.0]]])  # one row, two tokens; the second is a pad
    >>> pooled_features(x, torch.tensor([[1, 0]])).tolist()  # [3, 4] / sqrt(12.5)
    [[0.8485280871391296, 1.1313707828521729]]
    """
    if not isinstance(resid, Tensor) or resid.ndim != 3 or not resid.is_floating_point():
        raise WrongTypeError(f"resid must be a float tensor [batch, pos, d_model], got {_described(resid)}")
    if attention_mask is not None and (not isinstance(attention_mask, Tensor)
                                       or tuple(attention_mask.shape) != tuple(resid.shape[:2])):
        raise UserError(f"attention_mask must be a tensor [batch, pos] = {list(resid.shape[:2])} of 1 (real token) "
                        f"and 0 (pad), or None; got {_described(attention_mask)}")
    x = resid if resid.dtype in (torch.float32, torch.float64) else resid.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)
    if attention_mask is None:
        return x.mean(dim=1)
    real = attention_mask.to(device=x.device).bool()
    counts = real.sum(dim=1, keepdim=True)
    if bool((counts == 0).any()):
        raise UserError("attention_mask has a row with no real token; every row needs at least one 1")
    return x.masked_fill(~real[..., None], 0.0).sum(dim=1) / counts.to(x.dtype)


@dataclass
class FitOptions:
    """How the probes are fit: full-batch Adam on the logistic loss plus an L2 penalty, fixed seed."""

    rank: int = 16
    steps: int = 300
    lr: float = 0.01
    l2: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise UserError(f"steps must be a positive integer, got {self.steps!r}")


@dataclass
class PredictorConfig:
    """What a saved predictor is (its JSON file): the model it reads, the oracle it predicts, its
    probes' shape, its decision threshold, and how well it fit."""

    model: str
    n_layers: int
    n_heads: int
    d_model: int
    score: str
    threshold: float
    lookahead: int
    rank: int
    decision_threshold: float
    task: str | None = None
    p: float | None = None
    fit: dict[str, Any] = field(default_factory=dict)  # fit options, split sizes, fit-split metrics
    versions: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PredictorConfig":
        config = cls(**result_fields(cls, d))
        for name in ("n_layers", "n_heads", "d_model", "rank"):
            check_int(getattr(config, name), f"predictor config field {name}")
        check_int(config.format, "predictor config field format")
        for name in ("threshold", "decision_threshold"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(f"predictor config field {name} must be a finite number, got {value!r}")
        _check_lookahead(config.lookahead)
        return config


def _check_lookahead(lookahead) -> int:
    if lookahead not in LOOKAHEADS or isinstance(lookahead, bool):
        raise UserError(f"lookahead must be 0 or 1, got {lookahead!r}")
    return int(lookahead)


def _described(value: Any) -> str:
    return f"a tensor of shape {list(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def feature_layer(layer: int, lookahead: int) -> int:
    """The layer whose entering residual stream the probe of ``layer`` reads (0 for layer 0)."""
    return max(layer - lookahead, 0)


class Predictor:
    """Per-layer low-rank probes and one decision threshold: which heads each sequence holds.

    Implements the decider protocol of a forward that skips heads: :attr:`lookahead` and
    :meth:`held_heads`. Save with :meth:`save`, read back with :meth:`load`.
    """

    def __init__(self, config: PredictorConfig, mean: Tensor, scale: Tensor, down: Tensor, up: Tensor, bias: Tensor):
        L, H, d, r = config.n_layers, config.n_heads, config.d_model, config.rank
        expected = {"mean": (L, d), "scale": (L, d), "down": (L, d, r), "up": (L, r, H), "bias": (L, H)}
        got = {"mean": mean, "scale": scale, "down": down, "up": up, "bias": bias}
        for name, shape in expected.items():
            if tuple(got[name].shape) != shape:
                raise UserError(f"predictor weight {name!r} has shape {tuple(got[name].shape)}, expected {shape} "
                                "from its config; the files do not belong together")
        _check_lookahead(config.lookahead)
        self.config = config
        self.mean, self.scale = mean.float(), scale.float()
        self.down, self.up, self.bias = down.float(), up.float(), bias.float()
        self._copies: dict[str, tuple[Tensor, ...]] = {}

    @property
    def lookahead(self) -> int:
        return self.config.lookahead

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    def logits(self, layer: int, features: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch n_heads"]:
        """The probe of ``layer`` on pooled features (of layer ``feature_layer(layer, lookahead)``)."""
        mean, scale, down, up, bias = self._on(features.device)
        x = (features.float() - mean[layer]) / scale[layer]
        return (x @ down[layer]) @ up[layer] + bias[layer]

    def _on(self, device) -> tuple[Tensor, ...]:
        """The weights on ``device``, copied there once."""
        key = str(device)
        if key not in self._copies:
            self._copies[key] = tuple(t.to(device) for t in (self.mean, self.scale, self.down, self.up, self.bias))
        return self._copies[key]

    def decide(self, layer: int, features: Float[Tensor, "batch d_model"]) -> Bool[Tensor, "batch n_heads"]:
        """Heads of ``layer`` held for each row, from pooled features."""
        return self.logits(layer, features) > self.config.decision_threshold

    def predict(self, features: Float[Tensor, "seq n_layers d_model"]) -> Bool[Tensor, "seq n_layers n_heads"]:
        """Held heads for every (sequence, layer) from pooled features of every layer (``features[:, l]``
        entering layer ``l``; each probe reads the layer its lookahead says)."""
        return torch.stack([self.decide(l, features[:, feature_layer(l, self.lookahead)])
                            for l in range(self.n_layers)], dim=1)

    def held_heads(
        self, layer: int, resid: Float[Tensor, "batch pos d_model"], attention_mask: Int[Tensor, "batch pos"] | None,
    ) -> Bool[Tensor, "batch n_heads"]:
        """Which heads of ``layer`` to hold (not compute) for each row. ``resid`` is the residual
        stream entering layer ``layer - lookahead`` (layer 0 when that is negative), unnormalized;
        ``attention_mask`` is 1 for real tokens (left or right padding), None when all are real."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not (0 <= layer < self.n_layers):
            raise UserError(f"layer {layer!r} does not exist; the predictor has layers 0..{self.n_layers - 1}")
        if not isinstance(resid, Tensor) or resid.ndim != 3 or resid.shape[-1] != self.config.d_model:
            raise UserError(f"resid must be a tensor [batch, pos, {self.config.d_model}], got {_described(resid)}")
        return self.decide(layer, pooled_features(resid, attention_mask))

    def probe_macs(self, seq_len: int) -> int:
        """Multiply-adds of one layer's probe for one sequence of ``seq_len`` tokens: RMS
        normalization and pooling (3·d·T: squares, scaling, sum), standardization (2·d) and the
        rank-r map (d·r + r·H)."""
        d, r, H = self.config.d_model, self.config.rank, self.config.n_heads
        return 3 * d * seq_len + 2 * d + d * r + r * H

    def cost_fraction(self, shape, seq_len: int) -> float:
        """:meth:`probe_macs` as a fraction of one layer's multiply-adds for the same sequence by
        the FLOP model (``shape``: a :class:`~inactive_heads.pruning.accountant.ModelShape`; causal
        attention, so token t attends to t + 1 keys: (T + 1) / 2 on average; multiply-adds = FLOPs / 2)."""
        one_layer = replace(shape, n_layers=1, vocab_size=0)  # no LM head: exactly one layer's FLOPs
        layer_macs = seq_len * one_layer.flops_per_token((seq_len + 1) / 2) / 2
        return self.probe_macs(seq_len) / layer_macs

    # -- files ------------------------------------------------------------------------------
    def save(self, directory) -> Path:
        """Write ``predictor.safetensors`` (the weights) and ``predictor.json`` (the config) to ``directory``."""
        from safetensors.torch import save

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {"mean": self.mean, "scale": self.scale, "down": self.down, "up": self.up, "bias": self.bias}
        write_bytes_atomic(directory / WEIGHTS_FILE, save({k: v.contiguous().cpu() for k, v in tensors.items()}))
        write_json_atomic(directory / CONFIG_FILE, self.config.to_dict())
        return directory

    @classmethod
    def load(cls, directory) -> "Predictor":
        """A predictor saved by :meth:`save` (a directory holding its two files)."""
        from safetensors.torch import load

        directory = check_path(directory, "predictor directory")
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise MissingFileError(f"{directory / name} not found; give the directory that `inactive-heads "
                                       "predict fit` wrote (it holds predictor.json and predictor.safetensors)")
        try:
            d = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
            raise UserError(f"{directory / CONFIG_FILE} is not a predictor config (not valid JSON: {err}); refit the "
                            "predictor") from None
        try:
            config = PredictorConfig.from_dict(d)
        except UserError as err:
            raise UserError(f"{directory / CONFIG_FILE} is not a predictor config: {err}") from None
        if config.format != FORMAT:
            raise UserError(f"{directory} holds a predictor of format {config.format}; this version reads {FORMAT}")
        try:
            tensors = load((directory / WEIGHTS_FILE).read_bytes())
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error class for a damaged file
            raise UserError(f"{directory / WEIGHTS_FILE} is not a safetensors file ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}); refit the predictor") from None
        missing = [k for k in ("mean", "scale", "down", "up", "bias") if k not in tensors]
        if missing:
            raise UserError(f"{directory / WEIGHTS_FILE} lacks the weights {missing}; refit the predictor")
        return cls(config, **{k: tensors[k] for k in ("mean", "scale", "down", "up", "bias")})

    def digest(self) -> str:
        """A SHA-256 of what the predictor's decisions depend on: its weights (float32 bytes), its
        decision threshold and its lookahead; equal digests decide alike on every input."""
        import hashlib

        h = hashlib.sha256()
        parts = [t.detach().cpu().contiguous().numpy().tobytes() for t in (self.mean, self.scale, self.down,
                                                                            self.up, self.bias)]
        for part in parts + [repr((self.config.decision_threshold, self.lookahead)).encode()]:
            h.update(len(part).to_bytes(8, "little") + part)
        return h.hexdigest()

    def check_model(self, n_layers: int, n_heads: int, d_model: int, name: str = "the model") -> None:
        """A one-line error when the predictor was fit for other shapes than ``name``'s."""
        c = self.config
        if (c.n_layers, c.n_heads, c.d_model) != (n_layers, n_heads, d_model):
            raise UserError(
                f"the predictor was fit on {c.model!r} ({c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}), "
                f"but {name} has {n_layers} layers, {n_heads} heads, d_model {d_model}; fit one for this model "
                "with `inactive-heads predict fit`"
            )


# ----------------------------------------------------------------------------------------------
# Fitting


def fit_layer(
    features: Float[Tensor, "n d_model"], flags: Bool[Tensor, "n n_heads"], options: FitOptions, layer: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One layer's probe: ``(mean, scale, down, up, bias)`` minimizing the mean logistic loss of
    ``flags`` plus ``options.l2`` × the squared weights of the rank-r map (full-batch Adam on the
    CPU in float32, initialized from ``options.seed + layer``: the same inputs give the same bits)."""
    x = features.detach().float().cpu()
    y = flags.detach().float().cpu()
    n, d = x.shape
    H = y.shape[1]
    mean = x.mean(dim=0)
    scale = x.std(dim=0, unbiased=False).clamp_min(1e-6)
    xs = (x - mean) / scale
    gen = torch.Generator().manual_seed(options.seed + layer)
    with torch.inference_mode(False), torch.enable_grad():
        down = (torch.randn(d, options.rank, generator=gen) / d ** 0.5).requires_grad_(True)
        up = torch.zeros(options.rank, H, requires_grad=True)
        rate = y.mean(dim=0).clamp(1e-3, 1 - 1e-3)
        bias = torch.log(rate / (1 - rate)).clone().requires_grad_(True)
        opt = torch.optim.Adam([down, up, bias], lr=options.lr)
        for _ in range(options.steps):
            opt.zero_grad()
            logits = (xs @ down) @ up + bias
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
            loss = loss + options.l2 * (down.pow(2).sum() + up.pow(2).sum())
            loss.backward()
            opt.step()
    return mean, scale, down.detach(), up.detach(), bias.detach()


def decision_threshold(logits: Tensor, target_fraction: float) -> float:
    """The logit cut that holds ``round(target_fraction · N)`` of the ``N`` entries of ``logits``:
    midway between the k-th and (k+1)-th largest (so the held fraction is within 1/(2N) of the
    target, ties aside).

    >>> decision_threshold(torch.tensor([0.0, 1.0, 2.0, 3.0]), 0.5)
    1.5
    """
    if not (0.0 <= target_fraction <= 1.0):
        raise UserError(f"target fraction must be in [0, 1], got {target_fraction!r}")
    flat = logits.detach().double().flatten().sort(descending=True).values
    n = flat.numel()
    if n == 0:
        raise UserError("no logits to set a decision threshold on")
    k = int(round(target_fraction * n))
    if k == 0:
        return float(flat[0]) + 1.0
    if k == n:
        return float(flat[-1]) - 1.0
    return float((flat[k - 1] + flat[k]) / 2)


def fit_predictor(
    features: Float[Tensor, "seq n_layers d_model"],
    flags: Bool[Tensor, "seq n_layers n_heads"],
    *,
    lookahead: int = 0,
    options: FitOptions | None = None,
    model: str = "model",
    score: str = "",
    threshold: float = float("nan"),
    task: str | None = None,
    p: float | None = None,
) -> Predictor:
    """Fit one probe per layer (features of ``feature_layer(l, lookahead)`` → flags of layer ``l``)
    and the decision threshold that matches the oracle's held fraction on these sequences."""
    lookahead = _check_lookahead(lookahead)
    options = options or FitOptions()
    if features.ndim != 3 or flags.ndim != 3 or features.shape[:2] != flags.shape[:2]:
        raise UserError(f"features [seq, layer, d_model] and flags [seq, layer, head] must agree; got "
                        f"{tuple(features.shape)} and {tuple(flags.shape)}")
    n, L, d = features.shape
    H = flags.shape[2]
    if n < 2:
        raise UserError(f"fitting needs at least 2 sequences, got {n}")
    parts = [fit_layer(features[:, feature_layer(l, lookahead)], flags[:, l], options, l) for l in range(L)]
    mean, scale, down, up, bias = (torch.stack([p_[i] for p_ in parts]) for i in range(5))
    config = PredictorConfig(model=model, n_layers=L, n_heads=H, d_model=d, score=score, threshold=float(threshold),
                             lookahead=lookahead, rank=options.rank, decision_threshold=0.0, task=task, p=p,
                             fit={"options": asdict(options), "n_sequences": n,
                                  # per (layer, head): on how many fit sequences the oracle held it (the
                                  # static set's ranking when the fit questions are not in an eval's plan)
                                  "oracle_flag_counts": flags.sum(dim=0).tolist()},
                             versions=library_versions())
    predictor = Predictor(config, mean, scale, down, up, bias)
    all_logits = torch.stack([predictor.logits(l, features[:, feature_layer(l, lookahead)]) for l in range(L)], 1)
    oracle = float(flags.double().mean())
    predictor.config = replace(config, decision_threshold=decision_threshold(all_logits, oracle))
    predictor.config.fit["metrics"] = compare(predictor.predict(features), flags).summary()
    return predictor


# ----------------------------------------------------------------------------------------------
# Metrics


@dataclass
class Comparison:
    """Predicted held heads against the oracle's flags, per layer and overall."""

    precision: list[float]  # per layer; NaN where nothing was predicted
    recall: list[float]  # per layer; NaN where the oracle flagged nothing
    predicted_fraction: list[float]
    oracle_fraction: list[float]
    micro_precision: float
    micro_recall: float
    n_sequences: int

    def summary(self) -> dict[str, Any]:
        """Means over the layers where each is defined (and how many), the pooled (micro) figures,
        and the realized fractions overall."""
        def mean_defined(xs):
            ok = [x for x in xs if x == x]
            return (sum(ok) / len(ok) if ok else float("nan")), len(ok)

        p, np_ = mean_defined(self.precision)
        r, nr = mean_defined(self.recall)
        L = len(self.precision)
        return {"mean_precision": p, "layers_with_precision": np_, "mean_recall": r, "layers_with_recall": nr,
                "micro_precision": self.micro_precision, "micro_recall": self.micro_recall,
                "predicted_fraction": sum(self.predicted_fraction) / L, "oracle_fraction": sum(self.oracle_fraction) / L,
                "n_sequences": self.n_sequences, "n_layers": L}

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary()}


def compare(predicted: Bool[Tensor, "seq n_layers n_heads"], oracle: Bool[Tensor, "seq n_layers n_heads"]) -> Comparison:
    """Precision and recall of ``predicted`` against ``oracle`` per layer (over sequences × heads)."""
    if predicted.shape != oracle.shape:
        raise UserError(f"predicted {tuple(predicted.shape)} and oracle {tuple(oracle.shape)} flags differ in shape")
    pred, orc = predicted.bool().cpu(), oracle.bool().cpu()
    tp = (pred & orc).sum(dim=(0, 2)).double()
    npred = pred.sum(dim=(0, 2)).double()
    norc = orc.sum(dim=(0, 2)).double()
    nan = float("nan")
    per = pred.shape[0] * pred.shape[2]
    return Comparison(
        precision=[float(t / p) if p > 0 else nan for t, p in zip(tp, npred)],
        recall=[float(t / o) if o > 0 else nan for t, o in zip(tp, norc)],
        predicted_fraction=(npred / per).tolist() if per else [0.0] * pred.shape[1],
        oracle_fraction=(norc / per).tolist() if per else [0.0] * pred.shape[1],
        micro_precision=float(tp.sum() / npred.sum()) if npred.sum() > 0 else nan,
        micro_recall=float(tp.sum() / norc.sum()) if norc.sum() > 0 else nan,
        n_sequences=int(pred.shape[0]),
    )
