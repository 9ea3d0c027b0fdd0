"""Held heads really skipped (inactive_heads.pruning.skipping): equal to the zeroing simulation.

The reference is the toolkit's simulation: every head computed by the model's own forward, the
held ones zeroed at ``hook_z`` (``evaluation.decoding.HeldHeads``). Tiny random-weight models with one
KV head per query head (6 of 6) and grouped-query attention (2 KV heads for 6), on both lines."""

import pytest
import torch

from inactive_heads.ablation.head_ablation import RandomAblation, StaticAblation
from inactive_heads.core.errors import UserError
from inactive_heads.evaluation.generation import generate
from inactive_heads.pruning.accountant import model_shape
from inactive_heads.pruning.skipping import check_supported, choose, group_level, skip_logits
from tests.reference_skipping import simulated
from tests.tiny import random_sequences, tiny_gqa_bridge, tiny_gqa_model

_MODELS: dict = {}


def _model(backend: str, kv: int):
    """A tiny model with its attention weights scaled up (Hugging Face's initialization makes
    near-uniform patterns and attention outputs small beside ``b_O``: a wrong head would hardly show)."""
    key = (backend, kv)
    if key not in _MODELS:
        model = tiny_gqa_model(seed=5, n_kv_heads=kv) if backend == "hooked" else tiny_gqa_bridge(5, 3, kv)
        with torch.no_grad():
            for block in model.blocks:
                if backend == "hooked":
                    attn = block.attn
                    grouped = getattr(attn, "_W_K", None) is not None
                    weights = [(attn.W_Q, 3.0), (attn._W_K if grouped else attn.W_K, 3.0),
                               (attn._W_V if grouped else attn.W_V, 2.0), (attn.W_O, 2.0)]
                else:
                    hf = block.attn.original_component
                    weights = [(hf.q_proj.weight, 8.0), (hf.k_proj.weight, 8.0), (hf.v_proj.weight, 6.0),
                               (hf.o_proj.weight, 6.0)]
                for w, factor in weights:
                    w.mul_(factor)
        _MODELS[key] = model
    return _MODELS[key]


@pytest.fixture(params=["hooked", "bridge"])
def backend(request):
    return request.param


def attention_outputs(model, run):
    """Each layer's attention-block output (``[batch, pos, d_model]``) while ``run()`` runs."""
    outs: dict[int, torch.Tensor] = {}

    def keep(layer):
        def hook(module, args, output):
            outs[layer] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return hook

    handles = [block.attn.register_forward_hook(keep(l)) for l, block in enumerate(model.blocks)]
    try:
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, outs


def _batch():
    """Four left-padded rows; rows 0 and 2 hold the same heads, the others their own."""
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(3, 97, (4, 10), generator=gen)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[1, :3] = 0
    mask[3, :6] = 0
    held = torch.rand(4, 3, 6, generator=gen) < 0.45
    held[2] = held[0]
    held[1, 0, :3] = True  # a whole GQA group at layer 0 (KV head 0 left out)
    return tokens, mask, held


@pytest.mark.parametrize("kv", [2, 6])
@pytest.mark.parametrize("rule", ["skip", "dense", "auto"])
def test_prefill_equals_simulation(backend, kv, rule):
    model = _model(backend, kv)
    tokens, mask, held = _batch()
    real = mask.bool()
    got, got_layers = attention_outputs(model, lambda: skip_logits(model, tokens, mask, held=held, rule=rule))
    want, want_layers = attention_outputs(model, lambda: simulated(model, tokens, mask, held))
    for layer in range(3):  # each layer's attention output, not only the logits (small in a tiny model)
        a, b = got_layers[layer][real], want_layers[layer][real]
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), layer
    dense = simulated(model, tokens, mask, torch.zeros_like(held))
    scale = float(want[real].abs().max())
    assert float((dense - want)[real].abs().max()) > 1e-2 * scale  # the held heads matter
    assert float((got - want)[real].abs().max()) <= 1e-4 * max(1.0, scale)
    assert torch.equal(got[real].argmax(-1), want[real].argmax(-1))


