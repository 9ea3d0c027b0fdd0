"""A random-weight model of a given shape, saved as a Hugging Face directory that the toolkit loads
like any other (``ih.load_model(directory)``): for timings on a machine real weights cannot reach
(a GPU machine with no network, say), since speed does not depend on the weights' values.

    python benchmarks/bench_skip.py --random-weights meta-llama/Llama-3.1-8B --device cuda --dtype bfloat16

The shape is read with the accountant's ``model_shape``: a name from ``paper_model_shapes()``, a
local Hugging Face directory (its ``config.json`` alone is enough) or a built-in alias. Llama,
Qwen2 and Mistral shapes (the families held heads can be skipped in), and OLMo-2 where a caller
allows it (``families=ALL_FAMILIES``). The tokenizer is a word list over the shape's whole
vocabulary (``t0``, ``t1``, ...; pad t0, BOS t1, EOS t2): token ids are what a benchmark feeds,
not text.

The weights are written one tensor at a time (never the whole model in memory, so an 8B or 14B
shape is made on a small machine): matrices and embeddings drawn from N(0, 0.02²), norm weights
1, biases (Qwen2's q/k/v) drawn from N(0, 0.02²) so that they count, each tensor seeded by
``seed`` and its position in the checkpoint.

    python benchmarks/random_model.py Qwen/Qwen2.5-14B /work/big/qwen14b --layers 20 --dtype bfloat16
"""

import argparse
from pathlib import Path

FAMILIES = ("llama", "qwen2", "mistral")
ALL_FAMILIES = (*FAMILIES, "olmo2")
STD = 0.02


def random_model_dir(spec: str, directory, *, n_layers: int | None = None, dtype: str = "float32",
                     seed: int = 0, max_positions: int = 32768, families: tuple[str, ...] = FAMILIES) -> Path:
    """Write a random-weight model of ``spec``'s shape (its first ``n_layers`` layers when given)
    in ``dtype`` to ``directory``; returns the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from inactive_heads.pruning.accountant import model_shape
    from inactive_heads.core.tensor_files import write_checkpoint

    shape = model_shape(spec)
    if shape.family not in families:
        raise SystemExit(f"--random-weights {spec}: family {shape.family}; held heads are skipped in "
                         f"{', '.join(families)} models only")
    if n_layers is not None and not 1 <= n_layers <= shape.n_layers:
        raise SystemExit(f"--layers {n_layers}: give 1 to {shape.n_layers} (the layers of {spec})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(shape.vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(directory)
    config = _config(shape, n_layers, max_positions, dtype)
    write_checkpoint(_RandomWeights(config, dtype, seed), lambda name, t: [(name, t)], directory)
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    return directory


def _config(shape, n_layers: int | None, max_positions: int, dtype: str):
    from transformers import LlamaConfig, MistralConfig, Olmo2Config, Qwen2Config

    common = dict(hidden_size=shape.d_model, num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads,
                  head_dim=shape.d_head, intermediate_size=shape.d_mlp,
                  num_hidden_layers=n_layers or shape.n_layers, vocab_size=shape.vocab_size,
                  max_position_embeddings=max_positions, tie_word_embeddings=shape.tied_embeddings,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, dtype=dtype)
    if shape.family == "qwen2":  # Qwen2 has q/k/v biases and no o bias, always
        config = Qwen2Config(**common)
    elif shape.family == "mistral":
        config = MistralConfig(**common, sliding_window=None)
    elif shape.family == "olmo2":  # RMSNorm over all heads' q and k, norms after attention and MLP
        config = Olmo2Config(**common)
    else:
        config = LlamaConfig(**common, attention_bias=shape.qkv_bias)
    config.architectures = [{"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                             "olmo2": "Olmo2ForCausalLM"}.get(shape.family, "LlamaForCausalLM")]
    return config


class _RandomWeights:
    """The tensors of a model of ``config`` (names and shapes from the model class built on the
    ``meta`` device), each drawn when asked for: what ``write_checkpoint`` reads."""

    def __init__(self, config, dtype: str, seed: int):
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        self.shapes = {n: p for n, p in model.state_dict().items() if n not in tied}
        self.seed = seed

    def names(self) -> list[str]:
        return list(self.shapes)

    def meta(self, name: str):
        return self.shapes[name]

    def get(self, name: str):
        import torch

        like = self.shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(like.shape, dtype=like.dtype)
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.names().index(name))
        return torch.empty(like.shape, dtype=like.dtype).normal_(0.0, STD, generator=gen)

    def copy_to(self, name: str, f, buffer) -> None:
        """Write the drawn tensor's bytes to ``f`` (every tensor here passes through unchanged)."""
        import torch

        f.write(memoryview(self.get(name).view(-1).view(torch.uint8).numpy()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write a random-weight model of a shape to a folder.")
    parser.add_argument("shape", help="a name from paper_model_shapes() or a Hugging Face directory (its config)")
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int, default=None, help="the first N layers only")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=8192)
    args = parser.parse_args(argv)
    random_model_dir(args.shape, args.directory, n_layers=args.layers, dtype=args.dtype, seed=args.seed,
                     max_positions=args.max_positions, families=ALL_FAMILIES)
    print(args.directory)


if __name__ == "__main__":
    main()
