"""Prefix reuse (:class:`SharedPrefix`) equals running the whole sequences, on a tiny GQA model
(a ``HookedTransformer`` on TransformerLens 3.9, a ``TransformerBridge`` over Llama on 4).

The reference is the model's own forward on the full sequences (prefix + rest, one padded
batch) with the ablation's ordinary ``hook_z`` hooks, or :func:`record_scores` for recorded scores.
The code under test runs only the rest of each sequence against the cached prefix tree. Dynamic
thresholds are set inside the score distribution so that sequences decide differently and the
tree branches (each test checks that it did).
"""

import pytest
import torch

import inactive_heads as ih
from inactive_heads.ablation.head_ablation import DynamicAblation, StaticAblation
from inactive_heads.runtime.fast_attention import fast_attention
from inactive_heads.runtime.hooks import make_batches
from inactive_heads.runtime.prefix import ReuseStats, SharedPrefix
from inactive_heads.scoring.recording import ScoreRecorder
from inactive_heads.scoring.scores import resolve_scores
from tiny import tiny_gqa_model


TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_gqa_model(seed=5, n_layers=4)


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, 97, (17,), generator=gen).tolist()
    rests = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (6, 1, 9, 3, 12, 4, 7)]
    return prefix, rests


def _full_reference(model, prefix, rests, ablation):
    """Logits at the rest's positions and the per-sequence flags, from whole sequences."""
    full = [prefix + r for r in rests]
    width = max(map(len, full))
    tokens = torch.zeros((len(full), width), dtype=torch.long)
    valid = torch.zeros((len(full), width), dtype=torch.bool)
    for i, seq in enumerate(full):
        tokens[i, : len(seq)] = torch.tensor(seq)
        valid[i, : len(seq)] = True
    with torch.inference_mode():
        if ablation is None:
            logits = model(tokens, attention_mask=valid.long())
        else:
            with ablation.apply(model, valid=valid):  # sequence i has id i
                logits = model(tokens, attention_mask=valid.long())
    p = len(prefix)
    return [logits[i, p: p + len(r)] for i, r in enumerate(rests)]


def _shared(model, prefix, rests, callbacks, reads, batch_size, *, fused=False, cache_bytes=None):
    stats = ReuseStats()
    out = [None] * len(rests)
    kwargs = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    with torch.inference_mode(), fast_attention(model, fused=fused):
        shared = SharedPrefix(model, prefix, callbacks, reads=reads, stats=stats, **kwargs)
        for batch in make_batches(rests, batch_size):
            resid = shared.forward(batch.tokens, batch.valid, batch.indices)
            logits = model.unembed(model.ln_final(resid))
            for row, i in enumerate(batch.indices.tolist()):
                out[i] = logits[row, : len(rests[i])]
    return out, stats


def _tau(model, prefix, rests, key, q):
    hs = ih.record_scores(model, [prefix + r for r in rests], [key], progress=False)
    return float(torch.quantile(hs[key].flatten(), q))


@pytest.mark.parametrize("key, q", [("ahon_ln", 0.2), ("awft", 0.7), ("avvn", 0.4)])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_dynamic_reuse_equals_full_sequences(model, data, key, q, batch_size):
    prefix, rests = data
    tau = _tau(model, prefix, rests, key, q)
    ref_abl, abl = DynamicAblation(key, tau), DynamicAblation(key, tau)
    ref = _full_reference(model, prefix, rests, ref_abl)
    abl.reset(model)
    got, stats = _shared(model, prefix, rests, [abl.flags_for], abl.reads, batch_size)
    ref_flags, flags = ref_abl.stats.flagged_mask(), abl.stats.flagged_mask()
    assert 0 < ref_flags.float().mean() < 1
    assert torch.equal(ref_flags, flags)  # every (sequence, layer, head) decision
    assert stats.branches > 0  # sequences decided differently: the tree branched
    assert 0 < stats.computed < stats.needed
    for a, b in zip(ref, got):
        assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("key, q", [("ahon_ln", 0.2), ("awft", 0.6)])