@pytest.mark.parametrize("kv", [2, 6])
def test_prefill_does_not_depend_on_batch_or_padding(backend, kv):
    model = _model(backend, kv)
    tokens, mask, held = _batch()
    batched = skip_logits(model, tokens, mask, held=held, rule="skip")
    for row in range(4):
        keep = mask[row].bool()
        alone = skip_logits(model, tokens[row, keep][None], held=held[row:row + 1], rule="skip")
        assert float((alone[0] - batched[row, keep]).abs().max()) <= 1e-4


def test_static_set_broadcast(backend):
    model = _model(backend, 2)
    tokens, mask, _ = _batch()
    pairs = [(0, 1), (0, 2), (1, 5), (2, 0), (2, 1), (2, 2)]
    mask_lh = torch.zeros(3, 6, dtype=torch.bool)
    for l, h in pairs:
        mask_lh[l, h] = True
    got = skip_logits(model, tokens, mask, held=pairs)
    want = simulated(model, tokens, mask, mask_lh[None].expand(4, -1, -1))
    assert float((got - want)[mask.bool()].abs().max()) <= 1e-4


class _FakeDecider:
    """Holds, per row, heads chosen from the sign of the residual stream it is given."""

    def __init__(self, lookahead: int):
        self.lookahead = lookahead
        self.calls: dict[int, tuple] = {}

    def held_heads(self, layer, resid, attention_mask):
        last = resid[:, -1]  # left padding: every row's last position is real
        bits = torch.stack([(last[:, h::6].sum(dim=1) > 0) for h in range(6)], dim=1)
        flags = bits ^ bool(layer % 2)
        self.calls[layer] = (resid.clone(), attention_mask.clone(), flags.clone())
        return flags


@pytest.mark.parametrize("lookahead", [0, 1])
def test_decider_equals_simulation_with_its_decisions(backend, lookahead):
    model = _model(backend, 2)
    tokens, mask, _ = _batch()
    decider = _FakeDecider(lookahead)
    got = skip_logits(model, tokens, mask, decider=decider, rule="skip")
    held = torch.stack([decider.calls[l][2] for l in range(3)], dim=1)
    assert held.any() and not held.all()
    entering: dict[int, torch.Tensor] = {}
    handles = [block.register_forward_pre_hook(
        lambda mod, args, kwargs, l=l: entering.__setitem__(l, (args[0] if args else kwargs["hidden_states"]).clone()),
        with_kwargs=True) for l, block in enumerate(model.blocks)]
    try:
        want = simulated(model, tokens, mask, held)
    finally:
        for h in handles:
            h.remove()
    assert float((got - want)[mask.bool()].abs().max()) <= 1e-4
    for layer in range(3):
        resid, given_mask, _ = decider.calls[layer]
        assert torch.equal(given_mask.cpu(), mask)
        source = max(0, layer - lookahead)
        assert float((resid - entering[source])[mask.bool()].abs().max()) <= 1e-4


@pytest.mark.parametrize("kv", [2, 6])
@pytest.mark.parametrize("p", [0.3, 0.7])
def test_prompt_held_generation_equals_simulation(backend, kv, p):
    model = _model(backend, kv)
    prompts = random_sequences(5, seed=3, min_len=4, max_len=12)
    kw = dict(decision="prompt", max_new_tokens=6, eos_token_id=None, progress=False, batch_size=3)
    skipped = generate(model, prompts, ablation=RandomAblation(p, seed=1), skip=True, **kw)
    zeroed = generate(model, prompts, ablation=RandomAblation(p, seed=1), **kw)
    assert skipped.tokens == zeroed.tokens
    info = skipped.skipping
    for when in ("prefill", "end"):
        measured, predicted = info[f"kv_bytes_measured_{when}"], info[f"kv_bytes_predicted_{when}"]
        assert abs(measured - predicted) <= 0.01 * predicted
    if kv == 6:  # one KV head per query head: every held head frees its KV
        assert info["kv_groups_held_fraction"] == pytest.approx(info["query_heads_held_fraction"])


