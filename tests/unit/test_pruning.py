"""Static head sets, zeroed/pruned export and the savings accountant on tiny random Llama and Qwen2
models (GQA: 4 query heads, 2 key/value heads, d_head 16, 3 layers).

The references are independent of the code under test: the dense Hugging Face model with W_O
columns zeroed by hand, the toolkit's ``StaticAblation`` at ``hook_z``, parameters counted with
``sum(p.numel())``, savings and head choices worked out by hand in the comments.
"""

import json

import pytest
import torch

import inactive_heads as ih
from inactive_heads.cli import main
from tiny import TINY_VOCAB, save_tiny_family

FAMILIES = ("llama-3.2", "qwen2.5-untied")  # tied and untied embeddings
D_HEAD = 16
# layer 0: group 0 whole (KV head 0 goes); layer 1: one head of group 0 (KV stays, uneven groups);
# layer 2: every head (no attention left).
HEADS = [(0, 0), (0, 1), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(TINY_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w1", bos_token="w2",
                                   eos_token="w3")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_dir(request, tokenizer, tmp_path_factory):
    return save_tiny_family(request.param, tmp_path_factory.mktemp(request.param) / "model", tokenizer)


@pytest.fixture(scope="module")
def exports(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {mode: ih.export_pruned(str(tiny_dir), HEADS, root / mode, mode=mode) for mode in ("zeroed", "pruned")}


def hf(path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()


def hand_zeroed(tiny_dir):
    model = hf(tiny_dir)
    with torch.no_grad():
        for l, h in HEADS:
            model.model.layers[l].self_attn.o_proj.weight[:, h * D_HEAD:(h + 1) * D_HEAD] = 0.0
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


TOKENS = torch.randint(4, TINY_VOCAB, (3, 19), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------------------------
# export


def test_pruned_and_zeroed_exports_equal_hand_zeroed_w_o(tiny_dir, exports):
    ref = hand_zeroed(tiny_dir)
    pruned = hf(exports["pruned"], trust_remote_code=True)
    assert type(pruned).__name__.startswith("Pruned")
    with torch.no_grad():
        expected = ref(TOKENS).logits
        assert (hf(exports["zeroed"])(TOKENS).logits - expected).abs().max() <= 1e-5
        assert (pruned(TOKENS).logits - expected).abs().max() <= 1e-5
        # and the heads really mattered
        assert (hf(tiny_dir)(TOKENS).logits - expected).abs().max() > 1e-2


def test_pruned_export_equals_static_ablation_in_the_toolkit(tiny_dir, exports):
    model = ih.load_model(str(tiny_dir), progress=False)
    with torch.no_grad(), ih.StaticAblation(HEADS).apply(model):
        ours = model(TOKENS)
    assert (hf(exports["pruned"], trust_remote_code=True)(TOKENS).logits - ours).abs().max() <= 1e-4


def test_pruned_config_lists_heads_per_layer(exports):
    cfg = json.loads((exports["pruned"] / "config.json").read_text())
    assert cfg["num_attention_heads_per_layer"] == [2, 3, 0]
    assert cfg["num_key_value_heads_per_layer"] == [1, 2, 0]  # layer 1 keeps head 0 of group 0
    assert cfg["kept_query_heads"] == [[2, 3], [0, 2, 3], []]
    assert cfg["auto_map"]["AutoModelForCausalLM"].startswith("modeling_pruned_heads.Pruned")
    assert (exports["pruned"] / "modeling_pruned_heads.py").is_file()
    assert (exports["pruned"] / "tokenizer.json").is_file() and (exports["pruned"] / "generation_config.json").is_file()


def test_parameter_drop_equals_the_accountant(tiny_dir, exports):
    dense, pruned = hf(tiny_dir), hf(exports["pruned"], trust_remote_code=True)
    s = ih.savings(str(tiny_dir), HEADS)
    assert s.params_total == n_params(dense)
    assert n_params(dense) - n_params(pruned) == s.params_removed
    # by hand: 7 query heads × (q rows + o columns) + 3 KV heads × (k + v rows) + layer 2's input norm;
    # Qwen2 adds a d_head bias per q/k/v head
    bias = D_HEAD if "qwen" in str(tiny_dir) else 0
    assert s.params_removed == 7 * (2 * 64 * D_HEAD + bias) + 3 * 2 * (64 * D_HEAD + bias) + 64
    assert n_params(hf(exports["zeroed"])) == n_params(dense)


def test_padding_and_batch_do_not_change_the_pruned_model(exports):
    model = hf(exports["pruned"], trust_remote_code=True)
    lengths = [19, 11, 6]
    mask = torch.zeros_like(TOKENS)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    with torch.no_grad():
        batch = model(TOKENS, attention_mask=mask).logits
        for i, n in enumerate(lengths):
            alone = model(TOKENS[i:i + 1, :n]).logits[0]
            assert (batch[i, :n] - alone).abs().max() <= 1e-5


def test_greedy_generation_with_the_cache_equals_the_zeroed_model(tiny_dir, tmp_path):
    heads = [(0, h) for h in range(4)] + [(1, 2)]  # layer 0 empty: the cache length is read there
    pruned = hf(ih.export_pruned(str(tiny_dir), heads, tmp_path / "p"), trust_remote_code=True)
    zeroed = hf(ih.export_pruned(str(tiny_dir), heads, tmp_path / "z", mode="zeroed"))
    prompt = TOKENS[:1, :6]
    a = pruned.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=1)
    b = zeroed.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=1)
    assert torch.equal(a, b)


def test_export_errors_are_one_line(tiny_dir, tmp_path):
    from transformers import GPT2Config, Olmo2Config

    with pytest.raises(ih.UserError, match=r"head \(3, 0\) does not exist; layers are 0..2"):
        ih.export_pruned(str(tiny_dir), [(3, 0)], tmp_path / "a")
    with pytest.raises(ih.UserError, match="head .* does not exist"):
        ih.export_pruned(str(tiny_dir), [(0, 4)], tmp_path / "a")
    with pytest.raises(ih.UserError, match="unknown export mode"):
        ih.export_pruned(str(tiny_dir), HEADS, tmp_path / "a", mode="sliced")
    olmo = tmp_path / "olmo"
    Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=TINY_VOCAB).save_pretrained(olmo)
    with pytest.raises(ih.UserError, match="Olmo2ForCausalLM cannot be exported pruned .*; supported: LlamaForCausalLM"):
        ih.export_pruned(str(olmo), [(0, 0)], tmp_path / "b")
    gpt2 = tmp_path / "gpt2"
    GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=TINY_VOCAB).save_pretrained(gpt2)
    with pytest.raises(ih.UserError, match="GPT2LMHeadModel cannot be exported zeroed"):
        ih.export_pruned(str(gpt2), [(0, 0)], tmp_path / "c", mode="zeroed")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ih.UserError, match="exists and is not empty"):
        ih.export_pruned(str(tiny_dir), HEADS, tmp_path / "full")


