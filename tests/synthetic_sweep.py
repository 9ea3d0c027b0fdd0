"""Synthetic head scores and sweep results folders for plot and report tests (no model needed)."""

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from inactive_heads.scoring.calibration import DEFAULT_QUANTILES, calibrate
from inactive_heads.scoring.recording import HeadScores
from inactive_heads.sweep.config import SweepConfig

SCORES = ("ahon_ln", "awft", "aeqd")


def synthetic_head_scores(
    keys: Sequence[str] = SCORES, n_sequences: int = 6, n_layers: int = 4, n_heads: int = 3, seed: int = 0,
    model: str = "toy-model",
) -> HeadScores:
    gen = torch.Generator().manual_seed(seed)
    scores = {k: torch.rand(n_sequences, n_layers, n_heads, generator=gen) * (1 + i) for i, k in enumerate(keys)}
    return HeadScores(scores, {"model": model})


def write_synthetic_sweep(
    path: Path,
    *,
    scores: Sequence[str] = SCORES,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    include_random: bool = True,
    n_layers: int = 4,
    n_heads: int = 3,
    baseline: float = 50.0,
    with_scores_pt: bool = True,
    skip: Sequence[str] = (),
    n_questions: int = 400,
) -> Path:
    """A sweep folder as ``run_sweep`` writes it, with made-up accuracies.

    Score ``i`` loses ``0.05 * (i + 1)`` accuracy points per % zeroed and zeroes ``(i + 1) * p``
    realized % at nominal p (Random: 1 point per % and exactly p); run ids in ``skip`` are left out.
    Each run answers ``n_questions`` four-choice questions: it gets the first round(acc · n) right
    (so accuracies are multiples of 1/n), and its log-likelihoods pick the gold answer exactly when
    it is right, otherwise the choice after it.
    """
    path.mkdir(parents=True, exist_ok=True)
    config = SweepConfig(model="toy-model", task="mmlu", subjects=["anatomy"], limit=20, scores=list(scores),
                         quantiles=list(quantiles), include_random=include_random).validate()
    (path / "sweep.json").write_text(json.dumps(config.to_dict()))
    hs = synthetic_head_scores(scores, n_layers=n_layers, n_heads=n_heads)
    if with_scores_pt and scores:
        hs.save(path / "scores.pt")
    keys = list(scores) + (["random"] if include_random else [])
    thresholds = {k: calibrate(hs if k != "random" else None, k, quantiles) for k in keys}
    (path / "thresholds.json").write_text(json.dumps({k: t.to_dict() for k, t in thresholds.items()}))
    runs = path / "runs"
    runs.mkdir(exist_ok=True)
    for run_id, key, q in config.run_ids():
        if run_id in skip:
            continue
        if key is None:
            realized, acc, tau = 0.0, baseline, None
        else:
            i = keys.index(key)
            realized = 100 * q * (1 if key == "random" else i + 1)
            slope = 1.0 if key == "random" else 0.05 * (i + 1)
            acc, tau = baseline - slope * realized, thresholds[key].at(q)
        n_right = max(0, min(n_questions, round(acc / 100 * n_questions)))
        correct = [i < n_right for i in range(n_questions)]
        acc = 100 * n_right / n_questions
        golds = [i % 4 for i in range(n_questions)]
        lls = [[-2.0 - 0.1 * c for c in range(4)] for _ in range(n_questions)]
        for i, (ok, g) in enumerate(zip(correct, golds)):
            lls[i][g if ok else (g + 1) % 4] = -0.5
        # Uneven per layer, mean equal to the realized fraction.
        weights = [(layer + 1) / (n_layers * (n_layers + 1) / 2) * n_layers for layer in range(n_layers)]
        record = {
            "run_id": run_id,
            "score": key,
            "label": "No ablation" if key is None else key,
            "p": q,
            "threshold": tau,
            "accuracy": acc / 100,
            "accuracy_percent": acc,
            "acc_norm": None,
            "realized_fraction": realized / 100,
            "realized_percent": realized,
            "realized_fraction_per_layer": [realized / 100 * w for w in weights],
            "n": n_questions,
            "n_forward_sequences": n_questions,
            "correct": correct,
            "gold": golds,
            "loglikelihoods": lls,
            "per_subject": {},
            "seconds": 1.0,
            "ablation": None,
            "finished_at": "2026-01-02T03:04:05",
        }
        (runs / f"{run_id}.json").write_text(json.dumps(record))
    return path


__all__ = ["SCORES", "synthetic_head_scores", "write_synthetic_sweep"]