def test_extended_prefix_runs_one_token_per_step_equal_to_full_sequences(model, data, key, q):
    # Per-step generation's reuse: step k runs only token k against a prefix extended by the
    # tokens before it (SharedPrefix.extended). Each step's logits and every decision must equal
    # the whole sequence prefix + rest[:k + 1] run by TransformerLens with ordinary hooks.
    prefix, rests = data
    rest = rests[4]  # 12 tokens: 12 steps
    steps = [rest[: k + 1] for k in range(len(rest))]
    tau = _tau(model, prefix, steps, key, q)
    ref_abl, abl = DynamicAblation(key, tau), DynamicAblation(key, tau)
    ref = _full_reference(model, prefix, steps, ref_abl)  # sequence k has id k
    abl.reset(model)
    stats = ReuseStats()
    with torch.inference_mode(), fast_attention(model, fused=False):
        shared = SharedPrefix(model, prefix, [abl.flags_for], reads=abl.reads, stats=stats)
        for k, token in enumerate(rest):
            assert shared.length == len(prefix) + k
            tokens = torch.tensor([[token]])
            resid = shared.forward(tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor([k]), keep=True)
            logits = model.unembed(model.ln_final(resid))[0, -1]
            assert (logits - ref[k][-1]).abs().max() <= TOL
            (shared,) = shared.extended()
    ref_flags = ref_abl.stats.flagged_mask()
    assert 0 < ref_flags.float().mean() < 1
    assert torch.equal(ref_flags, abl.stats.flagged_mask())  # every (step, layer, head) decision
    assert stats.branches > 0  # some step decided otherwise than the one before: recomputed from there
    # Only the first prefix and the branches were computed, not every step's whole sequence.
    assert model.cfg.n_layers <= stats.computed < stats.needed == model.cfg.n_layers * len(rest)


def test_extended_needs_a_kept_forward(model, data):
    prefix, rests = data
    with torch.inference_mode(), fast_attention(model, fused=False):
        shared = SharedPrefix(model, prefix, [])
        tokens = torch.tensor([rests[0]])
        shared.forward(tokens, torch.ones_like(tokens, dtype=torch.bool), torch.tensor([0]))
        with pytest.raises(RuntimeError, match="keep=True"):
            shared.extended()


def test_branches_not_kept_past_the_cache_budget_give_the_same_numbers(model, data):
    prefix, rests = data
    tau = _tau(model, prefix, rests, "ahon_ln", 0.3)
    runs = {}
    for budget in (None, 0):
        abl = DynamicAblation("ahon_ln", tau)
        abl.reset(model)
        runs[budget] = _shared(model, prefix, rests, [abl.flags_for], abl.reads, 2, cache_bytes=budget) + (
            abl.stats.flagged_mask(),)
    (kept, kept_stats, kept_flags), (dropped, dropped_stats, dropped_flags) = runs[None], runs[0]
    assert torch.equal(kept_flags, dropped_flags)
    assert all(torch.equal(a, b) for a, b in zip(kept, dropped))
    # nothing kept: every batch recomputes the prefix, so more prefix layers are computed
    assert dropped_stats.computed > kept_stats.computed


def test_plain_and_static_reuse_one_path_with_fused_attention(model, data):
    prefix, rests = data
    for heads in (None, [(0, 1), (0, 4), (2, 0), (3, 5)]):
        make = (lambda: None) if heads is None else (lambda: StaticAblation(heads))
        ref = _full_reference(model, prefix, rests, make())
        abl = make()
        callbacks, reads = [], ("z",)
        if abl is not None:
            abl.reset(model)
            callbacks, reads = [abl.flags_for], abl.reads
        got, stats = _shared(model, prefix, rests, callbacks, reads, 3, fused=True)
        assert stats.branches == 0
        assert stats.computed == model.cfg.n_layers  # the prefix once, whatever the batch count
        for a, b in zip(ref, got):
            assert (a - b).abs().max() <= TOL


def test_recorded_scores_equal_record_scores(model, data):
    """Every score, built-in ones reading pattern, values, outputs and W_O alike, sees whole sequences."""
    prefix, rests = data
    keys = ["awft", "aeqd_ln", "ftvvn", "avvn_ln", "lthon_hn", "ahon_ln", "fho"]
    ref = ih.record_scores(model, [prefix + r for r in rests], keys, progress=False)
    recorder = ScoreRecorder(resolve_scores(keys), len(rests), model.cfg.n_layers, model.cfg.n_heads)
    _shared(model, prefix, rests, [recorder.on_layer], recorder.reads, 3)
    recorder.flush()
    for key in keys:
        torch.testing.assert_close(recorder.out[key], ref[key], rtol=1e-5, atol=1e-5)
