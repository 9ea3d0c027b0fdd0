"""Record head scores streaming: hooks reduce each layer to [batch, head] and keep nothing else."""

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from .hooks import HeadHookRunner, make_batches, model_device, run_forward, tokenize
from .io import atomic_path
from .models import model_info
from .scores import LayerActivations, get_score, layer_reads, resolve_scores

FORMAT_VERSION = 1


def toolkit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inactive-heads")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class HeadScores:
    """Per-(sequence, layer, head) scores for several score functions.

    ``hs["ahon_ln"]`` is a float32 tensor ``[n_sequences, n_layers, n_heads]``.
    ``metadata`` records the model, dtype, inputs and toolkit version that produced them.
    """

    scores: dict[str, Float[Tensor, "seq layer head"]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        shapes = {tuple(t.shape) for t in self.scores.values()}
        if len(shapes) > 1:
            raise ValueError(f"all score tensors must share one shape, got {sorted(shapes)}")
        for key, t in self.scores.items():
            if t.ndim != 3:
                raise ValueError(f"score '{key}' has shape {tuple(t.shape)}; expected [seq, layer, head]")

    def __getitem__(self, key: str) -> Float[Tensor, "seq layer head"]:
        try:
            return self.scores[key]
        except KeyError:
            raise KeyError(f"no scores for '{key}' here; recorded: {', '.join(self.scores)}") from None

    def __contains__(self, key: str) -> bool:
        return key in self.scores

    def keys(self) -> list[str]:
        return list(self.scores)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(next(iter(self.scores.values())).shape)

    @property
    def n_sequences(self) -> int:
        return self.shape[0]

    @property
    def n_layers(self) -> int:
        return self.shape[1]

    @property
    def n_heads(self) -> int:
        return self.shape[2]

    def label(self, key: str) -> str:
        try:
            return get_score(key).label
        except KeyError:
            return key

    def mean(self, key: str) -> Float[Tensor, "layer head"]:
        """Mean score per (layer, head) over sequences."""
        return self[key].mean(dim=0)

    def to_dataframe(self, keys: Sequence[str] | None = None):
        """Long form: one row per (sequence, layer, head, score) with columns
        ``sequence, layer, head, score, value``."""
        import pandas as pd

        frames = []
        for key in keys or self.keys():
            t = self[key]
            s, l, h = torch.meshgrid(
                torch.arange(t.shape[0]), torch.arange(t.shape[1]), torch.arange(t.shape[2]), indexing="ij"
            )
            frames.append(
                pd.DataFrame(
                    {
                        "sequence": s.flatten().numpy(),
                        "layer": l.flatten().numpy(),
                        "head": h.flatten().numpy(),
                        "score": key,
                        "value": t.flatten().numpy(),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def subset(self, sequences: Sequence[int] | Tensor) -> "HeadScores":
        idx = torch.as_tensor(sequences, dtype=torch.long)
        return HeadScores({k: v[idx] for k, v in self.scores.items()}, dict(self.metadata))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename) to a ``.pt`` file holding tensors and metadata."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Metadata travels as JSON text: it must round-trip exactly and load with weights_only.
        payload = {"format": FORMAT_VERSION, "scores": self.scores, "metadata": json.dumps(self.metadata)}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HeadScores":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no head scores at '{path}'; record them with record_scores(...).save(path)")
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise ValueError(f"'{path}' is not a HeadScores file of format {FORMAT_VERSION}")
        return cls(payload["scores"], json.loads(payload["metadata"]))


def _check_finite(key: str, layer: int, values: Tensor) -> None:
    if not torch.isfinite(values).all():
        raise FloatingPointError(
            f"score '{key}' is not finite at layer {layer} (NaN/inf in the activations or the score); "
            "try dtype=torch.float32"
        )


def record_scores(
    model,
    inputs: Sequence[str] | Sequence[Sequence[int]],
    scores: str | Sequence[str] | None = None,
    *,
    batch_size: int = 8,
    progress: bool = True,
    seed: int = 0,
    description: str | None = None,
) -> HeadScores:
    """Score every head on every input, streaming inside hooks.

    >>> hs = record_scores(model, ["The cat sat on the mat."], ["ahon_ln", "awft"])  # doctest: +SKIP
    >>> hs["ahon_ln"].shape                                                          # doctest: +SKIP
    torch.Size([1, 30, 9])

    ``inputs`` are strings (tokenized without BOS or other special tokens: the first token is
    the first token of the text) or token-id lists used as given. ``scores`` is None for every
    registered score, or keys. Batches are length-sorted and right-padded; pads are excluded from
    every score, so results do not depend on ``batch_size``. The forward stops after the last
    layer's attention: no MLP of the last layer, no logits.
    """
    functions = resolve_scores(scores)
    info = model_info(model)
    sequences = tokenize(model, inputs)
    reads = layer_reads(functions)
    n, L, H = len(sequences), info.n_layers, info.n_heads
    out = {f.key: torch.empty((n, L, H), dtype=torch.float32) for f in functions}
    rows: Tensor | None = None

    def on_layer(acts: LayerActivations) -> None:
        for f in functions:
            values = f(acts)
            if tuple(values.shape) != (acts.valid.shape[0], H):
                raise ValueError(
                    f"score '{f.key}' returned shape {tuple(values.shape)}; it must return [batch, head]"
                )
            values = values.detach().float().cpu()
            _check_finite(f.key, acts.layer, values)
            out[f.key][rows, acts.layer] = values

    runner = HeadHookRunner(model, on_layer, reads=reads, seed=seed, stop_after_last_layer=True)
    device = model_device(model)
    start = time.perf_counter()
    n_tokens = sum(len(s) for s in sequences)
    bar = tqdm(total=n, desc="recording scores", unit="seq", disable=not progress)
    with model.hooks(fwd_hooks=runner.fwd_hooks()):
        for batch in make_batches(sequences, batch_size, device=device):
            rows = batch.indices
            runner.set_batch(batch.valid, batch.indices)
            run_forward(model, batch.tokens, batch.valid, stop_early=True)
            bar.update(len(rows))
    bar.close()
    metadata = {
        "model": info.name,
        "model_info": info.to_dict(),
        "dtype": info.dtype,
        "backend": info.backend,
        "scores": [f.key for f in functions],
        "n_sequences": n,
        "n_tokens": n_tokens,
        "lengths": [len(s) for s in sequences],
        "inputs": description or f"{n} sequences",
        "batch_size": batch_size,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 3),
        "toolkit_version": toolkit_version(),
        "torch_version": str(torch.__version__),
    }
    return HeadScores(out, metadata)