# ----------------------------------------------------------------------------------------------
# static head sets


def test_static_heads_by_mean_and_by_flag_rate_worked_by_hand():
    # One layer, 4 heads, 3 sequences. Head 0 is usually tiny but has one huge value; head 1 is
    # always 0.3. Pool of 12 sorted: 0.1 0.1 0.3 0.3 0.3 1 1 1 2 2 2 5 -> tau at p = 0.25 is the
    # 3rd value, 0.3; "< 0.3" flags head 0 on 2 of 3 sequences and head 1 never.
    s = torch.tensor([[0.1, 0.3, 1.0, 2.0], [0.1, 0.3, 1.0, 2.0], [5.0, 0.3, 1.0, 2.0]])[:, None, :]
    by_rate = ih.static_heads(s, "ahon_ln", 0.25)
    assert by_rate.heads == ((0, 0),) and by_rate.threshold == pytest.approx(0.3)
    assert ih.static_heads(s, "ahon_ln", 0.25, rule="mean").heads == ((0, 1),)  # means 1.73, 0.3, 1, 2
    # AWFT is inactive when high: the highest means (2 and 1.73) win
    assert ih.static_heads(s, "awft", 0.5, rule="mean").heads == ((0, 0), (0, 3))


def test_head_set_round_trips_and_feeds_static_ablation(tmp_path):
    s = torch.rand(5, 3, 6, generator=torch.Generator().manual_seed(1))
    hs = ih.static_heads(s, "ahon_ln", 0.3)
    assert len(hs) == round(0.3 * 18) and hs.rule == "flag_rate"
    back = ih.HeadSet.load(hs.save(tmp_path / "heads.json"))
    assert back == hs
    assert ih.StaticAblation(back).heads == hs.heads


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.1, True])
def test_fraction_outside_zero_one_is_a_one_line_error(fraction):
    with pytest.raises(ih.UserError, match="fraction must lie strictly between 0 and 1"):
        ih.static_heads(torch.rand(2, 2, 2), "ahon_ln", fraction)


