"""Low-precision safety: scores reduced in float32, NaN-safe zeroing, fho without a d_model tensor,
device/dtype checks, one device→host copy per batch."""

import math

import pytest
import torch

from inactive_heads.models import devices
from inactive_heads.ablation.head_ablation import DynamicAblation, StaticAblation, zero_heads_hook
from inactive_heads.runtime.hooks import make_batches, run_forward
from inactive_heads.scoring.recording import record_scores
from inactive_heads.scoring.scores import LayerActivations, get_score, output_gram_factor, row_entropy
from tiny import random_sequences, tiny_gqa_model, value_weights


def _acts(z=None, pattern=None, v=None, w_o=None, valid=None, n_heads=None):
    ref = next(t for t in (z, pattern, v) if t is not None)
    batch = ref.shape[0]
    pos = z.shape[1] if z is not None else (v.shape[1] if v is not None else pattern.shape[-1])
    if valid is None:
        valid = torch.ones((batch, pos), dtype=torch.bool)
    heads = n_heads or (z.shape[2] if z is not None else pattern.shape[1])
    return LayerActivations(layer=0, n_heads=heads, valid=valid, sequence_ids=torch.arange(batch),
                            pattern=pattern, v_grouped=v, z=z, W_O=w_o)


# ---------------------------------------------------------------------------------------------
# Zeroing is NaN-safe


def test_nan_in_a_zeroed_head_does_not_survive_dynamic_zeroing():
    z = torch.randn(2, 5, 4, 3)
    z[0, 2, 1, 0] = float("nan")  # head 1 of row 0 holds a NaN ...
    z[1, 0, 3, :] = float("inf")  # ... and head 3 of row 1 an inf
    abl = StaticAblation([(0, 1), (0, 3)])
    abl.stats = None
    from inactive_heads.ablation.head_ablation import AblationStats

    abl.stats = AblationStats(1, 4)
    out = abl.on_layer(_acts(z=z))
    assert torch.isfinite(out).all()  # a multiply by a 0/1 mask leaves NaN*0 = NaN and inf*0 = NaN
    assert (out[:, :, [1, 3]] == 0).all()
    assert torch.equal(out[:, :, [0, 2]], z[:, :, [0, 2]])


def test_nan_in_a_zeroed_head_does_not_survive_zero_heads_hook():
    z = torch.randn(1, 4, 3, 2)
    z[0, 1, 2, 1] = float("nan")
    out = zero_heads_hook([2])(z, None)
    assert torch.isfinite(out).all() and (out[:, :, 2] == 0).all()


# ---------------------------------------------------------------------------------------------
# Scores reduced in float32


def test_bf16_lengths_are_not_quantized():
    # 1001 real positions, value 1 on the first 1000 and 0 on the last: the mean is 1000/1001.
    # In bf16 the length 1001 rounds to 1000 and the mean would come out as exactly 1.
    per_pos = torch.ones(1, 1001, 1, dtype=torch.bfloat16)
    per_pos[0, -1, 0] = 0
    acts = _acts(z=torch.zeros(1, 1001, 1, 2, dtype=torch.bfloat16))
    mean = acts.mean_over_positions(per_pos)
    assert mean.dtype == torch.float32
    assert mean.item() == pytest.approx(1000 / 1001, rel=1e-6)
    per_query = per_pos.permute(0, 2, 1)  # [batch, head, query]
    assert acts.mean_over_queries(per_query).item() == pytest.approx(1000 / 1001, rel=1e-6)


