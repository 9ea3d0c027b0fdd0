"""The lm-eval model type's log-likelihood path on a tiny GQA model, against an unbatched reference.

The reference is written here, the obvious way: one request at a time, TransformerLens's own
forward (no fused attention, no padding, no prefix reuse), full logits, ``log_softmax``, the
continuation's log-probabilities summed; truncation and head zeroing are spelled out by hand.
"""

import math

import pytest
import torch

pytest.importorskip("lm_eval")

import inactive_heads as ih  # noqa: E402
from inactive_heads.lmeval import model as lmeval  # noqa: E402
from tiny import tiny_gqa_model  # noqa: E402

TOL = 1e-5
VOCAB = 97


class _NoTokenizer:
    """The log-likelihood path gets token ids from lm-eval; a tiny model has no tokenizer files."""

    eos_token_id = 0
    bos_token_id = 1
    name_or_path = "tiny"


@pytest.fixture(scope="module")
def model():
    return tiny_gqa_model(seed=1, n_layers=3)


@pytest.fixture(scope="module")
def shared_requests(model):
    """Requests sharing long prefixes and their reference results (computed once)."""
    requests = requests_with_shared_prefixes()
    return requests, reference(model, requests, max_length=model.cfg.n_ctx)


@pytest.fixture(autouse=True)
def _tokenizer_free(monkeypatch):
    monkeypatch.setattr(lmeval, "plain_tokenizer", lambda model: _NoTokenizer())


def make_lm(model, **kwargs):
    return lmeval.InactiveHeadsLM(model, progress=False, **kwargs)


