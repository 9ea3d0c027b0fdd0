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

from ..runtime.deferred import DeferredCopies
from ..runtime.hooks import HeadHookRunner, installed, make_batches, model_device, run_forward, tokenize
from ..core.io import atomic_path
from ..models.loading import model_info
from .scores import LayerActivations, layer_reads, resolve_scores
from ..core.checks import check_path
from ..core.errors import MissingFileError, NonFiniteError, OutOfRangeError, UnknownNameError, UserError, WrongTypeError
from ..core.versions import toolkit_version  # noqa: F401  (re-exported: results record it)

FORMAT_VERSION = 1  # the torch.save layout of earlier versions (read only)
SAFETENSORS_FORMAT = "inactive-heads.HeadScores/2"


@dataclass
class HeadScores:
    """Per-(sequence, layer, head) scores for several score functions.

    ``hs["ahon_ln"]`` is a float32 tensor ``[n_sequences, n_layers, n_heads]``.
    ``metadata`` records the model, dtype, inputs and toolkit version that produced them.
    """

    scores: dict[str, Float[Tensor, "seq layer head"]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.scores, dict) or not all(isinstance(t, Tensor) for t in self.scores.values()):
            raise WrongTypeError(f"scores must be a dict of score key to [seq, layer, head] tensor, got "
                                 f"{type(self.scores).__name__}")
        shapes = {tuple(t.shape) for t in self.scores.values()}
        if len(shapes) > 1:
            raise UserError(f"all score tensors must share one shape, got {sorted(shapes)}")
        for key, t in self.scores.items():
            if t.ndim != 3:
                raise UserError(f"score '{key}' has shape {tuple(t.shape)}; expected [seq, layer, head]")

    def __getitem__(self, key: str) -> Float[Tensor, "seq layer head"]:
        try:
            return self.scores[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key
            raise UnknownNameError(f"no scores for '{key}' here; recorded: {', '.join(self.scores)}") from None

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
        try:
            idx = torch.as_tensor(sequences, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError):
            raise WrongTypeError(f"sequences must be a list of sequence indices, got {sequences!r}") from None
        n = self.n_sequences
        if idx.ndim != 1 or idx.numel() and not (-n <= int(idx.min()) and int(idx.max()) < n):
            raise OutOfRangeError(f"sequences must be a list of indices in 0..{n - 1}, got {sequences!r}")
        return HeadScores({k: v[idx] for k, v in self.scores.items()}, dict(self.metadata))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename) as safetensors: the tensors, plus the metadata as
        JSON text in the file's header. Loading it back never executes code."""
        from safetensors.torch import save_file

        path = check_path(path, "path")
        header = {"format": SAFETENSORS_FORMAT, "metadata": json.dumps(self.metadata),
                  "keys": json.dumps(list(self.scores))}  # safetensors sorts names; keep our order
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.scores.items()}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=header)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HeadScores":
        """Read a file written by :meth:`save` (safetensors), or an older ``scores.pt`` (read with
        ``torch.load(weights_only=True)``, which refuses anything but tensors and plain data)."""
        path = check_path(path, "path")
        if not path.is_file():
            raise MissingFileError(f"no head scores at '{path}'; record them with record_scores(...).save(path)")
        with open(path, "rb") as f:
            head = f.read(9)
        if head[:2] == b"PK":  # a zip archive: the torch.save format of earlier versions
            return cls._load_legacy(path)
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                scores = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"'{path}' is not a HeadScores file (neither safetensors nor an older .pt): {e}") from None
        if header.get("format") != SAFETENSORS_FORMAT:
            raise UserError(f"'{path}' is a safetensors file but not HeadScores (format {header.get('format')!r})")
        order = json.loads(header.get("keys", "[]"))
        if sorted(order) == sorted(scores):
            scores = {k: scores[k] for k in order}
        return cls(scores, json.loads(header["metadata"]))

    @classmethod
    def _load_legacy(cls, path: Path) -> "HeadScores":
        import pickle

        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"'{path}' holds objects other than tensors and plain data; refusing to load it "
                             f"({first})") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise UserError(f"'{path}' is not a HeadScores file of format {FORMAT_VERSION}")
        return cls(payload["scores"], json.loads(payload["metadata"]))

    @classmethod
    def concat(cls, parts: Sequence["HeadScores"], metadata: dict[str, Any] | None = None) -> "HeadScores":
        """Stack the sequences of several recordings of the same scores, in the order given."""
        if not parts:
            raise UserError("nothing to concatenate; pass at least one HeadScores")
        keys = parts[0].keys()
        for p in parts[1:]:
            if p.keys() != keys:
                raise UserError(f"cannot concatenate HeadScores of scores {p.keys()} and {keys}")
        meta = dict(parts[0].metadata) if metadata is None else metadata
        return cls({k: torch.cat([p[k] for p in parts]) for k in keys}, meta)


def _check_finite(key: str, layer: int, values: Tensor) -> None:
    if not torch.isfinite(values).all():
        raise NonFiniteError(
            f"score '{key}' is not finite at layer {layer} (NaN/inf in the activations or the score); "
            "try dtype=torch.float32"
        )