def test_kv_bytes_by_hand(backend):
    """Layer 0's whole first group held (3 query heads, KV head 0) plus one head elsewhere: the
    cache keeps 2·3 - 1 = 5 KV heads of 8 fp32 values, keys and values, per cached token."""
    model = _model(backend, 2)
    prompt = random_sequences(1, seed=9, min_len=7, max_len=7)
    heads = [(0, 0), (0, 1), (0, 2), (2, 4)]
    out = generate(model, prompt, ablation=StaticAblation(heads), decision="prompt", max_new_tokens=4,
                   eos_token_id=None, progress=False, skip=True)
    per_token = 2 * 5 * 8 * 4
    assert out.skipping["kv_bytes_measured_prefill"] == per_token * 7
    assert out.skipping["kv_bytes_measured_end"] == per_token * (7 + 3)  # the last token is not cached
    assert out.skipping["kv_groups_held_fraction"] == pytest.approx(1 / 6)


def test_group_level_rule():
    held = torch.tensor([[True, True, False, True, False, False]])  # groups of 3: 2/3 held, 1/3 held
    assert torch.equal(group_level(held, 2, 1.0), held)
    assert group_level(held, 2, 0.5).tolist() == [[True, True, True, True, False, False]]
    assert group_level(held, 2, 0.3).tolist() == [[True] * 6]
    with pytest.raises(UserError, match="min_fraction"):
        group_level(held, 2, 0.0)


def test_cost_rule_by_hand():
    """Shape of SmolLM2-135M (9 heads, 3 KV heads, d_head 64, d_model 576)."""
    from inactive_heads.pruning.accountant import ModelShape

    shape = ModelShape("s", "llama", 30, 9, 3, 64, 576, 1536, 49152)
    none = torch.zeros(1, 9, dtype=torch.bool)
    assert choose(shape, none, 512, 512, 0) == "dense"  # nothing to save
    three = none.clone()
    three[0, :3] = True  # a whole group: 3 of 9 query heads and 1 of 3 KV heads
    assert choose(shape, three, 512, 512, 0) == "skip"
    one = none.clone()
    one[0, 4] = True  # 1 of 9 heads: 11 % of the layer's query-head FLOPs
    assert choose(shape, one, 512, 512, 0) == "skip"
    # 8 rows, 8 different single heads, decode (1 token): the groups' fixed cost wins
    many = torch.zeros(8, 9, dtype=torch.bool)
    many[torch.arange(8), torch.arange(8)] = True
    assert choose(shape, many, 1, 512, 0) == "dense"
    assert choose(shape, many, 1, 512, 0, rule="skip") == "skip"


def test_errors(backend):
    with pytest.raises(UserError, match="Llama, Qwen2 and Mistral"):
        check_supported(torch.nn.Linear(2, 2))
    model = _model(backend, 2)
    with pytest.raises(UserError, match="skip=True needs decision='prompt'"):
        generate(model, [[3, 4]], decision="per_step", max_new_tokens=2, skip=True, progress=False)
    with pytest.raises(UserError, match="held heads must be"):
        skip_logits(model, torch.tensor([[3, 4]]), held=torch.zeros(2, 6, dtype=torch.bool))
    assert model_shape(model).n_heads == 6


def test_gathered_weights_follow_an_edit(backend):
    """Weights gathered per kept set are kept across calls; an in-place edit of the model's weights
    must reach the next call (a stale copy would not)."""
    from tests.tiny import value_weights

    model = tiny_gqa_model(seed=11) if backend == "hooked" else tiny_gqa_bridge(11)
    tokens, mask, held = _batch()
    skip_logits(model, tokens, mask, held=held, rule="skip")
    w_v, _ = value_weights(model, 1)
    with torch.no_grad():
        w_v.mul_(-2.0)
    got = skip_logits(model, tokens, mask, held=held, rule="skip")
    want = simulated(model, tokens, mask, held)
    assert float((got - want)[mask.bool()].abs().max()) <= 1e-4


