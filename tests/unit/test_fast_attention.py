"""Fast attention equals the model's own eager attention (tiny GQA model); prefix grouping.

The reference in every test is the unpatched forward (full sequences, no cache): TransformerLens
3.9's ``HookedTransformer``, or on TransformerLens 4 the ``TransformerBridge``'s own; the code under
test is the fused/grouped path. Tests of configurations and of the first-use check that only a
``HookedTransformer`` has carry the ``hooked`` mark; the bridge's own are in
tests/unit/test_bridge_attention.py. Prefix reuse: tests/unit/test_prefix.py.
"""

import pytest
import torch
from tiny import random_sequences, tiny_gqa_model

from inactive_heads.models.tl_line import is_hooked_transformer
from inactive_heads.runtime.fast_attention import (
    fast_attention,
    supports_fast_attention,
)
from inactive_heads.runtime.hook_registry import installed, read_only
from inactive_heads.runtime.hooks import make_batches
from inactive_heads.runtime.prefix import group_by_prefix



TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_gqa_model(seed=3)


@pytest.fixture(scope="module")
def batch():
    return next(make_batches(random_sequences(6, seed=1, min_len=4, max_len=24), 6))


def _forward(model, batch):
    with torch.inference_mode():
        return model(batch.tokens, attention_mask=batch.valid.long())


def test_fused_logits_equal_eager_on_padded_gqa_batch(model, batch):
    ref = _forward(model, batch)
    with fast_attention(model) as on:
        fast = _forward(model, batch)
    assert on
    assert (ref - fast)[batch.valid].abs().max() <= TOL
    # and the patch is gone afterwards: the module's own forward runs again
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)


def test_unfused_path_equals_eager_to_rounding(model, batch):
    ref = _forward(model, batch)
    with fast_attention(model, fused=False):
        out = _forward(model, batch)
    assert (ref - out)[batch.valid].abs().max() <= 1e-5


def test_hooks_fire_with_eager_values(model, batch):
    """hook_z/hook_v see the same tensors; hook_pattern fires (eager-grouped path) with the same pattern."""
    names = ("blocks.1.attn.hook_z", "blocks.1.attn.hook_v", "blocks.1.attn.hook_pattern")

    def capture():
        seen = {}
        # keyed by the name asked for: a bridge names its hook points by their own paths
        hooks = [(n, lambda x, hook, n=n: seen.__setitem__(n, x.clone())) for n in names]
        with model.hooks(fwd_hooks=hooks):
            _forward(model, batch)
        return seen

    ref = capture()
    with fast_attention(model):
        fast = capture()
    assert set(fast) == set(names)
    q = batch.valid  # compare at real query positions (pads are excluded by every score)
    assert (ref[names[0]] - fast[names[0]])[q].abs().max() <= 1e-5
    assert (ref[names[1]] - fast[names[1]])[q].abs().max() <= 1e-5
    assert (ref[names[2]] - fast[names[2]]).permute(0, 2, 1, 3)[q].abs().max() <= 1e-6


def test_pattern_replaced_by_a_hook_is_used(model, batch):
    """Zeroing head 2's pattern via hook_pattern zeroes its hook_z, as in the eager model."""

    def zero_head(p, hook):
        p = p.clone()
        p[:, 2] = 0.0
        return p

    zs = {}
    hooks = [("blocks.0.attn.hook_pattern", zero_head), ("blocks.0.attn.hook_z", lambda z, hook: zs.update(z=z))]
    with fast_attention(model), model.hooks(fwd_hooks=hooks):
        _forward(model, batch)
    assert zs["z"][:, :, 2].abs().max() == 0.0
    assert zs["z"][:, :, 1].abs().max() > 0.0