class ScoreRecorder:
    """The recording callback: reduce each layer to ``[batch, head]`` per score and store the rows.

    Give ``on_layer`` to a :class:`HeadHookRunner` (``reads=recorder.reads``); rows are placed by
    the sequence ids of each batch. ``sequence_ids`` lists the ids the forward passes will use, in
    output order (default ``0..n_sequences-1``); :func:`record_scores` and the evaluator's
    recording pass (``evaluate(..., record=[...])``) share it, so both give the same numbers.
    """

    def __init__(self, functions, n_sequences: int, n_layers: int, n_heads: int,
                 sequence_ids: Sequence[int] | None = None):
        self.functions = list(functions)
        self.reads = layer_reads(self.functions)
        self.n_heads = n_heads
        self.out = {f.key: torch.empty((n_sequences, n_layers, n_heads), dtype=torch.float32)
                    for f in self.functions}
        self._row = None if sequence_ids is None else {int(s): r for r, s in enumerate(sequence_ids)}
        self._pending = DeferredCopies()
        if self._row is not None and len(self._row) != n_sequences:
            raise UserError(f"sequence_ids must be {n_sequences} distinct ids, got {len(self._row)}")

    def rows(self, sequence_ids: Tensor) -> Tensor:
        if self._row is None:
            return sequence_ids
        return torch.tensor([self._row[int(s)] for s in sequence_ids.tolist()], dtype=torch.long)

    def on_layer(self, acts: LayerActivations) -> None:
        # Scores stay on the layer's device; a batch is brought to the host in one copy, when the
        # next batch starts (its layer 0) or at result(): no device→host sync per layer or score.
        if acts.layer == 0:
            self.flush()
        values = []
        for f in self.functions:
            v = f(acts)
            if tuple(v.shape) != (acts.valid.shape[0], self.n_heads):
                raise UserError(
                    f"score '{f.key}' returned shape {tuple(v.shape)}; it must return [batch, head]"
                )
            values.append(v.detach().float())
        self._pending.add(acts.layer, acts.batch, acts.sequence_ids, torch.stack(values))  # [score, batch, head]

    def flush(self) -> None:
        """Copy the pending layers' scores to the host (one copy per batch) and check they are finite."""
        for batch in self._pending.drain():
            host = batch.values  # [layer, score, batch, head]
            finite = torch.isfinite(host).flatten(2).all(dim=2)
            if not finite.all():
                i, k = (~finite).nonzero()[0].tolist()
                _check_finite(self.functions[k].key, batch.layers[i], host[i, k])
            rows = self.rows(batch.sequence_ids)[:, None]
            layers = torch.tensor(batch.layers)[None, :]
            for k, f in enumerate(self.functions):
                self.out[f.key][rows, layers] = host[:, k].transpose(0, 1)

    def result(self, metadata: dict[str, Any]) -> HeadScores:
        self.flush()
        return HeadScores(dict(self.out), metadata)


def scores_metadata(model, keys: Sequence[str], sequences: Sequence[Sequence[int]], *, description: str | None,
                    batch_size: int, seed: int, seconds: float) -> dict[str, Any]:
    """The metadata a :class:`HeadScores` carries: model, dtype, inputs, versions."""
    info = model_info(model)
    n = len(sequences)
    return {
        "model": info.name,
        "model_info": info.to_dict(),
        "dtype": info.dtype,
        "backend": info.backend,
        "scores": list(keys),
        "n_sequences": n,
        "n_tokens": sum(len(s) for s in sequences),
        "lengths": [len(s) for s in sequences],
        "inputs": description or f"{n} sequences",
        "batch_size": batch_size,
        "seed": seed,
        "seconds": round(seconds, 3),
        "toolkit_version": toolkit_version(),
        "torch_version": str(torch.__version__),
    }


def record_scores(
    model,
    inputs: Sequence[str] | Sequence[Sequence[int]],
    scores: str | Sequence[str] | None = None,
    *,
    batch_size: int = 8,
    progress: bool = True,
    seed: int = 0,
    description: str | None = None,
    attention: str = "exact",
) -> HeadScores:
    """Score every head on every input, streaming inside hooks.

    >>> hs = record_scores(model, ["The cat sat on the mat."], ["ahon_ln", "awft"])  # doctest: +SKIP
    >>> hs["ahon_ln"].shape                                                          # doctest: +SKIP
    torch.Size([1, 30, 9])

    ``inputs`` are strings (tokenized without BOS or other special tokens: the first token is
    the first token of the text) or token-id lists used as given. ``scores`` is None for every
    registered score, or keys. Batches are length-sorted and right-padded; pads are excluded from
    every score, so results do not depend on ``batch_size``. The forward stops after the last
    layer's attention: no MLP of the last layer, no logits. ``attention`` is the attention form
    (:func:`~inactive_heads.runtime.hooks.run_forward`): the default ``"exact"`` gives the numbers that
    ``evaluate``'s dynamic runs compute in-pass by default; use ``"fast"`` to calibrate for runs
    evaluated with ``attention="fast"``.
    """
    functions = resolve_scores(scores)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise WrongTypeError(f"seed must be an integer, got {type(seed).__name__}")
    info = model_info(model)
    sequences = tokenize(model, inputs)
    n = len(sequences)
    recorder = ScoreRecorder(functions, n, info.n_layers, info.n_heads)
    runner = HeadHookRunner(model, recorder.on_layer, reads=recorder.reads, seed=seed, stop_after_last_layer=True)
    device = model_device(model)
    start = time.perf_counter()
    bar = tqdm(total=n, desc="recording scores", unit="seq", disable=not progress)
    with installed(model, runner.fwd_hooks()):
        for batch in make_batches(sequences, batch_size, device=device):
            runner.set_batch(batch.valid, batch.indices)
            run_forward(model, batch.tokens, batch.valid, stop_early=True, attention=attention)
            bar.update(len(batch.indices))
    bar.close()
    metadata = scores_metadata(model, [f.key for f in functions], sequences, description=description,
                               batch_size=batch_size, seed=seed, seconds=time.perf_counter() - start)
    return recorder.result(metadata)