def test_hold_groups_frees_whole_groups(backend):
    """hold_groups=1/3 holds a group of 3 query heads whole when one of its heads is held: the
    freed KV share rises to the groups touched, and skip still equals the simulation of that rule."""
    model = _model(backend, 2)
    prompts = random_sequences(3, seed=4, min_len=5, max_len=9)
    heads = [(0, 0), (1, 4), (2, 1), (2, 2)]  # touches 1 of 2 groups at each layer
    kw = dict(ablation=StaticAblation(heads), decision="prompt", max_new_tokens=4, eos_token_id=None, progress=False)
    plain = generate(model, prompts, skip=True, **kw)
    grouped = generate(model, prompts, skip=True, hold_groups=1 / 3, **kw)
    assert plain.skipping["kv_groups_held_fraction"] == 0.0
    assert grouped.skipping["kv_groups_held_fraction"] == pytest.approx(3 / 6)
    assert grouped.skipping["query_heads_held_fraction"] == pytest.approx(9 / 18)
    assert grouped.tokens == generate(model, prompts, hold_groups=1 / 3, **kw).tokens
    with pytest.raises(UserError, match="hold_groups applies to decision='prompt'"):
        generate(model, prompts, ablation=StaticAblation(heads), max_new_tokens=2, hold_groups=0.5, progress=False)
    for bad in (0.0, 1.5, float("nan")):  # rejected before any pass, whichever path would run
        with pytest.raises(UserError, match="hold_groups must be a fraction in"):
            generate(model, prompts, hold_groups=bad, **kw)


def test_layer_choices_follow_the_cost_rule(backend):
    """Nothing held at layer 0 (dense: nothing to save), a whole group at layer 1 (skipped)."""
    from inactive_heads.pruning.skipping import skipping

    model = _model(backend, 2)
    tokens = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    held = torch.zeros(1, 3, 6, dtype=torch.bool)
    held[0, 1, 3:] = True
    held[0, 2, 0] = True
    with skipping(model, held) as state:
        model(tokens, **({"use_cache": False} if backend == "bridge" else {}))
    assert [c.mode for c in state.choices] == ["dense", "skip", "skip"]
    assert [c.groups for c in state.choices] == [1, 1, 1]


def _attention_bytes(model) -> int:
    """The bytes of the model's q/k/v/o projection weights, read off its parameters by name."""
    ends = ("attn.W_Q", "attn.W_K", "attn._W_K", "attn.W_V", "attn._W_V", "attn.W_O",
            "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if n.replace("._original_component", "").endswith(ends))


def test_gathered_weights_never_exceed_one_copy_of_the_attention(backend):
    """Many different held sets gather many copies; what stays gathered is bounded by the bytes of
    the attention projections (a count bound let an 8B run hold gigabytes of copies), and a skipped
    generation leaves nothing gathered behind it."""
    from inactive_heads.pruning import skipping

    model = tiny_gqa_model(seed=11) if backend == "hooked" else tiny_gqa_bridge(11)
    budget = _attention_bytes(model)
    assert budget > 0
    model_storage = {p.untyped_storage().data_ptr() for p in model.parameters()}  # a kept weight is not a copy
    tokens, mask, _ = _batch()
    gen = torch.Generator().manual_seed(3)
    for _ in range(12):
        held = (torch.rand(1, 3, 6, generator=gen) < 0.3).expand(4, -1, -1)
        skip_logits(model, tokens, mask, held=held, rule="skip")
        kept = skipping._PACKED.get(model, {})
        gathered = sum(t.numel() * t.element_size() for packed, *_ in kept.values()
                       for t in vars(packed).values()
                       if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in model_storage)
        assert 0 < gathered <= budget
    generate(model, random_sequences(2, seed=3, min_len=4, max_len=8), ablation=RandomAblation(0.3, seed=1),
             decision="prompt", max_new_tokens=3, eos_token_id=None, progress=False, skip=True)
    assert not skipping._PACKED.get(model)