def test_read_only_pattern_hooks_leave_z_bit_identical_and_in_place_edits_count(model, batch):
    """A read-only pattern hook sees the eager pattern and changes no number; an unmarked hook that
    edits the pattern in place (returning None) is honoured, as in TransformerLens."""
    with fast_attention(model):
        plain = _forward(model, batch)
        seen = []
        reader = read_only(lambda p, hook: seen.append(p.sum().item()))
        with installed(model, [("blocks.0.attn.hook_pattern", reader)]):
            read = _forward(model, batch)

        def in_place(p, hook):
            p[:, 3] = 0.0

        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", in_place)]):
            edited = _forward(model, batch)
    # each real query row of each head sums to 1; pad rows too (they see the real keys)
    assert seen and abs(seen[0] - 6 * batch.tokens.numel()) < 1e-2
    assert torch.equal(read, plain)
    assert (edited - plain)[batch.valid].abs().max() > 1e-3


def test_attn_scores_hook_falls_back_to_transformer_lens(model, batch):
    seen = []
    with fast_attention(model), model.hooks(fwd_hooks=[("blocks.2.attn.hook_attn_scores",
                                                          lambda s, hook: seen.append(s.shape))]):
        _forward(model, batch)
    assert seen == [torch.Size([6, 6, batch.tokens.shape[1], batch.tokens.shape[1]])]


@pytest.mark.hooked
def test_other_models_untouched_and_unsupported_configs_refused(model, batch):
    other = tiny_gqa_model(seed=4)
    with fast_attention(model):
        assert all("forward" not in block.attn.__dict__ for block in other.blocks)
    capped = tiny_gqa_model(seed=4)
    capped.cfg.attn_scores_soft_cap = 50.0
    assert not supports_fast_attention(capped)
    with fast_attention(capped) as on:
        assert not on


def test_group_by_prefix_by_hand():
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    inputs = [a + [9, 9], [5, 5, 5, 5, 5, 5], a + [7], a[:6] + [0, 0, 0], [5, 5, 5, 5, 4, 4]]
    limits = [len(x) - 1 for x in inputs]
    groups, alone = group_by_prefix(inputs, limits, min_length=4, min_fraction=0.0)
    assert [(g.tokens, g.members) for g in groups] == [([1, 2, 3, 4, 5, 6], [0, 2, 3]), ([5, 5, 5, 5], [1, 4])]
    assert alone == []
    # a scored position inside the shared part caps the prefix
    groups, _ = group_by_prefix(inputs, [3, 5, 8, 8, 5], min_length=2, min_fraction=0.0)
    assert groups[0].tokens == [1, 2, 3] and groups[0].members == [0, 2, 3]
    # nothing long enough shared: everything alone
    groups, alone = group_by_prefix(inputs, limits, min_length=7, min_fraction=0.0)
    assert [g.members for g in groups] == [[0, 2]] and alone == [1, 3, 4]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "causal-only"])
def test_exact_path_in_row_blocks_equals_eager(model, batch, monkeypatch, padded):
    """The exact path computes attention a few query rows at a time; with blocks of 5 rows the
    logits still equal TransformerLens's eager forward, and a read-only pattern hook still sees the
    whole [batch, head, query, key] pattern, equal to the eager one. Unpadded batches take the
    plain causal mask, padded ones the additive mask."""
    import inactive_heads.runtime.bridge_attention as ba
    import inactive_heads.runtime.fast_attention as fa

    if not padded:  # the longest row alone: every position real
        n = int(batch.valid[0].sum())
        batch = type(batch)(batch.tokens[:1, :n], batch.valid[:1, :n], batch.indices[:1])
    b, width = batch.tokens.shape
    for module in (fa, ba):  # a HookedTransformer's exact form, a bridge's
        monkeypatch.setattr(module, "_BLOCK_ELEMENTS", 5 * b * 6 * width)  # 5 query rows per block
    seen = {}
    grab = read_only(lambda p, hook: seen.__setitem__("blocks.1.attn.hook_pattern", p.clone()))
    hooks = [("blocks.1.attn.hook_pattern", grab)]
    with torch.inference_mode(), installed(model, hooks):
        ref = model(batch.tokens, attention_mask=batch.valid.long())
        eager_pattern = seen.pop("blocks.1.attn.hook_pattern")
        with fast_attention(model, fused=False):
            got = model(batch.tokens, attention_mask=batch.valid.long())
    assert (ref - got)[batch.valid].abs().max() <= 1e-6
    pattern = seen["blocks.1.attn.hook_pattern"]
    assert pattern.shape == eager_pattern.shape
    rows = batch.valid[:, None, :, None] & batch.valid[:, None, None, :]  # real query and key
    assert (pattern - eager_pattern).abs()[rows.expand_as(pattern)].max() <= 1e-6


