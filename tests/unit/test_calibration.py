import json
from importlib.resources import files

import numpy as np
import pytest
import torch

from inactive_heads.scoring.calibration import (
    DEFAULT_QUANTILES,
    Thresholds,
    calibrate,
    flag_fraction,
    official_models,
    official_tasks,
    official_thresholds,
)
from inactive_heads.scoring.recording import HeadScores


def _synthetic(seed: int = 0, shape=(37, 5, 7)) -> HeadScores:
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(shape, generator=gen)
    return HeadScores(
        {
            "ahon_ln": base * 2.0,  # "below"
            "awft": torch.rand(shape, generator=gen) ** 3,  # "above"
            "random": torch.rand(shape, generator=gen),
        },
        {"model": "synthetic"},
    )


def test_hand_computed_thresholds_below_and_above():
    x = torch.arange(1.0, 11.0).reshape(10, 1, 1)  # pool 1..10, y_i = i/10
    below = calibrate(x, "s", direction="below")
    assert below.values == pytest.approx((1.0, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0))
    above = calibrate(x, "s", direction="above")
    # y = 1 - p: 1.0 -> 10, 0.95 -> 9.5, 0.9 -> 9, 0.85 -> 8.5, ...
    assert above.values == pytest.approx((10.0, 9.5, 9.0, 8.5, 8.0, 7.5, 7.0))
    assert below.n_scores == 10 and below.source == "calibrated"
    assert below.quantiles == DEFAULT_QUANTILES


def test_p0_gives_min_below_and_max_above():
    hs = _synthetic()
    lo = calibrate(hs, "ahon_ln")
    hi = calibrate(hs, "awft")
    assert lo.direction == "below" and hi.direction == "above"
    assert lo.values[0] == pytest.approx(float(hs["ahon_ln"].min()))
    assert hi.values[0] == pytest.approx(float(hs["awft"].max()))
    assert flag_fraction(hs, "ahon_ln", lo.values[0]) == 0.0
    assert flag_fraction(hs, "awft", hi.values[0]) == 0.0


@pytest.mark.parametrize("key", ["ahon_ln", "awft"])
def test_flagged_fraction_matches_p(key):
    hs = _synthetic(seed=3)
    n = hs[key].numel()
    qs = (0.0, 0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.9)
    th = calibrate(hs, key, qs)
    assert th.n_scores == n
    for p, tau in th:
        assert abs(flag_fraction(hs, key, tau) - p) <= 1.0 / n + 1e-9, (p, tau)
    # Thresholds move the right way: more heads flagged as p grows.
    vals = np.array(th.values)
    assert (np.diff(vals) >= 0).all() if key == "ahon_ln" else (np.diff(vals) <= 0).all()


def test_direction_operators_are_strict():
    x = torch.tensor([1.0, 2.0, 2.0, 3.0]).reshape(4, 1, 1)
    assert flag_fraction(x, "s", 2.0, "below") == 0.25  # only 1 < 2
    assert flag_fraction(x, "s", 2.0, "above") == 0.25  # only 3 > 2