def test_bf16_scores_equal_a_float64_computation_on_the_same_bf16_values():
    gen = torch.Generator().manual_seed(0)
    b, p, h, kv, d = 2, 37, 6, 2, 8
    z = torch.randn(b, p, h, d, generator=gen).bfloat16()
    v = torch.randn(b, p, kv, d, generator=gen).bfloat16()
    logits = torch.randn(b, h, p, p, generator=gen).masked_fill(torch.ones(p, p).triu(1).bool(), -math.inf)
    pattern = logits.softmax(-1).bfloat16()
    valid = torch.ones(b, p, dtype=torch.bool)
    valid[1, 30:] = False
    acts = _acts(z=z, v=v, pattern=pattern, valid=valid, n_heads=h)
    z64, v64, a64 = z.double(), v.double(), pattern.double()
    n = valid.sum(1).double()
    m = valid.double()
    ahon = (z64.norm(dim=-1) * m[:, :, None]).sum(1) / n[:, None]
    avvn = ((v64.norm(dim=-1) * m[:, :, None]).sum(1) / n[:, None]).repeat_interleave(h // kv, dim=1)
    ent = -(a64 * torch.where(a64 > 0, a64.log(), torch.zeros_like(a64))).sum(-1)  # [b, h, q]
    aeqd = (ent * m[:, None, :]).sum(-1) / n[:, None]
    for key, want in (("ahon", ahon), ("avvn", avvn), ("aeqd", aeqd)):
        got = get_score(key)(acts)
        assert got.dtype == torch.float32, key
        torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6, msg=key)


def test_row_entropy_in_chunks_equals_one_float32_pass(monkeypatch):
    from inactive_heads.scoring import scores

    pattern = torch.rand(2, 3, 50, 50).softmax(-1).bfloat16()
    whole = torch.special.entr(pattern.float()).sum(-1)
    monkeypatch.setattr(scores, "_CHUNK_ELEMENTS", 2 * 3 * 50 * 7)  # 7 query rows per chunk
    assert torch.equal(row_entropy(pattern), whole)


# ---------------------------------------------------------------------------------------------
# fho from the W_O Gram factor


def test_fho_from_gram_factor_equals_the_explicit_product():
    gen = torch.Generator().manual_seed(1)
    b, p, h, d, m = 2, 9, 4, 8, 40
    z = torch.randn(b, p, h, d, generator=gen)
    w_o = torch.randn(h, d, m, generator=gen)
    explicit = torch.einsum("bphd,hdm->bphm", z.double(), w_o.double()).norm(dim=-1)
    got = _acts(z=z, w_o=w_o).result_norm
    torch.testing.assert_close(got.double(), explicit, rtol=1e-5, atol=1e-6)


def test_fho_stays_accurate_for_an_ill_conditioned_w_o():
    # One direction of each head's W_O is 1e-3 of the others: o G oᵀ in float32 would lose
    # about 6 digits on outputs along it; the triangular factor keeps full relative accuracy.
    gen = torch.Generator().manual_seed(2)
    h, d, m = 3, 4, 16
    q, _ = torch.linalg.qr(torch.randn(m, d, generator=gen, dtype=torch.float64))
    scale = torch.tensor([1.0, 1.0, 1.0, 1e-3], dtype=torch.float64)
    w_o = (torch.diag(scale) @ q.T).expand(h, d, m).contiguous().float()
    z = torch.zeros(1, 2, h, d)
    z[..., 3] = 1.0  # exactly along the weak direction
    z[..., 0] = 1e-4
    explicit = torch.einsum("bphd,hdm->bphm", z.double(), w_o.double()).norm(dim=-1)
    got = _acts(z=z, w_o=w_o).result_norm
    torch.testing.assert_close(got.double(), explicit, rtol=1e-5, atol=0)


def test_gram_factor_is_cached_per_weight_and_follows_in_place_changes():
    w_o = torch.nn.Parameter(torch.randn(2, 3, 10))
    first = output_gram_factor(w_o)
    assert output_gram_factor(w_o) is first  # computed once per weight
    with torch.no_grad():
        w_o.mul_(2.0)  # an in-place edit must not be served a stale factor
    second = output_gram_factor(w_o)
    torch.testing.assert_close(second.abs(), 2 * first.abs())