# ----------------------------------------------------------------------------------------------
# Trust: nesting, restoring, two models, the allow-list, the first-use check, the hook registry


def _patched(model) -> bool:
    return any("forward" in block.attn.__dict__ for block in model.blocks)


def test_nested_blocks_of_the_same_form_run_inside_the_outer_one_and_another_form_raises(model, batch):
    from inactive_heads.core.errors import UserError

    with fast_attention(model) as outer:
        with fast_attention(model) as inner:
            assert outer and inner and _patched(model)
        assert _patched(model)  # the inner block leaves the outer one's patch in place
        for kwargs, asked in (({"fused": False}, "exact"), ({"enabled": False}, "eager")):
            with pytest.raises(UserError) as info, fast_attention(model, **kwargs):
                pass
            message = str(info.value)
            assert "\n" not in message and "'fast'" in message and f"'{asked}'" in message
        assert _patched(model)
    assert not _patched(model)
    with fast_attention(model, enabled=False):  # an eager block is a form too
        with pytest.raises(UserError, match="already runs the 'eager' attention form"), fast_attention(model):
            pass
        assert not _patched(model)


def test_the_model_is_restored_after_an_exception(model, batch):
    ref = _forward(model, batch)
    hooked = is_hooked_transformer(model)  # only a HookedTransformer's gated MLPs are patched too
    with pytest.raises(ZeroDivisionError), fast_attention(model):
        assert _patched(model) and any("forward" in block.mlp.__dict__ for block in model.blocks) == hooked
        _ = 1 / 0
    assert not _patched(model)
    assert all("forward" not in block.mlp.__dict__ for block in model.blocks)
    with fast_attention(model, fused=False):  # no stale record of the failed block: another form starts
        out = _forward(model, batch)
    assert torch.equal(_forward(model, batch), ref)
    assert (ref - out)[batch.valid].abs().max() <= 1e-5


def test_two_models_at_once_each_in_its_own_form(model, batch):
    other = tiny_gqa_model(seed=8)
    ref_a, ref_b = _forward(model, batch), _forward(other, batch)
    with fast_attention(model) as a, fast_attention(other, fused=False) as b:
        assert a and b
        out_a, out_b = _forward(model, batch), _forward(other, batch)
        with fast_attention(other, fused=False):  # the same form nests on each model independently
            assert torch.equal(_forward(other, batch), out_b)
    assert not _patched(model) and not _patched(other)
    assert (ref_a - out_a)[batch.valid].abs().max() <= TOL
    assert (ref_b - out_b)[batch.valid].abs().max() <= 1e-5
    assert (out_a - out_b)[batch.valid].abs().max() > 1e-2  # two different models, not one patched twice