def test_raw_array_and_registered_default_direction():
    arr = np.linspace(0.0, 1.0, 101).reshape(101, 1, 1)
    t = calibrate(arr, "awft")  # registered: "above"
    assert t.direction == "above"
    assert t.values[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not registered"):
        calibrate(arr, "my_unknown_score")


def test_random_thresholds_are_p():
    hs = _synthetic()
    t = calibrate(hs, "random")
    assert t.values == DEFAULT_QUANTILES
    assert t.n_scores == hs["random"].numel()
    assert calibrate(None, "random", (0.1, 0.2)).values == (0.1, 0.2)


def test_validation_errors():
    x = torch.rand(4, 2, 3)
    with pytest.raises(ValueError, match="empty"):
        calibrate(x, "ahon_ln", ())
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        calibrate(x, "ahon_ln", (0.1, 1.0))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        calibrate(x, "ahon_ln", (-0.1,))
    bad = x.clone()
    bad[0, 0, 0] = float("nan")
    bad[1, 1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"'ahon_ln': 2 of 24 values are NaN/inf"):
        calibrate(bad, "ahon_ln")
    with pytest.raises(ValueError, match="direction"):
        calibrate(x, "ahon_ln", direction="sideways")
    with pytest.raises(KeyError, match="no scores for 'aeqd'"):
        calibrate(_synthetic(), "aeqd")


def test_thresholds_roundtrip_and_iteration():
    t = calibrate(_synthetic(), "ahon_ln")
    back = Thresholds.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t
    assert t.items() == list(zip(t.quantiles, t.values))
    assert t.at(0.15) == t.values[3]
    with pytest.raises(KeyError):
        t.at(0.5)
    with pytest.raises(ValueError, match="2 quantiles but 1 values"):
        Thresholds("k", (0.0, 0.1), (1.0,), "below")


# The paper's released thresholds (the authors' thresholds.json, MIT License), typed here by hand from
# that file: (task, model, our key) -> τ at p = 0, 5, ..., 30 %. The release names the scores
# HONOR (ahon_ln), Dormant (awft), NormalizedEntropy (aeqd_ln),
# HeadOutputMagnitudeNormalizedHeadLastToken (lthon_hn), ValueVectorAvgMagnitude (avvn) and
# UnnormalizedHONOR (ahon).
RELEASED = {
    ("mmlu", "meta-llama/Llama-3.2-3B", "ahon_ln"):
        [0.1337890625, 0.36328125, 0.46484375, 0.546875, 0.6171875, 0.6875, 0.75],
    ("piqa", "Qwen/Qwen2.5-7B", "awft"):
        [1.0, 0.9375, 0.89453125, 0.8515625, 0.81640625, 0.78125, 0.74609375],
    ("winogrande", "allenai/OLMo-2-1124-7B-Instruct", "aeqd_ln"):
        [0.261474609375, 0.828125, 0.8740234375, 0.900390625, 0.9189453125, 0.93359375, 0.9453125],
    ("mmlu", "Qwen/Qwen2.5-14B", "lthon_hn"):
        [0.03955078125, 0.2470703125, 0.32421875, 0.38671875, 0.439453125, 0.490234375, 0.54296875],
    ("piqa", "meta-llama/Llama-3.1-8B-Instruct", "avvn"):
        [0.2294921875, 0.796875, 1.9296875, 2.171875, 2.3125, 2.421875, 2.578125],
    ("winogrande", "Qwen/Qwen2.5-0.5B", "ahon"):
        [0.0595703125, 0.27734375, 0.65625, 0.84375, 1.0078125, 1.1171875, 1.265625],
}
# sha256 of the packaged copy of the released file, taken when it was added: an edit to any τ in it fails,
# not only to those typed above.
RELEASED_SHA256 = "c74f614cb50346cd33460fd2962afdfd719a77c8d5d5a003e6a376256b8d995a"


@pytest.mark.parametrize("task, model, key", list(RELEASED))
def test_official_preset_equals_the_released_values(task, model, key):
    for name in (model, model.replace("/", "_")):
        t = official_thresholds(name, task, key)
        assert list(t.values) == RELEASED[task, model, key]
        assert t.quantiles == DEFAULT_QUANTILES
        assert t.source == f"official:{task}/{model.replace('/', '_')}"


def test_official_preset_directions_names_and_random():
    assert official_thresholds("meta-llama/Llama-3.2-3B", "mmlu", "ahon_ln").direction == "below"
    assert official_thresholds("Qwen/Qwen2.5-7B", "piqa", "awft").direction == "above"
    assert official_thresholds("meta-llama/Llama-3.2-3B", "mmlu", "HONOR").key == "ahon_ln"
    assert official_thresholds("meta-llama/Llama-3.2-3B", "mmlu", "random").values == DEFAULT_QUANTILES


def test_packaged_json_is_the_released_file():
    import hashlib

    ours = files("inactive_heads").joinpath("data", "official_thresholds.json").read_bytes()
    assert hashlib.sha256(ours).hexdigest() == RELEASED_SHA256
    notice = files("inactive_heads").joinpath("data", "OFFICIAL_THRESHOLDS_LICENSE.txt").read_text()
    assert "MIT License" in notice and "Copyright (c) 2026 Pedro Sandoval" in notice


def test_official_models_and_errors():
    assert official_tasks() == ["mmlu", "piqa", "winogrande"]
    models = official_models("mmlu")
    assert len(models) == 14 and models[0] == "meta-llama_Llama-3.2-3B"
    assert official_models() == models
    with pytest.raises(ValueError, match="available: mmlu, piqa, winogrande"):
        official_models("gsm8k")
    with pytest.raises(ValueError, match="Qwen_Qwen2.5-14B"):
        official_thresholds("gpt2", "mmlu", "awft")
    with pytest.raises(ValueError, match="no official thresholds for score 'fho'"):
        official_thresholds("meta-llama/Llama-3.2-3B", "mmlu", "fho")


def test_has_matches_a_quantile_up_to_1e_9_and_nothing_else():
    t = Thresholds("awft", (0.1, 0.3), (0.5, 0.7), "below")
    assert t.has(0.1) and t.has(0.3 + 5e-10)
    assert not t.has(0.2) and not t.has(0.1 + 1e-8)