@pytest.mark.hooked
def test_unembed_at_equals_transformer_lens_unembed_to_the_bit_and_follows_weight_edits():
    from inactive_heads.runtime.hooks import unembed_at

    model = tiny_gqa_model(seed=4)
    resid = torch.randn(3, 5, model.cfg.d_model)
    rows, positions = torch.tensor([0, 2, 2]), torch.tensor([4, 0, 3])

    def expected():  # TransformerLens's own final norm and Unembed.forward (its per-call copy)
        return model.unembed(model.ln_final(resid[rows, positions][:, None]))[:, 0]

    with torch.inference_mode():
        assert torch.equal(unembed_at(model, resid, rows, positions), expected())
        whole = model(resid, start_at_layer=model.cfg.n_layers)  # TransformerLens's logits, every position
        torch.testing.assert_close(unembed_at(model, resid, rows, positions), whole[rows, positions])
    with torch.no_grad():
        model.unembed.W_U.mul_(-0.5)  # an in-place edit must not be served a stale copy
    with torch.inference_mode():
        assert torch.equal(unembed_at(model, resid, rows, positions), expected())
    seen = []
    with model.hooks(fwd_hooks=[("unembed.hook_in", lambda x, hook: seen.append(x.shape))]):
        with torch.inference_mode():
            unembed_at(model, resid, rows, positions)
    assert seen == [(3, 1, model.cfg.d_model)]  # TransformerLens's hooks still fire, on the scored rows
    logits = unembed_at(model, resid, rows, positions)  # gradients on: through W_U itself
    logits.sum().backward()
    assert model.unembed.W_U.grad is not None and model.unembed.W_U.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# Transfers: one device→host copy per batch


def _count_cpu_calls(monkeypatch):
    calls = []
    original = torch.Tensor.cpu

    def counting(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting)
    return calls


def test_recording_copies_to_the_host_once_per_batch(monkeypatch):
    model = tiny_gqa_model()
    sequences = random_sequences(10, seed=3)
    calls = _count_cpu_calls(monkeypatch)
    record_scores(model, sequences, ["ahon_ln", "awft", "aeqd", "fho"], batch_size=4, progress=False)
    assert len(calls) == 3  # 3 batches; the old code copied once per layer and score (3 x 4 x 3)


def test_dynamic_ablation_copies_to_the_host_once_per_batch(monkeypatch):
    model = tiny_gqa_model()
    sequences = random_sequences(8, seed=4)
    batches = list(make_batches(sequences, 4))
    abl = DynamicAblation("ahon_ln", 0.9)
    runner = abl.runner(model)
    calls = _count_cpu_calls(monkeypatch)
    with model.hooks(fwd_hooks=runner.fwd_hooks()):
        for batch in batches:
            runner.set_batch(batch.valid, batch.indices)
            run_forward(model, batch.tokens, batch.valid)
    assert len(calls) == 1  # batch 1 flushed when batch 2 starts; batch 2 stays on the device
    fraction = abl.stats.realized_fraction  # reading the stats brings the last batch over
    assert len(calls) == 2
    mask = abl.stats.flagged_mask()
    assert mask.shape == (8, model.cfg.n_layers, model.cfg.n_heads)
    assert fraction == pytest.approx(mask.float().mean().item())


def test_ablation_apply_copies_to_the_host_once_per_forward_pass(monkeypatch):
    # Under apply() each pass renumbers its rows at every layer (a new sequence-ids tensor per
    # layer); the flags of all layers of one pass must still reach the host in one copy.
    model = tiny_gqa_model()
    n_layers = model.cfg.n_layers
    assert n_layers > 1
    tokens = torch.tensor(random_sequences(3, seed=6, min_len=7, max_len=7))
    abl = DynamicAblation("ahon_ln", 0.9)
    abl.reset(model)
    calls = _count_cpu_calls(monkeypatch)
    with abl.apply(model), torch.inference_mode():
        model(tokens)
        assert len(calls) == 0  # the first pass's flags wait on the device
        model(tokens)
        assert len(calls) == 1  # the second pass's layer 0 brings the first pass over, in one copy
    mask = abl.stats.flagged_mask()  # reading brings the second pass over
    assert len(calls) == 2
    assert calls[0] == (n_layers, 3 * model.cfg.n_heads + 1)  # every layer's [3, head] flags + the finite flag
    assert mask.shape == (6, n_layers, model.cfg.n_heads)
    assert torch.equal(mask[:3], mask[3:])  # the same tokens, the same decisions


def test_a_non_finite_score_during_ablation_is_still_an_error():
    model = tiny_gqa_model()
    with torch.no_grad():
        value_weights(model, 1)[0].fill_(float("nan"))
    abl = DynamicAblation("ahon", 0.5)
    tokens = torch.tensor([random_sequences(1, seed=5, min_len=6, max_len=6)[0]])
    with abl.apply(model), torch.inference_mode():
        model(tokens)
    with pytest.raises(FloatingPointError, match="score 'ahon' is not finite at layer 1"):
        abl.stats.realized_fraction