def test_static_heads_bad_rule_and_tiny_fraction():
    with pytest.raises(ih.UserError, match="unknown rule 'median'"):
        ih.static_heads(torch.rand(2, 2, 2), "ahon_ln", 0.5, rule="median")
    with pytest.raises(ih.UserError, match="rounds to no head"):
        ih.static_heads(torch.rand(2, 2, 2), "ahon_ln", 0.01)


# ----------------------------------------------------------------------------------------------
# the accountant


def test_savings_of_a_paper_model_by_hand():
    # Llama-3.1-8B: d_model 4096, d_head 128, groups of 4. Heads 0-4 of layer 0: group 0 whole,
    # one head of group 1.
    s = ih.savings("meta-llama/Llama-3.1-8B", [(0, h) for h in range(5)], seq_len=1000, dtype="bfloat16")
    assert (s.query_heads_removed, s.kv_heads_removable, s.layers_without_attention) == (5, 1, 0)
    assert s.params_total == 8_030_261_248  # the published parameter count
    assert s.params_removed == 5 * 2 * 4096 * 128 + 2 * 4096 * 128
    # prefill of 1000 tokens: per query head 4·4096·128 + 4·128·(1001/2); per KV head 4·4096·128
    assert s.prefill_flops_per_token_removed == 5 * (4 * 4096 * 128 + 4 * 128 * 500.5) + 4 * 4096 * 128
    assert s.decode_flops_per_token_removed == 5 * (4 * 4096 * 128 + 4 * 128 * 1000) + 4 * 4096 * 128
    # KV cache: 2 · 32 layers · 8 heads · 128 · 2 bytes = 131072 bytes per token
    assert s.kv_cache_bytes[2048] == 131072 * 2048 and s.kv_cache_bytes_removed[8192] == 2 * 128 * 2 * 8192
    # a decode step at context 1000 reads the weights but the untied input table (128256 x 4096) and
    # the cache, 2 bytes each; the heads take their weights and one KV head's 2 x 128 values per token
    weights = 8_030_261_248 - 128256 * 4096
    assert s.decode_bytes_per_token == 2 * weights + 131072 * 1000
    assert s.decode_bytes_per_token_removed == 2 * (5 * 2 * 4096 * 128 + 2 * 4096 * 128) + 2 * 128 * 2 * 1000
    assert s.to_dict()["predicted_decode_bytes_ratio"] == pytest.approx(
        15_140_921_344 / (15_140_921_344 - 13_094_912), rel=1e-12)
    assert s.projection


