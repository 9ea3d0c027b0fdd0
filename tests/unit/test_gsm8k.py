"""GSM8K offline: data, prompt format, answer filters and exact match as lm-eval's gsm8k task.

Expected prompts, answers and verdicts are written out by hand from lm-eval's ``gsm8k.yaml``; the
shipped exemplars and constants are checked against the installed lm-eval files.
"""

import importlib.util
from pathlib import Path

import pytest

from inactive_heads.core.errors import UserError
from inactive_heads.evaluation import gsm8k as gsm8k_task
from inactive_heads.evaluation.gsm8k import (
    build_gsm8k_requests,
    gsm8k_exact_match,
    gsm8k_exemplar_target,
    gsm8k_exemplars,
    gsm8k_extract,
    load_gsm8k_docs,
)


class CharTokenizer:
    """One token per character (no special tokens); enough to check prompts without a real model."""

    bos_token_id = 1
    eos_token_id = 2
    chat_template = None

    def __call__(self, texts, add_special_tokens=False):
        assert add_special_tokens is False
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def _lm_eval_tasks_dir() -> Path | None:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "tasks" / "gsm8k"


def test_test_split_is_the_1319_questions_in_order():
    docs = load_gsm8k_docs()
    assert len(docs) == 1319
    assert docs[0]["question"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert docs[0]["answer"].endswith("#### 18")
    assert load_gsm8k_docs(limit=3) == docs[:3]


def test_exemplars_equal_the_installed_gsm8k_cot_yaml():
    folder = _lm_eval_tasks_dir()
    if folder is None:
        pytest.skip("lm-eval is not installed")
    import yaml

    config = yaml.safe_load((folder / "gsm8k-cot.yaml").read_text())
    assert list(gsm8k_exemplars()) == config["fewshot_config"]["samples"]
    assert len(gsm8k_exemplars()) == 8


def test_constants_equal_the_installed_gsm8k_yaml():
    folder = _lm_eval_tasks_dir()
    if folder is None:
        pytest.skip("lm-eval is not installed")
    import yaml

    config = yaml.safe_load((folder / "gsm8k.yaml").read_text())
    assert config["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert tuple(config["generation_kwargs"]["until"]) == gsm8k_task.GSM8K_UNTIL
    assert config["generation_kwargs"]["do_sample"] is False
    filters = {f["name"]: f["filter"][0] for f in config["filter_list"]}
    assert filters["strict-match"]["regex_pattern"] == gsm8k_task.GSM8K_STRICT_PATTERN
    assert filters["flexible-extract"]["regex_pattern"] == gsm8k_task.GSM8K_FLEXIBLE_PATTERN
    assert filters["flexible-extract"]["group_select"] == -1
    metric = config["metric_list"][0]
    assert tuple(metric["regexes_to_ignore"]) == gsm8k_task.GSM8K_IGNORE
    assert metric["ignore_case"] is True and metric["ignore_punctuation"] is False
    assert config["num_fewshot"] == gsm8k_task.GSM8K_NUM_FEWSHOT


def test_exemplar_target_in_gsm8k_form():
    assert gsm8k_exemplar_target(
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."
    ) == "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5.\n#### 5"
    assert gsm8k_exemplar_target("9 + 20 is 29. The answer is\n29.") == "9 + 20 is 29.\n#### 29"
    with pytest.raises(UserError, match="The answer is"):
        gsm8k_exemplar_target("no final answer here")


@pytest.mark.parametrize("generation, strict, flexible", [
    ("She has 16 - 3 = 13 left.\n#### 13", "13", "13"),
    ("It costs $1,200.\n#### 1,200\n\nQuestion", "1,200", "1,200"),
    ("The total is 5 apples and 7 pears", "[invalid]", "7"),
    ("#### -4.5 then 6", "-4.5", "6"),
    ("no numbers at all", "[invalid]", "[invalid]"),
    ("He paid $30.", "[invalid]", "$30."),
])
def test_filters(generation, strict, flexible):
    assert gsm8k_extract(generation) == {"strict-match": strict, "flexible-extract": flexible}


@pytest.mark.parametrize("answer, gold, same", [
    ("18", "Janet sells 9 eggs.\n#### 18", True),
    ("1,200", "so\n#### 1200", True),
    ("$30.", "#### 30", True),
    ("30.5", "#### 30", False),
    ("[invalid]", "#### 18", False),
    ("-4", "#### 4", False),
])
def test_exact_match(answer, gold, same):
    assert gsm8k_exact_match(answer, gold) is same


def test_prompt_format_written_out():
    reqs = build_gsm8k_requests(CharTokenizer(), limit=2, num_fewshot=2)
    q0 = load_gsm8k_docs(limit=1)[0]["question"]
    expected = (
        "Question: There are 15 trees in the grove. Grove workers will plant trees in the grove today. "
        "After they are done, there will be 21 trees. How many trees did the grove workers plant today?\n"
        "Answer: There are 15 trees originally. Then there were 21 trees after some more were planted. "
        "So there must have been 21 - 15 = 6.\n#### 6\n\n"
        "Question: If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in "
        "the parking lot?\nAnswer: There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5.\n#### 5\n\n"
        f"Question: {q0}\nAnswer:"
    )
    assert reqs[0].context_text == expected
    assert reqs[0].context_ids == tuple(ord(c) for c in expected)
    assert reqs[0].until == ("Question:", "</s>", "<|im_end|>")
    assert reqs[0].gold.endswith("#### 18") and reqs[1].doc_id == 1
    zero = build_gsm8k_requests(CharTokenizer(), limit=1, num_fewshot=0, prepend_bos=True)[0]
    assert zero.context_text == f"Question: {q0}\nAnswer:"
    assert zero.context_ids[0] == 1 and len(zero.context_ids) == len(zero.context_text) + 1


def test_default_is_five_shot():
    text = build_gsm8k_requests(CharTokenizer(), limit=1)[0].context_text
    assert text.count("Question: ") == 6 and text.count("#### ") == 5


@pytest.mark.parametrize("bad", [-1, 9, True])
def test_bad_num_fewshot(bad):
    with pytest.raises(UserError, match="num_fewshot"):
        build_gsm8k_requests(CharTokenizer(), limit=1, num_fewshot=bad)


def test_chat_without_template_is_refused():
    with pytest.raises(UserError, match="chat template"):
        build_gsm8k_requests(CharTokenizer(), limit=1, apply_chat_template=True)