# ---------------------------------------------------------------------------------------------
# Device and dtype checks (before any weight is read)


def test_cuda_on_a_machine_without_cuda_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(devices, "_gpu_count", lambda kind: 0)
    with pytest.raises(ValueError, match=r"device 'cuda' is not available .*use --device cpu") as err:
        devices.check_device_dtype("cuda", "float32")
    assert "\n" not in str(err.value)


def test_a_gpu_index_that_does_not_exist_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(devices, "_gpu_count", lambda kind: 1 if kind == "cuda" else 0)
    with pytest.raises(ValueError, match=r"device cuda:3 does not exist: 1 CUDA device\(s\) visible \(cuda:0..cuda:0\)"):
        devices.resolve_device("cuda:3")
    with pytest.raises(ValueError, match=r"device cuda:0..1 does not exist"):
        devices.resolve_device("cuda", n_devices=2)
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        devices.resolve_device("gpu0")


def test_bfloat16_on_a_gpu_without_bf16_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(devices, "_gpu_count", lambda kind: 1 if kind == "cuda" else 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Tesla V100")
    with pytest.raises(ValueError, match=r"bfloat16 is not supported by cuda:0 \(Tesla V100, compute capability 7.0\)"):
        devices.check_device_dtype("cuda", "bfloat16")


def test_a_dtype_the_device_cannot_compute_in_is_refused():
    # The probe runs real kernels: softmax has no complex implementation on the CPU.
    assert devices._probe("cpu", torch.complex64) is not None
    assert devices._probe("cpu", torch.float32) is None


def test_dtype_auto(monkeypatch):
    cfg = {"torch_dtype": "bfloat16"}
    assert devices.check_device_dtype("cpu", "auto", config=cfg) == ("cpu", torch.float32)
    monkeypatch.setattr(devices, "_gpu_count", lambda kind: 1 if kind == "cuda" else 0)
    monkeypatch.setattr(devices, "_probe", lambda device, dtype: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    assert devices.check_device_dtype("cuda", "auto", config=cfg) == ("cuda:0", torch.bfloat16)
    assert devices.check_device_dtype("cuda", "auto", config={}) == ("cuda:0", torch.float32)


@pytest.mark.parametrize("command", [["score", "--subjects", "anatomy", "--limit", "1"],
                                     ["sweep", "--subjects", "anatomy", "--limit", "1"]])
def test_cli_refuses_a_missing_gpu_before_loading(command, monkeypatch, tmp_path, capsys):
    from inactive_heads import cli
    from inactive_heads.models import loading as models

    monkeypatch.setattr(devices, "_gpu_count", lambda kind: 1 if kind == "cuda" else 0)
    monkeypatch.setattr(models, "resolve_model_dir", lambda *a, **k: pytest.fail("weights were reached"))
    status = cli.main([*command, "--device", "cuda:3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert "device cuda:3 does not exist: 1 CUDA device(s) visible" in err


def test_run_sweep_checks_a_passed_model_against_its_config(tmp_path):
    from inactive_heads.models.tl_line import has_hooked_transformer
    from inactive_heads.sweep.config import SweepConfig
    from inactive_heads.sweep.passes import check_model_matches

    model = tiny_gqa_model()  # float32, n_ctx 64, on the CPU; a HookedTransformer on 3.9, a bridge on 4
    backend, other = ("hooked", "bridge") if has_hooked_transformer() else ("bridge", "hooked")
    check_model_matches(SweepConfig(dtype="float32", backend=backend, n_ctx=64, device="cpu"), model)
    check_model_matches(SweepConfig(dtype="auto", backend="auto"), model)  # unset fields are not checked
    for field, value, shown in (("dtype", "bfloat16", "'float32'"), ("backend", other, f"'{backend}'"),
                                ("n_ctx", 128, "64")):
        with pytest.raises(ValueError, match=rf"has {field} {shown} but the sweep config says"):
            check_model_matches(SweepConfig(**{field: value}), model)