def test_paper_projections_bounds():
    table = ih.paper_projections(0.125).set_index("model")
    llama = table.loc["meta-llama/Llama-3.1-8B"]
    assert llama["query_heads_removed"] == 128 and llama["kv_heads_removable_max"] == 32
    assert llama["kv_heads_removable_min"] == 0  # 128 heads fit 3 per group in 256 groups
    # decode bytes at 2048 (bf16): 128 heads' q/o weights, and at best 32 KV heads' weights and cache
    dense = 2 * (8_030_261_248 - 128256 * 4096) + 131072 * 2048
    assert llama["decode_bytes_removed_pct_min"] == pytest.approx(100 * 2 * 128 * 2 * 4096 * 128 / dense, rel=1e-12)
    assert llama["decode_bytes_removed_pct_max"] == pytest.approx(
        100 * (2 * (128 + 32) * 2 * 4096 * 128 + 32 * 2 * 128 * 2 * 2048) / dense, rel=1e-12)
    olmo = table.loc["allenai/OLMo-2-1124-7B"]  # no GQA: every removed head frees its KV head
    assert olmo["kv_heads_removable_min"] == olmo["kv_heads_removable_max"] == 128
    assert table.loc["Qwen/Qwen2.5-14B", "params_total"] == 14_770_033_664
    assert table["projection"].all()


def test_oracle_savings_per_input_equals_savings_of_each_inputs_set(tiny_dir):
    flagged = torch.zeros(2, 3, 4, dtype=torch.bool)
    for l, h in HEADS:
        flagged[0, l, h] = True
    flagged[1, 1, 3] = True
    per_input = ih.oracle_savings(str(tiny_dir), flagged, lengths=[19, 5])
    assert per_input["query_heads_removed"].tolist() == [7, 1]
    assert per_input["kv_heads_removable"].tolist() == [3, 0]
    one = ih.savings(str(tiny_dir), HEADS, seq_len=19)
    expected = 100 * one.prefill_flops_per_token_removed / one.prefill_flops_per_token
    assert per_input["prefill_flops_removed_pct"][0] == pytest.approx(expected, rel=1e-12)
    assert per_input["kv_cache_removed_pct"].tolist() == [100 * 3 / 6, 0.0]


def test_savings_heads_out_of_range():
    with pytest.raises(ih.UserError, match=r"head \(32, 0\) does not exist; layers are 0..31"):
        ih.savings("meta-llama/Llama-3.1-8B", [(32, 0)])


# ----------------------------------------------------------------------------------------------
# command line


def test_cli_export_from_a_head_file_and_from_scores(tiny_dir, tmp_path, capsys):
    heads = ih.HeadSet(tuple(HEADS), 3, 4).save(tmp_path / "heads.json")
    assert main(["export", "--model", str(tiny_dir), "--heads", str(heads), "--out", str(tmp_path / "a")]) == 0
    assert "7 of 12 query heads removed, 3 of 6 KV heads removable" in capsys.readouterr().out
    scores = ih.HeadScores({"ahon_ln": torch.rand(4, 3, 4, generator=torch.Generator().manual_seed(0))})
    scores.save(tmp_path / "s.safetensors")
    assert main(["export", "--model", str(tiny_dir), "--from-scores", str(tmp_path / "s.safetensors"),
                 "--score", "ahon_ln", "--fraction", "0.25", "--mode", "zeroed", "--out", str(tmp_path / "b")]) == 0
    assert "chose 3 heads by flag_rate of ahon_ln on 4 sequences" in capsys.readouterr().out
    assert main(["export", "--model", str(tiny_dir), "--from-scores", str(tmp_path / "s.safetensors"),
                 "--out", str(tmp_path / "c")]) == 2
    assert "needs --score KEY and --fraction F" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--model", str(tiny_dir), "--heads", str(heads), "--fraction", "1.2", "--out", "x"])


def test_model_shape_round_trips_to_json_and_reads_a_hooked_transformer():
    from inactive_heads.pruning import model_shape
    from tiny import tiny_gqa_model

    shape = model_shape("Qwen/Qwen2.5-14B")
    assert ih.ModelShape.from_dict(json.loads(json.dumps(shape.to_dict()))) == shape
    tiny = model_shape(tiny_gqa_model())  # no checkpoint behind it: read from the TransformerLens config
    assert (tiny.n_layers, tiny.n_heads, tiny.n_kv_heads, tiny.d_head, tiny.d_mlp) == (3, 6, 2, 8, 64)