@pytest.mark.hooked
def test_configurations_outside_the_allow_list_run_transformer_lens_forward_with_one_warning(batch):
    import dataclasses

    from inactive_heads.runtime.fast_attention import unsupported_reason

    capped = tiny_gqa_model(seed=4)
    capped.cfg.attn_scores_soft_cap = 50.0
    assert unsupported_reason(capped) == "config attn_scores_soft_cap=50.0 is not supported"
    warned = "^fast_attention: config attn_scores_soft_cap=50.0 is not supported; running TransformerLens's own attention forward$"
    with pytest.warns(UserWarning, match=warned), fast_attention(capped) as on:
        assert not on and not _patched(capped)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model: no second warning
        with fast_attention(capped):
            pass
    # A config field this toolkit does not know (a newer TransformerLens) is refused, not ignored.
    newer = tiny_gqa_model(seed=4)
    fields = dataclasses.fields(newer.cfg)
    extended = dataclasses.make_dataclass("NewerConfig", [("use_new_feature", bool, dataclasses.field(default=False))],
                                          bases=(type(newer.cfg),))
    newer.cfg.__class__ = extended
    newer.cfg.use_new_feature = False
    assert len(dataclasses.fields(newer.cfg)) == len(fields) + 1
    assert unsupported_reason(newer) == ("config field 'use_new_feature' is unknown to this toolkit "
                                         "(a newer TransformerLens?)")
    assert not supports_fast_attention(newer)


@pytest.mark.hooked
def test_first_use_check_falls_back_when_the_fast_forward_disagrees(batch, monkeypatch):
    """A feature TransformerLens applies and the fast forward does not (score soft-capping, let
    through the allow-list here on purpose) is caught on the first batch: warning, then
    TransformerLens's own forward, to the bit."""
    from inactive_heads.runtime.lines import hooked

    monkeypatch.setitem(hooked._ALLOWED, "attn_scores_soft_cap", lambda v: True)
    capped = tiny_gqa_model(seed=6)
    capped.cfg.attn_scores_soft_cap = 0.5  # tight enough to change every layer's output
    ref = _forward(capped, batch)
    warned = (r"^fast_attention: .*fast form's attn output at layer 0 differs from TransformerLens's own forward by "
              r".*using TransformerLens's forward")
    with pytest.warns(UserWarning, match=warned), fast_attention(capped) as on:
        first = _forward(capped, batch)
    assert on
    assert torch.equal(first, ref)
    with fast_attention(capped):  # decided once: TransformerLens's forward from now on, no new check
        assert torch.equal(_forward(capped, batch), ref)


def test_first_use_check_changes_no_number_it_lets_through(batch):
    for fused in (True, False):
        fresh = tiny_gqa_model(seed=9)
        with fast_attention(fresh, fused=fused):
            checked = _forward(fresh, batch)  # the first batch: each layer checked against TransformerLens
            again = _forward(fresh, batch)
        assert torch.equal(checked, again)


def test_read_only_is_what_the_toolkit_installed_not_what_a_wrapper_holds(model):
    from inactive_heads.runtime.hook_registry import only_read_only

    point = model.hook_dict["blocks.0.attn.hook_pattern"]
    reader = read_only(lambda p, hook: None)
    with installed(model, [("blocks.0.attn.hook_pattern", reader)]):
        assert only_read_only(point)
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: None)]):
            assert not only_read_only(point)  # someone else's hook may edit the pattern
        assert only_read_only(point)
    # The same marked function added by TransformerLens's own model.hooks is not in the registry.
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", reader)]):
        assert not only_read_only(point)
    assert not point._forward_hooks


@pytest.mark.hooked
def test_gated_mlps_without_copies_equal_transformer_lens_to_the_bit_and_follow_weight_edits():
    from inactive_heads.runtime.gated_mlp import gated_mlps_without_copies

    model = tiny_gqa_model(seed=9)
    tokens = torch.tensor(random_sequences(2, seed=3, min_len=9, max_len=9))
    with torch.inference_mode():
        expected = model(tokens)  # TransformerLens's gated MLP, its weights copied at every call
        with gated_mlps_without_copies(model):
            assert torch.equal(model(tokens), expected)
            with fast_attention(model, fused=False):  # the exact form keeps the same arithmetic
                assert torch.equal(model(tokens), expected)
    with torch.no_grad():
        model.blocks[1].mlp.W_in.mul_(3.0)  # an in-place edit must not be served a stale copy
    with torch.inference_mode():
        expected = model(tokens)
        with gated_mlps_without_copies(model):
            assert torch.equal(model(tokens), expected)
    assert "forward" not in vars(model.blocks[1].mlp)  # restored after the block