def requests_with_shared_prefixes(seed=0, n=12):
    """Few-shot-like requests: a long shared prefix, a question, 1-3 choices of 1-4 tokens."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(2, VOCAB, (36,), generator=gen).tolist()
    out = []
    for q in range(n):
        question = torch.randint(2, VOCAB, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen).tolist()
        context = (prefix if q % 3 else prefix[:5]) + question
        for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
            cont = torch.randint(2, VOCAB, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
            out.append((None, context, cont))
    return out


def reference(model, requests, *, max_length, zero=(), nan=()):
    """(log-likelihood, greedy) per request: one unpadded forward each, TransformerLens's forward.

    ``zero``: (layer, head) pairs set to 0 in ``hook_z``; ``nan``: pairs set to NaN before that."""
    def hook(layer):
        def f(z, hook):
            z = z.clone()
            for l, h in nan:
                if l == layer:
                    z[:, :, h] = float("nan")
            for l, h in zero:
                if l == layer:
                    z[:, :, h] = 0.0
            return z
        return f

    hooks = [(f"blocks.{l}.attn.hook_z", hook(l)) for l in range(model.cfg.n_layers)]
    results = []
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        for _, context, cont in requests:
            whole = (context + cont)[-(max_length + 1):]
            tokens = torch.tensor([whole[:-1]])
            logprobs = torch.log_softmax(model(tokens)[0].double(), dim=-1)
            rows = range(len(whole) - 1 - len(cont), len(whole) - 1)
            ll = sum(float(logprobs[p, t]) for p, t in zip(rows, cont))
            greedy = all(int(logprobs[p].argmax()) == t for p, t in zip(rows, cont))
            results.append((ll, greedy))
    return results


def assert_close(got, expected):
    assert len(got) == len(expected) > 0
    for (ll, greedy), (ll_ref, greedy_ref) in zip(got, expected):
        assert math.isfinite(ll)
        assert ll == pytest.approx(ll_ref, abs=TOL)
        assert greedy == greedy_ref


@pytest.mark.parametrize("attention, reuse_prefix, batch_size", [
    ("auto", False, 1), ("auto", False, 8), ("exact", False, 3), ("eager", False, 5), ("fast", False, 8),
    ("auto", True, 3), ("exact", True, 8),
])
def test_loglikelihoods_equal_an_unbatched_reference(model, shared_requests, batch_size, attention, reuse_prefix):
    requests, expected = shared_requests
    lm = make_lm(model, batch_size=batch_size, attention=attention, reuse_prefix=reuse_prefix)
    got = lm._loglikelihood_tokens(requests)
    assert_close(got, expected)
    reuse = lm.stats["loglikelihood"]["prefix_reuse"]
    assert reuse["used"] is reuse_prefix
    if reuse_prefix:
        assert reuse["inputs_reused"] > 0


def test_model_args_text_sets_attention_and_prefix_reuse(model):
    lm = make_lm(model, attention="exact", reuse_prefix="True")
    assert (lm.attention, lm.reuse_prefix) == ("exact", True)
    assert make_lm(model, reuse_prefix="false").reuse_prefix is False
    info = lm.get_model_info()["inactive_heads"]
    assert (info["attention"], info["reuse_prefix"]) == ("exact", True)


@pytest.mark.parametrize("kwargs, message", [
    ({"attention": "flash"}, "attention must be one of 'auto', 'exact', 'fast', 'eager', got 'flash'"),
    ({"reuse_prefix": "maybe"}, "reuse_prefix must be true or false, got 'maybe'"),
])
def test_bad_model_args_are_one_line_errors(model, kwargs, message):
    with pytest.raises(ih.UserError) as info:
        make_lm(model, **kwargs)
    assert str(info.value) == message


def test_requests_sharing_an_input_share_one_forward(model):
    context = [5, 6, 7, 8]
    requests = [
        (None, context, [9]),          # input 5 6 7 8
        (None, context, [10]),         # the same input
        (None, context + [9], [11]),   # input 5 6 7 8 9
        (None, context, [9, 11]),      # the same input as the previous one
    ]
    lm = make_lm(model, batch_size=2)
    got = lm._loglikelihood_tokens(requests)
    assert lm.stats["loglikelihood"]["n_sequences"] == 2
    assert_close(got, reference(model, requests, max_length=model.cfg.n_ctx))


def test_long_requests_are_left_truncated_to_max_length(model):
    gen = torch.Generator().manual_seed(4)
    requests = [(None, torch.randint(2, VOCAB, (n,), generator=gen).tolist(), [3, 4, 5][:k])
                for n, k in ((30, 1), (11, 3), (9, 2), (40, 2))]
    lm = make_lm(model, batch_size=3, max_length=12)
    got = lm._loglikelihood_tokens(requests)
    assert_close(got, reference(model, requests, max_length=12))


def test_an_answer_longer_than_max_length_is_a_one_line_error(model):
    lm = make_lm(model, max_length=4)
    with pytest.raises(ih.UserError) as info:
        lm._loglikelihood_tokens([(None, [5, 6], [7, 8, 9, 10, 11])])
    assert str(info.value) == (
        "loglikelihood request 0 choice 0 has a 5-token answer, longer than max_length 4; pass a larger max_length"
    )


@pytest.mark.parametrize("given", ["text", "spec", "instance"])
def test_static_ablation_equals_the_reference_with_heads_zeroed_by_hand(model, given):
    heads = [(0, 1), (1, 4), (2, 0), (2, 5)]
    ablation = {
        "text": "static:" + "/".join(f"{l}.{h}" for l, h in heads),
        "spec": ih.AblationSpec("static", heads=tuple(heads)),
        "instance": ih.StaticAblation(heads),
    }[given]
    requests = requests_with_shared_prefixes(seed=2, n=6)
    lm = make_lm(model, ablation=ablation, batch_size=4)
    got = lm._loglikelihood_tokens(requests)
    assert_close(got, reference(model, requests, max_length=model.cfg.n_ctx, zero=heads))
    plain = reference(model, requests, max_length=model.cfg.n_ctx)
    assert max(abs(a[0] - b[0]) for a, b in zip(got, plain)) > 1e-3  # zeroing changed something
    n_sequences = lm.stats["loglikelihood"]["n_sequences"]
    assert lm.stats["loglikelihood"]["flagged"] == n_sequences * len(heads)


def test_a_nan_in_a_zeroed_head_does_not_survive(model):
    """Zeroing is a masked_fill: a NaN (or inf) in a zeroed head's z must not reach the output."""
    heads = [(1, 2), (2, 3)]
    requests = requests_with_shared_prefixes(seed=3, n=4)
    inject = [(f"blocks.{l}.attn.hook_z", lambda z, hook, h=h: z.index_fill(2, torch.tensor([h]), float("nan")))
              for l, h in heads]
    lm = make_lm(model, ablation=ih.AblationSpec("static", heads=tuple(heads)), batch_size=3)
    with model.hooks(fwd_hooks=inject):  # registered first, so they run before the ablation's hooks
        got = lm._loglikelihood_tokens(requests)
    assert_close(got, reference(model, requests, max_length=model.cfg.n_ctx, nan=heads, zero=heads))


def test_held_heads_in_generation_are_zeroed_by_masked_fill():
    from inactive_heads.evaluation.decoding import HeldHeads

    held = HeldHeads(tiny_gqa_model(n_layers=2))  # 6 heads
    held.masks = torch.zeros(1, 2, 6, dtype=torch.bool)  # [row, layer, head]
    held.masks[0, 1, 2] = True
    hooks = dict(held.hooks())
    z = torch.randn(1, 4, 6, 5)
    z[0, 1, 2, 0] = float("nan")
    z[0, 2, 2, 1] = float("inf")
    out = hooks["blocks.1.attn.hook_z"](z, None)
    assert torch.equal(out[:, :, 2], torch.zeros(1, 4, 5))
    assert torch.equal(out[:, :, :2], z[:, :, :2]) and torch.equal(out[:, :, 3:], z[:, :, 3:])
    z0 = hooks["blocks.0.attn.hook_z"](z, None)  # nothing held in layer 0: z passes unchanged
    assert torch.equal(z0.nan_to_num(posinf=7.0), z.nan_to_num(posinf=7.0))


