"""The tiny model and the files every fuzz test module of this folder shares, built once."""

import os

import pytest
import torch

import inactive_heads as ih
from synthetic_sweep import write_synthetic_sweep
from tiny import TINY_GQA_VOCAB, random_sequences, tiny_gqa_model
from fuzz_harness import (
    Env,
    _write_counts,
    _write_files,
)


@pytest.fixture(scope="package")
def env(tmp_path_factory):
    import jaxtyping

    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    torch.manual_seed(0)
    model = tiny_gqa_model()  # a HookedTransformer on TransformerLens 3.9, a TransformerBridge on 4
    if model.tokenizer is None:  # 3.9's has none: the word-level one of the bridge, for text and tasks
        from tiny import _word_tokenizer

        model.set_tokenizer(_word_tokenizer(tmp_path_factory.mktemp("tokenizer"), TINY_GQA_VOCAB))
    scores = ih.record_scores(model, random_sequences(4, vocab=TINY_GQA_VOCAB), progress=False)
    root = tmp_path_factory.mktemp("fuzz")
    cwd = os.getcwd()
    os.chdir(root)  # a relative path drawn as wrong input ("x") that happens to work lands here
    _write_files(root / "files", scores)
    sweep = write_synthetic_sweep(root / "sweep", n_questions=8)
    yield Env(model, scores, root / "files", root / "scratch", sweep)
    os.chdir(cwd)
    jaxtyping.config.update("jaxtyping_disable", previous)
    _write_counts()
