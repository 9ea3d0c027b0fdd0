"""A random-weight model of a given shape, saved as a Hugging Face directory that the toolkit loads
like any other (``ih.load_model(directory)``): for timings on a machine real weights cannot reach
(a GPU machine with no network, say), since speed does not depend on the weights' values.

    python benchmarks/bench_skip.py --random-weights meta-llama/Llama-3.1-8B --device cuda --dtype bfloat16

The shape is read with the accountant's ``model_shape``: a name from ``paper_model_shapes()``, a
local Hugging Face directory (its ``config.json`` alone is enough) or a built-in alias. Llama,
Qwen2 and Mistral shapes (the families held heads can be skipped in). The tokenizer is a word
list over the shape's whole vocabulary (``t0``, ``t1``, ...; pad t0, BOS t1, EOS t2): token ids are
what a benchmark feeds, not text.
"""

from pathlib import Path

FAMILIES = ("llama", "qwen2", "mistral")


def random_model_dir(spec: str, directory, *, n_layers: int | None = None, dtype: str = "float32",
                     seed: int = 0, max_positions: int = 32768) -> Path:
    """Write a random-weight model of ``spec``'s shape (its first ``n_layers`` layers when given)
    in ``dtype`` to ``directory``; returns the directory."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast, Qwen2Config

    from inactive_heads.pruning.accountant import model_shape

    shape = model_shape(spec)
    if shape.family not in FAMILIES:
        raise SystemExit(f"--random-weights {spec}: family {shape.family}; held heads are skipped in "
                         f"{', '.join(FAMILIES)} models only")
    if n_layers is not None and not 1 <= n_layers <= shape.n_layers:
        raise SystemExit(f"--layers {n_layers}: give 1 to {shape.n_layers} (the layers of {spec})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(shape.vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(directory)
    common = dict(hidden_size=shape.d_model, num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads,
                  head_dim=shape.d_head, intermediate_size=shape.d_mlp,
                  num_hidden_layers=n_layers or shape.n_layers, vocab_size=shape.vocab_size,
                  max_position_embeddings=max_positions, tie_word_embeddings=shape.tied_embeddings,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if shape.family == "qwen2":  # Qwen2 has q/k/v biases and no o bias, always
        config = Qwen2Config(**common)
    elif shape.family == "mistral":
        config = MistralConfig(**common, sliding_window=None)
    else:
        config = LlamaConfig(**common, attention_bias=shape.qkv_bias)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(directory)
    return directory