@pytest.mark.hooked
def test_only_the_scored_positions_are_unembedded(model):
    requests = requests_with_shared_prefixes(seed=5, n=5)
    rows = []

    def spy(x, hook):  # the unembedding's input hook: every row it projects passes here
        rows.append(x.shape[0] * x.shape[1])

    with model.hooks(fwd_hooks=[("unembed.hook_in", spy)]):
        make_lm(model, batch_size=4)._loglikelihood_tokens(requests)
    assert sum(rows) == sum(len(cont) for _, _, cont in requests)


def test_results_do_not_depend_on_batch_size_with_dynamic_ablation(model):
    requests = requests_with_shared_prefixes(seed=6, n=8)
    runs = [make_lm(model, ablation="ahon_ln@p0.3", batch_size=b) for b in (1, 5)]
    got = [lm._loglikelihood_tokens(requests) for lm in runs]
    assert_close(got[0], [(ll, g) for ll, g in got[1]])
    fractions = [lm.stats["loglikelihood"]["realized_fraction"] for lm in runs]
    assert 0 < fractions[0] == fractions[1] < 1


FIXED_HEADS_MODULE = '''
import inactive_heads as ih
from listed_heads import ZeroListedHeads


@ih.register_ablation("fixed_heads_for_test")
class FixedHeads(ZeroListedHeads):
    def __init__(self, heads=((0, 1), (1, 4), (2, 0), (2, 5))):
        super().__init__(heads)
'''


@pytest.fixture
def fixed_heads_module(tmp_path, monkeypatch):
    """A user module registering the kind ``fixed_heads_for_test``, importable but not imported."""
    import sys

    (tmp_path / "ih_fixed_heads_for_test.py").write_text(FIXED_HEADS_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ih_fixed_heads_for_test"
    if "fixed_heads_for_test" in ih.ablation_kinds():
        ih.unregister_ablation("fixed_heads_for_test")
    sys.modules.pop("ih_fixed_heads_for_test", None)


def test_a_registered_kind_from_model_args_with_imports(model, fixed_heads_module, monkeypatch):
    """``imports=MODULE,ablation=KIND`` (and a spec dict, as lm-eval's command line parses
    ``ablation={...}``): the user's class zeroes the heads, equal to zeroing them by hand."""
    monkeypatch.setattr(lmeval, "load_model", lambda spec, **kw: model)
    requests = requests_with_shared_prefixes(seed=2, n=6)
    heads = [(0, 1), (1, 4), (2, 0), (2, 5)]
    with pytest.raises(ih.UserError, match="^unknown ablation kind 'fixed_heads_for_test'; .* imports=MODULE"):
        make_lm(model, ablation="fixed_heads_for_test")  # the module is not imported yet
    lm = lmeval.InactiveHeadsLM.create_from_arg_string(
        f"pretrained=tiny,imports={fixed_heads_module},ablation=fixed_heads_for_test",
        {"batch_size": 4, "device": "cpu", "progress": False},
    )
    got = lm._loglikelihood_tokens(requests)
    assert_close(got, reference(model, requests, max_length=model.cfg.n_ctx, zero=heads))
    spec = {"kind": "fixed_heads_for_test", "heads": [list(h) for h in heads]}
    assert lm.stats["loglikelihood"]["ablation"] == spec
    assert lm.get_model_info()["inactive_heads"]["ablation"] == spec
    assert lm.stats["loglikelihood"]["flagged"] == lm.stats["loglikelihood"]["n_sequences"] * len(heads)
    other = lmeval.InactiveHeadsLM.create_from_arg_obj(
        {"pretrained": "tiny", "imports": [fixed_heads_module], "ablation": {**spec, "heads": [[1, 2]]}},
        {"batch_size": 4, "progress": False},
    )
    assert_close(other._loglikelihood_tokens(requests),
                 reference(model, requests, max_length=model.cfg.n_ctx, zero=[(1, 2)]))


def test_imports_that_fail_are_a_one_line_error(model):
    with pytest.raises(ih.UserError) as info:
        make_lm(model, imports="ih_no_such_module_xyz")
    assert str(info.value) == (
        "cannot import module 'ih_no_such_module_xyz' (model arg imports): ModuleNotFoundError: No module named "
        "'ih_no_such_module_xyz'; make it importable (PYTHONPATH) or remove it"
    )
